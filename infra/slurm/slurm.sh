#!/usr/bin/env bash
# A real, isolated Slurm cluster on this one machine for development and tests: its own munged,
# one slurmctld and one `slurmd -N nX` per node (n1..nN on distinct ports), fake GPUs.
#
#   infra/slurm/slurm.sh fetch            install Debian's slurm-wlm, slurmrestd and munge if missing (root)
#   infra/slurm/slurm.sh start [--fresh]  write the run directory, start the daemons, wait for idle nodes
#   infra/slurm/slurm.sh stop             stop every daemon by the PID in its pid file
#   infra/slurm/slurm.sh status           say whether it runs (exit 0) or not (exit 3)
#   infra/slurm/slurm.sh env              print `export SLURM_CONF=...` for the client commands
#
# Settings (environment):
#   FLEETLOG_SLURM_DIR            run directory: config, munge key+socket, state, spool, logs (default <repo>/var/slurm)
#   FLEETLOG_SLURM_NODES          number of nodes n1..nN                       (default 4)
#   FLEETLOG_SLURM_CPUS           CPUs declared per node                       (default 8)
#   FLEETLOG_SLURM_MEM_MIB        memory declared per node, MiB                (default 8192)
#   FLEETLOG_SLURM_GPUS           fake GPUs per node (links to /dev/null)      (default 4)
#   FLEETLOG_SLURM_START_TIMEOUT  seconds to wait for the cluster              (default 60)
# Ports are picked free at the first start and kept in the run directory, so two runs in two
# directories never collide.  Debian 22.05 pitfalls handled here: no cgroup.conf (proctrack/linuxproc,
# task/none); GPUs declared with File= (a Count=-only line drains the node); spool directories made
# before slurmd starts; more CPUs than the machine has need SlurmdParameters=config_overrides.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
DIR="${FLEETLOG_SLURM_DIR:-$REPO/var/slurm}"
NODES="${FLEETLOG_SLURM_NODES:-4}"
CPUS="${FLEETLOG_SLURM_CPUS:-8}"
MEM_MIB="${FLEETLOG_SLURM_MEM_MIB:-8192}"
GPUS="${FLEETLOG_SLURM_GPUS:-4}"
START_TIMEOUT="${FLEETLOG_SLURM_START_TIMEOUT:-60}"
CONF="$DIR/slurm.conf"
MUNGE_SOCKET="$DIR/munge/munge.socket"
PACKAGES=(slurm-wlm slurmrestd munge)

say() { echo "slurm.sh: $*" >&2; }
trap 'say "failed at line $LINENO: $BASH_COMMAND"' ERR
die() { say "$*"; exit 1; }

fetch() {
  local missing=() pkg
  for pkg in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  ((${#missing[@]} == 0)) && return 0
  # shellcheck source=../../scripts/bootstrap.sh
  source "$REPO/scripts/bootstrap.sh"
  apt_install "${missing[@]}"
}

# Whether process $1 still runs: one that exited but is not reaped yet (a zombie; here init
# reaps the detached daemons up to 2 s late) holds no port or file any more, and counts as gone.
alive() {
  local state
  state="$(sed -n 's/^.*) \(.\).*$/\1/p' "/proc/$1/stat" 2>/dev/null)" || return 1
  [[ -n "$state" && "$state" != Z ]]
}

# The PID in pid file $1 if that process is alive and its command line holds $2, else nothing.
live_pid() {
  [[ -f "$1" ]] || return 0
  local pid
  pid="$(cat "$1")"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 0
  if kill -0 "$pid" 2>/dev/null && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$2"; then
    echo "$pid"
  fi
}

# Every daemon as "pidfile marker" lines: the marker is what its command line must contain.
daemons() {
  echo "$DIR/run/munged.pid $MUNGE_SOCKET"
  echo "$DIR/run/slurmctld.pid $CONF"
  local i
  for ((i = 1; i <= NODES; i++)); do echo "$DIR/run/slurmd-n$i.pid $CONF"; done
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Ports are chosen once per run directory (the first start) and reused by later starts.
ports() {
  [[ -f "$DIR/ports" ]] && return 0
  local i list=()
  for ((i = 0; i <= NODES; i++)); do list+=("$(free_port)"); done
  echo "${list[*]}" >"$DIR/ports"
}

write_munge() {
  mkdir -p "$DIR/munge" "$DIR/run" "$DIR/log"
  chmod 0700 "$DIR/munge"
  [[ -f "$DIR/munge/munge.key" ]] || mungekey --create --keyfile="$DIR/munge/munge.key" --bits=1024
  chmod 0400 "$DIR/munge/munge.key"
}

write_gres() {
  local i g
  mkdir -p "$DIR/dev"
  : >"$DIR/gres.conf"
  for ((i = 1; i <= NODES; i++)); do
    for ((g = 0; g < GPUS; g++)); do ln -sfn /dev/null "$DIR/dev/n$i-gpu$g"; done
    if ((GPUS > 0)); then
      echo "NodeName=n$i Name=gpu Type=fake File=$DIR/dev/n$i-gpu[0-$((GPUS - 1))]" >>"$DIR/gres.conf"
    fi
  done
}

write_slurm_conf() {
  local host i gres="" port_list
  host="$(hostname -s)"
  read -r -a port_list <"$DIR/ports"
  if ((GPUS > 0)); then gres="Gres=gpu:fake:$GPUS"; fi
  cat >"$CONF" <<EOF
# Written by infra/slurm/slurm.sh: an isolated dev/test cluster on one machine.
ClusterName=fleetlog
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=${port_list[0]}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld-self.pid
SlurmdPidFile=$DIR/run/slurmd-self-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
SlurmdParameters=config_overrides
GresTypes=gpu
DefMemPerCPU=256
ReturnToService=2
MinJobAge=600
KillWait=2
SlurmdTimeout=30
MessageTimeout=10
InactiveLimit=0
PropagateResourceLimits=NONE
EOF
  for ((i = 1; i <= NODES; i++)); do
    # node features for --constraint: odd nodes "ib,fast", even ones "slow" (docs/slurm.md)
    local features="slow"
    if ((i % 2 == 1)); then features="ib,fast"; fi
    echo "NodeName=n$i NodeHostname=$host NodeAddr=127.0.0.1 Port=${port_list[$i]} CPUs=$CPUS" \
      "RealMemory=$MEM_MIB $gres Features=$features State=UNKNOWN" >>"$CONF"
  done
  echo "PartitionName=fleet Nodes=n[1-$NODES] Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO" >>"$CONF"
}

write_dirs() {
  local i
  mkdir -p "$DIR/state" "$DIR/run" "$DIR/log"
  for ((i = 1; i <= NODES; i++)); do mkdir -p "$DIR/spool/n$i"; done
}

# launch PIDFILE LOG CMD...: run CMD in the foreground of its own session, in the background here.
launch() {
  local pid_file="$1" log="$2"
  shift 2
  setsid "$@" </dev/null >>"$log" 2>&1 &
  echo $! >"$pid_file"
}

start_daemons() {
  local i
  launch "$DIR/run/munged.pid" "$DIR/log/munged.out" munged -F --force -S "$MUNGE_SOCKET" \
    --key-file="$DIR/munge/munge.key" --pid-file="$DIR/run/munged-self.pid" \
    --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/munged.seed"
  wait_for "munged" 10 test -S "$MUNGE_SOCKET"
  export SLURM_CONF="$CONF"
  launch "$DIR/run/slurmctld.pid" "$DIR/log/slurmctld.out" slurmctld -D -i -f "$CONF"
  wait_for "slurmctld" "$START_TIMEOUT" scontrol ping
  for ((i = 1; i <= NODES; i++)); do
    launch "$DIR/run/slurmd-n$i.pid" "$DIR/log/slurmd-n$i.out" slurmd -D -N "n$i" -f "$CONF"
  done
  wait_for "$NODES idle nodes" "$START_TIMEOUT" all_idle
}

all_idle() {
  local states
  states="$(sinfo -h -N -o '%N %T' 2>/dev/null | sort -u)"
  [[ "$(grep -c ' idle$' <<<"$states")" -eq "$NODES" ]]
}

# wait_for WHAT SECONDS CMD...: poll CMD until it succeeds; on timeout show the log tails and fail.
wait_for() {
  local what="$1" deadline=$((SECONDS + $2))
  shift 2
  while ((SECONDS < deadline)); do
    "$@" >/dev/null 2>&1 && return 0
    any_daemon_died && break
    sleep 0.2
  done
  log_tails
  die "$what not ready within the timeout (run directory $DIR)"
}

# Whether a daemon launched by this start has exited.  By its PID alone, not by its command line
# as live_pid checks it: just after launch the child may not have exec'd yet (its command line is
# still this script's: under load a poll lands there), and a daemon that is starting is not dead.
any_daemon_died() {
  local pid_file pid
  while read -r pid_file _; do
    [[ -f "$pid_file" ]] || continue
    pid="$(cat "$pid_file")"
    alive "$pid" || { say "$(basename "$pid_file" .pid) exited"; return 0; }
  done < <(daemons)
  return 1
}

log_tails() {
  local f
  for f in "$DIR"/log/*; do
    [[ -s "$f" ]] || continue
    echo "--- $f" >&2
    tail -n 15 "$f" >&2
  done
  sinfo -N -o '%N %T %E' >&2 2>/dev/null || true
}

start() {
  local fresh=0
  [[ "${1:-}" == "--fresh" ]] && fresh=1
  if [[ -n "$(live_pid "$DIR/run/slurmctld.pid" "$CONF")" ]]; then
    ((fresh)) && die "--fresh asked but a cluster already runs from $DIR"
    say "already running"
    echo "SLURM_CONF=$CONF"
    return 0
  fi
  fetch
  if ((fresh)) && [[ -d "$DIR" ]]; then
    # Wipe only a directory this script made (or an empty one), never an arbitrary path.
    [[ -f "$CONF" || -f "$DIR/ports" || -z "$(ls -A "$DIR")" ]] || die "--fresh refuses to wipe $DIR: no slurm.conf written by slurm.sh"
    stop >/dev/null 2>&1
    rm -rf "$DIR"
  fi
  mkdir -p "$DIR"
  stop_all quiet
  ports
  write_munge
  write_dirs
  write_gres
  write_slurm_conf
  start_daemons
  say "started $NODES nodes (run directory $DIR)"
  echo "SLURM_CONF=$CONF"
}

# stop_pids PIDFILE MARKER [PIDFILE MARKER ...]: TERM each, then wait for them all, KILL any that
# lingers; only a process whose command line matches.  Together, not one after another: the waits
# overlap.
stop_pids() {
  local pids=() pid
  while (($# >= 2)); do
    pid="$(live_pid "$1" "$2")"
    rm -f "$1"
    if [[ -n "$pid" ]]; then
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$pid")
    fi
    shift 2
  done
  local deadline=$((SECONDS + 15))
  for pid in "${pids[@]}"; do
    while alive "$pid" && ((SECONDS < deadline)); do sleep 0.1; done
    alive "$pid" && kill -KILL "$pid" 2>/dev/null || true
  done
  echo "${pids[*]}"
}

# Cancel every job of this cluster and wait for them to end: slurmstepd outlives slurmd otherwise.
cancel_jobs() {
  [[ -n "$(live_pid "$DIR/run/slurmctld.pid" "$CONF")" ]] || return 0
  export SLURM_CONF="$CONF"
  scancel --partition=fleet >/dev/null 2>&1 || return 0
  local deadline=$((SECONDS + 15))
  while [[ -n "$(squeue -h -t PD,R,CG,S -o %i 2>/dev/null)" ]] && ((SECONDS < deadline)); do sleep 0.2; done
}

stop_all() {
  local stopped=() slurmds=() i
  cancel_jobs
  # the slurmds first, all at once (they drain their steps), then the controller, then munge.
  for ((i = NODES; i >= 1; i--)); do slurmds+=("$DIR/run/slurmd-n$i.pid" "$CONF"); done
  stopped+=("$(stop_pids "${slurmds[@]}")")
  stopped+=("$(stop_pids "$DIR/run/slurmctld.pid" "$CONF")")
  stopped+=("$(stop_pids "$DIR/run/munged.pid" "$MUNGE_SOCKET")")
  [[ "${1:-}" == quiet ]] || say "stopped (pids: ${stopped[*]:-none})"
}

stop() { [[ -d "$DIR" ]] && stop_all || say "not running"; }

status() {
  if [[ -n "$(live_pid "$DIR/run/slurmctld.pid" "$CONF")" ]]; then
    echo "running dir=$DIR SLURM_CONF=$CONF"
    SLURM_CONF="$CONF" sinfo -N -o '%N %T %G' || true
  else
    echo "stopped dir=$DIR"
    return 3
  fi
}

case "${1:-}" in
  fetch) fetch ;;
  start) shift; start "$@" ;;
  stop) stop ;;
  status) status || exit "$?" ;;
  env) echo "export SLURM_CONF=$CONF" ;;
  *) echo "usage: $0 fetch|start [--fresh]|stop|status|env" >&2; exit 2 ;;
esac
