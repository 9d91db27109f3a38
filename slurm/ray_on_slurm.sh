#!/usr/bin/env bash
# shellcheck disable=SC2317  # stop_tree, stop_ray and forward run from traps
# Ray-on-Slurm bootstrap for the verl backend: start a Ray cluster over the nodes of the current Slurm
# allocation, wait until every node and GPU has joined, run one command against it, stop Ray.
#
# Design: the Ray head runs on the first node of $SLURM_JOB_NODELIST, one worker on each other node,
# each inside its own `srun --overlap --nodes=1 --ntasks=1 -w NODE` step running `ray start --block`
# (so Slurm tracks the Ray processes, and SIGTERM to the step stops them). Each node counts its own
# GPUs from the step's environment (CUDA_VISIBLE_DEVICES, else SLURM_GPUS_ON_NODE), so heterogeneous
# nodes and --gpus / --gres / --gpus-per-node requests all give the right count. The command runs on
# the head node with RAY_ADDRESS exported, so `ray.init()` (as verl's main_ppo calls it) connects.
#
# Usage, inside an allocation (sbatch script or salloc); `exec` it from a batch script so that it is
# the batch shell, which `--signal=B:USR1@N` and `scancel --batch` signal:
#   exec bash slurm/ray_on_slurm.sh python -m verl.trainer.main_ppo trainer.nnodes=$SLURM_NNODES ...
# Exit status: the command's, or 3 when the Ray cluster did not come up complete in time.
#
# Settings (environment):
#   TB_RAY_PORT          GCS port of the head (default 6379)
#   TB_RAY_CLIENT_PORT   Ray client server port of the head (default 10001)
#   TB_RAY_IFACE         network interface whose IPv4 address Ray binds to (default: the node's
#                        NodeAddr from slurm.conf, resolved to IPv4)
#   TB_RAY_HEAD_IP       force the head's address (skips resolution)
#   TB_RAY_OBJECT_STORE_MB  object store size per node in MiB (default: Ray's own, 30% of memory)
#   TB_RAY_TEMP_DIR      Ray's temp/session dir (default /tmp/ray-<jobid>, never shared by two jobs)
#   TB_RAY_WAIT_S        seconds to wait for all nodes and GPUs (default 300)
#   TB_RAY_WORKER_TRIES  times a worker node's `ray start` is tried (default 3): Ray gives a joining
#                        node 30 s to register with the head, which a loaded head can miss
#   TB_RAY_START_ARGS    extra arguments for every `ray start` (e.g. port ranges for firewalls)
#   TB_RAY_HEAD_START_ARGS / TB_RAY_WORKER_START_ARGS  extra arguments for the head's / the workers'
#                        `ray start` only (e.g. different agent ports where "nodes" share one host)
#   TB_RAY_BIN           the ray executable (default: ray on PATH)
#   TB_RAY_PYTHON        the python that has ray, used for the readiness check (default python3)
#   RAY_AUTH_MODE        Ray's auth mode for head, workers and the command (default: token when
#                        ~/.ray/auth_token exists, else disabled)
set -euo pipefail

SELF=$(readlink -f "${BASH_SOURCE[0]}")
RAY_BIN=${TB_RAY_BIN:-ray}
RAY_PYTHON=${TB_RAY_PYTHON:-python3}
RAY_PORT=${TB_RAY_PORT:-6379}
RAY_CLIENT_PORT=${TB_RAY_CLIENT_PORT:-10001}
RAY_WAIT_S=${TB_RAY_WAIT_S:-300}
RAY_WORKER_TRIES=${TB_RAY_WORKER_TRIES:-3}
RAY_TEMP_DIR=${TB_RAY_TEMP_DIR:-/tmp/ray-${SLURM_JOB_ID:-nojob}}
export RAY_USAGE_STATS_ENABLED=0
# One auth mode for the cluster and its clients: Ray turns token auth on for `ray start` once a token
# file exists but a client's ray.init(address) sends the token only when RAY_AUTH_MODE says so.
if [ -z "${RAY_AUTH_MODE:-}" ]; then
    if [ -f "${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token}" ]; then export RAY_AUTH_MODE=token; else export RAY_AUTH_MODE=disabled; fi
fi

log() { printf '[ray_on_slurm %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# GPUs this Slurm step can use: the entries of CUDA_VISIBLE_DEVICES, else SLURM_GPUS_ON_NODE, else 0.
count_gpus() {
    local cvd=${CUDA_VISIBLE_DEVICES:-}
    if [[ -n $cvd && $cvd != NoDevFiles ]]; then
        tr ',' '\n' <<<"$cvd" | grep -c .
    else
        echo "${SLURM_GPUS_ON_NODE:-0}"
    fi
}

# IPv4 address Ray should use on NODE: TB_RAY_IFACE's address (read on that node), else NodeAddr.
resolve_ip() {
    local node=$1 addr
    if [[ -n ${TB_RAY_IFACE:-} ]]; then
        if [[ ${SLURMD_NODENAME:-} == "$node" && -z ${TB_RAY_DRIVER:-} ]]; then
            addr=$(ip -4 -o addr show dev "$TB_RAY_IFACE" scope global | awk 'NR == 1 {split($4, a, "/"); print a[1]}')
        else
            addr=$(srun --overlap --nodes=1 --ntasks=1 -w "$node" ip -4 -o addr show dev "$TB_RAY_IFACE" scope global \
                | awk 'NR == 1 {split($4, a, "/"); print a[1]}')
        fi
    else
        addr=$(scontrol show node "$node" -o | tr ' ' '\n' | sed -n 's/^NodeAddr=//p')
        if [[ ! $addr =~ ^[0-9]+(\.[0-9]+){3}$ ]]; then
            addr=$(getent ahostsv4 "${addr:-$node}" | awk 'NR == 1 {print $1}')
        fi
    fi
    [[ -n $addr ]] || { log "cannot find an IPv4 address for node $node (set TB_RAY_IFACE or TB_RAY_HEAD_IP)"; return 1; }
    echo "$addr"
}

# --node-start head|worker HEAD_IP: run inside a one-task srun step on one node; becomes `ray start`.
start_node() {
    local role=$1 head_ip=$2 ip gpus args=()
    gpus=$(count_gpus)
    if [[ $role == head ]]; then
        ip=$head_ip
        args=(--head --port="$RAY_PORT" --ray-client-server-port="$RAY_CLIENT_PORT"
              --include-dashboard=false --temp-dir="$RAY_TEMP_DIR")
    else
        ip=$(resolve_ip "$SLURMD_NODENAME")
        args=(--address="$head_ip:$RAY_PORT")
    fi
    if [[ -n ${TB_RAY_OBJECT_STORE_MB:-} ]]; then
        args+=(--object-store-memory=$((TB_RAY_OBJECT_STORE_MB * 1024 * 1024)))
    fi
    # shellcheck disable=SC2206  # TB_RAY_START_ARGS is a word list by design
    args+=(${TB_RAY_START_ARGS:-})
    if [[ $role == head ]]; then
        # shellcheck disable=SC2206
        args+=(${TB_RAY_HEAD_START_ARGS:-})
    else
        # shellcheck disable=SC2206
        args+=(${TB_RAY_WORKER_START_ARGS:-})
    fi
    log "$role on $SLURMD_NODENAME ($ip): ${SLURM_CPUS_ON_NODE:-?} CPUs, $gpus GPUs"
    "$RAY_BIN" start --block --disable-usage-stats --node-ip-address="$ip" \
        --num-cpus="${SLURM_CPUS_ON_NODE:-1}" --num-gpus="$gpus" "${args[@]}" &
    local ray_pid=$!
    # `ray start --block` leaves gcs_server, raylet and the agents running when it gets SIGTERM, and
    # `ray stop` would kill every Ray process on the node (other jobs' too): stop this tree only.
    trap 'stop_tree "$ray_pid"; exit 0' TERM INT
    wait "$ray_pid"
}

# stop_tree PID: TERM PID and all its descendants at once, KILL what is left after 3 s.
stop_tree() {
    local root=$1 pids i
    pids=$(ps -e -o pid=,ppid= | awk -v root="$root" '
        { parent[$1] = $2 }
        END { for (p in parent) { q = p; while (q in parent && q != root && q > 1) q = parent[q];
                                  if (q == root) print p } }')
    # shellcheck disable=SC2086
    kill -TERM $pids 2>/dev/null || true
    for ((i = 0; i < 15; i++)); do
        # shellcheck disable=SC2086
        kill -0 $pids 2>/dev/null || return 0
        sleep 0.2
    done
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null || true
}

case "${1:-}" in
    --node-start) shift; start_node "$@"; exit ;;
    --count-gpus) count_gpus; exit 0 ;;
    "" | -h | --help) sed -n '3,/^set -euo/p' "$SELF" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
esac
[[ ${1:-} == -- ]] && shift

# ---- driver: runs once, in the batch script (or salloc shell) -----------------------------------------
if [[ -z ${SLURM_JOB_ID:-} || -z ${SLURM_JOB_NODELIST:-} ]]; then
    log "not inside a Slurm allocation (SLURM_JOB_ID / SLURM_JOB_NODELIST unset): run under sbatch or salloc"
    exit 2
fi
export TB_RAY_DRIVER=1
mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
num_nodes=${#nodes[@]}
if ((num_nodes == 0)) || ((num_nodes != ${SLURM_JOB_NUM_NODES:-$num_nodes})); then
    log "scontrol gave ${num_nodes} nodes for SLURM_JOB_NODELIST=$SLURM_JOB_NODELIST, expected $SLURM_JOB_NUM_NODES"
    exit 2
fi
head=${nodes[0]}
head_ip=${TB_RAY_HEAD_IP:-$(resolve_ip "$head")}
export RAY_ADDRESS=$head_ip:$RAY_PORT

# Expected GPUs: what one step per node sees, counted by the same function the nodes use.
want_gpus=$(srun --overlap --nodes="$num_nodes" --ntasks="$num_nodes" --ntasks-per-node=1 bash "$SELF" --count-gpus \
    | awk '{s += $1} END {print s + 0}')
log "job $SLURM_JOB_ID: $num_nodes node(s) [${nodes[*]}], head $head at $RAY_ADDRESS, $want_gpus GPU(s)"

step_pids=()
stop_ray() {
    local i
    ((${#step_pids[@]})) || return 0
    log "stopping Ray (srun steps ${step_pids[*]})"
    kill -TERM "${step_pids[@]}" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
        kill -0 "${step_pids[@]}" 2>/dev/null || break
        sleep 0.2
    done
    kill -KILL "${step_pids[@]}" 2>/dev/null || true
    wait "${step_pids[@]}" 2>/dev/null || true
    step_pids=()
}
cmd_pid=
forward() {  # forward SIGNAL to the command's step (the trainer may checkpoint), else stop
    if [[ -n $cmd_pid ]]; then
        log "$1: forwarding to the command"
        kill -"$1" "$cmd_pid" 2>/dev/null || true
    else
        log "$1 before the command started: stopping"
        exit 3
    fi
}
trap stop_ray EXIT
trap 'forward TERM' TERM
trap 'forward INT' INT
# --signal=B:USR1@N before the time limit reaches this shell: pass it on to the command.
trap 'forward USR1' USR1

srun --overlap --nodes=1 --ntasks=1 -w "$head" bash "$SELF" --node-start head "$head_ip" &
step_pids+=($!)
deadline=$((SECONDS + RAY_WAIT_S))
until (exec 3<>"/dev/tcp/$head_ip/$RAY_PORT") 2>/dev/null; do
    if ((SECONDS >= deadline)) || ! kill -0 "${step_pids[0]}" 2>/dev/null; then
        log "Ray head did not open $RAY_ADDRESS"
        exit 3
    fi
    sleep 0.5
done
# start_worker NODE: the worker's srun step, started again (a new step, so Slurm clears what the failed
# one left) while it fails, RAY_WORKER_TRIES times in all. A TERM (stop_ray) goes on to the current step.
start_worker() {
    local node=$1 try step=
    trap '[[ -n $step ]] && kill -TERM "$step" 2>/dev/null; wait "$step" 2>/dev/null; exit 0' TERM
    for ((try = 1; try <= RAY_WORKER_TRIES; try++)); do
        srun --overlap --nodes=1 --ntasks=1 -w "$node" bash "$SELF" --node-start worker "$head_ip" &
        step=$!
        wait "$step" && return 0
        log "worker on $node: ray start failed (try $try of $RAY_WORKER_TRIES)"
        sleep 2
    done
    return 1
}
for node in "${nodes[@]:1}"; do
    start_worker "$node" &
    step_pids+=($!)
done

# Wait until all nodes and GPUs have joined (a driver on the head node, as Ray requires).
wait_s=$((deadline - SECONDS > 1 ? deadline - SECONDS : 1))
if ! srun --overlap --nodes=1 --ntasks=1 -w "$head" "$RAY_PYTHON" - "$num_nodes" "$want_gpus" "$wait_s" <<'PY'
import sys
import time

import ray

want_nodes, want_gpus, wait_s = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
deadline = time.monotonic() + wait_s
ray.init(logging_level="ERROR", log_to_driver=False)
while True:
    alive = [n for n in ray.nodes() if n["Alive"]]
    gpus = sum(n["Resources"].get("GPU", 0) for n in alive)
    if len(alive) >= want_nodes and gpus >= want_gpus:
        print(f"[ray_on_slurm] ready: {len(alive)} node(s), {gpus:g} GPU(s)", file=sys.stderr)
        sys.exit(0)
    if time.monotonic() > deadline:
        print(f"[ray_on_slurm] timeout: {len(alive)}/{want_nodes} node(s), {gpus:g}/{want_gpus:g} GPU(s)", file=sys.stderr)
        sys.exit(1)
    time.sleep(0.5)
PY
then
    log "Ray cluster incomplete after ${RAY_WAIT_S}s"
    exit 3
fi

log "running: $*"
# In the background so that trapped signals are handled at once (bash defers traps until a
# foreground child exits); `wait` returns early on a trapped signal, so loop until the step is gone.
srun --overlap --nodes=1 --ntasks=1 -w "$head" "$@" &
cmd_pid=$!
while kill -0 "$cmd_pid" 2>/dev/null; do
    wait "$cmd_pid" || true
done
wait "$cmd_pid" && rc=0 || rc=$?  # bash keeps the status of a reaped background job
log "command exited with $rc"
exit "$rc"
