// cpprun across hosts: three network namespaces on one bridge, one agent in each, the store on
// the first host's address (reference/platform.md §8). A route in the root namespace makes the
// test subnet unreachable from it, so nothing can leave the machine; every process that talks
// to a namespace address runs inside a namespace. The namespaces, the route and every process
// started here are removed by the test.
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <memory>
#include <set>

#include "agent/processes/process_launcher.h"
#include "tests/support/cpprun_test_helpers.h"
#include "tests/support/netns_hosts.h"
#include "tests/support/test_support.h"
#include "tests/support/torch_peers.h"

namespace {

using namespace cpprun::testing;

// Three hosts (tests/support/netns_hosts.h): namespaces with eth0 = <subnet>.1..3/24 on one
// bridge, the root namespace guarded from the subnet; and the cpprun command lines these tests
// run on them.
class ThreeHosts : public NetnsHosts {
 public:
  ThreeHosts() : NetnsHosts(3) {}

  // Cuts host i off the bridge (its own eth0 stays up: packets just vanish).
  void cut(int i) { cutOff(i); }

  // An elastic cpprun (2 to 3 nodes) on host i; the endpoint is on host 1, whose agent serves
  // the store (the others find the address is not theirs).
  std::unique_ptr<ChildProcess> elasticAgent(int i, const std::vector<std::string>& args,
                                             const std::map<std::string, std::string>& env = {}) {
    std::vector<std::string> argv = {
        CPPRUN_BINARY, "--nnodes=2:3", "--rdzv-backend=c10d",
        "--rdzv-endpoint=" + address(1) + ":29400",
        "--rdzv-conf=keep_alive_interval=0.5,last_call_timeout=1,join_timeout=60"};
    argv.insert(argv.end(), args.begin(), args.end());
    return std::make_unique<ChildProcess>(onHost(i, argv), env);
  }

  // cpprun as node `node_rank` on host node_rank + 1, store on host 1.
  std::unique_ptr<ChildProcess> agent(int node_rank, const std::vector<std::string>& args,
                                      const std::map<std::string, std::string>& env = {}) {
    std::vector<std::string> argv = {CPPRUN_BINARY,
                                     "--nnodes=3",
                                     "--node-rank=" + std::to_string(node_rank),
                                     "--master-addr=" + address(1),
                                     "--master-port=29500",
                                     "--rdzv-conf=keep_alive_interval=0.5,join_timeout=60"};
    argv.insert(argv.end(), args.begin(), args.end());
    return std::make_unique<ChildProcess>(onHost(node_rank + 1, argv), env);
  }
};

int waitExit(ChildProcess& agent, std::chrono::milliseconds bound = 90s) {
  auto status = agent.wait(bound);
  REQUIRE(status.has_value());
  return exitCodeOf(*status);
}

// Node 2 and 1 first, node 0 (the store) last, as a scheduler might start them.
std::vector<std::unique_ptr<ChildProcess>> startAgents(ThreeHosts& hosts,
                                                       const std::vector<std::string>& args) {
  std::vector<std::unique_ptr<ChildProcess>> agents(3);
  for (int r = 2; r >= 0; --r) agents[static_cast<size_t>(r)] = hosts.agent(r, args);
  return agents;
}

// ddp_train.py on one worker per host with `peer`'s interpreter: one group of three, identical
// replicas.
void ddpSpansThreeHosts(const TorchPeer& peer) {
  requireTorchPeer(peer);
  ThreeHosts hosts;
  TempDir dir;
  std::vector<std::unique_ptr<ChildProcess>> agents(3);
  for (int r = 2; r >= 0; --r) {
    agents[static_cast<size_t>(r)] =
        hosts.agent(r,
                    {"--nproc-per-node=1", sourcePath("examples/python/ddp_train.py"), "--out",
                     dir.path(), "--steps", "10"},
                    {{"PYTHON_EXEC", peer.python}, {"GLOO_SOCKET_IFNAME", "eth0"}});
  }
  for (auto& a : agents) {
    const int code = waitExit(*a);
    INFO(a->output());  // after the exit, so that a failure shows what the agent said
    CHECK(code == 0);
  }
  std::set<double> checksums;
  for (int r = 0; r < 3; ++r) {
    Json result = readJson(dir.path() + "/result-" + std::to_string(r) + ".json");
    CHECK(result["world_size"] == 3);
    CHECK(result["all_reduce"] == 6.0);  // 1 + 2 + 3 across three hosts
    checksums.insert(result["param_checksum"].get<double>());
  }
  CHECK(checksums.size() == 1);  // DDP kept every replica identical
}

// Waits (60 s: three imports of torch on a shared machine, then the group forms) until `agent`
// relays its worker's "rank R of W: holding" (ddp_train.py --hold-first-attempt); otherwise fails
// showing every agent's output.
void requireHolding(ChildProcess& agent, std::vector<std::unique_ptr<ChildProcess>>& agents) {
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left <= 0ms) break;
    auto line = agent.waitForLine("[default", left);
    if (!line) break;
    if (line->find(": holding") != std::string::npos) return;
  }
  std::string outputs;
  for (size_t j = 0; j < agents.size(); ++j) {
    agents[j]->readAvailable(100ms);
    outputs += "--- agent " + std::to_string(j) + " ---\n" + agents[j]->output() + "\n";
  }
  FAIL("an agent relayed no 'holding' line of its worker within 60 s\n" << outputs);
}

// Elastic agents on hosts 1..3 whose workers run: kills the agent of host 3 (as an OOM kill
// would) and checks that the two others re-form the group and finish it.
void killAgentAndReform(std::vector<std::unique_ptr<ChildProcess>>& agents) {
  killAgentOf(*agents[2]);
  for (int i : {0, 1}) {
    ChildProcess& a = *agents[static_cast<size_t>(i)];
    const int code = waitExit(a);
    INFO(a.output());
    CHECK(code == 0);
    CHECK_THAT(a.output(), Catch::Contains("re-forming the group") &&
                               Catch::Contains("all 2 workers of 2 nodes succeeded"));
  }
  waitExit(*agents[2]);
}

}  // namespace

TEST_CASE("three hosts: a PyTorch gloo DDP script spans them unchanged",
          "[integration][netns][torch]") {
  ddpSpansThreeHosts(torch113());
}

TEST_CASE("three hosts, torch 2.x: a PyTorch gloo DDP script spans them unchanged",
          "[integration][netns][torch][torch2]") {
  ddpSpansThreeHosts(torch2());
}

TEST_CASE("a cut link is detected within the heartbeat bound and no host hangs",
          "[integration][netns]") {
  ThreeHosts hosts;
  TempDir dir;
  const std::string d = dir.path();
  auto agents = startAgents(hosts, {"--nproc-per-node=1", "--no-python", kWorker, "touch",
                                    d + "/up-{rank}", "print", "ready {rank}", "sleep-forever"});
  for (int r = 0; r < 3; ++r) {
    REQUIRE(relayed(*agents[static_cast<size_t>(r)], "[default" + std::to_string(r) + "]:ready"));
  }
  const auto cut = std::chrono::steady_clock::now();
  hosts.cut(2);  // node 1
  CHECK(waitExit(*agents[0]) == 1);
  CHECK(waitExit(*agents[2]) == 1);
  CHECK(waitExit(*agents[1]) == 4);
  // 0.5 s x 3 silent intervals, one interval of checking, the client's own bound, teardown.
  CHECK(std::chrono::steady_clock::now() - cut < 6s);
  CHECK_THAT(agents[0]->output(), Catch::Contains("the agent of node 1"));
  CHECK_THAT(agents[2]->output(), Catch::Contains("the agent of node 1"));
  CHECK_THAT(agents[1]->output(), Catch::Contains("lost the job's store at " + hosts.address(1)));
  CHECK(allGone(processesMentioning(d)));
}

TEST_CASE("across hosts: a killed agent fails the static job, a killed store host ends it",
          "[integration][netns]") {
  ThreeHosts hosts;
  TempDir dir;
  const std::string d = dir.path();
  const std::vector<std::string> wait_args = {
      "--nproc-per-node=1", "--no-python", kWorker,        "touch",
      d + "/up-{rank}",     "print",       "ready {rank}", "sleep-forever"};
  {
    auto agents = startAgents(hosts, wait_args);
    for (int r = 0; r < 3; ++r) {
      REQUIRE(relayed(*agents[static_cast<size_t>(r)], "[default" + std::to_string(r) + "]:ready"));
    }
    killAgentOf(*agents[2]);
    for (int r : {0, 1}) {
      ChildProcess& a = *agents[static_cast<size_t>(r)];
      INFO(a.output());
      CHECK(waitExit(a) == 1);
      CHECK_THAT(a.output(), Catch::Contains("Root Cause") &&
                                 Catch::Contains("the agent of node 2") &&
                                 Catch::Contains("stopped responding"));
    }
    waitExit(*agents[2]);
    CHECK(allGone(processesMentioning(d)));
  }
  {
    auto agents = startAgents(hosts, wait_args);
    for (int r = 0; r < 3; ++r) {
      REQUIRE(relayed(*agents[static_cast<size_t>(r)], "[default" + std::to_string(r) + "]:ready"));
    }
    const auto killed = std::chrono::steady_clock::now();
    killAgentOf(*agents[0]);
    for (int r : {1, 2}) {
      ChildProcess& a = *agents[static_cast<size_t>(r)];
      INFO(a.output());
      CHECK(waitExit(a) == 4);
      CHECK_THAT(a.output(), Catch::Contains("lost the job's store at " + hosts.address(1)));
    }
    CHECK(std::chrono::steady_clock::now() - killed < 5s);
    waitExit(*agents[0]);
    CHECK(allGone(processesMentioning(d)));
  }
}

TEST_CASE("across hosts, elastic: a killed agent leaves the others to re-form and finish",
          "[integration][netns][elastic]") {
  ThreeHosts hosts;
  TempDir dir;
  const std::string d = dir.path();
  const std::vector<std::string> args = {"--nproc-per-node=1",
                                         "--no-python",
                                         kWorker,
                                         "touch",
                                         d + "/up-{rank}-{restart}",
                                         "print",
                                         "ready {rank} {restart}",
                                         "exit-if-restart",
                                         "1",
                                         "0",
                                         "sleep-forever"};
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int i = 1; i <= 3; ++i) agents.push_back(hosts.elasticAgent(i, args));
  requireEveryAgentRelays(agents);
  CHECK_THAT(agents[0]->output(), Catch::Contains("this agent serves the job's store"));
  killAgentAndReform(agents);
  CHECK(allGone(processesMentioning(d)));
}

TEST_CASE("across hosts: a worker crash on one host restarts every host from one budget",
          "[integration][netns]") {
  ThreeHosts hosts;
  TempDir dir;
  const std::string d = dir.path();
  // Attempt 0: rank 1 (host 2) dies by SIGSEGV while the others wait. The job's one restart
  // (--max-restarts=1) runs on every host, and attempt 1 succeeds everywhere.
  std::vector<std::unique_ptr<ChildProcess>> agents(3);
  for (int r = 2; r >= 0; --r) {
    agents[static_cast<size_t>(r)] =
        hosts.agent(r, {"--nproc-per-node=1", "--max-restarts=1", "--no-python", kWorker,
                        "env-json", d + "/env-{rank}-{restart}.json", "exit-if-restart", "1", "0",
                        "kill-self-if-rank", "1", "SEGV", "sleep-forever"});
  }
  for (auto& a : agents) {
    INFO(a->output());
    CHECK(waitExit(*a) == 0);
    CHECK_THAT(a->output(), Catch::Contains("rank 1 was killed by SIGSEGV") &&
                                Catch::Contains("restarting every node (restart 1 of 1)"));
  }
  for (int r = 0; r < 3; ++r) {
    Json e = readJson(d + "/env-" + std::to_string(r) + "-1.json");
    CHECK(e["TORCHELASTIC_RESTART_COUNT"] == "1");
    CHECK(e["WORLD_SIZE"] == "3");
  }
  CHECK(allGone(processesMentioning(d)));
}

TEST_CASE("across hosts, elastic, torch 2.x: DDP re-forms on the two hosts left and trains",
          "[integration][netns][elastic][torch][torch2]") {
  requireTorchPeer(torch2());
  ThreeHosts hosts;
  TempDir dir;
  const std::string d = dir.path();
  // Attempt 0: the three ranks form one gloo group and hold. The agent of host 3 is killed; the
  // two others re-form (attempt 1, 2 nodes) and ddp_train.py trains on them.
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int i = 1; i <= 3; ++i) {
    agents.push_back(
        hosts.elasticAgent(i,
                           {"--nproc-per-node=1", sourcePath("examples/python/ddp_train.py"),
                            "--out", d, "--steps", "10", "--hold-first-attempt"},
                           {{"PYTHON_EXEC", torch2().python}, {"GLOO_SOCKET_IFNAME", "eth0"}}));
  }
  for (auto& a : agents) requireHolding(*a, agents);
  killAgentAndReform(agents);
  std::set<double> checksums;
  for (int r = 0; r < 2; ++r) {
    Json result = readJson(d + "/result-" + std::to_string(r) + ".json");
    CHECK(result["world_size"] == 2);
    CHECK(result["all_reduce"] == 3.0);  // 1 + 2: the group of the two hosts left
    checksums.insert(result["param_checksum"].get<double>());
  }
  CHECK(checksums.size() == 1);
  CHECK_FALSE(std::ifstream(d + "/result-2.json").good());
  CHECK(allGone(processesMentioning(d)));
}
