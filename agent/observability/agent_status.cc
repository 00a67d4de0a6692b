#include "agent/observability/agent_status.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace cpprun::agent {

namespace {

class PrometheusWriter {
 public:
  void family(const char* name, const char* type, const char* help) {
    out_ << "# HELP " << name << ' ' << help << '\n' << "# TYPE " << name << ' ' << type << '\n';
  }
  void sample(const std::string& name_and_labels, double value) {
    out_ << name_and_labels << ' ' << format(value) << '\n';
  }
  void metric(const char* name, const char* type, const char* help, double value) {
    family(name, type, help);
    sample(name, value);
  }
  std::string str() const { return out_.str(); }

 private:
  static std::string format(double v) {
    if (std::isnan(v)) return "NaN";
    if (v == std::floor(v) && std::fabs(v) < 1e15) {
      return std::to_string(static_cast<long long>(v));
    }
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.6g", v);
    return buf;
  }
  std::ostringstream out_;
};

std::string rankLabels(const WorkerSnapshot& w) {
  return "{rank=\"" + std::to_string(w.rank) + "\",local_rank=\"" + std::to_string(w.local_rank) +
         "\"";
}

}  // namespace

AgentStatus aged(AgentStatus s, double seconds) {
  if (seconds <= 0) return s;
  s.age_s += seconds;
  s.uptime_s += seconds;
  if (auto it = s.supervisor.seconds_in_state.find(s.supervisor.state);
      it != s.supervisor.seconds_in_state.end()) {
    it->second += seconds;
  }
  for (WorkerSnapshot& w : s.supervisor.workers) {
    if (w.alive) w.seconds_since_progress += seconds;
  }
  return s;
}

namespace {

// --stall-timeout's families: stalls, the bound, and the hangs' verdicts.
void stallMetrics(PrometheusWriter& w, const AgentStatus& s) {
  const SupervisorSnapshot& sup = s.supervisor;
  w.metric("cpprun_stalls_total", "counter", "Ranks declared stalled (--stall-timeout).",
           static_cast<double>(sup.stalls_total));
  w.metric("cpprun_stall_timeout_seconds", "gauge", "--stall-timeout; 0 when off.",
           s.stall_timeout_s);
  w.metric("cpprun_hang_verdicts_total", "counter",
           "Hangs whose verdict named who caused them (or that every rank waited).",
           static_cast<double>(sup.last_hang.verdicts_total));
  w.metric("cpprun_hang_culprits_total", "counter",
           "Ranks named as a hang's culprit (not the ranks that waited for it).",
           static_cast<double>(sup.last_hang.culprits_total));
}

}  // namespace

std::string prometheusText(const AgentStatus& s) {
  const SupervisorSnapshot& sup = s.supervisor;
  PrometheusWriter w;
  w.metric("cpprun_up", "gauge", "1 while the agent runs.", 1);
  w.metric("cpprun_uptime_seconds", "gauge", "Seconds since the agent started.", s.uptime_s);
  w.metric("cpprun_status_age_seconds", "gauge",
           "How old the agent's state in this answer is (grows while its event loop is busy).",
           s.age_s);
  int alive = 0;
  for (const WorkerSnapshot& ws : sup.workers) alive += ws.alive ? 1 : 0;
  w.metric("cpprun_workers", "gauge", "Workers of the current attempt on this node.",
           static_cast<double>(sup.workers.size()));
  w.metric("cpprun_workers_alive", "gauge", "Workers of the current attempt still running.", alive);
  w.metric("cpprun_workers_started_total", "counter", "Workers started, every attempt.",
           static_cast<double>(sup.workers_started_total));
  w.metric("cpprun_worker_failures_total", "counter",
           "Workers that failed on their own (teardown excluded), every attempt.",
           static_cast<double>(sup.worker_failures_total));
  w.metric("cpprun_restarts_total", "counter", "Restarts of the worker group.", sup.restart_count);
  w.metric("cpprun_max_restarts", "gauge", "The job's restart budget (--max-restarts).",
           s.max_restarts);
  stallMetrics(w, s);

  w.family("cpprun_state", "gauge", "1 for the agent's current state.");
  for (const auto& [state, seconds] : sup.seconds_in_state) {
    w.sample("cpprun_state{state=\"" + state + "\"}", state == sup.state ? 1 : 0);
  }
  w.family("cpprun_state_seconds_total", "counter", "Seconds spent in each state.");
  for (const auto& [state, seconds] : sup.seconds_in_state) {
    w.sample("cpprun_state_seconds_total{state=\"" + state + "\"}", seconds);
  }

  w.metric("cpprun_rendezvous_round", "gauge", "The last rendezvous round begun.",
           s.rendezvous.round);
  w.metric("cpprun_rendezvous_rounds_total", "counter", "Rendezvous rounds completed.",
           s.rendezvous.rounds_completed);
  w.metric("cpprun_rendezvous_duration_seconds", "gauge",
           "How long the last completed round took, from this agent's join.",
           s.rendezvous.last_duration_s);
  w.metric("cpprun_rendezvous_nodes", "gauge", "Nodes in the last completed round.",
           s.rendezvous.nodes);
  w.metric("cpprun_world_size", "gauge", "Workers in the whole job (last round).",
           s.rendezvous.world_size);
  w.metric("cpprun_waiting", "gauge", "1 while the agent waits on the other nodes.",
           s.rendezvous.waiting_for.empty() ? 0 : 1);

  if (s.store) {
    const auto& st = *s.store;
    w.metric("cpprun_store_connections", "gauge",
             "Open connections to the store this agent serves.",
             static_cast<double>(st.connections_open));
    w.metric("cpprun_store_connections_accepted_total", "counter", "Store connections accepted.",
             static_cast<double>(st.connections_accepted));
    w.metric("cpprun_store_connections_dropped_total", "counter",
             "Store connections closed for a protocol or limit violation.",
             static_cast<double>(st.connections_dropped + st.connections_rejected));
    w.family("cpprun_store_connections_dropped_by_reason_total", "counter",
             "Store connections closed, by why (bad_frame, refused_request, request_budget, "
             "reply_budget).");
    for (size_t i = 0; i < st.dropped_by_reason.size(); ++i) {
      std::string reason = rendezvous::dropReasonName(static_cast<rendezvous::DropReason>(i));
      std::replace(reason.begin(), reason.end(), ' ', '_');  // a label value: bad_frame
      w.sample("cpprun_store_connections_dropped_by_reason_total{reason=\"" + reason + "\"}",
               static_cast<double>(st.dropped_by_reason[i]));
    }
    w.metric("cpprun_store_operations_total", "counter", "Store requests served.",
             static_cast<double>(st.requests));
    w.metric("cpprun_store_received_bytes_total", "counter", "Bytes the store received.",
             static_cast<double>(st.bytes_received));
    w.metric("cpprun_store_sent_bytes_total", "counter", "Bytes the store sent.",
             static_cast<double>(st.bytes_sent));
    w.metric("cpprun_store_keys", "gauge", "Keys in the store.", static_cast<double>(st.keys));
    w.metric("cpprun_store_pending_waits", "gauge", "WAIT requests not yet answered.",
             static_cast<double>(st.pending_waits));
  }

  w.metric("cpprun_worker_output_bytes_total", "counter",
           "Bytes the workers wrote to stdout and stderr, every attempt.",
           static_cast<double>(sup.output_bytes_total));
  w.metric("cpprun_console_lines_dropped_total", "counter",
           "Worker lines not shown because the console took nothing for 1 s (log files keep "
           "them).",
           static_cast<double>(sup.console_lines_dropped_total));
  w.metric("cpprun_log_lines_dropped_total", "counter",
           "The agent's own log lines not shown because the console did not keep up.",
           static_cast<double>(sup.log_lines_dropped_total));
  w.family("cpprun_worker_alive", "gauge", "1 while the worker runs.");
  for (const WorkerSnapshot& ws : sup.workers) {
    w.sample("cpprun_worker_alive" + rankLabels(ws) + "}", ws.alive ? 1 : 0);
  }
  w.family("cpprun_worker_output_bytes", "gauge", "Bytes this attempt's worker wrote, by stream.");
  for (const WorkerSnapshot& ws : sup.workers) {
    w.sample("cpprun_worker_output_bytes" + rankLabels(ws) + ",stream=\"stdout\"}",
             static_cast<double>(ws.stdout_bytes));
    w.sample("cpprun_worker_output_bytes" + rankLabels(ws) + ",stream=\"stderr\"}",
             static_cast<double>(ws.stderr_bytes));
  }
  w.family("cpprun_worker_progress", "gauge",
           "The last counter the worker wrote to its progress file (absent until it does).");
  for (const WorkerSnapshot& ws : sup.workers) {
    if (ws.progress) {
      w.sample("cpprun_worker_progress" + rankLabels(ws) + "}", static_cast<double>(*ws.progress));
    }
  }
  w.family("cpprun_worker_seconds_since_progress", "gauge",
           "Seconds since the worker's last progress report (or its start).");
  for (const WorkerSnapshot& ws : sup.workers) {
    if (ws.alive) {
      w.sample("cpprun_worker_seconds_since_progress" + rankLabels(ws) + "}",
               ws.seconds_since_progress);
    }
  }
  return w.str();
}

nlohmann::json statusJson(const AgentStatus& s) {
  const SupervisorSnapshot& sup = s.supervisor;
  nlohmann::json workers = nlohmann::json::array();
  for (const WorkerSnapshot& ws : sup.workers) {
    nlohmann::json w = {{"rank", ws.rank},
                        {"local_rank", ws.local_rank},
                        {"pid", ws.pid},
                        {"alive", ws.alive},
                        {"stalled", ws.stalled},
                        {"stdout_bytes", ws.stdout_bytes},
                        {"stderr_bytes", ws.stderr_bytes},
                        {"progress", ws.progress ? nlohmann::json(*ws.progress) : nullptr}};
    if (ws.alive) w["seconds_since_progress"] = ws.seconds_since_progress;
    if (!ws.numa_binding.empty()) w["numa_binding"] = ws.numa_binding;
    if (!ws.alive && ws.pid > 0) {
      if (ws.signal > 0) {
        w["signal"] = ws.signal;
      } else {
        w["exit_code"] = ws.exit_code;
      }
    }
    workers.push_back(w);
  }
  nlohmann::json out = {
      {"host", s.host},
      {"run_id", s.run_id},
      {"agent_pid", s.agent_pid},
      {"uptime_s", s.uptime_s},
      {"status_age_s", s.age_s},
      {"state", sup.state},
      {"attempt", sup.restart_count},
      {"restarts", sup.restart_count},
      {"max_restarts", s.max_restarts},
      {"stall_timeout_s", s.stall_timeout_s},
      {"stalls", sup.stalls_total},
      {"last_hang", sup.last_hang.attempt < 0
                        ? nlohmann::json(nullptr)
                        : nlohmann::json({{"attempt", sup.last_hang.attempt},
                                          {"summary", sup.last_hang.summary},
                                          {"culprits", sup.last_hang.culprits},
                                          {"waiting", sup.last_hang.waiting}})},
      {"waiting_for", s.rendezvous.waiting_for.empty() ? nlohmann::json(nullptr)
                                                       : nlohmann::json(s.rendezvous.waiting_for)},
      {"seconds_in_state", sup.seconds_in_state},
      {"rendezvous",
       {{"round", s.rendezvous.round},
        {"rounds_completed", s.rendezvous.rounds_completed},
        {"last_duration_s", s.rendezvous.last_duration_s},
        {"nodes", s.rendezvous.nodes},
        {"world_size", s.rendezvous.world_size}}},
      {"store_endpoint", s.store_endpoint},
      {"workers", workers},
      {"worker_output_bytes", sup.output_bytes_total},
      {"console_lines_dropped", sup.console_lines_dropped_total},
      {"log_lines_dropped", sup.log_lines_dropped_total}};
  if (s.store) {
    out["store"] = {{"connections", s.store->connections_open},
                    {"connections_accepted", s.store->connections_accepted},
                    {"operations", s.store->requests},
                    {"keys", s.store->keys},
                    {"pending_waits", s.store->pending_waits}};
  }
  return out;
}

}  // namespace cpprun::agent
