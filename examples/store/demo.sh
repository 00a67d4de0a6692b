#!/usr/bin/env bash
# The main job until the launcher lands: cpprun-store serves the rendezvous store, and N PyTorch
# workers (default 2) that were written for torchrun bootstrap from it with env:// and
# TORCHELASTIC_USE_AGENT_STORE=True, exactly as they would under torchrun's agent, then
# all-reduce over gloo. Everything runs on 127.0.0.1 and ends when the workers do.
#
# Usage: examples/store/demo.sh [BUILD_DIR] [WORKERS]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:-$here/../../build}"
workers="${2:-2}"
python=/usr/bin/python3   # Debian's interpreter, which sees python3-torch

exec 3< <(exec "$build/cpprun-store" --host 127.0.0.1 --port 0)
store_pid=$!
pids=()
cleanup() {
  [ ${#pids[@]} -gt 0 ] && kill "${pids[@]}" 2>/dev/null
  kill "$store_pid" 2>/dev/null || true
  wait "$store_pid" 2>/dev/null || true
}
trap cleanup EXIT
# The store prints its address once it accepts connections.
read -r -t 30 line <&3 || { echo "demo: cpprun-store did not start" >&2; exit 1; }
echo "$line"
port=${line##*:}

for rank in $(seq 0 $((workers - 1))); do
  MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=$rank LOCAL_RANK=$rank WORLD_SIZE=$workers \
  TORCHELASTIC_USE_AGENT_STORE=True TORCHELASTIC_RESTART_COUNT=0 GLOO_SOCKET_IFNAME=lo \
    "$python" "$here/allreduce_worker.py" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
pids=()
if [ $status -eq 0 ]; then echo "demo: $workers workers finished"; else echo "demo: a worker failed" >&2; fi
exit $status
