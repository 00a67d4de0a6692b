// SingleNodeRendezvous: the rendezvous of a one-node job, where there is nothing to agree on —
// this agent is node 0 of 1, its workers are the whole world. It still reports like the real
// rendezvous (rendezvous_rounds.h) so an operator's tools see the same events and /status
// fields whatever the job's size: "rendezvous_started" (backend "single-node") before the first
// attempt's workers are made, "rendezvous_completed" once they are, and the progress /status
// shows. Later attempts (restarts) do not rendezvous again.
//
// Thread safety: the agent's loop thread only.
#pragma once

#include <string>
#include <utility>

#include "agent/coordination/job_coordinator.h"
#include "agent/observability/event_log.h"

namespace cpprun::agent {

class SingleNodeRendezvous {
 public:
  // `event_log` may be null; otherwise it must outlive this object. `host`: this node's name.
  SingleNodeRendezvous(EventLog* event_log, std::string host)
      : event_log_(event_log), host_(std::move(host)) {}

  // Before an attempt's workers are made: the first round begins (until one completes).
  void begin();
  // The attempt's `world_size` workers were made: the first round completes.
  void complete(int world_size);
  RendezvousProgress progress() const { return progress_; }

 private:
  EventLog* event_log_;
  std::string host_;
  RendezvousProgress progress_;
};

}  // namespace cpprun::agent
