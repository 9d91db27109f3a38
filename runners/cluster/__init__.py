"""Cells on a Slurm cluster (or as local submitit jobs), one module per role:

- ``job``: what runs inside a cell's job: its Slurm job id, the record of each attempt, the requeue of a
  stopped cell (``requeue_or_fail``);
- ``queue``: the submitting side: queue a job array (``submit_array``), wait for the jobs
  (``wait_jobs``), Slurm's view of them (``queue_states``, ``final_state``, ``JobOutcome``), the
  ``--signal`` delay a job gets;
- ``resources``: the cluster's partitions and nodes (``Cluster``), the sbatch options of a request and
  whether the cluster can ever run it (``check_request``);
- ``verl_batch``: a verl cell's batch script (``render_sbatch``), the command it runs (``run_cell``) and
  the ``trustbench verl`` commands.

What a cell asks for is derived from its config (``runners.config.resources``); the allocation a job
got is a fact of the machine (``runners.perf.hardware.slurm_allocation``): the backends read both, and
import nothing of this package. The package sits above the run of one cell (``runners.run``) and the
backends, below the sweep (``runners.sweep``) and the command line (``runners.cli``, ``runners.main``);
``tests/test_layering.py`` keeps it there. Importing it imports none of its modules.
"""
