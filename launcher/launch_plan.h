// LaunchPlan: the workers one agent starts for one attempt — each worker's command line and
// the environment torchrun would give it — computed from the LaunchConfig, this node's
// resources and the outcome of the rendezvous. Pure: no processes, no network. `cpprun
// --dry-run` prints it; the agent spawns it.
//
// The environment contract is torchrun's (docs/environment.md): RANK, LOCAL_RANK, WORLD_SIZE,
// LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, ROLE_NAME, ROLE_RANK, ROLE_WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT, TORCHELASTIC_* and the NCCL error-handling switches, plus
// CUDA_VISIBLE_DEVICES, OMP_NUM_THREADS (when unset) and CPPRUN_NCCL_UNIQUE_ID (when known).
// Thread safety: pure functions on values.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "agent/local_agent.h"
#include "agent/supervision/worker_spec.h"
#include "common/status.h"
#include "launcher/launch_config.h"
#include "launcher/node_resources.h"
#include "launcher/rendezvous_settings.h"
#include "launcher/scheduler_env.h"

namespace cpprun::launcher {

// What the rendezvous decided for this agent in this attempt.
struct RendezvousOutcome {
  int group_rank = 0;        // this node's rank among the agents
  int group_world_size = 1;  // number of agents
  int base_rank = 0;         // global rank of this node's local rank 0
  int world_size = 1;        // workers in the whole job
  std::string master_addr;   // the store the workers bootstrap from
  int master_port = 0;
  std::string run_id;
  int restart_count = 0;           // attempt number, 0 first
  std::string nccl_unique_id_hex;  // empty when NCCL is not available
  // Comma-joined ids for ncclCommInitRankScalable, above CPPRUN_NCCL_RANKS_PER_ID ranks only.
  std::string nccl_unique_ids_hex;
};

// What the rendezvous decided for the attempt the agent prepares (`context`): the nodes'
// agreement on several nodes, else node 0 of 1 whose `nproc` workers are the whole world.
RendezvousOutcome rendezvousOutcome(const std::string& run_id, int nproc,
                                    const agent::AttemptContext& context);

// The first attempt as `cpprun --dry-run` shows it, as if this node came first: node
// --node-rank of --max-nodes with ranks from 0 and a world of its `nproc` workers, the store of
// the settings, and a placeholder NCCL id when the agent would make one (`makes_nccl_id`).
agent::AttemptContext dryRunAttempt(const LaunchConfig& config, const RendezvousSettings& rdzv,
                                    int nproc, bool makes_nccl_id);

// One worker: ranks, command line, and the variables cpprun sets or overrides (the worker
// inherits the rest of the agent's environment).
using WorkerPlan = agent::WorkerSpec;

struct LaunchPlan {
  int nproc = 0;
  std::vector<WorkerPlan> workers;
  // Human-readable notes about choices made (e.g. OMP_NUM_THREADS), one per line.
  std::vector<std::string> notes;
};

// Resolves --nproc-per-node against the node: a number, the GPU count (error when there is
// none, naming the driver's error when it fails, or why CUDA_VISIBLE_DEVICES hides them), the
// usable CPUs, or auto (GPUs if any, else CPUs). An error too when the count is over a limit
// (launch_limits.h: per node, the world size of --nnodes such nodes, the node's descriptor and
// process limits) or --virtual-local-rank asks for more workers than there are GPUs.
Result<int> resolveNproc(const LaunchConfig& config, const NodeResources& node);

// The worker's command line for `local_rank`: PYTHON -u SCRIPT or PYTHON -u -m MODULE (PYTHON:
// PYTHON_EXEC, else the Python environment cpprun is installed in, else python3 —
// python_interpreter.h), or the entry point itself with --no-python or when it is
// not a .py file. "${local_rank}" in arguments becomes the local rank.
std::vector<std::string> workerCommand(const LaunchConfig& config,
                                       const std::map<std::string, std::string>& agent_env,
                                       int local_rank);

// torch's FileTimer watchdog, read as torchrun reads it: on when TORCHELASTIC_ENABLE_FILE_TIMER
// is exactly "1"; then the pipe is TORCHELASTIC_TIMER_FILE when set (and not empty), else
// "<run_dir>/watchdog_timer" (made absolute). nullopt when off.
std::optional<std::string> fileTimerPath(const std::map<std::string, std::string>& agent_env,
                                         const std::string& run_dir);

// REQUIRES: the rendezvous outcome is consistent (base_rank + nproc <= world_size).
// `run_dir` is the attempt's log directory root (error files live under it). With the FileTimer
// watchdog on, every worker gets TORCHELASTIC_TIMER_FILE (fileTimerPath).
Result<LaunchPlan> makeLaunchPlan(const LaunchConfig& config, const NodeResources& node,
                                  const RendezvousOutcome& rdzv,
                                  const std::map<std::string, std::string>& agent_env,
                                  const std::string& run_dir);

// The plan as `cpprun --dry-run` prints it.
std::string describeLaunchPlan(const LaunchConfig& config, const NodeResources& node,
                               const RendezvousOutcome& rdzv, const LaunchPlan& plan);

// All `cpprun --dry-run` prints: the plan (describeLaunchPlan), then the scheduler found
// (`scheduler`, empty: none), where each option came from, and how the rendezvous will go.
std::string describeDryRun(const LaunchConfig& config, const RendezvousSettings& settings,
                           const NodeResources& node, const RendezvousOutcome& rdzv,
                           const LaunchPlan& plan, const std::string& scheduler,
                           const Provenance& provenance);

}  // namespace cpprun::launcher
