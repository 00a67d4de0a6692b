// Job keys: where the job protocol (job_coordinator.h) keeps its records in the store, and the
// JSON form of each record. One place for the key scheme, so that every backend of the
// coordination seam (rendezvous::Store: cpprun's TCP store, etcd) and every reader of the store
// (docs/rendezvous.md, tests) agree on it. Malformed records decode to a safe value or an error
// naming the record, never an exception.
//
// Keys live under "cpprun/" and are kept across attempts:
//   cpprun/rdzv/node/<rank>               static: an agent's record
//   cpprun/rdzv/joined                    static: tickets of joined agents (Store::takeTicket)
//   cpprun/rdzv/round                     elastic: the round agents join now
//   cpprun/rdzv/round/<r>/joined          elastic: slots taken in round r (tickets)
//   cpprun/rdzv/round/<r>/agent/<slot>    elastic: an agent's record
//   cpprun/rdzv/round/<r>/members         elastic: the round's members (or its error, or job_over)
//   cpprun/heartbeat/<agent id>           a counter each agent bumps every keep-alive interval
//   cpprun/alive/<agent id>               etcd: the agent's host, under its lease (LeaseLiveness)
//   cpprun/attempt/<n>/ready/<rank>       static: the agent tore attempt n-1 down
//   cpprun/attempt/<n>/go                 the host's NCCL id ("!<error>": the attempt failed)
//   cpprun/attempt/<n>/stop               the first stop claim (compare-and-set)
//   cpprun/attempt/<n>/report/<rank>      how an agent's workers ended
//   cpprun/attempt/<n>/decision           the host's decision for the job
//   cpprun/attempt/<n>/done, all_done     agents that read the final decision (done: tickets)
//
// Thread safety: free functions on values; safe from any thread.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "agent/failure_report.h"
#include "agent/job_coordinator.h"
#include "common/status.h"

namespace cpprun::agent {

inline constexpr const char* kStaticJoinedKey = "cpprun/rdzv/joined";
inline constexpr const char* kRoundCounterKey = "cpprun/rdzv/round";
inline constexpr const char* kAliveKeyPrefix = "cpprun/alive/";

std::string attemptKey(int attempt, const std::string& what);
std::string nodeKey(int rank);
std::string heartbeatKey(const std::string& agent_id);
std::string roundKey(int round, const std::string& what);

// JSON form of a failure as it crosses the store (time as epoch microseconds).
nlohmann::json failureToJson(const WorkerFailure& failure);
WorkerFailure failureFromJson(const nlohmann::json& doc);

// An agent's report of one attempt; `host` is written into every failure. A malformed report
// decodes as kFailed without failures.
nlohmann::json reportToJson(const AttemptReport& report, const std::string& host);
AttemptReport reportFromJson(const nlohmann::json& doc);

// The host's decision with the number of agents that will read it (lost agents never do).
struct DecisionRecord {
  JobDecision decision;
  int readers = 0;
};
nlohmann::json decisionToJson(const JobDecision& decision, int readers);
// "restart", "succeeded", "failed", "stopped".
const char* decisionKindName(JobDecision::Kind kind);
// kInternal when the record is not a JSON object; a missing `readers` reads as
// `default_readers`.
Result<DecisionRecord> decisionFromJson(const nlohmann::json& doc, int default_readers);

// Who stopped an attempt and why: the first claim of the attempt's stop key wins.
enum class StopCause { kFailure, kSignal, kLost, kJoin, kEnd };
inline constexpr int kByNobody = -1;  // the end of the job (no agent's doing)
struct StopClaim {
  int by = kByNobody;  // the claiming agent's group rank; for kLost, the lost agent's
  std::string reason;
  StopCause cause = StopCause::kFailure;
  int signal = 0;  // kSignal: the signal the claiming agent received
};
nlohmann::json stopToJson(const StopClaim& stop);
// A malformed claim reads as by nobody, with no reason and no signal (cause kEnd).
StopClaim stopFromJson(const nlohmann::json& doc);

// An agent's rendezvous record. `previous_rank`: its rank in the last round (elastic), or -1.
nlohmann::json agentRecord(const AgentInfo& self, int previous_rank);
// kInternal naming `where` when the record lacks an integer nproc.
Result<AgentInfo> agentFromRecord(const nlohmann::json& doc, const std::string& where);
// The membership of the agent at `my_rank` among `agents` (in rank order).
Membership membershipOf(const std::vector<AgentInfo>& agents, int my_rank);

}  // namespace cpprun::agent
