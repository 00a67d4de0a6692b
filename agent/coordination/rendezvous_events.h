// The rendezvous events of the --event-log (docs/operations.md), written in one place for every
// rendezvous: the rounds of a multi-node job (rendezvous_rounds.h) and the one round of a
// single-node job (single_node_rendezvous.h), so an operator's tools see one schema whatever the
// job's size.
//
// Thread safety: as EventLog::emit (any thread).
#pragma once

#include <string>
#include <vector>

#include "agent/observability/event_log.h"

namespace cpprun::agent {

// "rendezvous_started": round `round` begins. `backend`: "single-node", "static", "c10d" or
// "etcd".
struct RendezvousStartedEvent {
  int round = 0;
  std::string backend;
  int min_nodes = 1;
  int max_nodes = 1;
};
void emitRendezvousStarted(EventLog* log, const RendezvousStartedEvent& e);

// "rendezvous_completed": round `round` closed with `nodes` agents and `world_size` workers;
// this agent is node `group_rank` with ranks from `base_rank`; `duration_s` from its join.
struct RendezvousCompletedEvent {
  int round = 0;
  int nodes = 0;
  int world_size = 0;
  int group_rank = 0;
  int base_rank = 0;
  std::vector<std::string> hosts;
  double duration_s = 0;
};
void emitRendezvousCompleted(EventLog* log, const RendezvousCompletedEvent& e);

}  // namespace cpprun::agent
