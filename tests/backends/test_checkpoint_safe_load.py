"""Checkpoints are read with torch's safe loader: a pickle payload is refused and never run.

References: a checkpoint written by a real (tiny) run, whose state must come back equal; and a file
whose pickle would create a marker file when loaded by the unsafe loader (checked first: the
payload does run under ``weights_only=False``), which must stay absent.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from runners.backends.local import checkpoint as ckpt
from runners.backends.local.trainer import LocalTrainer
from runners.config import compose

from ._tiny import TINY


class _NoTracker:
    def log_metrics(self, metrics, step):
        pass

    def flush(self, wait=True):
        pass


class _Payload:
    """Unpickling it calls ``os.system`` (a shell command creating ``marker``)."""

    def __init__(self, marker) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch '{self.marker}'",))


@pytest.fixture(scope="module")
def real_state(tmp_path_factory):
    """The state of the checkpoint a tiny two-step run writes after step 2."""
    home = tmp_path_factory.mktemp("home")
    mp = pytest.MonkeyPatch()
    mp.setenv("TRUSTBENCH_HOME", str(home))
    mp.delenv("MLFLOW_TRACKING_URI", raising=False)
    try:
        cfg, _ = compose(
            [o for o in TINY if not o.startswith("trainer.checkpoint_every")] + ["trainer.checkpoint_every=1"]
        )
        LocalTrainer(cfg, _NoTracker(), home / "run", label="grpo").train()
        with open(ckpt.path(home / "run"), "rb") as fh:
            raw = fh.read()
    finally:
        mp.undo()
    return raw


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


def test_a_real_checkpoint_loads_whole_with_the_safe_loader(real_state, tmp_path):
    (tmp_path / ckpt.FILENAME).write_bytes(real_state)
    state = ckpt.load(tmp_path)
    reference = torch.load(tmp_path / ckpt.FILENAME, map_location="cpu", weights_only=False)  # our own file
    assert state["step"] == 2 and _equal(state, reference)


def _arrays(obj):
    if isinstance(obj, np.ndarray):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _arrays(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _arrays(v)


def test_the_allowlist_is_what_a_real_checkpoint_names(real_state, tmp_path):
    """torch's own scan of a real checkpoint for globals outside its default allowlist (the GLOBAL
    opcodes), and the dtype class of each numpy array in it (built by a REDUCE, which the scan skips)."""
    file = tmp_path / ckpt.FILENAME
    file.write_bytes(real_state)
    needed = set(torch.serialization.get_unsafe_globals_in_checkpoint(str(file)))
    arrays = list(_arrays(torch.load(file, map_location="cpu", weights_only=False)))
    assert arrays  # numpy's RNG state
    needed |= {f"{type(a.dtype).__module__}.{type(a.dtype).__name__}" for a in arrays}
    assert sorted(f"{g.__module__}.{g.__name__}" for g in ckpt.SAFE_GLOBALS) == sorted(needed)


def test_the_numpy_rng_state_round_trips_through_the_safe_loader(tmp_path):
    ckpt.save(tmp_path, {"step": 1, "rng": {"numpy": np.random.RandomState(1234).get_state()}})
    restored = np.random.RandomState()
    restored.set_state(ckpt.load(tmp_path)["rng"]["numpy"])
    assert (restored.randint(0, 2**31, size=5) == np.random.RandomState(1234).randint(0, 2**31, size=5)).all()


def _write_payload(file, marker, where: str) -> None:
    state = {"step": 5, "model": {"w": torch.zeros(2)}}
    if where == "top":
        state["extra"] = _Payload(marker)
    else:  # hidden where a real checkpoint holds numpy's RNG state
        state["rng"] = {"numpy": ("MT19937", _Payload(marker), 0, 0, 0.0)}
    torch.save(state, file)


def test_the_payload_would_run_under_the_unsafe_loader(tmp_path):
    """The test's own check: the same file loaded as before (weights_only=False) runs the command."""
    marker = tmp_path / "marker"
    _write_payload(tmp_path / ckpt.FILENAME, marker, "top")
    torch.load(tmp_path / ckpt.FILENAME, weights_only=False)
    assert marker.exists()


@pytest.mark.parametrize("where", ["top", "rng"])
def test_a_checkpoint_carrying_a_pickle_payload_is_refused_and_not_run(tmp_path, where):
    marker = tmp_path / "marker"
    _write_payload(tmp_path / ckpt.FILENAME, marker, where)
    with pytest.raises(ckpt.CheckpointError) as caught:
        ckpt.load(tmp_path)
    assert not marker.exists()
    message = str(caught.value)
    assert "\n" not in message
    assert f"checkpoint {tmp_path / ckpt.FILENAME} cannot be read (refused by torch's safe loader" in message
    assert f"{os.system.__module__}.system" in message and "nothing in it was run" in message
    assert f"remove {tmp_path / ckpt.FILENAME}" in message


def test_a_payload_in_the_latest_checkpoint_falls_back_to_the_previous_one(real_state, tmp_path, capsys):
    marker = tmp_path / "marker"
    ckpt.previous_path(tmp_path).write_bytes(real_state)
    _write_payload(ckpt.path(tmp_path), marker, "top")
    state = ckpt.load(tmp_path)
    assert state["step"] == 2 and not marker.exists()
    assert (tmp_path / (ckpt.FILENAME + ckpt.CORRUPT_SUFFIX)).exists()
    err = capsys.readouterr().err
    assert "refused by torch's safe loader" in err and f"resuming from {ckpt.previous_path(tmp_path)}" in err
