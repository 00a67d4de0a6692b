// RendezvousSettings: where the job's store is and how long its agents wait for each other,
// resolved from the LaunchConfig (after scheduler discovery): --rdzv-endpoint (host[:port],
// IPv6 as [addr]:port) wins over --master-addr/--master-port; --rdzv-conf carries the bounds
// (join_timeout, keep_alive_interval, keep_alive_max_attempt, torchrun's names; seconds).
// Errors name the flag and the bad value (the caller exits 2).
// Thread safety: pure functions on values.
#pragma once

#include <chrono>
#include <string>

#include "common/status.h"
#include "launcher/launch_config.h"

namespace cpprun::launcher {

struct Endpoint {
  std::string host;
  int port = 0;
};

// "host", "host:port", "[v6]", "[v6]:port"; `default_port` when the port is left out.
Result<Endpoint> parseEndpoint(const std::string& text, int default_port);

struct RendezvousSettings {
  bool multi_node = false;  // more than one agent
  int nnodes = 1;
  int node_rank = 0;
  Endpoint store;         // the workers' MASTER_ADDR:MASTER_PORT and the agents' meeting place
  std::string bind_host;  // where node 0's store listens (empty: store.host)
  std::chrono::milliseconds join_timeout{std::chrono::seconds(600)};
  std::chrono::milliseconds keep_alive_interval{std::chrono::seconds(5)};
  int keep_alive_max_attempt = 3;
};

// torchrun's static default port, used by multi-node jobs that name none.
inline constexpr int kDefaultMasterPort = 29500;

Result<RendezvousSettings> resolveRendezvous(const LaunchConfig& config);

}  // namespace cpprun::launcher
