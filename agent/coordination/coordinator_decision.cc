#include "agent/coordination/coordinator_decision.h"

#include <algorithm>
#include <set>
#include <sstream>

#include "agent/coordination/job_decision.h"
#include "agent/coordination/job_keys.h"
#include "agent/coordination/node_exclusion.h"
#include "common/logging.h"
#include "rendezvous/store.h"

namespace cpprun::agent {

using nlohmann::json;
using rendezvous::StoreTimeout;
using rendezvous::toString;

namespace {

// How long after seeing an attempt's stop the decider waits for a member's agent to acknowledge
// it (heartbeat liveness: cpprun's TCP store). A live agent's watcher waits on the stop key and
// acknowledges within a store round trip, before its workers' teardown (which may take up to
// --shutdown-timeout). A member that has not acknowledged after this long, and whose heartbeat
// has not moved since the stop, is dead or stopped: the decider gives it up as lost at once
// instead of waiting out the heartbeat bound (keep_alive_interval x keep_alive_max_attempt,
// 15 s by default). 1 s is hundreds of round trips, room for an agent descheduled for a moment;
// one whose heartbeat moved keeps its place (it reports once its teardown is done).
constexpr std::chrono::milliseconds kStopAckBound{1000};

}  // namespace

Result<JobDecision> DecisionExchange::end(int n, const AttemptReport& report) {
  s_.control_client->set(attemptReportKey(n, s_.myRank()),
                         reportToJson(report, s_.opts.self.host).dump());
  JobDecision decision;
  bool decides = s_.isHost();
  if (!decides) {
    // The decision comes when every node's workers have exited, however long the others
    // train after this node's finished: no deadline. Liveness bounds the wait instead: a lost
    // store host ends it (s_.store_status), a lost node makes the host decide without it, and
    // (host_per_round) a lost node 0 makes the lowest live member decide.
    const Status decided = s_.waitKeys(
        {attemptDecisionKey(n)}, kNoDeadline,
        "attempt " + std::to_string(n) + ": waiting for " + s_.deciderName() + "'s decision",
        [&] {
          if (!s_.takesOverDecision()) return SliceVerdict::goOn();
          decides = true;
          return SliceVerdict::done();
        },
        [&] {
          return "attempt " + std::to_string(n) +
                 ": this node's workers are done; waiting for the other nodes' workers "
                 "(the job's outcome)";
        });
    if (!decided.isOk()) return decided;
    if (decides && s_.control_client->check({attemptDecisionKey(n)})) decides = false;
    if (decides) {
      CPPRUN_LOG(kWarn) << "attempt " << n
                        << ": node 0 was lost; this node decides for the job in its place";
    }
  }
  if (decides) {
    Result<JobDecision> decided = decide(n);
    if (!decided.isOk()) return decided.status();
    compactDecision(decided.value());
    int readers = s_.worldSize();
    {
      MutexLock lock(s_.mu);
      readers -= static_cast<int>(s_.lost_agents.size());
    }
    s_.decision_readers = readers;
    Result<JobDecision> published = publishDecision(n, decided.value(), readers);
    if (!published.isOk()) return published.status();
    decision = published.value();
    s_.restarts_used = decision.restarts_used;
    s_.next_attempt = n + 1;
  } else {
    Result<JobDecision> read = readDecision(n);
    if (!read.isOk()) return read.status();
    decision = read.value();
    s_.next_attempt = n + 1;
    s_.restarts_used = decision.restarts_used;
  }
  {
    MutexLock lock(s_.mu);
    s_.decided_attempt = n;
  }
  if (decision.kind != JobDecision::Kind::kRestart) finishJob(n, decision);
  return decision;
}

Result<JobDecision> DecisionExchange::decide(int n) {
  const Result<Membership> full = s_.fullMembership(*s_.control_client);
  if (!full.isOk()) return full.status();
  const Membership& membership = full.value();
  const int world = membership.group_world_size;
  std::map<int, NodeOutcome> outcomes;
  WaitAnnouncer announcer(s_);
  StopSeen seen;
  while (static_cast<int>(outcomes.size()) < world) {
    std::vector<std::string> missing;
    std::vector<int> missing_ranks;
    for (int r = 0; r < world; ++r) {
      if (outcomes.count(r)) continue;
      MutexLock lock(s_.mu);
      auto lost = s_.lost_agents.find(r);
      if (lost != s_.lost_agents.end()) {
        outcomes[r] = NodeOutcome{true, lost->second, {}};
        continue;
      }
      missing.push_back(attemptReportKey(n, r));
      missing_ranks.push_back(r);
    }
    if (missing.empty()) break;
    auto slice = s_.opts.keep_alive_interval;
    if (s_.acksStops() && seen.attempt != n && s_.control_client->check({attemptStopKey(n)})) {
      Result<StopSeen> noted = s_.noteStopSeen(*s_.control_client, n, s_.clock().now());
      if (!noted.isOk()) return noted.status();
      seen = std::move(noted.value());
    }
    if (seen.attempt == n) {
      const auto now = s_.clock().now();
      const auto ack_deadline = seen.at + kStopAckBound;
      if (now >= ack_deadline) {
        if (giveUpUnacknowledged(n, membership, missing_ranks, seen)) continue;
      } else {
        slice = std::min(slice, std::chrono::ceil<std::chrono::milliseconds>(ack_deadline - now));
      }
    }
    try {
      s_.control_client->wait(missing, slice);
    } catch (const StoreTimeout&) {
      announcer.maybeAnnounce([&] {
        return "attempt " + std::to_string(n) + ": waiting for " +
               std::to_string(missing_ranks.size()) + " of " + std::to_string(world) + " nodes (" +
               s_.nodeNames(missing_ranks) + ") to report how it ended";
      });
      continue;  // look at the lost agents again
    }
    auto values = s_.control_client->multiGet(missing);
    for (size_t i = 0; i < missing.size(); ++i) {
      outcomes[missing_ranks[i]] = NodeOutcome{false, "", readReport(missing[i], values[i])};
    }
  }
  StopClaim stop;
  std::string tampered_stop;
  if (s_.control_client->check({attemptStopKey(n)})) {
    Result<StopClaim> claim =
        stopFromRecord(toString(s_.control_client->get(attemptStopKey(n))), attemptStopKey(n));
    if (claim.isOk() && claim.value().by == kByNobody) {
      // The end of the job is claimed only after its decision (finishJob), and this is the
      // decision being made: a claim by nobody now was not written by an agent of this job.
      tampered_stop = "it says the job ended before its decision";
      stop = {kByNobody, tampered_stop, StopCause::kFailure, 0};
    } else if (claim.isOk()) {
      stop = std::move(claim).value();
    } else {
      tampered_stop = claim.status().message();
      stop = {kByNobody, tampered_stop, StopCause::kFailure, 0};
    }
  }
  DecisionPolicy policy;
  policy.max_restarts = s_.opts.max_restarts;
  policy.elastic = s_.opts.elastic;
  policy.min_nodes = s_.opts.min_nodes;
  if (s_.opts.elastic) {
    Result<int> waiting = s_.rounds.waitingIn(*s_.control_client, s_.rounds.nextRound());
    if (!waiting.isOk()) return waiting.status();
    policy.waiting_nodes = waiting.value();
  }
  const auto now = SystemClock::now();
  JobDecision d = decideJob(membership, outcomes, stop, policy, s_.restarts_used, now);
  // A hang: the culprit's node is charged, whoever noticed the stall first.
  int charged = stop.by;
  bool charged_by_verdict = false;
  if (auto hang = applyJobStallVerdict(membership, outcomes, d)) {
    CPPRUN_LOG(kError) << "attempt " << n << " hung: " << hang->verdict.summary;
    emitEvent(s_.opts.event_log, "stall_verdict",
              stallVerdictEvent(n, hang->verdict, hang->states));
    charged = hang->culprit_node;
    charged_by_verdict = true;
  }
  considerExclusion(membership, outcomes, stop, charged, charged_by_verdict, policy.waiting_nodes,
                    now, d);
  if (!tampered_stop.empty()) {
    // Every node stopped on it (coordinator_watcher.h); the job cannot trust its keys any more.
    d.kind = JobDecision::Kind::kFailed;
    d.summary = "attempt " + std::to_string(n) +
                "'s stop claim was not written by an agent of "
                "this job (" +
                tampered_stop + "); the job stops (docs/security.md)";
  }
  s_.restarts_used = d.restarts_used;
  return d;
}

void DecisionExchange::considerExclusion(const Membership& membership,
                                         const std::map<int, NodeOutcome>& outcomes,
                                         const StopClaim& stop, int charged, bool by_verdict,
                                         int waiting_nodes, SystemClock::time_point now,
                                         JobDecision& d) {
  if (s_.opts.exclude_after <= 0 || charged < 0 ||
      (stop.cause != StopCause::kFailure && stop.cause != StopCause::kStall)) {
    return;
  }
  if (d.kind != JobDecision::Kind::kRestart && d.kind != JobDecision::Kind::kFailed) return;
  if (d.membership_change || d.signal != 0) return;
  const auto culprit = outcomes.find(charged);
  // The stop's owner counts when its own workers failed; a hang's culprit node counts whatever
  // its report says (the peer's stall stopped it).
  if (culprit == outcomes.end() || culprit->second.lost ||
      (!by_verdict && culprit->second.report.kind != AttemptReport::Kind::kFailed)) {
    return;
  }
  const AgentInfo& agent = membership.agents.at(static_cast<size_t>(charged));
  const int64_t now_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count();
  s_.control_client->append(
      kExclusionHistoryKey,
      rendezvous::toBytes(encodeFailureRecord({agent.id, agent.host, now_ms})));
  const rendezvous::Bytes stored = s_.control_client->get(kExclusionHistoryKey);
  const auto history = decodeFailureHistory(toString(stored));
  ExclusionPolicy policy{s_.opts.exclude_after, s_.opts.exclude_window};
  ExclusionInput in;
  in.culprit_rank = charged;
  in.failures = failuresWithin(history, agent.id, policy.window, now_ms);
  // The history keeps what decides (node_exclusion.h); unless another decider wrote it since.
  const auto kept = trimFailureHistory(history, policy.window, now_ms,
                                       std::max(policy.after, kFailureRecordsPerAgent));
  if (kept.size() < history.size()) {
    s_.control_client->compareSet(kExclusionHistoryKey, stored,
                                  rendezvous::toBytes(encodeFailureHistory(kept)));
  }
  in.elastic = s_.opts.elastic;
  in.min_nodes = s_.opts.min_nodes;
  int lost = 0;
  for (const auto& [rank, outcome] : outcomes) lost += outcome.lost ? 1 : 0;
  in.survivors = membership.group_world_size - lost;
  in.waiting = waiting_nodes;
  // c10d: the store host's agent is the job's store; it cannot leave without ending the job.
  in.culprit_may_leave = s_.opts.host_per_round || charged != membership.group_rank;
  const int restarts_before = s_.restarts_used;
  if (const std::string blocked = exclusionBlocked(policy, in); !blocked.empty()) {
    CPPRUN_LOG(kWarn) << "node " << charged << " (" << agent.host << ") caused " << in.failures
                      << " failures within " << policy.window.count()
                      << " s but is not excluded: " << blocked;
    return;
  }
  applyExclusion(membership, policy, in, restarts_before, d);
  if (d.excluded) {
    CPPRUN_LOG(kError) << d.summary;
  }
}

void DecisionExchange::finishJob(int n, const JobDecision& decision) {
  s_.claimStop(*s_.control_client, n, {kByNobody, "the job ended", StopCause::kEnd, 0});
  if (s_.isHost() && s_.opts.elastic) {
    s_.rounds.endRounds(*s_.control_client, decisionKindName(decision.kind));
  }
  // Lost agents never read it: the host counts only the live ones in ("readers").
  const int64_t out = s_.control_client->takeTicket(attemptDoneKey(n));
  if (out >= s_.decision_readers) s_.control_client->set(attemptAllDoneKey(n), "1");
  if (s_.isHost()) {
    const auto linger_end = s_.clock().now() + s_.opts.final_linger;
    try {
      s_.control_client->wait({attemptAllDoneKey(n)}, s_.opts.final_linger);
      // Spares waiting in the next round read the outcome too (c10d: from this store).
      if (s_.opts.elastic &&
          s_.control_client->tickets(roundJoinedKey(s_.rounds.nextRound())) > 0) {
        s_.control_client->wait({attemptSparesAllDoneKey(n)},
                                std::max(std::chrono::milliseconds(1),
                                         std::chrono::duration_cast<std::chrono::milliseconds>(
                                             linger_end - s_.clock().now())));
      }
    } catch (const StoreTimeout&) {
      CPPRUN_LOG(kWarn) << "not every node read the job's outcome within "
                        << s_.opts.final_linger.count() / 1000.0 << " s; ending anyway";
    }
  }
  MutexLock lock(s_.mu);
  s_.job_over = true;
}

Result<JobDecision> DecisionExchange::publishDecision(int n, const JobDecision& decision,
                                                      int readers) {
  const std::string doc = decisionToJson(decision, readers).dump();
  if (!s_.opts.host_per_round) {
    s_.control_client->set(attemptDecisionKey(n), doc);
    return decision;
  }
  const std::string stored =
      toString(s_.control_client->compareSet(attemptDecisionKey(n), {}, rendezvous::toBytes(doc)));
  if (stored == doc) return decision;
  return readDecision(n);
}

AttemptReport DecisionExchange::readReport(const std::string& key,
                                           const std::vector<uint8_t>& bytes) {
  Result<AttemptReport> report = reportFromRecord(toString(bytes), key);
  if (report.isOk()) return std::move(report).value();
  // A node's report that cannot be decoded: the node failed as far as the job knows.
  CPPRUN_LOG(kError) << report.status().message();
  AttemptReport failed;
  failed.kind = AttemptReport::Kind::kFailed;
  failed.error = "its report cannot be decoded: " + report.status().message();
  return failed;
}

Result<JobDecision> DecisionExchange::readDecision(int n) {
  Result<DecisionRecord> record =
      decisionFromRecord(toString(s_.control_client->get(attemptDecisionKey(n))),
                         attemptDecisionKey(n), s_.worldSize());
  if (!record.isOk()) return record.status();
  s_.decision_readers = record.value().readers;
  return record.value().decision;
}

bool DecisionExchange::giveUpUnacknowledged(int n, const Membership& m,
                                            const std::vector<int>& missing, const StopSeen& seen) {
  std::set<int> acked;
  const std::string acks_key = attemptStopAcksKey(n);
  if (s_.control_client->check({acks_key})) {
    std::istringstream in(toString(s_.control_client->get(acks_key)));
    for (std::string line; std::getline(in, line);) {
      if (!line.empty()) acked.insert(std::atoi(line.c_str()));
    }
  }
  std::vector<int> silent;
  for (int r : missing) {
    if (r == m.group_rank || acked.count(r) || !seen.beats.count(r)) continue;
    silent.push_back(r);
  }
  if (silent.empty()) return false;
  const std::map<int, int64_t> beats = readHeartbeats(*s_.control_client, m, silent);
  bool gave_up = false;
  for (int r : silent) {
    if (beats.at(r) != seen.beats.at(r)) continue;  // alive: slow to tear down
    const AgentInfo& info = m.agents[static_cast<size_t>(r)];
    s_.memberLost(n, {r, "the agent of node " + std::to_string(r) + " (" + info.host +
                             ") stopped responding: it did not acknowledge the stop of attempt " +
                             std::to_string(n) + " within " + formatSeconds(kStopAckBound) +
                             " and its heartbeat has not moved since"});
    gave_up = gave_up || !s_.lostReason(r).empty();
  }
  return gave_up;
}

}  // namespace cpprun::agent
