#!/usr/bin/env bash
# Health check of the trustbench test Slurm cluster; the exit code names the first check that failed.
#
#   0  healthy
#   10 not configured ($SLURM_CONF missing: run up.sh)
#   11 munge does not answer
#   12 slurmctld does not answer (scontrol ping)
#   13 a node is not up (sinfo: not idle, mixed or allocated)
#   14 `srun hostname` on every node failed
#   15 slurmdbd / sacct does not answer
#
#   bash slurm/testcluster/health.sh; echo $?
set -uo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

fail() { log "FAIL: $2"; exit "$1"; }

[[ -f $SLURM_CONF ]] || fail 10 "$SLURM_CONF missing (run up.sh)"
munge -n -S "$MUNGE_SOCKET" 2>/dev/null | unmunge -S "$MUNGE_SOCKET" >/dev/null 2>&1 \
    || fail 11 "munged on $MUNGE_SOCKET does not answer"
timeout 15 scontrol ping 2>/dev/null | grep -q 'is UP' || fail 12 "slurmctld does not answer scontrol ping"
nodes=$(timeout 15 sinfo -h -N -o %N 2>/dev/null | sort -u | wc -l)
up=$(timeout 15 sinfo -h -N -t idle,mixed,allocated -o %N 2>/dev/null | sort -u | wc -l)
((nodes > 0 && up == nodes)) || fail 13 "$up of $nodes node(s) idle/mixed/allocated: $(sinfo -h -N -o '%N %t %E' 2>&1 | sort -u | tr '\n' ';')"
out=$(timeout 30 srun --quiet --nodes="$nodes" --ntasks-per-node=1 --time=1 --job-name=tb-health hostname 2>&1) \
    || fail 14 "srun hostname on $nodes node(s) failed: $out"
timeout 15 sacct -n -X -S now-1hours -o JobID >/dev/null 2>&1 || fail 15 "sacct does not answer (slurmdbd)"
log "healthy: slurmctld up, $nodes node(s) up, srun ran on all, sacct answers"
