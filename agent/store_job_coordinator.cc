// The store-backed JobCoordinator (job_coordinator.h): a control thread runs the requests of
// the loop one at a time with its own store connection; a watcher thread waits on the current
// attempt's stop key, bumps this agent's heartbeat and, on the host, watches the others'
// heartbeats. The store comes from a StoreConnector (any rendezvous::Store backend); the key
// scheme and records are job_keys.h's, the host's decision is job_decision.h's, heartbeats and
// lost agents are liveness.h's.
#include <algorithm>
#include <atomic>
#include <climits>
#include <condition_variable>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <tuple>

#include "agent/job_coordinator.h"
#include "agent/job_decision.h"
#include "agent/job_keys.h"
#include "agent/liveness.h"
#include "common/asio.h"
#include "common/logging.h"
#include "common/wait_notice.h"
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

// Thrown inside the control thread when the job is over or the store is gone.
struct Abandoned {
  Status status;
};

class StoreCoordinator : public JobCoordinator {
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
      Result<AttemptStart> result = guarded<AttemptStart>([&] { return doBeginAttempt(n); });
      post([done, result] { done(result); });
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
  RendezvousProgress progress() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return progress_;
  }

  void endAttempt(int n, const AttemptReport& report, DecisionDone done) override {
    enqueue([this, n, report, done = std::move(done)] {
      Result<JobDecision> result = guarded<JobDecision>([&] { return doEndAttempt(n, report); });
      post([done, result] { done(result); });
    });
  }

 private:
  bool isHost() const { return opts_.is_host; }

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

  std::unique_ptr<Store> connect(std::chrono::milliseconds connect_timeout,
                                 std::chrono::milliseconds timeout) {
    return opts_.store.connect(connect_timeout, timeout);
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
                       std::max(keepAliveBound(), opts_.keep_alive_interval * 2));
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

  // Waits for `keys` in keep-alive-sized slices, so a lost store, a lost agent (host) or the
  // end of the job is noticed within one interval. `what` names the wait in errors.
  // Ten years: a wait that only liveness (the store connection, heartbeats) ends.
  static constexpr std::chrono::milliseconds kNoDeadline = std::chrono::hours(24 * 365 * 10);
  // A wait wakes at least this often, so its notices keep their schedule.
  static constexpr std::chrono::milliseconds kNoticeSlice = std::chrono::seconds(5);

  void setWaiting(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    progress_.waiting_for = what;
  }

  // One wait's notices: when WaitNotice says one is due, logs what the wait is for, how long it
  // has lasted and (with a deadline) how long it may still last, and shows it in /status until
  // the wait ends.
  class WaitAnnouncer {
   public:
    explicit WaitAnnouncer(StoreCoordinator& coordinator,
                           SteadyClock::time_point deadline = SteadyClock::time_point::max())
        : coordinator_(coordinator), notice_(SteadyClock::now()), deadline_(deadline) {}
    ~WaitAnnouncer() { coordinator_.setWaiting(""); }
    WaitAnnouncer(const WaitAnnouncer&) = delete;
    WaitAnnouncer& operator=(const WaitAnnouncer&) = delete;

    void maybeAnnounce(const std::function<std::string()>& describe) {
      const auto now = SteadyClock::now();
      if (!notice_.due(now)) return;
      const std::string text = describe();
      coordinator_.setWaiting(text);
      std::string line = text + " for " + formatWait(notice_.elapsed(now));
      if (deadline_ != SteadyClock::time_point::max()) {
        line += ", timeout in " +
                formatWait(std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - now));
      }
      CPPRUN_LOG(kInfo) << line;
    }

   private:
    StoreCoordinator& coordinator_;
    WaitNotice notice_;
    SteadyClock::time_point deadline_;
  };

  void rendezvousStarted(int round) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      progress_.round = round;
      rendezvous_began_ = SteadyClock::now();
    }
    emitEvent(opts_.event_log, "rendezvous_started",
              {{"round", round},
               {"backend", opts_.elastic ? "c10d" : "static"},
               {"min_nodes", opts_.elastic ? opts_.min_nodes : opts_.group_world_size},
               {"max_nodes", opts_.elastic ? opts_.max_nodes : opts_.group_world_size}});
  }

  void rendezvousCompleted(int round, const Membership& m) {
    double seconds = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      seconds = std::chrono::duration<double>(SteadyClock::now() - rendezvous_began_).count();
      ++progress_.rounds_completed;
      progress_.last_duration_s = seconds;
      progress_.nodes = m.group_world_size;
      progress_.world_size = m.world_size;
    }
    json hosts = json::array();
    for (const AgentInfo& a : m.agents) hosts.push_back(a.host);
    emitEvent(opts_.event_log, "rendezvous_completed",
              {{"round", round},
               {"nodes", m.group_world_size},
               {"world_size", m.world_size},
               {"group_rank", m.group_rank},
               {"base_rank", m.base_rank},
               {"hosts", hosts},
               {"duration_s", seconds}});
  }

  // "node 4, 7" or, where the scheduler named the nodes, "n4, n7".
  std::string nodeNames(const std::vector<int>& ranks) const {
    std::string out;
    for (int r : ranks) {
      out += out.empty() ? "" : ", ";
      if (r >= 0 && r < static_cast<int>(opts_.expected_hosts.size())) {
        out += opts_.expected_hosts[static_cast<size_t>(r)];
      } else {
        out += "node " + std::to_string(r);
      }
    }
    return out;
  }

  // Which of `keys` (one per node rank) are missing: "3 of 8 nodes (n4, n7, n8)". Only the
  // store host lists them (one check per node); the others count the joined key.
  std::string describeMissing(Store& client, const std::vector<std::string>& keys,
                              const std::string& what) {
    std::vector<int> missing;
    for (size_t r = 0; r < keys.size(); ++r) {
      if (!client.check({keys[r]})) missing.push_back(static_cast<int>(r));
    }
    return "waiting for " + std::to_string(missing.size()) + " of " + std::to_string(keys.size()) +
           " nodes (" + nodeNames(missing) + ") " + what;
  }

  // `describe` (optional) says what the wait is for; it is logged every few seconds
  // (WaitNotice) with how long the wait has lasted and how long it may still last, and shown
  // in /status. `on_slice` (optional) runs after every slice; it may throw, or return true to
  // end the wait as if the keys had come.
  void waitKeys(Store& client, const std::vector<std::string>& keys,
                std::chrono::milliseconds total, const std::string& what,
                const std::function<bool()>& on_slice = {},
                const std::function<std::string()>& describe = {}) {
    const auto deadline = SteadyClock::now() + total;
    WaitAnnouncer announcer(*this, total < kNoDeadline ? deadline : SteadyClock::time_point::max());
    while (true) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!store_status_.isOk()) throw Abandoned{store_status_};
        if (shutting_down_) throw Abandoned{internalError("the agent is shutting down")};
      }
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now());
      if (left.count() <= 0) {
        throw Abandoned{timeoutError(what + ": not done after " +
                                     std::to_string(total.count() / 1000.0) + " s")};
      }
      try {
        client.wait(keys, std::min({left, opts_.keep_alive_interval, kNoticeSlice}));
        return;
      } catch (const StoreTimeout&) {
        if (on_slice && on_slice()) return;
        if (describe) announcer.maybeAnnounce(describe);
      }
    }
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

  json selfRecord(int previous_rank) const { return agentRecord(opts_.self, previous_rank); }

  // A record read from the store; a malformed one abandons the request.
  static AgentInfo agentOf(const json& doc, const std::string& where) {
    Result<AgentInfo> agent = agentFromRecord(doc, where);
    if (!agent.isOk()) throw Abandoned{agent.status()};
    return agent.value();
  }

  void logMembership(const Membership& m) {
    CPPRUN_LOG(kInfo) << "rendezvous complete: " << m.group_world_size << " nodes, " << m.world_size
                      << " workers; this node is node " << m.group_rank << " with ranks "
                      << m.base_rank << ".." << m.base_rank + opts_.self.nproc - 1;
  }

  // Static: every agent publishes its record under its fixed rank and reads everyone's.
  Membership joinStatic() {
    const int n = opts_.group_world_size;
    control_client_->set(nodeKey(opts_.group_rank), selfRecord(-1).dump());
    beat(*control_client_, opts_.self.id);
    std::vector<std::string> keys;
    for (int r = 0; r < n; ++r) keys.push_back(nodeKey(r));
    const int64_t joined_now = control_client_->add(kStaticJoinedKey, 1);
    rendezvousStarted(0);
    CPPRUN_LOG(kInfo) << "rendezvous: node " << opts_.group_rank << " of " << n
                      << " joined; waiting for the others (join timeout "
                      << opts_.join_timeout.count() / 1000.0 << " s)";
    (void)joined_now;
    try {
      waitKeys(*control_client_, keys, opts_.join_timeout, "rendezvous", {}, [&] {
        if (isHost() || n <= 64) return describeMissing(*control_client_, keys, "to join");
        const int64_t joined = control_client_->add(kStaticJoinedKey, 0);
        return "waiting for " + std::to_string(n - joined) + " of " + std::to_string(n) +
               " nodes to join";
      });
    } catch (const Abandoned& a) {
      if (a.status.code() != StatusCode::kTimeout) throw;
      std::string missing;
      for (int r = 0; r < n; ++r) {
        if (!control_client_->check({nodeKey(r)})) {
          missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        }
      }
      throw Abandoned{timeoutError("rendezvous: nodes " + missing + " did not join within " +
                                   std::to_string(opts_.join_timeout.count() / 1000.0) +
                                   " s (--rdzv-conf join_timeout)")};
    }
    auto values = control_client_->multiGet(keys);
    std::vector<AgentInfo> agents;
    for (int r = 0; r < n; ++r) {
      agents.push_back(
          agentOf(json::parse(toString(values[static_cast<size_t>(r)]), nullptr, false),
                  "node " + std::to_string(r) + "'s record"));
    }
    Membership m = membershipOf(agents, opts_.group_rank);
    logMembership(m);
    rendezvousCompleted(0, m);
    return m;
  }

  // Elastic: the records written in round r's slots 1..joined, in slot order, one per agent.
  // A slot can be empty (its joiner died, or its reply was lost and it joined again with a new
  // slot) or hold a record already seen (that joiner's earlier slot): both are skipped.
  // `all_written`: the caller saw every slot written, so none needs checking.
  struct SlotRecord {
    int64_t index;
    json record;
  };
  std::vector<SlotRecord> roundRecords(int r, int64_t joined, bool all_written = false) {
    std::vector<std::string> present;
    for (int64_t i = 1; i <= joined; ++i) {
      const std::string key = roundKey(r, "agent/" + std::to_string(i));
      if (all_written || control_client_->check({key})) present.push_back(key);
    }
    std::vector<SlotRecord> records;
    if (present.empty()) return records;
    auto values = control_client_->multiGet(present);
    std::set<std::string> ids;
    for (size_t i = 0; i < present.size(); ++i) {
      json doc = json::parse(toString(values[i]), nullptr, false);
      agentOf(doc, present[i]);  // validates
      if (!ids.insert(doc.value("id", "")).second) continue;
      records.push_back({std::stoll(present[i].substr(present[i].rfind('/') + 1)), doc});
    }
    return records;
  }

  // Elastic, host: closes round r once max_nodes joined, or last_call_timeout after min_nodes
  // did (the whole wait bounded by join_timeout), and publishes its members in rank order.
  // Returns the members document.
  json closeRound(int r) {
    const auto joinedNow = [&] { return control_client_->add(roundKey(r, "joined"), 0); };
    try {
      // Usually the min_nodes-th slot's record says enough have joined. A slot left empty
      // would hold that up for the whole join timeout, so every slice also counts the records
      // (only once enough slots are taken: one check per slot).
      waitKeys(
          *control_client_, {roundKey(r, "agent/" + std::to_string(opts_.min_nodes))},
          opts_.join_timeout, "rendezvous round " + std::to_string(r),
          [&] {
            const int64_t joined = joinedNow();
            return joined >= opts_.min_nodes &&
                   static_cast<int>(roundRecords(r, joined).size()) >= opts_.min_nodes;
          },
          [&] {
            const int64_t joined = static_cast<int64_t>(roundRecords(r, joinedNow()).size());
            return "rendezvous round " + std::to_string(r) + ": waiting for " +
                   std::to_string(opts_.min_nodes - joined) + " more node(s) (" +
                   std::to_string(joined) + " of at least " + std::to_string(opts_.min_nodes) +
                   " joined)";
          });
    } catch (const Abandoned& a) {
      const auto joined = roundRecords(r, joinedNow()).size();
      json members = {{"error", "rendezvous: only " + std::to_string(joined) + " of at least " +
                                    std::to_string(opts_.min_nodes) + " nodes joined within " +
                                    formatSeconds(opts_.join_timeout) +
                                    " (--rdzv-conf join_timeout)"}};
      control_client_->set(roundKey(r, "members"), members.dump());
      throw Abandoned{timeoutError(members["error"].get<std::string>())};
    }
    if (opts_.max_nodes > opts_.min_nodes) {
      try {  // last call: more may come, up to max_nodes
        control_client_->wait({roundKey(r, "agent/" + std::to_string(opts_.max_nodes))},
                              opts_.last_call_timeout);
      } catch (const StoreTimeout&) {
      }
    }
    // Later joiners see the next round; this one is closing.
    control_client_->set(kRoundCounterKey, std::to_string(r + 1));
    const int64_t joined = joinedNow();
    // Slots taken a moment ago may not hold their record yet: give them one interval. Usually
    // all are written, and then no slot needs a check of its own.
    bool all_written = true;
    {
      std::vector<std::string> slots;
      for (int64_t i = 1; i <= joined; ++i) {
        slots.push_back(roundKey(r, "agent/" + std::to_string(i)));
      }
      try {
        control_client_->wait(slots, opts_.keep_alive_interval);
      } catch (const StoreTimeout&) {
        all_written = false;
      }
    }
    std::vector<SlotRecord> candidates = roundRecords(r, joined, all_written);
    // The first max_nodes to join, and always this agent (it serves the store).
    if (static_cast<int>(candidates.size()) > opts_.max_nodes) {
      auto mine = std::find_if(candidates.begin(), candidates.end(), [&](const SlotRecord& c) {
        return c.record.value("id", "") == opts_.self.id;
      });
      if (mine != candidates.end() && mine - candidates.begin() >= opts_.max_nodes) {
        std::swap(*mine, candidates[static_cast<size_t>(opts_.max_nodes - 1)]);
      }
      candidates.resize(static_cast<size_t>(opts_.max_nodes));
    }
    // Stable order: the scheduler's rank, else the previous round's rank, else join order.
    auto order_key = [](const SlotRecord& c) {
      const int sched = c.record.value("scheduler_rank", -1);
      const int previous = c.record.value("previous_rank", -1);
      return std::make_tuple(sched >= 0 ? sched : INT_MAX, previous >= 0 ? previous : INT_MAX,
                             c.index);
    };
    std::stable_sort(
        candidates.begin(), candidates.end(),
        [&](const SlotRecord& a, const SlotRecord& b) { return order_key(a) < order_key(b); });
    json members = {{"attempt", next_attempt_}, {"round", r}, {"members", json::array()}};
    for (const SlotRecord& c : candidates) {
      json m = c.record;
      m["index"] = c.index;
      members["members"].push_back(m);
    }
    control_client_->set(roundKey(r, "members"), members.dump());
    return members;
  }

  // Elastic: takes a slot in round r and writes this agent's record there; returns the slot.
  // A request that times out (a store host stopped or swapping for longer than the request
  // timeout; the connection is then closed, its reply lost) is retried with a new slot until
  // the join timeout: the old slot is left empty or holds a copy of this record, and the host
  // skips both (roundRecords).
  int64_t takeSlot(int r, const std::string& record) {
    const auto deadline = SteadyClock::now() + opts_.join_timeout;
    while (true) {
      try {
        const int64_t index = control_client_->add(roundKey(r, "joined"), 1);
        control_client_->set(roundKey(r, "agent/" + std::to_string(index)), record);
        return index;
      } catch (const StoreTimeout& e) {
        if (SteadyClock::now() >= deadline) throw;
        CPPRUN_LOG(kWarn) << "rendezvous round " << r << ": " << e.what() << "; joining again";
      }
    }
  }

  // Elastic: joins rounds until this agent is a member of one; returns its membership and
  // sets `attempt` to the job's attempt number for it.
  Membership joinElastic(int* attempt) {
    if (nextRound() < 0) {
      const int current = static_cast<int>(control_client_->add(kRoundCounterKey, 0));
      std::lock_guard<std::mutex> lock(mu_);
      next_round_ = current;
    }
    while (true) {
      const int r = nextRound();
      const int64_t index = takeSlot(r, selfRecord(previous_rank_).dump());
      beat(*control_client_, opts_.self.id);
      rendezvousStarted(r);
      CPPRUN_LOG(kInfo) << "rendezvous round " << r << ": joined as number " << index
                        << "; waiting for " << opts_.min_nodes << ".." << opts_.max_nodes
                        << " nodes (join timeout " << formatSeconds(opts_.join_timeout)
                        << ", last call " << formatSeconds(opts_.last_call_timeout) << ")";
      json members;
      if (opts_.is_host) {
        members = closeRound(r);
      } else {
        waitKeys(*control_client_, {roundKey(r, "members")},
                 opts_.join_timeout + opts_.last_call_timeout,
                 "rendezvous round " + std::to_string(r), {}, [&] {
                   const int64_t joined = control_client_->add(roundKey(r, "joined"), 0);
                   return "rendezvous round " + std::to_string(r) +
                          ": waiting for the store host to close it (" + std::to_string(joined) +
                          " joined, " + std::to_string(opts_.min_nodes) + ".." +
                          std::to_string(opts_.max_nodes) + " needed)";
                 });
        members =
            json::parse(toString(control_client_->get(roundKey(r, "members"))), nullptr, false);
      }
      if (!members.is_object()) throw Abandoned{internalError("malformed round in the store")};
      if (members.contains("error")) {
        throw Abandoned{unavailable(members["error"].get<std::string>())};
      }
      if (members.contains("job_over")) {
        throw Abandoned{
            Status(StatusCode::kAlreadyExists, "the job ended before this node could join it: " +
                                                   members.value("job_over", std::string()))};
      }
      std::vector<AgentInfo> agents;
      int my_rank = -1;
      for (const json& m : members["members"]) {
        if (m.value("id", "") == opts_.self.id) my_rank = static_cast<int>(agents.size());
        agents.push_back(agentOf(m, "a member record"));
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        next_round_ = r + 1;
      }
      if (my_rank < 0) {
        CPPRUN_LOG(kInfo) << "rendezvous round " << r << " closed with " << agents.size()
                          << " nodes, this one not among them; waiting for the next round";
        continue;
      }
      previous_rank_ = my_rank;
      *attempt = members.value("attempt", 0);
      Membership m = membershipOf(agents, my_rank);
      logMembership(m);
      rendezvousCompleted(r, m);
      return m;
    }
  }

  AttemptStart doBeginAttempt(int n) {
    if (!control_client_) {
      // The first agents may start long before the store's host: keep trying for the join
      // timeout.
      control_client_ = connectWithNotices();
    }
    int attempt = n;
    if (opts_.elastic) {
      Membership m = joinElastic(&attempt);
      std::lock_guard<std::mutex> lock(mu_);
      membership_ = m;
      lost_agents_.clear();
      waiting_claimed_ = false;
    } else if (!membership_) {
      Membership m = joinStatic();
      std::lock_guard<std::mutex> lock(mu_);
      membership_ = m;
    }
    if (!watcher_.joinable()) watcher_ = std::thread([this] { watchLoop(); });
    const int world = worldSize();
    std::string go;
    if (isHost()) {
      if (!opts_.elastic) {
        // Static: every node must have torn its previous attempt down.
        control_client_->set(attemptKey(attempt, "ready/" + std::to_string(myRank())), "1");
        std::vector<std::string> keys;
        for (int r = 0; r < world; ++r) {
          keys.push_back(attemptKey(attempt, "ready/" + std::to_string(r)));
        }
        try {
          waitKeys(
              *control_client_, keys, opts_.join_timeout,
              "attempt " + std::to_string(attempt) + ": waiting for every node to be ready",
              [&] {
                throwIfAgentLost();
                return false;
              },
              [&] {
                return "attempt " + std::to_string(attempt) + ": " +
                       describeMissing(*control_client_, keys,
                                       "to tear their previous attempt down");
              });
        } catch (const Abandoned& a) {
          control_client_->set(attemptKey(attempt, "go"), "!" + a.status.message());
          throw;
        }
      }
      // Elastic: joining the round was the barrier (members join after their teardown).
      go = runOnLoop([this, attempt] { return host_prepare_(attempt); });
      control_client_->set(attemptKey(attempt, "go"), go);
    } else {
      if (!opts_.elastic) {
        control_client_->set(attemptKey(attempt, "ready/" + std::to_string(myRank())), "1");
      }
      waitKeys(*control_client_, {attemptKey(attempt, "go")}, opts_.join_timeout,
               "attempt " + std::to_string(attempt) + ": waiting for the store host's go", {}, [&] {
                 return "attempt " + std::to_string(attempt) +
                        ": waiting for the store host's go (every node ready)";
               });
      go = toString(control_client_->get(attemptKey(attempt, "go")));
      if (!go.empty() && go[0] == '!') throw Abandoned{unavailable(go.substr(1))};
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      watch_attempt_ = attempt;
    }
    cv_.notify_all();
    return AttemptStart{attempt, currentMembership(), go};
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
    client.compareSet(attemptKey(n, "stop"), {}, rendezvous::toBytes(stopToJson(stop).dump()));
  }

  JobDecision doEndAttempt(int n, const AttemptReport& report) {
    control_client_->set(attemptKey(n, "report/" + std::to_string(myRank())),
                         reportToJson(report, opts_.self.host).dump());
    JobDecision decision;
    if (isHost()) {
      decision = decide(n);
      int readers = worldSize();
      {
        std::lock_guard<std::mutex> lock(mu_);
        readers -= static_cast<int>(lost_agents_.size());
      }
      decision_readers_ = readers;
      control_client_->set(attemptKey(n, "decision"), decisionToJson(decision, readers).dump());
      next_attempt_ = n + 1;
    } else {
      // The decision comes when every node's workers have exited, however long the others
      // train after this node's finished: no deadline. Liveness bounds the wait instead: a lost
      // store host ends it (store_status_), a lost node makes the host decide without it.
      waitKeys(*control_client_, {attemptKey(n, "decision")}, kNoDeadline,
               "attempt " + std::to_string(n) + ": waiting for the store host's decision", {}, [&] {
                 return "attempt " + std::to_string(n) +
                        ": this node's workers are done; waiting for the other nodes' workers "
                        "(the job's outcome)";
               });
      Result<DecisionRecord> record = decisionFromJson(
          json::parse(toString(control_client_->get(attemptKey(n, "decision"))), nullptr, false),
          worldSize());
      if (!record.isOk()) throw Abandoned{record.status()};
      decision = record.value().decision;
      decision_readers_ = record.value().readers;
    }
    if (decision.kind != JobDecision::Kind::kRestart) finishJob(n, decision);
    return decision;
  }

  // Host: every node's report (or a lost node's stand-in), then one decision for the job
  // (decideJob).
  JobDecision decide(int n) {
    const Membership membership = currentMembership();
    const int world = membership.group_world_size;
    std::map<int, NodeOutcome> outcomes;
    WaitAnnouncer announcer(*this);
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
        missing.push_back(attemptKey(n, "report/" + std::to_string(r)));
        missing_ranks.push_back(r);
      }
      if (missing.empty()) break;
      try {
        control_client_->wait(missing, opts_.keep_alive_interval);
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
    if (control_client_->check({attemptKey(n, "stop")})) {
      stop = stopFromJson(
          json::parse(toString(control_client_->get(attemptKey(n, "stop"))), nullptr, false));
    }
    DecisionPolicy policy;
    policy.max_restarts = opts_.max_restarts;
    policy.elastic = opts_.elastic;
    policy.min_nodes = opts_.min_nodes;
    JobDecision d =
        decideJob(membership, outcomes, stop, policy, restarts_used_, SystemClock::now());
    restarts_used_ = d.restarts_used;
    return d;
  }

  // After the final decision: wake every watcher (the stop key), tell agents still waiting to
  // join that the job is over, count this agent out and, on the host, keep serving until
  // everyone has read the decision (bounded).
  void finishJob(int n, const JobDecision& decision) {
    claimStop(*control_client_, n, {kByNobody, "the job ended", StopCause::kEnd, 0});
    if (isHost() && opts_.elastic) {
      json over = {{"job_over", decisionKindName(decision.kind)}};
      control_client_->set(roundKey(nextRound(), "members"), over.dump());
    }
    // Lost agents never read it: the host counts only the live ones in ("readers").
    const int64_t out = control_client_->add(attemptKey(n, "done"), 1);
    if (out >= decision_readers_) control_client_->set(attemptKey(n, "all_done"), "1");
    if (isHost()) {
      try {
        control_client_->wait({attemptKey(n, "all_done")}, opts_.final_linger);
      } catch (const StoreTimeout&) {
        CPPRUN_LOG(kWarn) << "not every node read the job's outcome within "
                          << opts_.final_linger.count() / 1000.0 << " s; ending anyway";
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    job_over_ = true;
  }

  // The watcher: this agent's heartbeat, the current attempt's stop key and, on the host,
  // everyone's heartbeats and (elastic) agents waiting to join.
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
    int beats_for = -1;
    HeartbeatWatch beats(opts_.keep_alive_interval, bound);  // host only
    while (true) {
      int n;
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (watch_attempt_ == -2 || job_over_) return;
        n = watch_attempt_;
        if (n == handled_stop) {
          cv_.wait_for(lock, opts_.keep_alive_interval,
                       [&] { return watch_attempt_ != handled_stop || shutting_down_; });
          if (watch_attempt_ == -2 || job_over_) return;
          n = watch_attempt_;
        }
      }
      if (n != beats_for) {  // a new attempt (elastic: maybe new members): start afresh
        beats = HeartbeatWatch(opts_.keep_alive_interval, bound);
        beats_for = n;
      }
      try {
        if (n != handled_stop && n >= 0) {
          try {
            client->wait({attemptKey(n, "stop")}, opts_.keep_alive_interval);
            const StopClaim stop = stopFromJson(
                json::parse(toString(client->get(attemptKey(n, "stop"))), nullptr, false));
            handled_stop = n;
            if (stop.by != myRank() && stop.by != kByNobody) {
              post([this, n, stop] { on_peer_stop_(n, stop.reason, stop.signal); });
            } else if (stop.by == myRank() && stop.cause == StopCause::kLost) {
              // The host lost this agent's heartbeats (it was stopped, starved or cut off
              // for a while) and went on without it: its workers must stop too, or they run
              // on outside the job. It then reads the decision like everyone else (elastic:
              // it joins the next round).
              const std::string reason =
                  "the store host declared this node lost (" + stop.reason + ")";
              post([this, n, reason] { on_peer_stop_(n, reason, 0); });
            }
          } catch (const StoreTimeout&) {
          }
        }
        beat(*client, opts_.self.id);
        if (isHost() && n >= 0) {
          checkHeartbeats(*client, n, beats);
          if (opts_.elastic) checkJoiners(*client, n);
        }
      } catch (const StoreError& e) {
        reportLost(unavailable("lost " + storeWhere() + ": " + e.what()));
        return;
      }
    }
  }

  // Host: declares the members whose heartbeats stopped lost and stops the attempt for them.
  void checkHeartbeats(Store& client, int n, HeartbeatWatch& watch) {
    const Membership m = currentMembership();
    for (const HeartbeatWatch::Silent& silent : watch.check(client, m)) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (lost_agents_.count(silent.rank)) continue;
        lost_agents_[silent.rank] = silent.reason;
      }
      const std::string reason = silent.reason;
      CPPRUN_LOG(kError) << reason;
      claimStop(client, n, {silent.rank, reason, StopCause::kLost, 0});
      post([this, n, reason] { on_peer_stop_(n, reason, 0); });
    }
  }

  // Elastic host: agents that joined the next round while this one runs, and room for them:
  // stop the attempt so the group re-forms with them (no restart budget used).
  void checkJoiners(Store& client, int n) {
    if (waiting_claimed_ || worldSize() >= opts_.max_nodes) return;
    const int64_t waiting = client.add(roundKey(nextRound(), "joined"), 0);
    if (waiting <= 0) return;
    waiting_claimed_ = true;
    const std::string reason =
        std::to_string(waiting) + " node(s) waiting to join; re-forming the group";
    CPPRUN_LOG(kInfo) << reason;
    claimStop(client, n, {myRank(), reason, StopCause::kJoin, 0});
    post([this, n, reason] { on_peer_stop_(n, reason, 0); });
  }

  int nextRound() {
    std::lock_guard<std::mutex> lock(mu_);
    return next_round_;
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
  std::deque<std::function<void()>> tasks_;   // guarded by mu_
  bool shutting_down_ = false;                // guarded by mu_
  bool job_over_ = false;                     // guarded by mu_
  int watch_attempt_ = -1;                    // guarded by mu_; -2: watcher must leave
  Status store_status_;                       // guarded by mu_
  std::map<int, std::string> lost_agents_;    // guarded by mu_ (host); by group rank
  std::optional<Membership> membership_;      // guarded by mu_
  int next_round_ = -1;                       // guarded by mu_ (elastic)
  std::atomic<bool> waiting_claimed_{false};  // host, elastic: joiners announced
  std::unique_ptr<Store> control_client_;     // control thread only
  int decision_readers_ = 0;                  // control thread only
  int previous_rank_ = -1;                    // control thread only (elastic)
  int next_attempt_ = 0;                      // control thread only (host)
  int restarts_used_ = 0;                     // control thread only (host)
  std::thread control_;
  std::thread watcher_;
  RendezvousProgress progress_;               // guarded by mu_
  SteadyClock::time_point rendezvous_began_;  // guarded by mu_
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
