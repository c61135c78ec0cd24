#!/usr/bin/env bash
# A single-node Slurm cluster on this machine, for tests and for trying hydra/launcher=slurm:
#   scripts/slurm_local.sh up       install slurm-wlm + munge if missing (needs root), start munged,
#                                   slurmctld and slurmd on localhost, wait until the node is idle
#   scripts/slurm_local.sh down     stop them
#   scripts/slurm_local.sh status   sinfo, or exit 1 when the cluster is not up
# State lives in $RINGEXP_SLURM_DIR (default /tmp/ringexp-slurm). Facts behind the settings: ../shared/DESIGN.md.
set -euo pipefail
dir="${RINGEXP_SLURM_DIR:-/tmp/ringexp-slurm}"
conf="$dir/slurm.conf"
host="$(hostname -s)"
export SLURM_CONF="$conf"

install() {
  command -v slurmctld >/dev/null && command -v munged >/dev/null && return
  if [ "$(id -u)" != 0 ]; then echo "slurm_local: slurm-wlm and munge are missing and need root to install" >&2; exit 3; fi
  echo "slurm_local: installing slurm-wlm and munge (apt, about 30 s)" >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge) >"$dir/apt.log" 2>&1 \
    || { echo "slurm_local: apt-get install failed, see $dir/apt.log" >&2; exit 3; }
}

write_conf() {
  local cpus mem
  cpus="$(nproc)"
  mem="$(awk '/MemTotal/ {print int($2 / 1024 * 0.8)}' /proc/meminfo)"
  mkdir -p "$dir/spool/ctld" "$dir/spool/d" "$dir/log"
  cat >"$conf" <<EOF
ClusterName=ringexp
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$dir/spool/ctld
SlurmdSpoolDir=$dir/spool/d
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
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
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
}

up() {
  mkdir -p "$dir"
  install
  if sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then echo "slurm_local: already up"; return; fi
  write_conf
  # sbatch/srun/sinfo find the cluster without SLURM_CONF where no other Slurm is configured
  mkdir -p /etc/slurm
  [ -e /etc/slurm/slurm.conf ] || ln -s "$conf" /etc/slurm/slurm.conf
  mkdir -p /etc/munge /var/log/munge /var/lib/munge /run/munge
  [ -s /etc/munge/munge.key ] || (dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none \
    && chmod 400 /etc/munge/munge.key)
  pgrep -x munged >/dev/null || munged --force
  pgrep -x slurmctld >/dev/null || slurmctld -f "$conf"
  pgrep -x slurmd >/dev/null || slurmd -f "$conf"
  for _ in $(seq 1 60); do
    if sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
      scontrol update nodename="$host" state=resume >/dev/null 2>&1 || true
      echo "slurm_local: up ($host, partition local, config $conf)"; return
    fi
    sleep 0.5
  done
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
