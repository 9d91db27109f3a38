"""TRM masks (runners/algorithms/trm.py): defaults, input errors, edge rows and monitoring, checked
against values written here from the paper (TRM, arXiv 2512.23075), the formula sheet (spec section 4)
and the mask configs (conf/mask/*.yaml), with the loop references of tests/algorithms/test_ref_trm.py.

- defaults: a mask called without options decides as the reference with the paper's / config's
  thresholds (TRM-Max delta 0.05, TRM-Avg delta_avg 0.001, Max&Avg 0.1 and 0.002, LN-TRM delta 1e-4
  and delta_w 0.05, SER 0.05, exact masks with the rest bin), on batches whose scores sit on both
  sides of every default and which a threshold of half or twice the default (or the rest bin
  dropped) would decide differently;
- ``exact_token_kl`` with and without the rest bin against eq. 51 evaluated in loops;
- input errors name the offending threshold or field;
- edge rows: length-1 sequences (LN-TRM's Z(1) = 0), all-padding rows;
- monitoring metrics: present by default with the default length / position buckets, absent with
  ``monitor=False``, and equal to the reference's.

Run: ``pytest tests/algorithms/test_trm_mutants.py``.
"""

from __future__ import annotations

import math
import re
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from runners.algorithms import MASKS, trm
from runners.algorithms.types import PolicyInputs
from runners.metric_names import TRM_MAX_KL
from tests.algorithms.test_ref_trm import (
    ref_exact_token_kl,
    ref_k2,
    ref_k3,
    ref_kept_divergences,
    ref_ln_trm_score,
    ref_ser_score,
)

CONF = Path(__file__).resolve().parents[2] / "conf" / "mask"
# spec section 4 (TRM, arXiv 2512.23075, sections 6.2 and 7, appendix D): the paper's thresholds;
# LN-TRM's delta_w (lost from the paper's text) is the config schema's 0.05, inside SER's 0.03..0.10
DEFAULTS = {
    "trm_max": {"delta": 0.05},
    "trm_avg": {"delta_avg": 0.001},
    "trm_max_avg": {"delta": 0.1, "delta_avg": 0.002},
    "trm_max_k2": {"delta": 0.05},
    "trm_avg_k3": {"delta_avg": 0.001},
    "trm_max_avg_sample": {"delta": 0.1, "delta_avg": 0.002},
    "ln_trm": {"delta": 1e-4, "delta_w": 0.05},
    "ser": {"delta_ser": 0.05},
}
EXACT = ("trm_max", "trm_avg", "trm_max_avg")
SAMPLE = ("trm_max_k2", "trm_avg_k3", "trm_max_avg_sample", "ln_trm", "ser")
THRESHOLD_KEYS = {"delta", "delta_avg", "delta_w", "delta_ser"}


# -- batches --------------------------------------------------------------------------------------
def _log_softmax(x: np.ndarray) -> np.ndarray:
    top = x.max(-1, keepdims=True)
    return x - top - np.log(np.exp(x - top).sum(-1, keepdims=True))


def sample_inputs(rows: list[list[float]], *, seed: int = 0, T: int | None = None) -> PolicyInputs:
    """A batch whose real tokens have the given log-ratios ``log r = logp - rollout_logp`` (float64);
    padding positions get log-ratios of +-3 (reading them would change every decision)."""
    rng = np.random.default_rng(seed)
    T = T or max(1, max(len(r) for r in rows))
    B = len(rows)
    mask = np.zeros((B, T))
    log_ratio = 3.0 * np.sign(rng.standard_normal((B, T)))
    for i, r in enumerate(rows):
        mask[i, : len(r)] = 1.0
        log_ratio[i, : len(r)] = r
    rollout = -0.5 - 2.0 * rng.random((B, T))
    return PolicyInputs(
        logp=torch.from_numpy(rollout + log_ratio),
        old_logp=torch.from_numpy(rollout + 0.05 * rng.standard_normal((B, T))),
        advantages=torch.zeros(B, T, dtype=torch.float64),
        response_mask=torch.from_numpy(mask),
        rollout_logp=torch.from_numpy(rollout),
    )


def _scale_support(roll_lp: np.ndarray, support: np.ndarray, factor: float) -> np.ndarray:
    """Current logits of one position: the rollout's with the support's mass multiplied by
    ``factor`` (the shape inside the support and inside the rest unchanged)."""
    out = roll_lp.copy()
    out[support] += math.log(factor)
    return out


# -- references (TRM, arXiv 2512.23075) -----------------------------------------------------------
def ref_kl_rows(arrays, *, rest_bin: bool = True) -> list[list[float]]:
    """Per sequence, the exact token KL of eq. 51 (plus the rest bin, see ``ref_exact_token_kl``)
    of each real token; without the rest bin eq. 51 summed over the stored support alone."""
    logits, index, topk_logp, mask = arrays
    out = []
    for i in range(mask.shape[0]):
        row = []
        for t in range(int(mask[i].sum())):
            if rest_bin:
                row.append(ref_exact_token_kl(logits[i, t], index[i, t], topk_logp[i, t]))
            else:
                lq = _log_softmax(logits[i, t])
                row.append(float(sum(math.exp(lp) * (lp - lq[v]) for v, lp in zip(index[i, t], topk_logp[i, t]))))
        out.append(row)
    return out


def _max(row: list[float]) -> float:
    return max(row) if row else 0.0  # an all-padding row scores 0 (it adds nothing to the loss)


def _mean(row: list[float]) -> float:
    return sum(row) / len(row) if row else 0.0


def ref_decisions(name: str, params: dict, *, kl_rows=None, lr_rows=None) -> list[float]:
    """Keep weights of eq. 49 with inclusive thresholds (spec section 4: keep iff score <= threshold):
    TRM-Max ``max_t KL``, TRM-Avg ``mean_t KL`` (section 6.2), their sample versions with k2 / k3
    (appendix B), LN-TRM's W~ (eq. 76-77) and SER (eq. 82)."""
    keep = []
    rows = kl_rows if kl_rows is not None else lr_rows
    for row in rows:
        ok = True
        if name in ("trm_max", "trm_max_avg"):
            ok &= _max(row) <= params["delta"]
        if name in ("trm_avg", "trm_max_avg"):
            ok &= _mean(row) <= params["delta_avg"]
        if name in ("trm_max_k2", "trm_max_avg_sample"):
            ok &= _max([ref_k2(x) for x in row]) <= params["delta"]
        if name in ("trm_avg_k3", "trm_max_avg_sample"):
            ok &= _mean([ref_k3(x) for x in row]) <= params["delta_avg"]
        if name == "ln_trm":
            ok &= (ref_ln_trm_score(row, params["delta"]) if row else 0.0) <= params["delta_w"]
        if name == "ser":
            ok &= (ref_ser_score(row) if row else 0.0) <= params["delta_ser"]
        keep.append(float(ok))
    return keep


def _bisect_size(roll_lp, support, target: float, z: np.ndarray) -> float:
    """The noise size whose rest-bin KL (reference, eq. 51) is ``target`` (the KL of an exponential
    tilt grows with its size)."""
    lo, hi = 0.0, 4.0
    topk = roll_lp[support]
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if ref_exact_token_kl(roll_lp + mid * z, support, topk) < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def exact_target_inputs(rows: list[list[tuple[str, float]]], *, V: int = 40, K: int = 8, seed: int = 0):
    """A batch with stored sparse rollout distributions (V ids, the rollout's top-K as the support,
    about half its mass; float64). Each real token of ``rows`` is ``("kl", x)``: the rollout's
    log-probs tilted by random noise sized so that its reference KL (eq. 51 + rest bin) is x;
    ``("calm", 0)``: noise of size 0.01; ``("scale", f)``: the support's mass multiplied by f.
    Padding positions are far from the rollout. Returns the inputs and the numpy arrays (logits,
    index, rollout log-probs, mask) for the reference."""
    rng = np.random.default_rng(seed + 1)
    T = max(1, max(len(r) for r in rows))
    base = np.random.default_rng(seed)
    roll_lp = _log_softmax(1.2 * base.standard_normal((len(rows), T, V)))
    support = np.argsort(-roll_lp, axis=-1)[..., :K]
    resolved = []
    for i, r in enumerate(rows):
        out = []
        for t, (kind, size) in enumerate(r):
            if kind == "kl":
                z = rng.standard_normal(V)
                out.append(("direction", (_bisect_size(roll_lp[i, t], support[i, t], size, z), z)))
            elif kind == "calm":
                out.append(("direction", (0.01, rng.standard_normal(V))))
            else:
                out.append((kind, size))
        resolved.append(out)
    return _exact_from(resolved, roll_lp, support, seed)


def _exact_from(rows, roll_lp, support, seed):
    rng = np.random.default_rng(seed + 2)
    B, T, V = roll_lp.shape
    logits = roll_lp + 3.0 * rng.standard_normal((B, T, V))  # padding: far from the rollout
    mask = np.zeros((B, T))
    for i, r in enumerate(rows):
        for t, (kind, size) in enumerate(r):
            if kind == "direction":
                logits[i, t] = roll_lp[i, t] + size[0] * size[1]
            else:  # "scale"
                logits[i, t] = _scale_support(roll_lp[i, t], support[i, t], size)
            mask[i, t] = 1.0
    topk_logp = np.take_along_axis(roll_lp, support, -1)
    responses = roll_lp.argmax(-1)
    logp = np.take_along_axis(_log_softmax(logits), responses[..., None], -1)[..., 0]
    rollout_logp = np.take_along_axis(roll_lp, responses[..., None], -1)[..., 0]
    inp = PolicyInputs(
        logp=torch.from_numpy(logp),
        old_logp=torch.from_numpy(rollout_logp),
        advantages=torch.zeros(B, T, dtype=torch.float64),
        response_mask=torch.from_numpy(mask),
        logits=torch.from_numpy(logits),
        old_topk_index=torch.from_numpy(support),
        old_topk_logp=torch.from_numpy(topk_logp),
    )
    return inp, (logits, support, topk_logp, mask)


CALM = ("calm", 0.0)
# rows of the exact batch (token KL targets with the rest bin); comments: what each row decides
EXACT_ROWS = [
    [CALM] * 6 + [("kl", 0.04)],  # max in (delta/2, delta]: TRM-Max keeps it
    [CALM] * 5 + [("kl", 0.07)],  # max in (delta, 2 delta]: TRM-Max rejects it
    [CALM] * 4 + [("scale", 0.85)],  # mass moved off the support: small rest-bin KL, large without it
    [("scale", 0.97)] * 5,  # the same for the mean
    [("kl", 0.0008)] * 6,  # mean in (delta_avg/2, delta_avg]: TRM-Avg keeps it
    [("kl", 0.0015)] * 6,  # mean in (delta_avg, 2 delta_avg]: TRM-Avg rejects, Max&Avg keeps it
    [("kl", 0.003)] * 6,  # mean in (0.002, 0.004]: Max&Avg rejects it
    [CALM] * 60 + [("kl", 0.08)] + [CALM] * 39,  # long, one spike in (0.05, 0.1]: Max&Avg keeps it
    [CALM] * 30 + [("kl", 0.15)] + [CALM] * 69,  # long, one spike in (0.1, 0.2]: Max&Avg rejects it
    [("kl", 0.0006)],  # length 1
    [],  # all padding
]
# log-ratio rows of the sample batch
_calm = [0.005, -0.004, 0.006, -0.005, 0.003, -0.006, 0.004]
SAMPLE_ROWS = [
    _calm + [0.27],  # max k2 0.036: TRM-Max (k2) keeps it, not at delta/2
    [-0.38] + _calm,  # max k2 0.072: rejected, kept at 2 delta
    [0.038, 0.036, 0.04, 0.037, 0.039, 0.038],  # mean k3 ~7.4e-4, SER / LN-TRM ~0.039
    [-0.055, -0.053, -0.057, -0.054, -0.056, -0.055],  # mean k3 ~1.5e-3
    [0.05, 0.051, 0.049, 0.05, 0.05, 0.05],  # mean k3 ~1.3e-3: Max&Avg keeps it, not at delta_avg/2
    [-0.075, -0.074, -0.076, -0.075, -0.075, -0.075],  # mean k3 ~2.7e-3, SER ~0.072
    _calm * 8 + [-0.4] + _calm * 8,  # long, one k2 = 0.08 spike: Max&Avg keeps it, not at delta/2
    _calm * 5 + [0.5] + _calm * 10,  # long, one k2 = 0.125 spike: Max&Avg rejects it
    [0.22] + _calm,  # LN-TRM: an early spike, weight depends on delta through the cap of w_t
    [0.04],  # length 1: LN-TRM's Z(1) = 0, scored by |r - 1|
    [],  # all padding
]


def _kl_scores():
    inp, arrays = exact_target_inputs(EXACT_ROWS)
    return inp, arrays, ref_kl_rows(arrays), ref_kl_rows(arrays, rest_bin=False)


def test_yaml_configs_hold_the_paper_thresholds():
    """conf/mask/<name>.yaml carries the spec's thresholds (the mask functions' defaults are checked
    by behaviour below)."""
    for name, params in DEFAULTS.items():
        conf = yaml.safe_load((CONF / f"{name}.yaml").read_text())
        assert conf["name"] == name
        for key, value in conf.items():
            if key in THRESHOLD_KEYS:
                assert value == pytest.approx(params[key]), (name, key)


@pytest.mark.parametrize("name", EXACT)
def test_exact_mask_defaults_are_the_paper_thresholds_with_the_rest_bin(name):
    """TRM-Max / TRM-Avg / Max&Avg without options decide as eq. 51 (plus the rest bin) against the
    paper's thresholds (spec section 4), and as a call naming them; the batch is decided
    differently by half or twice any threshold and without the rest bin."""
    inp, arrays, kl, kl_no_rest = _kl_scores()
    params = DEFAULTS[name]
    expected = ref_decisions(name, params, kl_rows=kl)
    assert 0 < sum(expected) < len(expected)
    for key in params:
        for factor in (0.5, 2.0):
            assert ref_decisions(name, {**params, key: params[key] * factor}, kl_rows=kl) != expected, (key, factor)
    assert ref_decisions(name, params, kl_rows=kl_no_rest) != expected
    out = MASKS.get(name)(inp)
    assert out.seq_mask.tolist() == expected
    assert out.seq_mask.dtype == inp.logp.dtype
    assert MASKS.get(name)(inp, **params, tail_bin=True).seq_mask.tolist() == expected
    # without the rest bin: eq. 51 over the stored support alone
    no_rest = ref_decisions(name, params, kl_rows=kl_no_rest)
    assert MASKS.get(name)(inp, tail_bin=False).seq_mask.tolist() == no_rest
    assert getattr(trm, f"{name}_mask")(inp).seq_mask.tolist() == expected


@pytest.mark.parametrize("name", SAMPLE)
def test_sample_mask_defaults_are_the_paper_thresholds(name):
    """Sample masks without options decide as k2 / k3 (appendix B), W~ (eq. 76-77) or SER (eq. 82)
    against the paper's thresholds, and as a call naming them; half or twice any threshold (for
    LN-TRM's delta: 0.5, where w_t reaches its cap) decides the batch differently."""
    inp = sample_inputs(SAMPLE_ROWS)
    params = DEFAULTS[name]
    expected = ref_decisions(name, params, lr_rows=SAMPLE_ROWS)
    assert 0 < sum(expected) < len(expected)
    for key in params:
        factors = (5000.0,) if (name, key) == ("ln_trm", "delta") else (0.5, 2.0)
        for factor in factors:
            assert ref_decisions(name, {**params, key: params[key] * factor}, lr_rows=SAMPLE_ROWS) != expected, key
    out = MASKS.get(name)(inp)
    assert out.seq_mask.tolist() == expected
    assert out.seq_mask.dtype == inp.logp.dtype
    assert MASKS.get(name)(inp, **params).seq_mask.tolist() == expected
    assert getattr(trm, f"{name}_mask")(inp).seq_mask.tolist() == expected


# -- input errors -----------------------------------------------------------------------------------
def _raises_naming(fn, *words: str) -> str:
    with pytest.raises(ValueError) as info:
        fn()
    message = str(info.value)
    for word in words:
        assert re.search(rf"(?<!\w){re.escape(word)}(?!\w)", message), (word, message)
    return message


@pytest.mark.parametrize("name", list(DEFAULTS))
def test_negative_or_nan_threshold_names_its_key(name):
    """A threshold below 0 or NaN is an input error naming that key exactly (spec section 4: keep
    iff score <= threshold, thresholds >= 0); 0 itself is valid (every threshold inclusive)."""
    inp = exact_target_inputs(EXACT_ROWS[:3])[0] if name in EXACT else sample_inputs(SAMPLE_ROWS)
    mask = MASKS.get(name)
    for key in DEFAULTS[name]:
        if (name, key) == ("ln_trm", "delta"):
            continue  # the weights' scale, not a threshold
        for bad in (-1.0, float("nan")):
            message = _raises_naming(partial(mask, inp, **{key: bad}), key)
            assert "must be >= 0" in message
            for other in THRESHOLD_KEYS - {key}:
                assert not re.search(rf"\b{other}\b", message), (key, message)
        assert mask(inp, **{key: 0.0}, monitor=False).seq_mask.shape == (inp.logp.shape[0],)


@pytest.mark.parametrize("name", EXACT)
def test_exact_mask_without_distributions_names_the_mask_and_every_missing_field(name):
    """An exact mask on a batch without stored distributions names itself and each missing
    PolicyInputs field (and not the present one), and points to the sample-based masks."""
    inp = exact_target_inputs(EXACT_ROWS[:3])[0]
    inp.logits = None
    inp.old_topk_index = None
    message = _raises_naming(lambda: MASKS.get(name)(inp), f"'{name}'", "logits", "old_topk_index", "'trm_max_k2'")
    assert "old_topk_logp" not in message
    assert message.startswith(f"mask '{name}' ")
    inp2 = exact_target_inputs(EXACT_ROWS[:3])[0]
    inp2.old_topk_logp = None
    message = _raises_naming(lambda: MASKS.get(name)(inp2, monitor=False), f"'{name}'", "PolicyInputs.old_topk_logp")
    assert "logits" not in message.split("(")[0] and "old_topk_index" not in message


# -- exact token KL -------------------------------------------------------------------------------------
def test_exact_token_kl_default_has_the_rest_bin():
    """``exact_token_kl`` at every position (padding included: it takes no mask) equals eq. 51 plus
    the rest bin by default and eq. 51 over the support alone with ``tail_bin=False``, in float64."""
    _, (logits, index, topk_logp, mask) = exact_target_inputs(EXACT_ROWS[:4])
    full = np.ones_like(mask)
    ref = ref_kl_rows((logits, index, topk_logp, full))
    ref_no_rest = ref_kl_rows((logits, index, topk_logp, full), rest_bin=False)
    args = [torch.from_numpy(a) for a in (logits, index, topk_logp)]
    got = trm.exact_token_kl(*args)
    assert got.dtype == torch.float64 and got.shape == mask.shape
    np.testing.assert_allclose(got.numpy(), np.array(ref), rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(trm.exact_token_kl(*args, tail_bin=True).numpy(), np.array(ref), rtol=1e-9, atol=1e-15)
    no_rest = trm.exact_token_kl(*args, tail_bin=False).numpy()
    np.testing.assert_allclose(no_rest, np.array(ref_no_rest), rtol=1e-9, atol=1e-15)
    assert np.abs(no_rest - np.array(ref)).max() > 1e-2  # the rest bin matters here


# -- LN-TRM scores --------------------------------------------------------------------------------------
def test_ln_trm_scores_reduce_the_last_dimension():
    """``ln_trm_scores`` scores each row along its last dimension (eq. 76-77): one unbatched row [T]
    and a stack [2,B,T] give the reference's W~ of every row."""
    rows = [r for r in SAMPLE_ROWS if r][:6]
    T = max(len(r) for r in rows)
    lr = torch.zeros(len(rows), T, dtype=torch.float64)
    mask = torch.zeros(len(rows), T, dtype=torch.float64)
    for i, r in enumerate(rows):
        lr[i, : len(r)] = torch.tensor(r, dtype=torch.float64)
        lr[i, len(r) :] = 2.0
        mask[i, : len(r)] = 1.0
    expected = [ref_ln_trm_score(r, 1e-4) for r in rows]
    for i in range(len(rows)):
        got = trm.ln_trm_scores(lr[i], mask[i], 1e-4)
        assert got.shape == () and float(got) == pytest.approx(expected[i], rel=1e-12)
    stack = trm.ln_trm_scores(torch.stack([lr, lr.flip(0)]), torch.stack([mask, mask.flip(0)]), 1e-4)
    assert stack.shape == (2, len(rows))
    np.testing.assert_allclose(stack[0].numpy(), expected, rtol=1e-12)
    np.testing.assert_allclose(stack[1].numpy(), expected[::-1], rtol=1e-12)


# -- monitoring -----------------------------------------------------------------------------------------
DEFAULT_BUCKETS = (0, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


def ref_tv_rows(arrays) -> list[list[float]]:
    """Per sequence, the token TV of eq. 8 on the stored support plus the rest bin:
    ``0.5 (sum_S |p - q| + |p_rest - q_rest|)`` of each real token."""
    logits, index, topk_logp, mask = arrays
    out = []
    for i in range(mask.shape[0]):
        row = []
        for t in range(int(mask[i].sum())):
            lq = _log_softmax(logits[i, t])
            p = [math.exp(lp) for lp in topk_logp[i, t]]
            q = [math.exp(lq[v]) for v in index[i, t]]
            row.append(0.5 * (sum(abs(a - b) for a, b in zip(p, q)) + abs((1 - sum(p)) - (1 - sum(q)))))
        out.append(row)
    return out


def ref_monitoring(keep, kl_rows, lr_rows, tv_rows=None, edges=DEFAULT_BUCKETS) -> dict[str, float]:
    """TRM monitoring (arXiv 2512.23075, section 7, appendix D.1): acceptance overall and per length
    bucket lo <= T < hi over non-empty rows, max / token-mean KL, log absolute PPL gap (eq. 52), and
    per position bucket the mean over positions of Dbar_k (mean TV at position k over the non-empty
    sequences, a finished sequence counting 0; eq. 13, 40)."""
    rows = [i for i, r in enumerate(lr_rows) if r]
    out = {"trm/accept_rate": sum(keep[i] for i in rows) / len(rows)}
    for lo, hi in zip(edges, edges[1:]):
        sel = [i for i in rows if lo <= len(lr_rows[i]) < hi]
        if sel:
            out[f"trm/accept_rate/len_{lo}_{hi}"] = sum(keep[i] for i in sel) / len(sel)
    flat = [x for r in kl_rows for x in r]
    out["trm/max_kl"] = max(flat)
    out["trm/mean_kl"] = sum(flat) / len(flat)
    out["trm/ppl_gap"] = sum(abs(_mean(lr_rows[i])) for i in rows) / len(rows)
    if tv_rows is not None:
        width = max(len(r) for r in tv_rows)
        dbar = [sum(r[k] for r in tv_rows if len(r) > k) / len(rows) for k in range(width)]
        for lo, hi in zip(edges, edges[1:]):
            out[f"trm/tv/pos_{lo}_{hi}"] = sum(dbar[lo:hi]) / (hi - lo)
    return out


def _lr_rows(inp: PolicyInputs) -> list[list[float]]:
    lr = (inp.logp - inp.rollout_or_old_logp()).numpy()
    return [[float(x) for x in lr[i, : int(n)]] for i, n in enumerate(inp.response_mask.sum(-1))]


def _check_monitoring(metrics: dict, expected: dict) -> None:
    assert set(metrics) == set(expected), set(metrics) ^ set(expected)
    for key, value in expected.items():
        assert metrics[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key


@pytest.mark.parametrize(
    ("name", "tail_bin"), [(name, None) for name in ("none", *EXACT, *SAMPLE)] + [(name, False) for name in EXACT]
)
def test_monitoring_by_default_with_stored_distributions(name, tail_bin):
    """Every mask reports by default (``monitor`` on, the default length and position buckets 0, 64,
    128, ..., 32768) the acceptance overall and per length, the PPL gap and the exact KL of eq. 51
    with the rest bin (also for the sample criteria: the distributions are stored); an exact mask
    run without the rest bin reports the KL its criterion used. ``monitor=False`` reports nothing."""
    inp, arrays, kl, kl_no_rest = _kl_scores()
    lr = _lr_rows(inp)
    opts = {} if tail_bin is None else {"tail_bin": tail_bin}
    out = MASKS.get(name)(inp, **opts)
    if name == "none":
        keep = [1.0] * len(lr)
    elif name in EXACT:
        keep = ref_decisions(name, DEFAULTS[name], kl_rows=kl if tail_bin is None else kl_no_rest)
    else:
        keep = ref_decisions(name, DEFAULTS[name], lr_rows=lr)
    assert out.seq_mask.tolist() == keep
    assert len(out.seq_mask) == inp.logp.shape[0] != inp.logp.shape[1]
    used_kl = kl_no_rest if tail_bin is False else kl
    _check_monitoring(out.metrics, ref_monitoring(keep, used_kl, lr, ref_tv_rows(arrays)))
    assert "trm/accept_rate/len_64_128" in out.metrics and 0 < out.metrics["trm/accept_rate"] < 1 or name == "none"
    assert MASKS.get(name)(inp, **opts, monitor=False).metrics == {}
    assert MASKS.get(name)(inp, **opts, monitor=False).seq_mask.tolist() == keep


@pytest.mark.parametrize("name", ["none", *SAMPLE])
def test_monitoring_without_stored_distributions(name):
    """Without stored distributions the sample estimators are monitored: max k2 and token-mean k3
    (appendix B), no TV buckets; custom length buckets are honoured."""
    inp = sample_inputs(SAMPLE_ROWS)
    lr = SAMPLE_ROWS
    keep = [1.0] * len(lr) if name == "none" else ref_decisions(name, DEFAULTS[name], lr_rows=lr)
    out = MASKS.get(name)(inp, length_edges=(0, 4, 9, 200))
    assert out.seq_mask.tolist() == keep
    expected = ref_monitoring(keep, [[ref_k2(x) for x in r] for r in lr], lr, edges=(0, 4, 9, 200))
    expected["trm/mean_kl"] = _mean([ref_k3(x) for r in lr for x in r])
    _check_monitoring(out.metrics, expected)
    assert MASKS.get(name)(inp, monitor=False).metrics == {}


# -- sparse divergences: masks, shapes, degenerate values ------------------------------------------------
def test_sparse_divergences_skip_padding_and_match_the_reference():
    """With a response mask, real positions get eq. 51 (+ rest bin) and the TV of eq. 8, padding
    positions 0 (their logits are far from the rollout); an all-ones mask gives the unmasked result."""
    _, arrays = exact_target_inputs(EXACT_ROWS[:4] + [[], [("kl", 0.01)]])
    logits, index, topk_logp, mask = arrays
    args = [torch.from_numpy(a) for a in (logits, index, topk_logp)]
    kl, tv = trm.sparse_token_divergences(*args, torch.from_numpy(mask))
    ref_kl, ref_tv = ref_kl_rows(arrays), ref_tv_rows(arrays)
    for i in range(mask.shape[0]):
        n = len(ref_kl[i])
        np.testing.assert_allclose(kl[i, :n].numpy(), ref_kl[i], rtol=1e-9, atol=1e-15)
        np.testing.assert_allclose(tv[i, :n].numpy(), ref_tv[i], rtol=1e-9, atol=1e-15)
        assert (kl[i, n:] == 0).all() and (tv[i, n:] == 0).all()
    full_kl, full_tv = trm.sparse_token_divergences(*args)
    assert (full_kl[torch.from_numpy(mask) == 0] > 1e-3).all()  # padding would be visible
    ones_kl, ones_tv = trm.sparse_token_divergences(*args, torch.ones(mask.shape, dtype=torch.float64))
    assert torch.equal(ones_kl, full_kl) and torch.equal(ones_tv, full_tv)


def test_sparse_divergences_shape_mismatch_is_an_input_error():
    """Each inconsistent shape on its own (support vs its log-probs, logits vs support) is a
    ValueError naming the shapes."""
    _, (logits, index, topk_logp, _) = exact_target_inputs(EXACT_ROWS[:2])
    lg, ix, tp = (torch.from_numpy(a) for a in (logits, index, topk_logp))
    for args in ((lg, ix, tp[..., :-1]), (lg[:, :-1], ix, tp), (lg[:1], ix, tp)):
        message = _raises_naming(partial(trm.sparse_token_divergences, *args), "shape mismatch")
        assert str(tuple(args[0].shape)) in message and str(tuple(args[2].shape)) in message


def test_float32_logits_use_a_float64_normaliser():
    """A trainer's float32 logits: the KL (eq. 51 + rest bin) equals the float64 reference of the same
    float32 values to 1e-12, so a small rest mass is not swamped by the normaliser's rounding."""
    _, (logits, index, topk_logp, mask) = exact_target_inputs(EXACT_ROWS[:4], V=400, K=8)
    logits32 = (logits + 6.0).astype(np.float32)  # |logsumexp| ~ 10, as a language model's
    ref = ref_kl_rows((logits32.astype(np.float64), index, topk_logp, np.ones_like(mask)))
    kl = trm.exact_token_kl(torch.from_numpy(logits32), torch.from_numpy(index), torch.from_numpy(topk_logp))
    assert kl.dtype == torch.float64
    np.testing.assert_allclose(kl.numpy(), np.array(ref), rtol=0, atol=1e-12)


def test_token_tv_is_at_most_one_with_float32_stored_log_probs():
    """TV (eq. 8) is at most 1: a rollout distribution stored as float32 log-probs whose exponentials
    sum to slightly more than 1, against a current policy with disjoint support, gives TV exactly 1."""
    p = np.array([0.1, 0.2, 0.3, 0.4 - 1e-9])
    for shift in np.linspace(0, 0.05, 200):
        lp32 = np.log(np.array([0.1 + shift, 0.2, 0.3, 0.4 - shift])).astype(np.float32)
        if np.exp(lp32.astype(np.float64)).sum() > 1 + 1e-8:
            break
    else:
        raise AssertionError("no float32 rounding above 1 found")
    assert p.sum() < 1
    V = 8
    logits = torch.full((1, 1, V), float("-inf"), dtype=torch.float64)
    logits[..., 4:] = 0.0  # the current policy lives on ids 4..7
    index = torch.arange(4).reshape(1, 1, 4)
    kl, tv = trm.sparse_token_divergences(logits, index, torch.from_numpy(lp32.astype(np.float64)).reshape(1, 1, 4))
    assert float(tv) == 1.0
    assert float(kl) == math.inf  # log pi_theta = -inf on the rollout's support


def test_current_policy_without_mass_on_the_support_is_maximal_divergence():
    """A real position whose current logits are all -inf (undefined policy) or -inf on a stored id
    the rollout gave mass: eq. 51 is +inf there (or the largest float), and every exact mask rejects
    the sequence."""
    inp, arrays = exact_target_inputs([[CALM] * 3, [CALM] * 3, [CALM] * 3])
    inp.logits[0, 1, :] = float("-inf")
    inp.logits[1, 2, inp.old_topk_index[1, 2, 0]] = float("-inf")
    kl = trm.exact_token_kl(inp.logits, inp.old_topk_index, inp.old_topk_logp)
    assert kl[0, 1] == math.inf and kl[1, 2] > 1e300  # (-inf log-probs count as the lowest float)
    assert torch.isfinite(kl[2]).all() and torch.isfinite(kl[0, [0, 2]]).all()
    for name in EXACT:
        assert MASKS.get(name)(inp, monitor=False).seq_mask.tolist() == [0.0, 0.0, 1.0], name


def test_exact_thresholds_are_inclusive_at_zero():
    """Spec section 4: keep iff score <= threshold. An unchanged uniform policy over the full support
    has KL exactly 0 (eq. 51) and an all-padding row scores 0: both are kept with thresholds 0; a
    changed policy is rejected."""
    V, T = 4, 3
    logits = torch.zeros(3, T, V, dtype=torch.float64)
    logits[1, 1, 0] = 0.3  # changed
    index = torch.arange(V).expand(3, T, V)
    topk_logp = torch.full((3, T, V), -math.log(V), dtype=torch.float64)
    mask = torch.ones(3, T, dtype=torch.float64)
    mask[2] = 0.0
    inp = PolicyInputs(
        logp=torch.full((3, T), -math.log(V), dtype=torch.float64),
        old_logp=torch.full((3, T), -math.log(V), dtype=torch.float64),
        advantages=torch.zeros(3, T, dtype=torch.float64),
        response_mask=mask,
        logits=logits,
        old_topk_index=index,
        old_topk_logp=topk_logp,
    )
    assert float(trm.exact_token_kl(logits, index, topk_logp)[0].abs().max()) == 0.0
    zero = {"trm_max": {"delta": 0.0}, "trm_avg": {"delta_avg": 0.0}, "trm_max_avg": {"delta": 0.0, "delta_avg": 0.0}}
    for name, params in zero.items():
        out = MASKS.get(name)(inp, **params)
        assert out.seq_mask.tolist() == [1.0, 0.0, 1.0], name
        assert out.metrics["trm/accept_rate"] == 0.5  # the all-padding row is left out


@pytest.mark.parametrize("name", ["none", *EXACT, "trm_max_k2"])
def test_padding_positions_of_the_stored_distributions_are_never_read(name):
    """Only real response positions are read: ids out of the vocabulary and NaN log-probs stored
    on padding positions change neither the decisions nor the monitored KL / TV."""
    inp, arrays, kl, _ = _kl_scores()
    clean = MASKS.get(name)(inp)
    pad = inp.response_mask == 0
    inp.old_topk_index = inp.old_topk_index.clone()
    inp.old_topk_index[pad] = -7
    inp.old_topk_index[pad.nonzero()[0, 0], pad.nonzero()[0, 1], 0] = 10**6
    inp.old_topk_logp = inp.old_topk_logp.clone()
    inp.old_topk_logp[pad] = float("nan")
    dirty = MASKS.get(name)(inp)
    assert dirty.seq_mask.tolist() == clean.seq_mask.tolist()
    assert dirty.metrics == clean.metrics
    assert clean.metrics["trm/max_kl"] == pytest.approx(max(x for r in kl for x in r), rel=1e-9)


def _kept_pair(seed: int, B: int, T: int, K: int, moved: float, V: int = 12):
    """The rollout's and the moved policy's float64 log-probs at K stored ids per position, [B,T,K]
    each: both the first K ids of full distributions over V ids, so the rest (the other V - K ids)
    holds some mass under both."""
    g = torch.Generator().manual_seed(seed)
    old = torch.randn(B, T, V, generator=g, dtype=torch.float64) * 1.5
    new = old + moved * torch.randn(B, T, V, generator=g, dtype=torch.float64)
    return torch.log_softmax(old, -1)[..., :K].clone(), torch.log_softmax(new, -1)[..., :K].clone()


def test_kept_token_divergences_add_the_rest_bin_by_default_and_zero_masked_tokens():
    """``kept_token_divergences`` (a backend without the logits: current log-probs at the kept ids)
    against the loop of eq. 51: the rest bin is in by default, masked tokens are exactly 0 (their own
    divergences are not), unmasked ones equal the reference."""
    B, T, K = 2, 4, 5
    topk, logq = _kept_pair(11, B, T, K, moved=0.6)
    topk[0, 1, -1] = topk[1, 3, -1] = -math.inf  # a padding slot in some tokens
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0], [1.0, 0.0, 1.0, 1.0]], dtype=torch.float64)
    ref = {
        bin_: np.array(
            [
                [ref_kept_divergences(logq[b, t].tolist(), topk[b, t].tolist(), rest_bin=bin_) for t in range(T)]
                for b in range(B)
            ]
        )
        for bin_ in (True, False)
    }
    kl, tv = trm.kept_token_divergences(logq, topk, mask)
    assert (ref[True][mask.numpy() == 0] > 1e-3).all()  # the masked tokens do diverge
    np.testing.assert_allclose(kl.numpy(), np.where(mask.numpy() > 0, ref[True][..., 0], 0.0), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(tv.numpy(), np.where(mask.numpy() > 0, ref[True][..., 1], 0.0), rtol=1e-10, atol=1e-12)
    kl_all, tv_all = trm.kept_token_divergences(logq, topk)  # no mask, default tail_bin
    np.testing.assert_allclose(kl_all.numpy(), ref[True][..., 0], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(tv_all.numpy(), ref[True][..., 1], rtol=1e-10, atol=1e-12)
    kl_kept, _ = trm.kept_token_divergences(logq, topk, tail_bin=False)
    np.testing.assert_allclose(kl_kept.numpy(), ref[False][..., 0], rtol=1e-10, atol=1e-12)
    assert (np.abs(ref[True][..., 0] - ref[False][..., 0]) > 1e-4).any()


def test_the_exact_masks_honour_tail_bin_from_the_kept_log_probs():
    """TRM-Max from ``topk_logp`` (a backend without the logits) with ``tail_bin=False`` thresholds and
    reports the kept-only sum of eq. 51, not the coarse-grained KL: ``trm/max_kl`` equals the loop's
    largest kept-only KL over real tokens, which differs from the largest coarse-grained one."""
    B, T, K = 3, 4, 5
    topk, logq = _kept_pair(12, B, T, K, moved=0.8)
    mask = torch.ones(B, T)
    inp = PolicyInputs(
        logp=torch.zeros(B, T),
        old_logp=torch.zeros(B, T),
        advantages=torch.zeros(B, T),
        response_mask=mask,
        topk_logp=logq,
        old_topk_index=torch.zeros(B, T, K, dtype=torch.long),
        old_topk_logp=topk,
        vocab_size=50,
    )
    ref = {
        bin_: max(
            ref_kept_divergences(logq[b, t].tolist(), topk[b, t].tolist(), rest_bin=bin_)[0]
            for b in range(B)
            for t in range(T)
        )
        for bin_ in (True, False)
    }
    assert abs(ref[False] - ref[True]) > 1e-3  # the two criteria tell the policies apart differently
    for bin_ in (True, False):
        out = MASKS.get("trm_max")(inp, delta=10.0, tail_bin=bin_)
        assert out.metrics[TRM_MAX_KL] == pytest.approx(ref[bin_], rel=1e-9), bin_


def test_a_dense_old_distribution_is_no_sparse_store_for_monitoring():
    """Monitoring takes the exact KL only from a stored sparse distribution (old_topk_index and old_topk_logp
    both given). A dense old distribution (old_topk_logp [B,T,V] without an index, as TROLL's dense mode
    stores) leaves a sample-based mask's monitoring on its k2/k3 estimators: the metrics equal those
    without it."""
    g = torch.Generator().manual_seed(13)
    B, T, V = 2, 3, 7
    logits = torch.randn(B, T, V, generator=g)
    old_all = torch.log_softmax(torch.randn(B, T, V, generator=g), -1)
    responses = torch.randint(0, V, (B, T), generator=g)
    base = dict(
        logp=torch.log_softmax(logits, -1).gather(-1, responses[..., None]).squeeze(-1),
        old_logp=old_all.gather(-1, responses[..., None]).squeeze(-1),
        advantages=torch.zeros(B, T),
        response_mask=torch.ones(B, T),
        logits=logits,
        responses=responses,
    )
    plain = MASKS.get("trm_max_k2")(PolicyInputs(**base), delta=10.0)
    dense = MASKS.get("trm_max_k2")(PolicyInputs(**base, old_topk_logp=old_all), delta=10.0)
    assert dense.metrics == plain.metrics and TRM_MAX_KL in plain.metrics
