"""trustbench analysis: MLflow runs -> tidy frames (cached) -> the papers' tables and figures.

Torch-free by design (a test checks it): it reads MLflow, pandas and numpy only, and takes the TRM
bound formulas from the torch-free ``runners.algorithms.bounds``.

    from analysis import load_experiment
    data = load_experiment("troll_table1")          # ExperimentData(runs, metrics), parquet-cached
    df = data.tidy()                                 # run_id, method, ..., seed, metric, step, value, timestamp

Modules: ``load`` / ``sources`` / ``cache`` (loading), ``frames`` (data model), ``aggregate``
(final/best values, smoothing, seeds, bootstrap CIs, entropy change), ``tables/`` and ``figures/``
(one module per paper), ``paper_data`` (published numbers in ``data/``), ``roofline``, ``synthetic``.
"""

from __future__ import annotations

__all__ = ["ExperimentData", "load_experiment"]


def __getattr__(name: str):
    # lazy, so ``import analysis`` stays cheap (mlflow is imported only when loading)
    if name == "load_experiment":
        from analysis.load import load_experiment

        return load_experiment
    if name == "ExperimentData":
        from analysis.frames import ExperimentData

        return ExperimentData
    raise AttributeError(f"module 'analysis' has no attribute {name!r}")
