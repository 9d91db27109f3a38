"""The documentation cannot drift from the code: the site builds with warnings as errors, the generated
reference pages are what the code gives, every composed config key is in the configuration reference,
every metric name in the metrics reference, and every command of the pages' code blocks has an entry
in ``tests/test_readme_commands.py`` (which runs those that can run on CPU).

The references: a composed config (``runners.config.compose``, as ``trustbench run`` composes a cell),
the metric schema module itself (``runners.metric_names``), and MkDocs' own strict build.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import DictConfig

from runners import metric_names
from runners.config import CONF_DIR, compose
from runners.config.schema import TrustbenchConfig
from tests.test_readme_commands import COMMANDS, README, documented_pages, readme_commands

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
CONFIG_REF = DOCS / "reference" / "config.md"
METRICS_REF = DOCS / "reference" / "metrics.md"
MKDOCS = Path(sys.executable).parent / "mkdocs"
# options that only compose together with another choice (as tests/test_config.py composes them)
COMPANIONS = {("rollout", "truncated"): ["algorithm=tppo"], ("entropy_control", "adapo"): ["algorithm=dapo"]}
COMPONENT_GROUPS = ("estimator", "objective", "mask", "entropy_control", "loss_agg", "rollout_correction")


def _gen_reference():
    sys.path.insert(0, str(DOCS))
    try:
        import gen_reference
    finally:
        sys.path.remove(str(DOCS))
    return gen_reference


def _build(config: Path, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [str(MKDOCS), "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
        cwd=config.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


# -- the site --------------------------------------------------------------------------------------------
def test_site_builds_strict(tmp_path):
    """``mkdocs build --strict`` (what ``make docs`` runs): no warning, every page in the navigation,
    every internal link and anchor resolved."""
    done = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "WARNING" not in done.stderr, done.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "config" / "index.html").exists()


@pytest.mark.parametrize(
    "page,old,new",
    [
        ("methods/troll.md", "#objectivetroll)", "#objectivetroll-nowhere)"),  # an anchor that does not exist
        ("concepts.md", "(clusters.md)", "(cluster.md)"),  # a page that does not exist
    ],
)
def test_strict_build_fails_on_a_broken_link(tmp_path, page, old, new):
    """The same build over a copy of the pages with one link broken fails, naming it."""
    shutil.copytree(DOCS, tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    text = (tmp_path / "docs" / page).read_text()
    assert old in text, (page, old)
    (tmp_path / "docs" / page).write_text(text.replace(old, new, 1))
    done = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0
    assert new.strip("()#") in done.stderr, done.stderr[-2000:]


def test_readme_is_short_and_links_into_the_docs():
    text = README.read_text()
    assert len(text.splitlines()) <= 150, len(text.splitlines())
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / link).is_file(), link


# -- the generated references ----------------------------------------------------------------------------
def test_reference_pages_are_up_to_date():
    """The committed pages are what ``docs/gen_reference.py`` writes from the code today, in a fresh
    interpreter as ``make docs`` runs it (in this process, test modules add entries to registries:
    tests/backends/_tiny.py registers the reward ``test_has_digit``)."""
    out = subprocess.run(
        [sys.executable, str(DOCS / "gen_reference.py"), "--check"], cwd=DOCS.parent, capture_output=True, text=True
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-2000:]


def _free_form(schema: type, prefix: str = "") -> set[str]:
    """Keys of the schema declared as free-form mappings (``dict``): their contents are not schema keys."""
    out = set()
    for f in dataclasses.fields(schema):
        key = f"{prefix}{f.name}"
        factory = f.default_factory
        if dataclasses.is_dataclass(factory):
            out |= _free_form(factory, f"{key}.")
        elif f.type == "dict" or str(f.type).startswith("dict["):
            out.add(key)
    return out


FREE_FORM = _free_form(TrustbenchConfig)


def config_keys(node: DictConfig, prefix: str = "") -> list[str]:
    """Every dotted key of a composed config, down to leaves and free-form mappings."""
    keys = []
    for name in node.keys():
        key = f"{prefix}{name}"
        value = node[name]
        if isinstance(value, DictConfig) and key not in FREE_FORM:
            keys += config_keys(value, f"{key}.")
        else:
            keys.append(key)
    return keys


def _cells() -> list[list[str]]:
    """Every algorithm preset, and one option of every component (registry name) no preset selects; the
    other groups (model, dataset, trainer, ...) share their schema across options, so their keys are in
    every cell."""
    import yaml

    from runners.config import preset_components

    presets = sorted((CONF_DIR / "algorithm").glob("*.yaml"))
    chosen = {(group, option) for p in presets for group, option in preset_components(p.stem).items()}
    seen = {
        (group, yaml.safe_load((CONF_DIR / group / f"{option}.yaml").read_text()).get("name", option))
        for group, option in chosen
    }
    cells = [[f"algorithm={p.stem}"] for p in presets]
    for group in COMPONENT_GROUPS:
        for p in sorted((CONF_DIR / group).glob("*.yaml")):
            name = yaml.safe_load(p.read_text())["name"]
            if (group, name) not in seen:
                seen.add((group, name))
                cells.append([*COMPANIONS.get((group, p.stem), []), f"{group}={p.stem}"])
    return cells


@pytest.mark.parametrize("overrides", _cells(), ids=" ".join)
def test_every_composed_key_is_in_the_configuration_reference(overrides):
    """Every key of the cell's composed config (every algorithm preset, and a cell for each component no
    preset selects) is documented, as a `key` code span, in docs/reference/config.md."""
    text = CONFIG_REF.read_text()
    cfg, _ = compose(overrides)
    missing = [key for key in config_keys(cfg) if f"`{key}`" not in text]
    assert not missing, f"config keys missing from docs/reference/config.md (run `make docs`): {missing}"


def test_configuration_reference_catches_a_missing_key():
    """The check above sees a key the page lacks (here one taken out of the page)."""
    cfg, _ = compose(["objective=troll"])
    keys = config_keys(cfg)
    assert "objective.eps" in keys and "trainer.lr" in keys and "model.options" in keys
    assert "model.options.long_fraction" not in keys  # free-form mappings are not descended
    text = CONFIG_REF.read_text().replace("`objective.eps`", "`objective.epsilon`")
    assert [k for k in keys if f"`{k}`" not in text] == ["objective.eps"]


def test_configuration_reference_states_type_default_and_check():
    """A key's row gives its type, default and the message its check gives (objective.eps: > 0)."""
    row = next(line for line in CONFIG_REF.read_text().splitlines() if line.startswith("| `objective.eps` |"))
    cells = [c.strip() for c in row.strip("|").split(" | ")]
    assert cells[1:4] == ["float", "`0.05`", "must be > 0"], cells
    with pytest.raises(Exception, match="must be > 0"):
        compose(["objective=troll", "objective.eps=0"])


# -- metric names -------------------------------------------------------------------------------------------
# the values a name-building function of runners.metric_names takes (the others get `<parameter>`)
DOMAINS = {
    "arithmetic_intensity": metric_names.ROOFLINE_PHASES,
    "achieved_tflops": metric_names.ROOFLINE_PHASES,
    "post_update_kl_frac_above": metric_names.POST_UPDATE_KL_THRESHOLDS,
    "timing_cpu": metric_names.TIMING_PHASES,
}
NOT_NAMES = {"code_version_label", "per_prompt_artifact"}  # a code-version label and an artifact path


def schema_metric_names() -> list[str]:
    """Every metric name and name pattern of runners.metric_names."""
    names = [
        value
        for const, value in vars(metric_names).items()
        if const.isupper() and isinstance(value, str) and "/" in value and not const.startswith("TAG_")
        if not const.endswith("_PREFIX")
    ]
    for name, fn in inspect.getmembers(metric_names, inspect.isfunction):
        if fn.__module__ != metric_names.__name__ or name in NOT_NAMES:
            continue
        if name in DOMAINS:
            names += [fn(v) for v in DOMAINS[name]]
        else:
            names.append(fn(*(f"<{p}>" for p in inspect.signature(fn).parameters)))
    return names


def test_every_metric_name_is_in_the_metrics_reference():
    text = METRICS_REF.read_text()
    names = schema_metric_names()
    assert "critic/score/mean" in names and "val-core/<data>/acc/mean_at_<n>" in names
    assert "perf/rollout_tflops" in names and "actor/post_update_kl_frac_above_0.05" in names
    missing = [n for n in names if f"`{n}`" not in text]
    assert not missing, f"metric names missing from docs/reference/metrics.md (run `make docs`): {missing}"
    tags = [v for c, v in vars(metric_names).items() if c.startswith("TAG_")]
    assert all(f"`{t}`" in text for t in tags), [t for t in tags if f"`{t}`" not in text]


# -- commands ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("page", documented_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_of_a_page_has_an_entry(page):
    """Each command of the page's bash blocks is covered by tests/test_readme_commands.py (which runs it,
    or its dry form, in test_readme_command_works)."""
    missing = [c for c in readme_commands(page.read_text()) if c not in COMMANDS]
    assert not missing, f"{page.relative_to(ROOT)}: commands with no entry in tests/test_readme_commands.py: {missing}"


def test_results_page_has_a_marked_place_for_every_generated_part():
    """docs/gen_results.py rewrites only what sits between its markers; the prose around them is kept."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_results", ROOT / "docs" / "gen_results.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    text = (ROOT / "docs" / "results.md").read_text()
    for part in ("provenance", "setup", "figures", "verdicts", "score_map", "stability", "regime_claims"):
        assert f"<!-- results:{part} -->" in text and f"<!-- /results:{part} -->" in text, part
    page = "prose\n<!-- results:setup -->\nold\n<!-- /results:setup -->\nmore prose\n"
    assert gen.replace_part(page, "setup", "new") == page.replace("old", "new")
    with pytest.raises(SystemExit, match="results:missing"):
        gen.replace_part(page, "missing", "x")
