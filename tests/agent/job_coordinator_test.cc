// The job protocol (store_job_coordinator.cc) over the coordination seam with an in-process
// backend: two or three coordinators in one process, each on its own io_context thread, each
// connection a view of one shared MemoryStore with its own request timeout. A view can be cut
// (every request then fails as a broken connection does), which is how an agent loses the store.
// Every wait is bounded by a deadline; nothing sleeps to synchronise.
#include "agent/coordination/job_coordinator.h"

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <future>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <set>
#include <thread>

#include "agent/coordination/coordinator_waits.h"
#include "agent/coordination/job_keys.h"
#include "agent/coordination/liveness.h"
#include "agent/coordination/node_exclusion.h"
#include "agent/coordination/rendezvous_rounds.h"
#include "common/asio.h"
#include "common/clock.h"
#include "rendezvous/memory_store.h"
#include "rendezvous/prefix_store.h"
#include "tests/support/coordinator_futures.h"

namespace {

using namespace cpprun;
using namespace cpprun::agent;
using namespace std::chrono_literals;
using rendezvous::Bytes;
using rendezvous::MemoryStore;
using rendezvous::StoreError;

constexpr auto kDeadline = 20s;
// Where the keys of a job without --rdzv-id live in the store (job_keys.h: its namespace).
const std::string kNoneRun = "cpprun/none/";

// One connection to the shared store: the store's data, this connection's timeout. Cut: every
// request throws StoreError, as a TCP client's does once its connection is gone.
class StoreView : public rendezvous::Store {
 public:
  using Store::set;
  using Store::wait;

  // `members_reads` (optional): counts this connection's reads of a round's members document.
  StoreView(MemoryStore& shared, std::shared_ptr<std::atomic<bool>> cut,
            std::chrono::milliseconds timeout,
            std::shared_ptr<std::atomic<int>> members_reads = nullptr)
      : shared_(shared), cut_(std::move(cut)), members_reads_(std::move(members_reads)) {
    setTimeout(timeout);
  }

  void set(const std::string& key, const Bytes& value) override {
    live();
    shared_.set(key, value);
  }
  Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) override {
    live();
    return shared_.compareSet(key, expected, desired);
  }
  Bytes get(const std::string& key) override {
    live();
    countMembersRead(key);
    shared_.wait({key}, timeout());
    return shared_.get(key);
  }
  int64_t add(const std::string& key, int64_t delta) override {
    live();
    return shared_.add(key, delta);
  }
  bool deleteKey(const std::string& key) override {
    live();
    return shared_.deleteKey(key);
  }
  bool check(const std::vector<std::string>& keys) override {
    live();
    return shared_.check(keys);
  }
  int64_t numKeys() override {
    live();
    return shared_.numKeys();
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    live();
    shared_.wait(keys, timeout);
    live();
  }
  std::vector<Bytes> multiGet(const std::vector<std::string>& keys) override {
    live();
    for (const std::string& key : keys) countMembersRead(key);
    shared_.wait(keys, timeout());
    return shared_.multiGet(keys);
  }
  void multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) override {
    live();
    shared_.multiSet(keys, values);
  }
  void append(const std::string& key, const Bytes& value) override {
    live();
    shared_.append(key, value);
  }
  int64_t deletePrefix(const std::string& prefix) override {
    live();
    return shared_.deletePrefix(prefix);
  }

 private:
  void live() const {
    if (cut_->load()) throw StoreError("connection reset by peer (test: cut)");
  }
  void countMembersRead(const std::string& key) {
    const std::string suffix = "/members";
    if (members_reads_ && key.size() > suffix.size() &&
        key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0) {
      ++*members_reads_;
    }
  }

  MemoryStore& shared_;
  std::shared_ptr<std::atomic<bool>> cut_;
  std::shared_ptr<std::atomic<int>> members_reads_;
};

// Polls `condition` until it holds or the deadline passes.
template <typename F>
bool eventually(F condition, std::chrono::milliseconds within = kDeadline) {
  const auto deadline = std::chrono::steady_clock::now() + within;
  while (!condition()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(1ms);  // a poll's pace (the machine is shared), not a wait
  }
  return true;
}

template <typename T>
T within(std::future<T>& f) {
  REQUIRE(f.wait_for(kDeadline) == std::future_status::ready);
  return f.get();
}

struct PeerStopSeen {
  int attempt;
  std::string reason;
  int signal;
  bool stall = false;
};

// One agent: a coordinator on its own loop thread, and what its callbacks received.
class Agent {
 public:
  // `adjust` (optional) changes the options before the coordinator is made.
  Agent(MemoryStore& store, int rank, int world, int max_restarts,
        const std::function<void(StoreCoordinatorOptions&)>& adjust = {})
      : work_(boost::asio::make_work_guard(io_)),
        cut_(std::make_shared<std::atomic<bool>>()),
        members_reads_(std::make_shared<std::atomic<int>>(0)) {
    StoreCoordinatorOptions o;
    o.store.where = "the test's memory store";
    o.store.server = "the test's memory store";
    o.store.connect = [&store, cut = cut_, reads = members_reads_](
                          std::chrono::milliseconds, std::chrono::milliseconds request_timeout) {
      return std::unique_ptr<rendezvous::Store>(
          std::make_unique<StoreView>(store, cut, request_timeout, reads));
    };
    o.is_host = rank == 0;
    o.group_rank = rank;
    o.group_world_size = world;
    o.max_restarts = max_restarts;
    o.self = AgentInfo{"h" + std::to_string(rank), 2, "agent-" + std::to_string(rank), -1};
    o.join_timeout = 10s;
    o.keep_alive_interval = 50ms;
    o.keep_alive_max_attempt = 4;
    o.final_linger = 5s;
    if (adjust) adjust(o);
    coordinator_ = makeStoreCoordinator(
        io_, o, [](int attempt) { return "nccl-id-" + std::to_string(attempt); },
        [this](int n, const std::string& reason, int signal, bool stall) {
          std::lock_guard<std::mutex> lock(mu_);
          peer_stops_.push_back({n, reason, signal, stall});
        },
        [this](const Status& s) {
          std::lock_guard<std::mutex> lock(mu_);
          lost_ = s;
        });
    loop_ = std::thread([this] { io_.run(); });
  }

  ~Agent() {
    io_.stop();
    loop_.join();
    coordinator_.reset();
  }

  std::future<Result<AttemptStart>> begin(int n) {
    return testing::beginAttemptFuture(io_, *coordinator_, n);
  }

  std::future<Result<JobDecision>> end(int n, AttemptReport report) {
    return testing::endAttemptFuture(io_, *coordinator_, n, std::move(report));
  }

  void announceStop(int n, const std::string& reason, int signal = 0) {
    boost::asio::post(io_,
                      [this, n, reason, signal] { coordinator_->announceStop(n, reason, signal); });
  }
  void announceStall(int n, const std::string& reason) {
    boost::asio::post(io_, [this, n, reason] { coordinator_->announceStall(n, reason); });
  }

  std::vector<PeerStopSeen> peerStops() {
    std::lock_guard<std::mutex> lock(mu_);
    return peer_stops_;
  }
  std::optional<Status> lost() {
    std::lock_guard<std::mutex> lock(mu_);
    return lost_;
  }
  void cutFromStore() { cut_->store(true); }
  // How often this agent read a round's members document (every connection of it).
  int membersReads() const { return members_reads_->load(); }
  RendezvousProgress progress() const { return coordinator_->progress(); }

 private:
  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_;
  std::shared_ptr<std::atomic<bool>> cut_;
  std::shared_ptr<std::atomic<int>> members_reads_;
  std::unique_ptr<JobCoordinator> coordinator_;
  std::thread loop_;
  std::mutex mu_;
  std::vector<PeerStopSeen> peer_stops_;
  std::optional<Status> lost_;
};

std::vector<std::unique_ptr<Agent>> agents(MemoryStore& store, int world, int max_restarts) {
  std::vector<std::unique_ptr<Agent>> out;
  for (int r = 0; r < world; ++r) {
    out.push_back(std::make_unique<Agent>(store, r, world, max_restarts));
  }
  return out;
}

// Every agent begins attempt n, the host last (the others wait for its go, as agents started
// before node 0 do); returns their starts in rank order.
std::vector<AttemptStart> beginAll(std::vector<std::unique_ptr<Agent>>& all, int n) {
  std::vector<std::future<Result<AttemptStart>>> futures(all.size());
  for (size_t r = all.size(); r-- > 0;) futures[r] = all[r]->begin(n);
  std::vector<AttemptStart> starts;
  for (auto& f : futures) {
    Result<AttemptStart> r = within(f);
    REQUIRE(r.isOk());
    starts.push_back(r.value());
  }
  return starts;
}

AttemptReport reportOf(AttemptReport::Kind kind, std::vector<WorkerFailure> failures = {}) {
  AttemptReport r;
  r.kind = kind;
  r.failures = std::move(failures);
  return r;
}

WorkerFailure workerFailure(int local_rank, int rank, int exit_code, bool teardown = false) {
  WorkerFailure f;
  f.local_rank = local_rank;
  f.rank = rank;
  f.exit_code = exit_code;
  f.teardown = teardown;
  f.time = std::chrono::system_clock::now();
  return f;
}

}  // namespace

TEST_CASE("coordinator: three agents join statically and start one attempt with the host's id",
          "[unit]") {
  MemoryStore store;
  auto all = agents(store, 3, 0);
  const std::vector<AttemptStart> starts = beginAll(all, 0);
  for (int r = 0; r < 3; ++r) {
    const AttemptStart& s = starts[static_cast<size_t>(r)];
    CHECK(s.attempt == 0);
    CHECK(s.nccl_unique_id_hex == "nccl-id-0");
    CHECK(s.membership.group_rank == r);
    CHECK(s.membership.group_world_size == 3);
    CHECK(s.membership.base_rank == 2 * r);
    CHECK(s.membership.world_size == 6);
    REQUIRE(s.membership.agents.size() == 3);
    CHECK(s.membership.agents[2].host == "h2");
    CHECK(all[static_cast<size_t>(r)]->progress().rounds_completed == 1);
  }
  // Every agent succeeds: the host's decision reaches all, and nobody was told to stop.
  std::vector<std::future<Result<JobDecision>>> decisions;
  for (auto& a : all) decisions.push_back(a->end(0, reportOf(AttemptReport::Kind::kSucceeded)));
  for (size_t r = 0; r < all.size(); ++r) {
    Result<JobDecision> d = within(decisions[r]);
    REQUIRE(d.isOk());
    CHECK(d.value().kind == JobDecision::Kind::kSucceeded);
    CHECK(all[r]->peerStops().empty());
  }
}

TEST_CASE("coordinator: a failure one agent announces stops the others and restarts every node",
          "[unit]") {
  MemoryStore store;
  auto all = agents(store, 3, /*max_restarts=*/1);
  beginAll(all, 0);

  all[1]->announceStop(0, "worker 3 exited 7");
  for (size_t r : {size_t{0}, size_t{2}}) {
    REQUIRE(eventually([&] { return !all[r]->peerStops().empty(); }));
    const PeerStopSeen seen = all[r]->peerStops().front();
    CHECK(seen.attempt == 0);
    CHECK(seen.reason == "node 1 (h1): worker 3 exited 7");
    CHECK(seen.signal == 0);
  }
  CHECK(all[1]->peerStops().empty());  // its own claim is not a peer's stop

  std::vector<std::future<Result<JobDecision>>> decisions;
  decisions.push_back(
      all[0]->end(0, reportOf(AttemptReport::Kind::kStopped, {workerFailure(0, 0, 0, true)})));
  decisions.push_back(
      all[1]->end(0, reportOf(AttemptReport::Kind::kFailed, {workerFailure(1, 3, 7)})));
  decisions.push_back(all[2]->end(0, reportOf(AttemptReport::Kind::kStopped)));
  for (auto& f : decisions) {
    Result<JobDecision> d = within(f);
    REQUIRE(d.isOk());
    CHECK(d.value().kind == JobDecision::Kind::kRestart);
    CHECK(d.value().restarts_used == 1);
    CHECK(d.value().summary == "node 1 (h1): worker 3 exited 7");
  }

  // Attempt 1 starts everywhere with a new id; this time the job succeeds.
  for (const AttemptStart& s : beginAll(all, 1)) {
    CHECK(s.attempt == 1);
    CHECK(s.nccl_unique_id_hex == "nccl-id-1");
  }
  decisions.clear();
  for (auto& a : all) decisions.push_back(a->end(1, reportOf(AttemptReport::Kind::kSucceeded)));
  for (auto& f : decisions) {
    Result<JobDecision> d = within(f);
    REQUIRE(d.isOk());
    CHECK(d.value().kind == JobDecision::Kind::kSucceeded);
  }
}

TEST_CASE(
    "coordinator: a stall one agent claims reaches the others as a stall, and the decision "
    "names the culprit another node reported",
    "[unit]") {
  MemoryStore store;
  auto all = agents(store, 3, /*max_restarts=*/0);
  beginAll(all, 0);
  all[0]->announceStall(0, "rank(s) 0 stalled (no progress for 3.0 s)");
  for (size_t r : {size_t{1}, size_t{2}}) {
    REQUIRE(eventually([&] { return !all[r]->peerStops().empty(); }));
    CHECK(all[r]->peerStops().front().stall);  // they snapshot their ranks before the teardown
  }
  // Every rank (2 per node) waits in all_reduce #9 but rank 5, on node 2, after #8.
  auto hung = [](int node, AttemptReport::Kind kind) {
    AttemptReport r = reportOf(kind, {workerFailure(0, 2 * node, 0, node != 0),
                                      workerFailure(1, 2 * node + 1, 0, node != 0)});
    for (int rank : {2 * node, 2 * node + 1}) {
      RankState s;
      s.rank = rank;
      s.local_rank = rank - 2 * node;
      s.collective = CollectiveRecord{rank != 5, "all_reduce", "world", rank == 5 ? 8u : 9u};
      r.rank_states.push_back(s);
    }
    return r;
  };
  std::vector<std::future<Result<JobDecision>>> decisions;
  decisions.push_back(all[0]->end(0, hung(0, AttemptReport::Kind::kFailed)));
  decisions.push_back(all[1]->end(0, hung(1, AttemptReport::Kind::kStopped)));
  decisions.push_back(all[2]->end(0, hung(2, AttemptReport::Kind::kStopped)));
  for (auto& f : decisions) {
    Result<JobDecision> d = within(f);
    REQUIRE(d.isOk());
    CHECK(d.value().kind == JobDecision::Kind::kFailed);
    CHECK_THAT(d.value().summary, Catch::StartsWith("hang: rank 5 (node 2, h2) did not enter "
                                                    "all_reduce #9"));
    REQUIRE(!d.value().failures.empty());
    CHECK(d.value().failures[rootCauseIndex(d.value().failures)].rank == 5);
  }
}

TEST_CASE("coordinator: with no restart left every agent gets the failure with its root cause",
          "[unit]") {
  MemoryStore store;
  auto all = agents(store, 2, /*max_restarts=*/0);
  beginAll(all, 0);
  all[1]->announceStop(0, "worker 2 exited 3", 0);
  REQUIRE(eventually([&] { return !all[0]->peerStops().empty(); }));
  auto host = all[0]->end(0, reportOf(AttemptReport::Kind::kStopped,
                                      {workerFailure(0, 0, 134), workerFailure(1, 1, 0, true)}));
  auto other = all[1]->end(0, reportOf(AttemptReport::Kind::kFailed, {workerFailure(0, 2, 3)}));
  for (auto* f : {&host, &other}) {
    Result<JobDecision> d = within(*f);
    REQUIRE(d.isOk());
    const JobDecision& decision = d.value();
    CHECK(decision.kind == JobDecision::Kind::kFailed);
    REQUIRE(decision.failures.size() == 3);
    CHECK(decision.failures[0].host == "h1");  // the claimant's failure: the root cause
    CHECK(decision.failures[0].rank == 2);
    CHECK_FALSE(decision.failures[0].collateral);
    CHECK(decision.failures[1].host == "h0");
    CHECK(decision.failures[1].collateral);        // failed on its own after the stop
    CHECK_FALSE(decision.failures[2].collateral);  // torn down
  }
}

TEST_CASE("coordinator: a signal one agent forwards reaches the others with its number", "[unit]") {
  MemoryStore store;
  auto all = agents(store, 2, 3);
  beginAll(all, 0);
  all[0]->announceStop(0, "received SIGUSR1", 10);
  REQUIRE(eventually([&] { return !all[1]->peerStops().empty(); }));
  CHECK(all[1]->peerStops().front().signal == 10);
  AttemptReport signalled = reportOf(AttemptReport::Kind::kSignalled);
  signalled.signal = 10;
  auto host = all[0]->end(0, signalled);
  auto other = all[1]->end(0, signalled);
  for (auto* f : {&host, &other}) {
    Result<JobDecision> d = within(*f);
    REQUIRE(d.isOk());
    CHECK(d.value().kind == JobDecision::Kind::kStopped);
    CHECK(d.value().signal == 10);
    CHECK(d.value().restarts_used == 0);
  }
}

TEST_CASE("coordinator: an agent cut from the store is lost to itself and to the host", "[unit]") {
  MemoryStore store;
  auto all = agents(store, 3, 5);
  beginAll(all, 0);
  all[2]->cutFromStore();
  // The cut agent learns it within the keep-alive bound, naming the store.
  REQUIRE(eventually([&] { return all[2]->lost().has_value(); }));
  CHECK_THAT(all[2]->lost()->message(), Catch::Contains("lost the test's memory store"));
  // The host stops hearing its heartbeat and stops the attempt for every live agent.
  for (size_t r : {size_t{0}, size_t{1}}) {
    REQUIRE(eventually([&] { return !all[r]->peerStops().empty(); }));
    CHECK_THAT(all[r]->peerStops().front().reason,
               Catch::Contains("the agent of node 2 (h2) stopped responding"));
  }
  // Static: a lost node cannot be replaced; the job fails without waiting for its report and
  // without using the budget.
  auto host = all[0]->end(0, reportOf(AttemptReport::Kind::kStopped));
  auto other = all[1]->end(0, reportOf(AttemptReport::Kind::kStopped));
  for (auto* f : {&host, &other}) {
    Result<JobDecision> d = within(*f);
    REQUIRE(d.isOk());
    CHECK(d.value().kind == JobDecision::Kind::kFailed);
    CHECK(d.value().restarts_used == 0);
    REQUIRE_FALSE(d.value().failures.empty());
    CHECK(d.value().failures[0].host == "h2");
    CHECK(d.value().failures[0].rank == 4);
  }
}

// The coordinator's waits measure their bounds on StoreCoordinatorOptions::clock: a join whose
// other node never comes times out when join_timeout has passed on that clock, without the test
// waiting the 600 s (its store waits are 50 ms slices of real time).
TEST_CASE("coordinator: on virtual time, the join times out when join_timeout passed on its clock",
          "[unit]") {
  MemoryStore store;
  ManualClock clock;
  Agent lonely(store, 1, 2, 0, [&](StoreCoordinatorOptions& o) {
    o.join_timeout = 600s;
    o.clock = &clock;
  });
  auto start = lonely.begin(0);
  // Node 0 never comes. The clock stands still: the join goes on, however long it really takes
  // (several of its 50 ms slices).
  REQUIRE(eventually([&] { return lonely.progress().round == 0; }));
  CHECK(start.wait_for(200ms) == std::future_status::timeout);
  clock.advance(599s);
  CHECK(start.wait_for(200ms) == std::future_status::timeout);
  clock.advance(1s);
  Result<AttemptStart> r = within(start);
  REQUIRE_FALSE(r.isOk());
  CHECK(r.status().code() == StatusCode::kTimeout);
  CHECK_THAT(r.status().message(), Catch::Contains("node 0 did not join within 600.0"));
}

TEST_CASE("coordinator: elastic, an agent that comes late re-forms the running group with it",
          "[unit]") {
  MemoryStore store;
  const auto elastic = [](StoreCoordinatorOptions& o) {
    o.elastic = true;
    o.min_nodes = 2;
    o.max_nodes = 3;
    o.last_call_timeout = 100ms;
  };
  std::vector<std::unique_ptr<Agent>> all;
  for (int r = 0; r < 3; ++r) all.push_back(std::make_unique<Agent>(store, r, 1, 0, elastic));
  // Round 0: two agents; the round closes after the last call without a third.
  auto second = all[1]->begin(0);
  auto first = all[0]->begin(0);
  for (auto* f : {&first, &second}) {
    Result<AttemptStart> s = within(*f);
    REQUIRE(s.isOk());
    CHECK(s.value().attempt == 0);
    CHECK(s.value().membership.group_world_size == 2);
  }
  // The third joins the next round; the host stops the attempt to take it in, without using
  // the restart budget (max_restarts is 0).
  auto third = all[2]->begin(0);
  for (size_t r : {size_t{0}, size_t{1}}) {
    REQUIRE(eventually([&] { return !all[r]->peerStops().empty(); }));
    CHECK_THAT(all[r]->peerStops().front().reason,
               Catch::Contains("1 node(s) waiting to join; re-forming the group"));
  }
  auto d0 = all[0]->end(0, reportOf(AttemptReport::Kind::kStopped));
  auto d1 = all[1]->end(0, reportOf(AttemptReport::Kind::kStopped));
  for (auto* f : {&d0, &d1}) {
    Result<JobDecision> d = within(*f);
    REQUIRE(d.isOk());
    CHECK(d.value().kind == JobDecision::Kind::kRestart);
    CHECK(d.value().membership_change);
    CHECK(d.value().restarts_used == 0);
  }
  // Round 1 closes at max_nodes with all three, as attempt 1.
  auto b1 = all[1]->begin(1);
  auto b0 = all[0]->begin(1);
  std::set<int> ranks;
  for (auto* f : {&b0, &b1, &third}) {
    Result<AttemptStart> s = within(*f);
    REQUIRE(s.isOk());
    CHECK(s.value().attempt == 1);
    CHECK(s.value().membership.group_world_size == 3);
    CHECK(s.value().membership.world_size == 6);
    ranks.insert(s.value().membership.group_rank);
  }
  CHECK(ranks == std::set<int>{0, 1, 2});
  CHECK(all[2]->progress().rounds_completed == 1);
  CHECK(all[0]->progress().rounds_completed == 2);
}

TEST_CASE(
    "coordinator: elastic, a member reads only its own assignment, not the round's members, and "
    "a re-formed round does not read the previous one",
    "[unit]") {
  MemoryStore store;
  // Four agents of 1..4 workers, their threads racing to join: join order, not the host,
  // decides the ranks, so node 0 may be an agent other than the store host (agent 0, which
  // closes the round); that node 0 reads the members document once (it decides).
  const auto elastic = [](StoreCoordinatorOptions& o) {
    o.elastic = true;
    o.min_nodes = 4;
    o.max_nodes = 4;
    o.self.nproc = o.group_rank + 1;
  };
  std::vector<std::unique_ptr<Agent>> all;
  for (int r = 0; r < 4; ++r) all.push_back(std::make_unique<Agent>(store, r, 1, 1, elastic));
  const auto beginRound = [&](int n) {
    std::vector<std::future<Result<AttemptStart>>> futures(all.size());
    for (size_t a = all.size(); a-- > 0;) futures[a] = all[a]->begin(n);
    std::vector<AttemptStart> starts;
    for (auto& f : futures) {
      Result<AttemptStart> s = within(f);
      REQUIRE(s.isOk());
      starts.push_back(s.value());
    }
    // Ranks 0..3, base ranks the sums of the workers below each, one world size.
    std::vector<int> nproc_of_rank(all.size());
    for (size_t a = 0; a < all.size(); ++a) {
      CHECK(starts[a].attempt == n);
      CHECK(starts[a].membership.group_world_size == 4);
      CHECK(starts[a].membership.world_size == 10);
      nproc_of_rank[static_cast<size_t>(starts[a].membership.group_rank)] = static_cast<int>(a) + 1;
    }
    for (size_t a = 0; a < all.size(); ++a) {
      const Membership& m = starts[a].membership;
      CHECK(m.base_rank ==
            std::accumulate(nproc_of_rank.begin(), nproc_of_rank.begin() + m.group_rank, 0));
    }
    return starts;
  };
  std::vector<AttemptStart> starts = beginRound(0);
  // Nobody but node 0 read the members document (agent 0 closed the round: it wrote it).
  for (size_t a = 0; a < all.size(); ++a) {
    const bool node0 = starts[a].membership.group_rank == 0;
    CHECK(all[a]->membersReads() == (node0 && a != 0 ? 1 : 0));
    if (!node0 && a != 0) CHECK(starts[a].membership.agents.empty());
  }
  // A failure: every node restarts into round 1, which the host re-forms; the survivors read
  // neither round 1's members nor round 0's, and keep their ranks.
  all[3]->announceStop(0, "worker exited 1");
  std::vector<std::future<Result<JobDecision>>> decisions;
  for (size_t a = 0; a < all.size(); ++a) {
    if (a != 3) REQUIRE(eventually([&] { return !all[a]->peerStops().empty(); }));
    decisions.push_back(all[a]->end(
        0, reportOf(a == 3 ? AttemptReport::Kind::kFailed : AttemptReport::Kind::kStopped)));
  }
  for (auto& f : decisions) {
    Result<JobDecision> d = within(f);
    REQUIRE(d.isOk());
    CHECK(d.value().kind == JobDecision::Kind::kRestart);
  }
  const std::vector<int> reads_before = [&] {
    std::vector<int> v;
    for (auto& a : all) v.push_back(a->membersReads());
    return v;
  }();
  const std::vector<AttemptStart> again = beginRound(1);
  for (size_t a = 0; a < all.size(); ++a) {
    CHECK(again[a].membership.group_rank == starts[a].membership.group_rank);  // stable ranks
    const bool node0 = again[a].membership.group_rank == 0;
    // The closer reads round 0's members (who the survivors are); node 0 reads round 1's.
    CHECK(all[a]->membersReads() - reads_before[a] == (a == 0 || node0 ? 1 : 0));
  }
  decisions.clear();
  for (auto& a : all) decisions.push_back(a->end(1, reportOf(AttemptReport::Kind::kSucceeded)));
  for (auto& f : decisions) {
    Result<JobDecision> d = within(f);
    REQUIRE(d.isOk());
    CHECK(d.value().kind == JobDecision::Kind::kSucceeded);
  }
}

namespace {

// Round 0's next slot holds agent 2's record (Agent(store, 2, ...)) as its first join wrote it,
// whose reply was lost: takeSlot joins again with a new slot when agent 2 begins.
void agent2JoinedAndLostItsReply(MemoryStore& store) {
  const int64_t slot = store.takeTicket(kNoneRun + roundJoinedKey(0));
  store.set(kNoneRun + roundAgentKey(0, slot),
            agentRecord(AgentInfo{"h2", 2, "agent-2", -1}, -1).dump());
}

// Every start of `futures` is attempt 0 of one group of three; returns their group ranks.
std::set<int> groupRanksOfThree(std::vector<std::future<Result<AttemptStart>>>& futures) {
  std::set<int> ranks;
  for (auto& f : futures) {
    Result<AttemptStart> s = within(f);
    REQUIRE(s.isOk());
    CHECK(s.value().attempt == 0);
    CHECK(s.value().membership.group_world_size == 3);
    ranks.insert(s.value().membership.group_rank);
  }
  return ranks;
}

}  // namespace

TEST_CASE(
    "coordinator: elastic, an agent that joined twice is a member by its first slot while it "
    "waits on its last",
    "[unit]") {
  MemoryStore store;
  // Agent 2's first join: its slot and record are in the store (the round keeps the first record
  // of an id).
  agent2JoinedAndLostItsReply(store);
  // Three distinct agents, at most four slots: the round closes once agent 2's second slot (the
  // fourth) is taken, with agent 2 a member by its first slot.
  const auto elastic = [](StoreCoordinatorOptions& o) {
    o.elastic = true;
    o.min_nodes = 3;
    o.max_nodes = 4;
    o.last_call_timeout = 10s;
  };
  std::vector<std::unique_ptr<Agent>> all;
  for (int r = 0; r < 3; ++r) all.push_back(std::make_unique<Agent>(store, r, 1, 0, elastic));
  std::vector<std::future<Result<AttemptStart>>> futures;
  futures.push_back(all[0]->begin(0));
  futures.push_back(all[1]->begin(0));
  // Agent 2 joins again only after the others took slots 2 and 3 (else the round could close
  // at slot 3 with agent 2 twice in it, short of three agents).
  REQUIRE(eventually([&] { return store.check({kNoneRun + roundAgentKey(0, 3)}); }));
  futures.push_back(all[2]->begin(0));
  CHECK(groupRanksOfThree(futures) == std::set<int>{0, 1, 2});
  // Its last slot's assignment says "not a member"; the members document says otherwise.
  CHECK(all[2]->membersReads() >= 1);
}

TEST_CASE(
    "coordinator: elastic, a round whose slots hold one agent twice waits for min_nodes distinct "
    "agents",
    "[unit]") {
  MemoryStore store;
  // Slot 1: agent 2's first join.
  agent2JoinedAndLostItsReply(store);
  const auto elastic = [](StoreCoordinatorOptions& o) {
    o.elastic = true;
    o.min_nodes = 3;
    o.max_nodes = 3;
  };
  std::vector<std::unique_ptr<Agent>> all;
  for (int r = 0; r < 3; ++r) all.push_back(std::make_unique<Agent>(store, r, 1, 0, elastic));
  // Slots 2 and 3: the host, then agent 2 again. Three slots are taken but two agents joined:
  // the round must not close short of min_nodes (it did: it closed at slot 3 with two members).
  std::vector<std::future<Result<AttemptStart>>> futures;
  futures.push_back(all[0]->begin(0));
  REQUIRE(eventually([&] { return store.check({kNoneRun + roundAgentKey(0, 2)}); }));
  futures.push_back(all[2]->begin(0));
  REQUIRE(eventually([&] { return store.check({kNoneRun + roundAgentKey(0, 3)}); }));
  futures.push_back(all[1]->begin(0));
  CHECK(groupRanksOfThree(futures) == std::set<int>{0, 1, 2});
}

namespace {

// A liveness whose verdicts the test writes: every member whose id is in `dead` is reported lost
// as soon as its attempt is watched (as LeaseLiveness does for a member whose lease is gone).
class ScriptedLiveness : public MemberLiveness {
 public:
  ScriptedLiveness(LivenessOptions options, std::set<std::string> dead)
      : options_(std::move(options)), dead_(std::move(dead)) {}
  bool renew(rendezvous::Store&) override { return true; }
  void watch(int attempt, const Membership& m) override {
    for (int r = 0; r < m.group_world_size; ++r) {
      const AgentInfo& a = m.agents[static_cast<size_t>(r)];
      if (dead_.count(a.id)) options_.on_lost(attempt, {r, "the agent of " + a.host + " was lost"});
    }
  }
  std::vector<LostMember> poll(rendezvous::Store&) override { return {}; }

 private:
  LivenessOptions options_;
  std::set<std::string> dead_;
};

}  // namespace

TEST_CASE(
    "coordinator: host per round - node 0 lost between its round and its go: the others meet "
    "again in the next round",
    "[unit]") {
  MemoryStore store;
  // Node 0 of round 0 joins (its record in a slot, scheduler rank 0 orders it first) and dies
  // before it gives the go: nobody else could start attempt 0.
  const AgentInfo dead{"h-dead", 2, "agent-dead", 0};
  const int64_t slot = store.takeTicket(kNoneRun + roundJoinedKey(0));
  store.set(kNoneRun + roundAgentKey(0, slot), agentRecord(dead, -1).dump());
  const auto etcd_like = [&](StoreCoordinatorOptions& o) {
    o.elastic = true;
    o.host_per_round = true;
    o.min_nodes = 2;
    o.max_nodes = 3;
    o.last_call_timeout = 100ms;
    o.self.scheduler_rank = o.group_rank;  // 1, 2: after the dead node
    o.store.liveness = [id = dead.id](const LivenessOptions& lo) {
      return std::unique_ptr<MemberLiveness>(
          std::make_unique<ScriptedLiveness>(lo, std::set<std::string>{id}));
    };
  };
  std::vector<std::unique_ptr<Agent>> all;
  for (int r = 1; r <= 2; ++r) all.push_back(std::make_unique<Agent>(store, r, 1, 0, etcd_like));
  auto b1 = all[0]->begin(0);
  auto b2 = all[1]->begin(0);
  std::set<int> ranks;
  for (auto* f : {&b1, &b2}) {
    Result<AttemptStart> s = within(*f);
    REQUIRE(s.isOk());
    // Round 0 closed with the dead node as node 0; round 1 without it starts attempt 1.
    CHECK(s.value().attempt == 1);
    CHECK(s.value().membership.group_world_size == 2);
    CHECK(s.value().nccl_unique_id_hex == "nccl-id-1");
    for (const AgentInfo& a : s.value().membership.agents) CHECK(a.id != dead.id);
    ranks.insert(s.value().membership.group_rank);
  }
  CHECK(ranks == std::set<int>{0, 1});
  CHECK(store.check({kNoneRun + roundMembersKey(0)}));
  CHECK_FALSE(store.check({kNoneRun + attemptGoKey(0)}));
  for (auto& a : all) {
    CHECK(a->progress().rounds_completed == 2);
    CHECK(a->peerStops().empty());  // attempt 0 never started; attempt 1 has no one lost
  }
}

namespace {

// A static job of `world` agents with run id `run_id`, whose hosts are named "<run_id>-<rank>".
std::vector<std::unique_ptr<Agent>> job(MemoryStore& store, const std::string& run_id, int world) {
  std::vector<std::unique_ptr<Agent>> out;
  for (int r = 0; r < world; ++r) {
    out.push_back(std::make_unique<Agent>(store, r, world, 0, [&](StoreCoordinatorOptions& o) {
      o.run_id = run_id;
      o.self.host = run_id + "-" + std::to_string(r);
    }));
  }
  return out;
}

}  // namespace

TEST_CASE("coordinator: two jobs with different run ids in one store never see each other's keys",
          "[unit]") {
  MemoryStore store;
  // Job a runs to its end first: its worker fails and it has no restart left.
  {
    auto a = job(store, "job-a", 2);
    beginAll(a, 0);
    auto d0 = a[0]->end(0, reportOf(AttemptReport::Kind::kFailed, {workerFailure(0, 0, 3)}));
    auto d1 = a[1]->end(0, reportOf(AttemptReport::Kind::kSucceeded));
    for (auto* d : {&d0, &d1}) {
      Result<JobDecision> r = within(*d);
      REQUIRE(r.isOk());
      CHECK(r.value().kind == JobDecision::Kind::kFailed);
    }
  }
  // Job b in the same store: its own world (before, node 1 took job a's node 0 as its own) and
  // its own outcome (before, node 1 read job a's decision, "failed", before its host decided).
  auto b = job(store, "job-b", 2);
  const std::vector<AttemptStart> starts = beginAll(b, 0);
  for (const AttemptStart& s : starts) {
    REQUIRE(s.membership.agents.size() == 2);
    CHECK(s.membership.agents[0].host == "job-b-0");
    CHECK(s.membership.agents[1].host == "job-b-1");
  }
  auto d1 = b[1]->end(0, reportOf(AttemptReport::Kind::kSucceeded));
  auto d0 = b[0]->end(0, reportOf(AttemptReport::Kind::kSucceeded));
  for (auto* d : {&d0, &d1}) {
    Result<JobDecision> r = within(*d);
    REQUIRE(r.isOk());
    CHECK(r.value().kind == JobDecision::Kind::kSucceeded);
  }
  CHECK(store.check({"cpprun/job-a/rdzv/node/1", "cpprun/job-b/rdzv/node/1",
                     "cpprun/job-a/attempt/0/decision", "cpprun/job-b/attempt/0/decision"}));
}

TEST_CASE(
    "coordinator: an agent whose store is served by another run id refuses to join, naming both",
    "[unit]") {
  MemoryStore store;
  store.set("cpprun/served_run_id", "job-a");  // what job a's store host sets before serving
  Agent b(store, 1, 2, 0, [](StoreCoordinatorOptions& o) { o.run_id = "job-b"; });
  const auto began = std::chrono::steady_clock::now();
  auto start = b.begin(0);
  Result<AttemptStart> r = within(start);
  REQUIRE_FALSE(r.isOk());
  CHECK_THAT(r.status().message(), Catch::Contains("run id 'job-a'") &&
                                       Catch::Contains("--rdzv-id 'job-b'") &&
                                       Catch::Contains("--rdzv-endpoint"));
  CHECK(std::chrono::steady_clock::now() - began < 5s);  // at once, not after the join timeout
  // It wrote nothing: job a's keys (and its own namespace) are untouched.
  CHECK(store.numKeys() == 1);
}

// Every key of attempt n the protocol writes in a static job of `world` agents whose attempt a
// stop ended, in the job's namespace.
std::vector<std::string> attemptKeys(int n, int world) {
  std::vector<std::string> keys = {attemptGoKey(n), attemptStopKey(n), attemptDecisionKey(n)};
  for (int r = 0; r < world; ++r) {
    keys.push_back(attemptReadyKey(n, r));
    keys.push_back(attemptReportKey(n, r));
  }
  for (auto& k : keys) k = kNoneRun + k;
  return keys;
}

TEST_CASE("coordinator: past attempts' keys go, so the store stays the same size over 200 restarts",
          "[unit]") {
  constexpr int kAttempts = 200;
  MemoryStore store;
  // The two ways the decider deletes: through its connection (etcd's DeleteRange), or (the c10d
  // store host) on the store it serves, on its loop.
  const bool local = GENERATE(false, true);
  INFO((local ? "the store host's own eraser" : "through the store connection"));
  std::vector<std::unique_ptr<Agent>> all;
  for (int r = 0; r < 2; ++r) {
    all.push_back(std::make_unique<Agent>(store, r, 2, kAttempts, [&](StoreCoordinatorOptions& o) {
      if (local && r == 0) {
        o.erase_prefix = [&store](const std::string& p) {
          return static_cast<size_t>(store.deletePrefix(p));
        };
      }
    }));
  }
  int64_t keys_at_10 = 0;
  for (int n = 0; n < kAttempts; ++n) {
    beginAll(all, n);
    if (n >= 2) {
      // Attempt n-2's keys are gone once attempt n started; n-1's stay for late readers.
      for (const auto& key : attemptKeys(n - 2, 2)) CHECK_FALSE(store.check({key}));
      CHECK(store.check(attemptKeys(n - 1, 2)));
    }
    if (n == 10) keys_at_10 = store.numKeys();
    if (n > 10) REQUIRE(store.numKeys() <= keys_at_10);
    all[1]->announceStop(n, "worker 2 exited 1");
    REQUIRE(eventually([&] { return all[0]->peerStops().size() == static_cast<size_t>(n + 1); }));
    auto d0 = all[0]->end(n, reportOf(AttemptReport::Kind::kStopped));
    auto d1 = all[1]->end(n, reportOf(AttemptReport::Kind::kFailed, {workerFailure(0, 2, 1)}));
    for (auto* d : {&d0, &d1}) {
      Result<JobDecision> r = within(*d);
      REQUIRE(r.isOk());
      REQUIRE(r.value().kind == JobDecision::Kind::kRestart);
    }
  }
  CHECK(keys_at_10 > 0);
  // The exclusion history (kept across attempts) keeps the newest records of node 1 only.
  const std::string history = rendezvous::toString(store.get(kNoneRun + kExclusionHistoryKey));
  CHECK(std::count(history.begin(), history.end(), '\n') == kFailureRecordsPerAgent);
}

TEST_CASE("coordinator: elastic, rounds older than the one before the current one are deleted",
          "[unit]") {
  MemoryStore store;
  const auto elastic = [](StoreCoordinatorOptions& o) {
    o.elastic = true;
    o.min_nodes = 2;
    o.max_nodes = 2;
  };
  std::vector<std::unique_ptr<Agent>> all;
  for (int r = 0; r < 2; ++r) all.push_back(std::make_unique<Agent>(store, r, 1, 20, elastic));
  for (int n = 0; n < 12; ++n) {
    auto b1 = all[1]->begin(n);
    auto b0 = all[0]->begin(n);
    int round = -1;
    for (auto* f : {&b0, &b1}) {
      Result<AttemptStart> s = within(*f);
      REQUIRE(s.isOk());
      REQUIRE(s.value().attempt == n);
      round = s.value().membership.round;
    }
    REQUIRE(round >= 0);
    if (round >= 2) {
      CHECK_FALSE(store.check({kNoneRun + roundClosedKey(round - 2)}));
      CHECK_FALSE(store.check({kNoneRun + roundJoinedKey(round - 2)}));
      CHECK_FALSE(store.check({kNoneRun + roundMembersKey(round - 2)}));
      CHECK(store.check({kNoneRun + roundClosedKey(round - 1)}));
    }
    if (n >= 2) CHECK_FALSE(store.check({kNoneRun + attemptGoKey(n - 2)}));
    all[1]->announceStop(n, "worker exited 1");
    REQUIRE(eventually([&] { return all[0]->peerStops().size() == static_cast<size_t>(n + 1); }));
    auto d1 = all[1]->end(n, reportOf(AttemptReport::Kind::kFailed, {workerFailure(0, 2, 1)}));
    auto d0 = all[0]->end(n, reportOf(AttemptReport::Kind::kStopped));
    for (auto* d : {&d0, &d1}) {
      Result<JobDecision> r = within(*d);
      REQUIRE(r.isOk());
      REQUIRE(r.value().kind == JobDecision::Kind::kRestart);
    }
  }
}

TEST_CASE("coordinator waits: a list of nodes in a log line names at most 8 and counts the rest",
          "[unit]") {
  std::vector<int> ranks(99998);
  std::iota(ranks.begin(), ranks.end(), 2);
  CHECK(rankList(ranks) == "2, 3, 4, 5, 6, 7, 8, 9 and 99,990 more");
  CHECK(rankList({1, 2}) == "1, 2");
  CHECK(nodeNames({"n0", "n1", "n2"}, {1, 2}) == "n1, n2");
  CHECK(nodeNames({}, {3}, 10) == "node 3 and 9 more");
  CHECK(nodeNames({}, {}) == "");
  CHECK(withThousands(999) == "999");
  CHECK(withThousands(1234567) == "1,234,567");
}

namespace {

// A connection that counts its CHECK requests.
class CheckCounter : public StoreView {
 public:
  using StoreView::StoreView;
  bool check(const std::vector<std::string>& keys) override {
    ++checks;
    return StoreView::check(keys);
  }
  int checks = 0;
};

class NoWaits : public WaitContext {
 public:
  cpprun::Status abandonment() override { return cpprun::Status::ok(); }
  void setWaiting(const std::string&) override {}
};

}  // namespace

namespace {

// A store whose waits take no real time: each moves the test's clock by its timeout and times
// out, unless the keys are there.
class InstantWaits : public MemoryStore {
 public:
  explicit InstantWaits(ManualClock& clock) : clock_(clock) {}
  using MemoryStore::wait;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    if (check(keys)) return;
    ++waits;
    clock_.advance(timeout);
    throw rendezvous::StoreTimeout("test: nobody wrote the keys");
  }
  int waits = 0;

 private:
  ManualClock& clock_;
};

class ManualClockWaits : public WaitContext {
 public:
  explicit ManualClockWaits(ManualClock& clock) : clock_(clock) {}
  Status abandonment() override { return Status::ok(); }
  void setWaiting(const std::string&) override {}
  const MonotonicClock& clock() override { return clock_; }

 private:
  ManualClock& clock_;
};

}  // namespace

// waitForKeys returns how a wait ended (coordinator_waits.h) and measures its bound on the
// context's clock: 600 s of slices pass without real waiting.
TEST_CASE(
    "coordinator waits: on virtual time a wait times out after its total, and a slice's "
    "verdict ends it with its status",
    "[unit]") {
  ManualClock clock;
  InstantWaits store(clock);
  ManualClockWaits waits(clock);
  const Status timed_out = waitForKeys(waits, store, {"k"}, 600s, 2s, "the test's wait");
  CHECK(timed_out.code() == StatusCode::kTimeout);
  CHECK(timed_out.message() == "the test's wait: not done after 600.000000 s");
  CHECK(store.waits == 300);  // 2 s slices, none past the bound

  int slices = 0;
  const Status lost = waitForKeys(waits, store, {"k"}, 600s, 2s, "the test's wait", [&] {
    return ++slices < 3 ? SliceVerdict::goOn() : SliceVerdict::abandon(unavailable("node 1 lost"));
  });
  CHECK(lost.code() == StatusCode::kUnavailable);
  CHECK(lost.message() == "node 1 lost");
  CHECK(slices == 3);

  CHECK(
      waitForKeys(waits, store, {"k"}, 600s, 2s, "w", [] { return SliceVerdict::done(); }).isOk());
  store.set("k", rendezvous::toBytes("1"));
  store.waits = 0;
  CHECK(waitForKeys(waits, store, {"k"}, 600s, 2s, "w").isOk());
  CHECK(store.waits == 0);
}

// The store host reads a round at every joiner of its last call for survivors: one CHECK per
// slot made that O(N^2) requests for N survivors (issue 26's simulation: 835 requests for 256).
TEST_CASE("rendezvous rounds: reading a round of written slots is one CHECK, not one per slot",
          "[unit]") {
  MemoryStore shared;
  constexpr int kSlots = 500;
  for (int i = 1; i <= kSlots; ++i) {
    const AgentInfo a{"h" + std::to_string(i), 1, "agent-" + std::to_string(i), -1};
    shared.set(kNoneRun + roundAgentKey(0, i), rendezvous::toBytes(agentRecord(a, -1).dump()));
    shared.add(kNoneRun + roundJoinedKey(0), 1);
  }
  StoreCoordinatorOptions options;
  NoWaits waits;
  RendezvousRounds rounds(options, waits);
  auto store = std::make_shared<CheckCounter>(shared, std::make_shared<std::atomic<bool>>(), 5s);
  rendezvous::PrefixStore view(jobNamespace(""), store);
  CHECK(rounds.waitingIn(view, 0).value() == kSlots);
  CHECK(store->checks == 1);
  // A slot left empty (its joiner died): each slot is then checked, and the empty one skipped.
  shared.deleteKey(kNoneRun + roundAgentKey(0, 7));
  store->checks = 0;
  CHECK(rounds.waitingIn(view, 0).value() == kSlots - 1);
  CHECK(store->checks == 1 + kSlots);
}
