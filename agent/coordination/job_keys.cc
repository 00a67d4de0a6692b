#include "agent/coordination/job_keys.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <utility>

#include "agent/supervision/json_field.h"

namespace cpprun::agent {

using nlohmann::json;
using SystemClock = std::chrono::system_clock;

namespace {

// A record's field, or `fallback` when it is missing or of another type or range (jsonField).
template <typename T>
T fieldOr(const json& doc, const char* key, T fallback) {
  return jsonField<T>(doc, key).value_or(std::move(fallback));
}

std::string fieldOr(const json& doc, const char* key, const char* fallback) {
  return fieldOr<std::string>(doc, key, std::string(fallback));
}

// A record's array field, or an empty array.
json arrayOr(const json& doc, const char* key) {
  if (!doc.is_object()) return json::array();
  const auto it = doc.find(key);
  return it != doc.end() && it->is_array() ? *it : json::array();
}

std::string roundPrefix(int round) { return "rdzv/round/" + std::to_string(round) + "/"; }
std::string attemptPrefix(int attempt) { return "attempt/" + std::to_string(attempt) + "/"; }

}  // namespace

std::string storedRunId(const std::string& run_id) { return run_id.empty() ? "none" : run_id; }
std::string jobNamespace(const std::string& run_id) { return "cpprun/" + storedRunId(run_id); }
std::string namespacedKey(const std::string& run_id, const std::string& key) {
  return jobNamespace(run_id) + "/" + key;
}

std::string nodeKey(int rank) { return "rdzv/node/" + std::to_string(rank); }

std::string roundJoinedKey(int round) { return roundPrefix(round) + "joined"; }
std::string roundAgentKey(int round, int64_t slot) {
  return roundPrefix(round) + "agent/" + std::to_string(slot);
}
std::string roundMembersKey(int round) { return roundPrefix(round) + "members"; }
std::string roundAssignedKey(int round, int64_t slot) {
  return roundPrefix(round) + "assigned/" + std::to_string(slot);
}
std::string roundClosedKey(int round) { return roundPrefix(round) + "closed"; }

std::string heartbeatKey(const std::string& agent_id) { return "heartbeat/" + agent_id; }
std::string aliveKey(const std::string& agent_id) { return kAliveKeyPrefix + agent_id; }
std::string aliveSnapshotKey(const std::string& alive_prefix, int attempt,
                             const std::string& digest) {
  const bool slash = !alive_prefix.empty() && alive_prefix.back() == '/';
  return alive_prefix.substr(0, alive_prefix.size() - (slash ? 1 : 0)) + ".snapshot/" +
         std::to_string(attempt) + "/" + digest;
}

std::string attemptReadyKey(int attempt, int rank) {
  return attemptPrefix(attempt) + "ready/" + std::to_string(rank);
}
std::string attemptGoKey(int attempt) { return attemptPrefix(attempt) + "go"; }
std::string attemptNcclIdsPrefix(int attempt) { return attemptPrefix(attempt) + "nccl_ids/"; }
std::string attemptStopKey(int attempt) { return attemptPrefix(attempt) + "stop"; }
std::string attemptStopAcksKey(int attempt) { return attemptPrefix(attempt) + "stop_acks"; }
std::string attemptReportKey(int attempt, int rank) {
  return attemptPrefix(attempt) + "report/" + std::to_string(rank);
}
std::string attemptDecisionKey(int attempt) { return attemptPrefix(attempt) + "decision"; }
std::string attemptDoneKey(int attempt) { return attemptPrefix(attempt) + "done"; }
std::string attemptAllDoneKey(int attempt) { return attemptPrefix(attempt) + "all_done"; }
std::string attemptSparesDoneKey(int attempt) { return attemptPrefix(attempt) + "spares_done"; }
std::string attemptSparesAllDoneKey(int attempt) {
  return attemptPrefix(attempt) + "spares_all_done";
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
      {"waiting", f.waiting},
      {"host", f.host},
      {"error_document", f.error_document},
      {"unreaped", f.unreaped},
      {"state", f.state == 0 ? std::string() : std::string(1, f.state)},
      {"wchan", f.wchan}};
}

WorkerFailure failureFromJson(const json& d) {
  WorkerFailure f;
  f.local_rank = fieldOr(d, "local_rank", 0);
  f.rank = fieldOr(d, "rank", 0);
  f.pid = fieldOr(d, "pid", 0);
  f.exit_code = fieldOr(d, "exit_code", 0);
  f.signal = fieldOr(d, "signal", 0);
  f.time = SystemClock::time_point(std::chrono::duration_cast<SystemClock::duration>(
      std::chrono::microseconds(fieldOr(d, "time_us", int64_t{0}))));
  f.error_file = fieldOr(d, "error_file", "");
  f.message = fieldOr(d, "message", "");
  f.traceback = fieldOr(d, "traceback", "");
  f.stderr_tail = fieldOr(d, "stderr_tail", std::vector<std::string>{});
  f.teardown = fieldOr(d, "teardown", false);
  f.collateral = fieldOr(d, "collateral", false);
  f.waiting = fieldOr(d, "waiting", false);
  f.host = fieldOr(d, "host", "");
  if (d.contains("error_document")) f.error_document = d["error_document"];
  f.unreaped = fieldOr(d, "unreaped", false);
  const std::string state = fieldOr(d, "state", "");
  f.state = state.empty() ? 0 : state.front();
  f.wchan = fieldOr(d, "wchan", "");
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
    case StopCause::kStall:
      return "stall";
  }
  return "failure";
}

StopCause stopCauseFromName(const std::string& s) {
  if (s == "signal") return StopCause::kSignal;
  if (s == "lost") return StopCause::kLost;
  if (s == "join") return StopCause::kJoin;
  if (s == "end") return StopCause::kEnd;
  if (s == "leave") return StopCause::kLeave;
  if (s == "stall") return StopCause::kStall;
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
  if (!report.rank_states.empty()) {
    // Stacks only of the ranks that may be culprits: a waiting rank's digest stays small.
    std::vector<RankState> states = report.rank_states;
    trimWaitingStacks(states);
    json ranks = json::array();
    for (const RankState& s : states) {
      if (ranks.size() >= kMaxReportedRankStates) break;
      ranks.push_back(rankStateToJson(s));
    }
    doc["ranks"] = std::move(ranks);
  }
  return doc;
}

AttemptReport reportFromJson(const json& doc) {
  AttemptReport report;
  report.kind = AttemptReport::Kind::kFailed;
  if (!doc.is_object()) return report;
  report.kind = reportKindFromName(fieldOr(doc, "kind", "failed"));
  report.signal = fieldOr(doc, "signal", 0);
  report.error = fieldOr(doc, "error", "");
  for (const json& f : arrayOr(doc, "failures")) {
    report.failures.push_back(failureFromJson(f));
  }
  // Every rank's state at a stall: a malformed one is left out (the verdict then counts the rank
  // as one that gave no state), never an exception.
  if (auto ranks = doc.find("ranks"); ranks != doc.end() && ranks->is_array()) {
    for (const json& r : *ranks) {
      if (report.rank_states.size() >= kMaxReportedRankStates) break;
      auto state = rankStateFromJson(r, "a node's report");
      if (state.isOk()) report.rank_states.push_back(std::move(state).value());
    }
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
  decision.kind = decisionKindFromName(fieldOr(d, "kind", ""));
  record.readers = fieldOr(d, "readers", default_readers);
  decision.signal = fieldOr(d, "signal", 0);
  decision.summary = fieldOr(d, "summary", "");
  decision.restarts_used = fieldOr(d, "restarts_used", 0);
  decision.membership_change = fieldOr(d, "membership_change", false);
  for (const json& f : arrayOr(d, "failures")) {
    decision.failures.push_back(failureFromJson(f));
  }
  if (const auto it = d.find("excluded"); it != d.end() && it->is_object()) {
    ExcludedNode e;
    e.rank = fieldOr(*it, "rank", -1);
    e.host = fieldOr(*it, "host", "");
    e.agent_id = fieldOr(*it, "agent_id", "");
    e.reason = fieldOr(*it, "reason", "");
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
  stop.by = fieldOr(doc, "by", kByNobody);
  stop.reason = fieldOr(doc, "reason", "");
  stop.cause = stopCauseFromName(fieldOr(doc, "cause", ""));
  stop.signal = fieldOr(doc, "signal", 0);
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
  return AgentInfo{fieldOr(doc, "host", ""), doc["nproc"].get<int>(), fieldOr(doc, "id", ""),
                   fieldOr(doc, "scheduler_rank", -1), fieldOr(doc, "store", "")};
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
  if (!agents.empty()) m.node0_store_endpoint = agents.front().store_endpoint;
  m.members_digest = membersDigest(agents);
  return m;
}

std::string membersDigest(const std::vector<AgentInfo>& agents) {
  uint64_t h = 14695981039346656037ull;
  for (const AgentInfo& a : agents) {
    for (unsigned char c : a.id + "\n") {
      h ^= c;
      h *= 1099511628211ull;
    }
  }
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

Result<RoundMember> roundMemberFromRecord(const json& record, int64_t slot,
                                          const std::string& where) {
  Result<AgentInfo> agent = agentFromRecord(record, where);
  if (!agent.isOk()) return agent.status();
  return RoundMember{agent.value(), fieldOr(record, "previous_rank", -1), slot};
}

json roundMembersToJson(int attempt, int round, const std::vector<RoundMember>& members) {
  json doc = {{"attempt", attempt}, {"round", round}, {"members", json::array()}};
  for (const RoundMember& m : members) {
    json record = agentRecord(m.agent, m.previous_rank);
    record["index"] = m.slot;
    doc["members"].push_back(std::move(record));
  }
  return doc;
}

json roundErrorToJson(const std::string& error) { return {{"error", error}}; }
json roundJobOverToJson(const std::string& outcome) { return {{"job_over", outcome}}; }

Result<RoundMembers> roundMembersFromJson(const json& doc, int round) {
  const std::string where = "rendezvous round " + std::to_string(round) + "'s members";
  if (!doc.is_object() || !doc.contains("members") || !doc["members"].is_array()) {
    return internalError("rendezvous: " + where + " are malformed in the store");
  }
  RoundMembers out;
  out.attempt = fieldOr(doc, "attempt", 0);
  for (const json& m : doc["members"]) {
    Result<AgentInfo> agent =
        agentFromRecord(m, "a member record of round " + std::to_string(round));
    if (!agent.isOk()) return agent.status();
    out.agents.push_back(agent.value());
    out.slots.push_back(m.is_object() ? fieldOr(m, "index", int64_t{-1}) : -1);
  }
  return out;
}

Result<RoundDocument> roundDocumentFromJson(const json& doc, int round) {
  RoundDocument out;
  for (const auto& [field, kind] : {std::pair{"error", RoundDocument::Kind::kError},
                                    std::pair{"job_over", RoundDocument::Kind::kJobOver}}) {
    if (!doc.is_object() || !doc.contains(field)) continue;
    if (!doc[field].is_string()) {
      return internalError("rendezvous: rendezvous round " + std::to_string(round) + "'s " + field +
                           " is malformed in the store");
    }
    out.kind = kind;
    out.message = doc[field].get<std::string>();
    return out;
  }
  Result<RoundMembers> members = roundMembersFromJson(doc, round);
  if (!members.isOk()) return members.status();
  out.members = std::move(members.value());
  return out;
}

namespace {

const char* assignmentKindName(RoundAssignment::Kind kind) {
  switch (kind) {
    case RoundAssignment::Kind::kMember:
      return "member";
    case RoundAssignment::Kind::kNotMember:
      return "not_member";
    case RoundAssignment::Kind::kError:
      return "error";
    case RoundAssignment::Kind::kJobOver:
      return "job_over";
  }
  return "not_member";
}

}  // namespace

json assignmentToJson(const RoundAssignment& a) {
  json doc = {{"kind", assignmentKindName(a.kind)}};
  switch (a.kind) {
    case RoundAssignment::Kind::kMember: {
      const Membership& m = a.membership;
      doc["attempt"] = a.attempt;
      doc["round"] = m.round;
      doc["rank"] = m.group_rank;
      doc["nodes"] = m.group_world_size;
      doc["base_rank"] = m.base_rank;
      doc["world_size"] = m.world_size;
      if (!m.node0_store_endpoint.empty()) doc["node0_store"] = m.node0_store_endpoint;
      doc["digest"] = m.members_digest;
      break;
    }
    case RoundAssignment::Kind::kError:
    case RoundAssignment::Kind::kJobOver:
      doc["message"] = a.message;
      break;
    case RoundAssignment::Kind::kNotMember:
      break;
  }
  return doc;
}

Result<RoundAssignment> assignmentFromJson(const json& doc, const std::string& where) {
  const auto malformed = [&] {
    return internalError("rendezvous: " + where + " is malformed in the store");
  };
  if (!doc.is_object() || !doc.contains("kind") || !doc["kind"].is_string()) return malformed();
  const std::string kind = doc["kind"].get<std::string>();
  RoundAssignment a;
  if (kind == "not_member") return a;
  if (kind == "error" || kind == "job_over") {
    a.kind = kind == "error" ? RoundAssignment::Kind::kError : RoundAssignment::Kind::kJobOver;
    if (!doc.contains("message") || !doc["message"].is_string()) return malformed();
    a.message = doc["message"].get<std::string>();
    return a;
  }
  if (kind != "member") return malformed();
  for (const char* field : {"attempt", "round", "rank", "nodes", "base_rank", "world_size"}) {
    if (!doc.contains(field) || !doc[field].is_number_integer()) return malformed();
  }
  a.kind = RoundAssignment::Kind::kMember;
  a.attempt = doc["attempt"].get<int>();
  Membership& m = a.membership;
  m.round = doc["round"].get<int>();
  m.group_rank = doc["rank"].get<int>();
  m.group_world_size = doc["nodes"].get<int>();
  m.base_rank = doc["base_rank"].get<int>();
  m.world_size = doc["world_size"].get<int>();
  m.node0_store_endpoint = fieldOr(doc, "node0_store", "");
  m.members_digest = fieldOr(doc, "digest", "");
  if (m.group_world_size < 1 || m.group_rank < 0 || m.group_rank >= m.group_world_size ||
      m.base_rank < 0 || m.base_rank >= m.world_size) {
    return malformed();
  }
  return a;
}

std::vector<std::string> roundAssignments(const json& members_doc, int round, int64_t slots) {
  RoundAssignment other;  // a slot that is not a member's
  if (members_doc.is_object() && members_doc.contains("error")) {
    other.kind = RoundAssignment::Kind::kError;
    other.message = members_doc["error"].is_string() ? members_doc["error"].get<std::string>()
                                                     : std::string("malformed round");
  } else if (members_doc.is_object() && members_doc.contains("job_over")) {
    other.kind = RoundAssignment::Kind::kJobOver;
    other.message =
        members_doc["job_over"].is_string() ? members_doc["job_over"].get<std::string>() : "";
  }
  const std::string other_text = assignmentToJson(other).dump();
  std::vector<std::string> values(static_cast<size_t>(std::max<int64_t>(slots, 0)), other_text);
  if (other.kind != RoundAssignment::Kind::kNotMember) return values;
  Result<RoundMembers> members = roundMembersFromJson(members_doc, round);
  if (!members.isOk()) return values;
  const RoundMembers& rm = members.value();
  RoundAssignment a;
  a.kind = RoundAssignment::Kind::kMember;
  a.attempt = rm.attempt;
  Membership& m = a.membership;
  m.round = round;
  m.group_world_size = static_cast<int>(rm.agents.size());
  for (const AgentInfo& agent : rm.agents) m.world_size += agent.nproc;
  if (!rm.agents.empty()) m.node0_store_endpoint = rm.agents.front().store_endpoint;
  m.members_digest = membersDigest(rm.agents);
  // One pass: each member's base rank is the running sum of the nproc below it.
  for (size_t r = 0; r < rm.agents.size(); m.base_rank += rm.agents[r].nproc, ++r) {
    const int64_t slot = rm.slots[r];
    if (slot < 1 || slot > slots) continue;
    m.group_rank = static_cast<int>(r);
    values[static_cast<size_t>(slot - 1)] = assignmentToJson(a).dump();
  }
  return values;
}

std::string closedMarker(const json& members_doc, int64_t slots) {
  json marker = {{"slots", slots}};
  if (members_doc.is_object()) {
    for (const char* field : {"error", "job_over"}) {
      if (members_doc.contains(field)) marker[field] = members_doc[field];
    }
  }
  return marker.dump();
}

}  // namespace cpprun::agent
