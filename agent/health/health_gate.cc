#include "agent/health/health_gate.h"

#include "common/logging.h"

namespace cpprun::agent {

HealthGate::HealthGate(JobCoordinator& inner, HealthCheck& check, HealthGateOptions options)
    : inner_(&inner), check_(check), opts_(std::move(options)) {}

HealthGate::HealthGate(HealthCheck& check, HealthGateOptions options)
    : inner_(nullptr), check_(check), opts_(std::move(options)) {}

void HealthGate::checkBeforeAttempt(int restart_count, std::function<void(const Status&)> done) {
  if (!check_.enabled()) {
    done(Status::ok());
    return;
  }
  std::weak_ptr<bool> alive = alive_;
  check_.run(restart_count, [this, alive, restart_count,
                             done = std::move(done)](const HealthResult& result) {
    if (alive.expired()) return;
    failure_ = noteResult(restart_count, result, "fail_job");
    if (!failure_.isOk()) {
      CPPRUN_LOG(kError) << "the job ends before attempt " << restart_count
                         << "'s workers start (one node: there is no other to go on with)";
    }
    done(failure_);
  });
}

void HealthGate::beginAttempt(int restart_count, StartDone done) {
  if (!check_.enabled()) {
    inner_->beginAttempt(restart_count, std::move(done));
    return;
  }
  std::weak_ptr<bool> alive = alive_;
  check_.run(restart_count, [this, alive, restart_count,
                             done = std::move(done)](const HealthResult& result) mutable {
    if (alive.expired()) return;
    onHealth(restart_count, result, std::move(done));
  });
}

Status HealthGate::noteResult(int restart_count, const HealthResult& result, const char* action) {
  if (result.healthy) {
    CPPRUN_LOG(kDebug) << "health check passed in " << result.seconds << " s";
    emitEvent(opts_.event_log, "health_check_passed",
              {{"attempt", restart_count}, {"seconds", result.seconds}});
    return Status::ok();
  }
  emitEvent(opts_.event_log, "health_check_failed",
            {{"attempt", restart_count},
             {"check", result.check},
             {"reason", result.reason},
             {"output", result.output_tail},
             {"seconds", result.seconds},
             {"action", action}});
  std::string text = std::string("this node failed its health check before ") +
                     (inner_ ? "joining attempt " : "attempt ") + std::to_string(restart_count) +
                     ": " + result.reason;
  if (!result.output_tail.empty()) {
    text += "; its last output:";
    for (const std::string& line : result.output_tail) text += "\n  " + line;
  }
  CPPRUN_LOG(kError) << text;
  return Status(StatusCode::kUnavailable, "health check failed: " + result.reason);
}

void HealthGate::onHealth(int restart_count, const HealthResult& result, StartDone done) {
  const Status noted = noteResult(restart_count, result, opts_.must_join ? "fail_job" : "leave");
  if (noted.isOk()) {
    failure_ = Status::ok();
    inner_->beginAttempt(restart_count, std::move(done));
    return;
  }
  const std::string& reason = noted.message();
  if (opts_.must_join) {
    CPPRUN_LOG(kError) << "this node cannot leave the job (a static job, or it serves the c10d "
                          "store): the job fails with it";
    failure_ = noted;
    inner_->beginAttempt(restart_count, std::move(done));
    return;
  }
  CPPRUN_LOG(kError) << "this node does not join; the job goes on with the other nodes";
  left_ = Left::kUnhealthy;
  left_reason_ =
      "this node left the job before attempt " + std::to_string(restart_count) + ": " + reason;
  done(Status(StatusCode::kUnavailable, left_reason_));
}

void HealthGate::announceStop(int restart_count, const std::string& reason, int signal) {
  inner_->announceStop(restart_count, reason, signal);
}

void HealthGate::announceStall(int restart_count, const std::string& reason) {
  inner_->announceStall(restart_count, reason);
}

void HealthGate::endAttempt(int restart_count, const AttemptReport& report, DecisionDone done) {
  std::weak_ptr<bool> alive = alive_;
  inner_->endAttempt(restart_count, report,
                     [this, alive, done = std::move(done)](Result<JobDecision> decision) mutable {
                       if (alive.expired()) return;
                       onDecision(std::move(decision), std::move(done));
                     });
}

void HealthGate::onDecision(Result<JobDecision> decision, DecisionDone done) {
  if (!decision.isOk() || !decision.value().excluded) {
    done(std::move(decision));
    return;
  }
  JobDecision d = decision.value();
  const ExcludedNode& e = *d.excluded;
  const bool self = e.agent_id == opts_.agent_id;
  emitEvent(opts_.event_log, "node_excluded",
            {{"node_rank", e.rank},
             {"failed_host", e.host},
             {"agent_id", e.agent_id},
             {"reason", e.reason},
             {"self", self}});
  const std::string line =
      "node " + std::to_string(e.rank) + " (" + e.host + ") was excluded: " + e.reason;
  if (!self) {
    departures_.push_back(line);
    done(std::move(d));
    return;
  }
  CPPRUN_LOG(kError) << "this node is excluded from the job: " << e.reason
                     << "; its agent leaves and the others go on without it";
  left_ = Left::kExcluded;
  left_reason_ = "this node (" + e.host + ") was excluded from the job: " + e.reason;
  d.kind = JobDecision::Kind::kFailed;
  done(std::move(d));
}

RendezvousProgress HealthGate::progress() const { return inner_->progress(); }

}  // namespace cpprun::agent
