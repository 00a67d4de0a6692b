#include "agent/coordination/single_node_rendezvous.h"

#include "agent/coordination/rendezvous_events.h"

namespace cpprun::agent {

void SingleNodeRendezvous::begin() {
  if (progress_.rounds_completed > 0) return;
  emitRendezvousStarted(event_log_, {0, "single-node", 1, 1});
}

void SingleNodeRendezvous::complete(int world_size) {
  if (progress_.rounds_completed > 0) return;
  progress_ = {0, 1, 0.0, 1, world_size, ""};
  emitRendezvousCompleted(event_log_, {0, 1, progress_.world_size, 0, 0, {host_}, 0.0});
}

}  // namespace cpprun::agent
