// LeaseLiveness (agent/coordination/lease_liveness.h) against a real 3-member etcd (tests/support/
// etcd_cluster.h): agents that keep their leases are never reported; an agent that stops renewing
// is reported to every other member once its lease expires, within the TTL plus one second; a
// member whose key is already gone when an attempt is watched is reported at once. Callbacks
// come from the liveness threads; assertions stay on the test's thread.
#include "agent/coordination/lease_liveness.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "agent/coordination/job_keys.h"
#include "rendezvous/etcd_client.h"
#include "rendezvous/memory_store.h"
#include "tests/support/etcd_cluster.h"

namespace {

using namespace cpprun;
using namespace cpprun::agent;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

struct Reported {
  int attempt;
  LostMember lost;
  Clock::time_point at;
};

// One agent's liveness on its own client, and what it reported.
class Member {
 public:
  Member(const cpprun::testing::EtcdCluster& cluster, const std::string& id) {
    rendezvous::EtcdClientOptions o;
    o.endpoints = cluster.endpoints();
    o.request_timeout = 300ms;
    auto client = rendezvous::EtcdClient::connect(o);
    INFO(client.status().toString());
    REQUIRE(client.isOk());
    LivenessOptions lo;
    lo.self = AgentInfo{"host-" + id, 1, id, -1};
    lo.interval = 300ms;
    lo.bound = 900ms;  // a TTL of 1 s, etcd's minimum with the fixture's 500 ms election
    lo.on_lost = [this](int attempt, const LostMember& lost) {
      std::lock_guard<std::mutex> lock(mu_);
      reported_.push_back({attempt, lost, Clock::now()});
    };
    liveness_ = std::make_unique<LeaseLiveness>(
        std::shared_ptr<rendezvous::EtcdClient>(std::move(client).value()),
        "/cpprun/lease-test/" + std::string(kAliveKeyPrefix), lo, 3s);
  }

  LeaseLiveness& liveness() { return *liveness_; }
  void stop() { liveness_.reset(); }  // renews no more, as a killed agent
  std::vector<Reported> reported() {
    std::lock_guard<std::mutex> lock(mu_);
    return reported_;
  }

 private:
  std::mutex mu_;
  std::vector<Reported> reported_;
  std::unique_ptr<LeaseLiveness> liveness_;
};

std::vector<AgentInfo> agentsOf(const std::vector<std::string>& ids) {
  std::vector<AgentInfo> agents;
  for (const auto& id : ids) agents.push_back(AgentInfo{"host-" + id, 1, id, -1});
  return agents;
}

template <typename F>
bool eventually(F condition, std::chrono::milliseconds within) {
  const auto deadline = Clock::now() + within;
  while (!condition()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(5ms);  // a poll's pace, not a wait for something
  }
  return true;
}

}  // namespace

TEST_CASE(
    "lease liveness: a member that stops renewing is reported by every other within TTL + 1 s",
    "[etcd]") {
  cpprun::testing::EtcdCluster cluster;
  rendezvous::MemoryStore unused;  // renew() takes the caller's store; leases ignore it
  std::vector<std::unique_ptr<Member>> members;
  const std::vector<std::string> ids = {"a0", "a1", "a2"};
  for (const auto& id : ids) members.push_back(std::make_unique<Member>(cluster, id));
  for (auto& m : members) REQUIRE(m->liveness().renew(unused));
  CHECK(members[0]->liveness().ttl() == 1s);
  for (int r = 0; r < 3; ++r) {
    members[static_cast<size_t>(r)]->liveness().watch(0, membershipOf(agentsOf(ids), r));
  }
  // Two TTLs with everyone renewing: nobody is reported.
  std::this_thread::sleep_for(2s);  // the span checked for false reports, not a synchronisation
  for (auto& m : members) CHECK(m->reported().empty());
  for (auto& m : members) CHECK(m->liveness().renew(unused));

  const auto stopped = Clock::now();
  members[2]->stop();
  for (int r = 0; r < 2; ++r) {
    Member& m = *members[static_cast<size_t>(r)];
    REQUIRE(eventually([&] { return !m.reported().empty(); }, 5s));
    const Reported got = m.reported().front();
    const double seconds = std::chrono::duration<double>(got.at - stopped).count();
    WARN("member " << r << " heard of a2's loss after " << seconds << " s (TTL 1 s)");
    CHECK(seconds < 1.0 + 1.0);
    CHECK(got.attempt == 0);
    CHECK(got.lost.rank == 2);
    CHECK_THAT(got.lost.reason, Catch::Contains("the agent of node 2 (host-a2) was lost") &&
                                    Catch::Contains("etcd lease"));
    CHECK(m.reported().size() == 1);
  }
}

TEST_CASE("lease liveness: a member whose key is gone when its attempt is watched is lost at once",
          "[etcd]") {
  cpprun::testing::EtcdCluster cluster;
  rendezvous::MemoryStore unused;
  Member a0(cluster, "a0");
  REQUIRE(a0.liveness().renew(unused));
  // "ghost" joined a round but never kept a lease (or it expired before the round closed).
  a0.liveness().watch(3, membershipOf(agentsOf({"a0", "ghost"}), 0));
  REQUIRE(a0.reported().size() == 1);
  CHECK(a0.reported().front().attempt == 3);
  CHECK(a0.reported().front().lost.rank == 1);
  CHECK_THAT(a0.reported().front().lost.reason,
             Catch::Contains("had expired when attempt 3 began"));
}

namespace {

std::shared_ptr<rendezvous::EtcdClient> rawClient(const cpprun::testing::EtcdCluster& cluster) {
  rendezvous::EtcdClientOptions o;
  o.endpoints = cluster.endpoints();
  auto client = rendezvous::EtcdClient::connect(o);
  REQUIRE(client.isOk());
  return std::shared_ptr<rendezvous::EtcdClient>(std::move(client).value());
}

const std::string kPrefix = "/cpprun/lease-test/" + std::string(kAliveKeyPrefix);

}  // namespace

// Node 0 reads the members' keys once per attempt and publishes what it read; the others take
// that over instead of each reading every key: a member node 0 saw lost is lost for them too,
// even though they never read its key themselves.
TEST_CASE("lease liveness: the other members take node 0's snapshot over", "[etcd]") {
  cpprun::testing::EtcdCluster cluster;
  rendezvous::MemoryStore unused;
  Member a0(cluster, "a0");
  Member a1(cluster, "a1");
  REQUIRE(a0.liveness().renew(unused));
  REQUIRE(a1.liveness().renew(unused));
  const auto agents = agentsOf({"a0", "a1", "ghost"});
  a0.liveness().watch(4, membershipOf(agents, 0));
  REQUIRE(a0.reported().size() == 1);
  CHECK(a0.reported().front().lost.rank == 2);
  auto raw = rawClient(cluster);
  const std::string key = LeaseLiveness::snapshotKey(kPrefix, 4, membershipOf(agents, 0));
  auto published = raw->get(key);
  REQUIRE(published.isOk());
  REQUIRE(published.value());
  CHECK(published.value()->value.substr(published.value()->value.find(' ')) == " 2");

  // A snapshot that names a1's live peer a0 as missing: taken over as it is, so a1 did not read
  // the keys (it would have found a0's).
  const std::string fake = LeaseLiveness::snapshotKey(kPrefix, 5, membershipOf(agents, 1));
  REQUIRE(raw->put(fake, std::to_string(published.value()->mod_revision) + " 0,2").isOk());
  a1.liveness().watch(5, membershipOf(agents, 1));
  REQUIRE(eventually([&] { return a1.reported().size() == 2; }, 2s));
  for (const Reported& r : a1.reported()) {
    CHECK(r.attempt == 5);
    CHECK((r.lost.rank == 0 || r.lost.rank == 2));
    CHECK_THAT(r.lost.reason, Catch::Contains("had expired when attempt 5 began"));
  }
}

// Node 0's snapshot may be older than the moment a member takes it over: the member watches from
// the snapshot's revision on, so a member lost in between is still reported.
TEST_CASE("lease liveness: a member lost after node 0's snapshot is seen by those who take it over",
          "[etcd]") {
  cpprun::testing::EtcdCluster cluster;
  rendezvous::MemoryStore unused;
  Member a0(cluster, "a0");
  Member a1(cluster, "a1");
  Member a2(cluster, "a2");
  for (Member* m : {&a0, &a1, &a2}) REQUIRE(m->liveness().renew(unused));
  const auto agents = agentsOf({"a0", "a1", "a2"});
  a0.liveness().watch(0, membershipOf(agents, 0));
  CHECK(a0.reported().empty());
  a2.stop();  // its lease expires within the TTL (1 s), after node 0's snapshot
  auto raw = rawClient(cluster);
  REQUIRE(eventually([&] { return !raw->get(kPrefix + "a2").value().has_value(); }, 5s));
  a1.liveness().watch(0, membershipOf(agents, 1));  // takes over the snapshot that saw a2
  REQUIRE(eventually([&] { return !a1.reported().empty(); }, 3s));
  CHECK(a1.reported().front().lost.rank == 2);
  CHECK_THAT(a1.reported().front().lost.reason, Catch::Contains("expired"));
  CHECK(a1.reported().size() == 1);
}

// Node 0 lost before it published: the others read the keys themselves after the keep-alive
// bound (900 ms here) and find it gone.
TEST_CASE("lease liveness: without node 0's snapshot a member reads the keys itself", "[etcd]") {
  cpprun::testing::EtcdCluster cluster;
  rendezvous::MemoryStore unused;
  Member a1(cluster, "a1");
  REQUIRE(a1.liveness().renew(unused));
  const auto start = Clock::now();
  a1.liveness().watch(2, membershipOf(agentsOf({"ghost", "a1"}), 1));
  REQUIRE(eventually([&] { return !a1.reported().empty(); }, 5s));
  const Reported got = a1.reported().front();
  CHECK(got.lost.rank == 0);
  CHECK_THAT(got.lost.reason, Catch::Contains("had expired when attempt 2 began"));
  CHECK(got.at - start >= 900ms);
  CHECK(got.at - start < 900ms + 2s);
}

// A member that read only its own assignment (rendezvous_rounds.h) knows the members' digest, not
// their ids: it takes node 0's snapshot over by that digest, and reads the round's members
// document when a deletion comes, to name the member that was lost.
TEST_CASE(
    "lease liveness: a member that read only its assignment reads the round's members when a "
    "lease expires",
    "[etcd]") {
  cpprun::testing::EtcdCluster cluster;
  rendezvous::MemoryStore unused;
  Member a0(cluster, "a0");
  Member a1(cluster, "a1");
  Member a2(cluster, "a2");
  for (Member* m : {&a0, &a1, &a2}) REQUIRE(m->liveness().renew(unused));
  const auto agents = agentsOf({"a0", "a1", "a2"});
  nlohmann::json doc = {{"attempt", 0}, {"round", 7}, {"members", nlohmann::json::array()}};
  for (size_t i = 0; i < agents.size(); ++i) {
    nlohmann::json m = agentRecord(agents[i], -1);
    m["index"] = i + 1;
    doc["members"].push_back(m);
  }
  auto raw = rawClient(cluster);
  REQUIRE(raw->put("/cpprun/lease-test/" + roundMembersKey(7), doc.dump()).isOk());
  Membership full = membershipOf(agents, 0);
  full.round = 7;
  a0.liveness().watch(0, full);
  Membership compact = membershipOf(agents, 1);
  compact.round = 7;
  compact.agents.clear();  // as its assignment gave it
  // Named by the digest its assignment carries, the snapshot key is node 0's.
  CHECK(LeaseLiveness::snapshotKey(kPrefix, 0, compact) ==
        LeaseLiveness::snapshotKey(kPrefix, 0, full));
  a1.liveness().watch(0, compact);
  a2.stop();
  REQUIRE(eventually([&] { return !a1.reported().empty(); }, 5s));
  const Reported got = a1.reported().front();
  CHECK(got.lost.rank == 2);
  CHECK_THAT(got.lost.reason, Catch::Contains("the agent of node 2 (host-a2)"));
  CHECK_THAT(got.lost.reason, Catch::Contains("expired"));
  CHECK(a1.reported().size() == 1);
}
