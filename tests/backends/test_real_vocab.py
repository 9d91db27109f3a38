"""Every preset with a real vocabulary (V = 49,152, SmolLM2's tokenizer), where top-K keeps part of the mass.

The embedded model's 28-token vocabulary makes every sparse path exact (top-64 keeps all of it). Here a
tiny random Llama over SmolLM2's tokenizer (``model=tiny_llama_v49k``) trains 2 iterations of every
algorithm preset through ``runners.run.run``, off-policy (2 epochs x 2 mini-batches per rollout) and with
a shaped reward that varies within groups (``char_coverage``; a random model scores 0 on every
verifiable reward, so nothing would update). So do the objectives and masks no preset uses
(``troll_seq``, ``cispo``, ``dual_clip``; ``trm_avg``, ``trm_max_avg``, ``trm_avg_k3``,
``trm_max_avg_sample``, ``ln_trm``, ``ser``), and Qwen's output size (V = 151,936,
``tiny_qwen2_v152k`` with TROLL, ``tiny_qwen3_v152k`` with PPO and exact-KL TRM).

For every preset, the gradient of the trainer's loss for each on-policy micro-batch (the first
mini-batch of each iteration) is compared entry by entry with the gradient of the preset's loss written
here from the papers over the dense float64 distributions (log_softmax over the whole vocabulary,
gathered at the sampled tokens; the entropy over the whole vocabulary for GTPO's penalty and the
entropy bonus). At these vocabularies the update goes through ``chunked_head`` and holds no logits, so
the comparison is on the last hidden states: the reference's gradient with respect to all V logits
mapped through the output layer (dL/dh = dL/dz W / T) against the trainer's dL/dh.

For the method metrics, the trainer's old-log-prob pass and micro-batch losses are recorded (their
dense logits included) and each metric of the last off-policy micro-batch is recomputed here from the
dense [T, V] distributions, independently of the library's sparse code:

- ``troll/kept_mass``, ``troll/kl_before``, ``troll/projected_frac`` from the explicit V-dimensional
  sparse pair (TROLL, arXiv 2510.03817, Definition A.1), ``troll/kl_after`` from the dual of eq. 4 solved
  by scipy's bounded scalar minimiser over the whole vocabulary;
- ``trm/max_kl``, ``trm/mean_kl``, ``trm/accept_rate`` (exact-KL TRM-Max) from the dense coarse-grained
  KL (kept tokens plus one rest bin; at most the dense KL, also checked);
- ``trm/max_kl`` / ``trm/mean_kl`` of the sample-based TRM-Max (k2 / k3 of the sampled tokens);
- for every mask, each sequence's keep decision from its definition and the monitoring metrics:
  ``trm/accept_rate`` overall and by length (``trm/accept_rate/len_*``), ``trm/ppl_gap`` (eq. 52) and,
  with stored distributions, ``trm/tv/pos_*`` (the Adaptive bound's Dbar by position, dense TV);
- ``gtpo/filtered_frac`` (eq. 6, dense entropies) with H_ini below ln 2;
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
    "dataset.train_limit=64",  # encoding every training prompt cost more than the training
    "dataset.eval_limit=4",
    "progress=false",
    "experiment=real_vocab",
]


EDGES = [0, 4, 8, 13]  # trainer.length_buckets (responses have at most 12 tokens): three buckets
BUCKETS = f"trainer.length_buckets=[{','.join(map(str, EDGES))}]"


def _dense(out) -> torch.Tensor:
    """float64 logits of a forward's output: the logits themselves, or those of a ``Head`` (the chunked
    passes of large vocabularies) computed here from its hidden states and output layer."""
    from runners.backends.local.policy import Head

    if not isinstance(out, Head):
        return out.detach().double()
    z = out.hidden.detach().double() @ out.weight.detach().double().T
    z = z if out.bias is None else z + out.bias.detach().double()
    return z / out.temperature


class Recorder:
    """Records the trainer's old-pass logits and every micro-batch's inputs and metrics."""

    def __init__(self, monkeypatch, keep_last: bool = False):
        from runners.backends.local import actor, trainer

        self.keep_last = keep_last  # V = 151,936: the dense logits of every micro-batch would take GBs

        self.old_logits: list[torch.Tensor] = []
        self.calls: list[dict] = []
        real_old_pass, real_micro = actor.old_pass, actor.micro_batch_loss

        def old_pass(forward, batch, **kw):
            def recording(b, rows):
                out = forward(b, rows)
                self.old_logits.append(_dense(out))  # a Head (the chunked old pass): from h and W
                return out

            self.old_logits = []
            out = real_old_pass(recording, batch, **kw)
            self.old = {"logits": torch.cat(self.old_logits), "pass": out, "batch": batch}
            return out

        def micro_batch_loss(loss_fn, logits, batch, old, advantages, mask, rows, **kw):
            out = real_micro(loss_fn, logits, batch, old, advantages, mask, rows, **kw)
            if self.keep_last:
                self.calls.clear()
            self.calls.append(
                {
                    "logits": _dense(logits),
                    "old_logits": self.old["logits"][rows],
                    "rows": rows,
                    "responses": batch.responses[rows],
                    "groups": batch.group_index[rows],
                    "mask": mask[rows],
                    "advantages": advantages[rows],
                    "index": old.old_topk_index[rows] if old.old_topk_index is not None else None,
                    "topk_logp": old.old_topk_logp[rows] if old.old_topk_logp is not None else None,
                    "rollout_logp": batch.rollout_logp[rows],
                    "method": loss_fn.method,
                    "h_ini": kw.get("h_ini"),
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


def _train(overrides, home, monkeypatch, record=False, keep_last=False):
    from runners.run import run

    monkeypatch.setenv("TRUSTBENCH_HOME", str(home))
    recorder = Recorder(monkeypatch, keep_last) if record else None
    changed = {o.split("=")[0].lstrip("+") for o in overrides}
    cfg, choices = compose([*(b for b in BASE if b.split("=")[0] not in changed), *overrides])
    result = run(cfg, choices)
    assert result["status"] == "FINISHED"
    metrics = result["metrics"]
    assert all(math.isfinite(v) for v in metrics.values()), {k: v for k, v in metrics.items() if not math.isfinite(v)}
    return result, recorder


class OnPolicyUpdates:
    """Records the micro-batches that see the sampling policy itself (the first mini-batch of each
    iteration, before its optimiser step): dense logits, the gradient of the trainer's loss with
    respect to them (a hook on the logits) and the loss's inputs. Where the update goes through
    ``chunked_head`` (V >= its MIN_VOCAB) no logits exist: the hook sits on the hidden states, and the
    output layer ``W`` and temperature are kept to map the reference's logit gradient onto them."""

    def __init__(self, monkeypatch):
        from runners.backends.local import actor

        self.calls: list[dict] = []
        real_micro = actor.micro_batch_loss

        def micro_batch_loss(loss_fn, logits, batch, old, advantages, mask, rows, **kw):
            from runners.backends.local.policy import Head

            dense = _dense(logits)
            responses = batch.responses[rows]
            logp = torch.log_softmax(dense, -1).gather(-1, responses[..., None])[..., 0]
            real = mask[rows] > 0
            if real.any() and float((logp - old.old_logp[rows].double())[real].abs().max()) < 1e-5:
                call = {
                    "logits": dense,
                    "responses": responses,
                    "groups": batch.group_index[rows],
                    "mask": mask[rows].double(),
                    "advantages": advantages[rows].double(),
                    "old_logp": old.old_logp[rows].double(),
                    "ref": old.ref_logp is not None,
                    "method": loss_fn.method,
                    "kw": dict(kw),
                    # the entropy controllers' coefficients now (REPO's zeta, the bonus's beta): they start
                    # at the configured zeta0 / beta0 and move once per iteration
                    "zeta": getattr(loss_fn.controller, "zeta", None),
                    "beta": getattr(loss_fn.controller, "beta", None),
                }

                def keep(grad):  # returns None: the gradient itself is left as it is
                    call["grad"] = grad.detach().double()

                if isinstance(logits, Head):
                    call["head"] = (logits.weight.detach().double(), logits.temperature)
                    logits.hidden.register_hook(keep)
                else:
                    logits.register_hook(keep)
                self.calls.append(call)
            return real_micro(loss_fn, logits, batch, old, advantages, mask, rows, **kw)

        monkeypatch.setattr(actor, "micro_batch_loss", micro_batch_loss)


def _gtpo_weights(call: dict) -> torch.Tensor:
    """GTPO (arXiv 2508.03772) eq. 5 with spans combined by OR (section 5.1): lambda = 1 off the
    conflict spans; on them 2 for A > 0 and 0 for A < 0 responses (plain loops, ``_conflict_positions``)."""
    mask, adv, spans = _conflict_positions(call)
    lam = torch.ones(mask.shape, dtype=torch.float64)
    for i, positions in spans.items():
        for t in positions:
            lam[i, t] = 2.0 if adv[i] > 0 else 0.0
    return lam


def _dense_reference_loss(call: dict, logits: torch.Tensor) -> torch.Tensor:
    """The preset's loss of the recorded micro-batch, from the dense distributions over the whole
    vocabulary (float64 log_softmax, gathered at the sampled tokens), written from the papers:

    - ratio r = exp(logp - old_logp); PPO clip, DAPO / BAPO / ADAPO bounds and Token-IS give the
      per-token loss -r A at r = 1 (every bound is inactive there: calls are recorded only where
      |logp - old_logp| < 1e-5); GSPO
      -s A with s = exp(mean_t(logp - old_logp)) (sequence ratio); GPG -logp A;
    - GTPO (arXiv 2508.03772) eq. 7: -delta_i A lambda r + gamma H (the penalty form), H the token
      entropy over the whole vocabulary, delta_i the entropy filter of eq. 6;
    - REPO-R / REPO-D (Entropy-preserving RL, arXiv 2603.11682, section 5): A(1 - zeta logp) clamped
      at >= 0 for A > 0, A(1 + zeta logp) clamped at <= 0 for A < 0 / A - zeta logp, logp detached;
      the entropy bonus adds -beta H per token (appendix C.3); zeta / beta as the controller holds
      them at the call (the first call's are checked against the configured zeta0 / beta0);
    - aggregation (verl's agg_loss): token-mean over the mini-batch's tokens, seq-mean-token-mean,
      seq-mean-token-sum-norm (Dr.GRPO, arXiv 2503.20783: token sum / a constant length).
    """
    method = call["method"]
    mask, adv, old = call["mask"], call["advantages"], call["old_logp"]
    logq = torch.log_softmax(logits, -1)
    logp = logq.gather(-1, call["responses"][..., None])[..., 0]
    entropy = -(logq.exp() * logq).sum(-1)
    if method.entropy_control == "repo_r":
        zeta, lp = call["zeta"], logp.detach()
        adv = torch.where(
            adv > 0,
            (adv * (1 - zeta * lp)).clamp(min=0),
            torch.where(adv < 0, (adv * (1 + zeta * lp)).clamp(max=0), adv),
        )
    elif method.entropy_control == "repo_d":
        adv = adv - call["zeta"] * logp.detach()
    ratio = torch.exp(logp - old)
    kw = dict(method.objective_kw)
    if method.objective in ("clip", "bapo", "token_is"):
        loss = -ratio * adv
    elif method.objective == "gspo":
        seq_ratio = torch.exp(((logp - old) * mask).sum(-1) / mask.sum(-1).clamp(min=1))
        loss = -seq_ratio[:, None] * adv
    elif method.objective == "gpg":
        loss = -logp * adv
    elif method.objective == "gtpo":
        assert kw.get("entropy_term", "penalty") == "penalty" and kw.get("combine", "or") == "or"
        h_seq = (entropy.detach() * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        h_ini = call["kw"].get("h_ini")
        delta = torch.ones_like(h_seq)
        if h_ini is not None and h_ini < math.log(2):
            delta = (h_seq <= kw.get("entropy_threshold", math.log(2))).double()
        loss = -delta[:, None] * adv * _gtpo_weights(call) * ratio + kw["gamma"] * entropy
    else:
        raise AssertionError(f"no reference for objective {method.objective!r}")
    if method.entropy_control == "bonus":
        loss = loss - call["beta"] * entropy
    num_tokens, num_seqs = float(call["kw"]["num_tokens"]), float(call["kw"]["num_seqs"])
    if method.loss_agg == "token-mean":
        return (loss * mask).sum() / num_tokens
    if method.loss_agg == "seq-mean-token-mean":
        return ((loss * mask).sum(-1) / mask.sum(-1).clamp(min=1)).sum() / num_seqs
    if method.loss_agg == "seq-mean-token-sum-norm":
        return ((loss * mask).sum(-1) / method.norm_len).sum() / num_seqs
    raise AssertionError(f"no reference for loss_agg {method.loss_agg!r}")


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_trains_with_a_real_vocabulary(preset, home, monkeypatch):
    """Each preset's on-policy updates (the first mini-batch of each iteration): the gradient of the
    trainer's loss equals the gradient of the preset's loss computed here from the dense float64
    distributions over all V = 49,152 logits (``_dense_reference_loss``): with respect to the hidden
    states through the chunked head (dL/dz W / T, within 1e-5 of the largest entry), or entry by entry
    with respect to the logits on the dense path. Off the sampled token each logit's entry is
    -coefficient x p(v); a log-prob taken from part of the vocabulary, a sign, a missing normalisation or
    a wrong aggregation shows in both."""
    extra = ["rollout.max_response_length=16", "rollout.window=8"] if preset == "tppo" else []
    updates = OnPolicyUpdates(monkeypatch)
    result, _ = _train([f"algorithm={preset}", *extra], home, monkeypatch)
    assert result["metrics"]["actor/grad_norm"] > 0, "the update must move the policy"
    assert len(updates.calls) >= 2, "the first mini-batch of each iteration is on-policy"
    method = updates.calls[0]["method"]
    if method.entropy_control in ("repo_r", "repo_d"):
        assert updates.calls[0]["zeta"] == method.entropy_control_kw["zeta0"] > 0
    if method.entropy_control == "bonus":
        assert updates.calls[0]["beta"] == method.entropy_control_kw.get("beta0", 1e-3) > 0
    chunked = []
    for call in updates.calls:
        assert call["logits"].shape[-1] == V and "grad" in call
        assert not call["ref"] and call["kw"].get("is_weights") is None  # no KL or rollout-correction term
        real = call["mask"] > 0
        logits = call["logits"].clone().requires_grad_(True)
        (expected,) = torch.autograd.grad(_dense_reference_loss(call, logits), logits)
        grad = call["grad"]
        assert bool((grad[~real] == 0).all())  # padding (where there is any) gets no gradient
        if "head" in call:  # the chunked update: dL/dh = dL/dz W / T, against the hidden states' gradient
            weight, temperature = call["head"]
            to_hidden = expected @ weight / temperature
            torch.testing.assert_close(grad, to_hidden, rtol=1e-4, atol=1e-5 * float(to_hidden.abs().max()))
            chunked.append(call)
            continue
        # entry by entry: the trainer's float32 gradients are within 3e-6 of the float64 reference
        # (relative), 2e-5 where the entropy's gradient nearly cancels; off the sampled token entries
        # are ~ scale / V, so the absolute floor (for entries near 0) sits far below them
        scale = float(expected.abs().max())
        torch.testing.assert_close(grad, expected, rtol=1e-4, atol=1e-9 * scale)
    adv = torch.cat([call["advantages"][call["mask"] > 0] for call in updates.calls])
    assert bool((adv > 0).any() and (adv < 0).any()), "positive and negative advantages among the checked updates"
    dense = [c for c in updates.calls if not any(c is h for h in chunked)]
    if dense:
        acting = [(c["grad"][c["advantages"] != 0], c["responses"][c["advantages"] != 0]) for c in dense]
        grad, sampled = torch.cat([g for g, _ in acting]), torch.cat([r for _, r in acting])
        off = grad.scatter(-1, sampled[:, None], 0.0)  # the entries off the sampled token
        assert float((off != 0).double().mean()) > 0.99, "the gradient reaches the whole vocabulary"


# -- dense references ------------------------------------------------------------------------------
def _flat(call: dict, key: str) -> torch.Tensor:
    real = call["mask"].reshape(-1) > 0
    value = call[key]
    return value.reshape(-1, *value.shape[2:])[real]


def _kept(index: torch.Tensor, topk_logp: torch.Tensor, vocab: int = V) -> torch.Tensor:
    kept = torch.zeros(index.shape[0], vocab, dtype=torch.bool)
    for row in range(index.shape[0]):
        kept[row, index[row][topk_logp[row] > -math.inf]] = True
    return kept


def _explicit_sparse(logp: torch.Tensor, kept: torch.Tensor, p_default: float) -> torch.Tensor:
    """Definition A.1: kept tokens renormalised to 1 - (V - |S|) p_d, every other token p_d (log-probs)."""
    rest = (kept.shape[-1] - kept.sum(-1, keepdim=True)).double() * p_default
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
    kept = _kept(_flat(call, "index"), _flat(call, "topk_logp"), q.shape[-1])
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
    kept = _kept(_flat(call, "index"), _flat(call, "topk_logp"), q.shape[-1])
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
    _, rec = _train(["algorithm=grpo", "mask=trm_max", "mask.delta=0.001", BUCKETS], home, monkeypatch, record=True)
    rates = [_check_exact_trm_call(call, 0.001) for call in rec.calls]
    for call in rec.calls:  # the monitoring: by length, by position (TV), PPL gap
        _check_trm_monitoring("trm_max", {"delta": 0.001}, call)
    assert min(rates) < 1 and max(rates) > 0, f"the mask must reject some sequences and keep others: {rates}"


def test_sample_trm_metrics_equal_their_definition(home, monkeypatch):
    _, rec = _train(["algorithm=grpo", "mask=trm_max_k2", "mask.delta=0.05", BUCKETS], home, monkeypatch, record=True)
    for each in rec.calls:
        _check_trm_monitoring("trm_max_k2", {"delta": 0.05}, each)
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


def _conflict_positions(call: dict) -> tuple[torch.Tensor, list[float], dict[int, set[int]]]:
    """GTPO section 5.1 by hand: (mask, each response's advantage, {response: its positions in a
    conflict span}), forward spans on the responses, backward spans on them reversed."""
    mask = call["mask"] > 0
    lengths = mask.sum(-1).tolist()
    seqs = [row[:n] for row, n in zip(call["responses"].tolist(), lengths)]
    groups = call["groups"].tolist()
    adv = [float((call["advantages"][i] * mask[i]).sum()) / max(1, lengths[i]) for i in range(len(seqs))]
    spans = {}
    for i in range(len(seqs)):
        if adv[i] == 0:
            continue
        mates = [j for j in range(len(seqs)) if groups[j] == groups[i]]
        pos, neg = [j for j in mates if adv[j] > 0], [j for j in mates if adv[j] < 0]
        forward = _leading_conflicts(seqs, i, pos, neg)
        backward = _leading_conflicts([s[::-1] for s in seqs], i, pos, neg)
        spans[i] = set(range(forward)) | {lengths[i] - 1 - t for t in range(backward)}
    return mask, adv, spans


def _conflict_fraction(call: dict) -> float:
    """Share of real tokens in a conflict span (``_conflict_positions``)."""
    mask, _, spans = _conflict_positions(call)
    return sum(map(len, spans.values())) / max(1, int(mask.sum()))


def _filtered_fraction(call: dict) -> float:
    """GTPO (arXiv 2508.03772) eq. 6 by hand: with H_ini < ln 2, a response whose mean token entropy
    (dense, over the whole vocabulary) exceeds the threshold (ln 2 in the paper; ``entropy_threshold``)
    is filtered; the fraction of non-empty responses."""
    h_ini = call["h_ini"]
    threshold = call["method"].objective_kw.get("entropy_threshold", math.log(2))
    mask = call["mask"] > 0
    logp = torch.log_softmax(call["logits"], -1)
    entropy = -(logp.exp() * logp).sum(-1)
    rows = [i for i in range(mask.shape[0]) if mask[i].any()]
    if h_ini is None or h_ini >= math.log(2):
        return 0.0
    return sum(float(entropy[i][mask[i]].mean()) > threshold for i in rows) / len(rows)


def test_gtpo_conflicts_equal_a_plain_loop(home, monkeypatch):
    """gtpo/conflict_frac and gtpo/filtered_frac from plain loops over the dense distributions. A larger
    initialisation and a low temperature make the random model's distributions peaked: responses of a
    group share tokens at aligned positions (what GTPO's conflict spans look for), and H_ini falls below
    ln 2, which turns eq. 6's entropy filter on; its response threshold sits inside their spread."""
    overrides = [
        "algorithm=gtpo",
        "+model.options.initializer_range=1.0",
        "rollout.temperature=0.25",
        "trainer.eval_temperature=0.25",  # H_ini is measured like the evaluation samples
        "objective.entropy_threshold=0.2",
    ]
    _, rec = _train(overrides, home, monkeypatch, record=True)
    fractions, filtered = [], []
    for call in rec.calls:
        expected = _conflict_fraction(call)
        assert call["metrics"]["gtpo/conflict_frac"] == pytest.approx(expected, abs=1e-9)
        fractions.append(expected)
        filtered.append(_filtered_fraction(call))
        assert call["metrics"]["gtpo/filtered_frac"] == pytest.approx(filtered[-1], abs=1e-9)
    assert max(fractions) > 0, "some micro-batch must hold conflict tokens"
    assert rec.calls[0]["h_ini"] < math.log(2) and any(0 < f < 1 for f in filtered), (rec.calls[0]["h_ini"], filtered)


# -- objectives and masks no preset trains -------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("objective", ["troll_seq", "cispo", "dual_clip"])
def test_objectives_train_with_a_real_vocabulary(objective, home, monkeypatch):
    result, _ = _train(["algorithm=grpo", f"objective={objective}"], home, monkeypatch)
    assert result["metrics"]["actor/grad_norm"] > 0, "the update must move the policy"


def _dense_token_divergences(call: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Token KL and TV [B,T] of the coarse-grained pair (stored support + one rest bin), from the dense
    distributions of the rollout (old) and current policy."""
    q = torch.log_softmax(call["logits"], -1)
    p = torch.log_softmax(call["old_logits"], -1)
    B, T, vocab = q.shape
    kept = _kept(call["index"].reshape(B * T, -1), call["topk_logp"].reshape(B * T, -1), vocab).reshape(B, T, vocab)
    p_rest = p.exp().masked_fill(kept, 0).sum(-1)
    q_rest = q.exp().masked_fill(kept, 0).sum(-1)
    kl = (p.exp() * (p - q)).masked_fill(~kept, 0).sum(-1) + p_rest * (p_rest.log() - q_rest.log())
    tv = 0.5 * ((p.exp() - q.exp()).abs().masked_fill(~kept, 0).sum(-1) + (p_rest - q_rest).abs())
    return kl, tv


def _ln_trm_score(dev: list[float], delta: float) -> float:
    """TRM (arXiv 2512.23075) eq. 76-77 by hand: w_t = min(1, sqrt((T - t) delta / 2)), t = 1..T."""
    T = len(dev)
    w = [min(1.0, math.sqrt((T - t) * delta / 2)) for t in range(1, T + 1)]
    return sum(d * x for d, x in zip(dev, w)) / sum(w) if sum(w) > 0 else sum(dev) / T


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


# keep rules of the masks (TRM, arXiv 2512.23075, sections 6-7, appendices B and D), from one sequence's
# exact token KLs, k2 = 0.5 (log r)^2, k3 = r - 1 - log r and |r - 1|
KEEP_RULES = {
    "trm_max": lambda p, kl, k2, k3, dev: max(kl) <= p["delta"],
    "trm_avg": lambda p, kl, k2, k3, dev: _mean(kl) <= p["delta_avg"],
    "trm_max_avg": lambda p, kl, k2, k3, dev: max(kl) <= p["delta"] and _mean(kl) <= p["delta_avg"],
    "trm_max_k2": lambda p, kl, k2, k3, dev: max(k2) <= p["delta"],
    "trm_avg_k3": lambda p, kl, k2, k3, dev: _mean(k3) <= p["delta_avg"],
    "trm_max_avg_sample": lambda p, kl, k2, k3, dev: max(k2) <= p["delta"] and _mean(k3) <= p["delta_avg"],
    "ln_trm": lambda p, kl, k2, k3, dev: _ln_trm_score(dev, p["delta"]) <= p["delta_w"],
    "ser": lambda p, kl, k2, k3, dev: _mean(dev) <= p["delta_ser"],
}


def _dense_keep(name: str, params: dict, call: dict, kl, log_ratio) -> list[float]:
    """Each sequence's keep decision from the mask's definition (all-padding rows keep)."""
    real = call["mask"] > 0
    keep = []
    for row in range(real.shape[0]):
        lr = log_ratio[row][real[row]].tolist()
        if not lr:
            keep.append(1.0)
            continue
        exact = kl[row][real[row]].tolist() if kl is not None else None
        k2 = [0.5 * x * x for x in lr]
        k3 = [math.expm1(x) - x for x in lr]
        dev = [abs(math.expm1(x)) for x in lr]
        keep.append(float(KEEP_RULES[name](params, exact, k2, k3, dev)))
    return keep


def _check_trm_monitoring(name: str, params: dict, call: dict) -> float:
    """Every trm/* metric of one micro-batch against the dense reference; returns its acceptance rate."""
    from runners import metric_names as mn

    real = call["mask"] > 0
    lengths = real.sum(-1)
    logp = torch.log_softmax(call["logits"], -1).gather(-1, call["responses"][..., None])[..., 0]
    log_ratio = torch.nan_to_num(logp - call["rollout_logp"].double(), nan=20.0).clamp(-20, 20)
    exact = call["index"] is not None
    kl, tv = _dense_token_divergences(call) if exact else (None, None)
    keep = _dense_keep(name, params, call, kl, log_ratio)
    m = call["metrics"]
    rows = [i for i in range(len(keep)) if lengths[i] > 0]
    assert m[mn.TRM_ACCEPT_RATE] == pytest.approx(sum(keep[i] for i in rows) / len(rows))
    gaps = [abs(float(log_ratio[i][real[i]].mean())) for i in rows]
    assert m[mn.TRM_PPL_GAP] == pytest.approx(sum(gaps) / len(gaps), rel=1e-4, abs=1e-6)
    if exact:
        max_src, mean_src = kl, kl
    else:
        max_src, mean_src = 0.5 * log_ratio**2, torch.expm1(log_ratio) - log_ratio
    assert m[mn.TRM_MAX_KL] == pytest.approx(float(max_src[real].max()), rel=1e-4, abs=1e-6)
    assert m[mn.TRM_MEAN_KL] == pytest.approx(float(mean_src[real].mean()), rel=1e-4, abs=1e-6)
    for lo, hi in zip(EDGES, EDGES[1:]):
        sel = [i for i in rows if max(lo, 1) <= lengths[i] < hi]
        key = mn.trm_accept_rate_bucket(lo, hi)
        assert (key in m) == bool(sel), key
        if sel:
            assert m[key] == pytest.approx(sum(keep[i] for i in sel) / len(sel)), key
        if exact:  # Dbar_k: mean over the sequences of TV at k (0 after a sequence ended), bucket mean over k
            width = real.shape[1]
            dbar = [sum(float(tv[i, k]) for i in rows if real[i, k]) / len(rows) for k in range(width)]
            expected = sum(dbar[k] for k in range(lo, min(hi, width))) / (hi - lo)
            assert m[mn.trm_tv_position_bucket(lo, hi)] == pytest.approx(expected, rel=1e-4, abs=1e-7)
        else:
            assert mn.trm_tv_position_bucket(lo, hi) not in m
    return m[mn.TRM_ACCEPT_RATE]


# thresholds inside the spread of the second micro-batch's four sequences (the first after an update):
# the run's data depend on the sampler's draws, so a change there moves the spread (the test's last
# assertion then says so); where a mask has two thresholds, each alone keeps 2 or 3 of the 4
MASKS = {
    "trm_avg": {"delta_avg": 0.00056},
    "trm_max_avg": {"delta": 0.00085, "delta_avg": 0.00056},
    "trm_avg_k3": {"delta_avg": 0.095},
    "trm_max_avg_sample": {"delta": 0.5, "delta_avg": 0.095},
    "ln_trm": {"delta": 1e-4, "delta_w": 0.40},
    "ser": {"delta_ser": 0.30},
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MASKS))
def test_masks_and_their_monitoring_equal_dense_references(name, home, monkeypatch):
    """The masks no preset trains, with V >> K: each micro-batch's keep decisions and trm/* metrics
    (acceptance overall and by length, max / mean KL, PPL gap, TV by position) from the definitions."""
    params = MASKS[name]
    overrides = [f"mask={name}", *(f"mask.{k}={v}" for k, v in params.items())]
    _, rec = _train(["algorithm=grpo", *overrides, BUCKETS], home, monkeypatch, record=True)
    rates = [_check_trm_monitoring(name, params, call) for call in rec.calls]
    assert any(0 < r < 1 for r in rates), f"some micro-batch must keep part of its sequences: {rates}"


# -- Qwen's output size --------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides",
    [
        ["model=tiny_qwen2_v152k", "algorithm=grpo", "objective=troll", "objective.eps=0.075"],
        ["model=tiny_qwen3_v152k", "algorithm=ppo", "mask=trm_max", "mask.delta=0.001", BUCKETS],
    ],
    ids=["qwen2_v152k-grpo-troll", "qwen3_v152k-ppo-trm_max"],
)
def test_qwen_vocabulary(overrides, home, monkeypatch):
    """V = 151,936 (Qwen2/Qwen3 output size): TROLL and exact-KL TRM (with PPO's critic) train, and the
    last off-policy micro-batch's method metrics equal the dense references (only that one is kept:
    the dense logits of all of them would take gigabytes)."""
    result, rec = _train(overrides, home, monkeypatch, record=True, keep_last=True)
    assert result["metrics"]["actor/grad_norm"] > 0
    call = rec.last_off_policy()
    assert call["logits"].shape[-1] == 151936
    if "objective=troll" in overrides:
        _check_troll_call(call)
    else:
        _check_exact_trm_call(call, 0.001)
        _check_trm_monitoring("trm_max", {"delta": 0.001}, call)
