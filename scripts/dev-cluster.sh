#!/usr/bin/env bash
# dev-cluster.sh - run a small, real Slurm cluster on this machine for jobctl's tests.
#
#   scripts/dev-cluster.sh up [--ssh]  install packages if missing, start everything, wait until
#                                   ready; the LAST line on stdout is `export SLURM_CONF=...`
#                                   (all of stdout is eval-able)
#   scripts/dev-cluster.sh down [--ssh-only]
#                                   cancel all jobs, stop the daemons named by the pid files
#                                   (sshd first); --ssh-only stops only the sshd of `up --ssh`
#   scripts/dev-cluster.sh status [--ssh]
#                                   say which daemons run (+ sinfo); exit 0 only if all Slurm
#                                   daemons are up (and the sshd too, with --ssh)
#
# Cluster "jobctl-dev": munged + MariaDB + slurmdbd + slurmctld + two slurmd (node1, node2),
# each node advertising CPUs=16 RealMemory=64000 Gres=gpu:h100:8 (fake GPUs: character
# devices made with mknod), one partition "gpu". Needs root and Debian 12 (apt-get).
#
# `up --ssh` also makes the cluster a "remote" one reached over SSH on loopback: a local user
# jobctl-remote (key login only), an sshd of its own on 127.0.0.1 (own config and host key
# under $DIR/ssh, SLURM_CONF set for sessions), a venv /home/jobctl-remote/venv made with the
# system /usr/bin/python3, and the inventory $DIR/clusters/dev-ssh.yaml (host, port, user,
# key_file, known_hosts, remote_python, workdir). Its path is printed on stdout as
# `export JOBCTL_DEV_SSH_INVENTORY=...`; `export JOBCTL_CLUSTERS=$DIR/clusters` makes it
# visible to jobctl as `--cluster dev-ssh` (it is generated, never part of the repository).
#
# Everything (config, state, logs, pids, sockets, DB, keys) lives under ONE directory:
#   JOBCTL_DEV_CLUSTER_DIR        (default /tmp/jobctl-dev-cluster)
# Ports (all bound to / used on 127.0.0.1):
#   JOBCTL_DEV_MYSQL_PORT         (default 13306)  MariaDB
#   JOBCTL_DEV_SLURMDBD_PORT      (default 16819)  slurmdbd
#   JOBCTL_DEV_SLURMCTLD_PORT     (default 16817)  slurmctld
#   JOBCTL_DEV_SLURMD_PORT_BASE   (default 17001)  slurmd of node1; node2 uses base+1
#   JOBCTL_DEV_SSH_PORT           (default 2222)   sshd (only with `up --ssh`)
# Timeouts:
#   JOBCTL_DEV_TIMEOUT            (default 60)  seconds to wait for each daemon to be ready
#
# How it is built: docs/architecture.md, "Tests and real components".
set -euo pipefail

DIR="${JOBCTL_DEV_CLUSTER_DIR:-/tmp/jobctl-dev-cluster}"
[[ $DIR == /* ]] || DIR="$PWD/$DIR"
DIR="${DIR%/}"
MYSQL_PORT="${JOBCTL_DEV_MYSQL_PORT:-13306}"
DBD_PORT="${JOBCTL_DEV_SLURMDBD_PORT:-16819}"
CTLD_PORT="${JOBCTL_DEV_SLURMCTLD_PORT:-16817}"
SLURMD_PORT_BASE="${JOBCTL_DEV_SLURMD_PORT_BASE:-17001}"
SSH_PORT="${JOBCTL_DEV_SSH_PORT:-2222}"
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

# `up --ssh`: the remote user, sshd and the inventory
SSH_USER=jobctl-remote
SSH_HOME=/home/$SSH_USER
SSH_VENV=$SSH_HOME/venv
SSH_WORKDIR=$SSH_HOME/jobctl
SYSTEM_PYTHON=/usr/bin/python3
SSHD_BIN=/usr/sbin/sshd
SSH_DIR="$DIR/ssh"
SSHD_CONFIG="$SSH_DIR/sshd_config"
SSH_HOST_KEY="$SSH_DIR/ssh_host_ed25519_key"
SSH_CLIENT_KEY="$SSH_DIR/id_ed25519"
SSH_KNOWN_HOSTS="$SSH_DIR/known_hosts"
SSHD_PID="$RUNDIR/sshd.pid"
SSHD_LOG="$LOGDIR/sshd.log"
SSH_KEY_COMMENT="jobctl-dev-cluster:$DIR"
INVENTORY_DIR="$DIR/clusters"
INVENTORY="$INVENTORY_DIR/dev-ssh.yaml"

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

# ensure_packages PKG...: install with apt-get those that are missing
ensure_packages() {
  local p missing=()
  if command -v dpkg-query >/dev/null 2>&1; then
    for p in "$@"; do pkg_installed "$p" || missing+=("$p"); done
  else
    # no dpkg: look for each package's programs instead
    local prog progs
    for p in "$@"; do
      case $p in
        munge) progs=(munged) ;;
        mariadb-server) progs=(mariadbd) ;;
        slurmdbd|slurmctld|slurmd) progs=("$p") ;;
        slurm-client) progs=(sbatch sacct) ;;
        openssh-server) progs=("$SSHD_BIN") ;;
        openssh-client) progs=(ssh ssh-keygen sftp) ;;
        python3|python3-venv) progs=("$SYSTEM_PYTHON") ;;
        *) progs=("$p") ;;
      esac
      for prog in "${progs[@]}"; do
        if ! command -v "$prog" >/dev/null 2>&1; then missing+=("$p"); break; fi
      done
    done
  fi
  (( ${#missing[@]} == 0 )) && return 0
  command -v apt-get >/dev/null 2>&1 || die "missing packages (${missing[*]}) and no apt-get to install them"
  (( EUID == 0 )) || die "missing packages (${missing[*]}); installing them needs root"
  log "installing: ${missing[*]} (log: $LOGDIR/apt.log)"
  if [[ ! -e $POLICY_RC ]]; then
    # keep package scripts from starting system services on the default ports
    # (openssh-server would start an sshd on port 22)
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

# ---------------------------------------------------------------------------- sshd (up --ssh)

# openssh for sshd/ssh/sftp/ssh-keygen; python3-venv so that the system python3 makes venvs
SSH_PACKAGES=(openssh-server openssh-client python3 python3-venv)

# the host name as ssh writes it in known_hosts
known_hosts_host() {
  if [[ $SSH_PORT == 22 ]]; then echo 127.0.0.1; else echo "[127.0.0.1]:$SSH_PORT"; fi
}

# ssh_remote CMD...: run CMD as $SSH_USER through our sshd (key login, strict host key check)
ssh_remote() {
  timeout 30 ssh -F /dev/null -i "$SSH_CLIENT_KEY" -o IdentitiesOnly=yes -o BatchMode=yes \
    -o UserKnownHostsFile="$SSH_KNOWN_HOSTS" -o GlobalKnownHostsFile=/dev/null \
    -o StrictHostKeyChecking=yes -o ConnectTimeout=10 -o LogLevel=ERROR \
    -p "$SSH_PORT" "$SSH_USER@127.0.0.1" "$@" </dev/null
}

sshd_config_text() {
  cat <<CONF
# Generated by scripts/dev-cluster.sh - loopback sshd of the local dev cluster; do not use in production.
Port $SSH_PORT
ListenAddress 127.0.0.1
AddressFamily inet
HostKey $SSH_HOST_KEY
PidFile $SSHD_PID
PubkeyAuthentication yes
AuthorizedKeysFile .ssh/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitEmptyPasswords no
HostbasedAuthentication no
# UsePAM no: a password field '!' (locked) is refused; $SSH_USER has '*'
UsePAM no
PermitRootLogin no
AllowUsers $SSH_USER
StrictModes yes
# no AcceptEnv: nothing from the client's environment is passed on; Slurm clients get:
SetEnv SLURM_CONF=$SLURM_CONF_FILE
X11Forwarding no
AllowAgentForwarding no
PrintMotd no
MaxStartups 100:30:200
Subsystem sftp internal-sftp
LogLevel INFO
CONF
}

inventory_text() {
  cat <<YAML
# Generated by scripts/dev-cluster.sh up --ssh: the dev Slurm cluster reached over SSH on
# loopback. Machine-specific: do not commit. Use with JOBCTL_CLUSTERS=$INVENTORY_DIR
name: dev-ssh
scheduler: slurm
login:
  host: 127.0.0.1
  port: $SSH_PORT
  user: $SSH_USER
  key_file: $SSH_CLIENT_KEY
  known_hosts: $SSH_KNOWN_HOSTS
  remote_python: $SSH_VENV/bin/python
  workdir: $SSH_WORKDIR
partitions:
  - name: gpu
    gpu: h100-sxm-80gb
    gpus_per_node: $NGPUS
    nodes: ${#NODES[@]}
    cpus_per_node: 16
    mem_gib: 62
YAML
}

# new_key PATH COMMENT: an ed25519 key pair without passphrase, unless a whole pair is there
new_key() {
  if [[ ! -s $1 || ! -s $1.pub ]]; then
    rm -f "$1" "$1.pub"
    ssh-keygen -q -t ed25519 -N '' -C "$2" -f "$1" </dev/null >&2 || die "ssh-keygen failed for $1"
    SSH_CHANGED=1
  fi
  chown root:root "$1" "$1.pub"
  chmod 0600 "$1"
  chmod 0644 "$1.pub"
}

ensure_ssh_files() {
  install -d -o root -g root -m 0755 "$SSH_DIR" "$INVENTORY_DIR"
  new_key "$SSH_HOST_KEY" "jobctl-dev-sshd"
  new_key "$SSH_CLIENT_KEY" "$SSH_KEY_COMMENT"
  CONFIG_CHANGED=0
  # the host key line comes from the key file itself, not from a scan of the running sshd
  # (write_file not in a pipeline: it sets CONFIG_CHANGED in this shell)
  write_file "$SSH_KNOWN_HOSTS" 0644 \
    <<<"$(known_hosts_host) $(cut -d' ' -f1,2 "$SSH_HOST_KEY.pub")"
  write_file "$SSHD_CONFIG" 0644 < <(sshd_config_text)
  (( CONFIG_CHANGED )) && SSH_CHANGED=1
  # privilege separation directory (sshd -t wants it too): root-owned, not group/world-writable
  install -d -o root -g root -m 0755 /run/sshd
  local out
  if ! out="$("$SSHD_BIN" -t -f "$SSHD_CONFIG" 2>&1)"; then
    printf '%s\n' "$out" >&2
    die "$SSHD_CONFIG is not valid"
  fi
}

ensure_ssh_user() {
  if ! getent passwd "$SSH_USER" >/dev/null; then
    log "creating user $SSH_USER"
    useradd --create-home --home-dir "$SSH_HOME" --shell /bin/bash --user-group \
      --password '*' --comment "jobctl dev cluster over ssh" "$SSH_USER" >&2 \
      || die "useradd $SSH_USER failed"
  fi
  local home group pw
  home="$(getent passwd "$SSH_USER" | cut -d: -f6)"
  [[ $home == "$SSH_HOME" ]] || die "user $SSH_USER exists with home $home, expected $SSH_HOME"
  # key login only: '*' (no password can match) rather than '!' (locked: refused with UsePAM no)
  pw="$(getent shadow "$SSH_USER" | cut -d: -f2)"
  if [[ $pw != '*' ]]; then
    usermod -p '*' "$SSH_USER" || die "could not set the password field of $SSH_USER to '*'"
  fi
  group="$(id -gn "$SSH_USER")"
  # StrictModes: home and ~/.ssh not writable by others
  install -d -m 0755 "$SSH_HOME"
  chown "$SSH_USER:$group" "$SSH_HOME"
  chmod 0755 "$SSH_HOME"
  install -d -m 0700 "$SSH_HOME/.ssh"
  chown "$SSH_USER:$group" "$SSH_HOME/.ssh"
  chmod 0700 "$SSH_HOME/.ssh"

  # authorized_keys: this cluster's key (by its comment) replaced, other lines kept
  local ak="$SSH_HOME/.ssh/authorized_keys" tmp line
  tmp="$(mktemp "$ak.XXXXXX")"
  if [[ -f $ak ]]; then
    while IFS= read -r line || [[ -n $line ]]; do
      [[ $line == *" $SSH_KEY_COMMENT" ]] && continue
      printf '%s\n' "$line"
    done <"$ak" >"$tmp"
  fi
  cat "$SSH_CLIENT_KEY.pub" >>"$tmp"
  chown "$SSH_USER:$group" "$tmp"
  chmod 0600 "$tmp"
  if [[ -f $ak ]] && cmp -s "$tmp" "$ak"; then
    rm -f "$tmp"
    chown "$SSH_USER:$group" "$ak"
    chmod 0600 "$ak"
  else
    mv -f "$tmp" "$ak"
  fi
}

# what the remote user needs from the cluster: slurm.conf readable, the munge socket usable
check_remote_user_access() {
  [[ $(stat -c '%a %U' "$DBD_CONF") == "600 root" ]] || die "$DBD_CONF must be mode 0600, owned by root"
  if ! runuser -u "$SSH_USER" -- test -r "$SLURM_CONF_FILE"; then
    die "$SSH_USER cannot read $SLURM_CONF_FILE: $DIR and its parent folders must be world-executable"
  fi
  if ! runuser -u "$SSH_USER" -- sh -c 'munge -S "$1" -n | unmunge -S "$1" >/dev/null' sh "$MUNGE_SOCK" \
      >/dev/null 2>&1; then
    ls -ld "$MUNGE_DIR" "$MUNGE_SOCK" >&2 || true
    die "$SSH_USER cannot use the munge socket $MUNGE_SOCK (its folder must be world-executable)"
  fi
}

ensure_remote_venv() {
  [[ -x $SYSTEM_PYTHON ]] || die "$SYSTEM_PYTHON not found (Debian package python3)"
  local ok='import sys; sys.exit(0 if sys.prefix != sys.base_prefix and sys.base_prefix == "/usr" else 1)'
  if (cd / && runuser -u "$SSH_USER" -- "$SSH_VENV/bin/python" -c "$ok") >/dev/null 2>&1; then
    return 0
  fi
  log "creating $SSH_VENV with $SYSTEM_PYTHON (log: $LOGDIR/venv.log)"
  rm -rf "$SSH_VENV"
  if ! (cd / && runuser -u "$SSH_USER" -- "$SYSTEM_PYTHON" -m venv "$SSH_VENV") >>"$LOGDIR/venv.log" 2>&1; then
    tail_log "$LOGDIR/venv.log"
    die "could not create $SSH_VENV (is python3-venv installed?)"
  fi
}

# port_answers: something accepts connections on 127.0.0.1:$SSH_PORT
port_answers() { (exec 3<>"/dev/tcp/127.0.0.1/$SSH_PORT") 2>/dev/null; }

# check_sshd_banner: OUR sshd listens (it writes its pid file only once it has bound the port;
# it daemonizes before binding, so its exit status says nothing about that) and the port
# answers with an SSH banner
check_sshd_banner() {
  daemon_alive "$SSHD_PID" sshd || return 1
  (
    exec 3<>"/dev/tcp/127.0.0.1/$SSH_PORT" || exit 1
    IFS= read -r -t 5 banner <&3 || exit 1
    [[ $banner == SSH-2.0-* ]]
  )
}

check_ssh_sinfo() { ssh_remote sinfo -h -o %P | grep -q '^gpu'; }

# proc_descendants PID: all processes below PID (for the sshd: its sessions and what runs in them)
proc_descendants() {
  local f rest pid ppid
  declare -A children=()
  for f in /proc/[0-9]*/stat; do
    rest="$(cat "$f" 2>/dev/null)" || continue
    pid=${f#/proc/}; pid=${pid%/stat}
    rest=${rest##*) }            # after "(comm) ": state ppid ...
    ppid=$(cut -d' ' -f2 <<<"$rest")
    children[$ppid]+=" $pid"
  done
  local queue=("$1") p c
  while (( ${#queue[@]} )); do
    p=${queue[0]}; queue=("${queue[@]:1}")
    for c in ${children[$p]:-}; do echo "$c"; queue+=("$c"); done
  done
}

stop_sshd() {
  local pid procs p
  pid="$(read_pid "$SSHD_PID")"
  procs=""
  proc_alive "$pid" sshd && procs="$(proc_descendants "$pid")"
  stop_daemon sshd "$SSHD_PID" sshd 15 || return 1
  # sessions (and the commands they run) outlive the listener: end those of our sshd too
  if [[ -n $procs ]]; then
    log "ending ssh sessions: $(tr '\n' ' ' <<<"$procs")"
    for p in $procs; do kill -TERM "$p" 2>/dev/null || true; done
  fi
  return 0
}

start_sshd() {
  install -d -o root -g root -m 0755 /run/sshd
  if daemon_alive "$SSHD_PID" sshd; then
    if (( SSH_CHANGED )); then
      log "sshd configuration or keys changed; restarting sshd"
      stop_sshd || die "could not stop sshd"
    else
      log "sshd already running"
    fi
  fi
  if ! daemon_alive "$SSHD_PID" sshd; then
    if port_answers; then
      die "127.0.0.1:$SSH_PORT is in use by another program; choose another port with JOBCTL_DEV_SSH_PORT"
    fi
    log "starting sshd on 127.0.0.1:$SSH_PORT"
    rm -f "$SSHD_PID"
    if ! "$SSHD_BIN" -f "$SSHD_CONFIG" -E "$SSHD_LOG" </dev/null >>"$LOGDIR/sshd.out" 2>&1; then
      tail_log "$LOGDIR/sshd.out" "$SSHD_LOG"
      die "sshd failed to start"
    fi
  fi
  wait_ready sshd "$SSHD_PID" sshd "$TIMEOUT" check_sshd_banner "$SSHD_LOG" "$LOGDIR/sshd.out"
}

setup_ssh() {
  SSH_CHANGED=0
  ensure_ssh_files
  ensure_ssh_user
  check_remote_user_access
  ensure_remote_venv
  start_sshd
  wait_ready "ssh login as $SSH_USER (sinfo)" "$SSHD_PID" sshd "$TIMEOUT" check_ssh_sinfo \
    "$SSHD_LOG" "$LOGDIR/sshd.out"
  CONFIG_CHANGED=0
  write_file "$INVENTORY" 0644 < <(inventory_text)
  log "inventory $INVENTORY (export JOBCTL_CLUSTERS=$INVENTORY_DIR to use it as --cluster dev-ssh)"
}

ssh_already_up() {
  daemon_alive "$SSHD_PID" sshd || return 1
  [[ -s $SSH_CLIENT_KEY && -s $SSH_KNOWN_HOSTS && -s $INVENTORY && -x $SSH_VENV/bin/python ]] || return 1
  cmp -s "$SSHD_CONFIG" <(sshd_config_text) || return 1
  cmp -s "$INVENTORY" <(inventory_text) || return 1
  check_ssh_sinfo
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

print_exports() {  # WANT_SSH
  if (( $1 )); then echo "export JOBCTL_DEV_SSH_INVENTORY=$INVENTORY"; fi
  echo "export SLURM_CONF=$SLURM_CONF_FILE"
}

cmd_up() {
  local want_ssh=0 arg
  for arg in "$@"; do
    case $arg in
      --ssh) want_ssh=1 ;;
      *) usage; exit 2 ;;
    esac
  done
  local t0=$SECONDS slurm_up=0
  if already_up >/dev/null 2>&1; then slurm_up=1; fi
  if (( slurm_up )) && { (( ! want_ssh )) || ssh_already_up >/dev/null 2>&1; }; then
    log "cluster $CLUSTER_NAME is already up ($DIR)"
    if (( want_ssh )); then log "sshd is already up on 127.0.0.1:$SSH_PORT (inventory $INVENTORY)"; fi
    print_exports "$want_ssh"
    return 0
  fi
  (( EUID == 0 )) || die "'up' needs root (it runs munged/mariadbd as their users and slurmd as root)"
  install -d -m 0755 "$DIR" "$LOGDIR"
  local packages=("${PACKAGES[@]}")
  if (( want_ssh )); then packages+=("${SSH_PACKAGES[@]}"); fi
  ensure_packages "${packages[@]}"
  if (( slurm_up )); then
    log "cluster $CLUSTER_NAME is already up ($DIR)"
  else
    write_configs
    if (( CONFIG_CHANGED )) && { daemon_alive "$CTLD_PID" slurmctld || daemon_alive "$DBD_PID" slurmdbd; }; then
      log "WARNING: configuration changed while some daemons run; run '$0 down' then '$0 up' to apply it"
    fi
    start_munged
    start_mariadb
    start_slurmdbd
    start_slurmctld
    start_slurmds
  fi
  if (( want_ssh )); then setup_ssh; fi
  log "cluster $CLUSTER_NAME is up in $((SECONDS - t0))s ($DIR)"
  print_exports "$want_ssh"
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
  local rc=0 n arg ssh_only=0
  for arg in "$@"; do
    case $arg in
      --ssh-only) ssh_only=1 ;;
      *) usage; exit 2 ;;
    esac
  done
  if (( ssh_only )); then
    stop_sshd || return 1
    return 0
  fi
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
  stop_sshd || rc=1
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
  local all=0 n pid arg want_ssh=0
  for arg in "$@"; do
    case $arg in
      --ssh) want_ssh=1 ;;
      *) usage; exit 2 ;;
    esac
  done
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
  # sshd (up --ssh) is optional: it counts for the exit status only with `status --ssh`
  local ssh_running=0
  pid="$(read_pid "$SSHD_PID")"
  if proc_alive "$pid" sshd; then
    printf '%-14s running (pid %s)\n' sshd "$pid"
    ssh_running=1
  else
    printf '%-14s stopped\n' sshd
    (( want_ssh )) && all=1
  fi
  if (( all == 0 )); then
    echo
    sinfo || all=1
    (( ssh_running && want_ssh )) && echo "export JOBCTL_DEV_SSH_INVENTORY=$INVENTORY"
    echo "export SLURM_CONF=$SLURM_CONF_FILE"
  fi
  return "$all"
}

usage() {
  sed -n '2,/^# Facts this follows/p' "$0" | sed 's/^# \{0,1\}//' >&2
}

case "${1:-}" in
  up) shift; cmd_up "$@" ;;
  down) shift; cmd_down "$@" ;;
  status) shift; cmd_status "$@" ;;
  -h|--help|help) usage ;;
  *) usage; exit 2 ;;
esac
