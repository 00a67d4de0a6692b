// Faults of the c10d store host, two agents on loopback (issue 36): a store host frozen with
// SIGSTOP ends the other node within the documented bound, and on waking says it was stopped
// instead of blaming the healthy node; and the store host's memory stays flat over 2,000
// restarts (past attempts' keys are deleted, stale_job_keys.h). Synchronisation goes through
// relayed lines and process exits; every process a test starts is gone at its end.
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <memory>
#include <string>

#include "agent/processes/process_launcher.h"
#include "tests/support/cpprun_test_helpers.h"
#include "tests/support/test_support.h"

namespace {

using namespace cpprun::testing;

// The agents of a 2-node static job on 127.0.0.1:`port`, node 0 (the store host) last.
// `node1_log`: node 1's output goes to that file (no pipe for the test to drain), else to the
// test.
std::vector<std::unique_ptr<ChildProcess>> startPair(int port, const std::string& conf,
                                                     const std::vector<std::string>& extra,
                                                     const std::vector<std::string>& worker,
                                                     const std::string& node1_log = "") {
  std::vector<std::unique_ptr<ChildProcess>> agents(2);
  for (int rank = 1; rank >= 0; --rank) {
    std::vector<std::string> args = {"--nnodes=2",
                                     "--node-rank=" + std::to_string(rank),
                                     "--nproc-per-node=1",
                                     "--master-addr=127.0.0.1",
                                     "--master-port=" + std::to_string(port),
                                     "--rdzv-conf=" + conf};
    args.insert(args.end(), extra.begin(), extra.end());
    args.push_back("--no-python");
    args.insert(args.end(), worker.begin(), worker.end());
    std::vector<std::string> argv = cpprunCommand(args);
    if (rank == 1 && !node1_log.empty()) {
      argv.insert(argv.begin(), {"/bin/sh", "-c", "exec \"$@\" >" + node1_log + " 2>&1", "sh"});
    }
    agents[static_cast<size_t>(rank)] = std::make_unique<ChildProcess>(argv);
  }
  return agents;
}

int waitExit(ChildProcess& agent, std::chrono::milliseconds bound) {
  auto status = agent.wait(bound);
  REQUIRE(status.has_value());
  return exitCodeOf(*status);
}

// VmRSS of `pid` in kB, from /proc/<pid>/status.
long residentKb(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

}  // namespace

TEST_CASE(
    "a store host frozen by SIGSTOP: the other node exits 4 within the bound, the host "
    "says it was stopped and blames nobody",
    "[integration][multinode]") {
  TempDir dir;
  const std::string d = dir.path();
  // keep_alive_interval 1 s x 3: a request unanswered for the bound, 3 s, loses the store, and
  // one is due at least every interval: the others end within 4 s of the freeze (docs/
  // rendezvous.md). Before, the reconnect waited the bound again: 6 s at the least.
  const auto bound = std::chrono::milliseconds(3000);
  const auto interval = std::chrono::milliseconds(1000);
  auto agents =
      startPair(freeTcpPort(), "keep_alive_interval=1,keep_alive_max_attempt=3", {},
                {kWorker, "touch", d + "/up-{rank}", "print", "ready {rank}", "sleep-forever"});
  requireEveryAgentRelays(agents);
  std::vector<pid_t> host_agent = cpprun::agent::childrenOf(agents[0]->pid());
  REQUIRE(host_agent.size() == 1);
  REQUIRE(::kill(host_agent[0], SIGSTOP) == 0);
  const auto frozen = std::chrono::steady_clock::now();
  {
    INFO(agents[1]->output());
    CHECK(waitExit(*agents[1], 30s) == 4);
    const auto took = std::chrono::steady_clock::now() - frozen;
    CHECK(took >= bound);
    CHECK(took < bound + interval + 800ms);
    CHECK_THAT(agents[1]->output(), Catch::Contains("lost the job's store at 127.0.0.1:") &&
                                        Catch::Contains("no reply within the 3000 ms timeout"));
  }
  REQUIRE(::kill(host_agent[0], SIGCONT) == 0);
  INFO(agents[0]->output());
  CHECK(waitExit(*agents[0], 30s) == 4);
  const std::string& host = agents[0]->output();
  CHECK_THAT(host, Catch::Contains("this agent was stopped for") &&
                       Catch::Contains("the job ended without this node"));
  // Node 1 was healthy: the host names it nowhere (before: "the agent of node 1 (...) stopped
  // responding" as the job's root cause).
  CHECK_THAT(host, !Catch::Contains("stopped responding") && !Catch::Contains("node 1") &&
                       !Catch::Contains("Root Cause"));
  CHECK(allGone(processesMentioning(d)));
}

TEST_CASE("store host memory: flat over 2,000 restarts of a 2-node job",
          "[integration][multinode][slow]") {
  TempDir dir;
  const std::string d = dir.path();
  // Workers that fail at once: every attempt is a job-wide restart, a few ms each.
  auto agents = startPair(freeTcpPort(), "join_timeout=60", {"--max-restarts=2000"},
                          {"/bin/sh", "-c", "exit 1", d}, d + "/node1.log");
  auto reach = [&](int attempt) {
    return agents[0]->waitForText("attempt " + std::to_string(attempt) + ": started", 100s);
  };
  REQUIRE(reach(1));
  std::vector<pid_t> host_agent = cpprun::agent::childrenOf(agents[0]->pid());
  REQUIRE(host_agent.size() == 1);
  REQUIRE(reach(200));
  const long at_200 = residentKb(host_agent[0]);
  REQUIRE(reach(1990));
  const long at_1990 = residentKb(host_agent[0]);
  WARN("store host VmRSS: " << at_200 << " kB after 200 restarts, " << at_1990
                            << " kB after 1,990");
  // Before: +6.5 MB (8.4 -> 14.9 MB: every attempt's keys and the exclusion history kept).
  CHECK(at_200 > 0);
  CHECK(at_1990 - at_200 < 512);
  for (auto& a : agents) CHECK(waitExit(*a, 60s) == 1);
  CHECK(allGone(processesMentioning(d)));
}
