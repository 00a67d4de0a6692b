// Node exclusion: whether the node whose workers caused an attempt's failure has now caused
// `after` failures within `window` and leaves the job, so a sick node does not spend the job's
// whole restart budget. Pure: the decider (store_job_coordinator.cc) keeps the history in the
// store (job_keys.h, kExclusionHistoryKey: one line per root-cause failure, appended, so it
// survives a change of decider on the etcd backend) and applies the result to its decision.
//
// A node is counted by its agent's id (AgentInfo::id: host, pid and a random part): an agent
// restarted by an operator or the scheduler is a new node with a clean record. Only failures
// whose root cause was the node's own workers count (the stop claim's owner reported a worker
// failure); lost nodes, signals, start failures and the other nodes' collateral failures do not.
//
// Exclusion needs an elastic job that can go on without the node (at least MIN left, counting the
// hot spares waiting to join: one takes its place) and a node
// that may leave (on the c10d backend the store host's agent is the job's store: it is never
// excluded; exclusionBlocked says why). The failure that triggers it is charged to the node, not
// the job: the re-formed group's attempt does not use the restart budget.
//
// Thread safety: free functions on values; safe from any thread.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "agent/coordination/job_coordinator.h"

namespace cpprun::agent {

struct ExclusionPolicy {
  int after = 3;                                       // --exclude-after K; 0: never exclude
  std::chrono::seconds window{std::chrono::hours(1)};  // --exclude-window SECONDS
};

// One root-cause failure of a node, as the history holds it.
struct NodeFailureRecord {
  std::string agent_id;
  std::string host;
  int64_t unix_ms = 0;
};

// "<unix ms>\t<agent id>\t<host>\n": one line of the history (ids and hosts hold no tab).
std::string encodeFailureRecord(const NodeFailureRecord& record);
// Every well-formed line of `history`; malformed lines are skipped.
std::vector<NodeFailureRecord> decodeFailureHistory(const std::string& history);

// How many of `history`'s records are `agent_id`'s within `window` before `now_ms`.
int failuresWithin(const std::vector<NodeFailureRecord>& history, const std::string& agent_id,
                   std::chrono::seconds window, int64_t now_ms);

// The history the decider keeps, so that it does not grow with the job (4,500 restarts made it
// 270 kB, read at every decision): the records within `window` before `now_ms` (and any after
// it: another decider's clock), and of those at most the newest `per_agent` of each agent.
// With per_agent >= --exclude-after every exclusion comes out as with the whole history; a
// count above per_agent ("caused N failures") reads as per_agent. In the history's order.
inline constexpr int kFailureRecordsPerAgent = 64;
std::vector<NodeFailureRecord> trimFailureHistory(const std::vector<NodeFailureRecord>& history,
                                                  std::chrono::seconds window, int64_t now_ms,
                                                  int per_agent);
std::string encodeFailureHistory(const std::vector<NodeFailureRecord>& history);

// What the decider knows about the attempt's culprit when it decides.
struct ExclusionInput {
  int culprit_rank = -1;  // group rank of the node whose workers caused the failure
  int failures = 0;       // its failures within the window, this one included
  int survivors = 0;      // live nodes of the attempt, the culprit included
  int waiting = 0;        // hot spares waiting to join: one takes the culprit's place
  bool elastic = false;
  int min_nodes = 1;
  bool culprit_may_leave = true;  // false: the c10d store host
};

// Why a node that reached the threshold stays (empty: it is excluded, or not at the
// threshold, or exclusion is off).
std::string exclusionBlocked(const ExclusionPolicy& policy, const ExclusionInput& in);
bool shouldExclude(const ExclusionPolicy& policy, const ExclusionInput& in);

// Turns `decision` (decideJob's, for an attempt whose root cause was the culprit's workers) into
// the exclusion of the culprit: a membership change that re-forms the group without it and
// does not use the budget (`restarts_before`: the budget used before this attempt).
void applyExclusion(const Membership& membership, const ExclusionPolicy& policy,
                    const ExclusionInput& in, int restarts_before, JobDecision& decision);

}  // namespace cpprun::agent
