// GlooStore with the real gloo (Debian's libgloo-dev) over a real cpprun TCP store server.
#include "examples/mnist/gloo_store.h"

#include <gloo/common/error.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <future>
#include <thread>

#include "examples/mnist/communicator.h"
#include "rendezvous/memory_store.h"
#include "rendezvous/tcp_store_client.h"
#include "rendezvous/tcp_store_server.h"

using cpprun::mnist::GlooStore;
using namespace std::chrono_literals;

namespace {

std::shared_ptr<cpprun::rendezvous::TcpStoreClient> client(uint16_t port) {
  cpprun::rendezvous::TcpStoreClientOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.connect_timeout = 10s;
  o.timeout = 30s;
  return std::make_shared<cpprun::rendezvous::TcpStoreClient>(o);
}

}  // namespace

TEST_CASE("gloo store: values round-trip under the prefix", "[unit][mnist][gloo]") {
  auto memory = std::make_shared<cpprun::rendezvous::MemoryStore>();
  GlooStore store(memory, "gloo/run1/", 1s);
  store.set("rank_0", {'a', 'b', '\0', 'c'});
  CHECK(store.get("rank_0") == std::vector<char>{'a', 'b', '\0', 'c'});
  CHECK(memory->check({"gloo/run1/rank_0"}));
  CHECK_FALSE(memory->check({"rank_0"}));
}

TEST_CASE("gloo store: a timed wait really times out, naming the missing keys",
          "[unit][mnist][gloo]") {
  auto memory = std::make_shared<cpprun::rendezvous::MemoryStore>();
  GlooStore store(memory, "p/", 30s);
  store.set("here", {'1'});
  const auto start = std::chrono::steady_clock::now();
  try {
    store.wait({"here", "absent"}, 200ms);
    FAIL("wait returned although a key is missing");
  } catch (const gloo::IoException& e) {
    const std::string what = e.what();
    CHECK_THAT(what, Catch::Contains("p/absent") && Catch::Contains("200 ms"));
    CHECK(what.find("p/here") == std::string::npos);
  }
  const auto took = std::chrono::steady_clock::now() - start;
  CHECK(took >= 200ms);
  CHECK(took < 5s);
}

TEST_CASE("two gloo ranks meet through cpprun's TCP store: all-reduce, broadcast, barrier, finish",
          "[integration][mnist][gloo]") {
  auto server = cpprun::rendezvous::BackgroundTcpStoreServer::start({});
  REQUIRE(server.isOk());
  const uint16_t port = server.value()->port();
  struct Seen {
    std::vector<float> sum;
    std::vector<double> dsum;
    std::vector<float> broadcast;
  };
  auto rank = [port](int r) {
    cpprun::mnist::GlooOptions options;
    options.rank = r;
    options.world_size = 2;
    options.prefix = "test/attempt_0/";
    options.hostname = "127.0.0.1";
    options.timeout = 20s;
    auto comm = cpprun::mnist::makeGlooCommunicator(client(port), options);
    Seen seen;
    seen.sum = {static_cast<float>(r + 1), 10.0f * static_cast<float>(r + 1)};
    comm->allreduceSum(seen.sum.data(), seen.sum.size());
    seen.dsum = {0.5 * (r + 1)};
    comm->allreduceSum(seen.dsum.data(), seen.dsum.size());
    seen.broadcast = {static_cast<float>(r), static_cast<float>(r)};
    comm->broadcast(seen.broadcast.data(), seen.broadcast.size(), 1);
    comm->barrier();
    // Without finish() the first rank to tear down resets its sockets under the other's last
    // read (gloo closes with SO_LINGER 0), which is how this test once failed in CI.
    comm->finish();
    return seen;
  };
  auto r1 = std::async(std::launch::async, rank, 1);
  Seen s0 = rank(0);
  REQUIRE(r1.wait_for(30s) == std::future_status::ready);
  Seen s1 = r1.get();
  for (const Seen& s : {s0, s1}) {
    CHECK(s.sum == std::vector<float>{3.0f, 30.0f});
    CHECK(s.dsum == std::vector<double>{1.5});
    CHECK(s.broadcast == std::vector<float>{1.0f, 1.0f});
  }
}

TEST_CASE("a gloo rank whose peer never comes fails within its timeout, naming the keys",
          "[integration][mnist][gloo]") {
  auto server = cpprun::rendezvous::BackgroundTcpStoreServer::start({});
  REQUIRE(server.isOk());
  cpprun::mnist::GlooOptions options;
  options.rank = 0;
  options.world_size = 2;
  options.prefix = "lonely/";
  options.hostname = "127.0.0.1";
  options.timeout = 300ms;
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(cpprun::mnist::makeGlooCommunicator(client(server.value()->port()), options),
                    Catch::Contains("lonely/gloo/"));
  CHECK(std::chrono::steady_clock::now() - start < 10s);
}
