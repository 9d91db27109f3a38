"""verl's per-step metrics -> trustbench's metric schema (``runners/metric_names.py``), and the file they come in.

Design: verl (0.9.1, v1 trainer) logs one dict per training step through its ``Tracking`` object.
The verl backend asks for verl's ``file`` logger (one JSON line ``{"step": s, "data": {...}}`` per
call, ``VERL_FILE_LOGGER_PATH``), follows that file while verl runs (``MetricsFile``), renames the
metrics with ``map_metrics`` and logs them through the trustbench run's ``RunTracker`` -- so one
process writes the MLflow run, steps already logged before a requeue are not logged twice, and
every backend's runs read the same (see ``backend.py`` for the alternative ``metrics_via: mlflow``).

Most names already agree with the schema (``actor/entropy``, ``actor/pg_clipfrac``,
``critic/score/mean``, ``response_length/mean``, ``timing_s/gen``, ...). What differs:

- ``@`` (``val-core/<data>/acc/mean@4``, ``best@4/mean``, ``maj@4/mean``) becomes ``_at_``, and
  other characters MLflow rejects become ``_`` -- the substitution verl's own MLflow logger makes;
- verl's ``perf/throughput`` is tokens per second *per GPU*; the schema's is for the whole step:
  ``perf/total_num_tokens / perf/time_per_step``. verl's value is kept as ``perf/throughput_per_gpu``;
- ``perf/gen_throughput`` (generated tokens per second of rollout), which verl does not log:
  ``response_length/mean * responses_per_step / timing_s/gen``;
- the v1 workers report memory per role (``actor/perf/max_memory_allocated_gb``,
  ``critic/perf/...``): the schema's ``perf/max_memory_allocated_gb`` / ``perf/cpu_memory_used_gb``
  are the maximum over roles (the per-role names are kept too);
- ``kl_loss`` / ``kl_coef`` (unprefixed in v1's loss) become ``actor/kl_loss`` / ``actor/kl_coef``.

Values that are not numbers (lists, strings) are dropped. NaN and inf are kept, so that the run's
tracker stops the run naming the metric and step, except where verl itself reports NaN for a
diagnostic it did not compute (``NAN_WHEN_UNUSED``: e.g. ``variance_proxy/*`` in every step that
has no variance proxy).

    from runners.backends.verl.metrics import map_metrics
    map_metrics({"val-core/gsm8k/acc/mean@4": 0.5})   # {"val-core/gsm8k/acc/mean_at_4": 0.5}
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from runners import metric_names

_INVALID = re.compile(r"[^/\w.\- :]")
_SLASHES = re.compile(r"/+")
RENAMED = {"kl_loss": "actor/kl_loss", "kl_coef": "actor/kl_coef", "perf/throughput": "perf/throughput_per_gpu"}
# schema name <- verl's per-role names (maximum over the roles present)
ROLE_MAXIMA = {
    metric_names.MAX_MEMORY_ALLOCATED_GB: ("actor/perf/max_memory_allocated_gb", "critic/perf/max_memory_allocated_gb"),
    "perf/max_memory_reserved_gb": ("actor/perf/max_memory_reserved_gb", "critic/perf/max_memory_reserved_gb"),
    metric_names.CPU_MEMORY_USED_GB: ("actor/perf/cpu_memory_used_gb", "critic/perf/cpu_memory_used_gb"),
}


def sanitize_key(key: str) -> str:
    """An MLflow-valid metric name: ``@`` -> ``_at_``, ``//`` -> ``/``, other invalid characters -> ``_``."""
    return _INVALID.sub("_", _SLASHES.sub("/", key.replace("@", "_at_")))


# verl's metric prefixes that read NaN when their diagnostic was not computed in a step
NAN_WHEN_UNUSED = ("variance_proxy/",)


def _number(key: str, value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        if not math.isfinite(float(value)) and key.startswith(NAN_WHEN_UNUSED):
            return None
        return float(value)
    return None


def map_metrics(raw: Mapping[str, Any], *, responses_per_step: int | None = None) -> dict[str, float]:
    """One step's verl metrics renamed to the schema (see the module docstring).

    ``responses_per_step`` (prompts per step x n) enables ``perf/gen_throughput``.
    """
    out: dict[str, float] = {}
    for key, value in raw.items():
        number = _number(key, value)
        if number is not None:
            out[RENAMED.get(key, sanitize_key(key))] = number
    if out.get("perf/time_per_step", 0) > 0 and "perf/total_num_tokens" in out:
        out[metric_names.THROUGHPUT] = out["perf/total_num_tokens"] / out["perf/time_per_step"]
    gen_s = out.get(metric_names.TIMING_GEN, 0.0)
    if responses_per_step and gen_s > 0 and metric_names.RESPONSE_LENGTH_MEAN in out:
        out[metric_names.GEN_THROUGHPUT] = out[metric_names.RESPONSE_LENGTH_MEAN] * responses_per_step / gen_s
    for target, sources in ROLE_MAXIMA.items():
        present = [out[s] for s in sources if s in out]
        if present and target not in out:
            out[target] = max(present)
    return out


class MetricsFile:
    """Follows a JSON-lines file that another process appends to (verl's ``file`` logger).

    ``read_new()`` returns the complete records added since the last call; a last line still being
    written (no newline yet) is kept for the next call. The file is reopened on every call, so a
    reader on another node of a shared filesystem sees what the writer closed (close-to-open).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.offset = 0

    def read_new(self) -> list[tuple[int, dict[str, Any]]]:
        """``[(step, data), ...]`` of the records appended since the previous call."""
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read()
        except FileNotFoundError:
            return []
        end = chunk.rfind(b"\n")
        if end < 0:
            return []
        self.offset += end + 1
        records = []
        for line in chunk[: end + 1].splitlines():
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line verl never finished (killed mid-write)
            if isinstance(record, dict) and isinstance(record.get("data"), dict) and "step" in record:
                records.append((int(record["step"]), record["data"]))
        return records
