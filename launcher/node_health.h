// Node health: the built-in checks an agent runs before every join of a round
// (agent/health/health_check.h), taken from what `cpprun --check` reads (launcher/preflight.h), but
// only what can change while a job runs and would break this node's part of it:
//   GPUs        when the job uses GPUs: the CUDA driver answers and sees at least as many
//               devices as the node's list (a GPU fallen off the bus, a driver in a bad state)
//   network     when the job uses GPUs or NCCL_SOCKET_IFNAME is set: an interface NCCL would use
//               is up (NCCL_SOCKET_IFNAME's, else NCCL's default order), and without
//               NCCL_SOCKET_IFNAME no ib* interface is down while NCCL would fall back to
//               another; every interface GLOO_SOCKET_IFNAME names exists and is up
//   directories --log-dir and every --health-check-dirs directory exists (made when missing,
//               as the agent makes its log directory) and takes a new file (a read-only
//               remount, a full disk, a lost mount)
// Configuration mistakes that never change while the job runs (a loopback interface in a
// multi-node job, a missing program) stay --check's: they are not health.
//
// Thread safety: the returned function reads process-wide state (the driver, getifaddrs, the
// file system); it runs on the health check's own thread, one run at a time.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "agent/health/health_check.h"
#include "launcher/launch_config.h"
#include "launcher/node_resources.h"
#include "launcher/preflight.h"

namespace cpprun::launcher {

// The problems found by the network part on `interfaces` (pure; for tests).
std::vector<std::string> checkNodeNetwork(const std::vector<NetworkInterface>& interfaces,
                                          const std::map<std::string, std::string>& env,
                                          bool uses_gpus);

// Whether `dir` takes a new file (made when missing): empty, or the problem.
std::string checkWritableDirectory(const std::string& dir);

agent::BuiltinHealthCheck makeBuiltinHealthCheck(const LaunchConfig& config,
                                                 const NodeResources& node,
                                                 const std::map<std::string, std::string>& env);

}  // namespace cpprun::launcher
