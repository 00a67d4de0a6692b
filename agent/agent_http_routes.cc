#include "agent/agent_http_routes.h"

#include <string>
#include <utility>

namespace cpprun::agent {

HttpHandler agentStatusRoutes(std::function<AgentStatus()> snapshot) {
  return [snapshot = std::move(snapshot)](const std::string& target) {
    const std::string path = target.substr(0, target.find('?'));
    HttpResponse r;
    if (path == "/healthz") {
      r.body = "ok\n";
    } else if (path == "/metrics") {
      r.content_type = "text/plain; version=0.0.4; charset=utf-8";
      r.body = prometheusText(snapshot());
    } else if (path == "/status") {
      r.content_type = "application/json";
      r.body = statusJson(snapshot()).dump(2) + "\n";
    } else {
      r.status = 404;
      r.body = "not found; cpprun serves /healthz, /metrics and /status\n";
    }
    return r;
  };
}

}  // namespace cpprun::agent
