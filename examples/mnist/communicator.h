// Communicator: the collectives data-parallel training needs — sum-all-reduce of gradients and
// metrics, broadcast of the initial weights, a barrier — for one rank of a group.
//
// Two implementations: a single process (world size 1: every operation is a no-op) and gloo over
// TCP, which meets its peers through a cpprun Store (in the trainer, the store the agent serves at
// MASTER_ADDR:MASTER_PORT). Errors (a peer gone, a timeout) are exceptions carrying gloo's or the
// store's message; the trainer catches them at main() and exits non-zero so the agent restarts it.
//
// finish() must be called by every rank before it is destroyed on success: gloo closes its
// sockets with SO_LINGER 0 (a reset), so a rank that tears down while its peer is still reading
// the last message would fail the peer with "Connection closed by peer". finish() is a barrier
// through the store, which outlives every rank's sockets.
// Thread safety: one thread at a time per object.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "rendezvous/store.h"

namespace gloo {
class Context;
}  // namespace gloo

namespace cpprun::mnist {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int worldSize() const = 0;
  virtual void allreduceSum(float* data, size_t count) = 0;
  virtual void allreduceSum(double* data, size_t count) = 0;
  virtual void broadcast(float* data, size_t count, int root) = 0;
  virtual void barrier() = 0;
  virtual void finish() = 0;
  virtual std::string describe() const = 0;
  // The store the group met through and this attempt's key prefix (null for a single process):
  // for other libraries' bootstraps, such as NCCL's unique id.
  virtual std::shared_ptr<rendezvous::Store> store() const { return nullptr; }
  virtual std::string keyPrefix() const { return ""; }
};

std::unique_ptr<Communicator> makeSingleProcessCommunicator();

struct GlooOptions {
  int rank = 0;
  int world_size = 1;
  std::string prefix;    // store key prefix, unique per attempt (e.g. ".../attempt_0/")
  std::string hostname;  // the address gloo listens on and tells its peers
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
};

// Connects the full mesh (blocks until every rank arrived or the timeout passes).
std::unique_ptr<Communicator> makeGlooCommunicator(std::shared_ptr<rendezvous::Store> store,
                                                   const GlooOptions& options);

// Meets the other ranks through the store at MASTER_ADDR:MASTER_PORT (the agent's store under
// cpprun or torchrun) under `prefix`, listening on the local address that reaches that store.
// Returns an error when MASTER_ADDR or MASTER_PORT is missing or malformed; throws, as
// makeGlooCommunicator does, when the store or a peer cannot be reached.
Result<std::unique_ptr<Communicator>> makeGlooCommunicatorThroughMasterStore(
    int rank, int world_size, const std::string& prefix);

// The local IPv4 address this host reaches `host`:`port` from (what gloo listens on and
// announces), or "" when it cannot be told.
std::string localAddressTowards(const std::string& host, uint16_t port);

}  // namespace cpprun::mnist
