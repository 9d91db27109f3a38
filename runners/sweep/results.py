"""How each cell of a launched sweep ended (``runners.sweep``), from its status marker.

Hydra and submitit report a failed cell as a completed job: the status marker the run wrote
(``runners.run``), and for submitit jobs how the job ended, say what happened.
"""

from __future__ import annotations

import json
import sys

from runners import paths
from runners.sweep.planning import Cell, SweepPlan


def outcomes(p: SweepPlan) -> list[tuple[Cell, str, str]]:
    """(cell, status, reason) of every cell from its status marker and, for Slurm jobs, how the job ended.

    Hydra and submitit report a failed cell as a completed job: the marker says what happened. A job
    that ended without reaching a final marker (time limit, cancel, node failure) is LOST."""
    from runners.run import read_status

    out = []
    for cell in p.cells:
        st = read_status(paths.run_dir(cell.key)) or {}
        status, reason = st.get("status", "MISSING"), st.get("reason", "")
        job = p.jobs.get(cell.key)
        if cell.action == "skip-finished":
            status, reason = "FINISHED", ""
        elif job is not None and status not in ("FINISHED", "FAILED"):
            reason = f"{job.describe()}; last marker {status}" + (f" ({reason})" if reason else "")
            status = "LOST"
        elif job is not None and job.error and status != "FAILED":
            status, reason = "FAILED", job.describe()
        out.append((cell, status, reason))
    return out


def write_outcomes(p: SweepPlan) -> None:
    if p.sweep_dir is None:
        return
    rows = [
        {"name": c.name, "key": c.key, "overrides": c.overrides, "status": s, "reason": r,
         "job": p.jobs[c.key].job_id if c.key in p.jobs else None}
        for c, s, r in outcomes(p)
    ]  # fmt: skip
    (p.sweep_dir / "outcomes.json").write_text(json.dumps(rows, indent=2))


def report_outcomes(p: SweepPlan, stream=sys.stdout) -> int:
    """Print one line per cell; return the number of cells that did not finish."""
    bad = 0
    for cell, status, reason in outcomes(p):
        mark = "ok " if status == "FINISHED" else "!! "
        if status != "FINISHED":
            bad += 1
        extra = f"  ({reason})" if reason and status != "FINISHED" else ""
        print(f"{mark}{status:<10} {cell.name:<40} {cell.axes or '<base>'}{extra}", file=stream)
    return bad
