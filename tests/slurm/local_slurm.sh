#!/usr/bin/env bash
# A real single-node Slurm on this machine for the job-script tests: munged, slurmctld and slurmd
# from Debian's packages, state in one directory, the node declared with more CPUs than the machine
# has (SlurmdParameters=config_overrides) so 4-rank studies fit on 2 cores.
#   tests/slurm/local_slurm.sh start DIR   # prints SLURM_CONF=DIR/slurm.conf on success
#   tests/slurm/local_slurm.sh stop DIR
# Exit code 77 (with the reason) when Slurm cannot start here: no packages, not root.
set -euo pipefail
cmd=${1:?start|stop}
dir=$(mkdir -p "${2:?state directory}" && cd "$2" && pwd)
conf=$dir/slurm.conf

stop() {
    for pidfile in "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munged.pid"; do
        if [ -s "$pidfile" ]; then
            kill "$(cat "$pidfile")" 2>/dev/null || true
        fi
    done
    for _ in $(seq 50); do
        alive=0
        for pidfile in "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munged.pid"; do
            [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null && alive=1
        done
        [ "$alive" = 0 ] && break
        sleep 0.2
    done
    rm -f "$dir"/*.pid
}

if [ "$cmd" = stop ]; then
    stop
    exit 0
fi

for exe in munged slurmctld slurmd sbatch squeue; do
    command -v "$exe" >/dev/null || { echo "cannot start Slurm: $exe not installed (scripts/setup installs slurmctld, slurmd, munge, slurm-client)" >&2; exit 77; }
done
[ "$(id -u)" = 0 ] || { echo "cannot start Slurm: the test Slurm runs its daemons as root" >&2; exit 77; }
stop

host=$(hostname -s)
mkdir -p "$dir/state" "$dir/spool" "$dir/munge"
# munge: a key of our own, its socket in our directory.
[ -s "$dir/munge/munge.key" ] || dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
chmod 0400 "$dir/munge/munge.key"
socket=$dir/munge/munge.socket
munged --force --key-file="$dir/munge/munge.key" --socket="$socket" \
    --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" --seed-file="$dir/munge/seed"

cat > "$conf" <<CONF
ClusterName=trainscope-test
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$socket
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
SlurmctldPort=${TRAINSCOPE_SLURMCTLD_PORT:-16817}
SlurmdPort=${TRAINSCOPE_SLURMD_PORT:-16818}
ReturnToService=2
SlurmdParameters=config_overrides
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=$host CPUs=8 Boards=1 SocketsPerBoard=1 CoresPerSocket=8 ThreadsPerCore=1 RealMemory=8000 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
cat > "$dir/cgroup.conf" <<CONF
CgroupPlugin=cgroup/v1
CONF

export SLURM_CONF=$conf
slurmctld -f "$conf"
slurmd -f "$conf"
for _ in $(seq 100); do
    if sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
        echo "SLURM_CONF=$conf"
        exit 0
    fi
    sleep 0.2
done
echo "cannot start Slurm: the node did not come up in 20 s; logs in $dir (slurmctld.log, slurmd.log)" >&2
sinfo >&2 || true
tail -n 5 "$dir/slurmctld.log" "$dir/slurmd.log" >&2 || true
stop
exit 77
