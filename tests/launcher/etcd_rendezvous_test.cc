// cpprun agents meeting in a real 3-member etcd cluster on loopback (--rdzv-backend etcd-v2):
// a job of 2 and of 3 agents, the round's node 0 (the decider and the workers' store) killed
// in an elastic and in a static job, and etcd down at start. Every wait is bounded; every test
// checks that nothing it started is left running.
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "tests/launcher/cpprun_test_helpers.h"
#include "tests/support/etcd_cluster.h"
#include "tests/support/test_support.h"

namespace {

using namespace cpprun::testing;

std::unique_ptr<ChildProcess> etcdAgent(const std::string& endpoints, const std::string& run_id,
                                        const std::string& nnodes,
                                        const std::vector<std::string>& worker_args,
                                        const std::string& conf = "") {
  std::vector<std::string> args = {
      "--nnodes=" + nnodes,
      "--rdzv-backend=etcd-v2",
      "--rdzv-endpoint=" + endpoints,
      "--rdzv-id=" + run_id,
      "--rdzv-conf=keep_alive_interval=0.3,last_call_timeout=1,join_timeout=30" + conf,
      "--nproc-per-node=1",
      "--no-python",
      kWorker};
  args.insert(args.end(), worker_args.begin(), worker_args.end());
  return std::make_unique<ChildProcess>(cpprunCommand(args));
}

int waitExit(ChildProcess& agent, std::chrono::milliseconds bound = 60s) {
  auto status = agent.wait(bound);
  REQUIRE(status.has_value());
  return exitCodeOf(*status);
}

// The node number of the first rendezvous this agent completed (-1: none).
int firstNodeNumber(const std::string& output) {
  const std::string marker = "this node is node ";
  const size_t at = output.find(marker);
  return at == std::string::npos ? -1 : std::atoi(output.c_str() + at + marker.size());
}

nlohmann::json readJson(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str(), nullptr, false);
}

std::string uniqueRunId(const char* what) {
  return std::string(what) + "-" + std::to_string(::getpid()) + "-" + std::to_string(freeTcpPort());
}

void runToSuccess(EtcdCluster& cluster, int nodes) {
  TempDir dir;
  const std::string d = dir.path();
  const std::string id = uniqueRunId("ok");
  std::vector<std::unique_ptr<ChildProcess>> agents;
  const auto began = std::chrono::steady_clock::now();
  for (int i = 0; i < nodes; ++i) {
    agents.push_back(etcdAgent(cluster.endpointsFlag(), id, std::to_string(nodes),
                               {"env-json", d + "/env-{rank}.json", "exit", "0"}));
  }
  for (auto& a : agents) {
    const int code = waitExit(*a);
    INFO(a->output());
    CHECK(code == 0);
  }
  WARN(nodes << " agents on etcd: job done in "
             << std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count()
             << " s");
  std::set<int> ranks;
  std::set<std::string> masters;
  for (int r = 0; r < nodes; ++r) {
    nlohmann::json env = readJson(d + "/env-" + std::to_string(r) + ".json");
    REQUIRE(env.is_object());
    ranks.insert(std::stoi(env["RANK"].get<std::string>()));
    CHECK(env["WORLD_SIZE"].get<std::string>() == std::to_string(nodes));
    masters.insert(env["MASTER_ADDR"].get<std::string>() + ":" +
                   env["MASTER_PORT"].get<std::string>());
  }
  CHECK(ranks.size() == static_cast<size_t>(nodes));
  CHECK(masters.size() == 1);
  CHECK(allGone(processesMentioning(d)));
}

}  // namespace

TEST_CASE("etcd-v2 backend: 2 and 3 agents form one job with distinct ranks and one store",
          "[integration][multinode][etcd]") {
  EtcdCluster cluster;  // 3 members
  SECTION("2 agents") { runToSuccess(cluster, 2); }
  SECTION("3 agents") { runToSuccess(cluster, 3); }
}

TEST_CASE(
    "etcd-v2 backend: losing the round's node 0 re-forms an elastic job and fails a static one",
    "[integration][multinode][etcd]") {
  EtcdCluster cluster;  // 3 members
  const bool elastic = GENERATE(true, false);
  TempDir dir;
  const std::string d = dir.path();
  // Attempt 0 waits forever; a re-formed attempt succeeds.
  const std::vector<std::string> args = {"touch",     d + "/up-{rank}",  "print",
                                         "up {rank}", "exit-if-restart", "1",
                                         "0",         "sleep-forever"};
  std::vector<std::unique_ptr<ChildProcess>> agents;
  const std::string id = uniqueRunId(elastic ? "elastic" : "static");
  for (int i = 0; i < 3; ++i) {
    agents.push_back(etcdAgent(cluster.endpointsFlag(), id, elastic ? "2:3" : "3", args));
  }
  requireEveryAgentRelays(agents);
  size_t victim = agents.size();
  for (size_t i = 0; i < agents.size(); ++i) {
    if (firstNodeNumber(agents[i]->output()) == 0) victim = i;
  }
  REQUIRE(victim < agents.size());
  killAgentOf(*agents[victim]);
  for (size_t i = 0; i < agents.size(); ++i) {
    if (i == victim) continue;
    ChildProcess& a = *agents[i];
    const int code = waitExit(a);
    INFO(a.output());
    if (elastic) {
      CHECK(code == 0);
      CHECK_THAT(a.output(), Catch::Contains("stopped responding") &&
                                 Catch::Contains("rendezvous complete: 2 nodes") &&
                                 Catch::Contains("all 2 workers of 2 nodes succeeded"));
    } else {
      CHECK(code == 1);
      CHECK_THAT(a.output(),
                 Catch::Contains("the agent of node 0") && Catch::Contains("stopped responding"));
    }
  }
  waitExit(*agents[victim]);
  CHECK(allGone(processesMentioning(d)));
}

TEST_CASE("etcd-v2 backend: etcd down at start is a clear error within the join timeout",
          "[integration][multinode][etcd]") {
  TempDir dir;
  const std::string endpoint = "127.0.0.1:" + std::to_string(freeTcpPort());
  const auto began = std::chrono::steady_clock::now();
  ChildProcess agent(
      cpprunCommand({"--nnodes=2", "--rdzv-backend=etcd-v2", "--rdzv-endpoint=" + endpoint,
                     "--rdzv-conf=join_timeout=3", "--nproc-per-node=1", "--no-python", kWorker,
                     "touch", dir.path() + "/never"}));
  const int code = waitExit(agent, 30s);
  const auto took = std::chrono::steady_clock::now() - began;
  INFO(agent.output());
  // The lost-store exit code; the join timeout (3 s) spent waiting for etcd, not more.
  CHECK(code == 4);
  CHECK(took >= 2500ms);
  CHECK(took < 10s);
  CHECK_THAT(agent.output(),
             Catch::Contains("cannot connect to etcd") && Catch::Contains(endpoint));
  CHECK(allGone(processesMentioning(dir.path())));
  WARN("etcd down at start: exit code " << code);
}

TEST_CASE("etcd-v2 backend: bad endpoints and rdzv-conf values exit 2 naming them",
          "[integration][etcd]") {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--rdzv-endpoint=e1:70000"}, "e1:70000"},
      {{"--rdzv-endpoint=e1,,e2"}, "--rdzv-endpoint e1,,e2"},
      {{"--rdzv-endpoint=e1", "--rdzv-conf=protocol=gopher"}, "protocol=gopher"},
      {{"--rdzv-endpoint=e1", "--rdzv-conf=protocol=https,cacert=/nonexistent/ca.pem"},
       "cacert=/nonexistent/ca.pem"},
      {{"--rdzv-endpoint=e1", "--rdzv-conf=join_timeout=soon"}, "join_timeout=soon"}};
  for (const auto& [flags, named] : cases) {
    std::vector<std::string> args = {"--nnodes=2", "--rdzv-backend=etcd"};
    args.insert(args.end(), flags.begin(), flags.end());
    args.insert(args.end(), {"--no-python", kWorker, "exit", "0"});
    ChildProcess run(cpprunCommand(args));
    const int code = waitExit(run, 10s);
    INFO(run.output());
    CHECK(code == 2);
    CHECK_THAT(run.output(), Catch::Contains(named));
  }
}
