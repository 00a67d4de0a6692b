// The absolute sizes of a job cpprun accepts: nodes, workers per node, the world size. The
// launcher checks its command line and environment against them (launcher/launch_limits.h says
// why each is what it is); the agent holds every record it reads from a store to the same
// bounds (agent/coordination/job_keys.h), so a record cannot ask for what the command line
// could not.
//
// Thread safety: constants.
#pragma once

namespace cpprun {

inline constexpr int kMaxNodes = 65536;
inline constexpr int kMaxWorkersPerNode = 4096;
inline constexpr int kMaxWorldSize = 1 << 20;

}  // namespace cpprun
