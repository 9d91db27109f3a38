#!/usr/bin/env bash
# Bring up the trustbench test Slurm cluster on this machine, as root, without systemd.
#
# Starts private instances of munged, MariaDB, slurmdbd, slurmctld and $TB_SLURM_NODES slurmd (one
# per emulated node, default 2; 1 gives a strictly single-node cluster) with every config, socket,
# pid file, log and state file under $TB_SLURM_DIR (default /tmp/trustbench-slurm). The configs are
# rendered from the *.in templates beside this script with this machine's hostname, CPU layout and
# memory (`slurmd -C`) and $TB_SLURM_GPUS fake GPUs per node (character devices, gres "gpu").
# Idempotent: a healthy cluster is left alone, a daemon already running is not started twice. The
# MariaDB data directory and Slurm's state survive down.sh (fast restart); `down.sh --purge` wipes them.
#
#   sudo bash slurm/testcluster/up.sh && . /tmp/trustbench-slurm/etc/env.sh && sinfo
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
t0=${EPOCHREALTIME/./}
stage() { log "$(printf '%6.1f' "$(((${EPOCHREALTIME/./} - t0) / 1000))e-3") s  $*"; }

if [[ $(id -u) -ne 0 ]]; then
    log "must run as root (the daemons run as root in the test cluster)"
    exit 2
fi
for bin in munged mungekey mariadbd mariadb-install-db mariadb slurmdbd slurmctld slurmd sbatch sacctmgr; do
    command -v "$bin" >/dev/null || { log "missing $bin: run slurm/testcluster/install.sh"; exit 2; }
done
if [[ -f $SLURM_CONF ]] && bash "$TESTCLUSTER_SRC/health.sh" >/dev/null 2>&1; then
    log "cluster already up and healthy in $TB_SLURM_DIR"
    exit 0
fi

D=$TB_SLURM_DIR
mkdir -p "$D"/{etc,munge,mysql,spool/ctld,log,run,dev}
chmod 755 "$D"
chmod 755 "$D/munge"  # munged: socket dir must be searchable by all; the key stays 0600

# ---- configuration: this machine's layout, rendered into $D/etc --------------------------------
if ((TB_SLURM_NODES < 1 || TB_SLURM_NODES > 8)); then
    log "TB_SLURM_NODES=$TB_SLURM_NODES: expected 1 to 8 emulated nodes"
    exit 2
fi
hw=$(slurmd -C | head -1)
hw_field() { sed -n "s/.* $1=\([0-9]*\).*/\1/p" <<<"$hw"; }
# Leave 5% of memory (at least 512 MB) to the OS so slurmd's registration check never fails.
mem=$(hw_field RealMemory)
mem=$((mem - (mem / 20 > 512 ? mem / 20 : 512)))
if [[ ! -s $D/mysql/pass ]]; then
    head -c 18 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' >"$D/mysql/pass"
    chmod 600 "$D/mysql/pass"
fi
if ((TB_SLURM_GPUS < 1)); then
    log "TB_SLURM_GPUS=$TB_SLURM_GPUS: need at least one fake GPU"
    exit 2
fi
nodes=()
node_lines=""
for ((i = 0; i < TB_SLURM_NODES; i++)); do
    nodes+=("$(node_name "$i")")
    node_lines+="NodeName=$(node_name "$i") NodeHostname=$HOST NodeAddr=$TB_SLURM_ADDR Port=$(node_port "$i") \
CPUs=$(hw_field CPUs) Boards=$(hw_field Boards) SocketsPerBoard=$(hw_field SocketsPerBoard) \
CoresPerSocket=$(hw_field CoresPerSocket) ThreadsPerCore=$(hw_field ThreadsPerCore) RealMemory=$mem \
Gres=gpu:$TB_SLURM_GPUS State=UNKNOWN"$'\n'
done
node_csv=$(IFS=,; echo "${nodes[*]}")
printf '%s' "$node_lines" >"$D/etc/node_lines.tmp"
render() {  # render TEMPLATE DEST
    sed -e "s|@DIR@|$D|g" -e "s|@HOST@|$HOST|g" -e "s|@ADDR@|$TB_SLURM_ADDR|g" \
        -e "s|@CTLD_PORT@|$CTLD_PORT|g" -e "s|@SLURMD_PORT@|$SLURMD_PORT|g" \
        -e "s|@DBD_PORT@|$DBD_PORT|g" -e "s|@MYSQL_PORT@|$MYSQL_PORT|g" \
        -e "s|@MYSQL_PASS@|$(cat "$D/mysql/pass")|g" -e "s|@NODES@|$node_csv|g" \
        -e "s|@GPUS@|$TB_SLURM_GPUS|g" -e "s|@LAST_GPU@|$((TB_SLURM_GPUS - 1))|g" \
        -e "/@NODE_LINES@/{r $D/etc/node_lines.tmp" -e "d}" \
        "$TESTCLUSTER_SRC/$1" >"$D/etc/$2"
}
render slurm.conf.in slurm.conf
render gres.conf.in gres.conf
render slurmdbd.conf.in slurmdbd.conf
chmod 600 "$D/etc/slurmdbd.conf"
rm -f "$D/etc/node_lines.tmp"
cat >"$D/etc/env.sh" <<ENV
# Source this to use the trustbench test cluster: . $D/etc/env.sh
export SLURM_CONF=$SLURM_CONF
export TB_SLURM_DIR=$D
ENV

# Fake GPUs: character devices with the NVIDIA major number (195). Slurm rejects plain files
# ("not a valid character or block device") and then sets no CUDA_VISIBLE_DEVICES.
rm -f "$D"/dev/nvidia*
for ((i = 0; i < TB_SLURM_GPUS; i++)); do
    mknod "$D/dev/nvidia$i" c 195 "$i" || { log "mknod $D/dev/nvidia$i refused: fake GPUs need it"; exit 1; }
done

# ---- munge ----------------------------------------------------------------------------------------
if ! live_pid "$D/run/munged.pid" >/dev/null; then
    [[ -s $D/munge/munge.key ]] || mungekey --create --keyfile="$D/munge/munge.key" >/dev/null
    chmod 600 "$D/munge/munge.key"
    rm -f "$MUNGE_SOCKET" "$MUNGE_SOCKET.lock"
    munged --socket="$MUNGE_SOCKET" --key-file="$D/munge/munge.key" --pid-file="$D/run/munged.pid" \
        --log-file="$D/log/munged.log" --seed-file="$D/munge/munged.seed" --num-threads=2
fi
wait_for 10 "munged" bash -c "munge -n -S '$MUNGE_SOCKET' | unmunge -S '$MUNGE_SOCKET'"
stage "munged answers"

# ---- MariaDB (slurmdbd's store), TCP on $TB_SLURM_ADDR:$MYSQL_PORT only -----------------------------
if ! live_pid "$D/run/mariadbd.pid" >/dev/null; then
    if [[ ! -d $D/mysql/data/mysql ]]; then
        mariadb-install-db --no-defaults --user=root --datadir="$D/mysql/data" --skip-test-db \
            --auth-root-authentication-method=socket >"$D/log/mariadb-install.log" 2>&1 \
            || { log "mariadb-install-db failed, see $D/log/mariadb-install.log"; exit 1; }
    fi
    rm -f "$MYSQL_SOCKET"
    setsid mariadbd --no-defaults --user=root --datadir="$D/mysql/data" --socket="$MYSQL_SOCKET" \
        --pid-file="$D/run/mariadbd.pid" --port="$MYSQL_PORT" --bind-address="$TB_SLURM_ADDR" \
        --skip-name-resolve --log-error="$D/log/mariadb.log" --skip-log-bin \
        --innodb-buffer-pool-size=128M --innodb-log-file-size=64M --innodb-lock-wait-timeout=900 \
        --innodb-flush-log-at-trx-commit=0 --innodb-doublewrite=0 --innodb-use-native-aio=0 \
        --performance-schema=OFF </dev/null >/dev/null 2>&1 &
fi
wait_for 30 "MariaDB" mariadb-admin --no-defaults --socket="$MYSQL_SOCKET" ping
stage "MariaDB answers"
pass=$(cat "$D/mysql/pass")
mariadb --no-defaults --socket="$MYSQL_SOCKET" -u root <<SQL
CREATE USER IF NOT EXISTS 'slurm'@'$TB_SLURM_ADDR' IDENTIFIED BY '$pass';
ALTER USER 'slurm'@'$TB_SLURM_ADDR' IDENTIFIED BY '$pass';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'$TB_SLURM_ADDR';
SQL

# ---- slurmdbd, slurmctld, slurmd ------------------------------------------------------------------
if ! live_pid "$D/run/slurmdbd.pid" >/dev/null; then
    slurmdbd
fi
wait_for 60 "slurmdbd" sacctmgr -n list cluster
stage "slurmdbd answers"
if [[ -z $(sacctmgr -n -P list cluster format=cluster where cluster=trustbench) ]]; then
    sacctmgr -i add cluster trustbench >/dev/null
fi
if ! live_pid "$D/run/slurmctld.pid" >/dev/null; then
    slurmctld -i
fi
wait_for 30 "slurmctld" scontrol ping
stage "slurmctld answers"
for node in "${nodes[@]}"; do
    if ! live_pid "$D/run/slurmd-$node.pid" >/dev/null; then
        mkdir -p "$D/spool/d-$node"
        slurmd -N "$node"
    fi
done
# Jobs restored from the saved state of a cluster that was not brought down cleanly (or that left
# the cluster unhealthy) have no processes any more: cancel them so the node comes back idle.
if [[ -n $(squeue -h -o %i) ]]; then
    log "cancelling jobs left from a previous run: $(squeue -h -o %i | tr '\n' ' ')"
    # by job id (%F: an array's pending tasks show as 63_[10-17%18], which scancel does not parse)
    mapfile -t jobs < <(squeue -h -o %F | sort -u)
    scancel --quiet "${jobs[@]}" || true
fi
all_idle() { (($(sinfo -h -N -t idle -o %N | sort -u | wc -l) == TB_SLURM_NODES)); }
if ! wait_for 30 "$TB_SLURM_NODES node(s) idle" all_idle; then
    # a node still allocated to a job no process runs any more: take it down and back (its jobs end)
    log "forcing the nodes back to idle"
    mapfile -t busy < <(sinfo -h -N -o %N | sort -u)
    for node in "${busy[@]}"; do
        scontrol update nodename="$node" state=down reason="up.sh: stale jobs" || true
        scontrol update nodename="$node" state=resume || true
    done
    wait_for 30 "$TB_SLURM_NODES node(s) idle" all_idle || { sinfo -N -l >&2; exit 1; }
fi
stage "$TB_SLURM_NODES node(s) idle"

if bash "$TESTCLUSTER_SRC/health.sh"; then
    stage "healthy; use it with: . $D/etc/env.sh"
else
    rc=$?
    log "cluster started but health.sh failed (exit $rc); logs in $D/log"
    exit "$rc"
fi
