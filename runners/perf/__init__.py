"""Hardware accounting shared by the backends: model FLOPs and bytes of a step's phases (``flops``), the
machine's ceilings, load and Slurm allocation (``hardware``), the Roofline points and MFU computed from them
(``roofline``), and the estimated CPU time of cells (``cpu_cost``, for a sweep's dry run).
Backend-independent: each backend hands over its batch's prompt and response lengths and phase times."""
