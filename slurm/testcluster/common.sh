# shellcheck shell=bash disable=SC2034  # sourced: the variables are used by up/down/health.sh
# Shared settings of the trustbench test cluster scripts (sourced by up.sh, down.sh, health.sh).
#
# One directory holds everything: $TB_SLURM_DIR (default /tmp/trustbench-slurm) with etc/ (rendered
# configs and env.sh), munge/, mysql/, spool/, log/, run/ (pid files) and dev/ (fake GPU devices).
# Ports default to 16817.. so a system Slurm on 6817-6819 or MariaDB on 3306 is never touched.
# TB_SLURM_NODES slurmd daemons (default 2) emulate that many nodes on this machine; TB_SLURM_GPUS
# fake GPUs per node (default 8: the background sweeps of the tests and the tests beside them fit at once).

TB_SLURM_DIR=${TB_SLURM_DIR:-/tmp/trustbench-slurm}
TB_SLURM_PORT_BASE=${TB_SLURM_PORT_BASE:-16817}
TB_SLURM_NODES=${TB_SLURM_NODES:-2}
TB_SLURM_GPUS=${TB_SLURM_GPUS:-8}
TB_SLURM_ADDR=${TB_SLURM_ADDR:-127.0.0.1}

CTLD_PORT=$TB_SLURM_PORT_BASE
SLURMD_PORT=$((TB_SLURM_PORT_BASE + 1))
DBD_PORT=$((TB_SLURM_PORT_BASE + 2))
MYSQL_PORT=$((TB_SLURM_PORT_BASE + 3))
HOST=$(hostname -s)
# Node i (0-based) is $HOST, then $HOST-2, $HOST-3, ...; its slurmd listens on SLURMD_PORT + 10 * i.
node_name() { if (($1 == 0)); then echo "$HOST"; else echo "$HOST-$(($1 + 1))"; fi; }
node_port() { echo $((SLURMD_PORT + 10 * $1)); }

TESTCLUSTER_SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export SLURM_CONF=$TB_SLURM_DIR/etc/slurm.conf
MUNGE_SOCKET=$TB_SLURM_DIR/munge/munge.socket
MYSQL_SOCKET=$TB_SLURM_DIR/mysql/mysqld.sock

log() { printf '[%s] %s\n' "$(basename "$0")" "$*" >&2; }

# Print the pid in a pid file if that process is alive, else nothing.
live_pid() {
    local file=$1 pid
    [[ -s $file ]] || return 1
    pid=$(tr -dc '0-9' <"$file")
    [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

# wait_for SECONDS DESCRIPTION COMMAND...: retry COMMAND every 0.2 s until it succeeds.
wait_for() {
    local timeout=$1 what=$2 deadline
    shift 2
    deadline=$((SECONDS + timeout))
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS >= deadline)); then
            log "timed out after ${timeout}s waiting for $what"
            return 1
        fi
        sleep 0.2
    done
}
