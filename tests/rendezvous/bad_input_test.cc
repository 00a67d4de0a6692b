// Hostile and broken clients: the server drops only the offender and keeps serving the others.
#include <algorithm>
#include <catch2/catch.hpp>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/logging.h"
#include "common/system.h"
#include "rendezvous/tcp_store_client.h"
#include "rendezvous/tcp_store_server.h"
#include "tests/support/test_support.h"

namespace {

using namespace cpprun::rendezvous;
using namespace cpprun::testing;
namespace wire = cpprun::rendezvous::wire;

std::unique_ptr<TcpStoreClient> client(uint16_t port) {
  TcpStoreClientOptions o;
  o.port = port;
  o.timeout = 5s;
  o.connect_timeout = 5s;
  return std::make_unique<TcpStoreClient>(o);
}

// A healthy client still gets correct answers.
void expectServing(uint16_t port) {
  auto c = client(port);
  int64_t n = c->add("/healthy", 1);
  CHECK(n >= 1);
  c->set("/probe", std::string("alive"));
  CHECK(toString(c->get("/probe")) == "alive");
}

// torch >= 2.2 frames (VALIDATE first, then its numbering).
Bytes v2Handshake() { return fromHex("00cef7853c"); }
void appendKey(Bytes* out, const std::string& key) { wire::appendString(out, key); }

}  // namespace

TEST_CASE("random bytes close only that connection", "[integration]") {
  auto server = BackgroundTcpStoreServer::start({});
  REQUIRE(server.isOk());
  uint16_t port = server.value()->port();
  auto bystander = client(port);
  bystander->set("/before", std::string("x"));
  std::mt19937 rng(1234);
  int closed = 0;
  for (int round = 0; round < 200; ++round) {
    RawConnection c("127.0.0.1", port);
    Bytes junk(1 + rng() % 512);
    for (auto& byte : junk) byte = static_cast<uint8_t>(rng());
    c.send(junk);
    // Either dropped, or parsed as something harmless / incomplete: never a crash.
    if (c.closedByPeer(50ms)) ++closed;
  }
  CHECK(closed > 0);
  CHECK(toString(bystander->get("/before")) == "x");
  expectServing(port);
  CHECK(server.value()->stats().connections_dropped >= static_cast<uint64_t>(closed));
}

TEST_CASE("unknown query types and oversized or malformed frames are dropped", "[integration]") {
  TcpStoreServerOptions options;
  options.limits.max_key_bytes = 64;
  options.limits.max_value_bytes = 1024;
  options.limits.max_keys_per_request = 10;
  auto server = BackgroundTcpStoreServer::start(options);
  REQUIRE(server.isOk());
  uint16_t port = server.value()->port();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"unknown legacy type 12 (none in torch 1.13 or 2.1)", "0c01000000000000006b"},
      {"too many keys in a torch 2.1 MULTI_GET (type 9)", "090b00000000000000"},
      {"unknown V2 type 19", "00cef7853c13"},
      {"V2 VALIDATE with a wrong magic later", "00cef7853c0012345678"},
      {"key over the limit", "024100000000000000"},
      {"value over the limit", "0001000000000000006b0104000000000000"},
      {"too many keys", "050b00000000000000"},
      {"absurd key length", "02ffffffffffffffff"},
      {"GET of a missing key (legacy)", "0205000000000000002f6e6f6e65"},
      {"ADD on a non-numeric value",
       "0002000000000000002f74010000000000000078"
       "0302000000000000002f740100000000000000"},
  };
  for (const auto& [what, hex] : cases) {
    INFO(what);
    RawConnection c("127.0.0.1", port);
    c.sendHex(hex);
    CHECK(c.closedByPeer(5s));
  }
  expectServing(port);
}

TEST_CASE("a truncated frame followed by EOF is discarded", "[integration]") {
  auto server = BackgroundTcpStoreServer::start({});
  REQUIRE(server.isOk());
  uint16_t port = server.value()->port();
  {
    RawConnection c("127.0.0.1", port);
    c.sendHex("0005000000000000002f6b65");  // SET, key cut short
    c.shutdownWrite();
    CHECK(c.closedByPeer(5s));
  }
  auto check = client(port);
  CHECK_FALSE(check->check({"/ke"}));
  CHECK(check->numKeys() == 0);
}

TEST_CASE("a client that sends half a request and goes silent stalls nobody", "[integration]") {
  auto server = BackgroundTcpStoreServer::start({});
  REQUIRE(server.isOk());
  uint16_t port = server.value()->port();
  RawConnection slow("127.0.0.1", port);
  slow.sendHex("0005000000000000002f");  // half a SET; torch's legacy server blocks on this
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 50; ++i) expectServing(port);
  CHECK(std::chrono::steady_clock::now() - start < 10s);
  // The slow client finishes its request later and it is applied.
  slow.sendHex("736c6f77010000000000000031");  // "slow" = "1"
  auto c = client(port);
  c->wait({"/slow"}, 5s);
  CHECK(toString(c->get("/slow")) == "1");
}

TEST_CASE("a client vanishing mid-WAIT is forgotten and others are still woken", "[integration]") {
  auto server = BackgroundTcpStoreServer::start({});
  REQUIRE(server.isOk());
  uint16_t port = server.value()->port();
  auto waiter = client(port);
  {
    RawConnection vanishing("127.0.0.1", port);
    vanishing.sendHex("05010000000000000005000000000000002f676f6e65");  // WAIT ["/gone"]
    // Make sure the server registered the wait before the client disappears.
    auto c = client(port);
    for (int i = 0; i < 1000 && server.value()->stats().pending_waits == 0; ++i) c->numKeys();
    REQUIRE(server.value()->stats().pending_waits == 1);
  }  // closed here with the wait pending
  auto c = client(port);
  for (int i = 0; i < 1000 && server.value()->stats().pending_waits != 0; ++i) c->numKeys();
  CHECK(server.value()->stats().pending_waits == 0);
  std::thread t([&] { waiter->wait({"/gone"}, 5s); });
  c->set("/gone", std::string("now"));
  t.join();
  expectServing(port);
}

TEST_CASE("thousands of idle connections do not slow the others down", "[integration]") {
  // Both ends of every connection live in this process.
  uint64_t fd_limit = cpprun::raiseOpenFileLimit();
  size_t idle_count = std::min<size_t>(3000, (fd_limit - 200) / 2);
  INFO("open-file limit " << fd_limit << ", idle connections " << idle_count);
  REQUIRE(idle_count >= 1000);

  auto server = BackgroundTcpStoreServer::start({});
  REQUIRE(server.isOk());
  uint16_t port = server.value()->port();
  std::vector<RawConnection> idle;
  idle.reserve(idle_count);
  for (size_t i = 0; i < idle_count; ++i) idle.emplace_back("127.0.0.1", port);
  // Half of them are 1.13-style silent callback connections, half sent part of a request.
  for (size_t i = 0; i < idle_count; i += 2) idle[i].sendHex("03");
  auto c = client(port);
  for (int i = 0; i < 1000 && server.value()->stats().connections_open < idle_count + 1; ++i) {
    c->numKeys();
  }
  CHECK(server.value()->stats().connections_open == idle_count + 1);
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 200; ++i) c->add("/busy", 1);
  auto took = std::chrono::steady_clock::now() - start;
  CHECK(took < 5s);
  CHECK(c->add("/busy", 0) == 200);
}

TEST_CASE("the connection cap refuses extra clients with a warning and serves the rest",
          "[integration]") {
  TcpStoreServerOptions options;
  options.max_connections = 3;
  auto server = BackgroundTcpStoreServer::start(options);
  REQUIRE(server.isOk());
  uint16_t port = server.value()->port();
  auto a = client(port);
  RawConnection b("127.0.0.1", port);
  RawConnection c("127.0.0.1", port);
  RawConnection over("127.0.0.1", port);
  CHECK(over.closedByPeer(5s));
  CHECK(a->add("/n", 1) == 1);
  CHECK(server.value()->stats().connections_rejected >= 1);
}

TEST_CASE("a flood of connections over the cap writes at most 5 warning lines per 10 s",
          "[integration]") {
  // Every log line of this process, while the test runs.
  std::mutex mutex;
  std::vector<std::string> lines;
  cpprun::setLogSink([&](std::string line) {
    std::lock_guard<std::mutex> lock(mutex);
    lines.push_back(std::move(line));
  });
  TcpStoreServerOptions options;
  options.max_connections = 1;
  auto server = BackgroundTcpStoreServer::start(options);
  REQUIRE(server.isOk());
  const uint16_t port = server.value()->port();
  auto held = client(port);
  for (int i = 0; i < 30; ++i) {
    RawConnection over("127.0.0.1", port);
    CHECK(over.closedByPeer(5s));  // refused: its warning, if any, is written by now
  }
  CHECK(server.value()->stats().connections_rejected == 30);
  CHECK(held->add("/n", 1) == 1);
  cpprun::setLogSink(nullptr);
  size_t refusals = 0;
  for (const std::string& line : lines) {
    if (line.find("refusing connection from") != std::string::npos) ++refusals;
  }
  CHECK(refusals == 5);  // before: 30, one per connection
  CHECK(std::count_if(lines.begin(), lines.end(), [](const std::string& l) {
          return l.find("the warning limit of 5 per 10 s is reached") != std::string::npos;
        }) == 1);
}

TEST_CASE("a client that never reads its replies is dropped at the output cap", "[integration]") {
  TcpStoreServerOptions options;
  options.max_pending_output_bytes = 1 << 20;
  auto server = BackgroundTcpStoreServer::start(options);
  REQUIRE(server.isOk());
  uint16_t port = server.value()->port();
  auto c = client(port);
  c->set("/big", Bytes(64 * 1024, 'x'));
  REQUIRE(c->check({"/big"}));  // a round trip: the SET is applied
  RawConnection greedy("127.0.0.1", port);
  Bytes get = fromHex("0204000000000000002f626967");  // GET /big, 64 KiB reply each
  Bytes burst;
  for (int i = 0; i < 16; ++i) burst.insert(burst.end(), get.begin(), get.end());
  // Up to 64 MiB of replies requested, none read: kernel buffers fill, then the cap trips.
  bool dropped = false;
  for (int round = 0; round < 64 && !dropped; ++round) {
    try {
      greedy.send(burst);
    } catch (const std::exception&) {
      dropped = true;  // reset by the server
    }
    dropped = dropped || server.value()->stats().connections_dropped > 0;
  }
  CHECK(dropped);
  CHECK(server.value()->stats().connections_dropped == 1);
  expectServing(port);
}

TEST_CASE("an unfinished request over the request budget closes only that connection",
          "[integration]") {
  TcpStoreServerOptions options;
  options.limits.max_value_bytes = 256 * 1024;
  options.max_request_bytes = 1024 * 1024;
  auto server = BackgroundTcpStoreServer::start(options);
  REQUIRE(server.isOk());
  uint16_t port = server.value()->port();
  auto bystander = client(port);
  // The largest requests the field limits allow still fit the budget.
  Bytes biggest(options.limits.max_value_bytes, 'v');
  bystander->set("/max", biggest);
  CHECK(bystander->compareSet("/max", biggest, biggest) == biggest);

  // A MULTI_SET announcing 131,072 values of 256 KiB (32 GiB), sent for as long as the server
  // takes it.
  RawConnection giant("127.0.0.1", port);
  Bytes head = v2Handshake();
  wire::appendU8(&head, 11);  // MULTI_SET
  wire::appendU64(&head, 131072);
  giant.send(head);
  Bytes value_chunk(64 * 1024, 'x');
  size_t sent = head.size();
  bool reset = false;
  for (int pair = 0; pair < 131072 && !reset; ++pair) {
    Bytes pair_head;
    appendKey(&pair_head, "/k" + std::to_string(pair));
    wire::appendU64(&pair_head, options.limits.max_value_bytes);
    try {
      giant.send(pair_head);
      for (int i = 0; i < 4; ++i) giant.send(value_chunk);
    } catch (const std::exception&) {
      reset = true;  // the server closed the connection and the kernel said so
    }
    sent += pair_head.size() + 4 * value_chunk.size();
    if (server.value()->stats().dropped(DropReason::kRequestBudget) > 0) break;
    REQUIRE(sent < 64u * 1024 * 1024);  // 64 times the budget: it was never cut off
  }
  if (!reset) CHECK(giant.closedByPeer(5s));
  auto stats = server.value()->stats();
  CHECK(stats.dropped(DropReason::kRequestBudget) == 1);
  CHECK(stats.connections_dropped == 1);
  // The server read at most the budget plus one read (64 KiB) of it, besides the bystander's
  // two 256 KiB requests and their small change.
  CHECK(stats.bytes_received < options.max_request_bytes + 64 * 1024 + 3 * 270 * 1024);
  CHECK(bystander->get("/max") == biggest);
  expectServing(port);
}

TEST_CASE("a request budget below the largest request the limits allow is refused",
          "[integration]") {
  TcpStoreServerOptions options;
  options.limits.max_key_bytes = 100;
  options.limits.max_value_bytes = 1000;
  options.max_request_bytes = largestSingleKeyRequest(options.limits);
  CHECK(options.max_request_bytes == 1 + 24 + 100 + 2000);
  CHECK(BackgroundTcpStoreServer::start(options).isOk());
  options.max_request_bytes -= 1;
  auto refused = BackgroundTcpStoreServer::start(options);
  REQUIRE_FALSE(refused.isOk());
  CHECK(refused.status().code() == cpprun::StatusCode::kInvalidArgument);
  CHECK_THAT(refused.status().message(), Catch::Contains("request budget of 2124 bytes"));
  // The defaults fit torch's limits with room to spare.
  CHECK(TcpStoreServerOptions{}.max_request_bytes >= 3 * largestSingleKeyRequest(wire::Limits{}));
}

TEST_CASE("a MULTI_GET whose reply exceeds the output budget is refused before it is built",
          "[integration]") {
  TcpStoreServerOptions options;
  options.max_pending_output_bytes = 1024 * 1024;
  auto server = BackgroundTcpStoreServer::start(options);
  REQUIRE(server.isOk());
  uint16_t port = server.value()->port();
  auto c = client(port);
  c->set("/v", Bytes(64 * 1024, 'x'));
  REQUIRE(c->check({"/v"}));  // a round trip: the SET is applied
  RawConnection greedy("127.0.0.1", port);
  Bytes request = v2Handshake();
  wire::appendU8(&request, 10);     // MULTI_GET
  wire::appendU64(&request, 1000);  // a 64 MiB reply
  for (int i = 0; i < 1000; ++i) appendKey(&request, "/v");
  greedy.send(request);
  CHECK(greedy.closedByPeer(5s));
  auto stats = server.value()->stats();
  CHECK(stats.dropped(DropReason::kReplyBudget) == 1);
  CHECK(stats.bytes_sent < 2 * 64 * 1024);  // nothing of it went out
  // Fifteen copies fit (sixteen and their length fields would not).
  CHECK(c->multiGet(std::vector<std::string>(15, "/v")).size() == 15);
  expectServing(port);
}

TEST_CASE("garbage on many connections at once is dropped and counted with few warning lines",
          "[integration]") {
  TcpStoreServerOptions options;
  options.drop_warnings_per_interval = 5;
  options.drop_warning_interval = std::chrono::hours(1);  // one interval for the whole test
  auto server = BackgroundTcpStoreServer::start(options);
  REQUIRE(server.isOk());
  uint16_t port = server.value()->port();
  auto bystander = client(port);
  bystander->set("/before", std::string("x"));
  constexpr int kConnections = 300;
  std::mt19937 rng(4321);
  std::vector<RawConnection> junk;
  junk.reserve(kConnections);
  for (int i = 0; i < kConnections; ++i) {
    junk.emplace_back("127.0.0.1", port);
    // An unknown type byte (no torch numbers one above 18), then random bytes.
    Bytes bytes(1 + rng() % 256);
    for (auto& byte : bytes) byte = static_cast<uint8_t>(rng());
    bytes[0] = static_cast<uint8_t>(0x20 + rng() % 0xe0);
    junk.back().send(bytes);
  }
  auto start = std::chrono::steady_clock::now();
  int closed = 0;
  for (auto& c : junk) closed += c.closedByPeer(10s) ? 1 : 0;
  CHECK(closed == kConnections);
  CHECK(std::chrono::steady_clock::now() - start < 10s);
  auto stats = server.value()->stats();
  CHECK(stats.connections_dropped == kConnections);
  CHECK(stats.dropped(DropReason::kBadFrame) == kConnections);
  CHECK(stats.drop_warnings_suppressed == kConnections - 5);
  CHECK(toString(bystander->get("/before")) == "x");
  expectServing(port);
}

TEST_CASE("slowloris: requests sent a byte at a time delay no other client", "[integration]") {
  auto server = BackgroundTcpStoreServer::start({});
  REQUIRE(server.isOk());
  uint16_t port = server.value()->port();
  auto fast = client(port);
  constexpr int kSlow = 20;
  std::vector<RawConnection> slow;
  std::vector<Bytes> requests;
  for (int i = 0; i < kSlow; ++i) {
    slow.emplace_back("127.0.0.1", port);
    Bytes r = v2Handshake();
    wire::appendU8(&r, 1);                              // SET
    appendKey(&r, "/slow/" + std::to_string(100 + i));  // all the same length
    wire::appendBytes(&r, Bytes(200, static_cast<uint8_t>('a' + i)));
    requests.push_back(std::move(r));
  }
  // One byte from every slow client, then one round trip of the fast one: the slow requests
  // are unfinished during every fast request.
  std::chrono::steady_clock::duration slowest{};
  auto start = std::chrono::steady_clock::now();
  for (size_t pos = 0; pos < requests[0].size(); ++pos) {
    for (int i = 0; i < kSlow; ++i) slow[i].send(Bytes{requests[i][pos]});
    auto before = std::chrono::steady_clock::now();
    fast->add("/fast", 1);
    slowest = std::max(slowest, std::chrono::steady_clock::now() - before);
  }
  INFO("slowest fast request: "
       << std::chrono::duration_cast<std::chrono::milliseconds>(slowest).count() << " ms");
  CHECK(slowest < 1s);
  CHECK(std::chrono::steady_clock::now() - start < 30s);
  CHECK(fast->add("/fast", 0) == static_cast<int64_t>(requests[0].size()));
  // Every slow request arrived whole and was applied.
  for (int i = 0; i < kSlow; ++i) {
    CHECK(fast->get("/slow/" + std::to_string(100 + i)) ==
          Bytes(200, static_cast<uint8_t>('a' + i)));
  }
  CHECK(server.value()->stats().connections_dropped == 0);
}
