// AgentStatus: one node's agent as an operator sees it — the supervisor's state and workers,
// the rendezvous, the store it serves — and its two renderings: Prometheus text for /metrics
// and JSON for /status (docs/operations.md lists every metric and field). Pure functions of a
// snapshot; the agent takes the snapshot on its loop thread when a request comes.
//
// Thread safety: value types and free functions; safe from any thread.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "agent/job_coordinator.h"
#include "agent/supervisor.h"
#include "rendezvous/tcp_store_server.h"

namespace cpprun::agent {

struct AgentStatus {
  std::string host;
  std::string run_id;
  int agent_pid = 0;
  double uptime_s = 0;
  int max_restarts = 0;
  double stall_timeout_s = 0;  // 0: stall detection off
  SupervisorSnapshot supervisor;
  RendezvousProgress rendezvous;
  // When this agent serves the job's store.
  std::optional<rendezvous::TcpStoreServerStats> store;
  std::string store_endpoint;  // host:port of the job's store
};

// Prometheus text exposition format 0.0.4 (HELP and TYPE lines, one sample per line).
std::string prometheusText(const AgentStatus& status);
nlohmann::json statusJson(const AgentStatus& status);

}  // namespace cpprun::agent
