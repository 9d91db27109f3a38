#!/usr/bin/env bash
# Install the Debian packages of the single-node test Slurm cluster (idempotent, quiet).
#
# Debian bookworm ships Slurm 22.05 as slurmctld / slurmd / slurmdbd / slurm-client, with munge for
# authentication and MariaDB for slurmdbd's accounting store. Package maintainer scripts would start
# munge and MariaDB as system services; a temporary policy-rc.d forbids that (up.sh starts private
# instances under $TB_SLURM_DIR instead), and is removed afterwards unless it was there before.
#
# Run as root:  bash slurm/testcluster/install.sh
set -euo pipefail

PACKAGES=(slurmctld slurmd slurmdbd slurm-client munge mariadb-server)

if [[ $(id -u) -ne 0 ]]; then
    echo "install.sh: must run as root (apt-get install)" >&2
    exit 2
fi

missing=()
for pkg in "${PACKAGES[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
    [[ $status == "install ok installed" ]] || missing+=("$pkg")
done
if [[ ${#missing[@]} -eq 0 ]]; then
    echo "install.sh: all packages present (${PACKAGES[*]})"
    exit 0
fi

policy=/usr/sbin/policy-rc.d
created_policy=0
if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    created_policy=1
fi
cleanup() { if [[ $created_policy -eq 1 ]]; then rm -f "$policy"; fi; }
trap cleanup EXIT

export DEBIAN_FRONTEND=noninteractive
# apt lists may be missing or stale on a fresh machine: update when the candidates are unknown, and
# once more if the install fails (a stale list names package versions the mirror no longer has).
if ! apt-cache policy "${missing[0]}" 2>/dev/null | grep -q 'Candidate: [0-9]'; then
    apt-get update -qq
fi
if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; then
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "install.sh: installed ${missing[*]}"
