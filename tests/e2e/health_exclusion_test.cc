// Health checks before every join and the exclusion of a node that keeps failing (issue 23,
// items 4 and 5), with real cpprun agents: on loopback over the c10d TCP store and over a real
// etcd. Every wait is bounded and synchronises on process exits, relayed lines and the event
// log; each test would fail with the old behaviour (the unhealthy or failing node would take
// part in the job: three nodes instead of two, or exit 1 when the budget is spent).
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <memory>
#include <sstream>

#include "tests/support/cpprun_test_helpers.h"
#include "tests/support/etcd_cluster.h"
#include "tests/support/test_support.h"

namespace {

using namespace cpprun::testing;

int waitExit(ChildProcess& agent, std::chrono::milliseconds bound = 60s) {
  auto status = agent.wait(bound);
  REQUIRE(status.has_value());
  return exitCodeOf(*status);
}

// The events named `name` of an --event-log file.
std::vector<Json> events(const std::string& path, const std::string& name) {
  std::vector<Json> found;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    Json e = Json::parse(line, nullptr, false);
    if (e.is_object() && e.value("event", "") == name) found.push_back(e);
  }
  return found;
}

// One agent of an elastic job (--nnodes=2:3, one worker) over `backend`; `extra` before the
// worker's command.
std::unique_ptr<ChildProcess> agentOf(const std::vector<std::string>& rdzv,
                                      const std::vector<std::string>& extra,
                                      const std::vector<std::string>& worker_args) {
  std::vector<std::string> args = {"--nnodes=2:3", "--nproc-per-node=1"};
  args.insert(args.end(), rdzv.begin(), rdzv.end());
  args.insert(args.end(), extra.begin(), extra.end());
  args.insert(args.end(), {"--no-python", kWorker});
  args.insert(args.end(), worker_args.begin(), worker_args.end());
  return std::make_unique<ChildProcess>(cpprunCommand(args));
}

std::vector<std::string> c10d(int port) {
  return {"--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:" + std::to_string(port),
          "--rdzv-conf=keep_alive_interval=0.3,last_call_timeout=2,join_timeout=30"};
}

std::vector<std::string> etcd(const EtcdCluster& cluster, const std::string& run_id) {
  return {"--rdzv-backend=etcd-v2", "--rdzv-endpoint=" + cluster.endpointsFlag(),
          "--rdzv-id=" + run_id,
          "--rdzv-conf=keep_alive_interval=0.3,last_call_timeout=2,join_timeout=30"};
}

// Workers for the exclusion tests: the good ones wait until the bad one has started, so the
// bad node is in the first attempt however late its agent starts; the bad one always fails.
std::vector<std::string> goodWorker(const std::string& dir) {
  return {"wait-file", dir + "/bad-started", "30", "print", "up {rank} {restart}", "exit", "0"};
}
std::vector<std::string> badWorker(const std::string& dir) {
  return {"touch", dir + "/bad-started", "eprint", "CUDA error: uncorrectable ECC error", "exit",
          "1"};
}

std::string uniqueRunId(const char* what) {
  return std::string(what) + "-" + std::to_string(::getpid()) + "-" + std::to_string(freeTcpPort());
}

// The c10d store host is the first agent to bind the endpoint: start it and wait until it
// says so, so that the node under test is not the store host (which must join; see
// docs/rendezvous.md).
std::unique_ptr<ChildProcess> storeHost(int port, const std::vector<std::string>& extra,
                                        const std::vector<std::string>& worker_args) {
  auto host = agentOf(c10d(port), extra, worker_args);
  REQUIRE(host->waitForText("this agent serves the job's store", 30s));
  return host;
}

// A and B healthy, C with `c_extra`; checks that C left with `c_exit` and that A and B finished
// the job on their own, and returns C's output.
void requireTwoFinishWithoutC(std::vector<std::unique_ptr<ChildProcess>>& healthy, ChildProcess& c,
                              int c_exit) {
  {
    INFO(c.output());
    CHECK(waitExit(c) == c_exit);
  }
  for (auto& a : healthy) {
    INFO(a->output());
    CHECK(waitExit(*a) == 0);
    CHECK_THAT(a->output(), Catch::Contains("all 2 workers of 2 nodes succeeded"));
  }
}

}  // namespace

TEST_CASE("c10d: a node whose health command fails does not join, the job finishes on the others",
          "[integration][multinode][elastic][health]") {
  TempDir dir;
  const std::string d = dir.path();
  const int port = freeTcpPort();
  const std::vector<std::string> worker = {"print", "up {rank}", "exit", "0"};
  std::vector<std::unique_ptr<ChildProcess>> healthy;
  healthy.push_back(storeHost(port, {}, worker));
  healthy.push_back(agentOf(c10d(port), {}, worker));
  auto c = agentOf(c10d(port),
                   {"--health-check=echo checking; echo 'disk /data read-only'; exit 3",
                    "--event-log=" + d + "/c.jsonl"},
                   worker);
  requireTwoFinishWithoutC(healthy, *c, 5);
  CHECK_THAT(c->output(),
             Catch::Contains("exited with code 3") && Catch::Contains("disk /data read-only") &&
                 Catch::Contains("this node does not join") && !Catch::Contains("up "));
  const auto failed = events(d + "/c.jsonl", "health_check_failed");
  REQUIRE(failed.size() == 1);
  CHECK(failed[0]["check"] == "command");
  CHECK(failed[0]["action"] == "leave");
  CHECK(failed[0]["attempt"] == 0);
  CHECK(failed[0]["output"].dump().find("disk /data read-only") != std::string::npos);
  const auto finished = events(d + "/c.jsonl", "job_finished");
  REQUIRE(finished.size() == 1);
  CHECK(finished[0]["outcome"] == "unhealthy");
  CHECK(finished[0]["exit_code"] == 5);
}

TEST_CASE("c10d: a node that fails its health check before a re-join leaves, the others re-form",
          "[integration][multinode][elastic][health]") {
  TempDir dir;
  const std::string d = dir.path();
  const int port = freeTcpPort();
  // Attempt 0 fails everywhere (a restart, so every node re-joins); attempt 1 succeeds.
  const std::vector<std::string> worker = {
      "print", "up {rank} {restart}", "exit-if-restart", "0", "1", "exit", "0"};
  const std::vector<std::string> budget = {"--max-restarts=1"};
  std::vector<std::unique_ptr<ChildProcess>> healthy;
  healthy.push_back(storeHost(port, budget, worker));
  healthy.push_back(agentOf(c10d(port), budget, worker));
  auto c = agentOf(c10d(port),
                   {"--max-restarts=1", "--event-log=" + d + "/c.jsonl",
                    "--health-check=test ! -e " + d + "/checked && touch " + d +
                        "/checked || { echo 'GPU 3 fell off the bus'; exit 7; }"},
                   worker);
  requireTwoFinishWithoutC(healthy, *c, 5);
  CHECK_THAT(c->output(), Catch::Contains("GPU 3 fell off the bus"));
  CHECK(events(d + "/c.jsonl", "health_check_passed").size() == 1);
  const auto failed = events(d + "/c.jsonl", "health_check_failed");
  REQUIRE(failed.size() == 1);
  CHECK(failed[0]["attempt"] >= 1);
}

TEST_CASE("c10d: a health command that outlives --health-check-timeout fails the node",
          "[integration][multinode][elastic][health]") {
  const int port = freeTcpPort();
  const std::vector<std::string> worker = {"exit", "0"};
  std::vector<std::unique_ptr<ChildProcess>> healthy;
  healthy.push_back(storeHost(port, {}, worker));
  healthy.push_back(agentOf(c10d(port), {}, worker));
  const auto began = std::chrono::steady_clock::now();
  auto c = agentOf(c10d(port), {"--health-check=sleep 30", "--health-check-timeout=0.5"}, worker);
  requireTwoFinishWithoutC(healthy, *c, 5);
  CHECK(std::chrono::steady_clock::now() - began < 20s);
  CHECK_THAT(c->output(), Catch::Contains("did not finish within 0.5 s"));
}

TEST_CASE("c10d: a node whose workers keep failing is excluded and the job goes on without it",
          "[integration][multinode][elastic][exclusion]") {
  TempDir dir;
  const std::string d = dir.path();
  const int port = freeTcpPort();
  const std::vector<std::string> good = goodWorker(d);
  const std::vector<std::string> bad = badWorker(d);
  // One restart in the budget: without exclusion the second failure would end the job (exit 1
  // everywhere).
  const std::vector<std::string> flags = {"--max-restarts=1", "--exclude-after=2"};
  std::vector<std::unique_ptr<ChildProcess>> healthy;
  auto with_log = [&](const std::string& name) {
    std::vector<std::string> f = flags;
    f.push_back("--event-log=" + d + "/" + name + ".jsonl");
    return f;
  };
  healthy.push_back(storeHost(port, with_log("a"), good));
  healthy.push_back(agentOf(c10d(port), with_log("b"), good));
  auto c = agentOf(c10d(port), with_log("c"), bad);
  requireTwoFinishWithoutC(healthy, *c, 6);
  CHECK_THAT(c->output(), Catch::Contains("this node is excluded from the job") &&
                              Catch::Contains("caused 2 failures"));
  for (const char* name : {"a", "b"}) {
    INFO(name);
    const auto excluded = events(d + "/" + name + ".jsonl", "node_excluded");
    REQUIRE(excluded.size() == 1);
    CHECK(excluded[0]["self"] == false);
  }
  CHECK_THAT(healthy[0]->output(),
             Catch::Contains("left the job: node") && Catch::Contains("was excluded"));
  const auto own = events(d + "/c.jsonl", "node_excluded");
  REQUIRE(own.size() == 1);
  CHECK(own[0]["self"] == true);
  const auto finished = events(d + "/c.jsonl", "job_finished");
  REQUIRE(finished.size() == 1);
  CHECK(finished[0]["outcome"] == "excluded");
}

TEST_CASE("c10d: --exclude-after 0 turns exclusion off: the budget ends the job",
          "[integration][multinode][elastic][exclusion]") {
  TempDir dir;
  const int port = freeTcpPort();
  const std::vector<std::string> good = goodWorker(dir.path());
  const std::vector<std::string> bad = badWorker(dir.path());
  const std::vector<std::string> flags = {"--max-restarts=1", "--exclude-after=0"};
  std::vector<std::unique_ptr<ChildProcess>> agents;
  agents.push_back(storeHost(port, flags, good));
  agents.push_back(agentOf(c10d(port), flags, good));
  agents.push_back(agentOf(c10d(port), flags, bad));
  for (auto& a : agents) {
    INFO(a->output());
    CHECK(waitExit(*a) == 1);
    CHECK_THAT(a->output(), !Catch::Contains("excluded"));
  }
}

TEST_CASE("etcd: a node whose workers keep failing is excluded and the job goes on without it",
          "[integration][multinode][elastic][exclusion][etcd]") {
  EtcdClusterOptions eo;
  eo.members = 1;
  EtcdCluster cluster(eo);
  TempDir dir;
  const std::string d = dir.path();
  const std::string id = uniqueRunId("exclude");
  const std::vector<std::string> good = goodWorker(d);
  const std::vector<std::string> bad = badWorker(d);
  const std::vector<std::string> flags = {"--max-restarts=1", "--exclude-after=2",
                                          "--event-log=" + d + "/events.jsonl"};
  std::vector<std::unique_ptr<ChildProcess>> healthy;
  healthy.push_back(agentOf(etcd(cluster, id), flags, good));
  healthy.push_back(agentOf(etcd(cluster, id), flags, good));
  auto c = agentOf(etcd(cluster, id), flags, bad);
  requireTwoFinishWithoutC(healthy, *c, 6);
  CHECK_THAT(c->output(), Catch::Contains("this node is excluded from the job"));
  CHECK(events(d + "/events.jsonl", "node_excluded").size() == 3);  // every node says so
}

TEST_CASE("etcd: a node that fails its health check before a re-join leaves, the others re-form",
          "[integration][multinode][elastic][health][etcd]") {
  EtcdClusterOptions eo;
  eo.members = 1;
  EtcdCluster cluster(eo);
  TempDir dir;
  const std::string d = dir.path();
  const std::string id = uniqueRunId("health");
  const std::vector<std::string> worker = {"exit-if-restart", "0", "1", "exit", "0"};
  const std::vector<std::string> budget = {"--max-restarts=1"};
  std::vector<std::unique_ptr<ChildProcess>> healthy;
  healthy.push_back(agentOf(etcd(cluster, id), budget, worker));
  healthy.push_back(agentOf(etcd(cluster, id), budget, worker));
  auto c = agentOf(
      etcd(cluster, id),
      {"--max-restarts=1", "--health-check=test ! -e " + d + "/checked && touch " + d + "/checked"},
      worker);
  requireTwoFinishWithoutC(healthy, *c, 5);
  CHECK_THAT(c->output(), Catch::Contains("this node does not join"));
}

TEST_CASE("c10d: a store host that fails its health check fails the job at once, naming itself",
          "[integration][multinode][elastic][health]") {
  const int port = freeTcpPort();
  const std::vector<std::string> worker = {"print", "up {rank}", "exit", "0"};
  const auto began = std::chrono::steady_clock::now();
  std::vector<std::unique_ptr<ChildProcess>> agents;
  agents.push_back(storeHost(port, {"--health-check=echo 'nvidia-smi: GPU lost'; exit 1"}, worker));
  agents.push_back(agentOf(c10d(port), {}, worker));
  agents.push_back(agentOf(c10d(port), {}, worker));
  {
    INFO(agents[0]->output());
    CHECK(waitExit(*agents[0]) == 5);
    CHECK_THAT(agents[0]->output(), Catch::Contains("cannot leave the job"));
  }
  for (size_t i = 1; i < agents.size(); ++i) {
    INFO(agents[i]->output());
    CHECK(waitExit(*agents[i]) == 1);
    // Their workers may have started (the go precedes the host's own preparation) and are
    // stopped at once; the job's decision names the store host and its check.
    CHECK_THAT(agents[i]->output(), Catch::Contains("the job failed; first failure: node 0: "
                                                    "health check failed") &&
                                        Catch::Contains("nvidia-smi: GPU lost"));
  }
  // Not the join timeout (30 s) nor a lost store: the job's decision.
  CHECK(std::chrono::steady_clock::now() - began < 20s);
}

// One node (issue 36, finding 6): --health-check was ignored there — the command never ran and
// the workers started. It runs before every attempt now, and a failure ends the job with exit 5
// before the attempt's workers start. Each worker that starts leaves a marker file.
TEST_CASE("one node: a failing health command ends the job with exit 5 before any worker starts",
          "[integration][health]") {
  TempDir dir;
  const std::string d = dir.path();
  ChildProcess run(cpprunCommand({"--nproc-per-node=2", "--event-log=" + d + "/events.jsonl",
                                  "--health-check=echo checked $CPPRUN_HEALTH_CHECK_ATTEMPT > " +
                                      d + "/checked; echo 'disk /data read-only'; exit 3",
                                  "--no-python", kWorker, "touch", d + "/started-{restart}-{rank}",
                                  "exit", "0"}));
  {
    INFO(run.output());
    CHECK(waitExit(run) == 5);
    CHECK_THAT(run.output(), Catch::Contains("exited with code 3") &&
                                 Catch::Contains("disk /data read-only") &&
                                 Catch::Contains("this node failed its health check"));
  }
  CHECK(readFile(d + "/checked") == "checked 0\n");
  CHECK(::access((d + "/started-0-0").c_str(), F_OK) != 0);
  CHECK(::access((d + "/started-0-1").c_str(), F_OK) != 0);
  CHECK(events(d + "/events.jsonl", "worker_started").empty());
  const auto failed = events(d + "/events.jsonl", "health_check_failed");
  REQUIRE(failed.size() == 1);
  CHECK(failed[0]["attempt"] == 0);
  CHECK(failed[0]["action"] == "fail_job");
  const auto finished = events(d + "/events.jsonl", "job_finished");
  REQUIRE(finished.size() == 1);
  CHECK(finished[0]["outcome"] == "unhealthy");
  CHECK(finished[0]["exit_code"] == 5);
}

TEST_CASE("one node: the health check runs before every restart and stops the next attempt",
          "[integration][health]") {
  TempDir dir;
  const std::string d = dir.path();
  // Attempt 0's worker makes the node sick (the file the check reads) and fails, so there is a
  // restart; the check before attempt 1 fails, and attempt 1's worker never starts.
  ChildProcess run(cpprunCommand(
      {"--nproc-per-node=1", "--max-restarts=3", "--event-log=" + d + "/events.jsonl",
       "--health-check=echo $CPPRUN_HEALTH_CHECK_ATTEMPT >> " + d + "/checks; test ! -e " + d +
           "/sick || { echo 'GPU 3 fell off the bus'; exit 7; }",
       "--no-python", kWorker, "touch", d + "/started-{restart}", "touch", d + "/sick", "exit",
       "1"}));
  {
    INFO(run.output());
    CHECK(waitExit(run) == 5);
    CHECK_THAT(run.output(), Catch::Contains("GPU 3 fell off the bus") &&
                                 Catch::Contains("before attempt 1") &&
                                 Catch::Contains("exit 5: this node failed its health check"));
  }
  CHECK(readFile(d + "/checks") == "0\n1\n");
  CHECK(::access((d + "/started-0").c_str(), F_OK) == 0);
  CHECK(::access((d + "/started-1").c_str(), F_OK) != 0);
  CHECK(events(d + "/events.jsonl", "worker_started").size() == 1);
  CHECK(events(d + "/events.jsonl", "health_check_passed").size() == 1);
  const auto failed = events(d + "/events.jsonl", "health_check_failed");
  REQUIRE(failed.size() == 1);
  CHECK(failed[0]["attempt"] == 1);
}

TEST_CASE("one node: a passing health check runs before each attempt and the job goes on",
          "[integration][health]") {
  TempDir dir;
  const std::string d = dir.path();
  ChildProcess run(cpprunCommand(
      {"--nproc-per-node=1", "--max-restarts=1",
       "--health-check=echo $CPPRUN_HEALTH_CHECK_ATTEMPT >> " + d + "/checks", "--no-python",
       kWorker, "touch", d + "/started-{restart}", "exit-if-restart", "0", "1", "exit", "0"}));
  INFO(run.output());
  CHECK(waitExit(run) == 0);
  CHECK(readFile(d + "/checks") == "0\n1\n");
  CHECK(::access((d + "/started-1").c_str(), F_OK) == 0);
}
