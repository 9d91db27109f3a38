#!/usr/bin/env bash
# Tear down the trustbench test Slurm cluster started by up.sh, by pid only.
#
# Cancels every job first (so slurmstepd processes exit through Slurm), then stops slurmd,
# slurmctld, slurmdbd, MariaDB and munged by the pid files under $TB_SLURM_DIR/run (TERM, then KILL
# after a grace period). Leftover slurmstepd processes are found by their open files under
# $TB_SLURM_DIR, never by name. Data (MariaDB, Slurm state) is kept for a fast restart unless
# --purge is given, which also deletes $TB_SLURM_DIR.
#
#   sudo bash slurm/testcluster/down.sh [--purge]
set -uo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
start_time=$SECONDS
purge=0
case "${1:-}" in
    --purge) purge=1 ;;
    "") ;;
    *) log "unknown argument '$1' (expected --purge or nothing)"; exit 2 ;;
esac
D=$TB_SLURM_DIR

# stop_group NAME...: TERM every named daemon (pid file $D/run/NAME.pid) at once, wait up to 10 s
# for all of them, then KILL what is left. Each daemon takes ~2 s to exit, so groups save time.
stop_group() {
    local name pid i alive
    local -A pids=()
    for name in "$@"; do
        if pid=$(live_pid "$D/run/$name.pid"); then
            pids[$name]=$pid
            kill -TERM "$pid" 2>/dev/null
        fi
        rm -f "$D/run/$name.pid"
    done
    for ((i = 0; i < 50; i++)); do
        alive=0
        for name in "${!pids[@]}"; do
            kill -0 "${pids[$name]}" 2>/dev/null && alive=1
        done
        ((alive)) || break
        sleep 0.2
    done
    for name in "${!pids[@]}"; do
        if kill -KILL "${pids[$name]}" 2>/dev/null; then
            log "killed $name (pid ${pids[$name]}) after 10 s"
        else
            log "stopped $name (pid ${pids[$name]})"
        fi
    done
}

# slurmstepd processes (Debian names the binary slurmstepd-wlm) holding files open under $D (the
# slurmd logs), and all their descendants (the job's processes), whatever became of slurmd.
leftover_job_pids() {
    local pid stepds=()
    for pid in $(find /proc/[0-9]*/fd -maxdepth 1 -lname "$D/*" 2>/dev/null | cut -d/ -f3 | sort -u); do
        [[ $(readlink "/proc/$pid/exe" 2>/dev/null) == */slurmstepd* ]] && stepds+=("$pid")
    done
    ((${#stepds[@]})) || return 0
    ps -e -o pid=,ppid= | awk -v roots="${stepds[*]}" '
        BEGIN { n = split(roots, r, " "); for (i = 1; i <= n; i++) keep[r[i]] = 1 }
        { parent[$1] = $2 }
        END { for (p in parent) { q = p; while (q in parent && !(q in keep) && q > 1) q = parent[q];
                                  if (q in keep) print p } }'
}

if [[ -f $SLURM_CONF ]] && live_pid "$D/run/slurmctld.pid" >/dev/null; then
    mapfile -t jobs < <(squeue -h -o %F 2>/dev/null | sort -u)
    ((${#jobs[@]} == 0)) || scancel --quiet "${jobs[@]}" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
        [[ -z $(squeue -h -o %i 2>/dev/null) ]] && break
        sleep 0.2
    done
fi
# slurmctld keeps accounting records slurmdbd has not acknowledged in its state (dbd.messages), so
# slurmdbd may stop together with it; MariaDB and munged must outlive slurmdbd.
slurmds=()
for pidfile in "$D"/run/slurmd-*.pid; do
    [[ -e $pidfile ]] && slurmds+=("$(basename "$pidfile" .pid)")
done
stop_group "${slurmds[@]}" slurmctld slurmdbd
for pid in $(leftover_job_pids); do
    kill -KILL "$pid" 2>/dev/null && log "killed leftover job process (pid $pid)"
done
stop_group mariadbd munged

if ((purge)); then
    rm -rf "$D"
    log "purged $D"
fi
log "cluster down in $((SECONDS - start_time)) s"
