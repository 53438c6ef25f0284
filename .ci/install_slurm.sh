#!/usr/bin/env bash
# Install the Debian packages needed for the real one-node SLURM test cluster
# started by tests/slurm/cluster.py (munge, MariaDB, slurmdbd, slurmctld,
# slurmd and the client tools sbatch/squeue/sacct/scontrol/scancel/sacctmgr), plus
# iproute2 and util-linux (ip, nsenter, unshare) for the two-node cluster whose nodes are
# network namespaces (tests/slurm/multinode.py).
#
# Idempotent: if everything is already installed it only checks and exits.
# Meant for Debian 12 (bookworm, SLURM 22.05) as root, non-interactive (CI).
# No daemon is started here and none is enabled: there is no systemd; the
# test fixture starts the daemons itself with config files in its state dir.
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive
export NEEDRESTART_MODE=a

PKGS=(munge mariadb-server mariadb-client slurmctld slurmd slurmdbd slurm-client iproute2 util-linux)
BINS=(munged mariadbd mysql_install_db slurmctld slurmd slurmdbd sbatch squeue sacct scontrol scancel sacctmgr sinfo srun
      ip nsenter unshare mount)

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo -n"; else
        echo "install_slurm.sh: must run as root (or with passwordless sudo)" >&2; exit 1
    fi
fi

missing_pkgs=()
for p in "${PKGS[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing_pkgs+=("$p")
    fi
done

if [ "${#missing_pkgs[@]}" -gt 0 ]; then
    echo "install_slurm.sh: installing ${missing_pkgs[*]}"
    # Do not let package maintainer scripts try to start services (no systemd,
    # and the fixture runs its own daemons with its own configs).
    policy_created=0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
        $SUDO chmod +x /usr/sbin/policy-rc.d
        policy_created=1
    fi
    trap '[ "$policy_created" = 1 ] && $SUDO rm -f /usr/sbin/policy-rc.d' EXIT
    for attempt in 1 2 3; do
        if $SUDO apt-get update -q </dev/null; then break; fi
        echo "apt-get update failed (attempt $attempt), retrying" >&2; sleep 5
    done
    for attempt in 1 2 3; do
        if $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
            --no-install-recommends \
            -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
            "${missing_pkgs[@]}" </dev/null; then
            break
        fi
        if [ "$attempt" = 3 ]; then echo "apt-get install failed" >&2; exit 1; fi
        echo "apt-get install failed (attempt $attempt), retrying" >&2; sleep 5
    done
else
    echo "install_slurm.sh: all packages already installed"
fi

# Verify the binaries the tests need (some live in /usr/sbin).
export PATH="$PATH:/usr/sbin:/sbin"
fail=0
for b in "${BINS[@]}"; do
    if ! command -v "$b" >/dev/null 2>&1; then
        echo "install_slurm.sh: missing binary after install: $b" >&2; fail=1
    fi
done
[ "$fail" = 0 ] || exit 1
echo "install_slurm.sh: OK (slurm $(dpkg-query -W -f='${Version}' slurmctld), munge $(dpkg-query -W -f='${Version}' munge), mariadb $(dpkg-query -W -f='${Version}' mariadb-server))"
