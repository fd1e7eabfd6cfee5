#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, to try the SLURM path (configs/slurm/train.sbatch, requeue on
# preemption) without a real cluster. CI runs it before the tests; tests/test_slurm.py skips without it.
#
#   sudo tests/slurm/start_cluster.sh        # Debian/Ubuntu: installs slurm and munge first if missing
#   CONFIG=configs/cifar10.yaml STRATEGY=configs/trainer/ddp_cpu.yaml sbatch --gpus-per-node 0 --nodes 1 \
#       --ntasks-per-node 2 --cpus-per-task 1 configs/slurm/train.sbatch --model.net SimpleCNN
#   squeue; tail -f slurm-train-*.out; scancel --signal=USR1 JOBID    # preempt it: it stops, requeues, resumes
#
# It writes /etc/slurm/slurm.conf for this machine (its hostname and CPUs, on 127.0.0.1), starts munge,
# slurmctld and slurmd, and waits until `sinfo` shows the node idle. A second call with the cluster up does
# nothing. A slurm.conf it did not write is left alone: the script then stops with an error.
set -euo pipefail

CONF=/etc/slurm/slurm.conf
MARK="# Written by tests/slurm/start_cluster.sh"
TIMEOUT=${TIMEOUT:-60}  # seconds to wait for the node

node_up() { sinfo -h -N -o '%t' 2>/dev/null | grep -qE '^(idle|mix|alloc)$'; }

if command -v sinfo >/dev/null && scontrol ping 2>/dev/null | grep -q UP && node_up; then
    exit 0  # already running
fi
if [[ $(id -u) != 0 ]]; then
    echo "error: starting SLURM needs root: sudo $0" >&2
    exit 1
fi

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v sinfo >/dev/null \
    || ! command -v munged >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq slurmctld slurmd slurm-client munge >/dev/null \
        || { apt-get update -qq && apt-get install -y -qq slurmctld slurmd slurm-client munge >/dev/null; }
fi

if [[ -f $CONF ]] && ! grep -qF "$MARK" "$CONF"; then
    echo "error: $CONF exists and was not written by this script: start that cluster instead" >&2
    exit 1
fi
# The node line as slurmd sees this machine (name, CPUs, sockets, cores), without its memory: memory is not
# scheduled here, and a RealMemory above what slurmd finds at start would drain the node.
NODE=$(slurmd -C | head -n 1 | sed 's/ RealMemory=[0-9]*//')
HOST=$(hostname -s)
SPOOL=/var/lib/slurm
mkdir -p /etc/slurm $SPOOL/slurmctld $SPOOL/slurmd /var/log/slurm
chown slurm:slurm $SPOOL/slurmctld /var/log/slurm
cat >"$CONF" <<EOF
$MARK: a one-node cluster on this machine.
ClusterName=local
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=slurm
AuthType=auth/munge
# A requeued job waits this long before it starts again (the job credential's lifetime, default 120 s).
AuthInfo=cred_expire=10
# Look for jobs to start every few seconds (a requeued job becomes eligible only at the next pass).
SchedulerParameters=sched_interval=2,bf_interval=2
StateSaveLocation=$SPOOL/slurmctld
SlurmdSpoolDir=$SPOOL/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
# No cgroups: processes are tracked by their parent ids (slurm 22.05 refuses CgroupPlugin=disabled, so
# there is no cgroup.conf at all).
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobRequeue=1
ReturnToService=2
MpiDefault=none
$NODE NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=local Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF

# The daemons, each only if not running yet.
if [[ ! -f /etc/munge/munge.key ]]; then
    mungekey --create
    chown munge:munge /etc/munge/munge.key
fi
pgrep -x munged >/dev/null || service munge start >/dev/null
pgrep -x slurmctld >/dev/null || slurmctld
pgrep -x slurmd >/dev/null || slurmd

for _ in $(seq "$TIMEOUT"); do
    if [[ $(sinfo -h -N -o '%t' 2>/dev/null) == idle ]]; then
        sinfo
        exit 0
    fi
    sleep 1
done
echo "error: SLURM node not idle after ${TIMEOUT}s: see /var/log/slurm/slurmctld.log and slurmd.log" >&2
sinfo >&2 || true
exit 1
