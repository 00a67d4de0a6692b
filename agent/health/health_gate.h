// HealthGate: whether this node takes part in the job's next round — a JobCoordinator decorator
// between the supervisor and the store coordinator. Before every join (the first and each
// re-join after a restart) it runs the node's health check (health_check.h); after every
// decision it looks for an exclusion (node_exclusion.h).
//
//   healthy node              joins: the inner coordinator's beginAttempt
//   unhealthy, may leave      does not join: `health_check_failed` event, beginAttempt ends
//                             with the reason (kUnavailable) and the agent leaves (exit 5,
//                             JobOutcome::kUnhealthy); the others' round closes without it
//   unhealthy, must join      (a static job, whose fixed nodes cannot go on without it, or the
//                             agent that serves a c10d store, which is the job's store) joins,
//                             and failure() makes the attempt's preparation fail, so the job
//                             fails at once on every node naming this node and its check
//                             instead of waiting out a join timeout or losing its store
//   decision excludes this    `node_excluded` event; the decision is turned into a failure for
//                             this node (exit 6, JobOutcome::kExcluded); the others re-form
//   decision excludes another `node_excluded` event; named in departures() for the report
//
// A one-node job has no round to stay out of and no inner coordinator: checkBeforeAttempt()
// runs the same check before every attempt (the first and each restart), and a failure ends the
// job before the attempt's workers start (exit 5, JobOutcome::kUnhealthy). The agent runs it as
// SupervisorOptions::before_attempt, and the attempt's preparation fails on failure().
//
// Thread safety: loop thread only (every JobCoordinator call, callback and accessor), except
// progress(), which is the inner coordinator's (any thread).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agent/coordination/job_coordinator.h"
#include "agent/health/health_check.h"
#include "agent/observability/event_log.h"

namespace cpprun::agent {

struct HealthGateOptions {
  std::string agent_id;           // this agent's AgentInfo::id (to recognise its own exclusion)
  bool must_join = false;         // see above
  EventLog* event_log = nullptr;  // may be null; must outlive the gate
};

class HealthGate : public JobCoordinator {
 public:
  // Why this agent left the job, when it did.
  enum class Left { kNo, kUnhealthy, kExcluded };

  // REQUIRES: `inner` and `check` outlive the gate (`check` may be disabled: every join passes).
  HealthGate(JobCoordinator& inner, HealthCheck& check, HealthGateOptions options);
  // One node: only checkBeforeAttempt() and the accessors may be used (the JobCoordinator calls
  // need an inner coordinator). REQUIRES: `check` outlives the gate.
  HealthGate(HealthCheck& check, HealthGateOptions options);

  // One node: runs the check before attempt `restart_count`; `done` runs on the loop with ok
  // (start the workers) or the failure ("health check failed: ...", also failure()), after the
  // `health_check_*` event and the ERROR lines. Passes at once when `check` is disabled.
  void checkBeforeAttempt(int restart_count, std::function<void(const Status&)> done);

  void beginAttempt(int restart_count, StartDone done) override;
  void announceStop(int restart_count, const std::string& reason, int signal) override;
  void announceStall(int restart_count, const std::string& reason) override;
  void endAttempt(int restart_count, const AttemptReport& report, DecisionDone done) override;
  RendezvousProgress progress() const override;

  // Must join but failed its check: why (the attempt must not start its workers); ok otherwise.
  Status failure() const { return failure_; }
  Left left() const { return left_; }
  // One line: why this agent left (empty when it did not).
  const std::string& leftReason() const { return left_reason_; }
  // Nodes that left the job while this agent was in it (excluded), one line each.
  const std::vector<std::string>& departures() const { return departures_; }

 private:
  void onHealth(int restart_count, const HealthResult& result, StartDone done);
  // The event and the ERROR line of a check's result; the failure's reason ("health check
  // failed: ...") or ok.
  Status noteResult(int restart_count, const HealthResult& result, const char* action);
  void onDecision(Result<JobDecision> decision, DecisionDone done);

  JobCoordinator* inner_;  // null on one node
  HealthCheck& check_;
  const HealthGateOptions opts_;
  Status failure_;
  Left left_ = Left::kNo;
  std::string left_reason_;
  std::vector<std::string> departures_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace cpprun::agent
