"""The setup box at the top of every report: what the compared runs share, read from their logged config.

A reader must know what was trained before reading any number: the model and its size, the data and its
split sizes, the evaluation protocol, the training budget, the update regime, the sampler, the seeds, the
code and the machine. Each row is one setting of the runs' MLflow params (the resolved config, dotted keys)
or tags; a setting the runs do not share says so and lists its values with their run counts (what differs
per method is in the config-difference table). Nothing is assumed: a setting no run logged reads "–".

    from analysis.tables.setup import setup_table
    table = setup_table(data)       # rows: Model, Data, Evaluation, Training, Updates, Sampler, ...
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import numpy as np
import pandas as pd

from analysis.arms import run_labels
from analysis.frames import ExperimentData
from analysis.skip import SkipItem
from analysis.tables.base import MISSING, Table
from runners import metric_names
from runners.paths import repo_root

Params = dict[str, str]


def _get(p: Params, key: str) -> str:
    v = p.get(key)
    return MISSING if v is None or v == "None" else str(v)


def _per_step(p: Params) -> str:
    try:
        return str(max(1, int(p["trainer.prompts_per_step"]) // int(p["trainer.mini_batch_prompts"])))
    except (KeyError, ValueError, ZeroDivisionError):
        return MISSING


# (row, what it says) in reading order; each function turns one run's params into text
ROWS: tuple[tuple[str, Callable[[Params], str]], ...] = (
    (
        "Model",
        lambda p: f"{_get(p, 'model.name')} ({_get(p, 'model.params_b')} B parameters, {_get(p, 'model.dtype')})",
    ),
    (
        "Data",
        lambda p: (
            f"{_get(p, 'dataset.name')}: {_get(p, 'dataset.train_limit')} training problems at most, "
            f"{_get(p, 'dataset.eval_limit')} held-out problems"
        ),
    ),
    (
        "Evaluation",
        lambda p: (
            f"every {_get(p, 'trainer.eval_every')} steps and at step 0: pass@1 = mean success of "
            f"{_get(p, 'trainer.eval_n')} samples per held-out problem at temperature {_get(p, 'trainer.eval_temperature')}"
        ),
    ),
    (
        "Training",
        lambda p: (
            f"{_get(p, 'trainer.total_steps')} steps x {_get(p, 'trainer.prompts_per_step')} prompts x "
            f"{_get(p, 'trainer.n')} responses (up to {_get(p, 'rollout.max_response_length')} tokens, prompts up to "
            f"{_get(p, 'rollout.max_prompt_length')}), sampling temperature {_get(p, 'rollout.temperature')}"
        ),
    ),
    (
        "Updates",
        lambda p: (
            f"{_get(p, 'trainer.ppo_epochs')} epoch(s) x {_per_step(p)} mini-batch(es) per step, AdamW lr "
            f"{_get(p, 'trainer.lr')}, gradient clip {_get(p, 'trainer.grad_clip')}, KL coefficient {_get(p, 'trainer.kl_coef')}"
        ),
    ),
    (
        "Sampler",
        lambda p: (
            f"{_get(p, 'rollout.staleness')} iteration(s) behind the trained policy, dtype "
            f"{_get(p, 'rollout.dtype')} (auto = the model's)"
        ),
    ),
    (
        "Backend",
        lambda p: (
            f"{_get(p, 'backend.name')}, device {_get(p, 'backend.device')}, "
            f"{_get(p, 'backend.num_threads')} torch thread(s)"
        ),
    ),
)


def _shared(values: list[str]) -> str:
    """The value every run shares, else each value with its number of runs (most runs first)."""
    counts = Counter(values)
    if len(counts) == 1:
        return values[0]
    return "differs: " + "; ".join(f"{v} ({n} runs)" for v, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _machine(data: ExperimentData, run_ids: list[str]) -> str:
    runs = data.runs.set_index(data.runs["run_id"].astype(str))
    col = f"tags.{metric_names.TAG_HOST}"
    hosts = sorted({str(runs.at[r, col]) for r in run_ids if col in runs and isinstance(runs.at[r, col], str)})
    cpus = data.metrics[data.metrics["metric"] == metric_names.CPU_COUNT_AVAILABLE]["value"]
    parts = [f"host {', '.join(hosts)}" if hosts else "host not recorded"]
    if len(cpus):
        parts.append(f"{int(np.nanmax(cpus.to_numpy(dtype=float)))} CPU core(s) available to a run")
    return "; ".join(parts)


def planned_seeds(sweep: str) -> list[int] | None:
    """The seeds ``sweeps/<sweep>.yaml`` sweeps over (its ``hydra.sweeper.params.seed``), None when the file or
    the axis is not there: a report of a sweep stopped early says how many of its seeds ran."""
    import yaml

    path = repo_root() / "sweeps" / f"{sweep}.yaml"
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        axis = doc["hydra"]["sweeper"]["params"]["seed"]
        return sorted({int(s) for s in str(axis).split(",")})
    except (OSError, KeyError, TypeError, ValueError, yaml.YAMLError):
        return None


def setup_table(data: ExperimentData) -> Table:
    """Rows: the settings of ``ROWS``, then regime, seeds, code and machine (module docstring)."""
    labels = run_labels(data)
    if not len(labels):
        raise SkipItem("the experiment has no runs")
    run_ids = labels["run_id"].astype(str).tolist()
    runs = data.runs.set_index(data.runs["run_id"].astype(str))
    pcols = [c for c in runs.columns if c.startswith("params.")]
    params = {
        r: {c[7:]: str(v) for c, v in runs.loc[r, pcols].items() if isinstance(v, str) or pd.notna(v)} for r in run_ids
    }
    rows: dict[str, str] = {name: _shared([fn(params[r]) for r in run_ids]) for name, fn in ROWS}
    rows["Regime"] = _shared(labels[metric_names.TAG_REGIME].astype(str).tolist())
    seeds = sorted({int(s) for s in labels[metric_names.TAG_SEED] if int(s) >= 0})
    per_arm = labels.groupby("arm")[metric_names.TAG_SEED].nunique()
    rows["Seeds"] = f"{len(seeds)} ({', '.join(map(str, seeds))}); per compared configuration {per_arm.min()}" + (
        f" to {per_arm.max()}" if per_arm.max() != per_arm.min() else ""
    )
    sweeps = sorted({str(s) for s in labels[metric_names.TAG_SWEEP].dropna()})
    planned = planned_seeds(sweeps[0]) if len(sweeps) == 1 else None
    if planned and len(planned) > len(seeds):
        rows["Seeds"] += f"; {len(seeds)} of the {len(planned)} seeds of sweeps/{sweeps[0]}.yaml ran"
    rows["Runs"] = f"{len(run_ids)} runs of {labels['arm'].nunique()} compared configurations"
    rows["Code"] = "; ".join(f"{code} ({n} runs)" for code, n in data.code_versions())
    rows["Machine"] = _machine(data, run_ids)
    frame = pd.DataFrame({"setting": list(rows.values())}, index=pd.Index(list(rows), name="Setup"))
    return Table(
        key="setup",
        title="Setup",
        caption="What the compared runs share, read from their logged config (MLflow params) and tags; a setting "
        "that differs between runs lists its values with their run counts. What differs per method: the config "
        "differences table.",
        values=frame,
        display=frame,
    )
