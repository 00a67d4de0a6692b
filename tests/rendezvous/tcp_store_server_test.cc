// The TCP server itself: binding, many concurrent clients, deferred WAIT replies, shutdown.
#include "rendezvous/tcp_store_server.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <thread>

#include "rendezvous/tcp_store_client.h"
#include "tests/support/test_support.h"

namespace {

using namespace cpprun::rendezvous;
using namespace cpprun::testing;
namespace wire = cpprun::rendezvous::wire;

TcpStoreClientOptions clientOptions(uint16_t port) {
  TcpStoreClientOptions o;
  o.port = port;
  o.timeout = 10s;
  o.connect_timeout = 5s;
  return o;
}

}  // namespace

TEST_CASE("port 0 binds a free port on the given address only", "[integration]") {
  TcpStoreServerOptions options;
  options.host = "127.0.0.1";
  auto server = BackgroundTcpStoreServer::start(options);
  REQUIRE(server.isOk());
  CHECK(server.value()->host() == "127.0.0.1");
  CHECK(server.value()->port() != 0);
  // Another loopback address of the same machine is not served.
  TcpStoreClientOptions o = clientOptions(server.value()->port());
  o.host = "127.0.0.2";
  o.connect_timeout = 200ms;
  CHECK_THROWS_AS(TcpStoreClient(o), StoreTimeout);
}

TEST_CASE("a port in use and a bad host are clear errors", "[integration]") {
  auto first = BackgroundTcpStoreServer::start({});
  REQUIRE(first.isOk());
  TcpStoreServerOptions options;
  options.port = first.value()->port();
  auto second = BackgroundTcpStoreServer::start(options);
  REQUIRE_FALSE(second.isOk());
  CHECK_THAT(second.status().message(),
             Catch::Contains("bind 127.0.0.1:" + std::to_string(options.port)));
  CHECK_THAT(second.status().message(), Catch::Contains("in use"));
  options.port = 0;
  options.host = "no-such-host.invalid";
  auto third = BackgroundTcpStoreServer::start(options);
  REQUIRE_FALSE(third.isOk());
  CHECK_THAT(third.status().message(), Catch::Contains("no-such-host.invalid"));
}

TEST_CASE("the client retries until the server comes up", "[integration]") {
  // Reserve a port, free it, and start the server there only after the client began.
  uint16_t port;
  {
    auto probe = BackgroundTcpStoreServer::start({});
    REQUIRE(probe.isOk());
    port = probe.value()->port();
  }
  std::atomic<bool> connected{false};
  std::thread client([&] {
    TcpStoreClient c(clientOptions(port));
    c.set("/up", std::string("1"));
    connected = true;
  });
  TcpStoreServerOptions options;
  options.port = port;
  auto server = BackgroundTcpStoreServer::start(options);
  REQUIRE(server.isOk());
  client.join();
  CHECK(connected);
  TcpStoreClient check(clientOptions(port));
  CHECK(toString(check.get("/up")) == "1");
}

TEST_CASE("connecting to nothing gives up after the connect timeout", "[integration]") {
  uint16_t port;
  {
    auto probe = BackgroundTcpStoreServer::start({});
    REQUIRE(probe.isOk());
    port = probe.value()->port();
  }
  TcpStoreClientOptions o = clientOptions(port);
  o.connect_timeout = 300ms;
  auto start = std::chrono::steady_clock::now();
  try {
    TcpStoreClient c(o);
    FAIL("connected to a closed port");
  } catch (const StoreTimeout& e) {
    CHECK_THAT(e.what(), Catch::Contains("Connection refused"));
  }
  auto took = std::chrono::steady_clock::now() - start;
  CHECK(took >= 300ms);
  CHECK(took < 3s);
}

// Polls the server's own counters (bounded) until `done` holds.
template <typename Pred>
bool eventually(BackgroundTcpStoreServer& server, Pred done) {
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done(server.stats())) return true;
    std::this_thread::yield();
  }
  return false;
}

TEST_CASE("many clients wait on one key and are all woken by one set", "[integration]") {
  auto server = BackgroundTcpStoreServer::start({});
  REQUIRE(server.isOk());
  uint16_t port = server.value()->port();
  constexpr int kWaiters = 64;
  std::atomic<int> woken{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kWaiters; ++i) {
    threads.emplace_back([&] {
      TcpStoreClient c(clientOptions(port));
      c.wait({"/go"}, 10s);
      ++woken;
    });
  }
  CHECK(eventually(*server.value(),
                   [](const TcpStoreServerStats& s) { return s.pending_waits == kWaiters; }));
  CHECK(woken == 0);
  TcpStoreClient leader(clientOptions(port));
  leader.set("/go", std::string("1"));
  for (auto& t : threads) t.join();
  CHECK(woken == kWaiters);
  CHECK(server.value()->stats().pending_waits == 0);
}

TEST_CASE("ten thousand waits on one key are all released by one set", "[integration]") {
  // 500 connections with 20 WAITs each: the probe's 10,000 waiters without 20,000 descriptors.
  auto server = BackgroundTcpStoreServer::start({});
  REQUIRE(server.isOk());
  uint16_t port = server.value()->port();
  constexpr int kConnections = 500;
  constexpr int kWaitsEach = 20;
  Bytes waits = fromHex("00cef7853c");  // VALIDATE: torch >= 2.2 numbering
  for (int i = 0; i < kWaitsEach; ++i) {
    waits.push_back(6);  // WAIT ["/go"]
    wire::appendU64(&waits, 1);
    wire::appendString(&waits, "/go");
  }
  std::vector<RawConnection> waiters;
  waiters.reserve(kConnections);
  for (int i = 0; i < kConnections; ++i) {
    waiters.emplace_back("127.0.0.1", port);
    waiters.back().send(waits);
  }
  REQUIRE(eventually(*server.value(), [](const TcpStoreServerStats& s) {
    return s.pending_waits == kConnections * kWaitsEach;
  }));
  CHECK(waiters.front().silentFor(10ms));  // nobody answered yet
  auto start = std::chrono::steady_clock::now();
  TcpStoreClient(clientOptions(port)).set("/go", std::string("1"));
  for (auto& w : waiters) {
    auto released = w.read(kWaitsEach, 10s);
    REQUIRE(released.has_value());
    CHECK(*released == Bytes(kWaitsEach, 0));  // STOP_WAITING, once per WAIT
  }
  CHECK(std::chrono::steady_clock::now() - start < 10s);
  CHECK(server.value()->stats().pending_waits == 0);
}

TEST_CASE("a wait that times out is cancelled on the server (torch >= 2.2 dialect)",
          "[integration]") {
  auto server = BackgroundTcpStoreServer::start({});
  REQUIRE(server.isOk());
  TcpStoreClient c(clientOptions(server.value()->port()));
  CHECK_THROWS_AS(c.wait({"/absent"}, 100ms), StoreTimeout);
  CHECK(server.value()->stats().pending_waits == 0);
  CHECK(server.value()->stats().connections_open == 1);  // same connection, still usable
  CHECK(c.add("/x", 2) == 2);
}

TEST_CASE("a wake-up racing the cancel is consumed by the client", "[integration]") {
  auto server = BackgroundTcpStoreServer::start({});
  REQUIRE(server.isOk());
  uint16_t port = server.value()->port();
  TcpStoreClient setter(clientOptions(port));
  // Many short waits with the key set at about the same time: whichever of 00 / 01 arrives
  // first, the stream must stay in sync (checked by the add that follows each wait).
  for (int i = 0; i < 50; ++i) {
    TcpStoreClient waiter(clientOptions(port));
    std::string key = "/race" + std::to_string(i);
    std::thread t([&] { setter.set(key, std::string("v")); });
    try {
      waiter.wait({key}, std::chrono::milliseconds(i % 3));
    } catch (const StoreTimeout&) {
    }
    t.join();
    CHECK(waiter.add("/sync" + std::to_string(i), 7) == 7);
  }
}

TEST_CASE("torch 2.2+ extras - ping queues list keys barrier", "[integration]") {
  auto server = BackgroundTcpStoreServer::start({});
  REQUIRE(server.isOk());
  uint16_t port = server.value()->port();
  TcpStoreClient c(clientOptions(port));
  CHECK(c.ping(0xabcdef) == 0xabcdef);
  c.queuePush("/q", toBytes("one"));
  c.queuePush("/q", toBytes("two"));
  CHECK(c.queueLength("/q") == 2);
  CHECK(toString(c.queuePop("/q")) == "one");
  CHECK(toString(c.queuePop("/q")) == "two");
  CHECK(c.queueLength("/q") == 0);
  c.set("/a", std::string("1"));
  c.set("/b", std::string("2"));
  auto keys = c.listKeys();
  std::sort(keys.begin(), keys.end());
  CHECK(keys == std::vector<std::string>{"/a", "/b"});
  std::thread other([&] {
    TcpStoreClient peer(clientOptions(port));
    peer.barrier("/bar", 2, 10s);
  });
  c.barrier("/bar", 2, 10s);
  other.join();
  CHECK_THROWS_AS(c.barrier("/lonely", 2, 100ms), StoreTimeout);
  CHECK(c.add("/after-barrier", 1) == 1);  // still in sync after the cancel

  TcpStoreClientOptions legacy = clientOptions(port);
  legacy.dialect = cpprun::rendezvous::wire::Dialect::kLegacy;
  TcpStoreClient old(legacy);
  CHECK_THROWS_AS(old.ping(1), StoreError);
}

TEST_CASE("a request the server answers by closing the connection is named in the error",
          "[integration]") {
  // All a client sees of a rejected or unknown request is the server closing the connection
  // (torch's legacy server on QUEUE_*, any server on ADD to a non-numeric value); the error
  // must say which request that was, and the next call reconnects.
  auto server = BackgroundTcpStoreServer::start({});
  REQUIRE(server.isOk());
  TcpStoreClient c(clientOptions(server.value()->port()));
  c.set("/text", std::string("not a number"));
  CHECK_THROWS_WITH(c.add("/text", 1), Catch::Contains("while awaiting the reply to ADD") &&
                                           Catch::Contains("rejects or does not support"));
  CHECK(toString(c.get("/text")) == "not a number");
}

TEST_CASE("a blocking queue pop waits for a push", "[integration]") {
  auto server = BackgroundTcpStoreServer::start({});
  REQUIRE(server.isOk());
  uint16_t port = server.value()->port();
  std::thread producer([&] {
    TcpStoreClient p(clientOptions(port));
    p.wait({"/consumer-ready"}, 10s);
    p.queuePush("/jobs", toBytes("job-1"));
  });
  TcpStoreClient consumer(clientOptions(port));
  consumer.set("/consumer-ready", std::string("1"));
  CHECK(toString(consumer.queuePop("/jobs")) == "job-1");
  producer.join();
}

TEST_CASE("replies to requests sent just before a half-close are still delivered",
          "[integration]") {
  auto server = BackgroundTcpStoreServer::start({});
  REQUIRE(server.isOk());
  RawConnection c("127.0.0.1", server.value()->port());
  // ADD /n 5, then GETNUMKEYS, then EOF from the client (like `printf ... | nc`).
  c.sendHex(
      "0302000000000000002f6e0500000000000000"
      "06");
  c.shutdownWrite();
  auto reply = c.read(16, 5s);
  REQUIRE(reply.has_value());
  CHECK(toHex(*reply) ==
        "0500000000000000"
        "0100000000000000");
  CHECK(c.closedByPeer(5s));
}

TEST_CASE("several listening sockets share the port and every client is served", "[integration]") {
  TcpStoreServerOptions options;
  options.listen_sockets = 4;
  auto server = BackgroundTcpStoreServer::start(options);
  REQUIRE(server.isOk());
  CHECK(server.value()->stats().listen_sockets == 4);
  // The kernel hashes each connection to one of the four queues: with 64 connections every
  // queue gets some (all four missing none has probability ~4e-8), and a queue that nobody
  // accepted from would leave its clients hanging until their timeout.
  constexpr int kClients = 64;
  std::vector<std::unique_ptr<TcpStoreClient>> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(std::make_unique<TcpStoreClient>(clientOptions(server.value()->port())));
    clients.back()->set("/k" + std::to_string(i), std::to_string(i));
  }
  for (int i = 0; i < kClients; ++i) {  // each key read back over another connection
    auto value = clients[static_cast<size_t>((i + 1) % kClients)]->get("/k" + std::to_string(i));
    CHECK(std::string(value.begin(), value.end()) == std::to_string(i));
  }
  auto stats = server.value()->stats();
  CHECK(stats.connections_accepted == kClients);
  CHECK(stats.connections_open == kClients);
}

TEST_CASE("more expected clients than one accept queue holds open more listening sockets",
          "[integration]") {
  TcpStoreServerOptions options;
  auto one = BackgroundTcpStoreServer::start(options);
  REQUIRE(one.isOk());
  CHECK(one.value()->stats().listen_sockets == 1);  // unknown: one socket, as before
  options.expected_clients = 1u << 30;              // more than 32 queues of any backlog
  auto many = BackgroundTcpStoreServer::start(options);
  REQUIRE(many.isOk());
  CHECK(many.value()->stats().listen_sockets == 32);  // capped
  TcpStoreClient client(clientOptions(many.value()->port()));
  client.set("/x", std::string("1"));
  CHECK(client.check({"/x"}));
}

TEST_CASE("a port held by a server with several sockets is still in use for the next one",
          "[integration]") {
  TcpStoreServerOptions options;
  options.listen_sockets = 4;
  auto first = BackgroundTcpStoreServer::start(options);
  REQUIRE(first.isOk());
  options.port = first.value()->port();
  for (size_t sockets : {size_t{1}, size_t{4}}) {
    options.listen_sockets = sockets;
    auto second = BackgroundTcpStoreServer::start(options);
    REQUIRE_FALSE(second.isOk());
    CHECK(second.status().code() == cpprun::StatusCode::kAlreadyExists);
    CHECK_THAT(second.status().message(), Catch::Contains("in use"));
  }
}

TEST_CASE("a port another program holds is in use for a server with several sockets",
          "[integration]") {
  // A listening socket of our own stands for the other program (no SO_REUSEPORT).
  auto holder = BackgroundTcpStoreServer::start({});
  REQUIRE(holder.isOk());
  TcpStoreServerOptions options;
  options.port = holder.value()->port();
  options.listen_sockets = 4;
  auto second = BackgroundTcpStoreServer::start(options);
  REQUIRE_FALSE(second.isOk());
  CHECK(second.status().code() == cpprun::StatusCode::kAlreadyExists);
  CHECK_THAT(second.status().message(), Catch::Contains("in use"));
}
