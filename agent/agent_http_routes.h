// The agent's HTTP routes: /healthz, /metrics (Prometheus text) and /status (JSON), answered
// from a snapshot of the agent taken when the request comes (agent_status.h renders it). Any
// other path gets 404 naming the three it serves.
//
// Thread safety: the handler runs on the HTTP server's loop thread, and calls `snapshot` there.
#pragma once

#include <functional>

#include "agent/agent_status.h"
#include "agent/http_server.h"

namespace cpprun::agent {

// REQUIRES: `snapshot` is not empty and stays callable while the server serves.
HttpHandler agentStatusRoutes(std::function<AgentStatus()> snapshot);

}  // namespace cpprun::agent
