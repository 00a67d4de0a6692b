// The sizes cpprun accepts: nodes, workers per node and the job's world size, checked while the
// command line and the environment are read — before anything is allocated per node or per
// worker, or forked. A size over its bound is a usage error (exit 2) naming the flag or variable
// it came from, the value, the bound and what to do. docs/operations.md ("Size limits") gives
// the reasons for each bound.
//
// Absolute bounds (the same on every machine):
//   nodes            65,536     Slurm's own bound on the hosts of one hostlist (MAX_SLURM_NODES,
//                               launcher/hostlist.h); every agent holds a connection and a
//                               keep-alive key in node 0's store, and a round's member list is one
//                               value with an entry per node.
//   workers per node  4,096     5x the CPUs of today's largest two-socket node (2 x 192 cores x 2
//                               threads); a node runs one worker per GPU or per CPU.
//   world size     1,048,576    65,536 nodes x 16 GPUs. Every worker connects to the agent store
//                               on node 0, and Linux's default fs.nr_open (1,048,576) caps the
//                               descriptors one process can hold.
// Bounds from this node's limits (ProcessLimits), checked against the workers it would start:
//   descriptors      the agent holds per worker the read ends of its stdout and stderr pipes
//                    (2), its log files when -r/-t send output to files (0-2), and the worker's
//                    store connections when the agent serves the store (torch opens up to 2;
//                    counted on every node, since the rendezvous picks the node that serves it):
//                    at most 6, plus kAgentOwnDescriptors for itself. The bound is
//                    RLIMIT_NOFILE's hard limit: cpprun raises the soft limit to it before it
//                    starts the agent. (The node that serves a multi-node job's store also holds
//                    the other nodes' workers' connections; `cpprun --check` counts those.)
//   processes        RLIMIT_NPROC (soft), when the kernel enforces it (not for root).
//
// Thread safety: constants and pure functions; currentProcessLimits() reads this process's
// limits.
#pragma once

#include <cstdint>
#include <string>

#include "common/job_limits.h"
#include "common/status.h"
#include "launcher/launch_config.h"

namespace cpprun::launcher {

// common/job_limits.h: the agent reads store records against the same bounds.
using ::cpprun::kMaxNodes;
using ::cpprun::kMaxWorkersPerNode;
using ::cpprun::kMaxWorldSize;

// Descriptors the agent holds whatever the worker count: stdio, its event loop (epoll, signal,
// timer and wake-up descriptors), the store's and the metrics' listeners, its own store client
// and the agents' connections a small job brings, /dev/null for the workers' stdin, the event
// log, a spawn's transient pipes, NCCL's bootstrap socket, and room for the libraries it loads.
inline constexpr uint64_t kAgentOwnDescriptors = 64;

// This node's limits on what the agent may hold and start. A value of kUnlimited: no bound.
struct ProcessLimits {
  static constexpr uint64_t kUnlimited = UINT64_MAX;
  uint64_t open_files = kUnlimited;  // RLIMIT_NOFILE, hard limit
  uint64_t processes = kUnlimited;   // RLIMIT_NPROC, soft limit; kUnlimited when not enforced
};

// The limits of this process (RLIMIT_NPROC counts as unlimited for root, which the kernel does
// not hold to it).
ProcessLimits currentProcessLimits();

// Descriptors the agent holds for each worker of this job (see above).
uint64_t agentDescriptorsPerWorker(const LaunchConfig& config);

// Where `option`'s value came from, as an error names it: "--nnodes", "PET_NNODES (--nnodes)",
// "SLURM_NTASKS=4", or "--nnodes (default)".
std::string sourceOf(const LaunchConfig& config, const std::string& option);

// 1048576 -> "1,048,576", as the limits' messages spell counts.
std::string formatCount(uint64_t n);

// Checks `nproc` workers on this node (`what` says how nproc was found, e.g. "--nproc-per-node
// gpu: 8 GPUs") against the absolute bounds, the world size of config.max_nodes such nodes,
// and `limits`.
Status checkWorkerCount(const LaunchConfig& config, int nproc, const std::string& what,
                        const ProcessLimits& limits);

}  // namespace cpprun::launcher
