#include "agent/coordination/job_decision.h"

#include <algorithm>
#include <vector>

#include "agent/supervision/restart_policy.h"

namespace cpprun::agent {

JobDecision decideJob(const Membership& membership, const std::map<int, NodeOutcome>& outcomes,
                      const StopClaim& stop, const DecisionPolicy& policy, int restarts_used,
                      std::chrono::system_clock::time_point now) {
  const int world = membership.group_world_size;
  const int owner = stop.by;
  JobDecision d;
  d.restarts_used = restarts_used;
  std::vector<WorkerFailure> root_failures;
  std::vector<WorkerFailure> other_failures;
  bool any_failed = false;
  int lost = 0;
  std::string lost_error;
  std::string start_error;
  for (const auto& [rank, outcome] : outcomes) {
    if (outcome.lost) {
      ++lost;
      if (lost_error.empty()) lost_error = outcome.lost_error;
      // The lost agent's workers died with it (parent-death signal) or are cut off; stand in
      // for them so the report names the node.
      WorkerFailure stand_in;
      stand_in.host = membership.agents[static_cast<size_t>(rank)].host;
      for (int r = 0; r < rank; ++r) {
        stand_in.rank += membership.agents[static_cast<size_t>(r)].nproc;
      }
      stand_in.exit_code = 1;
      stand_in.time = now;
      stand_in.message = outcome.lost_error;
      root_failures.insert(root_failures.begin(), stand_in);
      continue;
    }
    const AttemptReport& report = outcome.report;
    if (report.kind == AttemptReport::Kind::kStartFailed && start_error.empty()) {
      start_error = "node " + std::to_string(rank) + ": " + report.error;
    }
    if (report.kind == AttemptReport::Kind::kSignalled && d.signal == 0) d.signal = report.signal;
    if (report.kind == AttemptReport::Kind::kFailed) any_failed = true;
    for (WorkerFailure wf : report.failures) {
      if (owner >= 0 && rank != owner) wf.collateral = !wf.teardown;
      (rank == owner ? root_failures : other_failures).push_back(std::move(wf));
    }
  }
  d.failures = std::move(root_failures);
  d.failures.insert(d.failures.end(), other_failures.begin(), other_failures.end());
  d.summary = stop.reason;
  const int survivors = world - lost;
  // The restart policy over every node's report (restart_policy.h); lost nodes, joins and
  // leaves are the host's own business between its start failure and its failures. The host's
  // store is the job's: it does not lose it and decide.
  AttemptFacts facts;
  facts.start_failed = !start_error.empty();
  facts.signal = d.signal;
  facts.workers_failed = any_failed;
  facts.peer_stopped = owner >= 0;
  const AttemptVerdict verdict = decideAttempt(facts, restarts_used < policy.max_restarts);
  if (verdict.end == AttemptEnd::kStartFailed) {
    d.kind = JobDecision::Kind::kFailed;
    d.summary = start_error;
  } else if (verdict.end == AttemptEnd::kSignalled) {
    d.kind = JobDecision::Kind::kStopped;
  } else if (lost > 0) {
    // Static: the lost node cannot be replaced. Elastic: go on with the others while enough
    // are left; a membership change does not use the restart budget.
    d.summary = lost_error;
    if (policy.elastic && survivors + policy.waiting_nodes >= policy.min_nodes) {
      d.kind = JobDecision::Kind::kRestart;
      d.membership_change = true;
      if (policy.waiting_nodes > 0) {
        d.summary += "; " + std::to_string(policy.waiting_nodes) + " spare node(s) waiting";
      }
    } else {
      d.kind = JobDecision::Kind::kFailed;
      if (policy.elastic) {
        d.summary += "; " + std::to_string(survivors) + " nodes left, fewer than the minimum " +
                     std::to_string(policy.min_nodes);
      }
    }
  } else if (stop.cause == StopCause::kLeave && !any_failed) {
    // A drained node: the others re-form without it (the leave was refused up front when that
    // would leave fewer than min_nodes with the spares).
    d.kind = JobDecision::Kind::kRestart;
    d.membership_change = true;
  } else if (stop.cause == StopCause::kJoin && !any_failed) {
    d.kind = JobDecision::Kind::kRestart;
    d.membership_change = true;
  } else if (verdict.restart) {
    d.kind = JobDecision::Kind::kRestart;
    d.restarts_used = restarts_used + 1;
  } else if (verdict.end == AttemptEnd::kWorkersFailed ||
             verdict.end == AttemptEnd::kStoppedByPeer) {
    d.kind = JobDecision::Kind::kFailed;  // the budget is spent
  } else {
    d.kind = JobDecision::Kind::kSucceeded;
  }
  return d;
}

void compactDecision(JobDecision& decision) {
  auto& f = decision.failures;
  if (f.size() <= kMaxDecisionFailures) return;
  const size_t total = f.size();
  std::stable_partition(f.begin(), f.end(), [](const WorkerFailure& w) {
    return !w.teardown && !w.waiting && !w.collateral;
  });
  f.resize(kMaxDecisionFailures);
  decision.summary += " (the report lists " + std::to_string(kMaxDecisionFailures) + " of " +
                      std::to_string(total) + " failures; each node's own lists its ranks)";
}

std::optional<JobStallVerdict> applyJobStallVerdict(const Membership& membership,
                                                    const std::map<int, NodeOutcome>& outcomes,
                                                    JobDecision& decision) {
  JobStallVerdict out;
  for (const auto& [rank, outcome] : outcomes) {
    if (outcome.lost) continue;
    const size_t node = static_cast<size_t>(rank);
    const std::string host = node < membership.agents.size() ? membership.agents[node].host : "";
    for (RankState s : outcome.report.rank_states) {
      s.node = rank;
      s.host = host;
      out.states.push_back(std::move(s));
    }
  }
  if (out.states.empty()) return std::nullopt;
  auto verdict = decideStall(out.states);
  if (!verdict) return std::nullopt;
  out.verdict = std::move(*verdict);
  if (!out.verdict.culprits.empty()) {
    out.culprit_node = out.states[out.verdict.culprits.front()].node;
  }
  applyStallVerdict(out.verdict, out.states, decision.failures);
  // Root cause first: the culprits (by the times applyStallVerdict gave them), then the rest.
  std::stable_sort(decision.failures.begin(), decision.failures.end(),
                   [](const WorkerFailure& a, const WorkerFailure& b) {
                     const bool a_first = !a.teardown && !a.collateral && !a.waiting;
                     const bool b_first = !b.teardown && !b.collateral && !b.waiting;
                     if (a_first != b_first) return a_first;
                     return a_first && a.time < b.time;
                   });
  decision.summary = "hang: " + out.verdict.summary;
  return out;
}

}  // namespace cpprun::agent
