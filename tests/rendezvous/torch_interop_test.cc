// Interoperability with the real thing: Debian's PyTorch 1.13 (run as CPPRUN_PYTHON, never the
// python3 first on PATH) against cpprun's TCPStore server and client.
//
//   * torch's Python TCPStore client drives our server through every operation it exposes
//     (tests/torch/store_client_ops.py checks each result itself);
//   * our client, in the legacy dialect, drives torch's own TCPStore server;
//   * two gloo workers bootstrap through our server with init_process_group(env://) in
//     torchelastic's agent-store mode, then all_reduce.
//
// These tests need /usr/bin/python3 with torch 1.13; without it they fail (they do not skip),
// saying what is missing. Every wait is bounded; ordering comes from the children's printed
// lines, their exit, or server state polled until a deadline, never from a sleep.
#include <signal.h>
#include <unistd.h>

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
#include "tests/rendezvous/torch_interop_helpers.h"
#include "tests/support/test_support.h"
#include "tests/support/torch_peers.h"

namespace {

using cpprun::rendezvous::Bytes;
using cpprun::rendezvous::StoreTimeout;
using cpprun::rendezvous::TcpStoreClient;
using cpprun::rendezvous::toBytes;
using cpprun::rendezvous::toString;
using cpprun::rendezvous::wire::Dialect;
using cpprun::testing::ChildProcess;
using cpprun::testing::requireTorchPeer;
using cpprun::testing::sourcePath;
using cpprun::testing::torch113;
using namespace cpprun::testing::interop;
using namespace std::chrono_literals;

const char* const kPython = CPPRUN_PYTHON;

void requireTorch() { requireTorchPeer(torch113()); }

TEST_CASE("torch 1.13 TCPStore client drives our server through every Python-visible operation",
          "[integration][torch]") {
  requireTorch();
  auto server = startOurServer();
  TcpStoreClient ours(clientOptions(server->port(), Dialect::kV2));

  ChildProcess script({kPython, sourcePath("tests/torch/store_client_ops.py"), "--host",
                       "127.0.0.1", "--port", std::to_string(server->port()), "--harness-wakes"},
                      pythonEnv());
  const std::string name = "store_client_ops.py";

  // A second torch store object is now blocked in get("interop_wakeup"). Before this point the
  // script only waited on keys that existed, so the first pending wait on the server is that
  // get's WAIT. Once it is registered, our (V2) client's SET must wake the legacy waiter.
  requireLine(script, name, "BLOCKED_ON /interop_wakeup", 60s);
  REQUIRE(eventually([&] { return server->stats().pending_waits >= 1; }, 30s));
  ours.set("/interop_wakeup", "from-cpprun");

  const std::string keys_line = requireLine(script, name, "KEYS ", 60s);
  const std::string ok_line = requireLine(script, name, "OK ", 30s);
  requireCleanExit(script, name, 30s);
  CHECK(keys_line == "KEYS 12");
  CHECK(ok_line.substr(ok_line.size() - 7) == " checks");  // "OK <n> checks"

  // What torch wrote is what our client reads back (user keys carry torch's "/" prefix).
  CHECK(toString(ours.get("/interop_final")) == "interop-ok");
  CHECK(toString(ours.get("/bytes_key")) == "value-2");
  CHECK(toString(ours.get("/str_key")) == "h\xc3\xa9llo");
  CHECK(ours.get("/empty_key").empty());
  CHECK(ours.get("/binary_key") == binaryValue());
  CHECK(ours.get("/large_key") == scriptLargeValue());
  CHECK(toString(ours.get("/counter")) == "13");
  CHECK(toString(ours.get("/cas_new")) == "second");
  CHECK(toString(ours.get("init/")) == "1");  // one store object was made with world_size=2
  CHECK(toString(ours.get("/default_pg/x")) == "z");
  CHECK(toString(ours.get("/default_pg/0/rank_0")) == "addr");
  CHECK_FALSE(ours.check({"/cas_missing"}));
  CHECK_FALSE(ours.check({"/to_delete"}));
  CHECK_FALSE(ours.check({"/default_pg/n"}));
  CHECK(ours.numKeys() == 12);
  CHECK(sorted(ours.listKeys()) ==
        sorted({"/bytes_key", "/str_key", "/empty_key", "/binary_key", "/large_key", "/counter",
                "/cas_new", "/interop_wakeup", "init/", "/default_pg/x", "/default_pg/0/rank_0",
                "/interop_final"}));

  // Every torch connection is gone, and so are the waits its timed-out store object left.
  CHECK(eventually(
      [&] {
        auto stats = server->stats();
        return stats.connections_open == 1 && stats.pending_waits == 0;
      },
      10s));
}

TEST_CASE("our client drives torch's own TCPStore server", "[integration][torch]") {
  requireTorch();
  const std::string name = "torch_store_server.py";
  ChildProcess torch_server({kPython, sourcePath("tests/torch/torch_store_server.py")},
                            pythonEnv());
  const std::string port_line = requireLine(torch_server, name, "PORT ", 60s);
  const auto port = static_cast<uint16_t>(std::stoi(port_line.substr(5)));
  REQUIRE(port != 0);

  auto options = clientOptions(port, Dialect::kLegacy);
  TcpStoreClient client(options);

  // set/get, add, compareSet and check, with torch's answers as the reference.
  checkOperationsEveryTorchServerServes(client);

  // wait: ready at once; then one that times out. torch 1.13's server answers a timed-out wait
  // later, so the client drops that connection and the next call must work on a fresh one.
  client.wait({"/a", "/ctr"}, 5s);
  auto started = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(client.wait({"/never"}, 300ms), StoreTimeout);
  CHECK(std::chrono::steady_clock::now() - started >= 250ms);
  CHECK(toString(client.get("/a")) == "2");
  // Setting the key the dropped connection waited for must not disturb anyone (torch's server
  // forgot the wait when the connection closed, or fails to write to it, harmlessly).
  client.set("/never", "now");
  CHECK(client.check({"/never"}));

  // A wait woken from another connection, deleteKey/numKeys, multiSet/multiGet, append.
  checkWaitDeleteMultiAppend(client, options);

  // The V2-only operations are refused locally, not sent to a server that would choke on them.
  CHECK_THROWS(client.ping(1));
  CHECK(toString(client.get("/log")) == "abc");

  // torch's server is still up and ends cleanly on SIGTERM.
  torch_server.signal(SIGTERM);
  requireCleanExit(torch_server, name, 30s);
}

TEST_CASE(
    "two torch workers init_process_group(gloo, env://) with TORCHELASTIC_USE_AGENT_STORE=True "
    "against our server, then all_reduce",
    "[integration][torch]") {
  requireTorch();
  auto server = startOurServer();
  const std::string port = std::to_string(server->port());
  constexpr int kWorld = 2;

  std::vector<std::unique_ptr<ChildProcess>> workers;
  for (int rank = 0; rank < kWorld; ++rank) {
    workers.push_back(std::make_unique<ChildProcess>(
        std::vector<std::string>{kPython, sourcePath("tests/torch/gloo_worker.py")},
        pythonEnv({{"MASTER_ADDR", "127.0.0.1"},
                   {"MASTER_PORT", port},
                   {"RANK", std::to_string(rank)},
                   {"LOCAL_RANK", std::to_string(rank)},
                   {"WORLD_SIZE", std::to_string(kWorld)},
                   {"LOCAL_WORLD_SIZE", std::to_string(kWorld)},
                   {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                   {"TORCHELASTIC_RESTART_COUNT", "0"},
                   {"GLOO_SOCKET_IFNAME", "lo"}})));
  }
  // One bound for the whole job; each wait gets what is left of it.
  auto deadline = std::chrono::steady_clock::now() + 120s;
  auto left = [&] {
    return std::max(
        Millis(1), std::chrono::duration_cast<Millis>(deadline - std::chrono::steady_clock::now()));
  };
  for (int rank = 0; rank < kWorld; ++rank) {
    const std::string name = "gloo_worker.py rank " + std::to_string(rank);
    const std::string expected = "rank " + std::to_string(rank) + " world 2 all_reduce 3.0";
    CHECK(requireLine(*workers[static_cast<size_t>(rank)], name, "rank ", left()) == expected);
  }
  for (int rank = 0; rank < kWorld; ++rank) {
    const std::string name = "gloo_worker.py rank " + std::to_string(rank);
    requireCleanExit(*workers[static_cast<size_t>(rank)], name, left());
  }

  // The keys torch 1.13 wrote: PrefixStore("/worker/attempt_0") over the TCPStore's "/", then
  // PrefixStore("default_pg") and the group prefix "0". "init/" is the TCPStore's own counter.
  TcpStoreClient ours(clientOptions(server->port(), Dialect::kV2));
  const std::string pg = "//worker/attempt_0/default_pg/";
  CHECK(sorted(ours.listKeys()) ==
        sorted({"init/", pg + "0/0/rank_0", pg + "0/0/rank_1", pg + "0/0/0", pg + "0/0/1",
                pg + "store_based_barrier_key:1", pg + "0/SEQ_NUM_STORE_KEY"}));
  CHECK(toString(ours.get("init/")) == "2");  // each rank's store added 1
  CHECK(toString(ours.get(pg + "store_based_barrier_key:1")) == "2");
  CHECK_FALSE(ours.get(pg + "0/0/rank_0").empty());  // the rank's host name
  CHECK_FALSE(ours.get(pg + "0/0/0").empty());       // gloo's listening address per rank
  CHECK_FALSE(ours.get(pg + "0/0/1").empty());
  CHECK(ours.get(pg + "0/SEQ_NUM_STORE_KEY").size() == 8);

  // Both workers' connections (two per store object in 1.13) are closed; no wait is left.
  CHECK(eventually(
      [&] {
        auto stats = server->stats();
        return stats.connections_open == 1 && stats.pending_waits == 0;
      },
      10s));
}

}  // namespace
