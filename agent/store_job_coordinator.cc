// The store-backed JobCoordinator (job_coordinator.h): a control thread runs the requests of
// the loop one at a time with its own store connection; a watcher thread waits on the current
// attempt's stop key, renews this agent's liveness, polls the members' where liveness is polled
// (heartbeats: on the host) and claims the stops of lost members. The store comes from a
// StoreConnector (any rendezvous::Store backend, with its own liveness or heartbeats); the key
// scheme and records are job_keys.h's, the static join and elastic rounds rendezvous_rounds.h's,
// the host's decision job_decision.h's, liveness liveness.h's, the waits' slices and notices
// coordinator_waits.h's. This file keeps the orchestration: the threads, attempts (ready, go),
// stop claims, lost members, reports and the end of the job.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "agent/job_coordinator.h"
#include "agent/job_decision.h"
#include "agent/job_keys.h"
#include "agent/liveness.h"
#include "agent/nccl_id_groups.h"
#include "agent/node_exclusion.h"
#include "agent/rendezvous_rounds.h"
#include "common/asio.h"
#include "common/logging.h"
#include "rendezvous/prefix_store.h"
#include "rendezvous/store.h"

namespace cpprun::agent {

namespace asio = boost::asio;
using nlohmann::json;
using rendezvous::Store;
using rendezvous::StoreError;
using rendezvous::StoreTimeout;
using rendezvous::toString;
using SteadyClock = std::chrono::steady_clock;
using SystemClock = std::chrono::system_clock;

namespace {

// How long after seeing an attempt's stop the decider waits for a member's agent to acknowledge
// it (heartbeat liveness: cpprun's TCP store). A live agent's watcher waits on the stop key and
// acknowledges within a store round trip, before its workers' teardown (which may take up to
// --shutdown-timeout). A member that has not acknowledged after this long, and whose heartbeat
// has not moved since the stop, is dead or stopped: the decider gives it up as lost at once
// instead of waiting out the heartbeat bound (keep_alive_interval x keep_alive_max_attempt,
// 15 s by default). 1 s is hundreds of round trips, room for an agent descheduled for a moment;
// one whose heartbeat moved keeps its place (it reports once its teardown is done).
constexpr std::chrono::milliseconds kStopAckBound{1000};

// What the decider's watcher noted on seeing an attempt's stop: when, and the other members'
// heartbeat counters then (by group rank).
struct StopSeen {
  int attempt = -1;
  std::chrono::steady_clock::time_point at{};
  std::map<int, int64_t> beats;
};

class StoreCoordinator : public JobCoordinator, private WaitContext {
 public:
  StoreCoordinator(asio::io_context& io, StoreCoordinatorOptions options, HostPrepare host_prepare,
                   PeerStop on_peer_stop, Lost on_lost)
      : io_(io),
        opts_(std::move(options)),
        host_prepare_(std::move(host_prepare)),
        on_peer_stop_(std::move(on_peer_stop)),
        on_lost_(std::move(on_lost)) {
    control_ = std::thread([this] { controlLoop(); });
  }

  ~StoreCoordinator() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      shutting_down_ = true;
    }
    cv_.notify_all();
    control_.join();
    if (watcher_.joinable()) watcher_.join();
  }

  void beginAttempt(int n, StartDone done) override {
    enqueue([this, n, done = std::move(done)] {
      std::vector<std::string> lost_before_start;
      Result<AttemptStart> result =
          guarded<AttemptStart>([&] { return doBeginAttempt(n, &lost_before_start); });
      post([done, result] { done(result); });
      // Members lost between the round and the start: the attempt starts (every node got the
      // go) and stops at once for them, after the start on the loop.
      for (const std::string& reason : lost_before_start) {
        const int attempt = result.value().attempt;
        post([this, attempt, reason] { on_peer_stop_(attempt, reason, 0); });
      }
    });
  }

  void announceStop(int n, const std::string& reason, int signal) override {
    enqueue([this, n, reason, signal] {
      Result<bool> claimed = guarded<bool>([&] {
        const int rank = myRank();
        claimStop(*control_client_, n,
                  {rank, "node " + std::to_string(rank) + " (" + opts_.self.host + "): " + reason,
                   signal == 0 ? StopCause::kFailure : StopCause::kSignal, signal});
        return true;
      });
      if (!claimed.isOk()) {
        CPPRUN_LOG(kWarn) << "cannot tell the other nodes: " << claimed.status().message();
      }
    });
  }
  void requestLeave(int n, const std::string& reason, LeaveDone done) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (waiting_as_spare_) {  // the control thread waits in the rounds: it sees this there
        spare_leave_ = true;
        post([done] { done(Status::ok()); });
        return;
      }
    }
    enqueue([this, n, reason, done = std::move(done)] {
      Result<bool> claimed = guarded<bool>([&] {
        if (Status s = leaveRefusal(n); !s.isOk()) throw Abandoned{s};
        const int rank = myRank();
        const StopClaim claim{rank,
                              "node " + std::to_string(rank) + " (" + opts_.self.host +
                                  ") left the job (" + reason + ")",
                              StopCause::kLeave, 0};
        const std::string mine = stopToJson(claim).dump();
        const std::string stored =
            toString(control_client_->compareSet(attemptStopKey(n), {}, rendezvous::toBytes(mine)));
        if (stored != mine) {
          throw Abandoned{Status(StatusCode::kAlreadyExists,
                                 "attempt " + std::to_string(n) +
                                     " is already stopping; ask again once the group re-formed")};
        }
        return true;
      });
      post([done, status = claimed.status()] { done(status); });
    });
  }

  bool waitingAsSpare() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return waiting_as_spare_;
  }

  RendezvousProgress progress() const override {
    RendezvousProgress p = rounds_.progress();
    std::lock_guard<std::mutex> lock(mu_);
    p.waiting_for = waiting_for_;
    return p;
  }

  void endAttempt(int n, const AttemptReport& report, DecisionDone done) override {
    enqueue([this, n, report, done = std::move(done)] {
      Result<JobDecision> result = guarded<JobDecision>([&] { return doEndAttempt(n, report); });
      post([done, result] { done(result); });
    });
  }

 private:
  // The decider of the job: the store host, or (host_per_round) the current round's node 0.
  bool isHost() {
    if (!opts_.host_per_round) return opts_.is_host;
    std::lock_guard<std::mutex> lock(mu_);
    return membership_ && membership_->group_rank == 0;
  }

  // host_per_round: node 0 (this attempt's decider) was lost and this agent is the
  // lowest-ranked member still live, so it decides in node 0's place.
  bool takesOverDecision() {
    if (!opts_.host_per_round) return false;
    std::lock_guard<std::mutex> lock(mu_);
    if (!membership_ || !lost_agents_.count(0)) return false;
    for (int r = 0; r < membership_->group_world_size; ++r) {
      if (!lost_agents_.count(r)) return r == membership_->group_rank;
    }
    return false;
  }

  // Publishes the decision; host_per_round: the first decision written wins (a node 0 that
  // was only slow and the member standing in for it may both decide). Returns the one stored.
  JobDecision publishDecision(int n, const JobDecision& decision, int readers) {
    const std::string doc = decisionToJson(decision, readers).dump();
    if (!opts_.host_per_round) {
      control_client_->set(attemptDecisionKey(n), doc);
      return decision;
    }
    const std::string stored =
        toString(control_client_->compareSet(attemptDecisionKey(n), {}, rendezvous::toBytes(doc)));
    if (stored == doc) return decision;
    return readDecision(n);
  }

  JobDecision readDecision(int n) {
    Result<DecisionRecord> record = decisionFromJson(
        json::parse(toString(control_client_->get(attemptDecisionKey(n))), nullptr, false),
        worldSize());
    if (!record.isOk()) throw Abandoned{record.status()};
    decision_readers_ = record.value().readers;
    return record.value().decision;
  }

  template <typename F>
  void post(F f) {
    asio::post(io_, std::move(f));
  }

  void enqueue(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks_.push_back(std::move(task));
    }
    cv_.notify_all();
  }

  // Runs `f`, turning store trouble into a Status.
  template <typename T, typename F>
  Result<T> guarded(F f) {
    try {
      return f();
    } catch (const Abandoned& a) {
      return a.status;
    } catch (const StoreTimeout& e) {
      return timeoutError(e.what());
    } catch (const StoreError& e) {
      return unavailable(storeWhere() + ": " + e.what());
    }
  }

  const std::string& storeWhere() const { return opts_.store.where; }

  // How long the store (or an agent) may stay silent before it counts as lost: every store
  // request's reply timeout, and the heartbeat bound.
  std::chrono::milliseconds keepAliveBound() const {
    return agent::keepAliveBound(opts_.keep_alive_interval, opts_.keep_alive_max_attempt);
  }

  // A connection to the job's namespace in the store (job_keys.h: "cpprun/<run id>/").
  // `check_run_id` (the control connection, which joins): after checking that the store is not
  // served by another job's agent. The watcher's connection comes after the join; a failure
  // of its first request is then a lost store, not a refused one.
  std::unique_ptr<Store> connect(std::chrono::milliseconds connect_timeout,
                                 std::chrono::milliseconds timeout, bool check_run_id = false) {
    std::shared_ptr<Store> root = opts_.store.connect(connect_timeout, timeout);
    if (check_run_id && !opts_.host_per_round) checkServedRunId(*root);
    return std::make_unique<rendezvous::PrefixStore>(jobNamespace(opts_.run_id), std::move(root));
  }

  // The store host's agent names its job's run id at the store's root before it answers
  // anyone. An agent of another run id must not join: the store also serves the host's job's
  // workers (MASTER_ADDR:MASTER_PORT) and the host clears their keys before every attempt, so
  // the two jobs would wipe each other's keys. (Before, the agents of both merged into one job
  // whose workers' TORCHELASTIC_RUN_ID differed between nodes.) No name there: a store not
  // served by a cpprun agent of this version; the namespaces still keep the jobs apart.
  void checkServedRunId(Store& root) {
    if (!root.check({kServedRunIdKey})) return;
    const std::string served = toString(root.get(kServedRunIdKey));
    const std::string mine = storedRunId(opts_.run_id);
    if (served == mine) return;
    throw Abandoned{Status(
        StatusCode::kAlreadyExists,
        opts_.store.server + " serves the job with run id '" + served +
            "', not this agent's job (--rdzv-id '" + mine +
            "'); two jobs cannot share one rendezvous endpoint (its store is also the host's "
            "workers' store): give each job its own --rdzv-endpoint port, or the same --rdzv-id "
            "to the agents of one job")};
  }

  // connect(), retried for the join timeout in notice-sized slices, saying what it waits for:
  // an agent started before the store host is a common, and otherwise silent, wait.
  std::unique_ptr<Store> connectWithNotices() {
    const auto deadline = SteadyClock::now() + opts_.join_timeout;
    WaitAnnouncer announcer(*this, deadline);
    while (true) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (shutting_down_) throw Abandoned{internalError("the agent is shutting down")};
      }
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now());
      try {
        return connect(std::max(std::min(left, kNoticeSlice), std::chrono::milliseconds(1)),
                       std::max(keepAliveBound(), opts_.keep_alive_interval * 2),
                       /*check_run_id=*/true);
      } catch (const StoreTimeout&) {
        if (SteadyClock::now() >= deadline) throw;
        announcer.maybeAnnounce(
            [&] { return "waiting for " + opts_.store.server + " to accept connections"; });
      }
    }
  }

  void controlLoop() {
    while (true) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return shutting_down_ || !tasks_.empty(); });
        // Shutting down: the loop no longer runs, so the callbacks of what is left could not
        // be delivered; drop it.
        if (shutting_down_) break;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
    std::lock_guard<std::mutex> lock(mu_);
    watch_attempt_ = -2;  // tells the watcher to leave
  }

  // WaitContext: every wait of the control thread ends when the store is lost or the agent
  // shuts down.
  void checkAbandoned() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!store_status_.isOk()) throw Abandoned{store_status_};
    if (shutting_down_) throw Abandoned{internalError("the agent is shutting down")};
  }
  void setWaiting(const std::string& what) override {
    std::lock_guard<std::mutex> lock(mu_);
    waiting_for_ = what;
  }
  void setWaitingAsSpare(bool spare) override {
    std::lock_guard<std::mutex> lock(mu_);
    waiting_as_spare_ = spare;
  }
  bool leaveRequested() override {
    std::lock_guard<std::mutex> lock(mu_);
    return spare_leave_;
  }

  std::string nodeNames(const std::vector<int>& ranks) const {
    return agent::nodeNames(opts_.expected_hosts, ranks);
  }

  // waitKeys (coordinator_waits.h) in keep-alive-sized slices on the control connection.
  void waitKeys(const std::vector<std::string>& keys, std::chrono::milliseconds total,
                const std::string& what, const std::function<bool()>& on_slice = {},
                const std::function<std::string()>& describe = {}) {
    agent::waitKeys(*this, *control_client_, keys, total, opts_.keep_alive_interval, what, on_slice,
                    describe);
  }

  // This agent's rank and the number of agents in the current membership.
  int myRank() {
    std::lock_guard<std::mutex> lock(mu_);
    return membership_ ? membership_->group_rank : opts_.group_rank;
  }
  int worldSize() {
    std::lock_guard<std::mutex> lock(mu_);
    return membership_ ? membership_->group_world_size : opts_.group_world_size;
  }
  Membership currentMembership() {
    std::lock_guard<std::mutex> lock(mu_);
    return *membership_;
  }
  // The current membership with every member's record. An agent that learnt its round from its
  // own assignment (rendezvous_rounds.h) reads the round's members document the first time it
  // needs them: it decides (node 0 has them already; a member taking the decision over does
  // not), it makes the NCCL ids of a large job, or (etcd) it watches every member's lease.
  // `client`: the calling thread's connection.
  Membership fullMembership(Store& client) {
    Membership m = currentMembership();
    if (!m.agents.empty() || m.round < 0) return m;
    const nlohmann::json doc =
        nlohmann::json::parse(toString(client.get(roundMembersKey(m.round))), nullptr, false);
    Result<RoundMembers> members = roundMembersFromJson(doc, m.round);
    if (!members.isOk()) throw Abandoned{members.status()};
    if (static_cast<int>(members.value().agents.size()) != m.group_world_size) {
      throw Abandoned{internalError("rendezvous round " + std::to_string(m.round) + " has " +
                                    std::to_string(members.value().agents.size()) +
                                    " members in the store, but this node's assignment says " +
                                    std::to_string(m.group_world_size))};
    }
    m.agents = std::move(members.value().agents);
    std::lock_guard<std::mutex> lock(mu_);
    if (membership_ && membership_->round == m.round && membership_->agents.empty()) {
      membership_->agents = m.agents;
    }
    return m;
  }

  // This agent's liveness: the backend's own (etcd: leases), else heartbeats in the store.
  std::unique_ptr<MemberLiveness> makeLiveness() {
    LivenessOptions o;
    o.self = opts_.self;
    o.interval = opts_.keep_alive_interval;
    o.bound = keepAliveBound();
    o.on_lost = [this](int attempt, const LostMember& lost) { memberLost(attempt, lost); };
    if (opts_.store.liveness) return opts_.store.liveness(o);
    return std::make_unique<HeartbeatLiveness>(o);
  }

  // Joins (elastic: a round; static: once) and starts watching the members' liveness for
  // `*attempt`.
  void join(int n, int* attempt) {
    *attempt = n;
    if (opts_.elastic) {
      Membership m = rounds_.joinElastic(*control_client_, *liveness_, next_attempt_, attempt);
      std::lock_guard<std::mutex> lock(mu_);
      membership_ = m;
      lost_agents_.clear();
      unclaimed_losses_.clear();
      waiting_claimed_ = false;
    } else if (!membership_) {
      Membership m = rounds_.joinStatic(*control_client_, *liveness_);
      std::lock_guard<std::mutex> lock(mu_);
      membership_ = m;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      liveness_attempt_ = *attempt;
    }
    // A member that read only its assignment: node 0 polls the heartbeats (it has the
    // members); host_per_round, every agent watches every member, and the members are read now
    // unless the liveness reads them when it needs them (etcd: when a lease is lost).
    const bool full = opts_.host_per_round && !liveness_->readsMembersWhenNeeded();
    liveness_->watch(*attempt, full ? fullMembership(*control_client_) : currentMembership());
  }

  // Why this agent may not leave attempt n now (OK: it may). Control thread.
  Status leaveRefusal(int n) {
    if (!opts_.elastic) {
      return Status(StatusCode::kInvalidArgument,
                    "a job of a fixed node count (--nnodes N) cannot lose a node; only an elastic "
                    "job (--nnodes=MIN:MAX with --rdzv-backend c10d or etcd) can");
    }
    if (!opts_.host_per_round && opts_.is_host) {
      return Status(StatusCode::kInvalidArgument,
                    "this agent serves the job's store (the c10d store host): the other nodes "
                    "cannot go on without it; drain another node, or stop the job (SIGTERM)");
    }
    int world;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (watch_attempt_ != n || !membership_) {
        return Status(StatusCode::kAlreadyExists,
                      "no attempt of this node is running (it is between attempts or waits as a "
                      "spare); ask again once its workers run");
      }
      world = membership_->group_world_size - static_cast<int>(lost_agents_.size());
    }
    const int64_t spares = rounds_.waitingIn(*control_client_, rounds_.nextRound());
    if (world - 1 + spares < opts_.min_nodes) {
      return Status(StatusCode::kInvalidArgument,
                    "leaving would leave " + std::to_string(world - 1) + " node(s) and " +
                        std::to_string(spares) + " spare(s), fewer than the minimum " +
                        std::to_string(opts_.min_nodes) +
                        " (--nnodes MIN): refused; stop the whole job instead (SIGTERM)");
    }
    return Status::ok();
  }

  // host_per_round, waiting for the go: node 0, which gives it, is lost.
  bool deciderLostBeforeGo() {
    if (!opts_.host_per_round) return false;
    std::lock_guard<std::mutex> lock(mu_);
    return lost_agents_.count(0) > 0;
  }

  AttemptStart doBeginAttempt(int n, std::vector<std::string>* lost_before_start) {
    if (!control_client_) {
      // The first agents may start long before the store's host: keep trying for the join
      // timeout.
      control_client_ = connectWithNotices();
    }
    if (!liveness_) liveness_ = makeLiveness();
    int attempt = n;
    join(n, &attempt);
    if (!watcher_.joinable()) watcher_ = std::thread([this] { watchLoop(); });
    const int world = worldSize();
    std::string go;
    if (isHost()) {
      if (!opts_.elastic) {
        // Static: every node must have torn its previous attempt down.
        control_client_->set(attemptReadyKey(attempt, myRank()), "1");
        std::vector<std::string> keys;
        for (int r = 0; r < world; ++r) {
          keys.push_back(attemptReadyKey(attempt, r));
        }
        try {
          waitKeys(
              keys, opts_.join_timeout,
              "attempt " + std::to_string(attempt) + ": waiting for every node to be ready",
              [&] {
                throwIfAgentLost();
                return false;
              },
              [&] {
                // One CHECK per node: for small jobs only.
                return "attempt " + std::to_string(attempt) + ": " +
                       (world <= kMaxCheckedNodes
                            ? describeMissing(*control_client_, keys, opts_.expected_hosts,
                                              "to tear their previous attempt down")
                            : "waiting for the " + withThousands(world) +
                                  " nodes to tear their previous attempt down");
              });
        } catch (const Abandoned& a) {
          control_client_->set(attemptGoKey(attempt), "!" + a.status.message());
          throw;
        }
      }
      // Elastic: joining the round was the barrier (members join after their teardown).
      go = runOnLoop([this, attempt] { return host_prepare_(attempt); });
      control_client_->set(attemptGoKey(attempt), go);
    } else {
      if (!opts_.elastic) {
        control_client_->set(attemptReadyKey(attempt, myRank()), "1");
      }
      while (true) {
        waitKeys(
            {attemptGoKey(attempt)}, opts_.join_timeout,
            "attempt " + std::to_string(attempt) + ": waiting for " + deciderName() + "'s go",
            [&] { return deciderLostBeforeGo(); },
            [&] {
              return "attempt " + std::to_string(attempt) + ": waiting for " + deciderName() +
                     "'s go (every node ready)";
            });
        // The store is asked only when node 0 is lost (one request less per agent otherwise).
        if (!deciderLostBeforeGo() || control_client_->check({attemptGoKey(attempt)})) break;
        // Node 0 closed the round and was lost before it started the attempt: nobody got the
        // go, so every member meets again in the next round (no restart used).
        CPPRUN_LOG(kWarn) << "attempt " << attempt << ": " << lostReason(0)
                          << " before it started the attempt; joining the next round";
        next_attempt_ = attempt + 1;
        join(next_attempt_, &attempt);
        if (isHost()) {
          go = runOnLoop([this, attempt] { return host_prepare_(attempt); });
          control_client_->set(attemptGoKey(attempt), go);
          break;
        }
      }
      if (go.empty()) go = toString(control_client_->get(attemptGoKey(attempt)));
      if (!go.empty() && go[0] == '!') throw Abandoned{unavailable(go.substr(1))};
    }
    // Before the attempt is watched: a node lost meanwhile ends the wait as in the go's.
    const std::string nccl_ids = scalableNcclIds(attempt, go);
    {
      std::lock_guard<std::mutex> lock(mu_);
      watch_attempt_ = attempt;
      for (const auto& [rank, reason] : lost_agents_) lost_before_start->push_back(reason);
    }
    cv_.notify_all();
    return AttemptStart{attempt, currentMembership(), go, nccl_ids};
  }

  // The attempt's ids for ncclCommInitRankScalable (nccl_id_groups.h), "" at or below the
  // threshold, without NCCL on node 0 (no single id in the go: none anywhere), or when a node
  // could not make its ids or they did not all come (every node then falls back to the single
  // id: a failing node publishes its error in place of its ids, so all see it). A node lost
  // while the others wait for its ids, or ids missing after join_timeout: Abandoned, as in the
  // wait for the go.
  std::string scalableNcclIds(int attempt, const std::string& go) {
    if (go.empty() || !opts_.make_nccl_id) return "";
    const Membership compact = currentMembership();
    const int nid = ncclIdCount(compact.world_size, opts_.nccl_ranks_per_id);
    if (nid <= 1) return "";
    const Membership m = fullMembership(*control_client_);
    std::vector<int> node_ranks;
    for (const auto& a : m.agents) node_ranks.push_back(a.nproc);
    auto wait = [&](const std::vector<std::string>& keys) {
      waitKeys(keys, opts_.join_timeout,
               "attempt " + std::to_string(attempt) + ": waiting for the " + std::to_string(nid) +
                   " NCCL ids",
               [&] {
                 throwIfAgentLost();
                 return false;
               });
    };
    auto ids = exchangeNcclIds(*control_client_, attemptNcclIdsPrefix(attempt), node_ranks,
                               m.group_rank, nid, opts_.make_nccl_id, opts_.join_timeout, wait);
    if (!ids.isOk()) {
      CPPRUN_LOG(kWarn) << "attempt " << attempt << ": " << ids.status().message()
                        << "; CPPRUN_NCCL_UNIQUE_IDS is not set (the workers use the single id)";
      return "";
    }
    return joinNcclIds(ids.value());
  }

  std::string runOnLoop(std::function<std::string()> f) {
    auto task = std::make_shared<std::packaged_task<std::string()>>(std::move(f));
    auto result = task->get_future();
    post([task] { (*task)(); });
    while (result.wait_for(opts_.keep_alive_interval) != std::future_status::ready) {
      std::lock_guard<std::mutex> lock(mu_);
      if (shutting_down_) throw Abandoned{internalError("the agent is shutting down")};
    }
    return result.get();
  }

  void throwIfAgentLost() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!lost_agents_.empty()) {
      throw Abandoned{unavailable(lost_agents_.begin()->second)};
    }
  }

  // The first claim of attempt n's stop wins (compare-and-set: the store decides who was first).
  static void claimStop(Store& client, int n, const StopClaim& stop) {
    client.compareSet(attemptStopKey(n), {}, rendezvous::toBytes(stopToJson(stop).dump()));
  }

  JobDecision doEndAttempt(int n, const AttemptReport& report) {
    control_client_->set(attemptReportKey(n, myRank()),
                         reportToJson(report, opts_.self.host).dump());
    JobDecision decision;
    bool decides = isHost();
    if (!decides) {
      // The decision comes when every node's workers have exited, however long the others
      // train after this node's finished: no deadline. Liveness bounds the wait instead: a lost
      // store host ends it (store_status_), a lost node makes the host decide without it, and
      // (host_per_round) a lost node 0 makes the lowest live member decide.
      waitKeys(
          {attemptDecisionKey(n)}, kNoDeadline,
          "attempt " + std::to_string(n) + ": waiting for " + deciderName() + "'s decision",
          [&] {
            if (!takesOverDecision()) return false;
            decides = true;
            return true;
          },
          [&] {
            return "attempt " + std::to_string(n) +
                   ": this node's workers are done; waiting for the other nodes' workers "
                   "(the job's outcome)";
          });
      if (decides && control_client_->check({attemptDecisionKey(n)})) decides = false;
      if (decides) {
        CPPRUN_LOG(kWarn) << "attempt " << n
                          << ": node 0 was lost; this node decides for the job in its place";
      }
    }
    if (decides) {
      decision = decide(n);
      int readers = worldSize();
      {
        std::lock_guard<std::mutex> lock(mu_);
        readers -= static_cast<int>(lost_agents_.size());
      }
      decision_readers_ = readers;
      decision = publishDecision(n, decision, readers);
      restarts_used_ = decision.restarts_used;
      next_attempt_ = n + 1;
    } else {
      decision = readDecision(n);
      next_attempt_ = n + 1;
      restarts_used_ = decision.restarts_used;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      decided_attempt_ = n;
    }
    if (decision.kind != JobDecision::Kind::kRestart) finishJob(n, decision);
    return decision;
  }

  // Host: every node's report (or a lost node's stand-in), then one decision for the job
  // (decideJob).
  JobDecision decide(int n) {
    const Membership membership = fullMembership(*control_client_);
    const int world = membership.group_world_size;
    std::map<int, NodeOutcome> outcomes;
    WaitAnnouncer announcer(*this);
    StopSeen seen;
    while (static_cast<int>(outcomes.size()) < world) {
      std::vector<std::string> missing;
      std::vector<int> missing_ranks;
      for (int r = 0; r < world; ++r) {
        if (outcomes.count(r)) continue;
        std::lock_guard<std::mutex> lock(mu_);
        auto lost = lost_agents_.find(r);
        if (lost != lost_agents_.end()) {
          outcomes[r] = NodeOutcome{true, lost->second, {}};
          continue;
        }
        missing.push_back(attemptReportKey(n, r));
        missing_ranks.push_back(r);
      }
      if (missing.empty()) break;
      auto slice = opts_.keep_alive_interval;
      if (acksStops() && seen.attempt != n && control_client_->check({attemptStopKey(n)})) {
        seen = noteStopSeen(*control_client_, n, SteadyClock::now());
      }
      if (seen.attempt == n) {
        const auto now = SteadyClock::now();
        const auto ack_deadline = seen.at + kStopAckBound;
        if (now >= ack_deadline) {
          if (giveUpUnacknowledged(n, membership, missing_ranks, seen)) continue;
        } else {
          slice = std::min(slice, std::chrono::ceil<std::chrono::milliseconds>(ack_deadline - now));
        }
      }
      try {
        control_client_->wait(missing, slice);
      } catch (const StoreTimeout&) {
        announcer.maybeAnnounce([&] {
          return "attempt " + std::to_string(n) + ": waiting for " +
                 std::to_string(missing_ranks.size()) + " of " + std::to_string(world) +
                 " nodes (" + nodeNames(missing_ranks) + ") to report how it ended";
        });
        continue;  // look at the lost agents again
      }
      auto values = control_client_->multiGet(missing);
      for (size_t i = 0; i < missing.size(); ++i) {
        outcomes[missing_ranks[i]] = NodeOutcome{
            false, "", reportFromJson(json::parse(toString(values[i]), nullptr, false))};
      }
    }
    StopClaim stop;
    if (control_client_->check({attemptStopKey(n)})) {
      stop = stopFromJson(
          json::parse(toString(control_client_->get(attemptStopKey(n))), nullptr, false));
    }
    DecisionPolicy policy;
    policy.max_restarts = opts_.max_restarts;
    policy.elastic = opts_.elastic;
    policy.min_nodes = opts_.min_nodes;
    if (opts_.elastic) {
      policy.waiting_nodes = rounds_.waitingIn(*control_client_, rounds_.nextRound());
    }
    const auto now = SystemClock::now();
    JobDecision d = decideJob(membership, outcomes, stop, policy, restarts_used_, now);
    considerExclusion(membership, outcomes, stop, now, d);
    restarts_used_ = d.restarts_used;
    return d;
  }

  // Decider: when the attempt's root cause was one node's own workers, records it in the job's
  // failure history (in the store, so a later decider reads it too) and excludes the node once
  // it has caused exclude_after failures within exclude_window (node_exclusion.h).
  void considerExclusion(const Membership& membership, const std::map<int, NodeOutcome>& outcomes,
                         const StopClaim& stop, SystemClock::time_point now, JobDecision& d) {
    if (opts_.exclude_after <= 0 || stop.cause != StopCause::kFailure || stop.by < 0) return;
    if (d.kind != JobDecision::Kind::kRestart && d.kind != JobDecision::Kind::kFailed) return;
    if (d.membership_change || d.signal != 0) return;
    const auto culprit = outcomes.find(stop.by);
    if (culprit == outcomes.end() || culprit->second.lost ||
        culprit->second.report.kind != AttemptReport::Kind::kFailed) {
      return;
    }
    const AgentInfo& agent = membership.agents.at(static_cast<size_t>(stop.by));
    const int64_t now_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count();
    control_client_->append(
        kExclusionHistoryKey,
        rendezvous::toBytes(encodeFailureRecord({agent.id, agent.host, now_ms})));
    const auto history = decodeFailureHistory(toString(control_client_->get(kExclusionHistoryKey)));
    ExclusionPolicy policy{opts_.exclude_after, opts_.exclude_window};
    ExclusionInput in;
    in.culprit_rank = stop.by;
    in.failures = failuresWithin(history, agent.id, policy.window, now_ms);
    in.elastic = opts_.elastic;
    in.min_nodes = opts_.min_nodes;
    int lost = 0;
    for (const auto& [rank, outcome] : outcomes) lost += outcome.lost ? 1 : 0;
    in.survivors = membership.group_world_size - lost;
    // c10d: the store host's agent is the job's store; it cannot leave without ending the job.
    in.culprit_may_leave = opts_.host_per_round || stop.by != membership.group_rank;
    const int restarts_before = restarts_used_;
    if (const std::string blocked = exclusionBlocked(policy, in); !blocked.empty()) {
      CPPRUN_LOG(kWarn) << "node " << stop.by << " (" << agent.host << ") caused " << in.failures
                        << " failures within " << policy.window.count()
                        << " s but is not excluded: " << blocked;
      return;
    }
    applyExclusion(membership, policy, in, restarts_before, d);
    if (d.excluded) {
      CPPRUN_LOG(kError) << d.summary;
    }
  }

  // After the final decision: wake every watcher (the stop key), tell agents still waiting to
  // join that the job is over, count this agent out and, on the host, keep serving until
  // everyone has read the decision (bounded).
  void finishJob(int n, const JobDecision& decision) {
    claimStop(*control_client_, n, {kByNobody, "the job ended", StopCause::kEnd, 0});
    if (isHost() && opts_.elastic) {
      rounds_.endRounds(*control_client_, decisionKindName(decision.kind));
    }
    // Lost agents never read it: the host counts only the live ones in ("readers").
    const int64_t out = control_client_->takeTicket(attemptDoneKey(n));
    if (out >= decision_readers_) control_client_->set(attemptAllDoneKey(n), "1");
    if (isHost()) {
      const auto linger_end = SteadyClock::now() + opts_.final_linger;
      try {
        control_client_->wait({attemptAllDoneKey(n)}, opts_.final_linger);
        // Spares waiting in the next round read the outcome too (c10d: from this store).
        if (opts_.elastic && control_client_->tickets(roundJoinedKey(rounds_.nextRound())) > 0) {
          control_client_->wait({attemptSparesAllDoneKey(n)},
                                std::max(std::chrono::milliseconds(1),
                                         std::chrono::duration_cast<std::chrono::milliseconds>(
                                             linger_end - SteadyClock::now())));
        }
      } catch (const StoreTimeout&) {
        CPPRUN_LOG(kWarn) << "not every node read the job's outcome within "
                          << opts_.final_linger.count() / 1000.0 << " s; ending anyway";
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    job_over_ = true;
  }

  // The watcher: this agent's liveness, the current attempt's stop key, the members' liveness
  // where it is polled (heartbeats: on the host, or on every agent with host_per_round),
  // the stop claims for lost members, and (elastic) agents waiting to join.
  void watchLoop() {
    std::unique_ptr<Store> client;
    const auto bound = keepAliveBound();
    try {
      // A reply may be late by up to the whole bound: one slow reply (the store host's agent
      // busy or descheduled for a moment) is not a lost store; keep_alive_max_attempt silent
      // intervals are.
      client = connect(bound, bound);
    } catch (const StoreError& e) {
      reportLost(unavailable("cannot reach " + storeWhere() + ": " + e.what()));
      return;
    }
    int handled_stop = -1;
    while (true) {
      int n;
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (watch_attempt_ == -2 || job_over_) return;
        n = watch_attempt_;
        if (n == handled_stop) {
          cv_.wait_for(lock, opts_.keep_alive_interval, [&] {
            return watch_attempt_ != handled_stop || shutting_down_ ||
                   std::any_of(unclaimed_losses_.begin(), unclaimed_losses_.end(),
                               [&](const auto& loss) { return loss.first == watch_attempt_; });
          });
          if (watch_attempt_ == -2 || job_over_) return;
          n = watch_attempt_;
        }
      }
      try {
        if (n != handled_stop && n >= 0) {
          try {
            client->wait({attemptStopKey(n)}, opts_.keep_alive_interval);
            const StopClaim stop =
                stopFromJson(json::parse(toString(client->get(attemptStopKey(n))), nullptr, false));
            handled_stop = n;
            if (acksStops()) acknowledgeStop(*client, n);
            if (stop.by != myRank() && stop.by != kByNobody) {
              post([this, n, stop] { on_peer_stop_(n, stop.reason, stop.signal); });
            } else if (stop.by == myRank() && stop.cause == StopCause::kLost) {
              // The others lost this agent (it was stopped, starved or cut off for a while)
              // and went on without it: its workers must stop too, or they run on outside
              // the job. It then reads the decision like everyone else (elastic: it joins the
              // next round).
              const std::string reason =
                  std::string(opts_.host_per_round ? "the other nodes" : "the store host") +
                  " declared this node lost (" + stop.reason + ")";
              post([this, n, reason] { on_peer_stop_(n, reason, 0); });
            }
          } catch (const StoreTimeout&) {
          }
        }
        if (!liveness_->renew(*client) && n >= 0) {
          const std::string reason =
              "this node was silent for longer than its liveness bound and the others count it "
              "as lost";
          post([this, n, reason] { on_peer_stop_(n, reason, 0); });
        }
        bool polls;
        {
          std::lock_guard<std::mutex> lock(mu_);
          polls = n >= 0 && liveness_attempt_ == n;
        }
        // host_per_round: every agent watches every member, so losing node 0 (the decider)
        // is noticed by the others and is just one lost node.
        if (polls && (isHost() || opts_.host_per_round)) {
          for (const LostMember& lost : liveness_->poll(*client)) memberLost(n, lost);
        }
        claimLosses(*client);
        if (polls && opts_.elastic && (isHost() || takesOverDecision())) checkJoiners(*client, n);
      } catch (const StoreError& e) {
        reportLost(unavailable("lost " + storeWhere() + ": " + e.what()));
        return;
      }
    }
  }

  // Heartbeat liveness: members acknowledge stops, the decider gives up the ones that do not
  // (kStopAckBound). Backends with their own liveness (etcd's leases) hear of a loss at once.
  bool acksStops() const { return !opts_.store.liveness; }

  // Watcher, on seeing attempt n's stop: tells the decider this agent lives (before its
  // teardown); the decider notes when it saw the stop and the other members' heartbeats then.
  void acknowledgeStop(Store& client, int n) {
    const auto seen_at = SteadyClock::now();
    client.append(attemptStopAcksKey(n), rendezvous::toBytes(std::to_string(myRank()) + "\n"));
    if (isHost()) noteStopSeen(client, n, seen_at);
  }

  // Decider: notes (once per attempt) when it saw attempt n's stop and the other members'
  // heartbeat counters then. The watcher calls it on seeing the stop; the control thread too,
  // when it decides before its watcher got there (this node claimed the stop itself). Returns
  // the note. Either thread, each with its own connection.
  StopSeen noteStopSeen(Store& client, int n, SteadyClock::time_point seen_at) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_seen_.attempt == n) return stop_seen_;
    }
    const Membership m = fullMembership(client);
    StopSeen seen{n, seen_at, readHeartbeats(client, m, otherMembers(m))};
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_seen_.attempt != n) stop_seen_ = std::move(seen);  // the first note stands
    return stop_seen_;
  }

  // Decider, kStopAckBound after it saw attempt n's stop: gives up the members in `missing`
  // (no report yet) that have not acknowledged the stop and whose heartbeat has not moved since,
  // as lost by heartbeat (memberLost). Returns true when it gave up any. Control thread.
  bool giveUpUnacknowledged(int n, const Membership& m, const std::vector<int>& missing,
                            const StopSeen& seen) {
    std::set<int> acked;
    const std::string acks_key = attemptStopAcksKey(n);
    if (control_client_->check({acks_key})) {
      std::istringstream in(toString(control_client_->get(acks_key)));
      for (std::string line; std::getline(in, line);) {
        if (!line.empty()) acked.insert(std::atoi(line.c_str()));
      }
    }
    std::vector<int> silent;
    for (int r : missing) {
      if (r == m.group_rank || acked.count(r) || !seen.beats.count(r)) continue;
      silent.push_back(r);
    }
    if (silent.empty()) return false;
    const std::map<int, int64_t> beats = readHeartbeats(*control_client_, m, silent);
    bool gave_up = false;
    for (int r : silent) {
      if (beats.at(r) != seen.beats.at(r)) continue;  // alive: slow to tear down
      const AgentInfo& info = m.agents[static_cast<size_t>(r)];
      memberLost(n, {r, "the agent of node " + std::to_string(r) + " (" + info.host +
                            ") stopped responding: it did not acknowledge the stop of attempt " +
                            std::to_string(n) + " within " + formatSeconds(kStopAckBound) +
                            " and its heartbeat has not moved since"});
      gave_up = gave_up || !lostReason(r).empty();
    }
    return gave_up;
  }

  // A member of `attempt`'s membership is lost (liveness: a poll on the watcher, or a
  // backend's own thread): count it out of the attempt, stop this node's workers if the attempt
  // runs (before it starts: doBeginAttempt does, or the round is joined again), and have the
  // watcher claim the attempt's stop for it. Any thread.
  void memberLost(int attempt, const LostMember& lost) {
    bool started;
    {
      std::lock_guard<std::mutex> lock(mu_);
      // A decided attempt is over: a member missing from the next round (it left, or it is
      // lost after the decision) is left out of that round instead.
      if (attempt != liveness_attempt_ || attempt <= decided_attempt_ || job_over_ ||
          shutting_down_) {
        return;
      }
      if (!lost_agents_.emplace(lost.rank, lost.reason).second) return;
      unclaimed_losses_.push_back({attempt, lost});
      started = watch_attempt_ == attempt;
    }
    CPPRUN_LOG(kError) << lost.reason;
    cv_.notify_all();
    if (started) {
      const std::string reason = lost.reason;
      post([this, attempt, reason] { on_peer_stop_(attempt, reason, 0); });
    }
  }

  // Watcher: the stop claims of the members found lost in started attempts (the first claim of
  // an attempt names its root cause on every node).
  void claimLosses(Store& client) {
    std::vector<std::pair<int, LostMember>> claims;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = unclaimed_losses_.begin();
      while (it != unclaimed_losses_.end()) {
        if (it->first != watch_attempt_) {
          ++it;
          continue;
        }
        claims.push_back(*it);
        it = unclaimed_losses_.erase(it);
      }
    }
    for (const auto& [n, lost] : claims) {
      claimStop(client, n, {lost.rank, lost.reason, StopCause::kLost, 0});
    }
  }

  std::string deciderName() const { return opts_.host_per_round ? "node 0" : "the store host"; }

  std::string lostReason(int rank) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = lost_agents_.find(rank);
    return it == lost_agents_.end() ? "" : it->second;
  }

  // Elastic host: agents that joined the next round while this one runs, and room for them:
  // stop the attempt so the group re-forms with them (no restart budget used).
  void checkJoiners(Store& client, int n) {
    if (waiting_claimed_ || worldSize() >= opts_.max_nodes) return;
    const int64_t waiting = client.tickets(roundJoinedKey(rounds_.nextRound()));
    if (waiting <= 0) return;
    waiting_claimed_ = true;
    const std::string reason =
        std::to_string(waiting) + " node(s) waiting to join; re-forming the group";
    CPPRUN_LOG(kInfo) << reason;
    claimStop(client, n, {myRank(), reason, StopCause::kJoin, 0});
    post([this, n, reason] { on_peer_stop_(n, reason, 0); });
  }

  void reportLost(const Status& status) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (job_over_ || shutting_down_ || !store_status_.isOk()) return;
      store_status_ = status;
    }
    post([this, status] { on_lost_(status); });
  }

  asio::io_context& io_;
  StoreCoordinatorOptions opts_;
  HostPrepare host_prepare_;
  PeerStop on_peer_stop_;
  Lost on_lost_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;  // guarded by mu_
  bool shutting_down_ = false;               // guarded by mu_
  bool job_over_ = false;                    // guarded by mu_
  int watch_attempt_ = -1;                   // guarded by mu_; -2: watcher must leave
  Status store_status_;                      // guarded by mu_
  std::string waiting_for_;                  // guarded by mu_; what the control thread awaits
  std::map<int, std::string> lost_agents_;   // guarded by mu_; by group rank
  int liveness_attempt_ = -1;                // guarded by mu_; the attempt liveness watches
  int decided_attempt_ = -1;                 // guarded by mu_; the last attempt decided
  bool waiting_as_spare_ = false;            // guarded by mu_; the rounds' spare wait
  bool spare_leave_ = false;                 // guarded by mu_; drained while a spare
  std::vector<std::pair<int, LostMember>> unclaimed_losses_;  // guarded by mu_; (attempt, who)
  // Decider: the last attempt whose stop its watcher saw (heartbeat liveness only).
  StopSeen stop_seen_;  // guarded by mu_; written by the watcher, read by the control thread
  std::optional<Membership> membership_;      // guarded by mu_
  RendezvousRounds rounds_{opts_, *this};     // control thread; nextRound(), progress(): any
  std::atomic<bool> waiting_claimed_{false};  // host, elastic: joiners announced
  std::unique_ptr<Store> control_client_;     // control thread only
  int decision_readers_ = 0;                  // control thread only
  int next_attempt_ = 0;                      // control thread only (host)
  int restarts_used_ = 0;                     // control thread only (host)
  std::thread control_;
  std::thread watcher_;
  // Last: destroyed first (after the threads are joined), so that a backend's liveness thread
  // never reports into members already gone. Created by the control thread before the watcher
  // starts; used by both.
  std::unique_ptr<MemberLiveness> liveness_;
};

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
                                      "the store host (" + host_name + ")");
  }
  return std::make_unique<StoreCoordinator>(io, std::move(options), std::move(host_prepare),
                                            std::move(on_peer_stop), std::move(on_lost));
}

}  // namespace cpprun::agent
