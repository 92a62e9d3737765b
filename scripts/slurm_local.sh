#!/usr/bin/env bash
# A single-node SLURM cluster on this machine, for trying (and testing) profiles/slurm for real.
#
#   scripts/slurm_local.sh install                 # Debian/Ubuntu packages: slurm-wlm, slurmctld, slurmd, munge
#   scripts/slurm_local.sh start [--accounting]    # munge + slurmctld + slurmd (+ MariaDB + slurmdbd)
#   scripts/slurm_local.sh status                  # daemons, partitions, accounting mode
#   scripts/slurm_local.sh stop                    # stops what `start` started (packages stay)
#
# Needs root (apt-get, daemons) and Debian's packages (bookworm: SLURM 22.05, munge 0.5.15). Every
# command is idempotent: `start` on a running cluster with the same accounting mode does nothing, with
# the other mode it restarts; `stop` on a stopped one does nothing.
#
# The cluster: one node (this host, its CPUs and memory as `slurmd -C` reports them) in two
# partitions, `cpu` (default) and `gpu`, the names profiles/slurm asks for (no GPUs are declared:
# jobs that request --gpus are refused here). proctrack/linuxproc + task/none (no cgroups: works in
# containers). Without --accounting: AccountingStorageType=accounting_storage/none, so `sacct` sees
# no jobs (profiles/slurm then has to query `squeue`); job completions are logged by jobcomp/filetxt.
# With --accounting: slurmdbd on a local MariaDB (packages mariadb-server, slurmdbd), `sacct` works.
#
# Daemons are started with stdin/stdout/stderr detached (their own log files instead), so that a
# caller reading this script's output through a pipe is never held open by them.
#
# Files: /etc/slurm/slurm.conf (+ slurmdbd.conf) carry a marker line and are only ever written when
# absent or ours (a foreign slurm.conf is refused); state, logs and pid files live under
# /var/lib/mhar-slurm, /var/log/mhar-slurm and /run/mhar-slurm. `start` clears the previous job state
# (slurmctld -c): a fresh test cluster each time.
set -euo pipefail

MARK="# written by mhar scripts/slurm_local.sh"
CONF_DIR=/etc/slurm
CONF=$CONF_DIR/slurm.conf
DBD_CONF=$CONF_DIR/slurmdbd.conf
STATE=/var/lib/mhar-slurm
LOGS=/var/log/mhar-slurm
RUN=/run/mhar-slurm
CLUSTER=mhar-local
PACKAGES=(slurm-wlm slurmctld slurmd slurm-client munge)
ACCT_PACKAGES=(slurmdbd mariadb-server)
WAIT_S=${MHAR_SLURM_WAIT_S:-60}

say() { echo "slurm_local: $*" >&2; }
die() { echo "error: slurm_local: $*" >&2; exit 1; }

need_root() {
    [ "$(id -u)" -eq 0 ] || die "needs root (apt-get and the SLURM daemons); run it with sudo"
}

have_pkgs() {
    local p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || return 1
    done
}

install_pkgs() {
    need_root
    have_pkgs "$@" && return 0
    command -v apt-get >/dev/null || die "apt-get not found: install ${*} with your distribution's package manager"
    say "installing ${*} (apt-get)"
    # policy-rc.d (containers) keeps the packages from starting their own services; we start them below
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" >"$LOGS/apt.log" 2>&1; then
        say "apt-get install failed; updating the package lists once and retrying"
        DEBIAN_FRONTEND=noninteractive apt-get update -q >>"$LOGS/apt.log" 2>&1 || true
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" >>"$LOGS/apt.log" 2>&1 \
            || { tail -20 "$LOGS/apt.log" >&2; die "apt-get install ${*} failed (log: $LOGS/apt.log)"; }
    fi
}

ours_or_absent() {  # a config file we may write
    [ ! -e "$1" ] || head -1 "$1" | grep -qF "$MARK"
}

pid_alive() {  # pidfile -> 0 if that process runs
    [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null
}

wait_for() {  # seconds, description, command...
    local limit=$1 what=$2 t=0
    shift 2
    until "$@" >/dev/null 2>&1; do
        t=$((t + 1))
        [ "$t" -le "$((limit * 2))" ] || return 1
        sleep 0.5
    done
}

node_line() {
    # this host as slurmd sees it (CPUs, sockets, cores, threads); memory a little below the total so
    # that the node never drains for "low RealMemory"
    local line mem
    line=$(slurmd -C | head -1)
    mem=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$line")
    sed "s/RealMemory=[0-9]*/RealMemory=$((mem * 9 / 10))/; s/^NodeName=[^ ]*/NodeName=$(hostname -s) NodeAddr=127.0.0.1/" <<<"$line"
}

write_conf() {  # $1: accounting (0/1)
    ours_or_absent "$CONF" || die "$CONF exists and was not written by this script; move it away to use the local cluster"
    local host acct
    host=$(hostname -s)
    if [ "$1" = 1 ]; then
        acct="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStorageEnforce=associations"
    else
        acct="AccountingStorageType=accounting_storage/none"
    fi
    mkdir -p "$CONF_DIR"
    cat >"$CONF.tmp" <<EOF
$MARK (accounting=$1); rewritten by each start
ClusterName=$CLUSTER
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MinJobAge=300
KillWait=10
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$LOGS/jobcomp.log
$acct
$(node_line) State=UNKNOWN
PartitionName=cpu Nodes=$host Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes=$host MaxTime=INFINITE State=UP
EOF
    mv "$CONF.tmp" "$CONF"
}

write_dbd_conf() {
    ours_or_absent "$DBD_CONF" || die "$DBD_CONF exists and was not written by this script; move it away"
    cat >"$DBD_CONF" <<EOF
$MARK
DbdHost=localhost
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=root
StorageLoc=slurm_acct_db
LogFile=$LOGS/slurmdbd.log
PidFile=$RUN/slurmdbd.pid
EOF
    chmod 600 "$DBD_CONF"
}

start_munge() {
    if munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
        return 0  # a munged already answers (ours or the system's)
    fi
    [ -s /etc/munge/munge.key ] || { say "creating /etc/munge/munge.key"; mungekey --create --keyfile /etc/munge/munge.key; }
    chown munge:munge /etc/munge/munge.key && chmod 600 /etc/munge/munge.key
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge
    runuser -u munge -- /usr/sbin/munged </dev/null >/dev/null 2>&1
    touch "$RUN/munge.ours"
    wait_for 10 munge sh -c 'munge -n </dev/null | unmunge' || die "munged did not start (see /var/log/munge/munged.log)"
}

start_mariadb() {
    if mysqladmin ping >/dev/null 2>&1; then
        return 0
    fi
    mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
    [ -d /var/lib/mysql/mysql ] || mariadb-install-db --user=mysql >"$LOGS/mariadb-install.log" 2>&1
    # the server runs as mysql; we keep its pid to stop exactly it again
    # (its pid file lies in /run/mysqld, which the server's user may write)
    (cd / && exec setsid mariadbd --user=mysql --pid-file=/run/mysqld/mhar.pid) </dev/null >"$LOGS/mariadbd.log" 2>&1 &
    touch "$RUN/mariadb.ours"
    wait_for 60 mariadb mysqladmin ping || die "MariaDB did not start (log: $LOGS/mariadbd.log)"
}

start_slurmdbd() {
    pid_alive "$RUN/slurmdbd.pid" && return 0
    write_dbd_conf
    slurmdbd </dev/null >/dev/null 2>&1
    wait_for "$WAIT_S" slurmdbd sacctmgr -n list cluster || die "slurmdbd did not answer (log: $LOGS/slurmdbd.log)"
}

cluster_ready() {
    scontrol ping | grep -q UP && sinfo -h -N -o %T | grep -qE '^(idle|mixed|allocated)'
}

running_mode() {  # accounting mode of the running cluster: 0, 1, or empty if not running
    pid_alive "$RUN/slurmctld.pid" || return 0
    sed -n "1s/.*(accounting=\([01]\)).*/\1/p" "$CONF" 2>/dev/null
}

cmd_install() {
    mkdir -p "$LOGS"
    install_pkgs "${PACKAGES[@]}"
    [ "${1:-0}" = 1 ] && install_pkgs "${ACCT_PACKAGES[@]}"
    say "installed: slurm-wlm $(dpkg-query -W -f='${Version}' slurm-wlm), munge $(dpkg-query -W -f='${Version}' munge)"
}

cmd_start() {
    local acct=0
    [ "${1:-}" = "--accounting" ] && acct=1
    need_root
    local mode
    mode=$(running_mode)
    if [ -n "$mode" ]; then
        if [ "$mode" = "$acct" ] && cluster_ready; then
            say "already running (accounting=$acct)"
            return 0
        fi
        say "running with accounting=$mode or not ready: restarting with accounting=$acct"
        cmd_stop
    fi
    mkdir -p "$STATE/ctld" "$STATE/d" "$LOGS" "$RUN"
    cmd_install "$acct"
    write_conf "$acct"
    start_munge
    if [ "$acct" = 1 ]; then
        start_mariadb
        start_slurmdbd
        sacctmgr -i -n add cluster "$CLUSTER" >/dev/null 2>&1 || true
        sacctmgr -i -n add account mhar Cluster="$CLUSTER" Description=local Organization=local >/dev/null 2>&1 || true
        sacctmgr -i -n add user "$(id -un)" Account=mhar DefaultAccount=mhar >/dev/null 2>&1 || true
        sacctmgr -i -n add user "${SUDO_USER:-root}" Account=mhar DefaultAccount=mhar >/dev/null 2>&1 || true
    fi
    pid_alive "$RUN/slurmctld.pid" || slurmctld -c </dev/null >/dev/null 2>&1
    pid_alive "$RUN/slurmd.pid" || slurmd </dev/null >/dev/null 2>&1
    if ! wait_for "$WAIT_S" slurm cluster_ready; then
        tail -5 "$LOGS/slurmctld.log" "$LOGS/slurmd.log" >&2 || true
        die "the cluster did not become ready in ${WAIT_S}s (logs under $LOGS)"
    fi
    # a node left DOWN/DRAIN by an earlier run (ReturnToService=2 usually revives it)
    scontrol update NodeName="$(hostname -s)" State=RESUME >/dev/null 2>&1 || true
    say "running: $(sinfo --version), partitions $(sinfo -h -o %P | tr '\n' ' '), accounting=$acct"
}

stop_pid() {  # pid file: a name under $RUN, or an absolute path
    local f=$1 pid t=0
    case "$f" in /*) ;; *) f=$RUN/$f ;; esac
    [ -s "$f" ] || return 0
    pid=$(cat "$f")
    if kill -0 "$pid" 2>/dev/null; then
        kill "$pid" 2>/dev/null || true
        while kill -0 "$pid" 2>/dev/null && [ "$t" -lt 40 ]; do sleep 0.5; t=$((t + 1)); done
        kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$f"
}

cmd_stop() {
    need_root
    # jobs first (their processes belong to slurmd's steps), then the daemons
    if pid_alive "$RUN/slurmctld.pid"; then
        scancel --full --quiet --user="$(id -un)" 2>/dev/null || true
        scancel --full --quiet --partition=cpu,gpu 2>/dev/null || true
    fi
    stop_pid slurmd.pid
    stop_pid slurmctld.pid
    stop_pid slurmdbd.pid
    if [ -e "$RUN/mariadb.ours" ]; then stop_pid /run/mysqld/mhar.pid; rm -f "$RUN/mariadb.ours"; fi
    if [ -e "$RUN/munge.ours" ]; then
        [ -s /run/munge/munged.pid ] && kill "$(cat /run/munge/munged.pid)" 2>/dev/null || true
        rm -f "$RUN/munge.ours"
    fi
    say "stopped"
}

cmd_status() {
    local mode
    mode=$(running_mode)
    if [ -z "$mode" ]; then
        echo "not running"
        return 3
    fi
    echo "running (accounting=$mode): $(sinfo --version)"
    sinfo
}

case "${1:-}" in
    install) shift; cmd_install "$([ "${1:-}" = "--accounting" ] && echo 1 || echo 0)" ;;
    start) shift; cmd_start "$@" ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    *) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
