"""Layering: which packages may import which, checked on every import statement of the source tree.

Rules (the project layout; every ``import`` and ``from ... import`` counts, also those inside functions):

- ``analysis`` and ``reports`` never import torch, ``runners.backends`` or ``runners.models`` (reports are
  built on machines without torch; they read MLflow, not trainers);
- the two backends never import each other (``runners.backends.local`` / ``runners.backends.verl``);
  what they share lives in ``runners.backends.base`` and ``runners.algorithms``;
- the bottom layer (``BOTTOM``: errors and checks, the registry, paths, redaction, metric names, ...)
  imports nothing of the project, so every layer may use it;
- ``runners.algorithms`` (the backend-independent library) never imports a backend, the models, the
  config layer (which reads the components' schemas from ``runners.algorithms.components``) or the
  run orchestration (``runners.run``, ``runners.sweep``, ``runners.tracking``, ``runners.cluster``);
- the config layer (``runners.config``: composing and checking a cell) never imports a backend: it sits
  under the backends, which read the checked config;
- ``runners.data`` (datasets, rewards) never imports the config layer, which checks datasets by calling
  it: the error it raises is ``runners.checks.ConfigError``, the bottom of that layer;
- ``runners.models`` never imports a backend; ``runners.perf`` (FLOPs, ceilings, Roofline points, shared
  by both backends) neither a backend nor the models;
- a backend never imports what runs or queues cells (``runners.run``, ``runners.cluster``,
  ``runners.sweep``, ``runners.cli``, ``runners.main``): the orchestration calls the backend, not the
  other way round;
- the cluster package (``runners.cluster``: Slurm jobs, the queue, the cluster's limits, verl's batch
  script) sits above the run of one cell and the backends, below the sweep and the command line: neither
  ``runners.run`` nor the layers under it (backends, models, algorithms, config, perf) import it, and it
  imports neither ``runners.sweep`` nor ``runners.cli`` / ``runners.main``;
- the orchestration (``runners.run``, ``runners.cluster``, ``runners.sweep``, ``runners.cli``,
  ``runners.main``) reaches a backend only through the registry (``runners.backends.BACKENDS``), never
  by importing ``runners.backends.local`` or ``runners.backends.verl``.

No import cycles: the import graph of ``runners``, ``analysis`` and ``reports`` (an edge for every import,
also those inside functions) has no cycle but those of ``ALLOWED_CYCLES``, and every allowed cycle still
exists (the list cannot go stale).

The checkers are also run on a small tree with one deliberately wrong import (or a planted cycle), which
they must report.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("runners", "analysis", "reports")

# modules that import nothing of the project
BOTTOM = (
    "runners.paths",
    "runners.redact",
    "runners.checks",
    "runners.registry",
    "runners.metric_names",
    "runners.status",
    "runners.cell_lock",
    "runners.disk_full",
)

# (importer prefix, forbidden prefixes, why)
RULES = [
    *((module, PACKAGES, "the bottom layer imports nothing of the project") for module in BOTTOM),
    ("analysis", ("torch", "runners.backends", "runners.models"), "analysis is torch-free and backend-free"),
    ("reports", ("torch", "runners.backends", "runners.models"), "reports are torch-free and backend-free"),
    ("runners.backends.local", ("runners.backends.verl",), "the backends never import each other"),
    ("runners.backends.verl", ("runners.backends.local",), "the backends never import each other"),
    (
        "runners.algorithms",
        (
            "runners.backends",
            "runners.models",
            "runners.config",
            "runners.run",
            "runners.sweep",
            "runners.tracking",
            "runners.cluster",
        ),
        "the algorithm library is backend-independent and under the config layer",
    ),
    ("runners.config", ("runners.backends",), "the config layer sits under the backends"),
    ("runners.models", ("runners.backends",), "models do not depend on a backend"),
    ("runners.data", ("runners.config",), "the datasets sit under the config layer (their error: runners.checks)"),
    ("runners.perf", ("runners.backends", "runners.models"), "hardware accounting is shared by the backends"),
    (
        "runners.backends",
        ("runners.run", "runners.cluster", "runners.sweep", "runners.cli", "runners.main"),
        "the orchestration calls a backend, a backend never imports it",
    ),
    *(
        (module, ("runners.cluster",), "the cluster package sits above the run of a cell and the backends")
        for module in ("runners.run", "runners.models", "runners.algorithms", "runners.config", "runners.perf")
    ),
    (
        "runners.cluster",
        ("runners.sweep", "runners.cli", "runners.main"),
        "the cluster package sits below the sweep and the command line",
    ),
    *(
        (module, ("runners.backends.local", "runners.backends.verl"), "orchestration reaches backends by registry")
        for module in ("runners.run", "runners.cluster", "runners.sweep", "runners.cli", "runners.main")
    ),
]


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in the file, relative imports resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            out.append((node.lineno, name))
            out.extend((node.lineno, f"{name}.{alias.name}") for alias in node.names)
    return out


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def violations(root: Path, packages=PACKAGES, rules=RULES) -> list[str]:
    found = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            module = module_name(path, root)
            for importer, forbidden, why in rules:
                if not _within(module, importer):
                    continue
                for line, name in imported_modules(path, module):
                    bad = next((f for f in forbidden if _within(name, f)), None)
                    if bad is not None:
                        found.append(f"{path.relative_to(root)}:{line}: {module} imports {name} ({why})")
    return sorted(set(found))


def test_the_source_tree_keeps_its_layers():
    assert violations(ROOT) == []


@pytest.mark.parametrize(
    ("where", "source", "expected"),
    [
        ("analysis/figures/bad.py", "def f():\n    import torch\n", "analysis.figures.bad imports torch"),
        (
            "runners/backends/verl/bad.py",
            "from runners.backends.local.trainer import LocalTrainer\n",
            "runners.backends.verl.bad imports runners.backends.local.trainer",
        ),
        (
            "runners/backends/local/bad.py",
            "from ..verl import plugins\n",
            "runners.backends.local.bad imports runners.backends.verl",
        ),
        ("runners/algorithms/bad.py", "from runners.models import sampler\n", "imports runners.models"),
        ("reports/bad.py", "from runners.backends import base\n", "reports.bad imports runners.backends"),
        (
            "runners/sweep/bad.py",
            "def f():\n    from runners.backends.verl.translate import backend_options\n",
            "runners.sweep.bad imports runners.backends.verl.translate",
        ),
        (
            "runners/backends/verl/bad.py",
            "def f():\n    from runners.cluster.job import requeue_or_fail\n",
            "runners.backends.verl.bad imports runners.cluster.job",
        ),
        (
            "runners/backends/verl/bad.py",
            "import runners.run as run_module\n",
            "runners.backends.verl.bad imports runners.run",
        ),
        ("runners/cluster/bad.py", "from runners.sweep import launch\n", "runners.cluster.bad imports runners.sweep"),
        (
            "runners/cluster/bad.py",
            "from runners.backends.verl.translate import backend_options\n",
            "runners.cluster.bad imports runners.backends.verl.translate",
        ),
        (
            "runners/config/bad.py",
            "from runners.cluster import resources\n",
            "runners.config.bad imports runners.cluster",
        ),
        ("runners/run.py", "import runners.backends.local.trainer\n", "runners.run imports runners.backends.local"),
        (
            "runners/algorithms/estimators.py",
            "from runners.config.components import GPG_RESCALE\n",
            "runners.algorithms.estimators imports runners.config.components",
        ),
        (
            "runners/config/validate.py",
            "def f():\n    from runners.backends import BACKENDS\n",
            "runners.config.validate imports runners.backends",
        ),
        (
            "runners/registry.py",
            "def f():\n    from runners.algorithms.components import component_dataclass\n",
            "runners.registry imports runners.algorithms.components (the bottom layer",
        ),
        ("runners/paths.py", "import analysis.load\n", "runners.paths imports analysis.load"),
    ],
)
def test_a_wrong_import_is_reported(tmp_path, where, source, expected):
    """The checker fails on a deliberately wrong import (and names file, line and rule)."""
    found = violations(_tree(tmp_path, {where: source}))
    assert len(found) >= 1 and any(expected in v for v in found), found
    assert all(v.startswith(where) for v in found), found
    (tmp_path / where).write_text("import json\n")  # the same file with a harmless import passes
    assert violations(tmp_path) == []


# what importing any module of analysis or reports must not load, directly or through runners: reports are
# built where neither torch nor a trainer is installed, and the config layer brings Hydra and OmegaConf
TRANSITIVE_FORBIDDEN = (
    "torch",
    "hydra",
    "omegaconf",
    "transformers",
    "verl",
    "runners.backends",
    "runners.models",
    "runners.config",
)
_LOADED = """
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
print(json.dumps(sorted(sys.modules)))
"""


def _loaded_by(modules: list[str], cwd: Path) -> set[str]:
    """Every module a fresh interpreter holds after importing ``modules`` (run in ``cwd``)."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _LOADED, *modules], cwd=cwd, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    return set(json.loads(out.stdout))


def _forbidden(loaded: set[str]) -> list[str]:
    return sorted(m for m in loaded if any(m == f or m.startswith(f + ".") for f in TRANSITIVE_FORBIDDEN))


def test_analysis_and_reports_load_no_torch_hydra_or_backend_even_transitively():
    """The import rules above are checked statement by statement; this follows them through every
    module actually loaded: a fresh interpreter imports every module of ``analysis`` and ``reports``
    and must then hold none of TRANSITIVE_FORBIDDEN (``import analysis.load`` used to load Hydra,
    OmegaConf and ``runners.backends`` through ``runners.tracking`` and the algorithm registry)."""
    modules = sorted(
        ".".join(p.relative_to(ROOT).with_suffix("").parts)
        for package in ("analysis", "reports")
        for p in (ROOT / package).rglob("*.py")
        if p.name != "__init__.py"
    )
    assert len(modules) > 30 and "analysis.load" in modules and "analysis.tables.trm" in modules
    assert _forbidden(_loaded_by(modules, ROOT)) == []


def test_the_transitive_check_sees_an_indirect_import(tmp_path):
    """The check fails for a module that reaches a forbidden one only through another module."""
    (tmp_path / "middle.py").write_text("import omegaconf\n")
    (tmp_path / "top.py").write_text("import middle\n")
    assert "omegaconf" in _forbidden(_loaded_by(["top"], tmp_path))


# --- import cycles -------------------------------------------------------------------------------------
#
# The graph has an edge A -> B when module A imports project module B anywhere in its file: at module level
# or inside a function (a lazy import only delays the cycle to run time, it does not remove it).
# ``from a.b import c`` is an edge to ``a.b.c`` when that is a module, else to ``a.b`` (the longest module
# prefix of the imported name); relative imports are resolved (``imported_modules``). A cycle is a strongly
# connected component of more than one module: each of its modules reaches every other through imports.

# Cycles tolerated, each with its reason. The set of modules must match exactly: a cycle that grows or
# shrinks is reported as new, and an entry whose cycle no longer exists fails the test too. None is left.
ALLOWED_CYCLES: dict[frozenset[str], str] = {}


def import_graph(root: Path, packages=PACKAGES) -> dict[str, set[str]]:
    """{module: the project modules it imports} over every ``.py`` file of ``packages`` under ``root``."""
    paths = {module_name(p, root): p for package in packages for p in sorted((root / package).rglob("*.py"))}
    graph: dict[str, set[str]] = {module: set() for module in paths}
    for module, path in paths.items():
        for _, name in imported_modules(path, module):
            target = name
            while target and target not in paths:  # a name defined in a module -> that module
                target = target.rpartition(".")[0]
            if target and target != module:
                graph[module].add(target)
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:  # v is the root of a component: pop it
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def cycle_problems(graph: dict[str, set[str]], allowed: dict[frozenset[str], str]) -> list[str]:
    """One line per cycle not in ``allowed`` (its modules and the imports that close it), and one per allowed
    cycle that no longer exists."""
    cycles = import_cycles(graph)
    problems = []
    for cycle in cycles:
        if cycle not in allowed:
            edges = "; ".join(f"{a} imports {', '.join(sorted(graph[a] & cycle))}" for a in sorted(cycle))
            problems.append(f"import cycle of {len(cycle)} modules {', '.join(sorted(cycle))} ({edges})")
    for cycle, why in allowed.items():
        if cycle not in cycles:
            problems.append(f"allowed cycle {', '.join(sorted(cycle))} ({why}) no longer exists: remove its entry")
    return sorted(problems)


def test_no_import_cycle_but_the_allowed_ones():
    """The real tree: no cycle outside ``ALLOWED_CYCLES``, and each allowed one still there."""
    graph = import_graph(ROOT)
    # the graph holds the imports made inside functions (validate reaches the Slurm sizes lazily)
    assert "runners.config.resources" in graph["runners.config.validate"]
    assert cycle_problems(graph, ALLOWED_CYCLES) == []


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    """A tree of the three packages holding ``files`` (path -> source), with the packages' __init__.py."""
    for package in PACKAGES:
        (tmp_path / package).mkdir(exist_ok=True)
        (tmp_path / package / "__init__.py").touch()
    for where, source in files.items():
        target = tmp_path / where
        target.parent.mkdir(parents=True, exist_ok=True)
        for parent in target.relative_to(tmp_path).parents:
            if str(parent) != ".":
                (tmp_path / parent / "__init__.py").touch()
        target.write_text(source)
    return tmp_path


@pytest.mark.parametrize(
    ("files", "cycle"),
    [
        (  # two modules, one import inside a function
            {"runners/a.py": "def f():\n    from runners.b import g\n", "runners/b.py": "from runners.a import f\n"},
            ("runners.a", "runners.b"),
        ),
        (  # relative imports, through a package's __init__
            {"runners/pkg/__init__.py": "from .x import X\n", "runners/pkg/x.py": "from . import helpers\n"},
            ("runners.pkg", "runners.pkg.x"),
        ),
        (  # three modules across packages, `import a.b` form
            {
                "analysis/one.py": "import reports.two\n",
                "reports/two.py": "def g():\n    import runners.three\n",
                "runners/three.py": "from analysis.one import thing\n",
            },
            ("analysis.one", "reports.two", "runners.three"),
        ),
    ],
)
def test_a_planted_cycle_is_reported(tmp_path, files, cycle):
    """A cycle planted in a small tree fails the check, naming its modules; breaking one of its imports
    makes the tree pass."""
    root = _tree(tmp_path, files)
    problems = cycle_problems(import_graph(root), {})
    assert len(problems) == 1 and f"import cycle of {len(cycle)} modules {', '.join(cycle)} (" in problems[0], problems
    first = root / next(iter(files))
    first.write_text("import json\n")  # the cycle's first import removed
    assert cycle_problems(import_graph(root), {}) == []


def test_an_allowed_cycle_that_is_gone_is_reported(tmp_path):
    """The allow-list is checked both ways: its cycle present passes, its cycle gone fails naming it."""
    allowed = {frozenset({"runners.a", "runners.b"}): "planted"}
    root = _tree(tmp_path, {"runners/a.py": "from runners import b\n", "runners/b.py": "from runners import a\n"})
    assert cycle_problems(import_graph(root), allowed) == []
    (root / "runners/b.py").write_text("import json\n")
    problems = cycle_problems(import_graph(root), allowed)
    assert problems == ["allowed cycle runners.a, runners.b (planted) no longer exists: remove its entry"], problems
    # a cycle that grew past its allowed modules is a new cycle (and the entry a stale one)
    (root / "runners/b.py").write_text("from runners import c\n")
    (root / "runners/c.py").write_text("import runners.a\n")
    problems = cycle_problems(import_graph(root), allowed)
    assert len(problems) == 2 and problems[0].startswith("allowed cycle runners.a, runners.b"), problems
    assert problems[1].startswith("import cycle of 3 modules runners.a, runners.b, runners.c ("), problems
