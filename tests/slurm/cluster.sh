#!/usr/bin/env bash
# A real SLURM for the tests: Debian's packages (munge, slurmctld, slurmd, slurm-client), two nodes
# on this host, three fake GPUs each, no accounting database.
#
#   bash tests/slurm/cluster.sh up      # install (once), configure, start, wait until both nodes are idle
#   bash tests/slurm/cluster.sh down    # stop what `up` started, remove the fake GPU device nodes
#   bash tests/slurm/cluster.sh status  # exit 0 when both nodes answer
#
# It needs root on Debian or Ubuntu (apt-get): elsewhere it refuses with one line and exits 2, and the
# tests that need it skip with that line (they fail instead when CI=true). A failure where it could
# run (a package, a daemon, nodes not idle) stops what it started and exits 1: the tests then fail. It writes
# /etc/slurm/slurm.conf and gres.conf (refusing to overwrite ones it did not write), and keeps its
# state, logs and pid files under $RLPIPE_SLURM_DIR (default /var/lib/rlpipe-slurm).
#
# The two nodes are two `slurmd -N NAME` daemons on this host, each with its own port, spool
# directory, pid file and log (%n), each declaring the whole host's CPUs and memory (SLURM then
# schedules up to twice the host; the workflow's --jobs and --resources keep it in bounds). GPUs are
# device nodes made with `mknod /dev/nvidiaN c 195 N` and named in gres.conf: SLURM hands them out
# and sets CUDA_VISIBLE_DEVICES (numbered from 0 on each node), and nothing can compute on them.
# There is no slurmdbd (AccountingStorageType=accounting_storage/none), as on many small clusters:
# `sacct` answers "Slurm accounting storage is disabled" and job status comes from `squeue`, which
# sees a finished job for MinJobAge seconds.
set -uo pipefail

DIR=${RLPIPE_SLURM_DIR:-/var/lib/rlpipe-slurm}
CONF=/etc/slurm/slurm.conf
MARK="# written by rlpipe tests/slurm/cluster.sh"
NODES=(rlnode1 rlnode2)
PORTS=(17001 17002)
GPUS_PER_NODE=3  # the smoke run may hold 4 (two 2-GPU jobs): SLURM has room for more (tests/slurm_harness.py)
PACKAGES=(munge slurmctld slurmd slurm-client)

refuse() { echo "tests/slurm/cluster.sh: $*" >&2; exit 2; }  # cannot run here: the tests skip (fail in CI)
fail() { echo "tests/slurm/cluster.sh: $*" >&2; down >/dev/null 2>&1; exit 1; }  # could run, did not: stop what started
log() { echo "slurm: $*" >&2; }

preflight() {
    [ "$(id -u)" -eq 0 ] || refuse "needs root to install and start SLURM's daemons (running as $(id -un))"
    command -v apt-get >/dev/null || refuse "needs a Debian or Ubuntu machine (no apt-get here)"
    if [ -e "$CONF" ] && ! grep -qF "$MARK" "$CONF"; then
        refuse "$CONF exists and was not written by this script; not touching a real cluster's config"
    fi
}

install_packages() {
    local missing=()
    for p in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    log "installing ${missing[*]} from the distribution's packages"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >"$DIR/apt.log" 2>&1 &&
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >>"$DIR/apt.log" 2>&1 ||
        { tail -5 "$DIR/apt.log" >&2; fail "apt-get could not install ${missing[*]} (log: $DIR/apt.log)"; }
}

write_config() {
    local host cpus mem
    host=$(hostname -s)
    cpus=$(nproc)
    mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))  # MB, 1 GB left to the OS
    mkdir -p "$DIR/ctld" "$DIR/log" "$DIR/run" /etc/slurm
    for n in "${NODES[@]}"; do mkdir -p "$DIR/spool/$n"; done
    cat >"$CONF" <<EOF
$MARK
ClusterName=rlpipe
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$DIR/ctld
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
MpiDefault=none
ReturnToService=2
GresTypes=gpu
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MinJobAge=300
KillWait=30
OverTimeLimit=0
InactiveLimit=0
SlurmdTimeout=120
NodeName=${NODES[0]} NodeHostname=$host NodeAddr=127.0.0.1 Port=${PORTS[0]} CPUs=$cpus RealMemory=$mem Gres=gpu:$GPUS_PER_NODE State=UNKNOWN
NodeName=${NODES[1]} NodeHostname=$host NodeAddr=127.0.0.1 Port=${PORTS[1]} CPUs=$cpus RealMemory=$mem Gres=gpu:$GPUS_PER_NODE State=UNKNOWN
PartitionName=debug Nodes=${NODES[0]},${NODES[1]} Default=YES MaxTime=INFINITE State=UP
EOF
    cat >/etc/slurm/gres.conf <<EOF
$MARK
NodeName=${NODES[0]} Name=gpu File=/dev/nvidia[0-$((GPUS_PER_NODE - 1))]
NodeName=${NODES[1]} Name=gpu File=/dev/nvidia[$GPUS_PER_NODE-$((2 * GPUS_PER_NODE - 1))]
EOF
}

fake_gpus() {
    for i in $(seq 0 $((2 * GPUS_PER_NODE - 1))); do
        [ -e "/dev/nvidia$i" ] && continue
        mknod "/dev/nvidia$i" c 195 "$i" && echo "/dev/nvidia$i" >>"$DIR/run/fake_devices"
    done
}

start_daemons() {
    mkdir -p /run/munge && chown munge:munge /run/munge && chmod 0755 /run/munge
    if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/munged.pid ||
            fail "munged did not start"
        echo started >"$DIR/run/munged.ours"
    fi
    /usr/sbin/slurmctld -c -f "$CONF" || fail "slurmctld did not start (log: $DIR/log/slurmctld.log)"
    for n in "${NODES[@]}"; do
        /usr/sbin/slurmd -N "$n" -f "$CONF" || fail "slurmd -N $n did not start (log: $DIR/log/slurmd-$n.log)"
    done
}

wait_idle() {
    local deadline=$((SECONDS + ${RLPIPE_SLURM_WAIT_S:-90})) states
    while [ $SECONDS -lt $deadline ]; do
        states=$(sinfo -h -N -o '%N %t' 2>/dev/null | sort -u)
        if [ "$(grep -c ' idle$' <<<"$states")" -eq ${#NODES[@]} ]; then return 0; fi
        sleep 1
    done
    fail "the nodes are not idle after ${RLPIPE_SLURM_WAIT_S:-90} s: $(tr '\n' ' ' <<<"$states")(logs: $DIR/log)"
}

# up: every node answers and takes jobs (comp: still ending a job it ran, as after a test's scancel)
status() { [ "$(sinfo -h -N -o '%N %t' 2>/dev/null | grep -cE ' (idle|mix|alloc|comp)$')" -ge ${#NODES[@]} ]; }

stop_pid() {  # a daemon we started, by the pid in its pid file; SIGKILL after 10 s
    local f=$1 pid
    [ -s "$f" ] || return 0
    pid=$(cat "$f")
    kill "$pid" 2>/dev/null || { rm -f "$f"; return 0; }
    for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -9 "$pid" 2>/dev/null
    rm -f "$f"
}

down() {
    [ -f "$CONF" ] && grep -qF "$MARK" "$CONF" || { log "no cluster of ours to stop"; return 0; }
    scancel --full --user=root 2>/dev/null
    for n in "${NODES[@]}"; do stop_pid "$DIR/run/slurmd-$n.pid"; done
    stop_pid "$DIR/run/slurmctld.pid"
    if [ -f "$DIR/run/munged.ours" ]; then stop_pid /run/munge/munged.pid; rm -f "$DIR/run/munged.ours"; fi
    if [ -f "$DIR/run/fake_devices" ]; then xargs -r rm -f <"$DIR/run/fake_devices"; rm -f "$DIR/run/fake_devices"; fi
    log "stopped"
}

up() {
    preflight
    mkdir -p "$DIR/run"
    if [ -f "$CONF" ] && status; then log "already up: $(sinfo -h -N -o '%N/%t' | sort -u | tr '\n' ' ')"; return 0; fi
    local t0=$SECONDS
    install_packages
    write_config
    fake_gpus
    start_daemons
    wait_idle
    log "up in $((SECONDS - t0)) s: nodes ${NODES[*]} idle, gpu:$GPUS_PER_NODE each, partition debug, no accounting"
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    status) status ;;
    *) echo "usage: $0 up|down|status" >&2; exit 64 ;;
esac
