// EtcdStore against a real etcd: the same contract cases as tests/rendezvous/store_test.cc
// (MemoryStore, PrefixStore, TcpStoreClient), run over EtcdStore and PrefixStore(EtcdStore),
// each pair of handles on two separate clients; plus handles on different members of a
// 3-member cluster.
#include "rendezvous/etcd_store.h"

#include <catch2/catch.hpp>
#include <functional>
#include <thread>

#include "rendezvous/prefix_store.h"
#include "tests/support/etcd_cluster.h"
#include "tests/support/http_get.h"

namespace {

using namespace cpprun::rendezvous;
using cpprun::testing::EtcdCluster;
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

struct Subject {
  std::string name;
  std::function<std::shared_ptr<Store>(const std::string& run_prefix)> open;
};

// Runs `body` once per store kind, each against fresh data under its own key prefix; the two
// handles have separate clients (separate connections), as two agents would. One cluster for
// both kinds, in one pass (no sections: Catch would start the test case, and a cluster, again
// for each).
void forEachStore(const std::function<void(Store&, Store&, const std::string&)>& body) {
  EtcdCluster cluster(clusterOptions(1, false));
  const auto endpoints = cluster.endpoints();
  std::vector<Subject> subjects = {
      {"EtcdStore",
       [&](const std::string& run) { return std::make_shared<EtcdStore>(client(endpoints), run); }},
      {"PrefixStore(EtcdStore)",
       [&](const std::string& run) {
         return std::make_shared<PrefixStore>("job",
                                              std::make_shared<EtcdStore>(client(endpoints), run));
       }},
  };
  int round = 0;
  for (const auto& s : subjects) {
    INFO("store: " << s.name);
    const std::string run = "/cpprun/run" + std::to_string(round) + "/";
    auto a = s.open(run);
    auto b = s.open(run);
    a->setTimeout(10s);
    b->setTimeout(10s);
    body(*a, *b, "/t" + std::to_string(round) + "/");
    ++round;
  }
}

}  // namespace

TEST_CASE("etcd store set and get with binary and empty values", "[etcd]") {
  forEachStore([](Store& s, Store& other, const std::string& p) {
    s.set(p + "k", toBytes("v"));
    CHECK(toString(other.get(p + "k")) == "v");
    Bytes binary{0, 1, 255, 0};
    s.set(p + "bin", binary);
    CHECK(other.get(p + "bin") == binary);
    s.set(p + "empty", Bytes{});
    CHECK(other.get(p + "empty").empty());
    Bytes big(1 << 20);
    for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 7);
    s.set(p + "big", big);
    CHECK(other.get(p + "big") == big);
    s.set(p + "k", std::string("overwritten"));
    CHECK(toString(s.get(p + "k")) == "overwritten");
    CHECK(toString(other.get(p + "k")) == "overwritten");
  });
}

TEST_CASE("etcd store add counts in decimal text", "[etcd]") {
  forEachStore([](Store& s, Store& other, const std::string& p) {
    CHECK(s.add(p + "c", 5) == 5);
    CHECK(other.add(p + "c", -2) == 3);
    CHECK(s.add(p + "c", 0) == 3);
    CHECK(toString(other.get(p + "c")) == "3");
    s.set(p + "text", std::string("abc"));
    CHECK_THROWS_AS(s.add(p + "text", 1), StoreError);
  });
}

TEST_CASE("etcd store compareSet's four cases", "[etcd]") {
  forEachStore([](Store& s, Store& other, const std::string& p) {
    CHECK(toString(s.compareSet(p + "k", {}, toBytes("first"))) == "first");
    CHECK(toString(s.compareSet(p + "missing", toBytes("x"), toBytes("y"))) == "x");
    CHECK_FALSE(other.check({p + "missing"}));
    CHECK(toString(s.compareSet(p + "k", toBytes("first"), toBytes("second"))) == "second");
    CHECK(toString(s.compareSet(p + "k", toBytes("nomatch"), toBytes("third"))) == "second");
    CHECK(toString(other.get(p + "k")) == "second");
  });
}

TEST_CASE("etcd store check and deleteKey and numKeys", "[etcd]") {
  forEachStore([](Store& s, Store& other, const std::string& p) {
    int64_t before = s.numKeys();
    CHECK_FALSE(s.check({p + "a"}));
    s.set(p + "a", std::string("1"));
    s.set(p + "b", std::string("2"));
    CHECK(s.check({p + "a", p + "b"}));
    CHECK(other.check({p + "a", p + "b"}));
    CHECK_FALSE(other.check({p + "a", p + "nope"}));
    CHECK(s.numKeys() == before + 2);
    CHECK(other.deleteKey(p + "a"));
    CHECK_FALSE(other.deleteKey(p + "a"));
    CHECK(s.numKeys() == before + 1);
    CHECK_FALSE(s.check({p + "a"}));
  });
}

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

TEST_CASE("etcd store wait returns once another handle writes and times out otherwise", "[etcd]") {
  forEachStore([](Store& s, Store& other, const std::string& p) {
    std::thread writer([&] {
      other.wait({p + "waiting"}, 10s);
      other.set(p + "late", std::string("arrived"));
    });
    s.set(p + "waiting", std::string("1"));
    s.wait({p + "late"}, 10s);
    CHECK(toString(s.get(p + "late")) == "arrived");
    writer.join();

    auto start = std::chrono::steady_clock::now();
    CHECK_THROWS_AS(s.wait({p + "never"}, 300ms), StoreTimeout);
    auto took = std::chrono::steady_clock::now() - start;
    CHECK(took >= 300ms);
    CHECK(took < 5s);
    s.set(p + "after", std::string("ok"));
    CHECK(toString(s.get(p + "after")) == "ok");
    CHECK(s.add(p + "n", 1) == 1);
  });
}

TEST_CASE("etcd store blocking get is woken by another client's set", "[etcd]") {
  forEachStore([](Store& s, Store& other, const std::string& p) {
    std::thread writer([&] {
      other.wait({p + "reader-started"}, 10s);
      other.set(p + "value", std::string("pushed"));
    });
    s.set(p + "reader-started", std::string("1"));
    auto start = std::chrono::steady_clock::now();
    CHECK(toString(s.get(p + "value")) == "pushed");
    CHECK(std::chrono::steady_clock::now() - start < 5s);
    writer.join();
  });
}

TEST_CASE("etcd store get times out on a key nobody writes", "[etcd]") {
  forEachStore([](Store& s, Store&, const std::string& p) {
    s.setTimeout(200ms);
    auto start = std::chrono::steady_clock::now();
    CHECK_THROWS_AS(s.get(p + "absent"), StoreTimeout);
    CHECK(std::chrono::steady_clock::now() - start >= 200ms);
    s.setTimeout(10s);
    s.set(p + "present", std::string("x"));
    CHECK(toString(s.get(p + "present")) == "x");
  });
}

TEST_CASE("etcd store multiGet and multiSet and append", "[etcd]") {
  forEachStore([](Store& s, Store& other, const std::string& p) {
    s.multiSet({p + "x", p + "y"}, {toBytes("1"), toBytes("22")});
    auto values = other.multiGet({p + "y", p + "x"});
    REQUIRE(values.size() == 2);
    CHECK(toString(values[0]) == "22");
    CHECK(toString(values[1]) == "1");
    s.append(p + "log", toBytes("a"));
    CHECK(toString(s.get(p + "log")) == "a");
    other.append(p + "log", toBytes("bc"));
    CHECK(toString(s.get(p + "log")) == "abc");
    CHECK_THROWS_AS(s.multiSet({p + "only-key"}, {}), StoreError);
  });
}

TEST_CASE("etcd store concurrent adds from many threads are never lost", "[etcd]") {
  forEachStore([](Store& s, Store& other, const std::string& p) {
    constexpr int kThreads = 8;
    constexpr int kAdds = 50;
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      // Half the threads through the other handle: two clients racing on one counter.
      Store& target = t % 2 == 0 ? s : other;
      threads.emplace_back([&target, &p] {
        for (int i = 0; i < kAdds; ++i) target.add(p + "counter", 1);
      });
    }
    for (auto& t : threads) t.join();
    CHECK(s.add(p + "counter", 0) == kThreads * kAdds);
  });
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
    const int port = std::stoi(cluster.endpoint(0).substr(cluster.endpoint(0).rfind(':') + 1));
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
