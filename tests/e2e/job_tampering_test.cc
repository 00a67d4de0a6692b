// Issue 36: a stranger's client on the job's store port, writing the exact bytes of each
// finding while a two-node job runs (static c10d, both agents on 127.0.0.1). Without the job's
// secret a tampered record stops every node loudly (never an abort, never a node left running);
// with it the stranger's writes are refused and the job does not notice them.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <map>
#include <memory>
#include <string>

#include "rendezvous/store.h"
#include "rendezvous/tcp_store_client.h"
#include "tests/support/cpprun_test_helpers.h"
#include "tests/support/test_support.h"

namespace {

using namespace cpprun::testing;
using cpprun::rendezvous::StoreError;
using cpprun::rendezvous::TcpStoreClient;
using cpprun::rendezvous::TcpStoreClientOptions;
using cpprun::rendezvous::toBytes;
using cpprun::rendezvous::toString;

const char* kSecret = "5f1c2e9a7b3d4c6e8f0a1b2c3d4e5f60";

bool fileExists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

// Two agents (node 0 last), one worker each: it says it runs, then waits for `release` in the
// store (never set by a stranger who wants the job to run on) and exits 0.
std::vector<std::unique_ptr<ChildProcess>> startPair(int port, const std::string& dir,
                                                     const std::string& secret) {
  std::vector<std::unique_ptr<ChildProcess>> agents(2);
  std::map<std::string, std::string> env;
  if (!secret.empty()) env["CPPRUN_RDZV_SECRET"] = secret;
  for (int rank = 1; rank >= 0; --rank) {
    agents[static_cast<size_t>(rank)] = std::make_unique<ChildProcess>(
        cpprunCommand({"--nnodes=2", "--node-rank=" + std::to_string(rank), "--nproc-per-node=1",
                       "--master-addr=127.0.0.1", "--master-port=" + std::to_string(port),
                       "--rdzv-conf=keep_alive_interval=0.3,join_timeout=60", "--no-python",
                       kWorker, "env-json", dir + "/env-{rank}.json", "store-set", "running-{rank}",
                       "1", "store-get", "release", dir + "/released-{rank}"}),
        env);
  }
  return agents;
}

std::unique_ptr<TcpStoreClient> stranger(int port) {
  TcpStoreClientOptions o;
  o.port = static_cast<uint16_t>(port);
  o.timeout = std::chrono::seconds(30);
  o.connect_timeout = std::chrono::seconds(30);
  return std::make_unique<TcpStoreClient>(o);
}

int waitExit(ChildProcess& agent, std::chrono::milliseconds bound = std::chrono::seconds(30)) {
  auto status = agent.wait(bound);
  REQUIRE(status.has_value());
  return exitCodeOf(*status);
}

// Writes `bytes` into attempt 0's stop key once both workers run; returns both agents' exits.
void tamperWithStop(const std::string& bytes, const std::string& node0_says,
                    const std::string& node1_says) {
  TempDir dir;
  const int port = freeTcpPort();
  auto agents = startPair(port, dir.path(), "");
  auto client = stranger(port);
  client->wait({"running-0", "running-1"}, std::chrono::seconds(30));
  client->set("cpprun/none/attempt/0/stop", toBytes(bytes));
  const int exit0 = waitExit(*agents[0]);
  const int exit1 = waitExit(*agents[1]);
  INFO(agents[0]->output());
  INFO(agents[1]->output());
  // Both stopped, both failed the same way: no abort (134), nobody "succeeded", nobody left
  // waiting on a job the key can no longer stop.
  CHECK(exit0 == 1);
  CHECK(exit1 == 1);
  CHECK_THAT(agents[0]->output(), Catch::Contains(node0_says));
  CHECK_THAT(agents[1]->output(), Catch::Contains(node1_says));
  CHECK_FALSE(fileExists(dir.path() + "/released-0"));
  CHECK_FALSE(fileExists(dir.path() + "/released-1"));
}

}  // namespace

TEST_CASE("tampering: a stop claim of the wrong types stops every node with a clear error",
          "[integration][multinode]") {
  // Finding 1: this aborted every agent within 0.03 s (uncaught nlohmann type_error, exit 134).
  tamperWithStop(R"({"by":"x","cause":7})",
                 "attempt 0's stop claim cannot be decoded (attempt/0/stop: \"by\" is text",
                 "attempt 0's stop claim cannot be decoded");
}

TEST_CASE("tampering: bytes that are not JSON in the stop key stop every node",
          "[integration][multinode]") {
  // Finding 2: read as "handled"; a later real failure then never reached the other node.
  tamperWithStop("handled", "attempt/0/stop: the record is not JSON",
                 "attempt/0/stop: the record is not JSON");
}

TEST_CASE("tampering: a stop claim forged in a live node's name stops that node too",
          "[integration][multinode]") {
  // Finding 2: node 1 ignored a claim in its own name and ran on while node 0 stopped.
  tamperWithStop(
      R"({"by":1,"reason":"node 1: rank 1 exited with code 9","cause":"failure",)"
      R"("signal":0})",
      "rank 1 exited with code 9",
      "attempt 0's stop claim names this node (1), which did not make it: it was forged");
}

TEST_CASE("tampering: an 'end of the job' claim before the decision stops every node",
          "[integration][multinode]") {
  tamperWithStop(R"({"by":-1,"reason":"the job ended","cause":"end","signal":0})",
                 "says the job ended, but attempt 0 has no decision: it was forged",
                 "says the job ended, but attempt 0 has no decision: it was forged");
}

TEST_CASE("tampering: with the job's secret a stranger's writes are refused and the job runs on",
          "[integration][multinode]") {
  TempDir dir;
  const int port = freeTcpPort();
  auto agents = startPair(port, dir.path(), kSecret);
  auto client = stranger(port);
  client->wait({"running-0", "running-1"}, std::chrono::seconds(30));
  // Every finding's bytes: the stop claims, a join record naming a store of the stranger's with
  // scheduler rank 0 and two billion workers, the run id, a decision.
  const std::vector<std::pair<std::string, std::string>> writes = {
      {"cpprun/none/attempt/0/stop", R"({"by":"x","cause":7})"},
      {"cpprun/none/attempt/0/stop", "handled"},
      {"cpprun/none/attempt/0/stop", R"({"by":1,"reason":"x","cause":"failure","signal":0})"},
      {"cpprun/none/rdzv/node/0",
       R"({"host":"evil","nproc":2000000000,"id":"e","scheduler_rank":0,"store":"10.0.0.9:1"})"},
      {"cpprun/none/attempt/0/decision", R"({"kind":"succeeded"})"},
      {"cpprun/served_run_id", "other"}};
  for (const auto& [key, value] : writes) {
    INFO(key);
    auto c = stranger(port);
    c->set(key, toBytes(value));  // no reply: the server closes the connection
    CHECK_THROWS_AS(c->get(key), StoreError);
  }
  CHECK_FALSE(client->check({"cpprun/none/attempt/0/stop"}));
  CHECK_FALSE(client->check({"cpprun/none/attempt/0/decision"}));
  // The workers' own keys stay theirs to write (as torch's clients, which cannot authenticate).
  client->set("release", toBytes(std::string("1")));
  for (auto& a : agents) {
    INFO(a->output());
    CHECK(waitExit(*a) == 0);
    CHECK(a->output().find("store is open") == std::string::npos);
  }
  CHECK(fileExists(dir.path() + "/released-0"));
  CHECK(fileExists(dir.path() + "/released-1"));
  // The secret stays with the agents: the workers' environment does not carry it.
  for (int r = 0; r < 2; ++r) {
    Json env = readJson(dir.path() + "/env-" + std::to_string(r) + ".json");
    CHECK_FALSE(env.contains("CPPRUN_RDZV_SECRET"));
    CHECK(env["MASTER_PORT"] == std::to_string(port));
  }
  CHECK_THAT(agents[0]->output(),
             Catch::Contains("from a connection that did not prove the job's secret"));
}

TEST_CASE("tampering: an agent without the job's secret is told why it cannot join",
          "[integration][multinode]") {
  TempDir dir;
  const int port = freeTcpPort();
  // Node 0 with the secret, node 1 without.
  ChildProcess node0(
      cpprunCommand({"--nnodes=2", "--node-rank=0", "--nproc-per-node=1", "--master-addr=127.0.0.1",
                     "--master-port=" + std::to_string(port),
                     "--rdzv-conf=keep_alive_interval=0.3,join_timeout=5", "--no-python", kWorker,
                     "exit", "0"}),
      {{"CPPRUN_RDZV_SECRET", kSecret}});
  auto client = stranger(port);  // connected: node 0's store is up
  ChildProcess node1(cpprunCommand(
      {"--nnodes=2", "--node-rank=1", "--nproc-per-node=1", "--master-addr=127.0.0.1",
       "--master-port=" + std::to_string(port),
       "--rdzv-conf=keep_alive_interval=0.3,join_timeout=5", "--no-python", kWorker, "exit", "0"}));
  const int exit1 = waitExit(node1);
  INFO(node1.output());
  CHECK(exit1 != 0);
  CHECK_THAT(node1.output(), Catch::Contains("requires the job's secret, and this agent has none"));
  const int exit0 = waitExit(node0);
  CHECK(exit0 != 0);
}

namespace {

// An elastic agent (2..3 nodes) of run id "ghosts" on `port`, with one worker.
std::unique_ptr<ChildProcess> elasticAgent(int port, const std::string& dir,
                                           const std::map<std::string, std::string>& env = {}) {
  return std::make_unique<ChildProcess>(
      cpprunCommand({"--nnodes=2:3", "--rdzv-backend=c10d",
                     "--rdzv-endpoint=127.0.0.1:" + std::to_string(port), "--rdzv-id=ghosts",
                     "--rdzv-conf=keep_alive_interval=0.3,last_call_timeout=1,join_timeout=60",
                     "--nproc-per-node=1", "--no-python", kWorker, "env-json",
                     dir + "/env-{rank}-{restart}.json"}),
      env);
}

// A join record written by a stranger into round 0 once the first agent joined: scheduler rank
// 0 (it would be node 0), its own store, a heartbeat never sent.
void joinGhost(TcpStoreClient& client) {
  client.wait({"cpprun/ghosts/rdzv/round/0/joined"}, std::chrono::seconds(30));
  const int64_t slot = client.add("cpprun/ghosts/rdzv/round/0/joined", 1);
  client.set(
      "cpprun/ghosts/rdzv/round/0/agent/" + std::to_string(slot),
      toBytes(std::string(R"({"host":"ghost","nproc":1,"id":"ghost:1:x",)"
                          R"("scheduler_rank":0,"previous_rank":-1,"store":"10.9.9.9:1"})")));
}

}  // namespace

TEST_CASE("tampering: a member a stranger wrote into an elastic round is dropped, not fatal",
          "[integration][multinode][elastic]") {
  // Finding 3: the ghost became node 0, every worker got its store as MASTER_ADDR:MASTER_PORT,
  // and the job ended with exit 4, its store host saying it "lost the job's store".
  TempDir dir;
  const int port = freeTcpPort();
  auto a0 = elasticAgent(port, dir.path());
  {
    INFO(a0->output());
    REQUIRE(a0->waitForText("this agent serves the job's store", std::chrono::seconds(30)));
  }
  auto client = stranger(port);
  joinGhost(*client);
  auto a1 = elasticAgent(port, dir.path());
  for (auto* a : {a0.get(), a1.get()}) {
    INFO(a->output());
    CHECK(waitExit(*a, std::chrono::seconds(60)) == 0);
    CHECK_THAT(a->output(), Catch::Contains("(ghost) stopped responding"));
    CHECK(a->output().find("lost the job's store") == std::string::npos);
  }
  // Whatever round the workers ran in, their store was the real one.
  for (const char* name : {"env-1-0.json", "env-2-0.json", "env-0-1.json", "env-1-1.json"}) {
    INFO(name);
    REQUIRE(fileExists(dir.path() + "/" + std::string(name)));
    Json e = readJson(dir.path() + "/" + std::string(name));
    CHECK(e["MASTER_ADDR"] == "127.0.0.1");
    CHECK(e["MASTER_PORT"] == std::to_string(port));
  }
}

TEST_CASE("tampering: with the job's secret a stranger cannot join an elastic round",
          "[integration][multinode][elastic]") {
  TempDir dir;
  const int port = freeTcpPort();
  const std::map<std::string, std::string> env = {{"CPPRUN_RDZV_SECRET", kSecret}};
  auto a0 = elasticAgent(port, dir.path(), env);
  {
    INFO(a0->output());
    REQUIRE(a0->waitForText("this agent serves the job's store", std::chrono::seconds(30)));
    auto client = stranger(port);
    CHECK_THROWS_AS(joinGhost(*client), StoreError);
  }
  auto a1 = elasticAgent(port, dir.path(), env);
  for (auto* a : {a0.get(), a1.get()}) {
    INFO(a->output());
    CHECK(waitExit(*a, std::chrono::seconds(60)) == 0);
    CHECK_THAT(a->output(), Catch::Contains("rendezvous complete: 2 nodes"));
    CHECK(a->output().find("(ghost)") == std::string::npos);
  }
}
