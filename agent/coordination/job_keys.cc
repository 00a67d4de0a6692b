#include "agent/coordination/job_keys.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <optional>
#include <utility>

#include "agent/supervision/record_reader.h"
#include "common/job_limits.h"

namespace cpprun::agent {

using nlohmann::json;
using SystemClock = std::chrono::system_clock;

namespace {

// The bounds of a record's fields besides the job's sizes (common/job_limits.h). Free text
// (messages, tracebacks, tails) is bounded by the record's own size (kMaxRecordBytes).
constexpr int kMaxPid = 1 << 22;  // PID_MAX_LIMIT on 64-bit Linux
constexpr int kMaxSignal = 128;   // past SIGRTMAX
constexpr int64_t kMaxEpochMicros = int64_t{1} << 53;
constexpr size_t kMaxPathBytes = 4096;    // PATH_MAX
constexpr size_t kMaxHostBytes = 255;     // a DNS name
constexpr size_t kMaxAgentIdBytes = 512;  // host:pid:random and room to spare
constexpr size_t kMaxTailLines = 4096;

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

Result<WorkerFailure> failureFromJson(const json& d, const std::string& where) {
  RecordReader in(d, where);
  WorkerFailure f;
  f.local_rank = in.intIn("local_rank", 0, 0, kMaxWorkersPerNode - 1);
  f.rank = in.intIn("rank", 0, 0, kMaxWorldSize - 1);
  f.pid = in.intIn("pid", 0, 0, kMaxPid);
  f.exit_code = in.intIn("exit_code", 0, INT32_MIN, INT32_MAX);
  f.signal = in.intIn("signal", 0, 0, kMaxSignal);
  f.time = SystemClock::time_point(std::chrono::duration_cast<SystemClock::duration>(
      std::chrono::microseconds(in.integer("time_us", 0, 0, kMaxEpochMicros))));
  f.error_file = in.text("error_file", "", kMaxPathBytes);
  f.message = in.text("message", "", kMaxRecordBytes);
  f.traceback = in.text("traceback", "", kMaxRecordBytes);
  f.stderr_tail = in.texts("stderr_tail", kMaxTailLines, kMaxRecordBytes);
  f.teardown = in.boolean("teardown", false);
  f.collateral = in.boolean("collateral", false);
  f.waiting = in.boolean("waiting", false);
  f.host = in.text("host", "", kMaxHostBytes);
  if (const json* doc = in.object("error_document")) f.error_document = *doc;
  f.unreaped = in.boolean("unreaped", false);
  const std::string state = in.text("state", "", 1);
  f.state = state.empty() ? 0 : state.front();
  f.wchan = in.text("wchan", "", kMaxHostBytes);
  if (!in.ok()) return in.status();
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

std::optional<AttemptReport::Kind> reportKindFromName(const std::string& s) {
  for (auto k : {AttemptReport::Kind::kSucceeded, AttemptReport::Kind::kFailed,
                 AttemptReport::Kind::kStopped, AttemptReport::Kind::kSignalled,
                 AttemptReport::Kind::kStartFailed}) {
    if (s == reportKindName(k)) return k;
  }
  return std::nullopt;
}

std::optional<JobDecision::Kind> decisionKindFromName(const std::string& s) {
  for (auto k : {JobDecision::Kind::kRestart, JobDecision::Kind::kSucceeded,
                 JobDecision::Kind::kFailed, JobDecision::Kind::kStopped}) {
    if (s == decisionKindName(k)) return k;
  }
  return std::nullopt;
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

std::optional<StopCause> stopCauseFromName(const std::string& s) {
  for (auto c : {StopCause::kFailure, StopCause::kSignal, StopCause::kLost, StopCause::kJoin,
                 StopCause::kEnd, StopCause::kLeave, StopCause::kStall}) {
    if (s == stopCauseName(c)) return c;
  }
  return std::nullopt;
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

Result<AttemptReport> reportFromJson(const json& doc, const std::string& where) {
  RecordReader in(doc, where);
  AttemptReport report;
  const auto kind = reportKindFromName(in.text("kind", "", 32, true));
  if (in.ok() && !kind) in.fail("\"kind\" is not one of the report kinds");
  report.kind = kind.value_or(AttemptReport::Kind::kFailed);
  report.signal = in.intIn("signal", 0, 0, kMaxSignal);
  report.error = in.text("error", "", kMaxRecordBytes);
  for (const json* f : in.array("failures", kMaxWorkersPerNode)) {
    Result<WorkerFailure> failure = failureFromJson(*f, where + ", a failure");
    if (!failure.isOk()) return failure.status();
    report.failures.push_back(std::move(failure).value());
  }
  // Every rank's state at a stall: a malformed one is left out (the verdict then counts the rank
  // as one that gave no state).
  for (const json* r : in.array("ranks", kMaxReportedRankStates)) {
    auto state = rankStateFromJson(*r, where);
    if (state.isOk()) report.rank_states.push_back(std::move(state).value());
  }
  if (!in.ok()) return in.status();
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

Result<DecisionRecord> decisionFromJson(const json& d, int default_readers,
                                        const std::string& where) {
  RecordReader in(d, where);
  DecisionRecord record;
  JobDecision& decision = record.decision;
  const auto kind = decisionKindFromName(in.text("kind", "", 32, true));
  if (in.ok() && !kind) in.fail("\"kind\" is not one of the decision kinds");
  decision.kind = kind.value_or(JobDecision::Kind::kFailed);
  record.readers = in.intIn("readers", default_readers, 0, kMaxNodes);
  decision.signal = in.intIn("signal", 0, 0, kMaxSignal);
  decision.summary = in.text("summary", "", kMaxRecordBytes);
  decision.restarts_used = in.intIn("restarts_used", 0, 0, INT32_MAX);
  decision.membership_change = in.boolean("membership_change", false);
  for (const json* f : in.array("failures", kMaxWorldSize)) {
    Result<WorkerFailure> failure = failureFromJson(*f, where + ", a failure");
    if (!failure.isOk()) return failure.status();
    decision.failures.push_back(std::move(failure).value());
  }
  if (const json* excluded = in.object("excluded")) {
    RecordReader e(*excluded, where + ", \"excluded\"");
    ExcludedNode node;
    node.rank = e.intIn("rank", -1, -1, kMaxNodes - 1);
    node.host = e.text("host", "", kMaxHostBytes);
    node.agent_id = e.text("agent_id", "", kMaxAgentIdBytes);
    node.reason = e.text("reason", "", kMaxRecordBytes);
    if (!e.ok()) return e.status();
    if (!node.agent_id.empty()) decision.excluded = node;
  }
  if (!in.ok()) return in.status();
  return record;
}

json stopToJson(const StopClaim& stop) {
  return {{"by", stop.by},
          {"reason", stop.reason},
          {"cause", stopCauseName(stop.cause)},
          {"signal", stop.signal}};
}

Result<StopClaim> stopFromJson(const json& doc, const std::string& where) {
  RecordReader in(doc, where);
  StopClaim stop;
  stop.by = in.intIn("by", kByNobody, kByNobody, kMaxNodes - 1, true);
  stop.reason = in.text("reason", "", kMaxRecordBytes);
  const auto cause = stopCauseFromName(in.text("cause", "", 32, true));
  if (in.ok() && !cause) in.fail("\"cause\" is not one of the stop causes");
  stop.cause = cause.value_or(StopCause::kFailure);
  stop.signal = in.intIn("signal", 0, 0, kMaxSignal);
  if (!in.ok()) return in.status();
  return stop;
}

Result<StopClaim> stopFromRecord(std::string_view bytes, const std::string& key) {
  return decodeRecord(bytes, key, [&](const json& d) { return stopFromJson(d, key); });
}

Result<AttemptReport> reportFromRecord(std::string_view bytes, const std::string& key) {
  return decodeRecord(bytes, key, [&](const json& d) { return reportFromJson(d, key); });
}

Result<DecisionRecord> decisionFromRecord(std::string_view bytes, const std::string& key,
                                          int default_readers) {
  return decodeRecord(bytes, key,
                      [&](const json& d) { return decisionFromJson(d, default_readers, key); });
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
  RecordReader in(doc, "rendezvous: " + where);
  AgentInfo agent;
  agent.host = in.text("host", "", kMaxHostBytes);
  agent.nproc = in.intIn("nproc", 0, 1, kMaxWorkersPerNode, true);
  agent.id = in.text("id", "", kMaxAgentIdBytes);
  agent.scheduler_rank = in.intIn("scheduler_rank", -1, -1, kMaxNodes - 1);
  agent.store_endpoint = in.text("store", "", kMaxHostBytes + 8);
  in.intIn("previous_rank", -1, -1, kMaxNodes - 1);
  if (!in.ok()) return in.status();
  return agent;
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
  RecordReader in(record, where);
  const int previous = in.intIn("previous_rank", -1, -1, kMaxNodes - 1);
  return RoundMember{agent.value(), previous, slot};
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
  const std::string where = "rendezvous: rendezvous round " + std::to_string(round) + "'s members";
  RecordReader in(doc, where);
  if (in.ok() && !in.has("members")) in.fail("\"members\" is missing");
  RoundMembers out;
  out.attempt = in.intIn("attempt", 0, 0, INT32_MAX);
  int64_t world = 0;
  for (const json* m : in.array("members", kMaxNodes)) {
    Result<AgentInfo> agent =
        agentFromRecord(*m, "a member record of round " + std::to_string(round));
    if (!agent.isOk()) return agent.status();
    world += agent.value().nproc;
    out.agents.push_back(agent.value());
    RecordReader member(*m, where);
    out.slots.push_back(member.integer("index", -1, -1, INT32_MAX));
    if (!member.ok()) return member.status();
  }
  if (in.ok() && world > kMaxWorldSize) {
    in.fail("the members have " + std::to_string(world) + " workers, over the bound of " +
            std::to_string(kMaxWorldSize));
  }
  if (!in.ok()) return in.status();
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
  RecordReader in(doc, "rendezvous: " + where);
  RoundAssignment a;
  const std::string kind = in.text("kind", "", 32, true);
  if (!in.ok() || kind == "not_member") {
    if (!in.ok()) return in.status();
    return a;
  }
  if (kind == "error" || kind == "job_over") {
    a.kind = kind == "error" ? RoundAssignment::Kind::kError : RoundAssignment::Kind::kJobOver;
    a.message = in.text("message", "", kMaxRecordBytes, true);
    if (!in.ok()) return in.status();
    return a;
  }
  if (kind != "member")
    return internalError("rendezvous: " + where +
                         ": \"kind\" is not one of "
                         "the assignment kinds");
  a.kind = RoundAssignment::Kind::kMember;
  a.attempt = in.intIn("attempt", 0, 0, INT32_MAX, true);
  Membership& m = a.membership;
  m.round = in.intIn("round", 0, 0, INT32_MAX, true);
  m.group_world_size = in.intIn("nodes", 0, 1, kMaxNodes, true);
  m.group_rank = in.intIn("rank", 0, 0, m.group_world_size - 1, true);
  m.world_size = in.intIn("world_size", 0, 1, kMaxWorldSize, true);
  m.base_rank = in.intIn("base_rank", 0, 0, m.world_size - 1, true);
  m.node0_store_endpoint = in.text("node0_store", "", kMaxHostBytes + 8);
  m.members_digest = in.text("digest", "", 64);
  if (!in.ok()) return in.status();
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
