#include "agent/single_node_rendezvous.h"

namespace cpprun::agent {

void SingleNodeRendezvous::begin() {
  if (progress_.rounds_completed > 0) return;
  emitEvent(event_log_, "rendezvous_started",
            {{"round", 0}, {"backend", "single-node"}, {"min_nodes", 1}, {"max_nodes", 1}});
}

void SingleNodeRendezvous::complete(int world_size) {
  if (progress_.rounds_completed > 0) return;
  progress_ = {0, 1, 0.0, 1, world_size, ""};
  emitEvent(event_log_, "rendezvous_completed",
            {{"round", 0},
             {"nodes", 1},
             {"world_size", progress_.world_size},
             {"group_rank", 0},
             {"base_rank", 0},
             {"hosts", {host_}},
             {"duration_s", 0.0}});
}

}  // namespace cpprun::agent
