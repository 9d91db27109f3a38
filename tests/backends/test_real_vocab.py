"""Every preset with a real vocabulary (V = 49,152, SmolLM2's tokenizer), where top-K keeps part of the mass.

The embedded model's 28-token vocabulary makes every sparse path exact (top-64 keeps all of it). Here a
tiny random Llama over SmolLM2's tokenizer (``model=tiny_llama_v49k``) trains 2 iterations of every
algorithm preset through ``runners.run.run``, off-policy (2 epochs x 2 mini-batches per rollout) and with
a shaped reward that varies within groups (``char_coverage``; a random model scores 0 on every
verifiable reward, so nothing would update).

For the method metrics, the trainer's old-log-prob pass and micro-batch losses are recorded (their
dense logits included) and each metric of the last off-policy micro-batch is recomputed here from the
dense [T, V] distributions, independently of the library's sparse code:

- ``troll/kept_mass``, ``troll/kl_before``, ``troll/projected_frac`` from the explicit V-dimensional
  sparse pair (TROLL, arXiv 2510.03817, Definition A.1), ``troll/kl_after`` from the dual of eq. 4 solved
  by scipy's bounded scalar minimiser over the whole vocabulary;
- ``trm/max_kl``, ``trm/mean_kl``, ``trm/accept_rate`` (exact-KL TRM-Max) from the dense coarse-grained
  KL (kept tokens plus one rest bin; at most the dense KL, also checked);
- ``trm/max_kl`` / ``trm/mean_kl`` of the sample-based TRM-Max (k2 / k3 of the sampled tokens);
- ``gtpo/conflict_frac`` from a plain loop over each group's aligned tokens (GTPO, arXiv 2508.03772,
  section 5.1).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from runners.config import compose

CONF = Path(__file__).resolve().parents[2] / "conf"
PRESETS = sorted(p.stem for p in (CONF / "algorithm").glob("*.yaml"))
V = 49152
BASE = [
    "model=tiny_llama_v49k",
    "dataset.reward=char_coverage",
    "trainer.total_steps=2",
    "trainer.prompts_per_step=2",
    "trainer.n=4",
    "trainer.mini_batch_prompts=1",
    "trainer.ppo_epochs=2",
    "trainer.lr=0.01",
    "trainer.eval_every=0",
    "trainer.checkpoint_every=0",
    "rollout.max_response_length=12",
    "rollout.temperature=0.5",
    "progress=false",
    "experiment=real_vocab",
]


class Recorder:
    """Records the trainer's old-pass logits and every micro-batch's inputs and metrics."""

    def __init__(self, monkeypatch):
        from runners.backends.local import actor, trainer

        self.old_logits: list[torch.Tensor] = []
        self.calls: list[dict] = []
        real_old_pass, real_micro = actor.old_pass, actor.micro_batch_loss

        def old_pass(forward, data, **kw):
            def recording(d, rows):
                logits = forward(d, rows)
                self.old_logits.append(logits.detach().double())
                return logits

            self.old_logits = []
            out = real_old_pass(recording, data, **kw)
            self.old = {"logits": torch.cat(self.old_logits), **out, "data": data}
            return out

        def micro_batch_loss(loss_fn, logits, data, old, advantages, mask, rows, **kw):
            out = real_micro(loss_fn, logits, data, old, advantages, mask, rows, **kw)
            self.calls.append(
                {
                    "logits": logits.detach().double(),
                    "old_logits": self.old["logits"][rows],
                    "rows": rows,
                    "responses": data["responses"][rows],
                    "groups": data["group_index"][rows],
                    "mask": mask[rows],
                    "advantages": advantages[rows],
                    "index": old["old_topk_index"][rows] if "old_topk_index" in old else None,
                    "topk_logp": old["old_topk_logp"][rows] if "old_topk_logp" in old else None,
                    "rollout_logp": data["rollout_logp"][rows],
                    "method": loss_fn.method,
                    "metrics": dict(out.metrics),
                }
            )
            return out

        monkeypatch.setattr(trainer, "old_pass", old_pass)
        monkeypatch.setattr(actor, "micro_batch_loss", micro_batch_loss)

    def last_off_policy(self) -> dict:
        """The last micro-batch of the last iteration: second epoch, so the policy has moved."""
        return self.calls[-1]


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """One MLflow store for the module (its schema is created once)."""
    return tmp_path_factory.mktemp("real_vocab")


def _train(overrides, home, monkeypatch, record=False):
    from runners.run import run

    monkeypatch.setenv("TRUSTBENCH_HOME", str(home))
    recorder = Recorder(monkeypatch) if record else None
    cfg, choices = compose([*BASE, *overrides])
    result = run(cfg, choices)
    assert result["status"] == "FINISHED"
    metrics = result["metrics"]
    assert all(math.isfinite(v) for v in metrics.values()), {k: v for k, v in metrics.items() if not math.isfinite(v)}
    return result, recorder


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_trains_with_a_real_vocabulary(preset, home, monkeypatch):
    extra = ["rollout.max_response_length=16", "rollout.window=8"] if preset == "tppo" else []
    result, _ = _train([f"algorithm={preset}", *extra], home, monkeypatch)
    assert result["metrics"]["actor/grad_norm"] > 0, "the update must move the policy"


# -- dense references ------------------------------------------------------------------------------
def _flat(call: dict, key: str) -> torch.Tensor:
    real = call["mask"].reshape(-1) > 0
    value = call[key]
    return value.reshape(-1, *value.shape[2:])[real]


def _kept(index: torch.Tensor, topk_logp: torch.Tensor) -> torch.Tensor:
    kept = torch.zeros(index.shape[0], V, dtype=torch.bool)
    for row in range(index.shape[0]):
        kept[row, index[row][topk_logp[row] > -math.inf]] = True
    return kept


def _explicit_sparse(logp: torch.Tensor, kept: torch.Tensor, p_default: float) -> torch.Tensor:
    """Definition A.1: kept tokens renormalised to 1 - (V - |S|) p_d, every other token p_d (log-probs)."""
    rest = (V - kept.sum(-1, keepdim=True)).double() * p_default
    on_s = torch.where(kept, logp, -math.inf)
    on_s = on_s - torch.logsumexp(on_s, -1, keepdim=True) + torch.log1p(-rest)
    return torch.where(kept, on_s, math.log(p_default))


def _kl(lp: torch.Tensor, lq: torch.Tensor) -> torch.Tensor:
    return (lp.exp() * (lp - lq)).sum(-1)


def _projected_kl(lq: torch.Tensor, lo: torch.Tensor, eps: float) -> float:
    """KL(q_proj || q_old) with eta* from scipy on the dual f(eta) = eta eps + (eta+1) lse((lq + eta lo)/(eta+1))."""
    from scipy.optimize import minimize_scalar

    def dual(log_eta):
        eta = math.exp(log_eta)
        return eta * eps + (eta + 1) * float(torch.logsumexp((lq + eta * lo) / (eta + 1), -1))

    best = minimize_scalar(dual, bounds=(math.log(1e-7), math.log(1e2)), method="bounded", options={"xatol": 1e-10})
    eta = math.exp(best.x)
    lp = torch.log_softmax((eta * lo + lq) / (eta + 1), -1)
    return float(_kl(lp, lo))


def _check_troll_call(call: dict) -> float:
    """Recompute one micro-batch's troll/* metrics densely; returns its projected fraction."""
    p_d = call["method"].objective_kw["p_default"]
    eps = call["method"].objective_kw["eps"]
    q = torch.log_softmax(_flat(call, "logits"), -1)
    old = torch.log_softmax(_flat(call, "old_logits"), -1)
    kept = _kept(_flat(call, "index"), _flat(call, "topk_logp"))
    assert float(old.exp().masked_fill(~kept, 0).sum(-1).median()) < 0.9  # top-64 misses real mass
    lq, lo = _explicit_sparse(q, kept, p_d), _explicit_sparse(old, kept, p_d)
    kl_before = _kl(lq, lo)
    projected = kl_before > eps
    kl_after = kl_before.clone()
    for i in torch.nonzero(projected).squeeze(-1).tolist():
        kl_after[i] = _projected_kl(lq[i], lo[i], eps)
    m = call["metrics"]
    assert m["troll/kept_mass"] == pytest.approx(float(q.exp().masked_fill(~kept, 0).sum(-1).mean()), rel=1e-4)
    assert m["troll/projected_frac"] == pytest.approx(float(projected.double().mean()), abs=1e-9)
    assert m["troll/kl_before"] == pytest.approx(float(kl_before.mean()), rel=1e-4, abs=1e-9)
    assert m["troll/kl_after"] == pytest.approx(float(kl_after.mean()), rel=1e-3, abs=1e-9)
    assert float(kl_after.max()) <= eps * (1 + 1e-3)  # the projection holds the trust region
    return float(projected.double().mean())


def test_troll_metrics_equal_dense_references(home, monkeypatch):
    _, rec = _train(["algorithm=grpo", "objective=troll", "objective.eps=0.075"], home, monkeypatch, record=True)
    fractions = [_check_troll_call(call) for call in rec.calls]
    assert any(0 < f < 1 for f in fractions), f"some off-policy micro-batch must be partly projected: {fractions}"


def _check_exact_trm_call(call: dict, delta: float) -> float:
    q = torch.log_softmax(_flat(call, "logits"), -1)
    p = torch.log_softmax(_flat(call, "old_logits"), -1)
    kept = _kept(_flat(call, "index"), _flat(call, "topk_logp"))
    p_rest = p.exp().masked_fill(kept, 0).sum(-1)
    q_rest = q.exp().masked_fill(kept, 0).sum(-1)
    coarse = (p.exp() * (p - q)).masked_fill(~kept, 0).sum(-1) + p_rest * (p_rest.log() - q_rest.log())
    assert torch.all(coarse <= _kl(p, q) + 1e-6)  # a lower bound of the dense KL
    m = call["metrics"]
    assert m["trm/max_kl"] == pytest.approx(float(coarse.max()), rel=1e-4, abs=1e-6)
    assert m["trm/mean_kl"] == pytest.approx(float(coarse.mean()), rel=1e-4, abs=1e-6)
    per_token = torch.zeros(call["mask"].shape, dtype=torch.float64)
    per_token[call["mask"] > 0] = coarse
    keep = (per_token.max(-1).values <= delta).double()  # keep iff the sequence's max token KL <= delta
    assert m["trm/accept_rate"] == pytest.approx(float(keep.mean()))
    return float(keep.mean())


def test_exact_trm_metrics_equal_dense_references(home, monkeypatch):
    _, rec = _train(["algorithm=grpo", "mask=trm_max", "mask.delta=0.001"], home, monkeypatch, record=True)
    rates = [_check_exact_trm_call(call, 0.001) for call in rec.calls]
    assert min(rates) < 1 and max(rates) > 0, f"the mask must reject some sequences and keep others: {rates}"


def test_sample_trm_metrics_equal_their_definition(home, monkeypatch):
    _, rec = _train(["algorithm=grpo", "mask=trm_max_k2", "mask.delta=0.05"], home, monkeypatch, record=True)
    call = rec.last_off_policy()
    real = call["mask"] > 0
    logp = torch.log_softmax(call["logits"], -1).gather(-1, call["responses"][..., None])[..., 0]
    log_ratio = (logp - call["rollout_logp"].double())[real]
    m = call["metrics"]
    assert m["trm/max_kl"] == pytest.approx(float((0.5 * log_ratio**2).max()), rel=1e-4)
    assert m["trm/mean_kl"] == pytest.approx(float((log_ratio.exp() - 1 - log_ratio).mean()), rel=1e-4)


def _leading_conflicts(seqs: list[list[int]], i: int, pos: list[int], neg: list[int]) -> int:
    """Length of the run, from position 0, where response i's token also sits at that position in some
    positive and some negative response of its group."""
    run = 0
    for step, token in enumerate(seqs[i]):
        at = [seqs[j][step] if step < len(seqs[j]) else None for j in range(len(seqs))]
        if not (any(at[j] == token for j in pos) and any(at[j] == token for j in neg)):
            break
        run += 1
    return run


def _conflict_fraction(call: dict) -> float:
    """GTPO section 5.1 by hand: forward spans on the responses, backward spans on them reversed."""
    mask = call["mask"] > 0
    lengths = mask.sum(-1).tolist()
    seqs = [row[:n] for row, n in zip(call["responses"].tolist(), lengths)]
    groups = call["groups"].tolist()
    adv = [float((call["advantages"][i] * mask[i]).sum()) / max(1, lengths[i]) for i in range(len(seqs))]
    in_span = 0
    for i in range(len(seqs)):
        if adv[i] == 0:
            continue
        mates = [j for j in range(len(seqs)) if groups[j] == groups[i]]
        pos, neg = [j for j in mates if adv[j] > 0], [j for j in mates if adv[j] < 0]
        forward = _leading_conflicts(seqs, i, pos, neg)
        backward = _leading_conflicts([s[::-1] for s in seqs], i, pos, neg)
        in_span += len(set(range(forward)) | {lengths[i] - 1 - t for t in range(backward)})
    return in_span / max(1, int(mask.sum()))


def test_gtpo_conflicts_equal_a_plain_loop(home, monkeypatch):
    # a larger initialisation makes the random model's distributions peaked: responses of a group share
    # tokens at aligned positions, which is what GTPO's conflict spans look for
    _, rec = _train(["algorithm=gtpo", "+model.options.initializer_range=0.3"], home, monkeypatch, record=True)
    fractions = []
    for call in rec.calls:
        expected = _conflict_fraction(call)
        assert call["metrics"]["gtpo/conflict_frac"] == pytest.approx(expected, abs=1e-9)
        fractions.append(expected)
    assert max(fractions) > 0, "some micro-batch must hold conflict tokens"
