// RendezvousRounds (rendezvous_rounds.h) over a MemoryStore: an elastic round closing at
// max_nodes, past max_nodes, after the last call with min_nodes, and failing below min_nodes;
// on etcd (host_per_round) closed by the agent in slot min_nodes, or in its place when it is lost;
// the per-slot assignments it publishes; and the pure member selection (selectRoundMembers).
// Agents are RendezvousRounds objects on one store; the test waits for their keys in the store,
// and every wait has a bound.
#include "agent/coordination/rendezvous_rounds.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <future>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "agent/coordination/job_keys.h"
#include "rendezvous/memory_store.h"

namespace {

using namespace cpprun;
using namespace cpprun::agent;
using namespace std::chrono_literals;
using nlohmann::json;

constexpr std::chrono::seconds kBound = 20s;  // no step of a test may take longer

class NoWaits : public WaitContext {
 public:
  Status abandonment() override { return Status::ok(); }
  void setWaiting(const std::string&) override {}
};

class AlwaysAlive : public MemberLiveness {
 public:
  bool renew(rendezvous::Store&) override { return true; }
  void watch(int, const Membership&) override {}
  std::vector<LostMember> poll(rendezvous::Store&) override { return {}; }
};

StoreCoordinatorOptions elastic(const AgentInfo& self, int min_nodes, int max_nodes, bool is_host) {
  StoreCoordinatorOptions o;
  o.elastic = true;
  o.is_host = is_host;
  o.min_nodes = min_nodes;
  o.max_nodes = max_nodes;
  o.self = self;
  o.join_timeout = kBound;
  o.last_call_timeout = kBound;
  o.keep_alive_interval = 50ms;
  return o;
}

// An agent's record in the next slot of round `r`, written as an agent that joined and then
// waits for its assignment (or was lost) leaves it. Returns the slot.
int64_t joinAs(rendezvous::Store& store, int r, const AgentInfo& agent) {
  const int64_t slot = store.takeTicket(roundJoinedKey(r));
  store.set(roundAgentKey(r, slot), agentRecord(agent, -1).dump());
  return slot;
}

RoundAssignment assignmentIn(rendezvous::Store& store, int r, int64_t slot) {
  Result<RoundAssignment> a = assignmentFromJson(
      json::parse(rendezvous::toString(store.get(roundAssignedKey(r, slot)))), "the test's slot");
  REQUIRE(a.isOk());
  return a.value();
}

// A join's membership; the test fails when the join returned an error.
Membership joined(Result<Membership> m) {
  if (!m.isOk()) FAIL("the join returned " << m.status().toString());
  return std::move(m).value();
}

std::vector<std::string> memberIds(rendezvous::Store& store, int r) {
  Result<RoundMembers> m =
      roundMembersFromJson(json::parse(rendezvous::toString(store.get(roundMembersKey(r)))), r);
  REQUIRE(m.isOk());
  std::vector<std::string> ids;
  for (const AgentInfo& a : m.value().agents) ids.push_back(a.id);
  return ids;
}

}  // namespace

TEST_CASE("rendezvous rounds: a round closes at max_nodes in the scheduler's order, nproc mixed",
          "[unit]") {
  rendezvous::MemoryStore store;
  NoWaits waits;
  AlwaysAlive liveness;
  // Slot 1: an agent that waits for its assignment (scheduler rank 2, 2 workers).
  const StoreCoordinatorOptions peer_opts = elastic({"h1", 2, "id-1", 2}, 2, 3, false);
  RendezvousRounds peer(peer_opts, waits);
  auto peer_joined = std::async(std::launch::async, [&] {
    int attempt = -1;
    Result<Membership> m = peer.joinElastic(store, liveness, 0, &attempt);
    return std::make_pair(m, attempt);
  });
  store.wait({roundAgentKey(0, 1)}, kBound);  // it holds slot 1
  // Slot 2: scheduler rank 0, 4 workers.
  REQUIRE(joinAs(store, 0, {"h2", 4, "id-2", 0}) == 2);
  // Slot 3: the store host (scheduler rank 1, 1 worker) fills the round and closes it.
  const StoreCoordinatorOptions host_opts = elastic({"h0", 1, "id-0", 1}, 2, 3, true);
  RendezvousRounds host(host_opts, waits);
  int host_attempt = -1;
  const Membership hm = joined(host.joinElastic(store, liveness, 4, &host_attempt));
  CHECK(host_attempt == 4);
  CHECK(hm.round == 0);
  CHECK(hm.group_rank == 1);
  CHECK(hm.group_world_size == 3);
  CHECK(hm.base_rank == 4);
  CHECK(hm.world_size == 7);
  CHECK(host.nextRound() == 1);
  CHECK(rendezvous::toString(store.get(kRoundCounterKey)) == "1");  // later joiners: round 1
  CHECK(memberIds(store, 0) == std::vector<std::string>{"id-2", "id-0", "id-1"});

  // Every slot's assignment: slot 2 is node 0 (ranks 0..3), slot 3 node 1, slot 1 node 2.
  struct Want {
    int64_t slot;
    int rank;
    int base_rank;
  };
  for (const Want& want : {Want{2, 0, 0}, Want{3, 1, 4}, Want{1, 2, 5}}) {
    const RoundAssignment a = assignmentIn(store, 0, want.slot);
    REQUIRE(a.kind == RoundAssignment::Kind::kMember);
    CHECK(a.attempt == 4);
    CHECK(a.membership.group_rank == want.rank);
    CHECK(a.membership.base_rank == want.base_rank);
    CHECK(a.membership.world_size == 7);
  }
  CHECK(json::parse(rendezvous::toString(store.get(roundClosedKey(0)))) == json({{"slots", 3}}));

  REQUIRE(peer_joined.wait_for(kBound) == std::future_status::ready);
  const auto [peer_result, peer_attempt] = peer_joined.get();
  const Membership pm = joined(peer_result);
  CHECK(peer_attempt == 4);
  CHECK(pm.group_rank == 2);
  CHECK(pm.base_rank == 5);
  CHECK(pm.world_size == 7);
  CHECK(pm.members_digest == hm.members_digest);
  CHECK(peer.progress().rounds_completed == 1);
}

TEST_CASE(
    "rendezvous rounds: past max_nodes the closer keeps its place, the other slots are not "
    "members",
    "[unit]") {
  rendezvous::MemoryStore store;
  NoWaits waits;
  AlwaysAlive liveness;
  REQUIRE(joinAs(store, 0, {"a", 1, "id-a", -1}) == 1);
  REQUIRE(joinAs(store, 0, {"b", 1, "id-b", -1}) == 2);
  const StoreCoordinatorOptions opts = elastic({"h", 2, "id-h", -1}, 1, 2, true);
  RendezvousRounds host(opts, waits);
  int attempt = -1;
  const Membership m = joined(host.joinElastic(store, liveness, 0, &attempt));
  // Join order among the members: slot 1, then the closer (slot 3).
  CHECK(memberIds(store, 0) == std::vector<std::string>{"id-a", "id-h"});
  CHECK(m.group_rank == 1);
  CHECK(m.world_size == 3);
  CHECK(assignmentIn(store, 0, 1).kind == RoundAssignment::Kind::kMember);
  CHECK(assignmentIn(store, 0, 2).kind == RoundAssignment::Kind::kNotMember);
  CHECK(assignmentIn(store, 0, 3).membership.group_rank == 1);
}

TEST_CASE("rendezvous rounds: with min_nodes in, the round closes when the last call ends",
          "[unit]") {
  rendezvous::MemoryStore store;
  NoWaits waits;
  AlwaysAlive liveness;
  REQUIRE(joinAs(store, 0, {"a", 3, "id-a", -1}) == 1);
  StoreCoordinatorOptions opts = elastic({"h", 1, "id-h", -1}, 2, 4, true);
  opts.last_call_timeout = 1ms;  // nobody else comes: the last call is all it waits
  RendezvousRounds host(opts, waits);
  int attempt = -1;
  const Membership m = joined(host.joinElastic(store, liveness, 0, &attempt));
  CHECK(m.group_world_size == 2);
  CHECK(m.group_rank == 1);
  CHECK(m.base_rank == 3);
  CHECK(m.world_size == 4);
  CHECK(json::parse(rendezvous::toString(store.get(roundClosedKey(0)))) == json({{"slots", 2}}));
}

TEST_CASE("rendezvous rounds: fewer than min_nodes within the join timeout fail the round",
          "[unit]") {
  rendezvous::MemoryStore store;
  NoWaits waits;
  AlwaysAlive liveness;
  StoreCoordinatorOptions opts = elastic({"h", 1, "id-h", -1}, 2, 2, true);
  opts.join_timeout = 100ms;  // the bound under test
  RendezvousRounds host(opts, waits);
  int attempt = -1;
  const Result<Membership> m = host.joinElastic(store, liveness, 0, &attempt);
  REQUIRE_FALSE(m.isOk());
  CHECK(m.status().code() == StatusCode::kTimeout);
  CHECK_THAT(m.status().message(), Catch::Contains("only 1 of at least 2 nodes joined"));
  // Its error is the round's members document and every slot's assignment.
  Result<RoundDocument> doc =
      roundDocumentFromJson(json::parse(rendezvous::toString(store.get(roundMembersKey(0)))), 0);
  REQUIRE(doc.isOk());
  CHECK(doc.value().kind == RoundDocument::Kind::kError);
  CHECK(assignmentIn(store, 0, 1).kind == RoundAssignment::Kind::kError);
  CHECK(store.check({roundClosedKey(0)}));
}

TEST_CASE("rendezvous rounds: etcd, the agent in slot min_nodes closes the round for the others",
          "[unit]") {
  rendezvous::MemoryStore store;
  NoWaits waits;
  AlwaysAlive liveness;
  StoreCoordinatorOptions first_opts = elastic({"a", 2, "id-a", -1, "a:1"}, 2, 2, false);
  first_opts.host_per_round = true;
  first_opts.keep_alive_interval = 1s;  // its wait for the closer: 4 s (the keep-alive bound)
  StoreCoordinatorOptions closer_opts = first_opts;
  closer_opts.self = {"b", 3, "id-b", -1, "b:1"};
  RendezvousRounds first(first_opts, waits);
  auto first_joined = std::async(std::launch::async, [&] {
    int attempt = -1;
    return first.joinElastic(store, liveness, 0, &attempt);
  });
  store.wait({roundAgentKey(0, 1)}, kBound);
  RendezvousRounds closer(closer_opts, waits);
  int attempt = -1;
  const Membership cm = joined(closer.joinElastic(store, liveness, 0, &attempt));
  REQUIRE(first_joined.wait_for(kBound) == std::future_status::ready);
  const Membership fm = joined(first_joined.get());
  // Join order; node 0's store is the workers' (MASTER_ADDR).
  CHECK(fm.group_rank == 0);
  CHECK(cm.group_rank == 1);
  CHECK(cm.base_rank == 2);
  CHECK(fm.world_size == 5);
  CHECK(fm.node0_store_endpoint == "a:1");
  CHECK(cm.node0_store_endpoint == "a:1");
  CHECK(memberIds(store, 0) == std::vector<std::string>{"id-a", "id-b"});
}

TEST_CASE("rendezvous rounds: etcd, a closer that never closes is replaced after the grace",
          "[unit]") {
  rendezvous::MemoryStore store;
  NoWaits waits;
  AlwaysAlive liveness;
  StoreCoordinatorOptions opts = elastic({"a", 1, "id-a", -1}, 2, 2, false);
  opts.host_per_round = true;
  opts.keep_alive_max_attempt = 1;  // the grace under test: 2 intervals, 100 ms
  RendezvousRounds first(opts, waits);
  auto first_joined = std::async(std::launch::async, [&] {
    int attempt = -1;
    return first.joinElastic(store, liveness, 0, &attempt);
  });
  store.wait({roundAgentKey(0, 1)}, kBound);
  // Slot 2 (min_nodes: the closer) joined and was lost before it closed the round.
  REQUIRE(joinAs(store, 0, {"b", 1, "id-b", -1}) == 2);
  REQUIRE(first_joined.wait_for(kBound) == std::future_status::ready);
  const Membership m = joined(first_joined.get());
  CHECK(m.group_rank == 0);
  CHECK(m.group_world_size == 2);
  CHECK(assignmentIn(store, 0, 2).membership.group_rank == 1);
  CHECK(store.check({roundClosedKey(0)}));
}

TEST_CASE("rendezvous rounds: members are survivors first, the closer always, in a stable order",
          "[unit]") {
  const auto member = [](const std::string& id, int sched, int previous, int64_t slot) {
    return RoundMember{{id, 1, id, sched}, previous, slot};
  };
  const auto ids = [](const std::vector<RoundMember>& members) {
    std::vector<std::string> out;
    for (const RoundMember& m : members) out.push_back(m.agent.id);
    return out;
  };
  // Spares s1, s2 took the first slots; survivors v1 (previous rank 1), v0 (previous rank 0)
  // came after; the closer c last. Three places: the survivors, then the closer.
  const std::vector<RoundMember> candidates = {member("s1", -1, -1, 1), member("s2", -1, -1, 2),
                                               member("v1", -1, 1, 3), member("v0", -1, 0, 4),
                                               member("c", -1, -1, 5)};
  CHECK(ids(selectRoundMembers(candidates, {"v0", "v1"}, 3, "c")) ==
        std::vector<std::string>{"v0", "v1", "c"});
  // Room for all: survivors by their previous rank, then the others in slot order.
  CHECK(ids(selectRoundMembers(candidates, {"v0", "v1"}, 8, "c")) ==
        std::vector<std::string>{"v0", "v1", "s1", "s2", "c"});
  // No survivors: join order, the closer kept in place of the last of them.
  CHECK(ids(selectRoundMembers(candidates, {}, 2, "c")) == std::vector<std::string>{"s1", "c"});
  // The scheduler's rank orders before anything else.
  CHECK(ids(selectRoundMembers({member("x", 1, 0, 1), member("y", 0, -1, 2)}, {"x"}, 2, "y")) ==
        std::vector<std::string>{"y", "x"});
}
