// Job keys: where the job protocol (job_coordinator.h) keeps its records in the store, and the
// JSON form of each record. One place for the key scheme, so that every backend of the
// coordination seam (rendezvous::Store: cpprun's TCP store, etcd) and every reader of the store
// (docs/rendezvous.md, tests) agree on it. Malformed records decode to a safe value or an error
// naming the record, never an exception.
//
// Every job key lives in its run's namespace, "cpprun/<run id>/" (jobNamespace; torch's c10d
// rendezvous keys its state by run id the same way, "torch.rendezvous.<run id>"), so two jobs
// that meet in one store (one TCP store endpoint, one etcd cluster) never see each other's keys.
// The coordinator applies the namespace (a PrefixStore over every connection); the keys built
// below are relative to it. The per-attempt clean-up of the workers' keys spares "cpprun/"; an
// attempt's own keys and a round's are deleted two attempts (rounds) later (stale_job_keys.h).
// With the job's secret only the job's agents may write them (rendezvous/store_auth.h). The scheme
// is the builders below, one per key, and nothing else spells a key: docs/rendezvous.md lists the
// same keys, and job_keys_test pins every builder's output.
//
// One key outside every namespace: kServedRunIdKey, the run id of the job whose agent serves a
// TCP store, set by that agent before it answers anyone. An agent of another run id that
// reaches the store refuses to join (the store host's job owns the store: its workers use it
// and it clears their keys before every attempt).
//
// Thread safety: free functions on values; safe from any thread.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "agent/coordination/job_coordinator.h"
#include "agent/supervision/failure_report.h"
#include "agent/supervision/record_reader.h"
#include "common/status.h"

namespace cpprun::agent {

// At the root of a TCP store served by an agent (not in a namespace).
inline constexpr const char* kServedRunIdKey = "cpprun/served_run_id";

// The run id as the store holds it: an empty one reads as torchrun's default, "none".
std::string storedRunId(const std::string& run_id);
// "cpprun/<stored run id>": the job's namespace, a PrefixStore's prefix (keys become
// "cpprun/<run id>/<key>").
std::string jobNamespace(const std::string& run_id);
// "cpprun/<stored run id>/<key>": `key` (one of the keys below) as it lies in the store.
std::string namespacedKey(const std::string& run_id, const std::string& key);

// --- The static join (a fixed rank and number of agents) ---

// "rdzv/node/<rank>": the agent of group rank `rank`'s record (agentRecord).
std::string nodeKey(int rank);
// "rdzv/joined": tickets of joined agents (Store::takeTicket).
inline constexpr const char* kStaticJoinedKey = "rdzv/joined";
// "rdzv/complete": every node's record is written (set by the agent whose ticket completed the
// count, after one CHECK of all).
inline constexpr const char* kStaticCompleteKey = "rdzv/complete";
// --warm-restart: the modules a node's warm process holds (a JSON array of names,
// warm_start_launcher.h), which a hot spare's warm process imports while it waits.
inline constexpr const char* kWarmImportsKey = "warm_imports";

// --- Elastic rounds ---

// "rdzv/round": the round agents join now.
inline constexpr const char* kRoundCounterKey = "rdzv/round";
// "rdzv/round/<r>/joined": slots taken in round r (tickets).
std::string roundJoinedKey(int round);
// "rdzv/round/<r>/agent/<slot>": the record of the agent in `slot` (1-based).
std::string roundAgentKey(int round, int64_t slot);
// "rdzv/round/<r>/members": the round's members document (roundMembersToJson; or its error,
// or job_over). Read by the closer, node 0, a spare and a decider taking over.
std::string roundMembersKey(int round);
// "rdzv/round/<r>/assigned/<slot>": what the agent in `slot` needs of the round (its rank, the
// sizes, node 0's store; or not a member, the error, job_over): one small key each, so an
// agent's reads do not grow with the job (written by the closer with one multiSet).
std::string roundAssignedKey(int round, int64_t slot);
// "rdzv/round/<r>/closed": set after every assigned/<slot> of slots 1..<n>: {"slots": n} (and
// the error or job_over; closedMarker). "Not a member" (a later slot, or a slot the round did
// not take) is confirmed in the members document, by id: an agent that joined twice is a
// member by its first slot and waits on its last.
std::string roundClosedKey(int round);

// --- Liveness ---

// "heartbeat/<agent id>": a counter each agent bumps every keep-alive interval (TCP store).
std::string heartbeatKey(const std::string& agent_id);
// "alive/<agent id>" (etcd): the agent's host, under its lease (LeaseLiveness). The prefix is
// what LeaseLiveness watches.
inline constexpr const char* kAliveKeyPrefix = "alive/";
std::string aliveKey(const std::string& agent_id);
// "<alive prefix without its '/'>.snapshot/<attempt>/<digest>" (etcd; in the job's namespace:
// "alive.snapshot/<n>/<digest>"): node 0's read of which members' alive keys existed when
// attempt n began, under its lease. `alive_prefix`: where the alive keys lie.
std::string aliveSnapshotKey(const std::string& alive_prefix, int attempt,
                             const std::string& digest);

// --- One attempt (attempt/<n>/...) ---

// "attempt/<n>/ready/<rank>": static: the agent tore attempt n-1 down.
std::string attemptReadyKey(int attempt, int rank);
// "attempt/<n>/go": the host's NCCL id ("!<error>": the attempt failed).
std::string attemptGoKey(int attempt);
// "attempt/<n>/nccl_ids/": the prefix of the attempt's scalable NCCL ids; id i is at
// "attempt/<n>/nccl_ids/<i>" (exchangeNcclIds, nccl_id_groups.h).
std::string attemptNcclIdsPrefix(int attempt);
// "attempt/<n>/stop": the first stop claim (compare-and-set; stopToJson).
std::string attemptStopKey(int attempt);
// "attempt/<n>/stop_acks": c10d: "<rank>\n" appended by each live member's agent as soon as it
// sees the stop (before its teardown); the decider gives up a member that has not within
// kStopAckBound.
std::string attemptStopAcksKey(int attempt);
// "attempt/<n>/report/<rank>": how an agent's workers ended (reportToJson).
std::string attemptReportKey(int attempt, int rank);
// "attempt/<n>/decision": the host's decision for the job (decisionToJson).
std::string attemptDecisionKey(int attempt);
// "attempt/<n>/done" (tickets), "attempt/<n>/all_done": agents that read the final decision,
// and the mark the last of them sets.
std::string attemptDoneKey(int attempt);
std::string attemptAllDoneKey(int attempt);
// "attempt/<n>/spares_done" (tickets), "attempt/<n>/spares_all_done": spares that saw the
// job's final decision, and the mark the last of them sets (the round they waited in counts
// them); the store host waits for it.
std::string attemptSparesDoneKey(int attempt);
std::string attemptSparesAllDoneKey(int attempt);

// --- Across attempts ---

// "exclusion/failures": one line per root-cause failure of a node (appended by the decider;
// node_exclusion.h).
inline constexpr const char* kExclusionHistoryKey = "exclusion/failures";

// --- Records ---
//
// Every record is decoded by one typed reader (RecordReader, agent/supervision/record_reader.h):
// a record larger than kMaxRecordBytes, that is not a JSON object, with a field of the wrong
// type, out of its range (the job's sizes: common/job_limits.h) or of an unknown name (a stop
// cause, a report's or decision's kind) is an error naming the key and the field. Absent
// optional fields keep their defaults. Callers decide what an error means for the job (a stop
// record that cannot be decoded stops every node: coordinator_watcher.h).
//
// The bytes of a record as JSON, bounded in size and depth; a JSON null when they are not JSON
// (the typed decoders below then say it is not an object).
inline nlohmann::json parseRecord(std::string_view bytes) { return parseBoundedJson(bytes); }

// Decodes the bytes read from `key` with `decode` (one of the decoders below, bound to its other
// arguments): an error naming `key` when the bytes are not a bounded JSON object, else what
// `decode` says.
template <typename Decode>
auto decodeRecord(std::string_view bytes, const std::string& key, Decode&& decode)
    -> decltype(decode(std::declval<const nlohmann::json&>())) {
  RecordReader in(bytes, key);
  if (!in.ok()) return in.status();
  return decode(in.doc());
}

// JSON form of a failure as it crosses the store (time as epoch microseconds).
nlohmann::json failureToJson(const WorkerFailure& failure);
Result<WorkerFailure> failureFromJson(const nlohmann::json& doc,
                                      const std::string& where = "a failure record");

// An agent's report of one attempt; `host` is written into every failure. A stall's rank states
// ("ranks") travel with it, at most kMaxReportedRankStates, waiting ranks without their stacks
// (trimWaitingStacks); a malformed state is dropped (the verdict counts its rank as silent).
inline constexpr size_t kMaxReportedRankStates = 4096;
nlohmann::json reportToJson(const AttemptReport& report, const std::string& host);
Result<AttemptReport> reportFromJson(const nlohmann::json& doc,
                                     const std::string& where = "a node's report");

// The host's decision with the number of agents that will read it (lost agents never do).
struct DecisionRecord {
  JobDecision decision;
  int readers = 0;
};
nlohmann::json decisionToJson(const JobDecision& decision, int readers);
// "restart", "succeeded", "failed", "stopped".
const char* decisionKindName(JobDecision::Kind kind);
// A missing `readers` reads as `default_readers`.
Result<DecisionRecord> decisionFromJson(const nlohmann::json& doc, int default_readers,
                                        const std::string& where = "the job's decision");

// Who stopped an attempt and why: the first claim of the attempt's stop key wins.
// kLeave: the claiming agent leaves the job (drained: SIGPWR or POST /leave, local_agent.h).
// kStall: the claiming agent's ranks stalled (a failure whose root cause the job's stall verdict
// names, job_decision.h).
enum class StopCause { kFailure, kSignal, kLost, kJoin, kEnd, kLeave, kStall };
inline constexpr int kByNobody = -1;  // the end of the job (no agent's doing)
struct StopClaim {
  int by = kByNobody;  // the claiming agent's group rank; for kLost, the lost agent's
  std::string reason;
  StopCause cause = StopCause::kFailure;
  int signal = 0;  // kSignal: the signal the claiming agent received
};
nlohmann::json stopToJson(const StopClaim& stop);
// `by` and `cause` are required. An error means the claim was not written by an agent of this
// job (or by one of another version): the job stops on every node, cause unknown.
Result<StopClaim> stopFromJson(const nlohmann::json& doc,
                               const std::string& where = "the attempt's stop claim");

// The three records every attempt reads, from their bytes (decodeRecord).
Result<StopClaim> stopFromRecord(std::string_view bytes, const std::string& key);
Result<AttemptReport> reportFromRecord(std::string_view bytes, const std::string& key);
Result<DecisionRecord> decisionFromRecord(std::string_view bytes, const std::string& key,
                                          int default_readers);

// An agent's rendezvous record. `previous_rank`: its rank in the last round (elastic), or -1.
nlohmann::json agentRecord(const AgentInfo& self, int previous_rank);
// An error naming `where` when the record is malformed (nproc is required, in
// 1..kMaxWorkersPerNode).
Result<AgentInfo> agentFromRecord(const nlohmann::json& doc, const std::string& where);
// The membership of the agent at `my_rank` among `agents` (in rank order).
Membership membershipOf(const std::vector<AgentInfo>& agents, int my_rank);
// Names one membership: its ids in rank order (FNV-1a, 16 hex digits, the same in every build).
std::string membersDigest(const std::vector<AgentInfo>& agents);

// An elastic round's members document (rdzv/round/<r>/members): {"attempt", "round",
// "members": [agentRecord + "index": its slot]} in rank order, or {"error": why} (the round
// failed), or {"job_over": outcome} (the job ended before the round closed).
//
// One member: its record and the slot it joined in.
struct RoundMember {
  AgentInfo agent;
  int previous_rank = -1;  // its rank in the round before (agentRecord), or -1
  int64_t slot = -1;
};
// A round member from the record in slot `slot`. kInternal naming `where` when the record is
// malformed (agentFromRecord).
Result<RoundMember> roundMemberFromRecord(const nlohmann::json& record, int64_t slot,
                                          const std::string& where);
// The members document of round `round`, members in rank order, starting attempt `attempt`.
nlohmann::json roundMembersToJson(int attempt, int round, const std::vector<RoundMember>& members);
// The members document of a round that failed (`error` says why) or that the end of the job
// closed (`outcome`: decisionKindName or the job's end).
nlohmann::json roundErrorToJson(const std::string& error);
nlohmann::json roundJobOverToJson(const std::string& outcome);

// A members document's members. kInternal naming the round when it is malformed (an error or
// job_over document is malformed here: see roundDocumentFromJson).
struct RoundMembers {
  int attempt = 0;
  std::vector<AgentInfo> agents;  // by group rank
  std::vector<int64_t> slots;     // agents[i]'s slot
};
Result<RoundMembers> roundMembersFromJson(const nlohmann::json& doc, int round);

// Any members document: the members, or the round's error, or the end of the job. kInternal
// naming the round when it is none of these (not an object, an error or job_over that is not
// text, members that are malformed).
struct RoundDocument {
  enum class Kind { kMembers, kError, kJobOver };
  Kind kind = Kind::kMembers;
  std::string message;   // kError: why; kJobOver: the outcome
  RoundMembers members;  // kMembers
};
Result<RoundDocument> roundDocumentFromJson(const nlohmann::json& doc, int round);

// What the agent in one slot of a closed round learns (rdzv/round/<r>/assigned/<slot>).
struct RoundAssignment {
  enum class Kind { kMember, kNotMember, kError, kJobOver };
  Kind kind = Kind::kNotMember;
  std::string message;  // kError, kJobOver: the members document's text
  int attempt = 0;
  Membership membership;  // kMember: without agents (Membership::agents is empty)
};
nlohmann::json assignmentToJson(const RoundAssignment& a);
// kInternal naming `where` when the record is malformed.
Result<RoundAssignment> assignmentFromJson(const nlohmann::json& doc, const std::string& where);

// Every slot's assignment of round `round` from its members document, for slots 1..`slots`
// (values[i] is slot i+1's): the members' ranks, "not a member" for the other slots, or the
// document's error or job_over for every slot. The members must have been validated
// (roundMembersFromJson) unless the document is an error or job_over.
std::vector<std::string> roundAssignments(const nlohmann::json& members_doc, int round,
                                          int64_t slots);
// The value of rdzv/round/<r>/closed for a round closed with `members_doc` over `slots` slots.
std::string closedMarker(const nlohmann::json& members_doc, int64_t slots);

}  // namespace cpprun::agent
