// AgentStatus: one node's agent as an operator sees it — the supervisor's state and workers,
// the rendezvous, the store it serves — and its two renderings: Prometheus text for /metrics
// and JSON for /status (docs/operations.md lists every metric and field). Pure functions of a
// snapshot; the agent takes the snapshot on its loop thread and publishes it to the HTTP thread
// (StatusBoard, agent_http_routes.h), which renders it.
//
// A new figure (a counter, say) is a field here or in SupervisorSnapshot, filled where the
// agent takes the snapshot (LocalAgent::statusNow(), or Supervisor::snapshot()), and one line
// in each rendering; publishing carries the whole value, so nothing else changes.
//
// Thread safety: value types and free functions; safe from any thread.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "agent/coordination/job_coordinator.h"
#include "agent/supervision/supervisor.h"
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
  // How old this view of the agent is when rendered: about 0 normally; more when the agent's
  // loop was too busy to take a fresh snapshot in time (the figures are then extrapolated from
  // the last one, see aged()).
  double age_s = 0;
};

// `status` as it stands `seconds` later if nothing happened meanwhile: the clocks advance (the
// uptime, the current state's time, each running worker's time since progress) and age_s grows.
AgentStatus aged(AgentStatus status, double seconds);

// Prometheus text exposition format 0.0.4 (HELP and TYPE lines, one sample per line).
std::string prometheusText(const AgentStatus& status);
nlohmann::json statusJson(const AgentStatus& status);

}  // namespace cpprun::agent
