#!/usr/bin/env bash
# A single-node Slurm cluster on this machine, for tests and for trying hydra/launcher=slurm:
#   scripts/slurm_local.sh up       install slurm-wlm + munge if missing (needs root), start munged,
#                                   slurmctld and slurmd on localhost, wait until the node is idle
#   scripts/slurm_local.sh down     stop them
#   scripts/slurm_local.sh status   sinfo, or exit 1 when the cluster is not up
#   scripts/slurm_local.sh env      the exports a shell needs to use it: eval "$(scripts/slurm_local.sh env)"
# State lives in $RINGEXP_SLURM_DIR (default: ringexp-slurm in ${TMPDIR:-/tmp}; give env, status and down the
# same one as up). Why each setting: docs/cluster.md ("Facts behind the settings").
set -euo pipefail

# The functions up to the guard below are shared with scripts/cluster_local.sh --slurm, which sources
# this file: each takes what it needs as arguments.

install_slurm() {  # install_slurm LOG: slurm-wlm, munge, and slurmdbd with MariaDB (accounting), where missing
  local tool
  for tool in slurmctld munged slurmdbd mariadbd; do command -v "$tool" >/dev/null || break; done
  command -v "$tool" >/dev/null && return
  if [ "$(id -u)" != 0 ]; then echo "slurm_local: Slurm's packages are missing and need root to install" >&2; exit 3; fi
  echo "slurm_local: installing slurm-wlm, slurmdbd, mariadb-server and munge (apt, about 1 min)" >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm slurmdbd mariadb-server munge) \
    >"$1" 2>&1 || { echo "slurm_local: apt-get install failed, see $1" >&2; exit 3; }
}

start_munge() {  # a key and munged, where missing; prints "started" when it started munged
  mkdir -p /etc/munge /var/log/munge /var/lib/munge /run/munge
  [ -s /etc/munge/munge.key ] || (dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none \
    && chmod 400 /etc/munge/munge.key)
  pgrep -x munged >/dev/null || { munged --force && echo started; }
}

start_accounting() {  # start_accounting DIR: MariaDB and slurmdbd on loopback, for the cluster whose slurm.conf is in DIR
  # Why: sacct is how submitit learns that a job ended when one of its tasks left no result (killed, OOM, its
  # node lost); without accounting it waits for ever. The database is this cluster's own, in DIR/db, reached
  # on 127.0.0.1 only and without grant tables (nothing else can connect to it).
  local d="$1" port=3316
  mkdir -p "$d/log"
  [ -d "$d/db/mysql" ] || mariadb-install-db --user=root --datadir="$d/db" --skip-test-db >"$d/log/mariadb-install.log" 2>&1
  if ! { [ -f "$d/mariadb.pid" ] && kill -0 "$(cat "$d/mariadb.pid")" 2>/dev/null; }; then
    setsid mariadbd --user=root --datadir="$d/db" --bind-address=127.0.0.1 --port="$port" --socket="$d/mariadb.sock" \
      --pid-file="$d/mariadb.pid" --skip-grant-tables --innodb-buffer-pool-size=32M --log-error="$d/log/mariadb.log" \
      </dev/null >/dev/null 2>&1 &
  fi
  printf '%s\n' DbdHost=localhost SlurmUser=root AuthType=auth/munge StorageType=accounting_storage/mysql \
    StorageHost=127.0.0.1 "StoragePort=$port" StorageUser=root StorageLoc=ringexp_acct "PidFile=$d/slurmdbd.pid" \
    "LogFile=$d/log/slurmdbd.log" >"$d/slurmdbd.conf"
  chmod 600 "$d/slurmdbd.conf"  # slurmdbd refuses a config others can read
  for _ in $(seq 1 60); do mariadb-admin -h 127.0.0.1 -P "$port" ping >/dev/null 2>&1 && break; sleep 0.5; done
  running "$d/slurmdbd.pid" || SLURM_CONF="$d/slurm.conf" slurmdbd  # reads slurmdbd.conf beside SLURM_CONF
  for _ in $(seq 1 60); do (echo >/dev/tcp/127.0.0.1/6819) 2>/dev/null && return; sleep 0.5; done
  echo "slurm_local: slurmdbd did not start; see $d/log/" >&2
  return 1
}

running() {  # running PIDFILE: the daemon that wrote it is alive
  [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null
}

accounting_pids() {  # accounting_pids DIR: the pids of start_accounting's daemons for DIR
  cat "$1/slurmdbd.pid" "$1/mariadb.pid" 2>/dev/null || true
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
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
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

# the one place the default is written: every other caller asks `env` (tests, scripts/fault_trials.py's tests)
dir="${RINGEXP_SLURM_DIR:-${TMPDIR:-/tmp}/ringexp-slurm}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
conf="$dir/slurm.conf"
host="$(hostname -s)"
export SLURM_CONF="$conf"

up() {
  mkdir -p "$dir"
  install_slurm "$dir/apt.log"
  # First: the cluster's slurmctld answers on every address, so sinfo below would take it for this one's.
  # (In a subshell: the cluster's SLURM_CONF must not replace this one's.)
  if (eval "$("$here/cluster_local.sh" env)" && [ -f "$SLURM_CONF" ]); then
    echo "slurm_local: the local cluster's Slurm is up (scripts/cluster_local.sh down first)" >&2; exit 1
  fi
  if sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then echo "slurm_local: already up"; return; fi
  { slurm_conf "$dir" "$host"
    echo "NodeName=$host CPUs=$(nproc) RealMemory=$(memory_mb 1) State=UNKNOWN"
    echo "PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4"; } >"$conf"
  # sbatch/srun/sinfo find the cluster without SLURM_CONF where no other Slurm is configured
  mkdir -p /etc/slurm
  [ -e /etc/slurm/slurm.conf ] || ln -s "$conf" /etc/slurm/slurm.conf
  [ "$(start_munge)" = started ] && touch "$dir/munged-started"  # then down stops it too
  start_accounting "$dir" || exit 1
  running "$dir/slurmctld.pid" || slurmctld -f "$conf"
  running "$dir/slurmd-$host.pid" || slurmd -f "$conf"
  if wait_idle 1; then
    scontrol update nodename="$host" state=resume >/dev/null 2>&1 || true
    echo "slurm_local: up ($host, partition local, config $conf)"; return
  fi
  echo "slurm_local: the node did not come up; see $dir/log/" >&2
  exit 1
}

down() {  # the daemons this script started, by the pids they wrote into $dir (never others by name)
  local pids alive
  if running "$dir/slurmctld.pid"; then  # this cluster's jobs first: their steps outlive a stopped slurmd
    scancel --full --user "$(id -un)" 2>/dev/null || true
    for _ in $(seq 1 50); do [ -z "$(squeue -h 2>/dev/null)" ] && break; sleep 0.2; done
  fi
  pids="$(cat "$dir/slurmctld.pid" "$dir"/slurmd-*.pid 2>/dev/null | tr '\n' ' ') $(accounting_pids "$dir" | tr '\n' ' ')"
  [ -f "$dir/munged-started" ] && pids="$pids $(cat /run/munge/munged.pid 2>/dev/null || true)" \
    && rm -f "$dir/munged-started"
  # shellcheck disable=SC2086
  [ -z "${pids// }" ] || kill $pids 2>/dev/null || true
  for _ in $(seq 1 100); do  # gone, not just signalled: the next up needs the ports
    alive=""
    for p in $pids; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ -z "$alive" ] && break
    sleep 0.1
  done
  echo "slurm_local: down"
}

status() {
  sinfo 2>/dev/null && sinfo -h -o %T | grep -qE '^(idle|mixed|allocated)'
}

exports() {  # env: lines for eval (quoted: a path may hold spaces; absolute: the shell may be elsewhere)
  local abs
  abs="$(realpath -m -- "$dir")"
  printf 'export RINGEXP_SLURM_DIR=%q\n' "$abs"
  printf 'export SLURM_CONF=%q\n' "$abs/slurm.conf"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  env) exports ;;
  *) echo "usage: scripts/slurm_local.sh up|down|status|env" >&2; exit 2 ;;
esac
