// Who caused a hang (issue 35; agent/supervision/stall_verdict.h), with real cpprun agents, real
// torch (2.15 from the venv and Debian's 1.13) and real gloo collectives: the report's root cause,
// the job's first line, the `stall_verdict` event and exclusion name the rank that stopped taking
// part, never one of the ranks that wait for it, wherever it runs. The workers are
// tests/torch/collective_hang_worker.py, which makes no progress call: only cpprun's
// sitecustomize stamps progress and records collectives. Every wait is bounded by a process exit.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/cpprun_test_helpers.h"
#include "tests/support/etcd_cluster.h"
#include "tests/support/test_support.h"
#include "tests/support/torch_peers.h"

namespace {

using namespace cpprun::testing;

constexpr double kStallTimeout = 3.0;

// How many times each culprit position of the two-node test runs (CPPRUN_HANG_REPEATS; 1 in CI,
// 10 for the figures in docs/operations.md).
int repeats() {
  const char* text = std::getenv("CPPRUN_HANG_REPEATS");
  const int n = text == nullptr ? 1 : std::atoi(text);
  return n > 0 && n <= 100 ? n : 1;
}

double printedTime(const std::string& output, const std::string& prefix) {
  const size_t at = output.find(prefix);
  REQUIRE(at != std::string::npos);
  return std::stod(output.substr(at + prefix.size()));
}

double eventSeconds(const Json& event) { return event.at("time_us").get<double>() / 1e6; }

std::vector<pid_t> workerPids(const std::vector<Json>& events) {
  std::vector<pid_t> pids;
  for (const Json& started : eventsNamed(events, "worker_started")) {
    pids.push_back(started.at("pid").get<pid_t>());
  }
  return pids;
}

// The "rank : R" line of the report's Root Cause entry; -1 when there is none.
int rootCauseRank(const std::string& output) {
  const size_t root = output.rfind("Root Cause");
  if (root == std::string::npos) return -1;
  const std::string key = "rank      : ";
  const size_t at = output.find(key, root);
  if (at == std::string::npos) return -1;
  return std::atoi(output.c_str() + at + key.size());
}

std::vector<std::string> hangFlags(const std::string& log_dir, const std::string& events) {
  return {"--stall-timeout=3", "--log-dir=" + log_dir, "--event-log=" + events};
}

struct OneNodeHang {
  int exit_code = -1;
  std::string output;
  std::vector<Json> events;
};

OneNodeHang runOneNode(const TorchPeer& peer, int nproc, const std::string& mode, int culprit) {
  requireTorchPeer(peer);
  TempDir dir;
  const std::string events = dir.path() + "/events.jsonl";
  std::vector<std::string> args = {"--nproc-per-node=" + std::to_string(nproc)};
  for (const std::string& f : hangFlags(dir.path(), events)) args.push_back(f);
  args.insert(args.end(),
              {sourcePath("tests/torch/collective_hang_worker.py"), mode, std::to_string(culprit)});
  ChildProcess run(cpprunCommand(args), {{"PYTHON_EXEC", peer.python}});
  auto status = run.wait(120s);
  REQUIRE(status.has_value());
  OneNodeHang out;
  out.exit_code = exitCodeOf(*status);
  out.output = run.output();
  out.events = readEventLog(events);
  // cpprun's exit means every process it started is gone, the hung ones included.
  CHECK(allGone(workerPids(out.events)));
  return out;
}

// The one `stall_verdict` event of a run, checked to come within the stall timeout + 2 s of the
// hang the worker printed.
Json verdictOf(const OneNodeHang& run) {
  INFO(run.output);
  const auto verdicts = eventsNamed(run.events, "stall_verdict");
  REQUIRE(verdicts.size() == 1);
  const double after = eventSeconds(verdicts[0]) - printedTime(run.output, "HANG_AT ");
  CHECK(after >= kStallTimeout - 0.6);
  CHECK(after <= kStallTimeout + 2.0);
  return verdicts[0];
}

void requireCulprit(const OneNodeHang& run, int culprit, const std::string& why) {
  INFO(run.output);
  CHECK(run.exit_code == 1);
  const Json verdict = verdictOf(run);
  REQUIRE(verdict["culprits"].size() == 1);
  CHECK(verdict["culprits"][0]["rank"] == culprit);
  CHECK_THAT(verdict["culprits"][0]["why"].get<std::string>(), Catch::Contains(why));
  CHECK(rootCauseRank(run.output) == culprit);
  CHECK_THAT(run.output,
             Catch::Contains("the job failed; hang: rank " + std::to_string(culprit) + " "));
  // The waiting ranks are listed as waiting, never as the failure.
  CHECK_THAT(run.output, Catch::Contains("(waiting: stopped by cpprun while it waited for the "
                                         "culprit)"));
}

void sleepingRankOfFour(const TorchPeer& peer) {
  const OneNodeHang run = runOneNode(peer, 4, "sleep-rank", 2);
  requireCulprit(run, 2, "did not enter all_reduce #4");
  INFO(run.output);
  const Json verdict = verdictOf(run);
  CHECK(verdict["waiting"] == Json::array({0, 1, 3}));
  CHECK(verdict["waited_in"] == "all_reduce #4");
  // Its stack is the one in the Root Cause: the sleep in the worker's own line.
  const std::string root = run.output.substr(run.output.rfind("Root Cause"));
  CHECK_THAT(root, Catch::Contains("collective_hang_worker.py\", line") &&
                       !Catch::Contains("distributed_c10d.py"));
}

// Two agents on loopback (static rendezvous), two ranks each; rank `culprit` sleeps.
void twoNodes(const TorchPeer& peer, int culprit) {
  requireTorchPeer(peer);
  TempDir dir;
  const int port = freeTcpPort();
  std::vector<std::unique_ptr<ChildProcess>> nodes;
  for (int n = 0; n < 2; ++n) {
    std::vector<std::string> args = {"--nnodes=2",
                                     "--node-rank=" + std::to_string(n),
                                     "--nproc-per-node=2",
                                     "--master-addr=127.0.0.1",
                                     "--master-port=" + std::to_string(port),
                                     "--rdzv-conf=join_timeout=60"};
    for (const std::string& f : hangFlags(dir.path() + "/n" + std::to_string(n),
                                          dir.path() + "/events" + std::to_string(n) + ".jsonl")) {
      args.push_back(f);
    }
    args.insert(args.end(), {sourcePath("tests/torch/collective_hang_worker.py"), "sleep-rank",
                             std::to_string(culprit)});
    nodes.push_back(std::make_unique<ChildProcess>(
        cpprunCommand(args), std::map<std::string, std::string>{{"PYTHON_EXEC", peer.python}}));
  }
  const int culprit_node = culprit / 2;
  const std::string named = "the job failed; hang: rank " + std::to_string(culprit) + " (node " +
                            std::to_string(culprit_node) + ", ";
  for (int n = 0; n < 2; ++n) {
    auto status = nodes[static_cast<size_t>(n)]->wait(120s);
    REQUIRE(status.has_value());
    const std::string out = nodes[static_cast<size_t>(n)]->output();
    INFO("node " << n << ":\n" << out);
    CHECK(exitCodeOf(*status) == 1);
    CHECK_THAT(out, Catch::Contains(named));
    CHECK(rootCauseRank(out) == culprit);
  }
  for (int n = 0; n < 2; ++n) {
    const auto started = readEventLog(dir.path() + "/events" + std::to_string(n) + ".jsonl");
    CHECK(workerPids(started).size() == 2);
    CHECK(allGone(workerPids(started)));
  }
  // The decider (node 0) made the verdict, within the stall timeout + 2 s of the hang.
  OneNodeHang host;
  host.output = nodes[0]->output();
  host.events = readEventLog(dir.path() + "/events0.jsonl");
  const Json verdict = verdictOf(host);
  INFO("node 0:\n"
       << nodes[0]->output() << "\nnode 1:\n"
       << nodes[1]->output() << "\nverdict: " << verdict.dump());
  REQUIRE(verdict["culprits"].size() == 1);
  CHECK(verdict["culprits"][0]["rank"] == culprit);
  CHECK(verdict["culprits"][0]["node"] == culprit_node);
  CHECK(verdict["waiting"].size() == 3);
}

}  // namespace

TEST_CASE("hang verdict: one node, 4 ranks, torch 2.x: the sleeping rank is the root cause",
          "[integration][stall][torch][torch2]") {
  sleepingRankOfFour(torch2());
}

TEST_CASE("hang verdict: one node, 4 ranks, torch 1.13: the sleeping rank is the root cause",
          "[integration][stall][torch]") {
  sleepingRankOfFour(torch113());
}

TEST_CASE(
    "hang verdict: two nodes x 2 ranks, torch 2.x: every culprit position is named with "
    "its node",
    "[integration][stall][torch][torch2][multinode]") {
  for (int run = 0; run < repeats(); ++run) {
    for (int culprit = 0; culprit < 4; ++culprit) {
      INFO("run " << run << ", culprit rank " << culprit);
      twoNodes(torch2(), culprit);
    }
  }
}

TEST_CASE(
    "hang verdict: two nodes x 2 ranks, torch 1.13: every culprit position is named with "
    "its node",
    "[integration][stall][torch][multinode]") {
  for (int run = 0; run < repeats(); ++run) {
    for (int culprit = 0; culprit < 4; ++culprit) {
      INFO("run " << run << ", culprit rank " << culprit);
      twoNodes(torch113(), culprit);
    }
  }
}

TEST_CASE("hang verdict: a culprit blocked in a read of a pipe is named with its frame",
          "[integration][stall][torch][torch2]") {
  const OneNodeHang run = runOneNode(torch2(), 3, "read-rank", 1);
  requireCulprit(run, 1, "did not enter all_reduce #4: it is in ");
  CHECK_THAT(verdictOf(run)["culprits"][0]["frame"].get<std::string>(),
             Catch::Contains("collective_hang_worker.py:"));
}

TEST_CASE("hang verdict: a culprit that left its collective loop early is named, a step behind",
          "[integration][stall][torch][torch2]") {
  // Its peers block in all_reduce #3; it left after #2 and waits in its end-of-training work.
  // (A rank that exits outright is no hang with gloo: its peers fail at once with "Connection
  // closed by peer", and that failure is the report's.)
  const OneNodeHang run = runOneNode(torch2(), 3, "early-rank", 1);
  requireCulprit(run, 1, "did not enter all_reduce #3: it is in ");
  CHECK_THAT(verdictOf(run)["culprits"][0]["why"].get<std::string>(),
             Catch::EndsWith("after all_reduce #2"));
}

TEST_CASE(
    "hang verdict: DDP, the rank that never reached a step's forward is named, the ranks "
    "blocked in backward's all-reduce wait",
    "[integration][stall][torch][torch2]") {
  const OneNodeHang run = runOneNode(torch2(), 3, "ddp-sleep-rank", 1);
  requireCulprit(run, 1, "is behind: at ddp_step #3, not #4");
  CHECK(verdictOf(run)["waited_in"] == "ddp_step #4");
}

TEST_CASE("hang verdict: DDP on torch 1.13 names the sleeping rank too",
          "[integration][stall][torch]") {
  const OneNodeHang run = runOneNode(torch113(), 3, "ddp-sleep-rank", 2);
  requireCulprit(run, 2, "is behind: at ddp_step #3, not #4");
}

TEST_CASE("hang verdict: a desync (one rank in another collective) is named as one",
          "[integration][stall][torch][torch2]") {
  const OneNodeHang run = runOneNode(torch2(), 3, "desync-rank", 1);
  requireCulprit(run, 1, "waits in broadcast #4, not all_reduce (a desync)");
}

TEST_CASE("hang verdict: when every rank waits in the same collective nobody is blamed",
          "[integration][stall][torch][torch2]") {
  // Rank 1 enters the all_reduce and is then stopped (SIGSTOP): every rank's record says it waits
  // in all_reduce #4.
  const OneNodeHang run = runOneNode(torch2(), 3, "stop-rank", 1);
  INFO(run.output);
  CHECK(run.exit_code == 1);
  const Json verdict = verdictOf(run);
  CHECK(verdict["culprits"].empty());
  CHECK(verdict["waiting"] == Json::array({0, 1, 2}));
  CHECK_THAT(run.output, Catch::Contains("hang: all 3 ranks wait in all_reduce #4; no rank is "
                                         "behind: suspect the network or a device"));
  CHECK_THAT(run.output, !Catch::Contains("culprit:"));
}

TEST_CASE(
    "hang verdict: elastic, --exclude-after 1: the culprit's node leaves, a spare takes "
    "its place, the store host that waited is not charged",
    "[integration][stall][torch][torch2][multinode][elastic][exclusion]") {
  requireTorchPeer(torch2());
  TempDir dir;
  const std::string d = dir.path();
  const int port = freeTcpPort();
  auto agent = [&](const std::string& name) {
    return std::make_unique<ChildProcess>(
        cpprunCommand({"--nnodes=2:2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                       "--rdzv-endpoint=127.0.0.1:" + std::to_string(port),
                       "--rdzv-conf=keep_alive_interval=0.3,last_call_timeout=2,join_timeout=60",
                       "--max-restarts=1", "--exclude-after=1", "--stall-timeout=3",
                       "--log-dir=" + d + "/" + name, "--event-log=" + d + "/" + name + ".jsonl",
                       sourcePath("tests/torch/collective_hang_worker.py"), "sleep-rank", "1"}),
        std::map<std::string, std::string>{{"PYTHON_EXEC", torch2().python}});
  };
  // Join order is rank order: the store host is node 0 (rank 0, a victim), b is node 1 (rank
  // 1, the culprit); the spare comes once the round is closed.
  auto a = agent("a");
  REQUIRE(a->waitForText("this agent serves the job's store", 30s));
  auto b = agent("b");
  REQUIRE(b->waitForText("started 1 workers", 60s));
  auto spare = agent("spare");
  {
    auto status = b->wait(120s);
    REQUIRE(status.has_value());
    INFO(b->output());
    CHECK(exitCodeOf(*status) == 6);
    CHECK_THAT(b->output(), Catch::Contains("this node is excluded from the job"));
  }
  for (ChildProcess* p : {a.get(), spare.get()}) {
    auto status = p->wait(120s);
    REQUIRE(status.has_value());
    INFO(p->output());
    CHECK(exitCodeOf(*status) == 0);
    CHECK_THAT(p->output(), Catch::Contains("all 2 workers of 2 nodes succeeded"));
  }
  INFO(a->output());
  CHECK_THAT(a->output(), !Catch::Contains("node 0 (") || !Catch::Contains("is not excluded"));
  const auto verdicts = eventsNamed(readEventLog(d + "/a.jsonl"), "stall_verdict");
  REQUIRE(verdicts.size() == 1);
  CHECK(verdicts[0]["culprits"][0]["rank"] == 1);
  CHECK(verdicts[0]["culprits"][0]["node"] == 1);
  const auto excluded = eventsNamed(readEventLog(d + "/b.jsonl"), "node_excluded");
  REQUIRE(excluded.size() == 1);
  CHECK(excluded[0]["self"] == true);
  CHECK(eventsNamed(readEventLog(d + "/a.jsonl"), "node_excluded").at(0)["self"] == false);
}

TEST_CASE(
    "hang verdict: over etcd, two nodes x 2 ranks: the digests travel through etcd and "
    "both nodes name the culprit",
    "[integration][stall][torch][torch2][multinode][elastic][etcd]") {
  requireTorchPeer(torch2());
  EtcdClusterOptions eo;
  eo.members = 1;
  EtcdCluster cluster(eo);
  TempDir dir;
  const std::string id = "hang-" + std::to_string(::getpid()) + "-" + std::to_string(freeTcpPort());
  std::vector<std::unique_ptr<ChildProcess>> nodes;
  for (int n = 0; n < 2; ++n) {
    const std::string name = "n" + std::to_string(n);
    nodes.push_back(std::make_unique<ChildProcess>(
        cpprunCommand({"--nnodes=2:2", "--nproc-per-node=2", "--rdzv-backend=etcd-v2",
                       "--rdzv-endpoint=" + cluster.endpointsFlag(), "--rdzv-id=" + id,
                       "--rdzv-conf=keep_alive_interval=0.3,last_call_timeout=2,join_timeout=60",
                       "--stall-timeout=3", "--log-dir=" + dir.path() + "/" + name,
                       sourcePath("tests/torch/collective_hang_worker.py"), "sleep-rank", "3"}),
        std::map<std::string, std::string>{{"PYTHON_EXEC", torch2().python}}));
  }
  for (auto& node : nodes) {
    auto status = node->wait(120s);
    REQUIRE(status.has_value());
    INFO(node->output());
    CHECK(exitCodeOf(*status) == 1);
    CHECK_THAT(node->output(), Catch::Contains("the job failed; hang: rank 3 (node 1, "));
    CHECK(rootCauseRank(node->output()) == 3);
  }
}

namespace {

// The records the sitecustomize wrote, by rank and phase.
std::map<std::string, std::string> recordsOf(const std::string& output) {
  std::map<std::string, std::string> out;
  std::istringstream in(output);
  std::string line;
  while (std::getline(in, line)) {
    const size_t at = line.find("RECORD ");
    if (at == std::string::npos) continue;
    std::istringstream fields(line.substr(at + 7));
    std::string rank, phase, rest;
    fields >> rank >> phase;
    std::getline(fields, rest);
    out[rank + " " + phase] = rest.substr(rest.find_first_not_of(' '));
  }
  return out;
}

void recordsAlike(const TorchPeer& peer) {
  requireTorchPeer(peer);
  TempDir dir;
  ChildProcess run(
      cpprunCommand({"--nproc-per-node=2", "--stall-timeout=60", "--log-dir=" + dir.path(),
                     sourcePath("tests/torch/collective_record_worker.py")}),
      {{"PYTHON_EXEC", peer.python}});
  auto status = run.wait(120s);
  REQUIRE(status.has_value());
  INFO(run.output());
  REQUIRE(exitCodeOf(*status) == 0);
  auto records = recordsOf(run.output());
  CHECK(records["0 world"] == "after broadcast world 2");
  CHECK_THAT(records["0 subgroup"], Catch::Matches("after all_reduce g[0-9a-f]{8}\\.2 1"));
  CHECK(records["0 object"] == "after all_gather_object world 3");
  CHECK(records["0 barrier"] == "after barrier world 4");
  for (const char* phase : {"world", "subgroup", "object", "barrier"}) {
    CHECK(records[std::string("0 ") + phase] == records[std::string("1 ") + phase]);
  }
}

}  // namespace

TEST_CASE(
    "hang verdict: the sitecustomize numbers the default group's and a subgroup's "
    "collectives alike on every rank, torch 2.x",
    "[integration][stall][torch][torch2]") {
  recordsAlike(torch2());
}

TEST_CASE(
    "hang verdict: the sitecustomize numbers the default group's and a subgroup's "
    "collectives alike on every rank, torch 1.13",
    "[integration][stall][torch]") {
  recordsAlike(torch113());
}
