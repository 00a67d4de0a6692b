// EtcdStore against a real etcd: the Store contract (store_contract.h, the cases MemoryStore,
// PrefixStore and TcpStoreClient pass in store_test.cc) over EtcdStore and PrefixStore(EtcdStore)
// on a 3-member cluster, each handle with a client of its own whose first endpoint is the next
// member (so the two handles of a case talk to different members); plus what only etcd has:
// prefixes as given, handles on different members, more keys than one txn, a watch whose member
// goes silent.
#include "rendezvous/etcd_store.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <thread>

#include "common/network_address.h"
#include "rendezvous/prefix_store.h"
#include "tests/rendezvous/store_contract.h"
#include "tests/support/etcd_cluster.h"
#include "tests/support/http_get.h"

namespace {

using namespace cpprun::rendezvous;
using cpprun::testing::EtcdCluster;
using cpprun::testing::NumKeysScope;
using cpprun::testing::StoreKinds;
using namespace std::chrono_literals;

cpprun::testing::EtcdClusterOptions clusterOptions(int members, bool tls) {
  cpprun::testing::EtcdClusterOptions o;
  o.members = members;
  o.tls = tls;
  return o;
}

std::shared_ptr<EtcdClient> client(const std::vector<std::string>& endpoints) {
  EtcdClientOptions o;
  o.endpoints = endpoints;
  auto c = EtcdClient::connect(o);
  INFO(c.status().toString());
  REQUIRE(c.isOk());
  return std::shared_ptr<EtcdClient>(std::move(c).value());
}

// One 3-member cluster per test case for both kinds. Every open() makes a new client whose
// endpoint list starts at the next member. numKeys counts the EtcdStore's own prefix only, so
// "elsewhere" is an EtcdStore under another run's prefix.
StoreKinds etcdKinds() {
  auto cluster = std::make_shared<EtcdCluster>(clusterOptions(3, false));
  auto next_member = std::make_shared<int>(0);
  auto etcd = [cluster, next_member](const std::string& run) {
    return [cluster, next_member, run]() {
      std::vector<std::string> endpoints = cluster->endpoints();
      std::rotate(endpoints.begin(), endpoints.begin() + (*next_member)++ % cluster->members(),
                  endpoints.end());
      return std::make_shared<EtcdStore>(client(endpoints), run);
    };
  };
  auto elsewhere = [etcd]() -> std::shared_ptr<Store> { return etcd("/cpprun/elsewhere/")(); };
  auto run0 = etcd("/cpprun/run0/");
  auto run1 = etcd("/cpprun/run1/");
  constexpr int kEtcdAddsPerThread = 50;
  StoreKinds made;
  made.servers = cluster;
  made.kinds = {
      {"EtcdStore", [run0]() -> std::shared_ptr<Store> { return run0(); }, elsewhere,
       NumKeysScope::kOwnPrefix, kEtcdAddsPerThread},
      {"PrefixStore(EtcdStore)",
       [run1]() -> std::shared_ptr<Store> { return std::make_shared<PrefixStore>("job", run1()); },
       elsewhere, NumKeysScope::kOwnPrefix, kEtcdAddsPerThread},
  };
  return made;
}

[[maybe_unused]] const bool kContractRegistered =
    cpprun::testing::registerStoreContract("etcd store ", "[etcd]", &etcdKinds);

}  // namespace

TEST_CASE("etcd store numKeys counts its own prefix only", "[etcd]") {
  EtcdCluster cluster(clusterOptions(1, false));
  auto c = client(cluster.endpoints());
  EtcdStore one(c, "/cpprun/one/");
  EtcdStore two(c, "/cpprun/two/");
  one.set("a", std::string("1"));
  one.set("b", std::string("1"));
  two.set("a", std::string("2"));
  CHECK(one.numKeys() == 2);
  CHECK(two.numKeys() == 1);
  CHECK(toString(two.get("a")) == "2");
  // The prefix is applied as given: the raw etcd key is prefix + key.
  CHECK(c->get("/cpprun/one/a").value().value().value == "1");
}

TEST_CASE("etcd store deletePrefix removes the keys under the prefix and no others", "[etcd]") {
  EtcdCluster cluster(clusterOptions(1, false));
  auto c = client(cluster.endpoints());
  auto job = std::make_shared<EtcdStore>(c, "/cpprun/");
  PrefixStore run("run", job);  // as the coordinator sees it: "/cpprun/run/<key>"
  for (const char* key : {"attempt/1/go", "attempt/1/report/0", "attempt/1/nccl_ids/3",
                          "attempt/10/go", "attempt/2/go", "exclusion/failures"}) {
    run.set(key, std::string("x"));
  }
  EtcdStore other(c, "/cpprun/other/");
  other.set("attempt/1/go", std::string("y"));
  // Attempt 1's keys go in one DeleteRange; attempt 10's (same leading digits) stay.
  CHECK(run.deletePrefix("attempt/1/") == 3);
  CHECK_FALSE(run.check({"attempt/1/go"}));
  CHECK(run.check({"attempt/10/go", "attempt/2/go", "exclusion/failures"}));
  CHECK(other.check({"attempt/1/go"}));
  CHECK(run.deletePrefix("attempt/1/") == 0);
}

TEST_CASE("etcd store handles on different members of a 3-member cluster see each other",
          "[etcd]") {
  EtcdCluster cluster(clusterOptions(3, false));
  EtcdStore a(client({cluster.endpoint(0)}), "/cpprun/multi/");
  EtcdStore b(client({cluster.endpoint(2)}), "/cpprun/multi/");
  a.setTimeout(10s);
  b.setTimeout(10s);
  std::thread writer([&] {
    b.wait({"reader-started"}, 10s);
    b.set("late", std::string("from member 2"));
  });
  a.set("reader-started", std::string("1"));
  CHECK(toString(a.get("late")) == "from member 2");
  writer.join();
  CHECK(a.add("n", 2) == 2);
  CHECK(b.add("n", 3) == 5);
  CHECK(toString(b.compareSet("cas", {}, toBytes("a"))) == "a");
  CHECK(toString(a.compareSet("cas", toBytes("x"), toBytes("b"))) == "a");
}

TEST_CASE("etcd store multiSet and multiGet of more keys than one etcd txn holds", "[etcd]") {
  EtcdCluster cluster(clusterOptions(1, false));
  EtcdStore s(client(cluster.endpoints()), "/cpprun/many/");
  s.setTimeout(10s);
  std::vector<std::string> keys;
  std::vector<Bytes> values;
  for (int i = 0; i < 300; ++i) {  // etcd refuses more than 128 ops in one txn by default
    keys.push_back("k" + std::to_string(i));
    values.push_back(toBytes("v" + std::to_string(i)));
  }
  // A repeated key: the last value wins, as in c10d (etcd refuses one txn putting it twice).
  keys.push_back("k7");
  values.push_back(toBytes("last"));
  s.multiSet(keys, values);
  CHECK(s.numKeys() == 300);
  keys.pop_back();
  CHECK(s.check(keys));
  auto got = s.multiGet(keys);
  REQUIRE(got.size() == 300);
  CHECK(toString(got[0]) == "v0");
  CHECK(toString(got[7]) == "last");
  CHECK(toString(got[299]) == "v299");
  keys.push_back("absent");
  CHECK_FALSE(s.check(keys));
}

TEST_CASE("etcd store blocking get survives the member of its watch going silent", "[etcd]") {
  EtcdCluster cluster(clusterOptions(3, false));
  EtcdClientOptions o;
  o.endpoints = cluster.endpoints();  // member 0 first: the waiter's watch goes there
  o.request_timeout = 1s;
  auto waiter_client = EtcdClient::connect(o);
  REQUIRE(waiter_client.isOk());
  EtcdStore waiter(std::shared_ptr<EtcdClient>(std::move(waiter_client).value()), "/cpprun/cut/");
  EtcdClientOptions w = o;
  w.endpoints = {cluster.endpoint(1), cluster.endpoint(2)};
  w.request_timeout = 2s;
  auto writer_client = EtcdClient::connect(w);
  REQUIRE(writer_client.isOk());
  EtcdStore writer(std::shared_ptr<EtcdClient>(std::move(writer_client).value()), "/cpprun/cut/");
  waiter.setTimeout(30s);
  writer.setTimeout(30s);
  REQUIRE(waiter.client().currentEndpoint() == cluster.endpoint(0));

  std::thread setter([&] {
    writer.wait({"waiter-started"}, 30s);
    // The waiter's watch is on member 0 once that member counts a watcher (its metrics).
    const int port = cpprun::parseNetworkAddress(cluster.endpoint(0)).value().port;
    bool watching = false;
    for (auto give_up = std::chrono::steady_clock::now() + 20s;
         !watching && std::chrono::steady_clock::now() < give_up;) {
      auto metrics = cpprun::testing::httpGetRaw(port, "/metrics", 2s);
      watching = metrics &&
                 metrics->find("\netcd_debugging_mvcc_watcher_total 0\n") == std::string::npos &&
                 metrics->find("\netcd_debugging_mvcc_watcher_total ") != std::string::npos;
    }
    CHECK(watching);
    cluster.pause(0);  // SIGSTOP: its connections stay open and say nothing
    writer.set("key", std::string("through another member"));
  });
  waiter.set("waiter-started", std::string("1"));
  auto start = std::chrono::steady_clock::now();
  Bytes value;
  CHECK_NOTHROW(value = waiter.get("key"));
  auto took = std::chrono::steady_clock::now() - start;
  setter.join();
  cluster.resume(0);
  CHECK(toString(value) == "through another member");
  CHECK(took < 15s);  // well within the 30 s store timeout: the waiter moved on
  WARN("get woke " << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                   << " ms after it started, its watch's member paused meanwhile");
}

// compareSet is one etcd txn: the comparison, the put, and on failure a read of the key, so a
// mismatch still hands back the value now stored (c10d's semantics) without a second request.
TEST_CASE("etcd store compareSet is one txn and returns the current value on a mismatch",
          "[etcd]") {
  EtcdCluster cluster(clusterOptions(1, false));
  auto c = client(cluster.endpoints());
  EtcdStore s(c, "/cpprun/cas/");
  s.set("k", std::string("a"));
  const auto requests = [&] { return c->requestsMade(); };

  auto before = requests();
  CHECK(toString(s.compareSet("k", toBytes("b"), toBytes("c"))) == "a");  // mismatch
  CHECK(requests() - before == 1);
  CHECK(toString(s.get("k")) == "a");  // untouched

  before = requests();
  CHECK(toString(s.compareSet("k", toBytes("a"), toBytes("c"))) == "c");  // match
  CHECK(requests() - before == 1);
  CHECK(toString(s.get("k")) == "c");

  before = requests();
  CHECK(toString(s.compareSet("k", {}, toBytes("d"))) == "c");  // "absent" expected, it exists
  CHECK(requests() - before == 1);

  before = requests();  // absent with a non-empty `expected`: that comes back, nothing stored
  CHECK(toString(s.compareSet("missing", toBytes("x"), toBytes("y"))) == "x");
  CHECK(requests() - before == 1);
  CHECK_FALSE(s.check({"missing"}));

  before = requests();  // absent with an empty `expected`: created
  CHECK(toString(s.compareSet("fresh", {}, toBytes("y"))) == "y");
  CHECK(requests() - before == 1);
  CHECK(toString(s.get("fresh")) == "y");

  // A key holding "" matches an empty `expected` (etcd cannot say "absent or empty" in one
  // comparison: a second txn on the read's revision).
  s.set("empty", std::string());
  CHECK(toString(s.compareSet("empty", {}, toBytes("z"))) == "z");
  CHECK(toString(s.get("empty")) == "z");
}

// Keys that exist cost one txn per 128 of them: wait and multiGet read them all before they
// wait for any one, and a missing one is still waited for.
TEST_CASE("etcd store wait and multiGet read present keys in one txn per 128 keys", "[etcd]") {
  EtcdCluster cluster(clusterOptions(1, false));
  auto c = client(cluster.endpoints());
  EtcdStore s(c, "/cpprun/batched/");
  s.setTimeout(10s);
  std::vector<std::string> keys;
  std::vector<Bytes> values;
  for (int i = 0; i < 200; ++i) {
    keys.push_back("k" + std::to_string(i));
    values.push_back(toBytes("v" + std::to_string(i)));
  }
  s.multiSet(keys, values);
  auto before = c->requestsMade();
  s.wait(keys, 10s);
  CHECK(c->requestsMade() - before == 2);  // 128 + 72 keys
  before = c->requestsMade();
  auto got = s.multiGet(keys);
  CHECK(c->requestsMade() - before == 2);
  REQUIRE(got.size() == 200);
  CHECK(toString(got[199]) == "v199");

  keys.push_back("late");
  EtcdStore writer(client(cluster.endpoints()), "/cpprun/batched/");
  std::thread setter([&] {
    writer.wait({"reader-started"}, 10s);
    writer.set("late", std::string("here"));
  });
  s.set("reader-started", std::string("1"));
  got = s.multiGet(keys);
  setter.join();
  REQUIRE(got.size() == 201);
  CHECK(toString(got[200]) == "here");
  CHECK(toString(got[0]) == "v0");
}
