#!/bin/bash
# One cpprun agent per node under Open MPI's mpirun, one worker per GPU of each node.
#
#   examples/mpi/cpprun-mpirun.sh -H node1,node2 -- train.py --epochs 10
#
# mpirun gives every agent its rank and the number of agents (OMPI_COMM_WORLD_RANK/SIZE); the
# rendezvous endpoint cannot come from mpirun, so MASTER_ADDR (this host, where rank 0 runs
# first with --map-by ppr:1:node) and MASTER_PORT are exported to every rank with -x.
# --bind-to none: mpirun would otherwise bind each agent, and so all of its workers, to one core.
set -euo pipefail

CPPRUN=${CPPRUN:-cpprun}
# One agent per node; MPIRUN_MAP_BY=slot puts several on one host (tests, a workstation).
MPIRUN_MAP_BY=${MPIRUN_MAP_BY:-ppr:1:node}
MASTER_PORT=${MASTER_PORT:-29500}
mpirun_args=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  mpirun_args+=("$1")
  shift
done
[ "${1:-}" = "--" ] && shift

exec mpirun --map-by "$MPIRUN_MAP_BY" --bind-to none "${mpirun_args[@]}" \
  -x MASTER_ADDR="${MASTER_ADDR:-$(hostname)}" -x MASTER_PORT="$MASTER_PORT" \
  "$CPPRUN" --nproc-per-node="${CPPRUN_NPROC:-gpu}" "$@"
