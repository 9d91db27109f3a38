"""Aggregations shared by the tables and figures: final/best values, smoothing, seeds, CIs, entropy change.

Conventions (each chosen to match how the papers report numbers):
- *final evaluation* of a run (``final_evals``, the one rule every table uses): its LAST evaluation, labelled
  with the step it was taken at (``final_eval_label``: "pass@1 at step 20 (last eval)"). Never a mean over the
  last few evaluations: with evaluations every 10 steps of a 20-step run that mean includes the evaluation
  at step 0, the same model for every method, and dilutes every difference by a third.
- *final value* of a training metric: mean of its last ``last_n`` logged points (a smoothed end of the
  training curve; the tables say "mean of the last n steps").
- *smoothing*: centred moving average over ``window`` logged points, shrinking at the ends
  (TROLL, arXiv 2510.03817, section 4: windows 7 for training and 21 for evaluation curves, raw curves faint behind).
- *across seeds*: mean, sample standard deviation (ddof=1; Entropy-preserving RL (arXiv 2603.11682) "mean +- std" over three
  seeds) and a percentile bootstrap CI of the mean.
- *best checkpoint* (Entropy-preserving RL, arXiv 2603.11682, appendix C.3): the step whose mean score over the selection
  metrics is highest (AppWorld: the validation split; AIME: the mean of AIME'24 and '25).
- *entropy change* at a step: absolute ``H(step) - H(first step)`` and relative ``/ H(first step)``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.frames import ExperimentData


def final_value(series: pd.Series, last_n: int = 1) -> float:
    """Mean of the last ``last_n`` points of a step-indexed series (NaN if empty)."""
    if last_n < 1:
        raise ValueError(f"last_n must be >= 1, got {last_n}")
    s = series.dropna().sort_index()
    return float(s.iloc[-last_n:].mean()) if len(s) else float("nan")


def last_point(series: pd.Series) -> tuple[float, int | None]:
    """(value, step) of the last logged point of a step-indexed series; (NaN, None) if it has none."""
    s = series.dropna().sort_index()
    if not len(s):
        return float("nan"), None
    return float(s.iloc[-1]), int(s.index[-1])


def best_value(series: pd.Series, mode: str = "max") -> float:
    s = series.dropna()
    if not len(s):
        return float("nan")
    if mode not in ("max", "min"):
        raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
    return float(s.max() if mode == "max" else s.min())


def smooth(values: np.ndarray | pd.Series, window: int) -> np.ndarray:
    """Centred moving average over ``window`` points (odd windows centre exactly), NaN-aware.

    values: [S]; returns [S]. At the ends the window shrinks to the points available.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    s = pd.Series(np.asarray(values, dtype=float))
    return s.rolling(window, center=True, min_periods=1).mean().to_numpy()


def effective_window(window: int, n_points: int) -> int:
    """The paper's window, capped at half the series (odd) so short CPU runs keep their shape."""
    cap = max(1, n_points // 2)
    w = min(window, cap)
    return w if w % 2 == 1 else max(1, w - 1)


def mean_std(values: np.ndarray | list[float]) -> tuple[float, float, int]:
    """(mean, sample std with ddof=1 (NaN for one value), count) of the finite values."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if not len(x):
        return float("nan"), float("nan"), 0
    std = float(np.std(x, ddof=1)) if len(x) > 1 else float("nan")
    return float(np.mean(x)), std, len(x)


def bootstrap_ci(
    values: np.ndarray | list[float], level: float = 0.95, n_boot: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean of ``values`` (NaN, NaN for fewer than 2 values)."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if len(x) < 2:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), size=(n_boot, len(x)))].mean(axis=1)
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(means, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


def run_series(data: ExperimentData, metric: str) -> dict[str, pd.Series]:
    """{run_id: step-indexed series} of one metric (last value wins on repeated steps)."""
    m = data.metrics
    sel = m[m["metric"] == metric]
    if not len(sel):
        return {}
    sel = sel.sort_values(["step", "timestamp"]).drop_duplicates(["run_id", "step"], keep="last")
    return {str(rid): g.set_index("step")["value"] for rid, g in sel.groupby("run_id", observed=True)}


def per_run(data: ExperimentData, metric: str, how: str = "final", last_n: int = 1) -> pd.DataFrame:
    """One value per run: columns run_id + run labels + ``value``.

    how: "final" (mean of last ``last_n``), "max", "min", "mean", "first", "median".
    """
    labels = data.labels()
    series = run_series(data, metric)
    fns = {
        "final": lambda s: final_value(s, last_n),
        "max": lambda s: best_value(s, "max"),
        "min": lambda s: best_value(s, "min"),
        "mean": lambda s: float(s.mean()),
        "median": lambda s: float(s.median()),
        "first": lambda s: float(s.dropna().sort_index().iloc[0]) if s.notna().any() else float("nan"),
    }
    if how not in fns:
        raise ValueError(f"how must be one of {sorted(fns)}, got {how!r}")
    labels["value"] = [fns[how](series[r]) if r in series else float("nan") for r in labels["run_id"]]
    return labels


def final_evals(data: ExperimentData, metric: str) -> pd.DataFrame:
    """The final evaluation of every run: its last logged evaluation of ``metric`` and the step it was
    taken at. Columns: ``data.labels()`` + ``value`` + ``step`` (NaN for a run without the metric).

    Every table that prints a "final" evaluation figure takes it from here, so a method has one final
    value per metric in the whole report."""
    labels = data.labels()
    series = run_series(data, metric)
    points = [last_point(series[r]) if r in series else (float("nan"), None) for r in labels["run_id"]]
    labels["value"] = [v for v, _ in points]
    labels["step"] = [float("nan") if st is None else float(st) for _, st in points]
    return labels


def steps_text(steps) -> str:
    """'step 20' when every run's evaluation was at the same step, 'steps 10-20' otherwise ('–' for none)."""
    x = sorted({int(v) for v in np.asarray(list(steps), dtype=float) if np.isfinite(v)})
    if not x:
        return "–"
    return f"step {x[0]}" if len(x) == 1 else f"steps {x[0]}-{x[-1]}"


def final_eval_label(steps, what: str = "pass@1") -> str:
    """'pass@1 at step 20 (last eval)': the label of a final evaluation figure, naming its step(s)."""
    return f"{what} at {steps_text(steps)} (last eval)"


def summarize(values: pd.DataFrame, by: list[str] | str = "method", ci: bool = True) -> pd.DataFrame:
    """Across-seed summary of a ``per_run`` frame: by-keys, mean, std, n, ci_lo, ci_hi."""
    by = [by] if isinstance(by, str) else list(by)
    rows = []
    for key, g in values.groupby(by, sort=False, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        mean, std, n = mean_std(g["value"])
        lo, hi = bootstrap_ci(g["value"]) if ci else (float("nan"), float("nan"))
        rows.append({**dict(zip(by, key)), "mean": mean, "std": std, "n": n, "ci_lo": lo, "ci_hi": hi})
    return pd.DataFrame(rows, columns=[*by, "mean", "std", "n", "ci_lo", "ci_hi"])


def seed_curves(
    data: ExperimentData, metric: str, by: str = "method", window: int = 1, level: float = 0.95, n_boot: int = 500
) -> pd.DataFrame:
    """Per group and step: raw mean over runs, smoothed mean, bootstrap band of the smoothed mean.

    Each run's curve is smoothed first (``effective_window(window, n)``); columns: by, step, raw,
    smooth, lo, hi, n_runs.
    """
    labels = data.labels().set_index("run_id")
    series = run_series(data, metric)
    frames = []
    for group, run_ids in labels.groupby(by, sort=False).groups.items():
        curves = {r: series[r] for r in run_ids if r in series}
        if not curves:
            continue
        table = pd.DataFrame(curves).sort_index()  # [S steps, R runs], NaN where a run lacks a step
        w = effective_window(window, len(table))
        smoothed = np.column_stack([smooth(table[c].to_numpy(), w) for c in table.columns])
        raw_mean = np.nanmean(table.to_numpy(), axis=1)
        smooth_mean = np.nanmean(smoothed, axis=1)
        lo = hi = np.full(len(table), np.nan)
        if smoothed.shape[1] > 1:
            rng = np.random.default_rng(0)
            idx = rng.integers(0, smoothed.shape[1], size=(n_boot, smoothed.shape[1]))
            boots = np.nanmean(smoothed[:, idx], axis=2)  # [S, n_boot]
            alpha = (1.0 - level) / 2.0
            lo, hi = np.nanquantile(boots, [alpha, 1.0 - alpha], axis=1)
        frames.append(
            pd.DataFrame(
                {
                    by: group,
                    "step": table.index.to_numpy(),
                    "raw": raw_mean,
                    "smooth": smooth_mean,
                    "lo": lo,
                    "hi": hi,
                    "n_runs": smoothed.shape[1],
                    "window": w,
                }
            )
        )
    cols = [by, "step", "raw", "smooth", "lo", "hi", "n_runs", "window"]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=cols)


def best_checkpoint(selection: list[pd.Series]) -> int | None:
    """Step with the highest mean over the selection series (only steps all of them have)."""
    if not selection:
        return None
    table = pd.concat(selection, axis=1).dropna()
    if not len(table):
        return None
    score = table.mean(axis=1)
    return int(score.idxmax())


def value_at(series: pd.Series, step: int) -> float:
    """Value at ``step`` or, if not logged there, at the last logged step before it (else NaN)."""
    s = series.dropna().sort_index()
    s = s[s.index <= step]
    return float(s.iloc[-1]) if len(s) else float("nan")


def entropy_change(entropy: pd.Series, step: int) -> tuple[float, float]:
    """(absolute, relative) change of entropy from the first logged step to ``step``.

    A checkpoint before the first logged entropy (e.g. the evaluation at step 0) is the initial
    policy: change 0.
    """
    s = entropy.dropna().sort_index()
    if not len(s):
        return float("nan"), float("nan")
    h0 = float(s.iloc[0])
    d = value_at(s, max(step, int(s.index[0]))) - h0
    return d, d / h0 if h0 != 0 else float("nan")
