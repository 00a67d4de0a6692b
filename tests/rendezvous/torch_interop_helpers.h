// What the torch interop tests (torch_interop_test.cc for torch 1.13, torch2_interop_test.cc for
// the pinned torch 2.x) share: Python children with bounded waits, our server and client set up
// the same way, the values the store scripts write, and the checks of the operations every
// torch server serves alike, asserted against torch's answers.
// Thread safety: none; each test uses these from its own thread.
#pragma once

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "rendezvous/store.h"
#include "rendezvous/tcp_store_client.h"
#include "rendezvous/tcp_store_server.h"
#include "rendezvous/wire.h"
#include "tests/support/test_support.h"

namespace cpprun::testing::interop {

using rendezvous::BackgroundTcpStoreServer;
using rendezvous::TcpStoreClient;
using rendezvous::TcpStoreClientOptions;
using Millis = std::chrono::milliseconds;

// Environment for every Python child: output unbuffered, so lines arrive as they are printed.
inline std::map<std::string, std::string> pythonEnv(std::map<std::string, std::string> extra = {}) {
  extra["PYTHONUNBUFFERED"] = "1";
  return extra;
}

// Waits (bounded) for a line of `child` starting with `prefix` and returns it.
inline std::string requireLine(ChildProcess& child, const std::string& name,
                               const std::string& prefix, Millis timeout) {
  auto line = child.waitForLine(prefix, timeout);
  INFO(name << " printed no line starting with '" << prefix << "' within " << timeout.count()
            << " ms; its output so far:\n"
            << child.output());
  REQUIRE(line.has_value());
  return *line;
}

// Waits (bounded) for `child` to exit and requires exit code 0.
inline void requireCleanExit(ChildProcess& child, const std::string& name, Millis timeout) {
  auto status = child.wait(timeout);
  INFO(name << " output:\n" << child.output());
  REQUIRE(status.has_value());
  REQUIRE(exitCodeOf(*status) == 0);
}

// Polls `condition` until it holds or `timeout` passes; returns whether it held.
inline bool eventually(const std::function<bool()>& condition, Millis timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!condition()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // polling, not synchronisation
  }
  return true;
}

inline std::unique_ptr<BackgroundTcpStoreServer> startOurServer() {
  auto server = BackgroundTcpStoreServer::start({});
  INFO(server.status().toString());
  REQUIRE(server.isOk());
  return std::move(server).value();
}

inline TcpStoreClientOptions clientOptions(
    uint16_t port, rendezvous::wire::Dialect dialect = rendezvous::wire::Dialect::kV2) {
  TcpStoreClientOptions options;
  options.host = "127.0.0.1";
  options.port = port;
  options.dialect = dialect;
  options.connect_timeout = std::chrono::seconds(30);
  options.timeout = std::chrono::seconds(30);
  return options;
}

inline std::vector<std::string> sorted(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  return v;
}

// Bytes 0 ... 255.
inline Bytes binaryValue() {
  Bytes b(256);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(i);
  return b;
}

// The 3 KiB value the store scripts write: bytes((i * 7 + 3) % 256 for i in range(3072)).
inline Bytes scriptLargeValue() {
  Bytes b(3 * 1024);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>((i * 7 + 3) % 256);
  return b;
}

// set/get (text, empty, binary, 3 KiB), add (decimal text), compareSet (the four cases) and check
// against a torch server, whose answers are the reference. Leaves the keys /a /empty /binary
// /large /ctr /cas.
inline void checkOperationsEveryTorchServerServes(TcpStoreClient& client) {
  using rendezvous::toBytes;
  using rendezvous::toString;
  client.set("/a", "1");
  CHECK(toString(client.get("/a")) == "1");
  client.set("/a", "2");
  CHECK(toString(client.get("/a")) == "2");
  client.set("/empty", Bytes{});
  CHECK(client.get("/empty").empty());
  client.set("/binary", binaryValue());
  CHECK(client.get("/binary") == binaryValue());
  client.set("/large", scriptLargeValue());
  CHECK(client.get("/large") == scriptLargeValue());

  CHECK(client.add("/ctr", 5) == 5);
  CHECK(client.add("/ctr", -2) == 3);
  CHECK(client.add("/ctr", 0) == 3);
  CHECK(toString(client.get("/ctr")) == "3");

  CHECK(toString(client.compareSet("/cas", {}, toBytes("first"))) == "first");
  CHECK(toString(client.compareSet("/cas_missing", toBytes("x"), toBytes("y"))) == "x");
  CHECK(toString(client.compareSet("/cas", toBytes("first"), toBytes("second"))) == "second");
  CHECK(toString(client.compareSet("/cas", toBytes("nomatch"), toBytes("third"))) == "second");
  CHECK(toString(client.get("/cas")) == "second");

  CHECK(client.check({"/a"}));
  CHECK(client.check({"/a", "/ctr", "/cas"}));
  CHECK_FALSE(client.check({"/a", "/cas_missing"}));
  CHECK(client.check({}));
}

// After checkOperationsEveryTorchServerServes and a set of /never: a wait woken by a set from
// another connection (whether the set lands before or after the WAIT registered cannot be seen
// from outside a torch server; both must work), deleteKey and numKeys, multiSet/multiGet and
// append (real requests on a torch >= 2.2 server, emulated with single requests and a compareSet
// loop on a legacy one). Leaves 12 keys.
inline void checkWaitDeleteMultiAppend(TcpStoreClient& client,
                                       const TcpStoreClientOptions& options) {
  using rendezvous::toBytes;
  using rendezvous::toString;
  {
    TcpStoreClient waiter(options);
    std::optional<std::string> waiter_error;
    std::thread waiting([&] {
      try {
        waiter.wait({"/late"}, std::chrono::seconds(20));
      } catch (const std::exception& e) {
        waiter_error = e.what();
      }
    });
    client.set("/late", "here");
    waiting.join();
    CHECK(waiter_error == std::nullopt);
    CHECK(toString(waiter.get("/late")) == "here");
  }

  // /a /empty /binary /large /ctr /cas /never /late.
  CHECK(client.numKeys() == 8);
  client.set("/doomed", "x");
  CHECK(client.numKeys() == 9);
  CHECK(client.deleteKey("/doomed"));
  CHECK_FALSE(client.deleteKey("/doomed"));
  CHECK_FALSE(client.check({"/doomed"}));
  CHECK(client.numKeys() == 8);

  client.multiSet({"/m1", "/m2", "/m3"}, {toBytes("one"), Bytes{}, binaryValue()});
  auto values = client.multiGet({"/m3", "/m1", "/m2", "/a"});
  REQUIRE(values.size() == 4);
  CHECK(values[0] == binaryValue());
  CHECK(toString(values[1]) == "one");
  CHECK(values[2].empty());
  CHECK(toString(values[3]) == "2");

  client.append("/log", toBytes("a"));
  client.append("/log", toBytes("bc"));
  client.append("/log", Bytes{});
  CHECK(toString(client.get("/log")) == "abc");
  CHECK(client.numKeys() == 12);
}

}  // namespace cpprun::testing::interop
