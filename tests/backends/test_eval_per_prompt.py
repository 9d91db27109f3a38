"""The built-in trainer logs each evaluation's per-prompt scores as a run artifact, without changing a number.

References: the metric the same evaluation logs (``val-core/<data>/acc/mean_at_<n>``: the mean of every sample's
score, so the artifact's scores must average to it exactly, in their logged order), the evaluation prompts'
dataset indices (the keys), and the same cell trained with the artifact writer removed (every evaluation
metric bitwise equal). A tracker that cannot write the artifact, or has no ``log_text``, never fails the run.
"""

from __future__ import annotations

import json
import logging

from analysis.eval_error import mlflow_reader
from runners import metric_names
from runners.backends.local.evaluate import Evaluator, per_prompt_scores
from runners.backends.local.trainer import LocalTrainer
from runners.config import compose, run_key
from runners.data.splits import eval_examples
from runners.data.types import Example
from runners.run import read_status, run

from ._tiny import TINY

CELL = [*TINY, "trainer.total_steps=2", "trainer.eval_every=2", "experiment=per_prompt"]


class RecordingTracker:
    """Stands in for RunTracker: metrics and text artifacts in memory."""

    def __init__(self) -> None:
        self.history: dict[int, dict[str, float]] = {}
        self.texts: dict[str, str] = {}

    def log_metrics(self, metrics, step):
        self.history.setdefault(step, {}).update({k: float(v) for k, v in metrics.items()})

    def log_text(self, text, artifact_file):
        self.texts[artifact_file] = text

    def flush(self, wait=True):
        pass


class FailingTracker(RecordingTracker):
    def log_text(self, text, artifact_file):
        raise OSError("disk full")


class MetricsOnlyTracker(RecordingTracker):
    log_text = None  # a tracker without artifacts (the test doubles of other trainer tests)


def _eval_metrics(history: dict[int, dict[str, float]]) -> dict[int, dict[str, float]]:
    return {s: {k: v for k, v in m.items() if k.startswith(("val-core/", "val-aux/"))} for s, m in history.items()}


def _flat_mean(payload: dict, source: str) -> float:
    scores = [s for row in payload["sources"][source]["scores"] for s in row]
    return sum(scores) / len(scores)


def test_the_artifact_averages_to_the_logged_metric_in_mlflow(tb_home):
    """A real run: the artifacts of steps 0 and 2 read back from the MLflow store (through the reader the
    analysis uses) average exactly to the pass@1 logged at the same step; keys are the eval prompts' indices."""
    from mlflow import MlflowClient

    cfg, choices = compose(CELL)
    assert run(cfg, choices)["status"] == "FINISHED"
    run_id = read_status(tb_home / "runs" / run_key(cfg))["run_id"]
    uri = f"sqlite:///{tb_home / 'mlflow.db'}"
    client = MlflowClient(uri)
    listed = {a.path for a in client.list_artifacts(run_id, metric_names.PER_PROMPT_ARTIFACT_PREFIX.rstrip("/"))}
    assert listed == {metric_names.per_prompt_artifact(0), metric_names.per_prompt_artifact(2)}
    source = eval_examples(cfg)[0].data_source
    metric = metric_names.val_acc_mean(source, cfg.trainer.eval_n)
    logged = {m.step: m.value for m in client.get_metric_history(run_id, metric)}
    read = mlflow_reader(uri)
    for step in (0, 2):
        payload = read(run_id, step)
        assert payload["step"] == step and payload["n"] == cfg.trainer.eval_n
        assert payload["sources"][source]["keys"] == [e.meta["index"] for e in eval_examples(cfg)]
        assert all(len(row) == cfg.trainer.eval_n for row in payload["sources"][source]["scores"])
        assert _flat_mean(payload, source) == logged[step]
    assert read(run_id, 1) is None  # no evaluation at step 1


def test_writing_the_artifact_changes_no_metric(tb_home, monkeypatch, caplog):
    """The same cell with the writer, without it, with a failing tracker and with a tracker lacking log_text:
    every evaluation metric is bitwise the same and every run ends."""
    cfg, _ = compose(CELL)
    runs = {}
    for name, tracker in (("writing", RecordingTracker()), ("failing", FailingTracker())):
        LocalTrainer(cfg, tracker, tb_home / name).train()
        runs[name] = tracker
    missing = MetricsOnlyTracker()
    LocalTrainer(cfg, missing, tb_home / "missing").train()
    monkeypatch.setattr(Evaluator, "log_per_prompt", lambda self, tracker, step, metrics: metrics)
    removed = RecordingTracker()
    LocalTrainer(cfg, removed, tb_home / "removed").train()

    writing = runs["writing"]
    assert sorted(writing.texts) == [metric_names.per_prompt_artifact(0), metric_names.per_prompt_artifact(2)]
    assert removed.texts == {} and runs["failing"].texts == {}
    expected = _eval_metrics(removed.history)
    assert expected[0] and expected[2]  # evaluations at steps 0 and 2
    for tracker in (writing, runs["failing"], missing):
        assert _eval_metrics(tracker.history) == expected
    source = eval_examples(cfg)[0].data_source
    for step in (0, 2):
        payload = json.loads(writing.texts[metric_names.per_prompt_artifact(step)])
        assert _flat_mean(payload, source) == expected[step][metric_names.val_acc_mean(source, cfg.trainer.eval_n)]
    failed = [r for r in caplog.records if r.levelno == logging.WARNING and "per-prompt" in r.getMessage()]
    assert len(failed) == 2 and "disk full" in failed[0].getMessage()


def test_keys_are_dataset_indices_else_positions():
    """Per data source, in the evaluator's order: indices where unique in the source, positions otherwise."""

    def ex(source: str, index=None) -> Example:
        return Example("q", "1", source, "math", meta={} if index is None else {"index": index})

    examples = [ex("a", 7), ex("b", 3), ex("a", 2), ex("b", 3), ex("c"), ex("a", 9)]
    scores = {id(e): [float(i), 1.0] for i, e in enumerate(examples) if i != 5}  # the last was not evaluated
    out = per_prompt_scores(examples, scores)
    assert out == {
        "a": {"keys": [7, 2], "scores": [[0.0, 1.0], [2.0, 1.0]]},
        "b": {"keys": [1, 3], "scores": [[1.0, 1.0], [3.0, 1.0]]},  # index 3 twice: positions
        "c": {"keys": [4], "scores": [[4.0, 1.0]]},  # no index: its position
    }
