// Interoperability with the pinned torch 2.x from PyPI (CPPRUN_TORCH2_PYTHON, exactly
// CPPRUN_TORCH2_VERSION), live on the wire:
//
//   * torch 2.x's Python TCPStore client drives the real cpprun-store daemon and the agent's
//     store (a worker under the real cpprun) through every operation it exposes
//     (tests/torch/store_client_ops_v2.py checks each result; these tests read the store back
//     with our client);
//   * 64 torch 2.x clients at once against our server (tests/torch/store_many_clients.py);
//   * init_process_group(gloo, env://) in the agent-store mode, against our server and under
//     cpprun --nproc-per-node=2, with the keys torch 2.x leaves in the store;
//   * our client (Dialect::kV2) drives torch 2.x's own servers, libuv and legacy.
//
// Without the torch 2.x venv these tests fail (they do not skip), saying how to install it.
// Every wait is bounded; ordering comes from the children's printed lines, their exit, or server
// state polled until a deadline, never from a sleep.
#include <signal.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
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

using cpprun::rendezvous::BackgroundTcpStoreServer;
using cpprun::rendezvous::Bytes;
using cpprun::rendezvous::StoreError;
using cpprun::rendezvous::StoreTimeout;
using cpprun::rendezvous::TcpStoreClient;
using cpprun::rendezvous::TcpStoreClientOptions;
using cpprun::rendezvous::toBytes;
using cpprun::rendezvous::toString;
using cpprun::rendezvous::wire::Dialect;
using cpprun::testing::ChildProcess;
using cpprun::testing::exitCodeOf;
using cpprun::testing::requireTorchPeer;
using cpprun::testing::sourcePath;
using cpprun::testing::torch2;
using namespace cpprun::testing::interop;
using namespace std::chrono_literals;

using Millis = std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

const char* const kTorch2 = CPPRUN_TORCH2_PYTHON;

uint16_t portAfterColon(const std::string& text) {
  return static_cast<uint16_t>(std::stoi(text.substr(text.rfind(':') + 1)));
}

// The user keys store_client_ops_v2.py leaves behind, as they are on the wire ("/" + key).
std::vector<std::string> scriptKeys() {
  std::vector<std::string> keys;
  for (const char* k : {"bytes_key",
                        "str_key",
                        "empty_key",
                        "binary_key",
                        "large_key",
                        "counter",
                        "cas_new",
                        "late_key",
                        "interop_wakeup",
                        "clone_wakeup",
                        "log",
                        "appended_later",
                        "m1",
                        "m2",
                        "m3",
                        "multi_later",
                        "meet",
                        "solo",
                        "lonely",
                        "default_pg/x",
                        "default_pg/0/rank_0",
                        "default_pg/p1",
                        "default_pg/p2",
                        "default_pg/pb/num_members",
                        "default_pg/pb/last_member",
                        "interop_final"}) {
    keys.push_back(std::string("/") + k);
  }
  return keys;
}

// Reads back, with our client, what store_client_ops_v2.py wrote.
void checkScriptContents(TcpStoreClient& ours) {
  CHECK(toString(ours.get("/interop_final")) == "interop-ok");
  CHECK(toString(ours.get("/interop_wakeup")) == "from-cpprun");
  CHECK(toString(ours.get("/bytes_key")) == "value-2");
  CHECK(toString(ours.get("/str_key")) == "h\xc3\xa9llo");
  CHECK(ours.get("/empty_key").empty());
  CHECK(ours.get("/binary_key") == binaryValue());
  CHECK(ours.get("/large_key") == scriptLargeValue());
  CHECK(toString(ours.get("/counter")) == "13");
  CHECK(toString(ours.get("/cas_new")) == "second");
  CHECK(toString(ours.get("/log")) == "abc");
  CHECK(ours.multiGet({"/m1", "/m2", "/m3"}) ==
        std::vector<Bytes>{toBytes("one"), {}, binaryValue()});
  CHECK(toString(ours.get("/meet")) == "2");    // the BARRIER counter, decimal
  CHECK(toString(ours.get("/lonely")) == "1");  // the barrier that timed out
  CHECK(toString(ours.get("/default_pg/x")) == "z!");
  CHECK(toString(ours.get("/default_pg/pb/num_members")) == "1");
  CHECK(ours.queueLength("/jobs") == 0);
  CHECK(ours.queueLength("/default_pg/pq") == 0);
  CHECK_FALSE(ours.check({"/cas_missing"}));
  CHECK_FALSE(ours.check({"/to_delete"}));
  CHECK_FALSE(ours.check({"/default_pg/n"}));
  const auto listed = ours.listKeys();
  const std::set<std::string> all(listed.begin(), listed.end());
  for (const auto& key : scriptKeys()) {
    INFO("key " << key);
    CHECK(all.count(key) == 1);
  }
  CHECK(all.count("init/") == 1);  // the store object made with world_size=2 added 1
}

// Runs store_client_ops_v2.py as `script` drives it: wakes its blocked get with our client on
// `port`, reads the store back once the script checked everything, then lets it finish.
// `prefix` is what precedes the script's lines (cpprun's "[default0]:" for a worker).
void driveOpsScript(ChildProcess& script, const std::string& name, const std::string& prefix,
                    int expected_base_keys) {
  const std::string store_line = requireLine(script, name, prefix + "STORE ", 120s);
  const std::string address = store_line.substr(store_line.find("STORE ") + 6);
  const auto port = portAfterColon(address.substr(0, address.find(' ')));
  const int base = std::stoi(store_line.substr(store_line.find(" BASE ") + 6));
  if (expected_base_keys >= 0) CHECK(base == expected_base_keys);
  TcpStoreClient ours(clientOptions(port));

  requireLine(script, name, prefix + "BLOCKED_ON /interop_wakeup", 60s);
  ours.set("/interop_wakeup", "from-cpprun");

  const std::string keys_line = requireLine(script, name, prefix + "KEYS ", 60s);
  const std::string ok_line = requireLine(script, name, prefix + "OK ", 30s);
  CHECK(std::stoi(keys_line.substr(keys_line.find("KEYS ") + 5)) == base + 27);
  CHECK_THAT(ok_line, Catch::EndsWith(" checks"));
  checkScriptContents(ours);
  CHECK(ours.numKeys() == base + 27);  // 26 user keys and "init/"; queues are not keys

  ours.set("/harness_done", "1");
  requireLine(script, name, prefix + "DONE", 30s);
}

TEST_CASE("torch 2.x TCPStore client drives cpprun-store through every Python-visible operation",
          "[integration][torch][torch2]") {
  requireTorchPeer(torch2());
  ChildProcess daemon({CPPRUN_STORE_BINARY, "--host", "127.0.0.1", "--port", "0"});
  const std::string listening =
      requireLine(daemon, "cpprun-store", "cpprun-store listening on ", 10s);
  const std::string port = std::to_string(portAfterColon(listening));

  const std::string name = "store_client_ops_v2.py";
  ChildProcess script({kTorch2, sourcePath("tests/torch/store_client_ops_v2.py"), "--host",
                       "127.0.0.1", "--port", port, "--harness-wakes", "--harness-done"},
                      pythonEnv());
  driveOpsScript(script, name, "", 0);
  requireCleanExit(script, name, 30s);

  daemon.signal(SIGTERM);
  requireCleanExit(daemon, "cpprun-store", 10s);
}

TEST_CASE(
    "torch 2.x TCPStore client in a worker under cpprun drives the agent's store through every "
    "Python-visible operation",
    "[integration][torch][torch2]") {
  requireTorchPeer(torch2());
  const std::string name = "cpprun --nproc-per-node=1 store_client_ops_v2.py";
  ChildProcess run(
      {CPPRUN_BINARY, "--nproc-per-node=1", sourcePath("tests/torch/store_client_ops_v2.py"),
       "--from-env", "--harness-wakes", "--harness-done"},
      pythonEnv({{"PYTHON_EXEC", kTorch2}}));
  driveOpsScript(run, name, "[default0]:", -1);
  requireCleanExit(run, name, 60s);
}

TEST_CASE("64 concurrent torch 2.x TCPStore clients against our server all succeed",
          "[integration][torch][torch2]") {
  requireTorchPeer(torch2());
  auto server = startOurServer();
  constexpr int kClients = 64;
  const std::string name = "store_many_clients.py";
  ChildProcess script(
      {kTorch2, sourcePath("tests/torch/store_many_clients.py"), "--port",
       std::to_string(server->port()), "--clients", std::to_string(kClients), "--timeout-s", "45"},
      pythonEnv());
  const std::string ok = requireLine(script, name, "OK ", 60s);
  CHECK(ok == "OK 64 clients sum 2016");
  requireCleanExit(script, name, 30s);

  TcpStoreClient ours(clientOptions(server->port()));
  CHECK(toString(ours.get("/many/arrived")) == "64");
  CHECK(toString(ours.get("/many/barrier")) == "64");
  CHECK(toString(ours.get("/many/sum")) == "2016");
  for (int i = 0; i < kClients; ++i) {
    CHECK(toString(ours.get("/many/client_" + std::to_string(i))) == "value-" + std::to_string(i));
  }
  CHECK(ours.numKeys() == kClients + 4);  // client_i, sum, arrived, go, barrier
  auto stats = server->stats();
  CHECK(stats.connections_accepted >= kClients + 2);  // + the final sum's client + ours
  CHECK(stats.connections_dropped == 0);
  CHECK(stats.connections_rejected == 0);
  CHECK(eventually(
      [&] {
        auto s = server->stats();
        return s.connections_open == 1 && s.pending_waits == 0;
      },
      10s));
}

// The keys torch 2.x's init_process_group leaves in the agent's store: no
// "/worker/attempt_<n>" prefix any more (1.13 had one), the TCPStore's "init/" counter, and
// gloo's per-rank addresses under PrefixStore("default_pg") / group "0/" / device "cpu/".
std::vector<std::string> torch2AgentStoreKeys() {
  return {"init/", "/default_pg/0//cpu//0/0", "/default_pg/0//cpu//0/1"};
}

std::map<std::string, std::string> glooWorkerEnv(const std::string& port, int rank, int world) {
  return pythonEnv({{"MASTER_ADDR", "127.0.0.1"},
                    {"MASTER_PORT", port},
                    {"RANK", std::to_string(rank)},
                    {"LOCAL_RANK", std::to_string(rank)},
                    {"WORLD_SIZE", std::to_string(world)},
                    {"LOCAL_WORLD_SIZE", std::to_string(world)},
                    {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                    {"TORCHELASTIC_RESTART_COUNT", "0"},
                    {"GLOO_SOCKET_IFNAME", "lo"}});
}

TEST_CASE(
    "two torch 2.x workers init_process_group(gloo, env://) with TORCHELASTIC_USE_AGENT_STORE=True "
    "against our server, then all_reduce",
    "[integration][torch][torch2]") {
  requireTorchPeer(torch2());
  constexpr int kWorld = 2;
  // Without and with the store-based barrier after init (2.x runs it only when asked).
  for (const bool init_barrier : {false, true}) {
    INFO("TORCH_DIST_INIT_BARRIER=" << init_barrier);
    auto server = startOurServer();
    const std::string port = std::to_string(server->port());
    std::vector<std::unique_ptr<ChildProcess>> workers;
    for (int rank = 0; rank < kWorld; ++rank) {
      auto env = glooWorkerEnv(port, rank, kWorld);
      env["TORCH_DIST_INIT_BARRIER"] = init_barrier ? "1" : "0";
      workers.push_back(std::make_unique<ChildProcess>(
          std::vector<std::string>{kTorch2, sourcePath("tests/torch/gloo_worker.py")}, env));
    }
    auto deadline = Clock::now() + 120s;
    auto left = [&] {
      return std::max(Millis(1), std::chrono::duration_cast<Millis>(deadline - Clock::now()));
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

    TcpStoreClient ours(clientOptions(server->port()));
    auto expected_keys = torch2AgentStoreKeys();
    if (init_barrier) {
      // The barrier counts arrivals under one key; the last arrival SETs ":last_worker".
      expected_keys.push_back("/default_pg/store_based_barrier_key:0");
      expected_keys.push_back("/default_pg/store_based_barrier_key:0:last_worker");
    }
    const auto keys = sorted(ours.listKeys());
    CHECK(keys == sorted(expected_keys));
    for (const auto& key : keys) CHECK(key.find("/worker/attempt_") == std::string::npos);
    CHECK(toString(ours.get("init/")) == "2");                 // each rank's store added 1
    CHECK_FALSE(ours.get("/default_pg/0//cpu//0/0").empty());  // gloo's address of rank 0
    CHECK_FALSE(ours.get("/default_pg/0//cpu//0/1").empty());
    if (init_barrier) CHECK(toString(ours.get("/default_pg/store_based_barrier_key:0")) == "2");
    CHECK(server->stats().connections_dropped == 0);
    CHECK(eventually(
        [&] {
          auto stats = server->stats();
          return stats.connections_open == 1 && stats.pending_waits == 0;
        },
        10s));
  }
}

TEST_CASE(
    "two torch 2.x gloo workers under cpprun --nproc-per-node=2 bootstrap from the agent's "
    "store and all_reduce",
    "[integration][torch][torch2]") {
  requireTorchPeer(torch2());
  const std::string name = "cpprun --nproc-per-node=2 gloo_worker.py";
  ChildProcess run({CPPRUN_BINARY, "--nproc-per-node=2", sourcePath("tests/torch/gloo_worker.py")},
                   pythonEnv({{"PYTHON_EXEC", kTorch2}, {"GLOO_SOCKET_IFNAME", "lo"}}));
  requireCleanExit(run, name, 120s);
  for (const std::string rank : {"0", "1"}) {
    CHECK_THAT(run.output(),
               Catch::Contains("[default" + rank + "]:rank " + rank + " world 2 all_reduce 3.0"));
  }
  CHECK_THAT(run.output(), !Catch::Contains("FAIL"));
}

size_t occurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST_CASE(
    "torch 2.x gloo workers under cpprun --max-restarts=1 bootstrap again from the agent's store "
    "after a worker failed",
    "[integration][torch][torch2]") {
  // torch 2.x puts no /worker/attempt_<n> prefix on agent-store keys: the second attempt must
  // not read the first attempt's gloo addresses (the agent clears the store between attempts).
  requireTorchPeer(torch2());
  const std::string name = "cpprun --max-restarts=1 gloo_worker.py --fail-first-attempt";
  ChildProcess run({CPPRUN_BINARY, "--nproc-per-node=2", "--max-restarts=1",
                    sourcePath("tests/torch/gloo_worker.py"), "--fail-first-attempt"},
                   pythonEnv({{"PYTHON_EXEC", kTorch2}, {"GLOO_SOCKET_IFNAME", "lo"}}));
  requireCleanExit(run, name, 150s);
  CHECK_THAT(run.output(), Catch::Contains("[default1]:rank 1 fails attempt 0"));
  CHECK_THAT(run.output(), Catch::Contains("restart 1 of 1"));
  for (const std::string rank : {"0", "1"}) {
    CHECK(occurrences(run.output(),
                      "[default" + rank + "]:rank " + rank + " world 2 all_reduce 3.0") == 2);
  }
  CHECK_THAT(run.output(), !Catch::Contains("FAIL"));
}

// Starts torch 2.x's own TCPStore server (tests/torch/torch_store_server.py) with `backend`.
std::unique_ptr<ChildProcess> startTorchServer(const std::string& backend, uint16_t* port) {
  auto server = std::make_unique<ChildProcess>(
      std::vector<std::string>{kTorch2, sourcePath("tests/torch/torch_store_server.py"),
                               "--backend", backend, "--max-seconds", "300"},
      pythonEnv());
  const std::string name = "torch_store_server.py --backend " + backend;
  const std::string port_line = requireLine(*server, name, "PORT ", 90s);
  *port = static_cast<uint16_t>(std::stoi(port_line.substr(5)));
  REQUIRE(*port != 0);
  CHECK(requireLine(*server, name, "BACKEND ", 10s) == "BACKEND " + backend);
  return server;
}

// Every operation our client has that both torch 2.x servers serve, with torch's answers.
void driveTorchServerCommonOps(TcpStoreClient& client, const TcpStoreClientOptions& options) {
  // VALIDATE + PING happened in the constructor; a ping echoes its nonce.
  CHECK(client.ping(0xdeadbeef) == 0xdeadbeef);
  CHECK(client.ping(7) == 7);

  // set/get, add, compareSet and check, with torch's answers as the reference.
  checkOperationsEveryTorchServerServes(client);

  // wait: ready at once; then timeouts. torch 2.x's servers answer CANCEL_WAIT, so the same
  // connection keeps working (several times in a row).
  client.wait({"/a", "/ctr"}, 5s);
  for (int i = 0; i < 3; ++i) {
    auto started = Clock::now();
    CHECK_THROWS_AS(client.wait({"/never", "/a"}, 300ms), StoreTimeout);
    const auto took = Clock::now() - started;
    CHECK(took >= 250ms);
    CHECK(took < 5s);
    CHECK(toString(client.get("/a")) == "2");
  }
  client.set("/never", "now");  // the cancelled waits must not answer late
  CHECK(client.check({"/never"}));
  CHECK(client.add("/ctr", 0) == 3);

  // A wait woken from another connection, deleteKey/numKeys, multiSet/multiGet, append.
  checkWaitDeleteMultiAppend(client, options);

  // listKeys: the raw server keys (torch's own client strips the "/").
  CHECK(sorted(client.listKeys()) == sorted({"/a", "/empty", "/binary", "/large", "/ctr", "/cas",
                                             "/never", "/late", "/m1", "/m2", "/m3", "/log"}));

  // barrier: two of our clients meet; one alone times out and its connection keeps working.
  {
    TcpStoreClient other(options);
    std::optional<std::string> other_error;
    std::thread arriving([&] {
      try {
        other.barrier("/meet", 2, 20s);
      } catch (const std::exception& e) {
        other_error = e.what();
      }
    });
    client.barrier("/meet", 2, 20s);
    arriving.join();
    CHECK(other_error == std::nullopt);
  }
  CHECK(toString(client.get("/meet")) == "2");
  auto started = Clock::now();
  CHECK_THROWS_AS(client.barrier("/lonely", 2, 300ms), StoreTimeout);
  CHECK(Clock::now() - started >= 250ms);
  CHECK(toString(client.get("/meet")) == "2");
}

TEST_CASE("our client drives torch 2.x's libuv TCPStore server", "[integration][torch][torch2]") {
  requireTorchPeer(torch2());
  uint16_t port = 0;
  auto torch_server = startTorchServer("libuv", &port);
  const auto options = clientOptions(port);
  TcpStoreClient client(options);
  driveTorchServerCommonOps(client, options);

  // Queues: only the libuv server has them.
  CHECK(client.queueLength("/jobs") == 0);
  client.queuePush("/jobs", toBytes("j1"));
  client.queuePush("/jobs", toBytes("j2"));
  CHECK(client.queueLength("/jobs") == 2);
  CHECK(client.check({"/jobs"}));  // a non-empty queue counts as present
  CHECK(toString(client.queuePop("/jobs")) == "j1");
  CHECK(toString(client.queuePop("/jobs")) == "j2");
  CHECK(client.queueLength("/jobs") == 0);
  {
    TcpStoreClient popper(options);
    std::optional<Bytes> popped;
    std::thread popping([&] {
      try {
        popped = popper.queuePop("/jobs");
      } catch (const std::exception&) {
      }
    });
    client.queuePush("/jobs", toBytes("j3"));
    popping.join();
    REQUIRE(popped.has_value());
    CHECK(toString(*popped) == "j3");
  }
  client.setTimeout(300ms);
  CHECK_THROWS_AS(client.queuePop("/jobs"), StoreTimeout);
  client.setTimeout(30s);
  CHECK(client.queueLength("/jobs") == 0);
  CHECK(client.numKeys() == 14);  // + /meet, /lonely; queues are not counted

  torch_server->signal(SIGTERM);
  requireCleanExit(*torch_server, "torch_store_server.py --backend libuv", 30s);
}

TEST_CASE("our client drives torch 2.x's legacy TCPStore server (use_libuv=False)",
          "[integration][torch][torch2]") {
  requireTorchPeer(torch2());
  uint16_t port = 0;
  auto torch_server = startTorchServer("legacy", &port);
  const auto options = clientOptions(port);
  TcpStoreClient client(options);
  driveTorchServerCommonOps(client, options);

  // The legacy server has no queues: it drops the connection on QUEUE_*. Our client reports a
  // StoreError naming the request (no hang) and reconnects for the next call. A QUEUE_PUSH has
  // no reply, so it is lost without an error; the call after it fails instead.
  {
    auto started = Clock::now();
    CHECK_THROWS_WITH(client.queueLength("/jobs"),
                      Catch::Contains("while awaiting the reply to QUEUE_LEN"));
    CHECK(Clock::now() - started < 10s);
  }
  CHECK(toString(client.get("/a")) == "2");
  // queuePop is WAIT + QUEUE_POP: the legacy server serves the WAIT, never sees the queue, and
  // the pop times out after the store timeout (the cancelled wait leaves the stream in sync).
  client.setTimeout(300ms);
  CHECK_THROWS_AS(client.queuePop("/jobs"), StoreTimeout);
  client.setTimeout(30s);
  CHECK(toString(client.get("/a")) == "2");
  client.queuePush("/jobs", toBytes("lost"));
  CHECK_THROWS_AS(client.numKeys(), StoreError);
  CHECK(toString(client.get("/a")) == "2");
  CHECK(client.numKeys() == 14);

  torch_server->signal(SIGTERM);
  requireCleanExit(*torch_server, "torch_store_server.py --backend legacy", 30s);
}

}  // namespace
