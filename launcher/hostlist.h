// Slurm's hostlist and task-count grammars, expanded in process (never by calling scontrol).
//
// expandHostlist("node[01-04,07],gpu-[1-3]a") -> node01 node02 node03 node04 node07 gpu-1a
// gpu-2a gpu-3a, following SchedMD's src/common/hostlist.c (docs/rendezvous.md, "Slurm
// hostlists"): tokens split on ',', ' ', '\t' and '\n' outside brackets; a token is split at its
// last '[' into prefix, ranges and suffix; a prefix with its own bracket groups expands as a
// cartesian product, leftmost group slowest; a range's zero padding is the width of its low
// bound; order and duplicates are kept.
//
// expandTaskCounts("2(x3),1") -> 2 2 2 1 (SLURM_TASKS_PER_NODE, SLURM_JOB_CPUS_PER_NODE).
//
// Thread safety: pure functions.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace cpprun::launcher {

// At most this many hosts come out of one hostlist (Slurm's MAX_SLURM_NODES per range).
inline constexpr size_t kMaxHostlistHosts = 65536;

// The hosts of `hostlist`, in order. An error names the offending token and why.
Result<std::vector<std::string>> expandHostlist(const std::string& hostlist);

// The per-node counts of a Slurm count list ("2(x3),1"). An error names the bad element.
Result<std::vector<int>> expandTaskCounts(const std::string& counts);

}  // namespace cpprun::launcher
