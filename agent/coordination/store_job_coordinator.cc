// The store-backed JobCoordinator (job_coordinator.h): a control thread runs the requests of
// the loop one at a time with its own store connection; a watcher thread waits on the current
// attempt's stop key, renews this agent's liveness, polls the members' where liveness is polled
// (heartbeats: on the host) and claims the stops of lost members. The store comes from a
// StoreConnector (any rendezvous::Store backend, with its own liveness or heartbeats); the key
// scheme and records are job_keys.h's, the static join and elastic rounds rendezvous_rounds.h's,
// the host's decision job_decision.h's, liveness liveness.h's, the waits' slices and notices
// coordinator_waits.h's. The parts next to this file:
//
//   coordinator_shared.h    the options, callbacks and state the parts and threads share (one
//                           mutex), the connection to the job's namespace, lost members
//   coordinator_start.h     the start of an attempt: connect, join, ready/go, NCCL ids
//   coordinator_decision.h  the end of an attempt: reports, the decision, the end of the job
//   coordinator_watcher.h   the watcher thread: stops, liveness, lost members, joiners
//
// This file keeps the requests of the loop (the JobCoordinator methods), the control thread that
// runs them, and leaving the job.
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "agent/coordination/coordinator_decision.h"
#include "agent/coordination/coordinator_shared.h"
#include "agent/coordination/coordinator_start.h"
#include "agent/coordination/coordinator_watcher.h"
#include "agent/coordination/job_coordinator.h"
#include "agent/coordination/job_keys.h"
#include "common/asio.h"
#include "common/logging.h"
#include "common/thread_annotations.h"
#include "rendezvous/store.h"

namespace cpprun::agent {

namespace asio = boost::asio;
using rendezvous::Store;
using rendezvous::StoreError;
using rendezvous::StoreTimeout;
using rendezvous::toString;

namespace {

class StoreCoordinator : public JobCoordinator {
 public:
  StoreCoordinator(asio::io_context& io, StoreCoordinatorOptions options, HostPrepare host_prepare,
                   PeerStop on_peer_stop, Lost on_lost)
      : s_(io, std::move(options), std::move(host_prepare), std::move(on_peer_stop),
           std::move(on_lost)) {
    if (s_.opts.on_warm_imports) {
      s_.on_spare_wait = [this] {
        if (!warm_watch_.joinable()) warm_watch_ = std::thread([this] { watchWarmImports(); });
      };
    }
    control_ = std::thread([this] { controlLoop(); });
  }

  ~StoreCoordinator() override {
    {
      MutexLock lock(s_.mu);
      s_.shutting_down = true;
    }
    s_.cv.notifyAll();
    control_.join();
    if (watcher_.joinable()) watcher_.join();
    if (warm_watch_.joinable()) warm_watch_.join();
    if (warm_share_.joinable()) warm_share_.join();
  }

  // Called from the loop: each queues a task for the control thread, whose result is posted
  // back to the loop.
  void beginAttempt(int n, StartDone done) override;
  void announceStop(int n, const std::string& reason, int signal) override;
  void announceStall(int n, const std::string& reason) override;
  void requestLeave(int n, const std::string& reason, LeaveDone done) override;
  void endAttempt(int n, const AttemptReport& report, DecisionDone done) override;

  // Any thread.
  bool waitingAsSpare() const override;
  RendezvousProgress progress() const override;
  void shareWarmImports(const std::string& record) override;

 private:
  // Queues `task` for the control thread. Loop.
  void enqueue(std::function<void()> task);
  // Claims the attempt's stop in this agent's name (on the control thread).
  void claimOwnStop(int n, const std::string& reason, StopCause cause, int signal);

  // The control thread: runs the queued tasks one at a time until shutdown.
  void controlLoop();

  // A spare's thread (--warm-restart): waits on a connection of its own, in slices, for the job's
  // module record, hands it to the loop and ends; ends too at shutdown or if the store is lost.
  void watchWarmImports();

  // Why this agent may not leave attempt n now (OK: it may). Control thread.
  Status leaveRefusal(int n);

  // Runs `f` (which returns a Result<T>), turning the store's exceptions (StoreTimeout,
  // StoreError) into a Status; everything else (the waits, the rounds) returns its Status.
  // Control thread.
  template <typename T, typename F>
  Result<T> guarded(F f) {
    try {
      return f();
    } catch (const StoreTimeout& e) {
      return timeoutError(e.what());
    } catch (const StoreError& e) {
      return unavailable(s_.storeWhere() + ": " + e.what());
    }
  }

  CoordinatorShared s_;
  StartProtocol start_{s_, [this] {
                         if (!watcher_.joinable())
                           watcher_ = std::thread([this] { watcher_part_.run(); });
                       }};
  DecisionExchange decision_{s_};
  CoordinatorWatcher watcher_part_{s_};
  std::thread control_;
  std::thread watcher_;
  std::thread warm_watch_;  // started by the control thread, joined by the destructor
  std::thread warm_share_;  // started by the loop, joined by it or the destructor
};

void StoreCoordinator::beginAttempt(int n, StartDone done) {
  enqueue([this, n, done = std::move(done)] {
    std::vector<std::string> lost_before_start;
    Result<AttemptStart> result =
        guarded<AttemptStart>([&] { return start_.begin(n, &lost_before_start); });
    s_.post([done, result] { done(result); });
    // Members lost between the round and the start: the attempt starts (every node got the
    // go) and stops at once for them, after the start on the loop.
    for (const std::string& reason : lost_before_start) {
      const int attempt = result.value().attempt;
      s_.post([this, attempt, reason] { s_.on_peer_stop(attempt, reason, 0, false); });
    }
  });
}

void StoreCoordinator::announceStop(int n, const std::string& reason, int signal) {
  claimOwnStop(n, reason, signal == 0 ? StopCause::kFailure : StopCause::kSignal, signal);
}

void StoreCoordinator::announceStall(int n, const std::string& reason) {
  claimOwnStop(n, reason, StopCause::kStall, 0);
}

void StoreCoordinator::claimOwnStop(int n, const std::string& reason, StopCause cause, int signal) {
  enqueue([this, n, reason, cause, signal] {
    Result<bool> claimed = guarded<bool>([&]() -> Result<bool> {
      const int rank = s_.myRank();
      s_.claimStop(
          *s_.control_client, n,
          {rank, "node " + std::to_string(rank) + " (" + s_.opts.self.host + "): " + reason, cause,
           signal});
      return true;
    });
    if (!claimed.isOk()) {
      CPPRUN_LOG(kWarn) << "cannot tell the other nodes: " << claimed.status().message();
    }
  });
}

void StoreCoordinator::requestLeave(int n, const std::string& reason, LeaveDone done) {
  {
    MutexLock lock(s_.mu);
    if (s_.waiting_as_spare) {  // the control thread waits in the rounds: it sees this there
      s_.spare_leave = true;
      s_.post([done] { done(Status::ok()); });
      return;
    }
  }
  enqueue([this, n, reason, done = std::move(done)] {
    Result<bool> claimed = guarded<bool>([&]() -> Result<bool> {
      if (Status s = leaveRefusal(n); !s.isOk()) return s;
      const int rank = s_.myRank();
      const StopClaim claim{rank,
                            "node " + std::to_string(rank) + " (" + s_.opts.self.host +
                                ") left the job (" + reason + ")",
                            StopCause::kLeave, 0};
      const std::string stored = s_.claimStop(*s_.control_client, n, claim);
      if (stored != stopToJson(claim).dump()) {
        return Status(StatusCode::kAlreadyExists,
                      "attempt " + std::to_string(n) +
                          " is already stopping; ask again once the group re-formed");
      }
      return true;
    });
    s_.post([done, status = claimed.status()] { done(status); });
  });
}

// On a thread and connection of its own: the control thread may wait in the rounds for the whole
// attempt (the next round's joins), and a record shared after the attempt is too late.
void StoreCoordinator::shareWarmImports(const std::string& record) {
  if (warm_share_.joinable()) warm_share_.join();  // a warm process that started again
  warm_share_ = std::thread([this, record] {
    try {
      auto connected = s_.connect(s_.keepAliveBound(), s_.keepAliveBound(), false);
      if (!connected.isOk()) throw StoreError(connected.status().message());
      connected.value()->set(kWarmImportsKey, rendezvous::toBytes(record));
      CPPRUN_LOG(kInfo) << "--warm-restart: the job's hot spares can read the modules this node "
                           "holds";
    } catch (const StoreError& e) {  // StoreTimeout too
      CPPRUN_LOG(kInfo) << "--warm-restart: the job's spares cannot be told its modules: "
                        << e.what();
    }
  });
}

void StoreCoordinator::watchWarmImports() {
  constexpr std::chrono::milliseconds kSlice{500};  // how long shutdown may wait for this thread
  std::unique_ptr<rendezvous::Store> store;
  try {
    auto connected = s_.connect(s_.keepAliveBound(), s_.keepAliveBound(), false);
    if (!connected.isOk()) return;
    store = std::move(connected).value();
  } catch (const StoreError& e) {  // StoreTimeout too
    CPPRUN_LOG(kInfo) << "--warm-restart: no pre-warming: " << e.what();
    return;
  }
  CPPRUN_LOG(kInfo) << "--warm-restart: a hot spare: pre-warms once the job's store holds the "
                       "modules its workers import";
  for (;;) {
    {
      MutexLock lock(s_.mu);
      if (s_.shutting_down) return;
    }
    try {
      store->wait({kWarmImportsKey}, kSlice);
      std::string record = toString(store->get(kWarmImportsKey));
      s_.post([this, record = std::move(record)] { s_.opts.on_warm_imports(record); });
      return;
    } catch (const StoreTimeout&) {
      continue;
    } catch (const StoreError& e) {
      CPPRUN_LOG(kInfo) << "--warm-restart: no pre-warming: " << e.what();
      return;
    }
  }
}

bool StoreCoordinator::waitingAsSpare() const {
  MutexLock lock(s_.mu);
  return s_.waiting_as_spare;
}

RendezvousProgress StoreCoordinator::progress() const {
  RendezvousProgress p = s_.rounds.progress();
  MutexLock lock(s_.mu);
  p.waiting_for = s_.waiting_for;
  return p;
}

void StoreCoordinator::endAttempt(int n, const AttemptReport& report, DecisionDone done) {
  enqueue([this, n, report, done = std::move(done)] {
    Result<JobDecision> result = guarded<JobDecision>([&] { return decision_.end(n, report); });
    s_.post([done, result] { done(result); });
  });
}

void StoreCoordinator::enqueue(std::function<void()> task) {
  {
    MutexLock lock(s_.mu);
    s_.tasks.push_back(std::move(task));
  }
  s_.cv.notifyAll();
}

void StoreCoordinator::controlLoop() {
  while (true) {
    std::function<void()> task;
    {
      MutexLock lock(s_.mu);
      s_.cv.wait(s_.mu, [&] {
        s_.mu.assertHeld();
        return s_.shutting_down || !s_.tasks.empty();
      });
      // Shutting down: the loop no longer runs, so the callbacks of what is left could not
      // be delivered; drop it.
      if (s_.shutting_down) break;
      task = std::move(s_.tasks.front());
      s_.tasks.pop_front();
    }
    task();
  }
  MutexLock lock(s_.mu);
  s_.watch_attempt = -2;  // tells the watcher to leave
}

Status StoreCoordinator::leaveRefusal(int n) {
  if (!s_.opts.elastic) {
    return Status(StatusCode::kInvalidArgument,
                  "a job of a fixed node count (--nnodes N) cannot lose a node; only an elastic "
                  "job (--nnodes=MIN:MAX with --rdzv-backend c10d or etcd) can");
  }
  if (!s_.opts.host_per_round && s_.opts.is_host) {
    return Status(StatusCode::kInvalidArgument,
                  "this agent serves the job's store (the c10d store host): the other nodes "
                  "cannot go on without it; drain another node, or stop the job (SIGTERM)");
  }
  int world;
  {
    MutexLock lock(s_.mu);
    if (s_.watch_attempt != n || !s_.membership) {
      return Status(StatusCode::kAlreadyExists,
                    "no attempt of this node is running (it is between attempts or waits as a "
                    "spare); ask again once its workers run");
    }
    world = s_.membership->group_world_size - static_cast<int>(s_.lost_agents.size());
  }
  const Result<int> waiting = s_.rounds.waitingIn(*s_.control_client, s_.rounds.nextRound());
  if (!waiting.isOk()) return waiting.status();
  const int64_t spares = waiting.value();
  if (world - 1 + spares < s_.opts.min_nodes) {
    return Status(StatusCode::kInvalidArgument,
                  "leaving would leave " + std::to_string(world - 1) + " node(s) and " +
                      std::to_string(spares) + " spare(s), fewer than the minimum " +
                      std::to_string(s_.opts.min_nodes) +
                      " (--nnodes MIN): refused; stop the whole job instead (SIGTERM)");
  }
  return Status::ok();
}

}  // namespace

std::unique_ptr<JobCoordinator> makeStoreCoordinator(asio::io_context& io,
                                                     StoreCoordinatorOptions options,
                                                     JobCoordinator::HostPrepare host_prepare,
                                                     JobCoordinator::PeerStop on_peer_stop,
                                                     JobCoordinator::Lost on_lost) {
  if (!options.store.connect) {
    const std::string host_name =
        options.expected_hosts.empty() ? "node 0" : options.expected_hosts.front();
    options.store = tcpStoreConnector(options.store_host, options.store_port,
                                      "the store host (" + host_name + ")", options.secret);
  }
  return std::make_unique<StoreCoordinator>(io, std::move(options), std::move(host_prepare),
                                            std::move(on_peer_stop), std::move(on_lost));
}

}  // namespace cpprun::agent
