#!/usr/bin/env bash
# A single-node Slurm cluster on this machine, for tests and for trying hydra/launcher=slurm:
#   scripts/slurm_local.sh up       install slurm-wlm + munge if missing (needs root), start munged,
#                                   slurmctld and slurmd on localhost, wait until the node is idle
#   scripts/slurm_local.sh down     stop them
#   scripts/slurm_local.sh status   sinfo, or exit 1 when the cluster is not up
# State lives in $RINGEXP_SLURM_DIR (default /tmp/ringexp-slurm). Facts behind the settings: ../shared/DESIGN.md.
set -euo pipefail

# The functions up to the guard below are shared with scripts/cluster_local.sh --slurm, which sources
# this file: each takes what it needs as arguments.

install_slurm() {  # install_slurm LOG: slurm-wlm and munge, where missing
  command -v slurmctld >/dev/null && command -v munged >/dev/null && return
  if [ "$(id -u)" != 0 ]; then echo "slurm_local: slurm-wlm and munge are missing and need root to install" >&2; exit 3; fi
  echo "slurm_local: installing slurm-wlm and munge (apt, about 30 s)" >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge) >"$1" 2>&1 \
    || { echo "slurm_local: apt-get install failed, see $1" >&2; exit 3; }
}

start_munge() {  # a key and munged, where missing; prints "started" when it started munged
  mkdir -p /etc/munge /var/log/munge /var/lib/munge /run/munge
  [ -s /etc/munge/munge.key ] || (dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none \
    && chmod 400 /etc/munge/munge.key)
  pgrep -x munged >/dev/null || { munged --force && echo started; }
}

slurm_conf() {  # slurm_conf DIR CTLD_HOST: the settings both clusters share; nodes and partition follow
  mkdir -p "$1/spool/ctld" "$1/log"
  cat <<EOF
ClusterName=ringexp
SlurmctldHost=$2
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$1/spool/ctld
SlurmdSpoolDir=$1/spool/%n
SlurmctldPidFile=$1/slurmctld.pid
SlurmdPidFile=$1/slurmd-%n.pid
SlurmctldLogFile=$1/log/slurmctld.log
SlurmdLogFile=$1/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=300
EOF
}

memory_mb() {  # memory_mb N: a Slurm RealMemory for each of N nodes sharing this machine
  awk -v n="$1" '/MemTotal/ {print int($2 / 1024 * 0.8 / n)}' /proc/meminfo
}

wait_idle() {  # wait_idle N: until N nodes answer (30 s at most)
  for _ in $(seq 1 60); do
    [ "$(sinfo -h -N -o %T 2>/dev/null | grep -cE '^(idle|mixed|allocated)')" -ge "$1" ] && return
    sleep 0.5
  done
  return 1
}

[[ "${BASH_SOURCE[0]}" == "$0" ]] || return 0  # sourced: the functions only

dir="${RINGEXP_SLURM_DIR:-/tmp/ringexp-slurm}"
conf="$dir/slurm.conf"
host="$(hostname -s)"
export SLURM_CONF="$conf"

up() {
  mkdir -p "$dir"
  install_slurm "$dir/apt.log"
  if sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then echo "slurm_local: already up"; return; fi
  if [ -f "${RINGEXP_CLUSTER_DIR:-/tmp/ringexp-cluster}/slurm/slurm.conf" ]; then
    echo "slurm_local: the local cluster's Slurm is up (scripts/cluster_local.sh down first)" >&2; exit 1
  fi
  { slurm_conf "$dir" "$host"
    echo "NodeName=$host CPUs=$(nproc) RealMemory=$(memory_mb 1) State=UNKNOWN"
    echo "PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4"; } >"$conf"
  # sbatch/srun/sinfo find the cluster without SLURM_CONF where no other Slurm is configured
  mkdir -p /etc/slurm
  [ -e /etc/slurm/slurm.conf ] || ln -s "$conf" /etc/slurm/slurm.conf
  start_munge >/dev/null
  pgrep -x slurmctld >/dev/null || slurmctld -f "$conf"
  pgrep -x slurmd >/dev/null || slurmd -f "$conf"
  if wait_idle 1; then
    scontrol update nodename="$host" state=resume >/dev/null 2>&1 || true
    echo "slurm_local: up ($host, partition local, config $conf)"; return
  fi
  echo "slurm_local: the node did not come up; see $dir/log/" >&2
  exit 1
}

down() {
  pkill -x slurmd 2>/dev/null || true
  pkill -x slurmctld 2>/dev/null || true
  echo "slurm_local: down"
}

status() {
  sinfo 2>/dev/null && sinfo -h -o %T | grep -qE '^(idle|mixed|allocated)'
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  *) echo "usage: scripts/slurm_local.sh up|down|status" >&2; exit 2 ;;
esac
