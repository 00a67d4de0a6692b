#include "agent/job_keys.h"

#include <chrono>

namespace cpprun::agent {

using nlohmann::json;
using SystemClock = std::chrono::system_clock;

std::string storedRunId(const std::string& run_id) { return run_id.empty() ? "none" : run_id; }
std::string jobNamespace(const std::string& run_id) { return "cpprun/" + storedRunId(run_id); }
std::string attemptKey(int attempt, const std::string& what) {
  return "attempt/" + std::to_string(attempt) + "/" + what;
}
std::string nodeKey(int rank) { return "rdzv/node/" + std::to_string(rank); }
std::string heartbeatKey(const std::string& agent_id) { return "heartbeat/" + agent_id; }
std::string roundKey(int round, const std::string& what) {
  return "rdzv/round/" + std::to_string(round) + "/" + what;
}

json failureToJson(const WorkerFailure& f) {
  return {
      {"local_rank", f.local_rank},
      {"rank", f.rank},
      {"pid", f.pid},
      {"exit_code", f.exit_code},
      {"signal", f.signal},
      {"time_us",
       std::chrono::duration_cast<std::chrono::microseconds>(f.time.time_since_epoch()).count()},
      {"error_file", f.error_file},
      {"message", f.message},
      {"traceback", f.traceback},
      {"stderr_tail", f.stderr_tail},
      {"teardown", f.teardown},
      {"collateral", f.collateral},
      {"host", f.host},
      {"error_document", f.error_document},
      {"unreaped", f.unreaped},
      {"state", f.state == 0 ? std::string() : std::string(1, f.state)},
      {"wchan", f.wchan}};
}

WorkerFailure failureFromJson(const json& d) {
  WorkerFailure f;
  f.local_rank = d.value("local_rank", 0);
  f.rank = d.value("rank", 0);
  f.pid = d.value("pid", 0);
  f.exit_code = d.value("exit_code", 0);
  f.signal = d.value("signal", 0);
  f.time = SystemClock::time_point(std::chrono::duration_cast<SystemClock::duration>(
      std::chrono::microseconds(d.value("time_us", int64_t{0}))));
  f.error_file = d.value("error_file", "");
  f.message = d.value("message", "");
  f.traceback = d.value("traceback", "");
  f.stderr_tail = d.value("stderr_tail", std::vector<std::string>{});
  f.teardown = d.value("teardown", false);
  f.collateral = d.value("collateral", false);
  f.host = d.value("host", "");
  if (d.contains("error_document")) f.error_document = d["error_document"];
  f.unreaped = d.value("unreaped", false);
  const std::string state = d.value("state", "");
  f.state = state.empty() ? 0 : state.front();
  f.wchan = d.value("wchan", "");
  return f;
}

namespace {

const char* reportKindName(AttemptReport::Kind k) {
  switch (k) {
    case AttemptReport::Kind::kSucceeded:
      return "succeeded";
    case AttemptReport::Kind::kFailed:
      return "failed";
    case AttemptReport::Kind::kStopped:
      return "stopped";
    case AttemptReport::Kind::kSignalled:
      return "signalled";
    case AttemptReport::Kind::kStartFailed:
      return "start_failed";
  }
  return "failed";
}

AttemptReport::Kind reportKindFromName(const std::string& s) {
  if (s == "succeeded") return AttemptReport::Kind::kSucceeded;
  if (s == "stopped") return AttemptReport::Kind::kStopped;
  if (s == "signalled") return AttemptReport::Kind::kSignalled;
  if (s == "start_failed") return AttemptReport::Kind::kStartFailed;
  return AttemptReport::Kind::kFailed;
}

JobDecision::Kind decisionKindFromName(const std::string& s) {
  if (s == "restart") return JobDecision::Kind::kRestart;
  if (s == "succeeded") return JobDecision::Kind::kSucceeded;
  if (s == "stopped") return JobDecision::Kind::kStopped;
  return JobDecision::Kind::kFailed;
}

const char* stopCauseName(StopCause c) {
  switch (c) {
    case StopCause::kFailure:
      return "failure";
    case StopCause::kSignal:
      return "signal";
    case StopCause::kLost:
      return "lost";
    case StopCause::kJoin:
      return "join";
    case StopCause::kEnd:
      return "end";
    case StopCause::kLeave:
      return "leave";
  }
  return "failure";
}

StopCause stopCauseFromName(const std::string& s) {
  if (s == "signal") return StopCause::kSignal;
  if (s == "lost") return StopCause::kLost;
  if (s == "join") return StopCause::kJoin;
  if (s == "end") return StopCause::kEnd;
  if (s == "leave") return StopCause::kLeave;
  return StopCause::kFailure;
}

}  // namespace

const char* decisionKindName(JobDecision::Kind k) {
  switch (k) {
    case JobDecision::Kind::kRestart:
      return "restart";
    case JobDecision::Kind::kSucceeded:
      return "succeeded";
    case JobDecision::Kind::kFailed:
      return "failed";
    case JobDecision::Kind::kStopped:
      return "stopped";
  }
  return "failed";
}

json reportToJson(const AttemptReport& report, const std::string& host) {
  json doc = {{"kind", reportKindName(report.kind)},
              {"signal", report.signal},
              {"error", report.error},
              {"failures", json::array()}};
  for (const WorkerFailure& f : report.failures) {
    WorkerFailure with_host = f;
    with_host.host = host;
    doc["failures"].push_back(failureToJson(with_host));
  }
  return doc;
}

AttemptReport reportFromJson(const json& doc) {
  AttemptReport report;
  report.kind = AttemptReport::Kind::kFailed;
  if (!doc.is_object()) return report;
  report.kind = reportKindFromName(doc.value("kind", "failed"));
  report.signal = doc.value("signal", 0);
  report.error = doc.value("error", "");
  for (const json& f : doc.value("failures", json::array())) {
    report.failures.push_back(failureFromJson(f));
  }
  return report;
}

json decisionToJson(const JobDecision& decision, int readers) {
  json d = {{"kind", decisionKindName(decision.kind)},
            {"readers", readers},
            {"signal", decision.signal},
            {"summary", decision.summary},
            {"restarts_used", decision.restarts_used},
            {"membership_change", decision.membership_change},
            {"failures", json::array()}};
  for (const WorkerFailure& f : decision.failures) d["failures"].push_back(failureToJson(f));
  if (decision.excluded) {
    d["excluded"] = {{"rank", decision.excluded->rank},
                     {"host", decision.excluded->host},
                     {"agent_id", decision.excluded->agent_id},
                     {"reason", decision.excluded->reason}};
  }
  return d;
}

Result<DecisionRecord> decisionFromJson(const json& d, int default_readers) {
  if (!d.is_object()) return internalError("malformed decision in the store");
  DecisionRecord record;
  JobDecision& decision = record.decision;
  decision.kind = decisionKindFromName(d.value("kind", ""));
  record.readers = d.value("readers", default_readers);
  decision.signal = d.value("signal", 0);
  decision.summary = d.value("summary", "");
  decision.restarts_used = d.value("restarts_used", 0);
  decision.membership_change = d.value("membership_change", false);
  for (const json& f : d.value("failures", json::array())) {
    decision.failures.push_back(failureFromJson(f));
  }
  if (const auto it = d.find("excluded"); it != d.end() && it->is_object()) {
    ExcludedNode e;
    e.rank = it->value("rank", -1);
    e.host = it->value("host", "");
    e.agent_id = it->value("agent_id", "");
    e.reason = it->value("reason", "");
    if (!e.agent_id.empty()) decision.excluded = e;
  }
  return record;
}

json stopToJson(const StopClaim& stop) {
  return {{"by", stop.by},
          {"reason", stop.reason},
          {"cause", stopCauseName(stop.cause)},
          {"signal", stop.signal}};
}

StopClaim stopFromJson(const json& doc) {
  StopClaim stop;
  if (!doc.is_object()) {
    stop.cause = StopCause::kEnd;
    return stop;
  }
  stop.by = doc.value("by", kByNobody);
  stop.reason = doc.value("reason", "");
  stop.cause = stopCauseFromName(doc.value("cause", ""));
  stop.signal = doc.value("signal", 0);
  return stop;
}

json agentRecord(const AgentInfo& self, int previous_rank) {
  json record = {{"host", self.host},
                 {"nproc", self.nproc},
                 {"id", self.id},
                 {"scheduler_rank", self.scheduler_rank},
                 {"previous_rank", previous_rank}};
  if (!self.store_endpoint.empty()) record["store"] = self.store_endpoint;
  return record;
}

Result<AgentInfo> agentFromRecord(const json& doc, const std::string& where) {
  if (!doc.is_object() || !doc.contains("nproc") || !doc["nproc"].is_number_integer()) {
    return internalError("rendezvous: " + where + " is malformed in the store");
  }
  return AgentInfo{doc.value("host", ""), doc["nproc"].get<int>(), doc.value("id", ""),
                   doc.value("scheduler_rank", -1), doc.value("store", "")};
}

Membership membershipOf(const std::vector<AgentInfo>& agents, int my_rank) {
  Membership m;
  m.group_rank = my_rank;
  m.group_world_size = static_cast<int>(agents.size());
  for (int r = 0; r < m.group_world_size; ++r) {
    if (r < my_rank) m.base_rank += agents[static_cast<size_t>(r)].nproc;
    m.world_size += agents[static_cast<size_t>(r)].nproc;
  }
  m.agents = agents;
  return m;
}

}  // namespace cpprun::agent
