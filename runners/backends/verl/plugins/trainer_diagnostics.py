"""The built-in trainer's per-iteration diagnostics inside verl's trainer: post-update KL, CPU time, load.

Design: the built-in trainer logs for every method (``runners.backends.local``)

- ``actor/post_update_kl`` / ``_max`` / ``_frac_above_<eps>`` and ``gtpo/conflict_prob_delta`` from one no-grad forward of the
  updated policy (phase ``post_update``; switch: ``trainer.post_update_diagnostics``);
- ``timing_cpu_s/<phase>``: CPU seconds beside each wall-time phase;
- ``perf/load_avg_1m`` and ``perf/cpu_count_available``.

In verl the same quantities come from:

- ``post_update_pass``: after ``_update_actor`` the trainer asks the actor workers for one more
  log-prob pass with ``sparse_old.POST_UPDATE_KEY`` set: the engine hook returns, per response token,
  KL(pi_new || pi_old) on the old top-K the old-log-prob pass stored (stored for every method while
  the diagnostics are on, with the cell's sparse settings), and verl returns the new log-probs; the
  metrics are then ``runners.algorithms.diagnostics``' (the built-in backend's) on those tensors;
- ``install_cpu_timing``: verl times its phases with ``marked_timer``; wrapped (in the trainer
  modules' namespace, once per process), each phase also records the CPU seconds consumed meanwhile
  by this node's Ray workers (the trainer's siblings under the raylet: rollout server, training
  workers, agent loop), which is where verl's work happens. Other jobs sharing the node's Ray would
  be counted too; on a multi-node cluster only the trainer's node is;
- ``runners.perf.hardware.load_metrics`` at the end of each step.

    install_cpu_timing()                               # plugins_trainer does it at import
    metrics.update(post_update_pass(trainer, batch))   # after the actor update
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from typing import Any

from runners import metric_names

POST_UPDATE_PHASE = "post_update"
# CPU seconds per phase of the step whose timing dict has this id (popped when the step's metrics are made)
_CPU_BY_STEP: dict[int, dict[str, float]] = {}


def node_cpu_seconds() -> float:
    """User + system CPU seconds so far of this process's siblings under the raylet (Ray's workers on this
    node) and of this process; processes that ended meanwhile drop out (callers clamp deltas at 0)."""
    import psutil

    me = psutil.Process()
    try:
        parent = me.parent()
        procs = parent.children(recursive=True) if parent is not None and parent.pid != 1 else [me]
    except psutil.Error:
        procs = [me]
    total = 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            continue
    return total


def install_cpu_timing() -> None:
    """Wrap ``marked_timer`` in verl's v1 trainer modules so each phase also records CPU seconds."""
    import verl.trainer.ppo.v1.trainer_base as base
    import verl.trainer.ppo.v1.trainer_sync as sync

    original = base.marked_timer
    if getattr(original, "__trustbench_cpu__", False):
        return

    @contextlib.contextmanager
    def marked_timer(name: str, timing_raw: dict, *args: Any, **kwargs: Any):
        start = node_cpu_seconds()
        try:
            with original(name, timing_raw, *args, **kwargs):
                yield
        finally:
            phases = _CPU_BY_STEP.setdefault(id(timing_raw), defaultdict(float))
            phases[name] += max(0.0, node_cpu_seconds() - start)

    marked_timer.__trustbench_cpu__ = True
    for module in (base, sync):
        if getattr(module, "marked_timer", None) is original:
            module.marked_timer = marked_timer


def step_cpu_metrics(timing_raw: dict) -> dict[str, float]:
    """``timing_cpu_s/<phase>`` of the step whose wall times are ``timing_raw`` (and forget them)."""
    phases = _CPU_BY_STEP.pop(id(timing_raw), {})
    return {f"{metric_names.TIMING_CPU_PREFIX}{name}": value for name, value in phases.items()}


def _group_ids(uids: list) -> Any:
    import torch

    index = {uid: i for i, uid in enumerate(dict.fromkeys(uids))}
    return torch.tensor([index[u] for u in uids], dtype=torch.long)


def post_update_metrics(data: dict) -> dict[str, float]:
    """The post-update metrics from [B,T] tensors of the real rows: ``kl`` (per token), ``new_logp``,
    ``old_logp``, ``advantages``, ``response_mask``, ``responses`` and the prompt ``uids`` (list)."""
    from runners.algorithms.diagnostics import conflict_tokens, kl_exceedance

    mask = data["response_mask"]
    real = mask > 0
    out: dict[str, float] = {}
    if bool(real.any()):
        kl = data["kl"][real]
        out[metric_names.POST_UPDATE_KL] = float(kl.double().mean())
        out[metric_names.POST_UPDATE_KL_MAX] = float(kl.max())
        out.update(kl_exceedance(kl))
    groups = _group_ids(data["uids"])
    if groups.unique().numel() < mask.shape[0]:
        conflicts = conflict_tokens(data["responses"], mask, groups, data["advantages"], mask=mask)
        if bool(conflicts.any()):
            delta = (data["new_logp"] - data["old_logp"])[conflicts]
            out[metric_names.GTPO_CONFLICT_PROB_DELTA] = float(delta.double().mean())
    return out


def post_update_pass(trainer: Any, batch: Any, chunk_size: int) -> dict[str, float]:
    """One log-prob pass of the updated actor over ``batch`` (a KVBatchMeta) and its metrics."""
    import transfer_queue as tq
    from verl.workers.utils.padding import response_from_nested

    from runners.backends.verl.plugins.sparse_old import POST_KL_OUTPUT, POST_UPDATE_KEY, padded_from_nested

    extra = {
        "calculate_entropy": False,
        "compute_loss": False,
        "temperature": trainer.config.actor_rollout_ref.rollout.temperature,
        POST_UPDATE_KEY: int(chunk_size),
    }
    saved = {key: batch.extra_info.get(key) for key in extra}
    batch.extra_info.update(extra)
    try:
        trainer.actor_rollout_wg.compute_log_prob(batch)
    finally:
        for key, value in saved.items():
            if value is None:
                batch.extra_info.pop(key, None)
            else:
                batch.extra_info[key] = value
    fields = [POST_KL_OUTPUT, "log_probs", "old_log_probs", "advantages", "response_mask", "responses", "uid"]
    got = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
    got["log_probs"] = response_from_nested(got["log_probs"], got["response_mask"])  # verl writes whole sequences
    real = [i for i, tag in enumerate(batch.tags) if not tag.get("is_padding", False)]
    width = int(got["response_mask"].offsets().diff().max())
    pad = {key: padded_from_nested(got[key], width, 0)[real] for key in fields if key != "uid"}
    uids = got["uid"].tolist() if hasattr(got["uid"], "tolist") else list(got["uid"])
    return post_update_metrics(
        {
            "kl": pad[POST_KL_OUTPUT].float(),
            "new_logp": pad["log_probs"].float(),
            "old_logp": pad["old_log_probs"].float(),
            "advantages": pad["advantages"].float(),
            "response_mask": pad["response_mask"].float(),
            "responses": pad["responses"].long(),
            "uids": [uids[i] for i in real],
        }
    )


__all__ = [
    "POST_UPDATE_PHASE",
    "install_cpu_timing",
    "node_cpu_seconds",
    "post_update_metrics",
    "post_update_pass",
    "step_cpu_metrics",
]
