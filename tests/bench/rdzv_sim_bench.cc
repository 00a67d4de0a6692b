// rdzv_sim_bench: the rendezvous at 1k-4k agents, in simulation (issue 26).
//
// N agents as threads of one process, each the REAL coordinator (makeStoreCoordinator: the
// elastic rounds, the go, liveness, the decision) with its own store connections, over a real
// store: cpprun's TCP store server (in this process, on its own thread) or a real 3-member etcd
// cluster (tests/support/etcd_cluster.h; the etcd backend's connector, leases and watches).
// One run of the scenario per N:
//
//   round      every agent begins attempt 0: joins round 0 (elastic, N-1..N nodes), the round
//              closes with N members, the decider says go; timed until the last agent started
//   liveness   the attempt runs for --liveness-s: heartbeats (TCP) or lease keep-alives (etcd)
//              and the watchers' waits; the store load per second
//   loss       one member (not the decider) dies: its connections fail from then on and its
//              liveness stops (heartbeats, or its lease is no longer renewed)
//   re-form    the survivors see the stop, report, get the decision (restart, membership
//              change) and begin attempt 1: a round of N-1 (it waits out the last call for a
//              replacement, --last-call-ms, as a real job does)
//
// With --scenario hang, instead of the loss: a hang of N x --ranks-per-node ranks (issue 35).
// One node (the decider's) declares a stall; every node reports its ranks' states (every rank
// waits in all_reduce #100 but one rank of one other node, after all_reduce #99, with its stack);
// the decider makes the verdict. Timed from the stall to every agent holding the decision, whose
// summary must name the culprit and its node; the reports' and decision's bytes are counted.
//
// Every agent's store requests and payload bytes are counted (counting_store.h), per phase;
// over TCP also the server's own counters (requests, wire bytes); over etcd the gRPC messages
// the members received (their /metrics), which include the lease keep-alives.
// Prints a table and RESULT lines; exits 1 when a round does not close with the members it
// should (the ctest rdzv_sim_bench_smoke runs it at 16 agents).
//
// Thread safety: main thread drives; the coordinators run on their own threads and post their
// callbacks to one shared io_context run by a few threads.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <future>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "agent/coordination/etcd_connector.h"
#include "agent/coordination/job_coordinator.h"
#include "agent/coordination/job_keys.h"
#include "agent/coordination/liveness.h"
#include "agent/supervision/stall_verdict.h"
#include "common/asio.h"
#include "common/command_line.h"
#include "common/logging.h"
#include "common/network_address.h"
#include "common/system.h"
#include "rendezvous/tcp_store_server.h"
#include "tests/bench/counting_store.h"
#include "tests/support/coordinator_futures.h"
#include "tests/support/etcd_cluster.h"
#include "tests/support/http_get.h"

namespace cpprun::bench {
namespace {

using namespace std::chrono_literals;
using agent::AttemptReport;
using agent::AttemptStart;
using agent::JobDecision;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string backend = "tcp";  // tcp | etcd
  std::vector<int> agents = {16};
  int keep_alive_ms = 1000;
  int keep_alive_max_attempt = 3;
  int last_call_ms = 2000;
  int liveness_s = 5;
  int phase_timeout_s = 300;
  std::string json_out;           // one JSON line per N appended here ("" none)
  std::string scenario = "loss";  // loss | hang
  int ranks_per_node = 8;         // hang: the rank states each node reports
  int store_boost = 10;           // the store's threads and processes run at nice -store_boost
};

void usage() {
  std::cout
      << "usage: rdzv_sim_bench [--backend tcp|etcd] [--agents 256,1024,...]\n"
         "         [--keep-alive-ms 1000] [--keep-alive-max-attempt 3] [--last-call-ms 2000]\n"
         "         [--liveness-s 5] [--phase-timeout-s 300] [--json-out FILE]\n"
         "         [--store-boost 10]  (the store at nice -10, the agents at 0)\n"
         "         [--scenario loss|hang] [--ranks-per-node 8]\n"
         "N agents as threads, each the real coordinator with its own store connections, over\n"
         "cpprun's TCP store (in process) or a real 3-member etcd cluster: a round of N, the\n"
         "go, liveness, one member lost, the re-formed round of N-1. Exit 1 on a wrong round.\n";
}

Result<std::vector<int>> parseAgents(const std::string& text) {
  std::vector<int> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    Result<uint64_t> n = parseUnsigned("--agents", item, 100000);
    if (!n.isOk()) return n.status();
    if (n.value() < 3) return Status(StatusCode::kInvalidArgument, "--agents: at least 3 each");
    out.push_back(static_cast<int>(n.value()));
  }
  if (out.empty()) return Status(StatusCode::kInvalidArgument, "--agents: empty list");
  return out;
}

// Sets the integer option `name` from the cursor; false when it is not one of them.
Result<bool> parseIntOption(OptionCursor& cur, Options& o) {
  const std::pair<const char*, int*> ints[] = {
      {"--keep-alive-ms", &o.keep_alive_ms},
      {"--keep-alive-max-attempt", &o.keep_alive_max_attempt},
      {"--last-call-ms", &o.last_call_ms},
      {"--liveness-s", &o.liveness_s},
      {"--phase-timeout-s", &o.phase_timeout_s},
      {"--store-boost", &o.store_boost},
      {"--ranks-per-node", &o.ranks_per_node}};
  for (const auto& [name, target] : ints) {
    if (cur.name() != name) continue;
    Result<std::string> v = cur.value();
    if (!v.isOk()) return v.status();
    Result<uint64_t> n = parseUnsigned(name, v.value(), 10'000'000);
    if (!n.isOk()) return n.status();
    *target = static_cast<int>(n.value());
    return true;
  }
  return false;
}

Result<Options> parseOptions(int argc, char** argv) {
  Options o;
  OptionCursor cur(argc, argv);
  while (cur.next()) {
    Result<bool> is_int = parseIntOption(cur, o);
    if (!is_int.isOk()) return is_int.status();
    if (is_int.value()) continue;
    if (cur.name() == "--help") {
      usage();
      std::exit(0);
    }
    if (cur.name() != "--backend" && cur.name() != "--agents" && cur.name() != "--json-out" &&
        cur.name() != "--scenario") {
      return Status(StatusCode::kInvalidArgument, "unknown option " + cur.name());
    }
    Result<std::string> v = cur.value();
    if (!v.isOk()) return v.status();
    if (cur.name() == "--backend") {
      if (v.value() != "tcp" && v.value() != "etcd") {
        return Status(StatusCode::kInvalidArgument, "--backend: tcp or etcd, not " + v.value());
      }
      o.backend = v.value();
    } else if (cur.name() == "--json-out") {
      o.json_out = v.value();
    } else if (cur.name() == "--scenario") {
      if (v.value() != "loss" && v.value() != "hang") {
        return Status(StatusCode::kInvalidArgument, "--scenario: loss or hang, not " + v.value());
      }
      o.scenario = v.value();
    } else {
      Result<std::vector<int>> agents = parseAgents(v.value());
      if (!agents.isOk()) return agents.status();
      o.agents = agents.value();
    }
  }
  if (o.keep_alive_ms == 0 || o.keep_alive_max_attempt == 0) {
    return Status(StatusCode::kInvalidArgument, "--keep-alive-ms/--keep-alive-max-attempt: > 0");
  }
  return o;
}

// A member's death, shared by its connections and its liveness: once set, every request fails
// as a broken connection does, and the liveness renews nothing any more.
using Death = std::shared_ptr<std::atomic<bool>>;

// One connection of a simulated agent: counted, and dead once its agent died.
class MortalStore : public CountingStore {
 public:
  MortalStore(std::unique_ptr<rendezvous::Store> inner, StoreCounters& counters, Death death)
      : CountingStore(std::move(inner), counters), death_(std::move(death)) {}
  using CountingStore::set;
  using CountingStore::wait;
  void set(const std::string& k, const Bytes& v) override { live(), CountingStore::set(k, v); }
  Bytes compareSet(const std::string& k, const Bytes& e, const Bytes& d) override {
    return live(), CountingStore::compareSet(k, e, d);
  }
  Bytes get(const std::string& k) override { return live(), CountingStore::get(k); }
  int64_t add(const std::string& k, int64_t d) override { return live(), CountingStore::add(k, d); }
  bool check(const std::vector<std::string>& k) override { return live(), CountingStore::check(k); }
  void wait(const std::vector<std::string>& k, std::chrono::milliseconds t) override {
    live(), CountingStore::wait(k, t), live();
  }
  std::vector<Bytes> multiGet(const std::vector<std::string>& k) override {
    return live(), CountingStore::multiGet(k);
  }
  void append(const std::string& k, const Bytes& v) override {
    live(), CountingStore::append(k, v);
  }
  int64_t takeTicket(const std::string& k) override { return live(), CountingStore::takeTicket(k); }
  int64_t tickets(const std::string& k) override { return live(), CountingStore::tickets(k); }

 private:
  void live() const {
    if (death_->load()) throw rendezvous::StoreError("connection reset by peer (simulated death)");
  }
  Death death_;
};

// A backend's own liveness (etcd's leases) that dies with its agent: the inner liveness is
// destroyed (its threads stop renewing the lease, which then expires) and renew() fails.
// Thread safety: a mutex; renew() on the watcher thread, watch() on the control thread.
class MortalLiveness : public agent::MemberLiveness {
 public:
  MortalLiveness(std::unique_ptr<agent::MemberLiveness> inner, Death death)
      : lazy_(inner->readsMembersWhenNeeded()),
        inner_(std::move(inner)),
        death_(std::move(death)) {}
  bool renew(rendezvous::Store& store) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (death_->load()) {
      inner_.reset();
      throw rendezvous::StoreError("connection reset by peer (simulated death)");
    }
    return inner_->renew(store);
  }
  void watch(int attempt, const agent::Membership& m) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (inner_) inner_->watch(attempt, m);
  }
  std::vector<agent::LostMember> poll(rendezvous::Store& store) override {
    std::lock_guard<std::mutex> lock(mu_);
    return inner_ ? inner_->poll(store) : std::vector<agent::LostMember>{};
  }
  // As the inner one (etcd's reads the members when a lease is lost, not at every watch()).
  bool readsMembersWhenNeeded() const override { return lazy_; }
  void die() {
    std::lock_guard<std::mutex> lock(mu_);
    inner_.reset();
  }

 private:
  const bool lazy_;
  std::mutex mu_;
  std::unique_ptr<agent::MemberLiveness> inner_;
  Death death_;
};

// What one agent's callbacks received. Any thread (atomics).
struct AgentEvents {
  std::atomic<bool> peer_stop{false};
  std::atomic<bool> lost{false};
};

// One simulated agent: a real coordinator, its connections counted and mortal.
// Thread safety: the main thread calls begin/end/die; callbacks run on the shared io_context.
class SimAgent {
 public:
  SimAgent(boost::asio::io_context& io, agent::StoreCoordinatorOptions o)
      : io_(io), death_(std::make_shared<std::atomic<bool>>(false)) {
    wrapConnector(o.store);
    coordinator_ = agent::makeStoreCoordinator(
        io_, std::move(o), [](int) { return std::string(); },
        [this](int, const std::string&, int, bool) { events_.peer_stop = true; },
        [this](const Status&) { events_.lost = true; });
  }

  std::future<Result<AttemptStart>> begin(int n) {
    return testing::beginAttemptFuture(io_, *coordinator_, n);
  }

  std::future<Result<JobDecision>> end(int n, AttemptReport report) {
    return testing::endAttemptFuture(io_, *coordinator_, n, std::move(report));
  }

  // This node's ranks stalled: claim attempt n's stop as a stall (on the loop, as the agent).
  void stall(int n, const std::string& reason) {
    boost::asio::post(io_, [this, n, reason] { coordinator_->announceStall(n, reason); });
  }

  // The node dies: every connection fails from now on, its liveness stops.
  void die() {
    death_->store(true);
    std::lock_guard<std::mutex> lock(mu_);
    for (MortalLiveness* l : livenesses_) l->die();
  }

  const StoreCounters& counters() const { return counters_; }
  const AgentEvents& events() const { return events_; }

 private:
  void wrapConnector(agent::StoreConnector& c) {
    auto connect = c.connect;
    c.connect = [this, connect](std::chrono::milliseconds ct, std::chrono::milliseconds rt) {
      return std::unique_ptr<rendezvous::Store>(
          std::make_unique<MortalStore>(connect(ct, rt), counters_, death_));
    };
    if (!c.liveness) return;
    auto liveness = c.liveness;
    c.liveness = [this, liveness](const agent::LivenessOptions& lo) {
      auto mortal = std::make_unique<MortalLiveness>(liveness(lo), death_);
      std::lock_guard<std::mutex> lock(mu_);
      livenesses_.push_back(mortal.get());
      return std::unique_ptr<agent::MemberLiveness>(std::move(mortal));
    };
  }

  boost::asio::io_context& io_;
  Death death_;
  StoreCounters counters_;
  AgentEvents events_;
  std::mutex mu_;
  std::vector<MortalLiveness*> livenesses_;  // guarded by mu_; owned by the coordinator
  std::unique_ptr<agent::JobCoordinator> coordinator_;
};

// Where the agents meet, and the store's own view of its load.
class Backend {
 public:
  virtual ~Backend() = default;
  // The connector of the job `run_id` (each N runs as a job of its own in the one store).
  virtual agent::StoreConnector connector(const std::string& run_id) = 0;
  virtual bool hostPerRound() const = 0;
  // The store's own count of requests received (TCP: requests; etcd: gRPC messages, lease
  // keep-alives included) and bytes (TCP: wire bytes both ways; etcd: 0, not counted).
  virtual CountSnapshot serverCount() = 0;
};

class TcpBackend : public Backend {
 public:
  TcpBackend() {
    rendezvous::TcpStoreServerOptions o;
    o.host = "127.0.0.1";
    auto server = rendezvous::BackgroundTcpStoreServer::start(o);
    if (!server.isOk()) throw std::runtime_error(server.status().message());
    server_ = std::move(server).value();
  }
  agent::StoreConnector connector(const std::string&) override {
    return agent::tcpStoreConnector(server_->host(), server_->port(), "the simulation's store");
  }
  bool hostPerRound() const override { return false; }
  CountSnapshot serverCount() override {
    const rendezvous::TcpStoreServerStats s = server_->stats();
    return {s.requests, s.bytes_received, s.bytes_sent};
  }

 private:
  std::unique_ptr<rendezvous::BackgroundTcpStoreServer> server_;
};

// The sum of one Prometheus counter's samples in a /metrics text.
uint64_t sumCounter(const std::string& text, const std::string& name) {
  uint64_t sum = 0;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(name, 0) != 0) continue;
    const size_t space = line.rfind(' ');
    if (space != std::string::npos) sum += static_cast<uint64_t>(std::stod(line.substr(space + 1)));
  }
  return sum;
}

class EtcdBackend : public Backend {
 public:
  EtcdBackend() : cluster_(testing::EtcdClusterOptions{}) {}
  agent::StoreConnector connector(const std::string& run_id) override {
    agent::EtcdConnectorOptions o;
    o.endpoints = cluster_.endpoints();
    o.run_id = run_id;
    return agent::etcdStoreConnector(o);
  }
  bool hostPerRound() const override { return true; }
  CountSnapshot serverCount() override {
    CountSnapshot c;
    for (int m = 0; m < cluster_.members(); ++m) {
      const int port = parseNetworkAddress(cluster_.endpoint(m)).value().port;
      auto text = testing::httpRequestRaw(port, "GET", "/metrics", 5s);
      if (text) c.ops += sumCounter(*text, "grpc_server_msg_received_total");
    }
    return c;
  }

 private:
  testing::EtcdCluster cluster_;
};

// One N's figures.
struct RunResult {
  int n = 0;
  double round_s = 0;     // all begin -> the last agent started attempt 0
  double detect_s = 0;    // death -> every survivor told to stop
  double decide_s = 0;    // death -> every survivor has the decision
  double reform_s = 0;    // death -> every survivor started attempt 1
  double liveness_s = 0;  // the window measured
  CountSnapshot round_all, round_max, round_median;  // per agent, phase "round"
  CountSnapshot live_all;                            // the whole job, liveness window
  CountSnapshot reform_all, reform_max, reform_median;
  CountSnapshot server_round, server_live, server_reform;
  int round_members = 0, reformed_members = 0;
  // --scenario hang: the decision's summary (it must name the culprit) and the pure verdict's
  // time over every rank's state, measured apart.
  std::string verdict;
  double verdict_compute_s = 0;
  size_t report_bytes_max = 0;  // the largest node report's JSON
};

std::vector<CountSnapshot> snapshots(const std::vector<std::unique_ptr<SimAgent>>& all) {
  std::vector<CountSnapshot> out;
  out.reserve(all.size());
  for (const auto& a : all) out.push_back(snapshotOf(a->counters()));
  return out;
}

// Sum, max (by ops) and median (by ops) of the per-agent differences after - before.
void summarise(const std::vector<CountSnapshot>& after, const std::vector<CountSnapshot>& before,
               CountSnapshot* sum, CountSnapshot* max, CountSnapshot* median) {
  std::vector<CountSnapshot> d;
  for (size_t i = 0; i < after.size(); ++i) d.push_back(after[i] - before[i]);
  *sum = {};
  for (const CountSnapshot& x : d) {
    sum->ops += x.ops, sum->bytes_out += x.bytes_out, sum->bytes_in += x.bytes_in;
  }
  std::sort(d.begin(), d.end(), [](auto& a, auto& b) { return a.ops < b.ops; });
  if (max) *max = d.back();
  if (median) *median = d[d.size() / 2];
}

double secondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Waits for every future (bounded by `deadline`); returns them or the first failure.
template <typename T>
Result<std::vector<T>> collect(std::vector<std::future<Result<T>>>& futures,
                               Clock::time_point deadline, const std::string& what) {
  std::vector<T> out;
  for (auto& f : futures) {
    if (f.wait_until(deadline) != std::future_status::ready) {
      return Status(StatusCode::kTimeout, what + ": not done within the phase timeout");
    }
    Result<T> r = f.get();
    if (!r.isOk()) return Status(r.status().code(), what + ": " + r.status().message());
    out.push_back(r.value());
  }
  return out;
}

agent::StoreCoordinatorOptions agentOptions(const Options& opt, Backend& backend, int n, int i) {
  agent::StoreCoordinatorOptions o;
  o.run_id = "sim-" + std::to_string(n);
  o.store = backend.connector(o.run_id);
  o.host_per_round = backend.hostPerRound();
  o.is_host = !o.host_per_round && i == 0;
  o.elastic = true;
  o.min_nodes = n - 1;
  o.max_nodes = n;
  o.last_call_timeout = std::chrono::milliseconds(opt.last_call_ms);
  o.max_restarts = 0;
  o.exclude_after = 0;
  o.self = agent::AgentInfo{"sim-" + std::to_string(i), 8, "sim-agent-" + std::to_string(i), -1};
  o.join_timeout = std::chrono::seconds(opt.phase_timeout_s);
  o.keep_alive_interval = std::chrono::milliseconds(opt.keep_alive_ms);
  o.keep_alive_max_attempt = opt.keep_alive_max_attempt;
  o.final_linger = 1s;
  return o;
}

// Phase "round": every agent begins attempt 0; checks one round of n members.
Result<std::vector<AttemptStart>> runRound(std::vector<std::unique_ptr<SimAgent>>& all, int attempt,
                                           size_t expect, Clock::time_point deadline,
                                           const std::vector<bool>& skip = {}) {
  std::vector<std::future<Result<AttemptStart>>> futures;
  for (size_t i = 0; i < all.size(); ++i) {
    if (skip.empty() || !skip[i]) futures.push_back(all[i]->begin(attempt));
  }
  auto starts = collect(futures, deadline, "attempt " + std::to_string(attempt));
  if (!starts.isOk()) return starts.status();
  for (const AttemptStart& s : starts.value()) {
    if (static_cast<size_t>(s.membership.group_world_size) != expect) {
      return Status(StatusCode::kInternal, "attempt " + std::to_string(attempt) + " formed with " +
                                               std::to_string(s.membership.group_world_size) +
                                               " members, not " + std::to_string(expect));
    }
  }
  return starts;
}

// The member to lose: the highest rank of attempt 0 that is neither the decider (rank 0) nor
// agent 0, the TCP store's host (is_host: it decides for the job and stands for the node that
// serves the store, whose loss is another scenario). Ranks follow the order of joining, so agent
// 0 may well hold the last rank: losing it left nobody to notice (2 runs in 30).
size_t victimOf(const std::vector<AttemptStart>& starts) {
  size_t victim = starts.size() - 1;
  int highest = -1;
  for (size_t i = 1; i < starts.size(); ++i) {
    const int rank = starts[i].membership.group_rank;
    if (rank != 0 && rank > highest) {
      highest = rank;
      victim = i;
    }
  }
  return victim;
}

// Waits until every agent but `victim` was told to stop; false at the deadline.
bool waitForStops(const std::vector<std::unique_ptr<SimAgent>>& all, size_t victim,
                  Clock::time_point deadline) {
  for (size_t i = 0; i < all.size(); ++i) {
    while (i != victim && !all[i]->events().peer_stop.load()) {
      if (Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(2ms);  // a poll's pace of the main thread, not a wait
    }
  }
  return true;
}

// Phase "loss" and "re-form": the victim dies; the survivors stop, report, take the decision
// (a restart for a membership change) and form attempt 1 of n-1 members.
Status lossAndReform(const Options& opt, std::vector<std::unique_ptr<SimAgent>>& all, size_t victim,
                     RunResult& r) {
  const auto deadline = Clock::now() + std::chrono::seconds(opt.phase_timeout_s);
  const auto died = Clock::now();
  all[victim]->die();
  if (!waitForStops(all, victim, deadline)) {
    std::string missing;
    for (size_t i = 0; i < all.size(); ++i) {
      if (i == victim || all[i]->events().peer_stop.load()) continue;
      missing += " " + std::to_string(i) + (all[i]->events().lost.load() ? "(lost the store)" : "");
    }
    return Status(StatusCode::kTimeout, "the survivors were not told to stop in time (agent " +
                                            std::to_string(victim) + " died; not told:" + missing +
                                            ")");
  }
  r.detect_s = secondsSince(died);
  std::vector<std::future<Result<JobDecision>>> ends;
  AttemptReport stopped;
  stopped.kind = AttemptReport::Kind::kStopped;
  for (size_t i = 0; i < all.size(); ++i) {
    if (i != victim) ends.push_back(all[i]->end(0, stopped));
  }
  auto decisions = collect(ends, deadline, "the decision of attempt 0");
  if (!decisions.isOk()) return decisions.status();
  for (const JobDecision& d : decisions.value()) {
    if (d.kind != JobDecision::Kind::kRestart || !d.membership_change) {
      return Status(StatusCode::kInternal, "attempt 0's decision is not a re-formed group: " +
                                               std::string(agent::decisionKindName(d.kind)) + " (" +
                                               d.summary + ")");
    }
  }
  r.decide_s = secondsSince(died);
  std::vector<bool> skip(all.size(), false);
  skip[victim] = true;
  auto starts = runRound(all, 1, all.size() - 1, deadline, skip);
  if (!starts.isOk()) return starts.status();
  r.reform_s = secondsSince(died);
  r.reformed_members = starts.value().front().membership.group_world_size;
  return Status::ok();
}

// One node's report of a hung attempt: `ranks` rank states from `base`, every rank in
// all_reduce #100 but `culprit` (a global rank; -1: none here), after #99 with its stack.
AttemptReport hangReport(int base, int ranks, int culprit, bool stalled_here) {
  AttemptReport report;
  report.kind = stalled_here ? AttemptReport::Kind::kFailed : AttemptReport::Kind::kStopped;
  for (int r = base; r < base + ranks; ++r) {
    agent::RankState s;
    s.rank = r;
    s.local_rank = r - base;
    s.pid = 100000 + r;
    s.stalled = true;
    s.collective = CollectiveRecord{r != culprit, "all_reduce", "world", r == culprit ? 99u : 100u};
    if (r == culprit) {
      s.frame = "/job/train.py:212 in load_next_batch";
      s.stack = {"Current thread 0x00007f1fe2539040 (most recent call first):",
                 "  File \"/job/data.py\", line 88 in read_shard",
                 "  File \"/job/train.py\", line 212 in load_next_batch",
                 "  File \"/job/train.py\", line 340 in main"};
    } else {
      s.stack = {"Current thread 0x00007f1fe2539040 (most recent call first):",
                 "  File \"/venv/lib/python3.11/site-packages/torch/distributed/"
                 "distributed_c10d.py\", line 4181 in all_reduce"};
    }
    report.rank_states.push_back(std::move(s));
    agent::WorkerFailure f;
    f.rank = r;
    f.local_rank = r - base;
    f.pid = 100000 + r;
    f.signal = 15;
    f.teardown = !stalled_here;
    f.message = stalled_here ? "stalled: no progress for 4.0 s" : "Signal 15 (SIGTERM)";
    f.time = std::chrono::system_clock::now();
    report.failures.push_back(std::move(f));
  }
  return report;
}

// Phase "hang": the decider's node declares a stall; every node reports its ranks' states;
// every agent gets the verdict.
Status hangVerdict(const Options& opt, std::vector<std::unique_ptr<SimAgent>>& all,
                   const std::vector<AttemptStart>& starts, RunResult& r) {
  const auto deadline = Clock::now() + std::chrono::seconds(opt.phase_timeout_s);
  const size_t culprit_agent = victimOf(starts);
  const int culprit_node = starts[culprit_agent].membership.group_rank;
  const int culprit = culprit_node * opt.ranks_per_node + opt.ranks_per_node / 2;
  size_t decider = 0;
  for (size_t i = 0; i < starts.size(); ++i) {
    if (starts[i].membership.group_rank == 0) decider = i;
  }
  // The pure verdict over every rank, timed apart from the store traffic.
  {
    std::vector<agent::RankState> states;
    for (size_t i = 0; i < all.size(); ++i) {
      const int node = starts[i].membership.group_rank;
      for (auto& s :
           hangReport(node * opt.ranks_per_node, opt.ranks_per_node, culprit, false).rank_states) {
        s.node = node;
        states.push_back(std::move(s));
      }
    }
    const auto began = Clock::now();
    auto v = agent::decideStall(states);
    r.verdict_compute_s = secondsSince(began);
    if (!v || v->culprits.size() != 1) {
      return Status(StatusCode::kInternal, "the pure verdict did not name one culprit");
    }
  }
  const auto stalled_at = Clock::now();
  all[decider]->stall(0, "rank(s) 0 stalled (no progress for 4.0 s)");
  if (!waitForStops(all, decider, deadline)) {
    return Status(StatusCode::kTimeout, "the stall's stop did not reach every agent in time");
  }
  r.detect_s = secondsSince(stalled_at);
  std::vector<std::future<Result<JobDecision>>> ends;
  for (size_t i = 0; i < all.size(); ++i) {
    const int node = starts[i].membership.group_rank;
    AttemptReport report =
        hangReport(node * opt.ranks_per_node, opt.ranks_per_node, culprit, i == decider);
    r.report_bytes_max =
        std::max(r.report_bytes_max, agent::reportToJson(report, "n").dump().size());
    ends.push_back(all[i]->end(0, std::move(report)));
  }
  auto decisions = collect(ends, deadline, "the decision of the hung attempt");
  if (!decisions.isOk()) return decisions.status();
  r.decide_s = secondsSince(stalled_at);
  const std::string named =
      "rank " + std::to_string(culprit) + " (node " + std::to_string(culprit_node) + ",";
  for (const JobDecision& d : decisions.value()) {
    if (d.summary.find(named) == std::string::npos) {
      return Status(StatusCode::kInternal, "a decision does not name " + named + ": " + d.summary);
    }
  }
  r.verdict = decisions.value().front().summary;
  return Status::ok();
}

// Ends every agent's coordinator, many at once (each may take a keep-alive interval).
void destroyAll(std::vector<std::unique_ptr<SimAgent>>& all) {
  const size_t threads = std::min<size_t>(all.size(), 256);
  std::vector<std::thread> pool;
  for (size_t t = 0; t < threads; ++t) {
    pool.emplace_back([&all, t, threads] {
      for (size_t i = t; i < all.size(); i += threads) all[i].reset();
    });
  }
  for (std::thread& th : pool) th.join();
  all.clear();
}

// How many agents were told to stop or lost the store (before the loss: none should be).
size_t stoppedEarly(const std::vector<std::unique_ptr<SimAgent>>& all) {
  return static_cast<size_t>(std::count_if(all.begin(), all.end(), [](const auto& a) {
    return a->events().peer_stop.load() || a->events().lost.load();
  }));
}

// The scenario at n agents over `backend`.
Result<RunResult> runOnce(const Options& opt, Backend& backend, int n) {
  RunResult r;
  r.n = n;
  boost::asio::io_context io;
  auto work = boost::asio::make_work_guard(io);
  std::vector<std::thread> loop;
  for (int i = 0; i < 4; ++i) loop.emplace_back([&io] { io.run(); });
  std::vector<std::unique_ptr<SimAgent>> all;
  for (int i = 0; i < n; ++i) {
    all.push_back(std::make_unique<SimAgent>(io, agentOptions(opt, backend, n, i)));
  }
  const auto stop_loop = [&] {
    destroyAll(all);
    io.stop();
    for (std::thread& t : loop) t.join();
  };
  Status status = [&]() -> Status {
    const auto deadline = Clock::now() + std::chrono::seconds(opt.phase_timeout_s);
    auto c0 = snapshots(all);
    auto s0 = backend.serverCount();
    const auto began = Clock::now();
    auto starts = runRound(all, 0, static_cast<size_t>(n), deadline);
    if (!starts.isOk()) return starts.status();
    r.round_s = secondsSince(began);
    r.round_members = starts.value().front().membership.group_world_size;
    auto c1 = snapshots(all);
    auto s1 = backend.serverCount();
    summarise(c1, c0, &r.round_all, &r.round_max, &r.round_median);
    r.server_round = s1 - s0;
    // Liveness: the attempt runs.
    const auto live_began = Clock::now();
    std::this_thread::sleep_for(std::chrono::seconds(opt.liveness_s));
    auto c2 = snapshots(all);
    auto s2 = backend.serverCount();
    r.liveness_s = secondsSince(live_began);
    summarise(c2, c1, &r.live_all, nullptr, nullptr);
    r.server_live = s2 - s1;
    if (const size_t early = stoppedEarly(all); early > 0) {
      return Status(StatusCode::kInternal,
                    std::to_string(early) +
                        " agents were told to stop (or lost the store) before any member was "
                        "lost: the keep-alive bound is too short for this machine's load");
    }
    Status s = opt.scenario == "hang" ? hangVerdict(opt, all, starts.value(), r)
                                      : lossAndReform(opt, all, victimOf(starts.value()), r);
    if (!s.isOk()) return s;
    auto c3 = snapshots(all);
    r.server_reform = backend.serverCount() - s2;
    summarise(c3, c2, &r.reform_all, &r.reform_max, &r.reform_median);
    return Status::ok();
  }();
  stop_loop();
  if (!status.isOk()) return status;
  return r;
}

std::string perAgent(const CountSnapshot& sum, int n) {
  std::ostringstream out;
  out.precision(1);
  out << std::fixed << static_cast<double>(sum.ops) / n << " ops "
      << static_cast<double>(sum.bytes()) / n << " B";
  return out.str();
}

void printResult(const Options& opt, const RunResult& r) {
  const std::string tag = "rdzv_sim_" + opt.backend + "_" + std::to_string(r.n);
  if (opt.scenario == "hang") {
    std::printf(
        "%s N=%d x %d ranks: hang -> every agent told to stop %.3f s, -> every agent holds the "
        "verdict %.3f s (pure verdict over %d states: %.4f s) | reports + decision per agent: "
        "mean %s, max %llu ops %llu B (largest report %zu B) | %s\n",
        opt.backend.c_str(), r.n, opt.ranks_per_node, r.detect_s, r.decide_s,
        r.n * opt.ranks_per_node, r.verdict_compute_s, perAgent(r.reform_all, r.n).c_str(),
        static_cast<unsigned long long>(r.reform_max.ops),
        static_cast<unsigned long long>(r.reform_max.bytes()), r.report_bytes_max,
        r.verdict.c_str());
    std::printf("RESULT %s_hang_verdict_s %.3f s\n", tag.c_str(), r.decide_s);
    std::printf("RESULT %s_hang_bytes_per_agent %.0f B\n", tag.c_str(),
                static_cast<double>(r.reform_all.bytes()) / r.n);
    std::printf("RESULT %s_hang_decider_bytes %llu B\n", tag.c_str(),
                static_cast<unsigned long long>(r.reform_max.bytes()));
    std::fflush(stdout);
    return;
  }
  const double live_ops = static_cast<double>(r.live_all.ops) / r.liveness_s;
  const double server_live = static_cast<double>(r.server_live.ops) / r.liveness_s;
  std::printf(
      "%s N=%d: round %.3f s (%d members) | per agent: mean %s, median %llu ops %llu B, max "
      "%llu ops %llu B | liveness %.0f ops/s (%.2f /agent/s), server %.0f req/s | loss: detect "
      "%.3f s, decide %.3f s, re-formed %.3f s (%d members; last call %.3f s) | re-form per "
      "agent: mean %s, max %llu ops %llu B\n",
      opt.backend.c_str(), r.n, r.round_s, r.round_members, perAgent(r.round_all, r.n).c_str(),
      static_cast<unsigned long long>(r.round_median.ops),
      static_cast<unsigned long long>(r.round_median.bytes()),
      static_cast<unsigned long long>(r.round_max.ops),
      static_cast<unsigned long long>(r.round_max.bytes()), live_ops, live_ops / r.n, server_live,
      r.detect_s, r.decide_s, r.reform_s, r.reformed_members, opt.last_call_ms / 1000.0,
      perAgent(r.reform_all, r.n - 1).c_str(), static_cast<unsigned long long>(r.reform_max.ops),
      static_cast<unsigned long long>(r.reform_max.bytes()));
  std::printf("RESULT %s_round_s %.3f s\n", tag.c_str(), r.round_s);
  std::printf("RESULT %s_reform_s %.3f s\n", tag.c_str(), r.reform_s);
  std::printf("RESULT %s_liveness_ops_per_s %.0f ops/s\n", tag.c_str(), live_ops);
  std::fflush(stdout);
}

// One JSON object per N for the plot and the docs.
std::string jsonOf(const Options& opt, const RunResult& r) {
  auto snap = [](const CountSnapshot& c) {
    return "{\"ops\":" + std::to_string(c.ops) + ",\"bytes_out\":" + std::to_string(c.bytes_out) +
           ",\"bytes_in\":" + std::to_string(c.bytes_in) + "}";
  };
  std::ostringstream o;
  o << "{\"backend\":\"" << opt.backend << "\",\"n\":" << r.n << ",\"round_s\":" << r.round_s
    << ",\"detect_s\":" << r.detect_s << ",\"decide_s\":" << r.decide_s
    << ",\"reform_s\":" << r.reform_s << ",\"liveness_s\":" << r.liveness_s
    << ",\"last_call_s\":" << opt.last_call_ms / 1000.0
    << ",\"keep_alive_s\":" << opt.keep_alive_ms / 1000.0 << ",\"round_all\":" << snap(r.round_all)
    << ",\"round_max\":" << snap(r.round_max) << ",\"round_median\":" << snap(r.round_median)
    << ",\"live_all\":" << snap(r.live_all) << ",\"reform_all\":" << snap(r.reform_all)
    << ",\"reform_max\":" << snap(r.reform_max) << ",\"reform_median\":" << snap(r.reform_median)
    << ",\"server_round\":" << snap(r.server_round) << ",\"server_live\":" << snap(r.server_live)
    << ",\"server_reform\":" << snap(r.server_reform) << "}";
  return o.str();
}

int run(const Options& opt) {
  const uint64_t fds = raiseOpenFileLimit();
  std::printf(
      "rdzv_sim_bench: backend %s, open-file limit %llu, keep-alive %d ms x %d, last "
      "call %d ms, liveness window %d s\n",
      opt.backend.c_str(), static_cast<unsigned long long>(fds), opt.keep_alive_ms,
      opt.keep_alive_max_attempt, opt.last_call_ms, opt.liveness_s);
  // The store stands for another machine: its thread (and etcd's processes), made while this
  // thread runs at nice -(--store-boost), keep that priority; the agents' threads, made after, run
  // at 0. Without it the store's one thread starved behind 4,096 agent threads on 2 shared cores
  // (2,048 agents: a first request unanswered for 15 s). (Nicing the agents instead starved
  // their lease keep-alives behind the machine's other work.)
  const id_t self = static_cast<id_t>(::gettid());
  if (opt.store_boost != 0 && ::setpriority(PRIO_PROCESS, self, -opt.store_boost) != 0) {
    std::fprintf(stderr, "rdzv_sim_bench: cannot set nice -%d for the store (continuing)\n",
                 opt.store_boost);
  }
  std::unique_ptr<Backend> backend;
  try {
    if (opt.backend == "tcp") backend = std::make_unique<TcpBackend>();
    if (opt.backend == "etcd") backend = std::make_unique<EtcdBackend>();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rdzv_sim_bench: cannot start the %s store: %s\n", opt.backend.c_str(),
                 e.what());
    return 1;
  }
  ::setpriority(PRIO_PROCESS, self, 0);
  for (int n : opt.agents) {
    Result<RunResult> r = runOnce(opt, *backend, n);
    if (!r.isOk()) {
      std::fprintf(stderr, "rdzv_sim_bench: %s N=%d failed: %s\n", opt.backend.c_str(), n,
                   r.status().message().c_str());
      return 1;
    }
    printResult(opt, r.value());
    if (!opt.json_out.empty()) {
      FILE* f = std::fopen(opt.json_out.c_str(), "a");
      if (f) std::fprintf(f, "%s\n", jsonOf(opt, r.value()).c_str()), std::fclose(f);
    }
  }
  return 0;
}

}  // namespace
}  // namespace cpprun::bench

int main(int argc, char** argv) {
  // An exception that escapes a thread names itself before the abort.
  std::set_terminate([] {
    try {
      if (auto e = std::current_exception()) std::rethrow_exception(e);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rdzv_sim_bench: uncaught exception: %s\n", e.what());
    } catch (...) {
    }
    std::abort();
  });
  auto opt = cpprun::bench::parseOptions(argc, argv);
  if (!opt.isOk()) {
    std::fprintf(stderr, "rdzv_sim_bench: %s\n", opt.status().message().c_str());
    return 2;
  }
  // N agents' info lines would flood; CPPRUN_LOG_LEVEL (e.g. warn) overrides for a diagnosis.
  if (!std::getenv("CPPRUN_LOG_LEVEL")) cpprun::setLogLevel(cpprun::LogLevel::kError);
  return cpprun::bench::run(opt.value());
}
