#!/usr/bin/env bash
# dev-cluster.sh - run a small, real Slurm cluster on this machine for jobctl's tests.
#
#   scripts/dev-cluster.sh up       install packages if missing, start everything, wait until ready;
#                                   the LAST line on stdout is `export SLURM_CONF=...` (eval-able)
#   scripts/dev-cluster.sh down     cancel all jobs, stop the daemons named by the pid files
#   scripts/dev-cluster.sh status   say which daemons run (+ sinfo); exit 0 only if all are up
#
# Cluster "jobctl-dev": munged + MariaDB + slurmdbd + slurmctld + two slurmd (node1, node2),
# each node advertising CPUs=16 RealMemory=64000 Gres=gpu:h100:8 (fake GPUs: character
# devices made with mknod), one partition "gpu". Needs root and Debian 12 (apt-get).
#
# Everything (config, state, logs, pids, sockets, DB) lives under ONE directory:
#   JOBCTL_DEV_CLUSTER_DIR        (default /tmp/jobctl-dev-cluster)
# Ports (all bound to / used on 127.0.0.1):
#   JOBCTL_DEV_MYSQL_PORT         (default 13306)  MariaDB
#   JOBCTL_DEV_SLURMDBD_PORT      (default 16819)  slurmdbd
#   JOBCTL_DEV_SLURMCTLD_PORT     (default 16817)  slurmctld
#   JOBCTL_DEV_SLURMD_PORT_BASE   (default 17001)  slurmd of node1; node2 uses base+1
# Timeouts:
#   JOBCTL_DEV_TIMEOUT            (default 60)  seconds to wait for each daemon to be ready
#
# Facts this follows: shared/design/real-components.md.
set -euo pipefail

DIR="${JOBCTL_DEV_CLUSTER_DIR:-/tmp/jobctl-dev-cluster}"
[[ $DIR == /* ]] || DIR="$PWD/$DIR"
DIR="${DIR%/}"
MYSQL_PORT="${JOBCTL_DEV_MYSQL_PORT:-13306}"
DBD_PORT="${JOBCTL_DEV_SLURMDBD_PORT:-16819}"
CTLD_PORT="${JOBCTL_DEV_SLURMCTLD_PORT:-16817}"
SLURMD_PORT_BASE="${JOBCTL_DEV_SLURMD_PORT_BASE:-17001}"
TIMEOUT="${JOBCTL_DEV_TIMEOUT:-60}"

CLUSTER_NAME=jobctl-dev
NODES=(node1 node2)
NGPUS=8
PACKAGES=(munge slurmctld slurmd slurm-client slurmdbd mariadb-server)

ETC="$DIR/etc"
LOGDIR="$DIR/log"
RUNDIR="$DIR/run"
STATEDIR="$DIR/state"
DEVDIR="$DIR/dev"
MUNGE_DIR="$DIR/munge"          # owned by munge: key, socket, pid, log, seed
MYSQL_DIR="$DIR/mysql"          # owned by mysql: datadir, socket, pid, log

SLURM_CONF_FILE="$ETC/slurm.conf"
DBD_CONF="$ETC/slurmdbd.conf"
GRES_CONF="$ETC/gres.conf"
MY_CNF="$ETC/my.cnf"
DB_PASSWORD_FILE="$ETC/db-password"

MUNGE_KEY="$MUNGE_DIR/munge.key"
MUNGE_SOCK="$MUNGE_DIR/munged.sock"
MUNGE_PID="$MUNGE_DIR/munged.pid"
MUNGE_LOG="$MUNGE_DIR/munged.log"
MUNGE_SEED="$MUNGE_DIR/munged.seed"

MYSQL_DATA="$MYSQL_DIR/data"
MYSQL_SOCK="$MYSQL_DIR/mariadbd.sock"
MYSQL_PID="$MYSQL_DIR/mariadbd.pid"
MYSQL_LOG="$MYSQL_DIR/mariadbd.err"

DBD_PID="$RUNDIR/slurmdbd.pid"
DBD_LOG="$LOGDIR/slurmdbd.log"
CTLD_PID="$RUNDIR/slurmctld.pid"
CTLD_LOG="$LOGDIR/slurmctld.log"
slurmd_pid() { echo "$RUNDIR/slurmd-$1.pid"; }
slurmd_log() { echo "$LOGDIR/slurmd-$1.log"; }

export SLURM_CONF="$SLURM_CONF_FILE"

# ---------------------------------------------------------------------------- helpers

log() { printf '[dev-cluster] %s\n' "$*" >&2; }

tail_log() {
  local f
  for f in "$@"; do
    if [[ -s $f ]]; then
      printf '[dev-cluster] ---- last lines of %s ----\n' "$f" >&2
      tail -n 25 "$f" >&2 || true
    fi
  done
}

die() { log "ERROR: $*"; exit 1; }

# read_pid PIDFILE -> prints the pid (digits only) or nothing
read_pid() {
  local p=""
  [[ -r $1 ]] && p="$(tr -dc '0-9' <"$1" 2>/dev/null || true)"
  printf '%s' "$p"
}

# proc_alive PID COMM: PID exists, is not a zombie, and its comm is COMM
proc_alive() {
  local pid=$1 comm=$2 c state
  [[ -n $pid && -r /proc/$pid/comm ]] || return 1
  c="$(cat "/proc/$pid/comm" 2>/dev/null || true)"
  [[ $c == "$comm" ]] || return 1
  state="$(awk '/^State:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)"
  [[ -n $state && $state != Z && $state != X ]]
}

# daemon_alive PIDFILE COMM
daemon_alive() { proc_alive "$(read_pid "$1")" "$2"; }

# wait_ready WHAT PIDFILE COMM TIMEOUT CHECK_FUNCTION [LOGFILE...]
# Polls CHECK_FUNCTION until it succeeds; fails early if the daemon has died.
wait_ready() {
  local what=$1 pidfile=$2 comm=$3 timeout=$4 check=$5
  shift 5
  local start=$SECONDS
  while true; do
    if "$check" >/dev/null 2>&1; then
      log "$what is ready ($((SECONDS - start))s)"
      return 0
    fi
    if (( SECONDS - start >= 3 )) && ! daemon_alive "$pidfile" "$comm"; then
      # one last try: the check might have raced with the pid file being written
      if "$check" >/dev/null 2>&1; then return 0; fi
      log "ERROR: $what is not running (no live '$comm' process in $pidfile)"
      tail_log "$@"
      exit 1
    fi
    if (( SECONDS - start >= timeout )); then
      log "ERROR: timed out after ${timeout}s waiting for $what to be ready"
      tail_log "$@"
      exit 1
    fi
    sleep 0.25
  done
}

# write_file PATH MODE: write stdin to PATH only if the content changed
write_file() {
  local path=$1 mode=$2 tmp
  tmp="$(mktemp "$path.XXXXXX")"
  cat >"$tmp"
  chmod "$mode" "$tmp"
  if [[ -f $path ]] && cmp -s "$tmp" "$path"; then
    rm -f "$tmp"
    chmod "$mode" "$path"
    return 0
  fi
  mv -f "$tmp" "$path"
  CONFIG_CHANGED=1
}

# ---------------------------------------------------------------------------- packages

POLICY_RC=/usr/sbin/policy-rc.d
CREATED_POLICY_RC=0
cleanup() {
  if (( CREATED_POLICY_RC )); then rm -f "$POLICY_RC"; CREATED_POLICY_RC=0; fi
}
trap cleanup EXIT

pkg_installed() {
  local s
  s="$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)"
  [[ $s == "install ok installed" ]]
}

ensure_packages() {
  local p missing=()
  if command -v dpkg-query >/dev/null 2>&1; then
    for p in "${PACKAGES[@]}"; do pkg_installed "$p" || missing+=("$p"); done
  else
    for p in munged mariadbd slurmdbd slurmctld slurmd sbatch; do
      command -v "$p" >/dev/null 2>&1 || missing+=("$p")
    done
  fi
  (( ${#missing[@]} == 0 )) && return 0
  command -v apt-get >/dev/null 2>&1 || die "missing packages (${missing[*]}) and no apt-get to install them"
  (( EUID == 0 )) || die "missing packages (${missing[*]}); installing them needs root"
  log "installing: ${missing[*]} (log: $LOGDIR/apt.log)"
  if [[ ! -e $POLICY_RC ]]; then
    # keep package scripts from starting system services on the default ports
    printf '#!/bin/sh\nexit 101\n' >"$POLICY_RC"
    chmod 0755 "$POLICY_RC"
    CREATED_POLICY_RC=1
  fi
  local t0=$SECONDS
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get -o DPkg::Lock::Timeout=120 update >>"$LOGDIR/apt.log" 2>&1; then
    tail_log "$LOGDIR/apt.log"; die "apt-get update failed"
  fi
  if ! apt-get -o DPkg::Lock::Timeout=120 install -y --no-install-recommends "${missing[@]}" \
      >>"$LOGDIR/apt.log" 2>&1; then
    tail_log "$LOGDIR/apt.log"; die "apt-get install failed"
  fi
  cleanup
  log "packages installed ($((SECONDS - t0))s)"
}

# ---------------------------------------------------------------------------- config

db_password() {
  if [[ ! -s $DB_PASSWORD_FILE ]]; then
    (umask 077; od -An -tx1 -N16 /dev/urandom | tr -d ' \n' >"$DB_PASSWORD_FILE")
  fi
  cat "$DB_PASSWORD_FILE"
}

write_configs() {
  CONFIG_CHANGED=0
  install -d -m 0755 "$DIR" "$ETC" "$LOGDIR" "$RUNDIR" "$STATEDIR" "$DEVDIR" \
    "$STATEDIR/slurmctld" "$STATEDIR/slurmd"
  local last_port=$((SLURMD_PORT_BASE + ${#NODES[@]} - 1))
  local nodes="node[1-${#NODES[@]}]"
  local pw
  pw="$(db_password)"

  write_file "$SLURM_CONF_FILE" 0644 <<EOF
# Generated by scripts/dev-cluster.sh - local development cluster, do not use in production.
ClusterName=$CLUSTER_NAME
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT_BASE
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCK,cred_expire=10
StateSaveLocation=$STATEDIR/slurmctld
SlurmdSpoolDir=$STATEDIR/slurmd/%n
SlurmctldPidFile=$CTLD_PID
SlurmdPidFile=$RUNDIR/slurmd-%n.pid
SlurmctldLogFile=$CTLD_LOG
SlurmdLogFile=$LOGDIR/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1000
SlurmdParameters=config_overrides
MpiDefault=none
SwitchType=switch/none
MailProg=/bin/true
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=5,bf_interval=2
KillWait=5
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=60
Waittime=0
GresTypes=gpu
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$DBD_PORT
AccountingStoragePass=$MUNGE_SOCK
AccountingStorageTRES=gres/gpu
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
JobCompType=jobcomp/none
NodeName=$nodes NodeAddr=127.0.0.1 NodeHostname=localhost Port=[$SLURMD_PORT_BASE-$last_port] CPUs=16 RealMemory=64000 Gres=gpu:h100:$NGPUS State=UNKNOWN
PartitionName=gpu Nodes=$nodes Default=YES MaxTime=INFINITE State=UP
EOF

  write_file "$GRES_CONF" 0644 <<EOF
AutoDetect=off
NodeName=$nodes Name=gpu Type=h100 File=$DEVDIR/nvidia[0-$((NGPUS - 1))]
EOF

  write_file "$DBD_CONF" 0600 <<EOF
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCK
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
DebugLevel=info
LogFile=$DBD_LOG
PidFile=$DBD_PID
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$MYSQL_PORT
StorageUser=slurm
StoragePass=$pw
StorageLoc=slurm_acct_db
EOF

  write_file "$MY_CNF" 0644 <<EOF
[client]
socket=$MYSQL_SOCK
port=$MYSQL_PORT
user=root

[mysqld]
user=mysql
datadir=$MYSQL_DATA
socket=$MYSQL_SOCK
pid-file=$MYSQL_PID
log-error=$MYSQL_LOG
port=$MYSQL_PORT
bind-address=127.0.0.1
skip-name-resolve
performance_schema=OFF
innodb_buffer_pool_size=256M
innodb_log_file_size=64M
innodb_lock_wait_timeout=900
innodb_flush_log_at_trx_commit=2
innodb_doublewrite=0
EOF

  # fake GPUs: character devices (plain files give no CUDA_VISIBLE_DEVICES)
  local i f
  for ((i = 0; i < NGPUS; i++)); do
    f="$DEVDIR/nvidia$i"
    if [[ ! -c $f ]]; then
      rm -f "$f"
      mknod -m 666 "$f" c 195 "$i"
    fi
  done
}

# ---------------------------------------------------------------------------- readiness checks

check_munge() { munge -S "$MUNGE_SOCK" -n | unmunge -S "$MUNGE_SOCK" >/dev/null; }
check_mysql() { mariadb-admin --defaults-file="$MY_CNF" ping; }
check_dbd() { timeout 10 sacctmgr -n -P show cluster; }
check_ctld() { timeout 10 scontrol ping 2>&1 | grep -q 'is UP'; }

# node_info NODE -> "STATE EPOCH_OF_SLURMDSTARTTIME"
node_info() {
  local line state start epoch=0
  line="$(scontrol -o show node "$1" 2>/dev/null)" || return 1
  state="$(sed -n 's/.* State=\([^ ]*\).*/\1/p' <<<"$line")"
  start="$(sed -n 's/.* SlurmdStartTime=\([^ ]*\).*/\1/p' <<<"$line")"
  if [[ -n $start && $start != None && $start != Unknown ]]; then
    epoch="$(date -d "$start" +%s 2>/dev/null || echo 0)"
  fi
  echo "$state $epoch"
}

node_state_ok() {
  case $1 in IDLE|MIXED|ALLOCATED) return 0 ;; *) return 1 ;; esac
}

# ---------------------------------------------------------------------------- starting

start_munged() {
  if daemon_alive "$MUNGE_PID" munged; then
    log "munged already running"
  else
    log "starting munged"
    install -d -o munge -g munge -m 0711 "$MUNGE_DIR"
    if [[ ! -s $MUNGE_KEY ]]; then
      rm -f "$MUNGE_KEY"
      mungekey --create --keyfile="$MUNGE_KEY" >&2
    fi
    chown munge:munge "$MUNGE_KEY"
    chmod 0400 "$MUNGE_KEY"
    rm -f "$MUNGE_SOCK" "$MUNGE_SOCK.lock" "$MUNGE_PID"
    if ! runuser -u munge -- munged --socket="$MUNGE_SOCK" --key-file="$MUNGE_KEY" \
        --pid-file="$MUNGE_PID" --log-file="$MUNGE_LOG" --seed-file="$MUNGE_SEED" \
        </dev/null >>"$LOGDIR/munged.out" 2>&1; then
      tail_log "$LOGDIR/munged.out" "$MUNGE_LOG"
      die "munged failed to start"
    fi
  fi
  wait_ready munged "$MUNGE_PID" munged "$TIMEOUT" check_munge "$MUNGE_LOG" "$LOGDIR/munged.out"
}

mysql_sql() { mariadb --defaults-file="$MY_CNF" -uroot; }

start_mariadb() {
  if daemon_alive "$MYSQL_PID" mariadbd; then
    log "mariadbd already running"
  else
    install -d -o mysql -g mysql -m 0755 "$MYSQL_DIR"
    if [[ ! -d $MYSQL_DATA/mysql ]]; then
      log "initialising MariaDB datadir"
      rm -rf "$MYSQL_DATA"
      install -d -o mysql -g mysql -m 0750 "$MYSQL_DATA"
      if ! mariadb-install-db --defaults-file="$MY_CNF" --user=mysql --skip-test-db \
          >>"$LOGDIR/mariadb-install-db.log" 2>&1; then
        tail_log "$LOGDIR/mariadb-install-db.log"
        rm -rf "$MYSQL_DATA"
        die "mariadb-install-db failed"
      fi
    fi
    log "starting mariadbd"
    rm -f "$MYSQL_PID"
    setsid mariadbd --defaults-file="$MY_CNF" </dev/null >>"$MYSQL_DIR/mariadbd.out" 2>&1 &
  fi
  wait_ready mariadbd "$MYSQL_PID" mariadbd "$TIMEOUT" check_mysql "$MYSQL_LOG" "$MYSQL_DIR/mariadbd.out"
  # idempotent: the slurmdbd user and its grants
  local pw
  pw="$(db_password)"
  if ! mysql_sql >>"$LOGDIR/mariadb-setup.log" 2>&1 <<EOF; then
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$pw';
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$pw';
ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$pw';
ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$pw';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
FLUSH PRIVILEGES;
EOF
    tail_log "$LOGDIR/mariadb-setup.log"
    die "could not create the MariaDB user for slurmdbd"
  fi
}

start_slurmdbd() {
  if daemon_alive "$DBD_PID" slurmdbd; then
    log "slurmdbd already running"
  else
    log "starting slurmdbd"
    rm -f "$DBD_PID"
    if ! slurmdbd </dev/null >>"$LOGDIR/slurmdbd.out" 2>&1; then
      tail_log "$LOGDIR/slurmdbd.out" "$DBD_LOG"
      die "slurmdbd failed to start"
    fi
  fi
  wait_ready slurmdbd "$DBD_PID" slurmdbd "$TIMEOUT" check_dbd "$DBD_LOG" "$LOGDIR/slurmdbd.out"
}

start_slurmctld() {
  if daemon_alive "$CTLD_PID" slurmctld; then
    log "slurmctld already running"
  else
    log "starting slurmctld"
    rm -f "$CTLD_PID"
    if ! slurmctld </dev/null >>"$LOGDIR/slurmctld.out" 2>&1; then
      tail_log "$LOGDIR/slurmctld.out" "$CTLD_LOG"
      die "slurmctld failed to start"
    fi
  fi
  wait_ready slurmctld "$CTLD_PID" slurmctld "$TIMEOUT" check_ctld "$CTLD_LOG" "$LOGDIR/slurmctld.out"
}

start_slurmds() {
  local n now
  declare -A launched=()
  for n in "${NODES[@]}"; do
    if daemon_alive "$(slurmd_pid "$n")" slurmd; then
      log "slurmd $n already running"
      launched[$n]=0
    else
      log "starting slurmd $n"
      rm -f "$(slurmd_pid "$n")"
      now="$(date +%s)"
      if ! slurmd -N "$n" </dev/null >>"$LOGDIR/slurmd-$n.out" 2>&1; then
        tail_log "$LOGDIR/slurmd-$n.out" "$(slurmd_log "$n")"
        die "slurmd $n failed to start"
      fi
      launched[$n]=$now
    fi
  done

  # ready: every node IDLE (or busy) without flags, and registered after its launch
  local start=$SECONDS info state epoch pending resumed=""
  while true; do
    pending=()
    for n in "${NODES[@]}"; do
      info="$(node_info "$n" || echo "UNKNOWN 0")"
      state="${info% *}"
      epoch="${info##* }"
      if (( epoch >= launched[$n] )) && node_state_ok "$state"; then
        continue
      fi
      # a node drained by an earlier run (e.g. "Kill task failed") does not come back by
      # itself; once its fresh slurmd has registered, resume it.
      if (( epoch >= launched[$n] )) && [[ $state == *DRAIN* && " $resumed " != *" $n "* ]]; then
        log "node $n is $state after registering; resuming it"
        scontrol update NodeName="$n" State=RESUME >&2 || true
        resumed+=" $n"
      fi
      if (( SECONDS - start >= 3 )) && ! daemon_alive "$(slurmd_pid "$n")" slurmd; then
        log "ERROR: slurmd $n is not running"
        tail_log "$(slurmd_log "$n")" "$LOGDIR/slurmd-$n.out"
        exit 1
      fi
      pending+=("$n=$state")
    done
    if (( ${#pending[@]} == 0 )); then
      log "slurmd nodes ready: ${NODES[*]} ($((SECONDS - start))s)"
      return 0
    fi
    if (( SECONDS - start >= TIMEOUT )); then
      log "ERROR: timed out after ${TIMEOUT}s waiting for nodes: ${pending[*]}"
      scontrol show node >&2 || true
      for n in "${NODES[@]}"; do tail_log "$(slurmd_log "$n")"; done
      tail_log "$CTLD_LOG"
      exit 1
    fi
    sleep 0.25
  done
}

# ---------------------------------------------------------------------------- subcommands

all_pids_alive() {
  daemon_alive "$MUNGE_PID" munged || return 1
  daemon_alive "$MYSQL_PID" mariadbd || return 1
  daemon_alive "$DBD_PID" slurmdbd || return 1
  daemon_alive "$CTLD_PID" slurmctld || return 1
  local n
  for n in "${NODES[@]}"; do daemon_alive "$(slurmd_pid "$n")" slurmd || return 1; done
}

already_up() {
  all_pids_alive || return 1
  [[ -f $SLURM_CONF_FILE ]] || return 1
  check_ctld || return 1
  local n info
  for n in "${NODES[@]}"; do
    info="$(node_info "$n")" || return 1
    node_state_ok "${info% *}" || return 1
  done
}

cmd_up() {
  local t0=$SECONDS
  if already_up >/dev/null 2>&1; then
    log "cluster $CLUSTER_NAME is already up ($DIR)"
    echo "export SLURM_CONF=$SLURM_CONF_FILE"
    return 0
  fi
  (( EUID == 0 )) || die "'up' needs root (it runs munged/mariadbd as their users and slurmd as root)"
  install -d -m 0755 "$DIR" "$LOGDIR"
  ensure_packages
  write_configs
  if (( CONFIG_CHANGED )) && { daemon_alive "$CTLD_PID" slurmctld || daemon_alive "$DBD_PID" slurmdbd; }; then
    log "WARNING: configuration changed while some daemons run; run '$0 down' then '$0 up' to apply it"
  fi
  start_munged
  start_mariadb
  start_slurmdbd
  start_slurmctld
  start_slurmds
  log "cluster $CLUSTER_NAME is up in $((SECONDS - t0))s ($DIR)"
  echo "export SLURM_CONF=$SLURM_CONF_FILE"
}

# stop_daemon WHAT PIDFILE COMM TIMEOUT
stop_daemon() {
  local what=$1 pidfile=$2 comm=$3 timeout=$4 pid
  pid="$(read_pid "$pidfile")"
  if ! proc_alive "$pid" "$comm"; then
    if [[ -e $pidfile ]]; then log "$what not running (stale pid file)"; else log "$what not running"; fi
    return 0
  fi
  log "stopping $what (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  local start=$SECONDS
  while proc_alive "$pid" "$comm"; do
    if (( SECONDS - start >= timeout )); then
      log "WARNING: $what (pid $pid) still running after ${timeout}s; sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      local k=$SECONDS
      while proc_alive "$pid" "$comm"; do
        (( SECONDS - k >= 10 )) && { log "ERROR: $what (pid $pid) survived SIGKILL"; return 1; }
        sleep 0.2
      done
      break
    fi
    sleep 0.2
  done
}

cmd_down() {
  local rc=0 n
  if daemon_alive "$CTLD_PID" slurmctld && [[ -f $SLURM_CONF_FILE ]] && command -v squeue >/dev/null 2>&1; then
    local ids
    ids="$(squeue -h -o %A 2>/dev/null | sort -u | tr '\n' ' ' || true)"
    if [[ -n ${ids// /} ]]; then
      log "cancelling jobs: $ids"
      # shellcheck disable=SC2086
      scancel $ids >&2 || true
      local start=$SECONDS
      while [[ -n "$(squeue -h -o %A 2>/dev/null || true)" ]]; do
        if (( SECONDS - start >= 30 )); then
          log "WARNING: jobs still listed after 30s:"
          squeue >&2 || true
          break
        fi
        sleep 0.5
      done
    fi
  fi
  for n in "${NODES[@]}"; do
    stop_daemon "slurmd $n" "$(slurmd_pid "$n")" slurmd 30 || rc=1
  done
  stop_daemon slurmctld "$CTLD_PID" slurmctld 30 || rc=1
  stop_daemon slurmdbd "$DBD_PID" slurmdbd 30 || rc=1
  stop_daemon mariadbd "$MYSQL_PID" mariadbd 60 || rc=1
  stop_daemon munged "$MUNGE_PID" munged 15 || rc=1
  if (( rc == 0 )); then log "cluster $CLUSTER_NAME is down"; else log "some daemons could not be stopped"; fi
  return "$rc"
}

cmd_status() {
  local all=0 n pid
  report() {  # WHAT PIDFILE COMM
    pid="$(read_pid "$2")"
    if proc_alive "$pid" "$3"; then
      printf '%-14s running (pid %s)\n' "$1" "$pid"
    else
      printf '%-14s stopped\n' "$1"
      all=1
    fi
  }
  report munged "$MUNGE_PID" munged
  report mariadbd "$MYSQL_PID" mariadbd
  report slurmdbd "$DBD_PID" slurmdbd
  report slurmctld "$CTLD_PID" slurmctld
  for n in "${NODES[@]}"; do report "slurmd $n" "$(slurmd_pid "$n")" slurmd; done
  if (( all == 0 )); then
    echo
    sinfo || all=1
    echo "export SLURM_CONF=$SLURM_CONF_FILE"
  fi
  return "$all"
}

usage() {
  sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//' >&2
}

case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  -h|--help|help) usage ;;
  *) usage; exit 2 ;;
esac
