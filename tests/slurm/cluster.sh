#!/usr/bin/env bash
# A real single-node Slurm for the tests (issue 16), started without systemd.
#
#   tests/slurm/cluster.sh start DIR   # munged + slurmctld + slurmd; prints "SLURM_CONF=..."
#                                      # (a cluster already up in DIR is used as it is)
#   tests/slurm/cluster.sh status DIR  # exit 0 if it answers
#   tests/slurm/cluster.sh stop DIR
#
# Needs the Debian packages slurm-wlm and munge, and root (slurmd runs jobs as their
# users). The node has 4 fake GPUs (gres.conf File= entries on files in DIR: Slurm sets
# CUDA_VISIBLE_DEVICES from them) in partition "gpu" (MaxTime 60 min). Accounting without
# slurmdbd (and its database): Slurm 22.05 has no accounting_storage/filetxt any more, but
# its job completion log (JobCompType=jobcomp/filetxt) is what `sacct -c` reads, so ends
# come from sacct as on a cluster with slurmdbd. The controller forgets a finished job
# after 10 s (MinJobAge), so the tests see ends that only accounting still knows.
set -euo pipefail
cmd=${1:?start|stop}
dir=$(realpath -m "${2:?state dir}")
conf="$dir/slurm.conf"
host=$(hostname -s)

stop() {
    for pidfile in "$dir"/slurmd.pid "$dir"/slurmctld.pid "$dir"/munged.pid; do
        [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
    done
    for _ in $(seq 50); do
        pgrep -f "slurm(ctld|d) -f $conf" >/dev/null || break
        sleep 0.1
    done
}

if [ "$cmd" = stop ]; then stop; exit 0; fi
up() { SLURM_CONF="$conf" timeout 10 sinfo -h -o %t 2>/dev/null | grep -qE '^(idle|mix|alloc)'; }
if [ "$cmd" = status ]; then
    if [ -f "$conf" ] && up; then echo "SLURM_CONF=$conf"; exit 0; fi
    exit 1
fi

mkdir -p "$dir"/{state,spool,munge,log}
chmod 755 "$dir" "$dir/munge"  # (munged wants its socket's dir reachable by all)
# Character devices (like /dev/null): Slurm sets CUDA_VISIBLE_DEVICES only for device files.
for i in 0 1 2 3; do [ -c "$dir/nvidia$i" ] || { rm -f "$dir/nvidia$i"; mknod -m 666 "$dir/nvidia$i" c 1 3; }; done
# At least 8 CPUs whatever the machine has (config_overrides: slurmd takes the node as
# configured): the timeout test holds one for over a minute on its own test worker while
# the others run theirs beside it.
cpus=$(( $(nproc) > 8 ? $(nproc) : 8 ))
mem=$(awk '/MemTotal/ {print int($2 / 1024 / 2)}' /proc/meminfo)
cat >"$conf.new" <<CONF
ClusterName=gpulayer-test
SlurmctldHost=$host
SlurmctldPort=16817
SlurmdPort=16818
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CryptoType=crypto/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
SlurmdParameters=config_overrides
TaskPlugin=task/none
ReturnToService=2
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmdSpoolDir=$dir/spool
StateSaveLocation=$dir/state
SlurmUser=root
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
MinJobAge=10
KillWait=5
InactiveLimit=0
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/jobcomp.txt
AccountingStorageType=accounting_storage/none
PropagateResourceLimitsExcept=ALL
NodeName=$host CPUs=$cpus RealMemory=$mem Gres=gpu:4 State=UNKNOWN
PartitionName=gpu Nodes=$host Default=YES MaxTime=60 State=UP
CONF
cat >"$dir/gres.conf" <<CONF
Name=gpu File=$dir/nvidia[0-3]
CONF
cp "$dir/gres.conf" "$(dirname "$conf")/gres.conf" 2>/dev/null || true
if [ -f "$conf" ] && cmp -s "$conf.new" "$conf" && up; then
    # Already up with this configuration (another test worker, an earlier run): use it.
    rm -f "$conf.new"
    echo "SLURM_CONF=$conf"
    exit 0
fi
stop
mv "$conf.new" "$conf"
# munge: its own key and socket in DIR, so a system munged is not needed.
[ -f "$dir/munge/munge.key" ] || dd if=/dev/urandom bs=1 count=1024 of="$dir/munge/munge.key" 2>/dev/null
chmod 400 "$dir/munge/munge.key"
munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
    --pid-file="$dir/munged.pid" --log-file="$dir/log/munged.log" --seed-file="$dir/munge/seed"
export SLURM_CONF="$conf"
# A cluster started anew starts empty (-c: no saved jobs; the completion log with them):
# jobs an interrupted run left pending would otherwise come back, fail on their vanished
# log dirs and drain the one node.
: >"$dir/jobcomp.txt"
slurmctld -f "$conf" -c
slurmd -f "$conf"
for _ in $(seq 100); do
    if sinfo -h -o %t 2>/dev/null | grep -qE '^(idle|mix|alloc)'; then
        echo "SLURM_CONF=$conf"
        exit 0
    fi
    sleep 0.2
done
echo "slurm did not come up; see $dir/log" >&2
tail -n 20 "$dir"/log/*.log >&2 || true
exit 1
