// GlooStore with the real gloo (Debian's libgloo-dev) over a real cpprun TCP store server.
#include "examples/mnist/gloo_store.h"

#include <gloo/allreduce_ring.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <future>
#include <thread>

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

TEST_CASE("two gloo ranks meet through cpprun's TCP store and all-reduce",
          "[integration][mnist][gloo]") {
  auto server = cpprun::rendezvous::BackgroundTcpStoreServer::start({});
  REQUIRE(server.isOk());
  const uint16_t port = server.value()->port();
  auto rank = [port](int r) {
    GlooStore store(client(port), "gloo/", 20s);
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(r, 2);
    context->setTimeout(20s);
    context->connectFullMesh(store, device);
    std::vector<float> data = {static_cast<float>(r + 1), 10.0f * static_cast<float>(r + 1)};
    gloo::AllreduceRing<float> allreduce(context, {data.data()}, static_cast<int>(data.size()));
    allreduce.run();
    return data;
  };
  auto r1 = std::async(std::launch::async, rank, 1);
  std::vector<float> d0 = rank(0);
  REQUIRE(r1.wait_for(30s) == std::future_status::ready);
  std::vector<float> d1 = r1.get();
  CHECK(d0 == std::vector<float>{3.0f, 30.0f});
  CHECK(d1 == std::vector<float>{3.0f, 30.0f});
}
