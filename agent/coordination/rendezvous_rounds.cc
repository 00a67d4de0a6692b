#include "agent/coordination/rendezvous_rounds.h"

#include <algorithm>
#include <climits>
#include <set>
#include <tuple>

#include "agent/coordination/job_keys.h"
#include "agent/coordination/liveness.h"
#include "agent/coordination/rendezvous_events.h"
#include "common/logging.h"
#include "rendezvous/store.h"

namespace cpprun::agent {

using nlohmann::json;
using rendezvous::Store;
using rendezvous::StoreTimeout;
using rendezvous::toString;

namespace {

// Whether every key exists, in CHECKs of at most kKeysPerCheck keys: a few requests for the
// largest job, none of them megabytes.
constexpr size_t kKeysPerCheck = 8192;
bool checkAll(Store& store, const std::vector<std::string>& keys) {
  for (size_t at = 0; at < keys.size(); at += kKeysPerCheck) {
    const auto end =
        keys.begin() + static_cast<std::ptrdiff_t>(std::min(keys.size(), at + kKeysPerCheck));
    if (!store.check(
            std::vector<std::string>(keys.begin() + static_cast<std::ptrdiff_t>(at), end))) {
      return false;
    }
  }
  return true;
}

// The static join's missing nodes for its timeout error: "nodes 1, 2" (one CHECK per node up to
// kMaxCheckedNodes nodes); above, the count from the tickets and the missing ones among the
// first kMaxCheckedNodes: "49,999 of 50,000 nodes (1, 2, 3, 4, 5, 6, 7, 8 and 49,991 more)".
std::string missingNodes(Store& store, const std::vector<std::string>& keys) {
  const size_t n = keys.size();
  std::vector<int> missing;
  for (size_t r = 0; r < n && r < static_cast<size_t>(kMaxCheckedNodes); ++r) {
    if (!store.check({keys[r]})) missing.push_back(static_cast<int>(r));
  }
  if (n <= static_cast<size_t>(kMaxCheckedNodes)) {
    if (missing.empty()) return "the last nodes";  // they joined just now
    return (missing.size() == 1 ? "node " : "nodes ") + rankList(missing);
  }
  const int64_t joined = std::min<int64_t>(store.tickets(kStaticJoinedKey), n);
  const size_t count = std::max(missing.size(), n - static_cast<size_t>(joined));
  std::string text = withThousands(static_cast<int64_t>(count)) + " of " +
                     withThousands(static_cast<int64_t>(n)) + " nodes";
  if (!missing.empty()) text += " (" + rankList(missing, count) + ")";
  return text;
}

// The records written in round r's slots 1..joined, in slot order, one per agent. A slot can
// be empty (its joiner died, or its reply was lost and it joined again with a new slot) or hold
// a record already seen (that joiner's earlier slot): both are skipped. `all_written`: the
// caller saw every slot written, so none needs checking. Usually every slot is written: one
// CHECK per 8,192 slots says so, and only then is each slot checked on its own. (Before, one
// CHECK per slot every time: the store host's last call for survivors re-reads the round at
// every joiner, so N survivors cost it O(N^2) requests; issue 26's simulation found it.)
Result<std::vector<RoundMember>> roundRecords(Store& store, int r, int64_t joined,
                                              bool all_written = false) {
  std::vector<std::string> slots;
  slots.reserve(static_cast<size_t>(std::max<int64_t>(joined, 0)));
  for (int64_t i = 1; i <= joined; ++i) slots.push_back(roundAgentKey(r, i));
  // Usually every slot holds its record: one CHECK of them all (etcd: one txn per 128 keys)
  // says so; only otherwise is each slot checked on its own.
  if (!all_written && !slots.empty()) all_written = checkAll(store, slots);
  std::vector<std::string> present;
  std::vector<int64_t> present_slots;
  for (int64_t i = 1; i <= joined; ++i) {
    const std::string& key = slots[static_cast<size_t>(i - 1)];
    if (!all_written && !store.check({key})) continue;
    present.push_back(key);
    present_slots.push_back(i);
  }
  std::vector<RoundMember> records;
  if (present.empty()) return records;
  auto values = store.multiGet(present);
  std::set<std::string> ids;
  for (size_t i = 0; i < present.size(); ++i) {
    Result<RoundMember> member =
        roundMemberFromRecord(parseRecord(toString(values[i])), present_slots[i], present[i]);
    if (!member.isOk()) return member.status();
    if (!ids.insert(member.value().agent.id).second) continue;
    records.push_back(std::move(member.value()));
  }
  return records;
}

// The slots taken in round r (one ADD).
int64_t joinedIn(Store& store, int r) { return store.tickets(roundJoinedKey(r)); }

// Agents with a record in the round's first `joined` slots: an agent that joined twice (its
// first request's reply was lost, takeSlot) holds two slots and counts once.
Result<int64_t> distinctAgents(Store& store, int r, int64_t joined) {
  Result<std::vector<RoundMember>> records = roundRecords(store, r, joined);
  if (!records.isOk()) return records.status();
  std::set<std::string> ids;
  for (const RoundMember& c : records.value()) ids.insert(c.agent.id);
  return static_cast<int64_t>(ids.size());
}

// One multiSet of every slot's assignment (1..`slots`), then round r's closed mark: an agent
// that sees the mark finds its slot's assignment there, or knows that the round closed without
// its slot. The assignments are a pure function of the members document (roundAssignments), so
// an agent closing in a lost closer's place writes the same values.
void publishAssignments(Store& store, int r, const json& members, int64_t slots) {
  std::vector<std::string> keys;
  std::vector<rendezvous::Bytes> values;
  int64_t slot = 0;
  for (std::string& value : roundAssignments(members, r, slots)) {
    keys.push_back(roundAssignedKey(r, ++slot));
    values.push_back(rendezvous::toBytes(value));
  }
  if (!keys.empty()) store.multiSet(keys, values);
  store.set(roundClosedKey(r), closedMarker(members, slots));
}

// The members document of round r, read from the store, with every slot's assignment published
// when nobody did yet (the closer was lost in between; host_per_round).
json readClosedRound(Store& store, int r) {
  json members = parseRecord(toString(store.get(roundMembersKey(r))));
  if (!store.check({roundClosedKey(r)})) {
    publishAssignments(store, r, members, joinedIn(store, r));
  }
  return members;
}

// A spare counts itself out of attempt n's final decision (a ticket); the last of the spares
// waiting in round r sets the mark the store host waits for (finishJob).
void countSpareOut(Store& store, int r, int attempt) {
  if (store.takeTicket(attemptSparesDoneKey(attempt)) >= joinedIn(store, r)) {
    store.set(attemptSparesAllDoneKey(attempt), "1");
  }
}

// "rendezvous complete: …" in the log.
void logMembership(const StoreCoordinatorOptions& opts, const Membership& m) {
  CPPRUN_LOG(kInfo) << "rendezvous complete: " << m.group_world_size << " nodes, " << m.world_size
                    << " workers; this node is node " << m.group_rank << " with ranks "
                    << m.base_rank << ".." << m.base_rank + opts.self.nproc - 1;
}

// Publishes round r's members document `doc`; returns the one in the store. host_per_round:
// every waiting agent closes the round; the first to publish its members (compareSet on an
// absent key: the store decides) wins, and the others take those.
json publishMembers(const StoreCoordinatorOptions& opts, Store& store, int r, const json& doc) {
  if (!opts.host_per_round) {
    store.set(roundMembersKey(r), doc.dump());
    return doc;
  }
  const std::string stored =
      toString(store.compareSet(roundMembersKey(r), {}, rendezvous::toBytes(doc.dump())));
  return parseRecord(stored);
}

// Whether another agent closed round r already (etcd, host_per_round).
bool closedByOther(const StoreCoordinatorOptions& opts, Store& store, int r) {
  return opts.host_per_round && store.check({roundMembersKey(r)});
}

// This agent's (`self_id`) membership from how round r closed: its `members` document, or (null
// members) only its `assignment`; nullopt when it is not a member. The round's error
// (kUnavailable) and the end of the job (kAlreadyExists, kJobOverBeforeJoin) are returned.
Result<std::optional<Membership>> membershipFrom(const std::string& self_id, Store& store, int r,
                                                 json members, const json& assignment,
                                                 int* attempt) {
  if (members.is_null()) {
    Result<RoundAssignment> a =
        assignmentFromJson(assignment, "round " + std::to_string(r) + "'s assignment of this node");
    if (!a.isOk()) return a.status();
    switch (a.value().kind) {
      case RoundAssignment::Kind::kNotMember:
        // Slots are keyed by slot, members by id: an agent that joined twice (its first
        // request's reply was lost, takeSlot) may be a member by its first slot while it waits
        // on its last. Only the members document says it is not a member (a spare the round did
        // not take reads it too: a rare path).
        members = parseRecord(toString(store.get(roundMembersKey(r))));
        break;
      case RoundAssignment::Kind::kError:
        return unavailable(a.value().message);
      case RoundAssignment::Kind::kJobOver:
        return Status(StatusCode::kAlreadyExists,
                      std::string(kJobOverBeforeJoin) + ": " + a.value().message);
      case RoundAssignment::Kind::kMember: {
        *attempt = a.value().attempt;
        Membership m = a.value().membership;
        if (m.group_rank != 0) return std::optional<Membership>(std::move(m));
        // Node 0 decides (and polls the heartbeats): it reads every member's record.
        members = parseRecord(toString(store.get(roundMembersKey(r))));
        break;
      }
    }
  }
  if (!members.is_object()) return internalError("malformed round in the store");
  Result<RoundDocument> doc = roundDocumentFromJson(members, r);
  if (!doc.isOk()) return doc.status();
  switch (doc.value().kind) {
    case RoundDocument::Kind::kError:
      return unavailable(doc.value().message);
    case RoundDocument::Kind::kJobOver:
      return Status(StatusCode::kAlreadyExists,
                    std::string(kJobOverBeforeJoin) + ": " + doc.value().message);
    case RoundDocument::Kind::kMembers:
      break;
  }
  const RoundMembers& rm = doc.value().members;
  const std::vector<AgentInfo>& agents = rm.agents;
  int my_rank = -1;
  for (size_t i = 0; i < agents.size(); ++i) {
    if (agents[i].id == self_id) my_rank = static_cast<int>(i);
  }
  if (my_rank < 0) return std::optional<Membership>();
  *attempt = rm.attempt;
  Membership m = membershipOf(agents, my_rank);
  m.round = r;
  return std::optional<Membership>(std::move(m));
}

// Ends waitForRunningRound's spare flag when the wait ends, however it ends.
class SpareFlag {
 public:
  explicit SpareFlag(WaitContext& waits) : waits_(waits) { waits_.setWaitingAsSpare(true); }
  ~SpareFlag() { waits_.setWaitingAsSpare(false); }
  SpareFlag(const SpareFlag&) = delete;
  SpareFlag& operator=(const SpareFlag&) = delete;

 private:
  WaitContext& waits_;
};

}  // namespace

int RendezvousRounds::nextRound() const {
  std::lock_guard<std::mutex> lock(mu_);
  return next_round_;
}

RendezvousProgress RendezvousRounds::progress() const {
  std::lock_guard<std::mutex> lock(mu_);
  return progress_;
}

void RendezvousRounds::started(int round) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    progress_.round = round;
    round_began_ = waits_.clock().now();
  }
  emitRendezvousStarted(opts_.event_log,
                        {round,
                         opts_.host_per_round ? "etcd"
                         : opts_.elastic      ? "c10d"
                                              : "static",
                         opts_.elastic ? opts_.min_nodes : opts_.group_world_size,
                         opts_.elastic ? opts_.max_nodes : opts_.group_world_size});
}

void RendezvousRounds::completed(int round, const Membership& m) {
  double seconds = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    seconds = std::chrono::duration<double>(waits_.clock().now() - round_began_).count();
    ++progress_.rounds_completed;
    progress_.last_duration_s = seconds;
    progress_.nodes = m.group_world_size;
    progress_.world_size = m.world_size;
  }
  std::vector<std::string> hosts;
  hosts.reserve(m.agents.size());
  for (const AgentInfo& a : m.agents) hosts.push_back(a.host);
  emitRendezvousCompleted(opts_.event_log, {round, m.group_world_size, m.world_size, m.group_rank,
                                            m.base_rank, std::move(hosts), seconds});
}

// Every agent writes its record, then takes a ticket. The agent whose ticket completes the
// count checks every record (one CHECK per 8,192) and marks the join complete; everyone waits for
// that one key. So a wait slice costs one WAIT of one key and one ADD, whatever --nnodes is
// (before: a WAIT naming every node's key, and on the host a CHECK per node for every notice and
// again at the timeout: --nnodes=100000 overran a 1 s join timeout by seconds). An agent that
// joined twice (restarted) takes two tickets, so a reached count is only a hint: the CHECK decides.
Result<Membership> RendezvousRounds::joinStatic(Store& store, MemberLiveness& liveness) {
  const int n = opts_.group_world_size;
  liveness.renew(store);
  store.set(nodeKey(opts_.group_rank), agentRecord(opts_.self, -1).dump());
  std::vector<std::string> keys;
  keys.reserve(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) keys.push_back(nodeKey(r));
  const int64_t ticket = store.takeTicket(kStaticJoinedKey);
  const auto completeIfAllJoined = [&] {
    if (!checkAll(store, keys)) return false;
    store.set(kStaticCompleteKey, "1");
    return true;
  };
  if (ticket >= n) completeIfAllJoined();
  started(0);
  CPPRUN_LOG(kInfo) << "rendezvous: node " << opts_.group_rank << " of " << n
                    << " joined; waiting for the others (join timeout "
                    << opts_.join_timeout.count() / 1000.0 << " s)";
  const Status joined = waitForKeys(
      waits_, store, {kStaticCompleteKey}, opts_.join_timeout, opts_.keep_alive_interval,
      "rendezvous",
      [&] {
        const bool all = store.tickets(kStaticJoinedKey) >= n && completeIfAllJoined();
        return all ? SliceVerdict::done() : SliceVerdict::goOn();
      },
      [&] {
        if (n <= kMaxCheckedNodes) {
          return describeMissing(store, keys, opts_.expected_hosts, "to join");
        }
        const int64_t count = std::min<int64_t>(store.tickets(kStaticJoinedKey), n);
        return "waiting for " + withThousands(n - count) + " of " + withThousands(n) +
               " nodes to join";
      });
  if (joined.code() == StatusCode::kTimeout) {
    return timeoutError("rendezvous: " + missingNodes(store, keys) + " did not join within " +
                        std::to_string(opts_.join_timeout.count() / 1000.0) +
                        " s (--rdzv-conf join_timeout)");
  }
  if (!joined.isOk()) return joined;
  auto values = store.multiGet(keys);
  std::vector<AgentInfo> agents;
  for (int r = 0; r < n; ++r) {
    Result<AgentInfo> agent = agentFromRecord(parseRecord(toString(values[static_cast<size_t>(r)])),
                                              "node " + std::to_string(r) + "'s record");
    if (!agent.isOk()) return agent.status();
    agents.push_back(std::move(agent).value());
  }
  Membership m = membershipOf(agents, opts_.group_rank);
  logMembership(opts_, m);
  completed(0, m);
  return m;
}

// A survivor of round r-1 that does not close round r: it read that round's decision (a
// restart) or saw its node 0 lost, so nothing runs; who the survivors are only the closer needs
// (it reads the previous members, and an agent closing in a lost closer's place reads them
// first: closeRound). Before, every survivor read round r-1's members document too: O(N) bytes.
bool RendezvousRounds::survivorNotClosing(int r, int64_t my_slot) const {
  const bool closes = opts_.is_host || (opts_.host_per_round && my_slot == opts_.min_nodes);
  return !closes && r > 0 && last_round_ == r - 1;
}

Status RendezvousRounds::waitForRunningRound(Store& store, int r, int64_t my_slot,
                                             bool survivor_may_skip) {
  previous_ids_.clear();
  expected_survivors_ = -1;
  previous_attempt_ = -1;
  previous_unread_ = false;
  if (r <= 0) return Status::ok();
  if (survivor_may_skip && survivorNotClosing(r, my_slot)) {
    previous_attempt_ = last_attempt_;
    previous_unread_ = true;
    return Status::ok();
  }
  if (!store.check({roundMembersKey(r - 1)})) {
    // The counter moved to round r as round r-1 began closing; its members come within moments
    // (the closer gives slots one interval to be written; on etcd another agent closes in a lost
    // closer's place after the last call and the keep-alive bound). Before, an agent that came
    // in that moment skipped the spare's wait and counted the join timeout instead.
    const Status closed =
        waitForKeys(waits_, store, {roundMembersKey(r - 1)},
                    opts_.last_call_timeout +
                        keepAliveBound(opts_.keep_alive_interval, opts_.keep_alive_max_attempt) +
                        2 * opts_.keep_alive_interval,
                    opts_.keep_alive_interval, "rendezvous round " + std::to_string(r - 1));
    if (closed.code() == StatusCode::kTimeout) return Status::ok();
    if (!closed.isOk()) return closed;
  }
  const Result<RoundMembers> previous =
      roundMembersFromJson(parseRecord(toString(store.get(roundMembersKey(r - 1)))), r - 1);
  if (!previous.isOk()) return Status::ok();  // an error or the end of the job: nothing runs
  std::vector<std::string> alive_keys;
  for (const AgentInfo& m : previous.value().agents) {
    previous_ids_.insert(m.id);
    alive_keys.push_back(aliveKey(m.id));
  }
  const int attempt = previous.value().attempt;
  previous_attempt_ = attempt;
  const std::string decision = attemptDecisionKey(attempt);
  // Whether a member of round r-1 has joined round r (its attempt is over even without a
  // decision: its node 0 was lost before the go) or (etcd) none of them is alive any more.
  const auto roundOver = [&]() -> Result<bool> {
    Result<std::vector<RoundMember>> records = roundRecords(store, r, joinedIn(store, r));
    if (!records.isOk()) return records.status();
    for (const RoundMember& c : records.value()) {
      if (previous_ids_.count(c.agent.id)) return true;
    }
    if (!opts_.host_per_round) return false;  // heartbeats: the store host decides
    for (const std::string& key : alive_keys) {
      if (store.check({key})) return false;
    }
    return true;
  };
  Result<bool> over = store.check({decision}) ? Result<bool>(true) : roundOver();
  if (!over.isOk()) return over.status();
  if (!over.value()) {
    CPPRUN_LOG(kInfo) << "rendezvous round " << r << ": the job runs attempt " << attempt
                      << " with " << previous_ids_.size()
                      << " nodes; this node waits as a spare until its membership changes";
    // Drained while waiting: the slot is emptied (the round skips empty slots), so the round
    // never counts this agent in.
    const auto leaveIfAsked = [&]() -> Status {
      if (!waits_.leaveRequested()) return Status::ok();
      store.deleteKey(roundAgentKey(r, my_slot));
      // Counted out as a spare that read the outcome, so a store host ending the job does not
      // linger for it (finishJob).
      countSpareOut(store, r, attempt);
      CPPRUN_LOG(kInfo) << "rendezvous round " << r
                        << ": leaving the job as asked; this spare gave up its place";
      return Status(StatusCode::kAlreadyExists, kLeftWhileSpare);
    };
    Status waited;
    {
      SpareFlag spare(waits_);
      waited = waitForKeys(
          waits_, store, {decision}, kNoDeadline, opts_.keep_alive_interval,
          "rendezvous round " + std::to_string(r),
          [&] {
            if (Status left = leaveIfAsked(); !left.isOk()) return SliceVerdict::abandon(left);
            Result<bool> ended = roundOver();
            if (!ended.isOk()) return SliceVerdict::abandon(ended.status());
            return ended.value() ? SliceVerdict::done() : SliceVerdict::goOn();
          },
          [&] {
            return "rendezvous round " + std::to_string(r) +
                   ": waiting as a spare while the job runs attempt " + std::to_string(attempt) +
                   " with " + std::to_string(previous_ids_.size()) + " nodes";
          });
    }
    if (!waited.isOk()) return waited;
    if (Status left = leaveIfAsked(); !left.isOk()) return left;  // asked as it stopped waiting
  }
  return readRunningDecision(store, r, attempt);
}

Status RendezvousRounds::readRunningDecision(Store& store, int r, int attempt) {
  const std::string decision = attemptDecisionKey(attempt);
  if (!store.check({decision})) return Status::ok();
  Result<DecisionRecord> record = decisionFromRecord(toString(store.get(decision)), decision, -1);
  if (!record.isOk()) return Status::ok();
  if (record.value().decision.kind != JobDecision::Kind::kRestart) {
    // The job is over. Count this spare out, so the store host (c10d) keeps serving until every
    // spare has read that (bounded by its final linger, as for the members).
    countSpareOut(store, r, attempt);
    return Status(StatusCode::kAlreadyExists, std::string(kJobOverBeforeJoin) + ": " +
                                                  decisionKindName(record.value().decision.kind));
  }
  if (record.value().readers < 0) return Status::ok();
  expected_survivors_ = record.value().readers;
  // An excluded node (node_exclusion.h) read the decision but does not come back.
  if (record.value().decision.excluded && expected_survivors_ > 0) --expected_survivors_;
  // Nor does the node that asked to leave.
  if (store.check({attemptStopKey(attempt)})) {
    const Result<StopClaim> stop =
        stopFromRecord(toString(store.get(attemptStopKey(attempt))), attemptStopKey(attempt));
    if (stop.isOk() && stop.value().cause == StopCause::kLeave && expected_survivors_ > 0) {
      --expected_survivors_;
    }
  }
  return Status::ok();
}

Status RendezvousRounds::lastCallForSurvivors(Store& store, int r) {
  const auto began = waits_.clock().now();
  const auto deadline = began + opts_.last_call_timeout;
  // Survivors join within moments of the decision (their teardown is over); one that does not
  // (a failed health check, a slow node) is not waited for longer than the keep-alive bound
  // when the round is full without it: a spare then takes its place.
  const auto survivors_deadline = std::min(
      deadline, began + keepAliveBound(opts_.keep_alive_interval, opts_.keep_alive_max_attempt) +
                    opts_.keep_alive_interval);
  const int wanted_survivors = std::min(expected_survivors_, opts_.max_nodes);
  while (true) {
    const int64_t joined = joinedIn(store, r);
    Result<std::vector<RoundMember>> records = roundRecords(store, r, joined);
    if (!records.isOk()) return records.status();
    int survivors = 0;
    int total = 0;
    for (const RoundMember& c : records.value()) {
      ++total;
      if (previous_ids_.count(c.agent.id)) ++survivors;
    }
    if (total >= opts_.max_nodes &&
        (survivors >= wanted_survivors || waits_.clock().now() >= survivors_deadline)) {
      return Status::ok();
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - waits_.clock().now());
    if (left <= std::chrono::milliseconds(0)) return Status::ok();
    if (Status s = waits_.abandonment(); !s.isOk()) return s;
    try {  // the next slot's record, or a slice
      store.wait({roundAgentKey(r, joined + 1)}, std::min(left, opts_.keep_alive_interval));
    } catch (const StoreTimeout&) {
    }
  }
}

// The previous round's survivors first (a spare takes a lost node's place, never a live one's),
// then the first to join, and always this agent (it closes the round); then a stable order.
std::vector<RoundMember> selectRoundMembers(std::vector<RoundMember> candidates,
                                            const std::set<std::string>& survivors, int max_nodes,
                                            const std::string& self_id) {
  std::stable_partition(candidates.begin(), candidates.end(),
                        [&](const RoundMember& c) { return survivors.count(c.agent.id) > 0; });
  if (static_cast<int>(candidates.size()) > max_nodes) {
    auto mine = std::find_if(candidates.begin(), candidates.end(),
                             [&](const RoundMember& c) { return c.agent.id == self_id; });
    if (mine != candidates.end() && mine - candidates.begin() >= max_nodes) {
      std::swap(*mine, candidates[static_cast<size_t>(max_nodes - 1)]);
    }
    candidates.resize(static_cast<size_t>(max_nodes));
  }
  // Stable order: the scheduler's rank, else the previous round's rank, else join order.
  auto order_key = [](const RoundMember& c) {
    const int sched = c.agent.scheduler_rank;
    const int previous = c.previous_rank;
    return std::make_tuple(sched >= 0 ? sched : INT_MAX, previous >= 0 ? previous : INT_MAX,
                           c.slot);
  };
  std::stable_sort(
      candidates.begin(), candidates.end(),
      [&](const RoundMember& a, const RoundMember& b) { return order_key(a) < order_key(b); });
  return candidates;
}

// Usually the min_nodes-th slot's record says enough have joined. A slot left empty would hold
// that up for the whole join timeout, so every slice also counts the records (only once enough
// slots are taken: one check per slot). Each agent that holds two slots makes the round wait for
// one slot more. Within the join timeout, else the round fails: its error is published (unless
// another closer published first) and returned (kTimeout).
Result<RendezvousRounds::MaybeClosed> RendezvousRounds::awaitMinNodes(Store& store, int r) {
  const auto deadline = waits_.clock().now() + opts_.join_timeout;
  int64_t awaited_slot = opts_.min_nodes;
  Status failed;
  for (;;) {
    failed = waitForKeys(
        waits_, store, {roundAgentKey(r, awaited_slot)},
        std::max(
            std::chrono::milliseconds(0),
            std::chrono::duration_cast<std::chrono::milliseconds>(deadline - waits_.clock().now())),
        opts_.keep_alive_interval, "rendezvous round " + std::to_string(r),
        [&] {
          if (closedByOther(opts_, store, r)) return SliceVerdict::done();
          const int64_t joined = joinedIn(store, r);
          if (joined < opts_.min_nodes) return SliceVerdict::goOn();
          Result<int64_t> distinct = distinctAgents(store, r, joined);
          if (!distinct.isOk()) return SliceVerdict::abandon(distinct.status());
          return distinct.value() >= opts_.min_nodes ? SliceVerdict::done() : SliceVerdict::goOn();
        },
        [&] {
          // The slots taken (one ADD), not the records written (one CHECK per slot).
          const int64_t joined = std::min<int64_t>(joinedIn(store, r), opts_.min_nodes);
          return "rendezvous round " + std::to_string(r) + ": waiting for " +
                 withThousands(opts_.min_nodes - joined) + " more node(s) (" +
                 withThousands(joined) + " of at least " + withThousands(opts_.min_nodes) +
                 " joined)";
        });
    if (!failed.isOk()) break;
    if (closedByOther(opts_, store, r)) return MaybeClosed();
    Result<int64_t> distinct = distinctAgents(store, r, joinedIn(store, r));
    if (!distinct.isOk()) {
      failed = distinct.status();
      break;
    }
    if (distinct.value() >= opts_.min_nodes) return MaybeClosed();
    awaited_slot += opts_.min_nodes - distinct.value();
  }
  // Whatever ended the wait (`failed`), the round fails with the join timeout's error.
  Result<int64_t> joined = distinctAgents(store, r, joinedIn(store, r));
  if (!joined.isOk()) return joined.status();
  const json members = publishMembers(
      opts_, store, r,
      roundErrorToJson("rendezvous: only " + std::to_string(joined.value()) + " of at least " +
                       std::to_string(opts_.min_nodes) + " nodes joined within " +
                       formatSeconds(opts_.join_timeout) + " (--rdzv-conf join_timeout)"));
  publishAssignments(store, r, members, joinedIn(store, r));
  // The round's error is this agent's; another closer's members (etcd) are taken as they are.
  const Result<RoundDocument> doc = roundDocumentFromJson(members, r);
  if (doc.isOk() && doc.value().kind == RoundDocument::Kind::kError) {
    return timeoutError(doc.value().message);
  }
  return MaybeClosed(RoundResult{members, json()});
}

// host_per_round, an agent not in slot min_nodes: waits for that agent's members (it takes the
// last call), and closes the round in its place only if they do not come (it was lost). Reading
// every record is then one agent's work, not every agent's: N agents make O(N) requests, not
// O(N^2). nullopt: this agent closes the round.
Result<RendezvousRounds::MaybeClosed> RendezvousRounds::awaitCloser(Store& store, int r,
                                                                    int64_t my_slot) {
  const auto grace = keepAliveBound(opts_.keep_alive_interval, opts_.keep_alive_max_attempt) +
                     opts_.keep_alive_interval;
  Result<json> assignment = awaitAssignment(
      store, r, my_slot,
      (opts_.max_nodes > opts_.min_nodes ? opts_.last_call_timeout : std::chrono::milliseconds(0)) +
          grace);
  if (assignment.isOk()) return MaybeClosed(RoundResult{json(), std::move(assignment).value()});
  if (assignment.status().code() != StatusCode::kTimeout) return assignment.status();
  CPPRUN_LOG(kWarn) << "rendezvous round " << r << ": the agent that joined as number "
                    << opts_.min_nodes << " did not close it; closing it in its place";
  if (closedByOther(opts_, store, r))
    return MaybeClosed(RoundResult{readClosedRound(store, r), json()});
  // A survivor skipped round r-1's members; closing, it needs them.
  if (previous_unread_) {
    if (Status s = waitForRunningRound(store, r, my_slot, false); !s.isOk()) return s;
  }
  return MaybeClosed();
}

// The last call once min_nodes are in: re-forming, until the previous round's survivors are
// in too (spares may hold the first slots); else until max_nodes joined. Bounded by
// last_call_timeout.
Status RendezvousRounds::lastCall(Store& store, int r) {
  if (!previous_ids_.empty() && expected_survivors_ >= 0) {
    return lastCallForSurvivors(store, r);
  }
  if (opts_.max_nodes > opts_.min_nodes) {
    try {  // more may come, up to max_nodes
      store.wait({roundAgentKey(r, opts_.max_nodes)}, opts_.last_call_timeout);
    } catch (const StoreTimeout&) {
    }
  }
  return Status::ok();
}

// Closes round r with the records in its slots: moves the round counter on (later joiners see
// the next round), publishes the members and every slot's assignment.
Result<json> RendezvousRounds::closeWithMembers(Store& store, int r, int next_attempt) {
  store.set(kRoundCounterKey, std::to_string(r + 1));
  const int64_t joined = joinedIn(store, r);
  // Slots taken a moment ago may not hold their record yet: give them one interval. Usually all
  // are written, and then no slot needs a check of its own.
  bool all_written = true;
  {
    std::vector<std::string> slots;
    for (int64_t i = 1; i <= joined; ++i) slots.push_back(roundAgentKey(r, i));
    try {
      store.wait(slots, opts_.keep_alive_interval);
    } catch (const StoreTimeout&) {
      all_written = false;
    }
  }
  Result<std::vector<RoundMember>> records = roundRecords(store, r, joined, all_written);
  if (!records.isOk()) return records.status();
  // An agent that never ran an attempt (a spare closing the round, etcd) knows the job's
  // attempt number from the previous round only: the next one comes after that round's.
  const json members = publishMembers(
      opts_, store, r,
      roundMembersToJson(std::max(next_attempt, previous_attempt_ + 1), r,
                         selectRoundMembers(std::move(records).value(), previous_ids_,
                                            opts_.max_nodes, opts_.self.id)));
  publishAssignments(store, r, members, joined);
  return members;
}

// Host: closes round r once max_nodes joined, or last_call_timeout after min_nodes did (the
// whole wait bounded by join_timeout), and publishes its members in rank order. Returns the
// members document.
Result<RendezvousRounds::RoundResult> RendezvousRounds::closeRound(Store& store, int r,
                                                                   int64_t my_slot,
                                                                   int next_attempt) {
  if (closedByOther(opts_, store, r)) return RoundResult{readClosedRound(store, r), json()};
  Result<MaybeClosed> failed = awaitMinNodes(store, r);
  if (!failed.isOk()) return failed.status();
  if (failed.value()) return *failed.value();
  // host_per_round: the agent in slot min_nodes closes the round; the others wait for its
  // members (awaitCloser), which reads them at once when they are there (no check of its own
  // first).
  const bool closer = !opts_.host_per_round || my_slot == opts_.min_nodes;
  if (closer && closedByOther(opts_, store, r))
    return RoundResult{readClosedRound(store, r), json()};
  if (!closer) {
    Result<MaybeClosed> closed = awaitCloser(store, r, my_slot);
    if (!closed.isOk()) return closed.status();
    if (closed.value()) return *closed.value();
  }
  if (Status s = lastCall(store, r); !s.isOk()) return s;
  Result<json> members = closeWithMembers(store, r, next_attempt);
  if (!members.isOk()) return members.status();
  return RoundResult{std::move(members).value(), json()};
}

Result<json> RendezvousRounds::awaitAssignment(Store& store, int r, int64_t slot,
                                               std::chrono::milliseconds total) {
  const std::string mine = roundAssignedKey(r, slot);
  const std::string closed = roundClosedKey(r);
  bool closed_seen = false;
  // Each slice also looks for the closed mark: a slot taken after the closer counted the slots
  // gets no assignment (it waits for the next round, as before a member list without it did).
  const Status came = waitForKeys(
      waits_, store, {mine}, total, opts_.keep_alive_interval,
      "rendezvous round " + std::to_string(r),
      [&] {
        closed_seen = store.check({closed});
        return closed_seen ? SliceVerdict::done() : SliceVerdict::goOn();
      },
      [&] {
        const int64_t joined = joinedIn(store, r);
        return "rendezvous round " + std::to_string(r) + ": waiting for " +
               (opts_.host_per_round ? "its closer" : "the store host") + " to close it (" +
               std::to_string(joined) + " joined, " + std::to_string(opts_.min_nodes) + ".." +
               std::to_string(opts_.max_nodes) + " needed)";
      });
  if (!came.isOk()) return came;
  if (!closed_seen || store.check({mine})) {
    return parseRecord(toString(store.get(mine)));
  }
  // Closed without this slot: its error or end of the job, else "not a member".
  const json marker = parseRecord(toString(store.get(closed)));
  return parseRecord(roundAssignments(marker, r, 1).front());
}

// Takes a slot in round r and writes this agent's record there; returns the slot. A request
// that times out (a store host stopped or swapping for longer than the request timeout; the
// connection is then closed, its reply lost) is retried with a new slot until the join timeout:
// the old slot is left empty or holds a copy of this record, and the host skips both
// (roundRecords).
int64_t RendezvousRounds::takeSlot(Store& store, int r, const std::string& record) {
  const auto deadline = waits_.clock().now() + opts_.join_timeout;
  while (true) {
    try {
      const int64_t index = store.takeTicket(roundJoinedKey(r));
      store.set(roundAgentKey(r, index), record);
      return index;
    } catch (const StoreTimeout& e) {
      if (waits_.clock().now() >= deadline) throw;
      CPPRUN_LOG(kWarn) << "rendezvous round " << r << ": " << e.what() << "; joining again";
    }
  }
}

Result<Membership> RendezvousRounds::joinElastic(Store& store, MemberLiveness& liveness,
                                                 int next_attempt, int* attempt) {
  if (nextRound() < 0) {
    const int current = static_cast<int>(store.add(kRoundCounterKey, 0));
    std::lock_guard<std::mutex> lock(mu_);
    next_round_ = current;
  }
  while (true) {
    const int r = nextRound();
    liveness.renew(store);
    const int64_t index = takeSlot(store, r, agentRecord(opts_.self, previous_rank_).dump());
    started(r);
    CPPRUN_LOG(kInfo) << "rendezvous round " << r << ": joined as number " << index
                      << "; waiting for " << opts_.min_nodes << ".." << opts_.max_nodes
                      << " nodes (join timeout " << formatSeconds(opts_.join_timeout)
                      << ", last call " << formatSeconds(opts_.last_call_timeout) << ")";
    if (Status s = waitForRunningRound(store, r, index); !s.isOk()) return s;
    Result<RoundResult> result = RoundResult{};
    if (opts_.is_host || opts_.host_per_round) {
      result = closeRound(store, r, index, next_attempt);
    } else {
      Result<json> assignment =
          awaitAssignment(store, r, index, opts_.join_timeout + opts_.last_call_timeout);
      if (!assignment.isOk()) return assignment.status();
      result = RoundResult{json(), std::move(assignment).value()};
    }
    if (!result.isOk()) return result.status();
    int round_attempt = 0;
    Result<std::optional<Membership>> joined = membershipFrom(
        opts_.self.id, store, r, result.value().members, result.value().assignment, &round_attempt);
    if (!joined.isOk()) return joined.status();
    const std::optional<Membership>& m = joined.value();
    {
      std::lock_guard<std::mutex> lock(mu_);
      next_round_ = r + 1;
    }
    if (!m) {
      CPPRUN_LOG(kInfo) << "rendezvous round " << r
                        << " closed without this node; waiting for the next round";
      continue;
    }
    previous_rank_ = m->group_rank;
    last_round_ = r;
    last_attempt_ = round_attempt;
    *attempt = round_attempt;
    logMembership(opts_, *m);
    completed(r, *m);
    return *m;
  }
}

Result<int> RendezvousRounds::waitingIn(Store& store, int r) {
  if (r < 0) return 0;
  Result<std::vector<RoundMember>> records = roundRecords(store, r, joinedIn(store, r));
  if (!records.isOk()) return records.status();
  return static_cast<int>(records.value().size());
}

void RendezvousRounds::endRounds(Store& store, const std::string& outcome) {
  const json over = roundJobOverToJson(outcome);
  const int r = nextRound();
  store.set(roundMembersKey(r), over.dump());
  // Agents waiting for their assignment in round r (spares) read the end from it.
  publishAssignments(store, r, over, joinedIn(store, r));
}

}  // namespace cpprun::agent
