#!/usr/bin/env bash
# A throw-away Slurm cluster on this host for cpprun's tests: munged, slurmctld and two slurmd
# ("n1", "n2", two fake GPUs each), all state under WORKDIR. Runs COMMAND against it (with
# SLURM_CONF exported) and exits with COMMAND's status.
#
#   unshare --mount --pid --net --fork --kill-child --mount-proc tests/slurm/slurm_cluster.sh WORKDIR COMMAND...
#
# Run it under unshare as above (the test does): the private mount namespace lets the node names
# resolve (a bind-mounted /etc/hosts, nothing changes on the host), the private PID namespace
# ends every daemon when this script ends, however it ends, and the private network namespace
# gives the cluster a loopback of its own, so two tests' clusters running at once never meet on
# Slurm's fixed ports (slurmctld 16817, slurmd 17001-2). Needs root (mknod, mount).
set -euo pipefail
D=$1
shift
N=2

if [ "$$" != 1 ]; then
  echo "slurm_cluster.sh: run me as PID 1 of a new PID namespace (see the header)" >&2
  exit 2
fi

# A new network namespace starts with its loopback down and no other interface. Slurm resolves
# names with AI_ADDRCONFIG, which finds nothing while the only IPv4 addresses are 127.x, so lo
# also gets one documentation address (TEST-NET-1; this namespace has no route anywhere else).
ip link set lo up
ip addr add 192.0.2.1/32 dev lo

mkdir -p "$D/munge" "$D/state" "$D/log"
chmod 755 "$D/munge"
# Slurm's node names must resolve on the nodes, as on a real cluster: here, in this mount
# namespace only.
{ cat /etc/hosts; echo "127.0.0.1 n1 n2"; } > "$D/hosts"
mount --bind "$D/hosts" /etc/hosts

dd if=/dev/urandom of="$D/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$D/munge/munge.key"
munged --force --socket="$D/munge/munge.sock" --key-file="$D/munge/munge.key" \
  --pid-file="$D/munge/munged.pid" --log-file="$D/munge/munged.log" \
  --seed-file="$D/munge/munged.seed"

cat > "$D/slurm.conf" <<CONF
ClusterName=cpprun
SlurmctldHost=localhost
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$D/munge/munge.sock
SlurmctldPort=16817
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool/%n
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd.%n.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
GresTypes=gpu
# Pending jobs (a requeued one) are scheduled within a second, not at the default 60 s pass.
SchedulerParameters=sched_interval=1
CONF
echo "AutoDetect=off" > "$D/gres.conf"
for i in $(seq 1 $N); do
  mkdir -p "$D/spool/n$i"
  # gres File= must be a device: character devices with /dev/null's numbers stand in for GPUs.
  for g in 0 1; do mknod "$D/n${i}gpu$g" c 1 3; done
  echo "NodeName=n$i NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((17000 + i)) CPUs=2 RealMemory=2000 Gres=gpu:2" >> "$D/slurm.conf"
  echo "NodeName=n$i Name=gpu File=$D/n${i}gpu[0-1]" >> "$D/gres.conf"
done
echo "PartitionName=debug Nodes=n[1-$N] Default=YES MaxTime=INFINITE State=UP" >> "$D/slurm.conf"

export SLURM_CONF=$D/slurm.conf
slurmctld -f "$SLURM_CONF"
for i in $(seq 1 $N); do slurmd -f "$SLURM_CONF" -N "n$i"; done
if ! timeout 30 bash -c "until [ \$(sinfo -h -N -t idle -o %N 2>/dev/null | wc -l) = $N ]; do sleep 0.2; done"; then
  echo "slurm_cluster.sh: the nodes did not come up within 30 s" >&2
  tail -n 20 "$D"/log/*.log >&2
  exit 3
fi

status=0
"$@" || status=$?
exit $status
