// One behaviour, every Store: MemoryStore, PrefixStore, and TcpStoreClient in both dialects
// against our real TCP server.
#include <catch2/catch.hpp>
#include <functional>
#include <thread>

#include "rendezvous/memory_store.h"
#include "rendezvous/prefix_store.h"
#include "rendezvous/tcp_store_client.h"
#include "rendezvous/tcp_store_server.h"

namespace {

using namespace cpprun::rendezvous;
using namespace std::chrono_literals;

// A store under test plus a way to open a second handle on the same data.
struct Subject {
  std::string name;
  std::function<std::shared_ptr<Store>()> open;
};

std::vector<Subject> subjects(BackgroundTcpStoreServer& server) {
  auto memory = std::make_shared<MemoryStore>();
  auto tcp = [&server](wire::Dialect d) {
    return [&server, d]() -> std::shared_ptr<Store> {
      TcpStoreClientOptions o;
      o.port = server.port();
      o.dialect = d;
      o.connect_timeout = 10s;
      o.timeout = 10s;
      return std::make_shared<TcpStoreClient>(o);
    };
  };
  return {
      {"MemoryStore", [memory] { return memory; }},
      {"PrefixStore(MemoryStore)",
       [memory] { return std::make_shared<PrefixStore>("job", memory); }},
      {"TcpStoreClient torch>=2.2", tcp(wire::Dialect::kV2)},
      {"TcpStoreClient torch<=2.0", tcp(wire::Dialect::kLegacy)},
      {"PrefixStore(TcpStoreClient)",
       [tcp] { return std::make_shared<PrefixStore>("p", tcp(wire::Dialect::kV2)()); }},
  };
}

// Runs `body` once per implementation, each against fresh data under a unique key prefix.
void forEachStore(const std::function<void(Store&, Store&, const std::string&)>& body) {
  auto server = BackgroundTcpStoreServer::start({});
  REQUIRE(server.isOk());
  int round = 0;
  for (const auto& s : subjects(*server.value())) {
    DYNAMIC_SECTION(s.name) {
      auto a = s.open();
      auto b = s.open();
      a->setTimeout(10s);
      b->setTimeout(10s);
      body(*a, *b, "/t" + std::to_string(round++) + "/");
    }
  }
}

}  // namespace

TEST_CASE("set and get with binary and empty values", "[unit][integration]") {
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
    // SET has no reply, so only a round trip on the same handle orders it before what another
    // connection reads next.
    s.set(p + "k", std::string("overwritten"));
    CHECK(toString(s.get(p + "k")) == "overwritten");
    CHECK(toString(other.get(p + "k")) == "overwritten");
  });
}

TEST_CASE("add counts in decimal text", "[unit][integration]") {
  forEachStore([](Store& s, Store& other, const std::string& p) {
    CHECK(s.add(p + "c", 5) == 5);
    CHECK(other.add(p + "c", -2) == 3);
    CHECK(s.add(p + "c", 0) == 3);
    CHECK(toString(other.get(p + "c")) == "3");
    s.set(p + "text", std::string("abc"));
    CHECK_THROWS_AS(s.add(p + "text", 1), StoreError);
  });
}

TEST_CASE("compareSet's four cases", "[unit][integration]") {
  forEachStore([](Store& s, Store& other, const std::string& p) {
    CHECK(toString(s.compareSet(p + "k", {}, toBytes("first"))) == "first");
    CHECK(toString(s.compareSet(p + "missing", toBytes("x"), toBytes("y"))) == "x");
    CHECK_FALSE(other.check({p + "missing"}));
    CHECK(toString(s.compareSet(p + "k", toBytes("first"), toBytes("second"))) == "second");
    CHECK(toString(s.compareSet(p + "k", toBytes("nomatch"), toBytes("third"))) == "second");
    CHECK(toString(other.get(p + "k")) == "second");
  });
}

TEST_CASE("check and deleteKey and numKeys", "[unit][integration]") {
  forEachStore([](Store& s, Store& other, const std::string& p) {
    int64_t before = s.numKeys();
    CHECK_FALSE(s.check({p + "a"}));
    s.set(p + "a", std::string("1"));
    s.set(p + "b", std::string("2"));
    CHECK(s.check({p + "a", p + "b"}));  // a round trip: both SETs were applied
    CHECK(other.check({p + "a", p + "b"}));
    CHECK_FALSE(other.check({p + "a", p + "nope"}));
    CHECK(s.numKeys() == before + 2);
    CHECK(other.deleteKey(p + "a"));
    CHECK_FALSE(other.deleteKey(p + "a"));
    CHECK(s.numKeys() == before + 1);
    CHECK_FALSE(s.check({p + "a"}));
  });
}

TEST_CASE("wait returns once another handle writes and times out otherwise",
          "[unit][integration]") {
  forEachStore([](Store& s, Store& other, const std::string& p) {
    std::thread writer([&] {
      // Synchronise on the store itself: write once the waiter announced itself.
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
    // The handle still works after a timed-out wait (legacy: reconnects; V2: CANCEL_WAIT).
    s.set(p + "after", std::string("ok"));
    CHECK(toString(s.get(p + "after")) == "ok");
    CHECK(s.add(p + "n", 1) == 1);
  });
}

TEST_CASE("get times out on a key nobody writes", "[unit][integration]") {
  forEachStore([](Store& s, Store&, const std::string& p) {
    s.setTimeout(200ms);
    CHECK_THROWS_AS(s.get(p + "absent"), StoreTimeout);
    s.setTimeout(10s);
    s.set(p + "present", std::string("x"));
    CHECK(toString(s.get(p + "present")) == "x");
  });
}

TEST_CASE("multiGet and multiSet and append", "[unit][integration]") {
  forEachStore([](Store& s, Store& other, const std::string& p) {
    s.multiSet({p + "x", p + "y"}, {toBytes("1"), toBytes("22")});
    auto values = other.multiGet({p + "y", p + "x"});
    REQUIRE(values.size() == 2);
    CHECK(toString(values[0]) == "22");
    CHECK(toString(values[1]) == "1");
    s.append(p + "log", toBytes("a"));
    // APPEND has no reply: a round trip on the same handle orders it before the next append
    // from another connection.
    CHECK(toString(s.get(p + "log")) == "a");
    other.append(p + "log", toBytes("bc"));
    CHECK(toString(s.get(p + "log")) == "abc");
    CHECK_THROWS_AS(s.multiSet({p + "only-key"}, {}), StoreError);
  });
}

TEST_CASE("concurrent adds from many threads are never lost", "[unit][integration]") {
  forEachStore([](Store& s, Store&, const std::string& p) {
    constexpr int kThreads = 8;
    constexpr int kAdds = 200;
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&] {
        for (int i = 0; i < kAdds; ++i) s.add(p + "counter", 1);
      });
    }
    for (auto& t : threads) t.join();
    CHECK(s.add(p + "counter", 0) == kThreads * kAdds);
  });
}
