#include "agent/coordination/rendezvous_events.h"

namespace cpprun::agent {

void emitRendezvousStarted(EventLog* log, const RendezvousStartedEvent& e) {
  emitEvent(log, "rendezvous_started",
            {{"round", e.round},
             {"backend", e.backend},
             {"min_nodes", e.min_nodes},
             {"max_nodes", e.max_nodes}});
}

void emitRendezvousCompleted(EventLog* log, const RendezvousCompletedEvent& e) {
  emitEvent(log, "rendezvous_completed",
            {{"round", e.round},
             {"nodes", e.nodes},
             {"world_size", e.world_size},
             {"group_rank", e.group_rank},
             {"base_rank", e.base_rank},
             {"hosts", e.hosts},
             {"duration_s", e.duration_s}});
}

}  // namespace cpprun::agent
