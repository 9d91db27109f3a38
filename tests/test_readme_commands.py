"""Every command of the README's and the documentation's (``docs/**/*.md``) shell code blocks works
as written (issue: the documented ``trustbench run --cfg job algorithm=tppo`` once exited 2).

The README and the docs pages are parsed when the tests run: each line of a fenced ``bash`` block
(backslash continuations joined, the trailing ``# comment`` dropped) is one command, and ``COMMANDS``
says how it runs here. A command that is cheap runs as written; one that needs a cluster, a GPU, the
network or a long run runs in a dry or shortened form, and its entry says which and why. A documented
command that ``COMMANDS`` does not cover fails ``test_every_readme_command_is_covered`` (so a new or
changed command needs an entry here, and the documentation cannot drift from the tool unnoticed), as
does an entry whose command left every page.

``trustbench`` commands run in this process (``runners.cli.main``) against a scratch home;
``make``, ``pytest`` and ``ruff`` run as subprocesses of this interpreter's environment (the README's
``.venv/bin/`` is the environment ``make`` sets up).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import tomllib

from runners import cli

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

BIN = Path(sys.executable).parent
# the one real training run: one step of a small batch on the embedded default (a full run takes minutes)
SHORT = [
    "trainer.total_steps=1",
    "trainer.prompts_per_step=2",
    "trainer.n=4",
    "trainer.mini_batch_prompts=2",
    "trainer.eval_every=0",
    "dataset.eval_limit=4",
    "progress=false",
]


def documented_pages() -> list[Path]:
    """The README and every Markdown page of the documentation (generated reference pages included)."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def documented_text() -> str:
    """Every page of ``documented_pages``, one after another."""
    return "\n".join(page.read_text() for page in documented_pages())


def readme_commands(text: str) -> list[str]:
    """The commands of ``text``'s fenced bash blocks, one per logical line, comments dropped."""
    commands = []
    for block in re.findall(r"^```(?:bash|sh|shell)[^\n]*\n(.*?)^```", text, re.S | re.M):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            command = " ".join(re.sub(r"(^|\s)#.*$", "", line).split())
            if command:
                commands.append(command)
    return commands


# -- how commands run here ----------------------------------------------------------------------------
class Env:
    """What a command's check gets: a scratch home and working directory, and pytest's capture."""

    def __init__(self, tmp: Path, capsys, monkeypatch) -> None:
        self.tmp, self.capsys, self.monkeypatch = tmp, capsys, monkeypatch

    def trustbench(self, args: list[str]) -> str:
        """``trustbench ARGS`` in this process; returns its stdout (exit code 0 required)."""
        self.capsys.readouterr()
        code = cli.main(args)
        out = self.capsys.readouterr()
        assert code == 0, f"trustbench {shlex.join(args)} exited {code}:\n{out.out[-2000:]}\n{out.err[-2000:]}"
        return out.out

    def shell(self, argv: list[str], ok=(0,), **kw) -> subprocess.CompletedProcess:
        env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
        done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, **kw)
        assert done.returncode in ok, (
            f"{shlex.join(argv)} exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        )
        return done


@dataclass(frozen=True)
class Case:
    how: str  # "as written", or the form it runs in here
    why: str  # why not as written ("" when it is)
    check: Callable[[Env, list[str]], None]


def _as_written(env: Env, argv: list[str]) -> None:
    env.trustbench(argv[1:])


def _compose_only(env: Env, argv: list[str]) -> None:
    """``--cfg job``: the CLI parses the command and Hydra prints the composed config, in which every
    override is found; then the cell is validated, as ``trustbench run`` does before it trains."""
    import yaml

    from runners.config import compose

    argv = [*argv, *([] if "--cfg" in argv else ["--cfg", "job"])]
    cfg = yaml.safe_load(env.trustbench(argv[1:]))
    overrides = [a for a in argv[2:] if "=" in a]
    for override in overrides:
        key, value = override.split("=", 1)
        if key.startswith("+"):  # a recipe (+method=...): what it sets is its own business
            continue
        node = cfg
        for part in key.split("."):
            node = node[part]
        assert str(node.get("name") if isinstance(node, dict) else node) == value, (override, node)
    compose(overrides)


def _dry_run(env: Env, argv: list[str]) -> None:
    out = env.trustbench([*argv[1:], "--dry-run"])
    assert re.search(r"^sweep '\w+': \d+ cells", out, re.M), out


def _dry_run_without_cluster(env: Env, argv: list[str]) -> None:
    """A Slurm sweep's dry run without ``sbatch`` on PATH (this machine's test cluster is for the slurm tests)."""
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if not (Path(p) / "sbatch").exists())
    env.monkeypatch.setenv("PATH", path)
    site = ["launcher=slurm", "launcher.partition=gpu"]  # what the slurm/README example profile starts from
    args = [x for a in argv[1:] for x in (site if a == "launcher=cluster" else [a])]
    out = env.trustbench([*args, *([] if "--dry-run" in args else ["--dry-run"])])
    assert "launcher slurm" in out and "cluster not checked: no sbatch on PATH" in out, out


def _train_shortened(env: Env, argv: list[str]) -> None:
    from tests.reliability import runs

    env.trustbench([*argv[1:], *SHORT, "experiment=demo"])
    (run,) = runs(env.tmp / "home")
    assert run.info.status == "FINISHED", run.info
    assert run.data.tags["git_revision"] and run.data.tags["trustbench.version"]


def _report(env: Env, argv: list[str]) -> None:
    if not (env.tmp / "home" / "mlflow.db").exists():
        env.trustbench(["run", *SHORT, "experiment=demo"])  # a run to report on
    out = env.trustbench([*argv[1:], "--no-pdf", "--quiet", "--no-mlflow"])
    html = env.tmp / "home" / "reports" / "demo" / "report.html"
    assert "html:" in out and html.exists(), out
    assert "Code of the runs" in html.read_text()


def _ui(env: Env, argv: list[str]) -> None:
    """The server command ``trustbench ui`` starts, instead of serving until Ctrl-C."""
    started = []
    env.monkeypatch.setattr(cli, "_serve", lambda cmd, env=None: started.append(cmd) or 0)
    out = env.trustbench(argv[1:])
    assert "at http://127.0.0.1:5000" in out
    (cmd,) = started
    assert cmd[1:4] == ["-m", "mlflow", "ui"], cmd
    assert "--port" in cmd and cmd[cmd.index("--port") + 1] == "5000", cmd


def _bounds(env: Env, argv: list[str]) -> None:
    out = env.trustbench(argv[1:])
    assert "4096" in out, out


def _make_target(env: Env, argv: list[str]) -> None:
    """``make -n``: the target exists and its recipe expands (it would install and train)."""
    done = env.shell(["make", "-n", *argv[1:]])
    assert done.stdout.strip(), done


def _extras_exist(env: Env, argv: list[str]) -> None:
    """The extras named exist in pyproject.toml (installing needs the network)."""
    spec = argv[-1].strip("'\"")
    extras = re.fullmatch(r"\.\[([\w,-]+)\]", spec).group(1).split(",")
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(extras) <= set(declared), (extras, sorted(declared))


def _prints(env: Env, argv: list[str]) -> str:
    """``trustbench ARGS`` as written, which prints something; returns its stdout."""
    out = env.trustbench(argv[1:])
    assert out.strip(), argv
    return out


def _sbatch_script(env: Env, argv: list[str]) -> None:
    """The script ``... sbatch ... > cell.sbatch`` writes is a shell script with #SBATCH lines; it is not queued."""
    cut = argv.index(">")
    assert argv[cut + 1 :] == ["cell.sbatch", "&&", "sbatch", "cell.sbatch"], argv
    text = _prints(env, argv[:cut])
    script = env.tmp / "cell.sbatch"
    script.write_text(text)
    assert text.startswith("#!") and "#SBATCH" in text, text[:500]
    env.shell(["bash", "-n", str(script)])


def _pytest_selection(env: Env, argv: list[str]) -> None:
    """What the pytest command selects exists: its paths hold tests, its markers are registered and
    used there (collecting imports every selected module: torch, verl; a minute here)."""
    args = argv[1:]
    markers = set()
    if "-m" in args:
        markers = set(re.findall(r"\w+", args[args.index("-m") + 1])) - {"not", "and", "or"}
        del args[args.index("-m") : args.index("-m") + 2]
    registered = {
        m.split(":")[0]
        for m in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    }
    assert markers <= registered, (markers, registered)
    paths = [ROOT / a for a in (args or ["tests"])]
    files = [f for p in paths for f in ([p] if p.is_file() else p.rglob("test_*.py"))]
    assert all(p.exists() for p in paths), [str(p) for p in paths if not p.exists()]
    assert files, args
    for marker in markers:
        assert any(f"mark.{marker}" in f.read_text() for f in files), marker


def _ruff(env: Env, argv: list[str]) -> None:
    """Both ruff commands run; findings (exit 1) are the lint job's business, an error (exit 2) is not."""
    line = " ".join(argv)
    for part in line.split("&&"):
        words = shlex.split(part)
        assert words[0] == ".venv/bin/ruff", words
        env.shell([str(BIN / "ruff"), *words[1:]], ok=(0, 1))


LONG = "a full run trains for minutes"
COMMANDS: dict[str, Case] = {
    # quick start
    "make demo": Case("make -n demo", "sets up .venv (pip, network) and trains the demo sweep (~12 min)", _make_target),
    "make test": Case("make -n test", "sets up .venv and runs this whole suite", _make_target),
    "make test-fast": Case("make -n test-fast", "runs every test but the stages (minutes)", _make_target),
    "make test-times": Case("make -n test-times", "runs this whole suite and times it", _make_target),
    "make coverage": Case("make -n coverage", "runs the fast tier under coverage (minutes)", _make_target),
    "make mutation": Case("make -n mutation", "installs mutmut and runs every mutant (hours)", _make_target),
    # trustbench commands
    "trustbench run": Case("1 step of a small batch (+ logged to experiment demo)", LONG, _train_shortened),
    "trustbench run algorithm=gspo objective=troll": Case("--cfg job, then validated", LONG, _compose_only),
    "trustbench run objective=troll": Case("--cfg job, then validated", LONG, _compose_only),
    "trustbench run algorithm=grpo mask=trm_max entropy_control=repo_r seed=1": Case(
        "--cfg job, then validated", LONG, _compose_only
    ),
    "trustbench run --cfg job algorithm=tppo": Case("as written", "", _compose_only),
    "trustbench sweep demo --dry-run": Case("as written", "", _dry_run),
    "trustbench sweep demo": Case("--dry-run", "trains 21 cells (~12 min)", _dry_run),
    "trustbench report demo": Case(
        "--no-pdf --quiet --no-mlflow, on one shortened run",
        "the PDF needs Chromium or ~10 s of reportlab layout; the demo sweep's runs are not here",
        _report,
    ),
    "trustbench ui": Case("the server command checked, not started", "serves until Ctrl-C", _ui),
    "trustbench bounds --T 4096 --delta 1e-4 --d-seq 0.01": Case("as written", "", _bounds),
    "trustbench list": Case("as written", "", _as_written),
    "trustbench run +method=grpo_trm rollout.staleness=1 trainer.ppo_epochs=2": Case(
        "--cfg job, then validated", LONG, _compose_only
    ),
    "trustbench run algorithm=grpo rollout.dtype=bfloat16 rollout_correction=token_tis": Case(
        "--cfg job, then validated", LONG, _compose_only
    ),
    "trustbench run +method=grpo_troll +regime=stale2": Case("--cfg job, then validated", LONG, _compose_only),
    # Slurm
    "trustbench sweep troll_table1 launcher=slurm launcher.partition=gpu --dry-run": Case(
        "as written, without sbatch on PATH",
        "sbatch --test-only would ask this machine's Slurm test cluster (the slurm tests use it)",
        _dry_run_without_cluster,
    ),
    "trustbench sweep troll_table1 launcher=cluster": Case(
        "--dry-run with launcher=slurm launcher.partition=gpu, without sbatch",
        "needs a cluster and a site's git-ignored conf/launcher/cluster.yaml",
        _dry_run_without_cluster,
    ),
    "trustbench sweep troll_table1 launcher=cluster --no-wait": Case(
        "--dry-run with launcher=slurm launcher.partition=gpu, without sbatch",
        "needs a cluster and a site's git-ignored conf/launcher/cluster.yaml",
        _dry_run_without_cluster,
    ),
    # verl
    "pip install -e '.[verl,slurm]'": Case(
        "the extras exist in pyproject.toml", "installs from the network", _extras_exist
    ),
    "trustbench verl overrides backend=verl model=qwen3_8b algorithm=gspo backend.device=cuda": Case(
        "as written", "", _prints
    ),
    "trustbench run backend=verl model=qwen3_1.7b dataset=gsm8k algorithm=grpo": Case(
        "--cfg job, then validated", "needs a GPU node and trains for hours", _compose_only
    ),
    "trustbench verl sbatch backend=verl model=qwen3_8b +method=grpo_troll "
    "launcher.partition=gpu launcher.time_min=1440 > cell.sbatch && sbatch cell.sbatch": Case(
        "the script written and checked with bash -n; not queued", "sbatch needs a cluster", _sbatch_script
    ),
    "trustbench run backend=verl algorithm=grpo objective=troll trainer.total_steps=2": Case(
        "--cfg job, then validated", "~1 min of real verl; the verl_cpu stage runs it", _compose_only
    ),
    "trustbench verl overrides backend=verl": Case("as written", "", _prints),
    "pytest -m verl_cpu tests/verl": Case(
        "its path and marker checked", "the verl_cpu stage takes minutes; collecting it imports verl", _pytest_selection
    ),
    # tests
    ".venv/bin/pytest tests/test_reliability.py tests/test_reliability_messages.py tests/data/test_sandbox_escapes.py "
    "tests/test_metric_kill_points.py": Case(
        "its paths checked", "the reliability scenarios take minutes (the suite runs them)", _pytest_selection
    ),
    ".venv/bin/pytest tests/algorithms": Case(
        "its path checked", "runs an area of the suite; collecting it imports torch", _pytest_selection
    ),
    "make bench": Case("make -n bench", "runs every benchmark (minutes)", _make_target),
    "make docs": Case("make -n docs", "sets up .venv; tests/test_docs.py builds the site", _make_target),
    ".venv/bin/ruff check . && .venv/bin/ruff format --check .": Case(
        "as written, exit 1 (findings) accepted", "findings are the lint job's verdict, not the docs'", _ruff
    ),
}


def test_readme_parser_joins_continuations_and_drops_comments():
    text = "x\n```bash\na b   # c\nd \\\n   e  # f\n\n# only a comment\n```\n```yaml\nk: v\n```\n"
    assert readme_commands(text) == ["a b", "d e"]


def uncovered(text: str) -> tuple[list[str], list[str]]:
    """(documented commands without an entry, entries whose command is on no page), each once."""
    commands = list(dict.fromkeys(readme_commands(text)))
    return [c for c in commands if c not in COMMANDS], [c for c in COMMANDS if c not in commands]


def test_every_readme_command_is_covered():
    """No command of the README or docs/ without an entry (how it runs here), and no entry for a command
    on no page."""
    text = documented_text()
    missing, gone = uncovered(text)
    assert not missing, "documented commands with no entry in tests/test_readme_commands.py COMMANDS: " + "; ".join(
        missing
    )
    assert not gone, f"COMMANDS entries no longer in README.md or docs/: {gone}"
    assert all(case.why for case in COMMANDS.values() if case.how != "as written")
    # a command added to (or changed in) the README is caught
    changed = text.replace("trustbench list ", "trustbench list algorithm ") + "\n```bash\ntrustbench new-thing\n```\n"
    assert uncovered(changed) == (["trustbench list algorithm", "trustbench new-thing"], ["trustbench list"])


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("readme")


@pytest.mark.slow
@pytest.mark.parametrize("command", list(dict.fromkeys(readme_commands(documented_text()))))
def test_readme_command_works(command, scratch, capsys, monkeypatch):
    case = COMMANDS.get(command)
    if case is None:
        pytest.fail(f"no entry in COMMANDS for documented command {command!r}")
    monkeypatch.setenv("TRUSTBENCH_HOME", str(scratch / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(scratch)
    case.check(Env(scratch, capsys, monkeypatch), shlex.split(command))
