"""The peer of launch_bench: torch 1.13's elastic launcher, called as torchrun calls it.

    /usr/bin/python3 torch_elastic_launch.py --nproc N --port P [--max-restarts K]
        [--monitor-interval S] [--rdzv-backend static|c10d] [--run-id ID] [--nnodes N]
        -- PROGRAM ARGS...

Does what torch/distributed/run.py (torchrun) does for `torchrun --no_python
--nproc_per_node=N --master_addr=127.0.0.1 --master_port=P PROGRAM ARGS`: builds the same
LaunchConfig (static rendezvous with rank 0 by default, endpoint 127.0.0.1:P, monitor_interval
5 s, start_method spawn, OMP_NUM_THREADS=1 when N > 1) and calls
elastic_launch(config, entrypoint=PROGRAM)(*ARGS). Debian's `torchrun` script itself does not
start under Python 3.11, hence this shim; run it with /usr/bin/python3 (Debian's python3-torch).

With the static backend (torchrun's default) the agent hosts the TCPStore at the endpoint and the
workers get MASTER_ADDR:MASTER_PORT = that store and TORCHELASTIC_USE_AGENT_STORE=True, which is
what cpprun does. Exit status: 0 when every worker succeeded, 1 when the workers failed (as
torchrun), 2 on a bad argument.
"""

import argparse
import os
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nproc", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--addr", default="127.0.0.1")
    parser.add_argument("--max-restarts", type=int, default=0)
    # torchrun's default (run.py: --monitor_interval default=5); LaunchConfig's own is 30.
    parser.add_argument("--monitor-interval", type=float, default=5.0)
    parser.add_argument("--rdzv-backend", choices=["static", "c10d"], default="static")
    parser.add_argument("--run-id", default="none")  # torchrun's --rdzv_id default
    # Agents in the job (torchrun --nnodes N): with c10d, every agent runs this shim and the
    # first to bind the endpoint hosts the store (rendezvous_bench).
    parser.add_argument("--nnodes", type=int, default=1)
    parser.add_argument("program")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    a = parser.parse_args()

    # torchrun sets this in its own environment before launching (run.py config_from_args).
    if "OMP_NUM_THREADS" not in os.environ and a.nproc > 1:
        os.environ["OMP_NUM_THREADS"] = "1"

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    rdzv_configs = {"rank": 0} if a.rdzv_backend == "static" else {}
    config = LaunchConfig(
        min_nodes=a.nnodes,
        max_nodes=a.nnodes,
        nproc_per_node=a.nproc,
        run_id=a.run_id,
        role="default",
        rdzv_endpoint=f"{a.addr}:{a.port}",
        rdzv_backend=a.rdzv_backend,
        rdzv_configs=rdzv_configs,
        max_restarts=a.max_restarts,
        monitor_interval=a.monitor_interval,
        start_method="spawn",
    )
    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    try:
        elastic_launch(config=config, entrypoint=a.program)(*args)
    except ChildFailedError as e:
        print(f"torch_elastic_launch: workers failed:\n{e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
