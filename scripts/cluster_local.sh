#!/usr/bin/env bash
# A cluster of N nodes on this machine: each node a network namespace joined to a bridge by a veth pair, each
# node's link shaped to RATE in both directions (tbf), ranks on one node talking over that namespace's own
# loopback, unshaped (the fast intra-node level). Needs root, ip and tc.
#   scripts/cluster_local.sh up [--nodes N] [--rate RATE] [--slurm]
#                                                            N from 2 to 8 (2); RATE a tc rate (1gbit, 250mbit)
#                                                            or none (1gbit); --slurm: also a Slurm across the
#                                                            nodes (partition "cluster"; for sbatch, srun and
#                                                            hydra, eval "$(scripts/cluster_local.sh env)")
#   scripts/cluster_local.sh status                          nodes, addresses, shaping; exit 1 when not up
#   scripts/cluster_local.sh down                            removes what up made, and nothing else
#   scripts/cluster_local.sh env                             the exports a shell needs to use the cluster
#                                                            (RINGEXP_CLUSTER_DIR, SLURM_CONF of up --slurm's
#                                                            Slurm): eval "$(scripts/cluster_local.sh env)"
#   scripts/cluster_local.sh run NODE -- CMD...              CMD inside node NODE (0..N-1), with
#                                                            GLOO_SOCKET_IFNAME, RINGEXP_CLUSTER_NODE and
#                                                            RINGEXP_CLUSTER_LINK (the rate) set
#   scripts/cluster_local.sh torchrun [--nproc-per-node K] -- ARGS...
#                                                            torchrun --nnodes=N ... ARGS on every node at once
#                                                            (e.g. -- -m ringexp.train +parallel=hierarchical);
#                                                            exit code: the first node's that failed
# Addresses come from 198.18.0.0/24 (RFC 2544's benchmarking block) only: the bridge is 198.18.0.1, node i is
# 198.18.0.(10+i), named ringexp-node<i> in /etc/hosts (lines marked "# ringexp-cluster"). State lives in
# $RINGEXP_CLUSTER_DIR (default: ringexp-cluster in ${TMPDIR:-/tmp}; give env, status and down the same one as up,
# and note that sudo passes neither variable on). Why each setting: docs/cluster.md ("Facts behind the settings").
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/slurm_local.sh
source "$here/slurm_local.sh"  # installing Slurm and munge, and the settings both Slurm clusters share
# the one place the default is written: every other caller asks `env` (a shell, tests, slurm_local.sh)
dir="${RINGEXP_CLUSTER_DIR:-${TMPDIR:-/tmp}/ringexp-cluster}"
bridge=rxbr0
mark="# ringexp-cluster"

fail() { echo "cluster_local: $1" >&2; exit "${2:-1}"; }

need() {
  [ "$(id -u)" = 0 ] || fail "needs root (network namespaces, a bridge and tc)" 3
  for tool in ip tc nsenter; do command -v "$tool" >/dev/null || fail "needs '$tool' (apt-get install iproute2)" 3; done
}

ns() { echo "ringexp-node$1"; }
addr() { echo "198.18.0.$((10 + $1))"; }

burst() {  # burst RATE: tbf's bucket in bytes for a tc rate (1gbit, 250mbit, 12.5mbps): 1 ms of link, >= 4096
  # tbf saves tokens while the link idles (the ranks compute) and then lets that many bytes out at once, which a real
  # link cannot: a fixed 512 KB was 42 ms of free link at 100 Mbit/s. The bucket must still (a) hold one full frame
  # (1514 bytes; a smaller one drops every full-size packet; GSO packets larger than it tbf segments in software,
  # rate intact) and (b) cover the tbf watchdog's wake-up delay, else tokens spill and the link runs below RATE.
  # Measured here (TCP stream, 2 cores busy): at 1 Gbit/s 4/32/128 KB carried 912/944/956 Mbit/s (512 KB: 963, its
  # burst included); at 100 Mbit/s 1514 B/4 KB/12 KB carried 92/96/96 (96 is the rate less TCP/IP headers). So:
  # 1 ms of the rate (rate/HZ at HZ=1000), never under 4 KB (a few frames). docs/cluster.md, "The link".
  awk -v r="$1" 'BEGIN {
    match(r, /^[0-9.]+/); n = substr(r, 1, RLENGTH) + 0; u = substr(r, RLENGTH + 1)
    m = (u ~ /^k/) ? 1e3 : (u ~ /^m/) ? 1e6 : (u ~ /^g/) ? 1e9 : 1
    b = int(n * m / (u ~ /bit$/ ? 8 : 1) / 1000)
    print (b < 4096 ? 4096 : b) }'
}

shape() {  # shape DEV RATE [NETNS]: tbf on DEV's egress (none: no qdisc)
  local dev="$1" rate="$2" in=()
  [ -n "${3:-}" ] && in=(ip netns exec "$3")
  [ "$rate" = none ] && return
  "${in[@]}" tc qdisc replace dev "$dev" root tbf rate "$rate" burst "$(burst "$rate")" latency 100ms
}

up() {
  local nodes=2 rate=1gbit slurm=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --nodes) nodes="${2:-}"; shift $(($# > 1 ? 2 : 1)) ;;
      --rate) rate="${2:-}"; shift $(($# > 1 ? 2 : 1)) ;;
      --slurm) slurm=slurm; shift ;;
      *) fail "unknown option $1 (up [--nodes N] [--rate RATE] [--slurm])" 2 ;;
    esac
  done
  [[ "$nodes" =~ ^[2-8]$ ]] || fail "--nodes $nodes: give 2 to 8" 2
  # a rate of 0 (a link that carries nothing) once passed here, on to `down` and tc after the namespaces were made
  [[ "$rate" =~ ^(none|[0-9]+(\.[0-9]+)?[kmg]?(bit|bps))$ ]] && ! [[ "$rate" =~ ^[0.]+[kmg]?(bit|bps)$ ]] ||
    fail "--rate $rate: give a tc rate above 0 such as 1gbit or 250mbit, or none" 2
  need
  if [ -f "$dir/nodes" ] && [ "$(cat "$dir/nodes")" = "$nodes $rate $slurm" ] && status >/dev/null 2>&1; then
    echo "cluster_local: already up ($nodes nodes, $rate${slurm:+, Slurm})"; return
  fi
  down >/dev/null
  mkdir -p "$dir"
  ip link add "$bridge" type bridge
  ip addr add 198.18.0.1/24 dev "$bridge"
  ip link set "$bridge" up
  for i in $(seq 0 $((nodes - 1))); do
    ip netns add "$(ns "$i")"
    ip link add "rxv$i" type veth peer name "rxp$i"
    ip link set "rxp$i" netns "$(ns "$i")"
    ip link set "rxv$i" master "$bridge" up
    ip netns exec "$(ns "$i")" ip link set lo up
    ip netns exec "$(ns "$i")" ip link set "rxp$i" name eth0
    ip netns exec "$(ns "$i")" ip addr add "$(addr "$i")/24" dev eth0
    ip netns exec "$(ns "$i")" ip link set eth0 up
    shape eth0 "$rate" "$(ns "$i")"  # what the node sends
    shape "rxv$i" "$rate"              # what it receives
    echo "$(addr "$i") $(ns "$i") $mark" >>/etc/hosts
  done
  echo "$nodes $rate $slurm" >"$dir/nodes"
  [ -z "$slurm" ] || slurm_up "$nodes" "$rate"
  echo "cluster_local: up ($nodes nodes at $rate per node link: $(for i in $(seq 0 $((nodes - 1))); do printf '%s=%s ' "$(ns "$i")" "$(addr "$i")"; done))"
  [ -z "$slurm" ] || echo "cluster_local: Slurm partition cluster; eval \"\$($0 env)\" exports SLURM_CONF=$dir/slurm/slurm.conf"
}

exports() {  # env: what a shell needs to reach this cluster, as lines for eval (quoted: a path may hold spaces)
  local abs
  abs="$(realpath -m -- "$dir")"  # absolute: the shell that evals it may be elsewhere
  printf 'export RINGEXP_CLUSTER_DIR=%q\n' "$abs"
  printf 'export SLURM_CONF=%q\n' "$abs/slurm/slurm.conf"  # where up --slurm writes its config
}

slurm_up() {  # slurmctld in the root namespace on the bridge address, one slurmd inside each node
  local nodes="$1" rate="$2" s="$dir/slurm" names
  "$here/slurm_local.sh" down >/dev/null  # one slurmctld per machine: the single-node one goes
  mkdir -p "$s"
  install_slurm "$s/apt.log"
  [ "$(start_munge)" = started ] && touch "$s/munged-started"
  names="$(ns 0)"
  [ "$nodes" -gt 1 ] && names="ringexp-node[0-$((nodes - 1))]"
  # Every task of every job learns its node's interface for gloo (the namespaces share one host name) and the
  # link it is on, as a site's TaskProlog would set them on a real cluster.
  # shellcheck disable=SC2016  # the prolog's own $... are written as they are, for the prolog to expand
  { printf '#!/bin/sh\necho export GLOO_SOCKET_IFNAME=eth0\necho export RINGEXP_CLUSTER_LINK=%s\n' "$rate"
    echo 'echo export RINGEXP_CLUSTER_NODE=${SLURMD_NODENAME#ringexp-node}'
    # every node is this one machine: a thread each for the step's tasks on all nodes (as torchrun_all below). A
    # job's srun inherits what this prolog set for its batch step (one task: every core), so a value this prolog
    # set is set again for each step; a user's own OMP_NUM_THREADS is kept. (Two threads per rank over the story's
    # four ranks made a local step of the CNN 5x slower; DDP, waiting on the link, hid it.)
    echo 'n=$(( $(getconf _NPROCESSORS_ONLN) / ${SLURM_STEP_NUM_TASKS:-1} )); n=$(( n > 1 ? n : 1 ))'
    echo 'if [ -z "$OMP_NUM_THREADS" ] || [ "$OMP_NUM_THREADS" = "$RINGEXP_PROLOG_THREADS" ]; then'
    echo '  echo export OMP_NUM_THREADS=$n; echo export RINGEXP_PROLOG_THREADS=$n; fi'; } >"$s/task_prolog.sh"
  chmod +x "$s/task_prolog.sh"
  { slurm_conf "$s" "$(hostname -s)(198.18.0.1)"
    echo "TaskProlog=$s/task_prolog.sh"
    for i in $(seq 0 $((nodes - 1))); do
      mkdir -p "$s/spool/$(ns "$i")"
      echo "NodeName=$(ns "$i") NodeAddr=$(addr "$i") CPUs=$(nproc) RealMemory=$(memory_mb "$nodes") State=UNKNOWN"
    done
    echo "PartitionName=cluster Nodes=$names Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4"; } >"$s/slurm.conf"
  export SLURM_CONF="$s/slurm.conf"
  start_accounting "$s" || fail "no Slurm accounting; see $s/log/" 1
  slurmctld -f "$SLURM_CONF"
  for i in $(seq 0 $((nodes - 1))); do
    # nsenter, not `ip netns exec`: that remounts /sys, and slurmd then finds no cgroup mount
    nsenter --net="/var/run/netns/$(ns "$i")" slurmd -f "$SLURM_CONF" -N "$(ns "$i")"
  done
  wait_idle "$nodes" || fail "Slurm's nodes did not come up; see $s/log/" 1
}

down() {
  need
  local s="$dir/slurm" pids="" alive
  [ -f "$s/slurmctld.pid" ] && pids="$(cat "$s/slurmctld.pid")"
  [ -d "$s" ] && pids="$pids $(accounting_pids "$s" | tr '\n' ' ')"
  [ -f "$s/munged-started" ] && pids="$pids $(cat /run/munge/munged.pid 2>/dev/null || true)"
  for n in $(ip netns list 2>/dev/null | awk '/^ringexp-node[0-9]/ {print $1}'); do
    pids="$pids $(ip netns pids "$n" 2>/dev/null | tr '\n' ' ')"  # slurmd, jobs, anything started there
  done
  # shellcheck disable=SC2086
  kill -9 $pids 2>/dev/null || true
  for _ in $(seq 1 50); do  # gone, not just signalled: `down` then `up` must find the ports free
    alive=""
    for p in $pids; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ -z "$alive" ] && break
    sleep 0.1
  done
  for n in $(ip netns list 2>/dev/null | awk '/^ringexp-node[0-9]/ {print $1}'); do ip netns del "$n"; done
  for v in $(ip -o link show 2>/dev/null | awk -F': ' '$2 ~ /^rxv[0-9]/ {sub(/@.*/, "", $2); print $2}'); do
    ip link del "$v" 2>/dev/null || true
  done
  ip link show "$bridge" >/dev/null 2>&1 && ip link del "$bridge"
  if grep -q "$mark" /etc/hosts; then  # /etc/hosts may be a bind mount: rewrite it in place
    grep -v "$mark" /etc/hosts >"$dir.hosts" || true
    cat "$dir.hosts" >/etc/hosts
    rm -f "$dir.hosts"
  fi
  rm -rf "$dir"
  echo "cluster_local: down"
}

status() {
  [ -f "$dir/nodes" ] || { echo "cluster_local: not up" >&2; return 1; }
  read -r nodes rate slurm <"$dir/nodes"
  echo "cluster: $nodes nodes, $rate per node link (both directions), bridge $bridge 198.18.0.1"
  for i in $(seq 0 $((nodes - 1))); do
    ip netns exec "$(ns "$i")" true 2>/dev/null || { echo "cluster_local: $(ns "$i") is missing" >&2; return 1; }
    printf '  %s  %s  %s\n' "$(ns "$i")" "$(addr "$i")" \
      "$(ip netns exec "$(ns "$i")" tc qdisc show dev eth0 | awk '/tbf/ {print "tbf rate " $8; f=1} END {if (!f) print "unshaped"}')"
  done
  [ -z "$slurm" ] || SLURM_CONF="$dir/slurm/slurm.conf" sinfo -h -N -o "  %N %T (Slurm, partition %P, %c CPUs)" || { echo "cluster_local: Slurm does not answer" >&2; return 1; }
}

run() {  # run NODE -- CMD...
  local node="$1"; shift
  [ "${1:-}" = "--" ] && shift
  [ -f "$dir/nodes" ] || fail "not up (scripts/cluster_local.sh up)" 1
  read -r nodes rate _ <"$dir/nodes"
  { [[ "$node" =~ ^[0-9]+$ ]] && [ "$node" -lt "$nodes" ]; } || fail "node $node: give 0..$((nodes - 1))" 2
  # nsenter, not `ip netns exec`: that remounts /sys, which Slurm's daemons then cannot use
  exec nsenter --net="/var/run/netns/$(ns "$node")" env GLOO_SOCKET_IFNAME=eth0 RINGEXP_CLUSTER_NODE="$node" \
    RINGEXP_CLUSTER_LINK="$rate" "$@"
}

rendezvous_port() {  # a port for torchrun's rendezvous on node 0 that no socket there uses
  # Not 29500 + a random 1000, as this once took: the Slurm jobs on these same nodes listen on a port submitit
  # derives from the job id, anywhere in 20000-60000 (job 4's is 30486), and connections take the kernel's
  # 32768-60999. A port in use makes node 0's agent fail at once (EADDRINUSE) while node 1's connects to whatever
  # listens there and waits for it for torchrun's 600 s. So: 10000-19999, which neither uses, and none that node 0
  # holds in any state. docs/cluster.md, "The rendezvous".
  local p
  for _ in $(seq 1 100); do
    p=$((10000 + RANDOM % 10000))
    if [ -z "$(nsenter --net="/var/run/netns/$(ns 0)" ss -Htan "( sport = :$p )")" ]; then echo "$p"; return; fi
  done
  fail "no free port for the rendezvous on $(ns 0)" 1
}

stop_nodes() {  # stop_nodes CODE: SIGTERM to torchrun_all's torchruns, and exit CODE once they are gone
  kill -TERM "${pids[@]}" 2>/dev/null || true
  wait || true
  exit "$1"
}

torchrun_all() {  # torchrun [--nproc-per-node K] -- ARGS...
  local nproc=2 port pids=() rc=0 rdzv_timeout=120
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    case "$1" in
      --nproc-per-node) nproc="$2"; shift 2 ;;
      *) fail "unknown option $1 (torchrun [--nproc-per-node K] -- ARGS)" 2 ;;
    esac
  done
  [ "${1:-}" = "--" ] && shift
  [ -f "$dir/nodes" ] || fail "not up (scripts/cluster_local.sh up)" 1
  read -r nodes _ _ <"$dir/nodes"
  port="$(rendezvous_port)"
  # every node of this cluster runs on this one machine's cores: a thread each for all nodes' ranks, not the
  # cores / ranks per node a real node would give (4 x 1 ranks with 2 threads each on 2 cores collapsed)
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(( $(nproc) / (nodes * nproc) > 1 ? $(nproc) / (nodes * nproc) : 1 ))}"
  # stopped itself (SIGTERM, SIGHUP: `timeout`, a caller's time limit), it stops every node's torchrun, which stops
  # its workers, rather than leave them running on without it
  trap 'stop_nodes 143' TERM
  trap 'stop_nodes 129' HUP
  for i in $(seq 0 $((nodes - 1))); do
    # rdzv timeout: how long an agent waits for the others to join (torchrun's static rendezvous: 600 s). Every
    # node starts here at once, so one that has not joined within it never will (its agent failed, e.g. node 0's
    # could not listen): the others then fail saying so, instead of waiting for it for 10 minutes.
    "$0" run "$i" -- torchrun --nnodes="$nodes" --node-rank="$i" --nproc-per-node="$nproc" \
      --master-addr="$(addr 0)" --master-port="$port" --rdzv-conf="timeout=$rdzv_timeout" "$@" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || { r=$?; [ "$rc" = 0 ] && rc=$r; }; done
  return "$rc"
}

cmd="${1:-}"
[ $# -gt 0 ] && shift
case "$cmd" in
  up) up "$@" ;;
  down) down ;;
  status) status ;;
  env) exports ;;
  run) [ $# -ge 1 ] || fail "usage: run NODE -- CMD..." 2; run "$@" ;;
  torchrun) torchrun_all "$@" ;;
  *) echo "usage: scripts/cluster_local.sh up [--nodes N] [--rate RATE] [--slurm] | status | down | env | run NODE -- CMD | torchrun [--nproc-per-node K] -- ARGS" >&2; exit 2 ;;
esac
