// Preflight: `cpprun --check [the options of a run]` — what would break the job on this node,
// found before it starts: the program, the GPUs and the CUDA driver, NCCL, the network
// interfaces NCCL and gloo would pick, the rendezvous endpoint, the open-file limit against the
// job's size, and the CPU/NUMA layout the workers get. Each finding is ok, a warning (the job
// may run; the text says what to watch) or a failure (the job would not run as configured).
//
// The checks are pure functions of a SystemFacts snapshot, so tests can give any machine;
// probeSystem() takes the snapshot of this one.
// Thread safety: pure functions on values; probeSystem() reads process-wide state (call it from
// one thread).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "launcher/launch_config.h"
#include "launcher/node_resources.h"
#include "launcher/rendezvous_settings.h"

namespace cpprun::launcher {

struct NetworkInterface {
  std::string name;
  std::string address;  // numeric, IPv4 or IPv6
  bool ipv6 = false;
  bool up = false;
  bool loopback = false;
};

struct NumaNode {
  int id = 0;
  std::vector<int> cpus;  // only those in the agent's affinity mask
};

// What the checks look at, taken once.
struct SystemFacts {
  std::string hostname;
  // CUDA driver (libcuda.so.1, launcher/cuda_driver.h): empty error when it answered.
  std::string cuda_error;
  bool cuda_installed = false;                // it loaded (cuda_error: how it then failed)
  int cuda_driver_version = 0;                // e.g. 12040 for 12.4
  std::vector<std::string> gpu_names;         // every device the driver sees, in its order
  std::vector<std::string> gpu_bus_ids;       // per device, "0000:1B:00.0"; empty when unknown
  std::vector<int> gpu_numa_nodes;            // per device, -1 when unknown
  std::string nccl_library = "libnccl.so.2";  // what was loaded (CPPRUN_NCCL_LIBRARY)
  std::string nccl_error;                     // empty when it loaded and has ncclGetUniqueId
  int nccl_version = 0;                       // e.g. 22809 for 2.28.9
  std::vector<NetworkInterface> interfaces;   // every address of every interface
  // What the host name resolves to (first address), empty when it does not resolve.
  std::string hostname_address;
  uint64_t open_file_soft_limit = 0;  // after cpprun raised it to the hard limit
  uint64_t open_file_hard_limit = 0;
  std::vector<NumaNode> numa;
  // The endpoint: resolved address (empty: does not resolve), bind and connect results.
  std::string endpoint_address;
  std::string endpoint_resolve_error;
  std::optional<std::string> endpoint_bind_error;     // probed on the node that serves the store
  std::optional<std::string> endpoint_connect_error;  // probed on the others
  bool endpoint_is_local = false;
  // The worker program: the resolved executable (empty: not found) and, for a script, whether
  // the file exists.
  std::string program_path;
  std::string program_error;
  // Operations (--stall-timeout, --metrics-port, --event-log): gdb on PATH (empty: none), and
  // whether the metrics port binds and the event log opens (set only when asked for).
  std::string gdb_path;
  std::optional<std::string> metrics_bind_error;
  std::optional<std::string> event_log_error;
};

enum class CheckLevel { kOk, kWarn, kFail };

struct CheckFinding {
  CheckLevel level = CheckLevel::kOk;
  std::string topic;  // "GPUs", "NCCL", "rendezvous", ...
  std::string text;
};

struct PreflightReport {
  std::vector<CheckFinding> findings;
  int failures() const;
  int warnings() const;
  std::string format(const std::string& title) const;
};

// NCCL's choice of socket interface (NCCL_SOCKET_IFNAME: comma-separated prefixes, "^" to
// exclude, "=" for exact names; unset: "ib*" first, then any but docker* and lo, then docker*,
// then lo). IPv4 first unless NCCL_SOCKET_FAMILY=AF_INET6. Empty when nothing matches.
std::optional<NetworkInterface> ncclSocketInterface(const std::vector<NetworkInterface>& ifaces,
                                                    const std::map<std::string, std::string>& env);

// Estimated open files a worker and the agent need for a job of `world_size` workers with
// `nproc` on this node (documented in docs/troubleshooting.md).
uint64_t workerOpenFilesNeeded(int world_size);
uint64_t agentOpenFilesNeeded(int world_size, int nproc, bool serves_store);

// Every address of every interface of this machine, as --check lists them (getifaddrs).
std::vector<NetworkInterface> networkInterfaces();

// True when this agent serves the rendezvous store (node 0 / the endpoint's host).
bool servesStore(const RendezvousSettings& rdzv);

SystemFacts probeSystem(const LaunchConfig& config, const RendezvousSettings& rdzv,
                        const std::map<std::string, std::string>& env);

PreflightReport runPreflight(const LaunchConfig& config, const RendezvousSettings& rdzv,
                             const NodeResources& node, int nproc,
                             const std::map<std::string, std::string>& env,
                             const SystemFacts& facts);

}  // namespace cpprun::launcher
