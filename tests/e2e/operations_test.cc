// Operating cpprun: stall detection (progress files, stacks by gdb and faulthandler), the event
// log, the metrics endpoint and the notices of visible waiting — end to end with the real
// binary, real workers, real gdb and a real HTTP client. Every wait is bounded; the tests
// synchronise on relayed output lines, files the workers write and process exits.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/cpprun_test_helpers.h"
#include "tests/support/http_get.h"
#include "tests/support/test_support.h"
#include "tests/support/torch_peers.h"

namespace {

using namespace cpprun::testing;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// The epoch seconds a worker printed as "<prefix><seconds>" (cpprun's "[default0]:" before it).
double printedTime(const std::string& output, const std::string& prefix) {
  const size_t at = output.find(prefix);
  REQUIRE(at != std::string::npos);
  return std::stod(output.substr(at + prefix.size()));
}

double eventSeconds(const Json& event) { return event.at("time_us").get<double>() / 1e6; }

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct HttpReply {
  int status = 0;
  std::string headers;
  std::string body;
};

// One GET with Connection: close; status 0 when nothing listens.
HttpReply httpGet(int port, const std::string& target) {
  HttpReply reply;
  const std::optional<std::string> raw = httpGetRaw(port, target, 5s);
  if (!raw) return reply;
  const size_t split = raw->find("\r\n\r\n");
  REQUIRE(split != std::string::npos);
  reply.headers = raw->substr(0, split);
  reply.body = raw->substr(split + 4);
  REQUIRE(raw->rfind("HTTP/1.1 ", 0) == 0);
  reply.status = std::stoi(raw->substr(9, 3));
  return reply;
}

// The value of a metric sample line "name{labels} value" (exact name and labels).
std::optional<double> metricValue(const std::string& text, const std::string& name_and_labels) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name_and_labels + " ", 0) == 0) {
      return std::stod(line.substr(name_and_labels.size() + 1));
    }
  }
  return std::nullopt;
}

// One agent of a two-node static job whose one worker exits 0.
std::unique_ptr<ChildProcess> startNode(int port, int rank) {
  return std::make_unique<ChildProcess>(
      cpprunCommand({"--nnodes=2", "--node-rank=" + std::to_string(rank), "--nproc-per-node=1",
                     "--master-addr=127.0.0.1", "--master-port=" + std::to_string(port),
                     "--rdzv-conf=join_timeout=60", "--no-python", kWorker, "exit", "0"}));
}

// Reads the agent's lines (each starts with "cpprun ") until one contains `text`.
bool agentSays(ChildProcess& agent, const std::string& text) {
  while (agent.output().find(text) == std::string::npos) {
    if (!agent.waitForLine("cpprun ", 30s).has_value()) return false;
  }
  return true;
}

// Both agents exit 0.
void bothSucceed(ChildProcess& a, ChildProcess& b) {
  auto sa = a.wait(60s);
  auto sb = b.wait(60s);
  REQUIRE(sa.has_value());
  REQUIRE(sb.has_value());
  INFO(a.output());
  INFO(b.output());
  CHECK(exitCodeOf(*sa) == 0);
  CHECK(exitCodeOf(*sb) == 0);
}

}  // namespace

TEST_CASE(
    "a rank that stops making progress is reported stalled within the bound, with gdb's "
    "stack of it, and the job fails",
    "[integration][stall]") {
  TempDir dir;
  const std::string events = dir.path() + "/events.jsonl";
  const auto start = Clock::now();
  // Both ranks bump their progress file three times, 0.1 s apart; rank 1 then hangs in pause().
  ChildProcess run(cpprunCommand(
      {"--nproc-per-node=2", "--stall-timeout=2", "--stall-stacks-timeout=30",
       "--log-dir=" + dir.path(), "--rdzv-id=stall", "--event-log=" + events, "--no-python",
       kWorker, "progress-every", "3", "0.1", "stall-if-rank", "1", "exit", "0"}));
  auto status = run.wait(60s);
  REQUIRE(status.has_value());
  const double took = secondsSince(start);
  INFO(run.output());
  CHECK(exitCodeOf(*status) == 1);
  // Detected no sooner than the timeout after the last report, and no later than one check
  // interval (0.5 s) plus scheduling slack after it.
  auto stalls = eventsNamed(readEventLog(events), "stall_detected");
  REQUIRE(stalls.size() == 1);
  CHECK(stalls[0]["rank"] == 1);
  CHECK(stalls[0]["progress"] == 3);
  CHECK(stalls[0]["seconds_since_progress"].get<double>() >= 2.0);
  CHECK(stalls[0]["seconds_since_progress"].get<double>() < 3.5);
  CHECK(took < 15);
  // Where it hangs: gdb's native stack, in the log, the report and the rank's log directory.
  CHECK_THAT(run.output(), Catch::Contains("rank 1 (local_rank 1, pid"));
  CHECK_THAT(run.output(), Catch::Contains("is stalled: no progress for"));
  CHECK_THAT(run.output(), Catch::Contains("Root Cause (first observed failure)"));
  const std::string report = run.output().substr(run.output().find("Root Cause"));
  CHECK_THAT(report, Catch::Contains("rank      : 1 (local_rank: 1)"));
  CHECK_THAT(report, Catch::Contains("stalled: no progress for"));
  CHECK_THAT(report, Catch::Contains("pauseForever"));
  const std::string stacks =
      readFile(runDirectoryOf(dir.path(), "stall") + "/attempt_0/1/stacks_gdb.txt");
  CHECK_THAT(stacks, Catch::Contains("pauseForever"));
  CHECK_THAT(stacks, Catch::Contains("Thread 1"));
  auto roots = eventsNamed(readEventLog(events), "root_cause");
  REQUIRE(roots.size() == 1);
  CHECK(roots[0]["rank"] == 1);
  CHECK_THAT(roots[0]["message"].get<std::string>(), Catch::StartsWith("stalled:"));
}

TEST_CASE("a SIGSTOPped worker is detected, its stack taken while stopped, and the job restarts",
          "[integration][stall]") {
  TempDir dir;
  const std::string events = dir.path() + "/events.jsonl";
  const auto start = Clock::now();
  // Attempt 0: one progress report, then the worker stops itself (SIGSTOP). Attempt 1 succeeds.
  // A stopped process cannot act on SIGTERM: unless the agent wakes it, teardown would wait out
  // the 30 s shutdown timeout before SIGKILL.
  ChildProcess run(
      cpprunCommand({"--nproc-per-node=1", "--stall-timeout=1.5", "--stall-stacks-timeout=30",
                     "--max-restarts=1", "--shutdown-timeout=30", "--log-dir=" + dir.path(),
                     "--rdzv-id=stop", "--event-log=" + events, "--no-python", kWorker, "progress",
                     "1", "exit-if-restart", "1", "0", "kill-self", "SIGSTOP"}));
  auto status = run.wait(60s);
  REQUIRE(status.has_value());
  const double took = secondsSince(start);
  INFO(run.output());
  CHECK(exitCodeOf(*status) == 0);
  CHECK(took < 20);  // not the 30 s shutdown timeout
  const auto all = readEventLog(events);
  REQUIRE(eventsNamed(all, "stall_detected").size() == 1);
  REQUIRE(eventsNamed(all, "restart").size() == 1);
  CHECK(eventsNamed(all, "job_finished").at(0)["outcome"] == "succeeded");
  const std::string stacks =
      readFile(runDirectoryOf(dir.path(), "stop") + "/attempt_0/0/stacks_gdb.txt");
  CHECK_THAT(stacks, Catch::Contains("killSelf"));
}

TEST_CASE("a healthy step longer than the check interval but under the bound is left alone",
          "[integration][stall]") {
  TempDir dir;
  // Steps of 1.2 s under a 2 s bound (checked every 0.5 s).
  ChildProcess run(
      cpprunCommand({"--nproc-per-node=2", "--stall-timeout=2", "--log-dir=" + dir.path(),
                     "--no-python", kWorker, "progress-every", "4", "1.2"}));
  auto status = run.wait(60s);
  REQUIRE(status.has_value());
  INFO(run.output());
  CHECK(exitCodeOf(*status) == 0);
  CHECK_THAT(run.output(), !Catch::Contains("is stalled:"));
}

TEST_CASE("a stalled Python rank's Python stack comes from faulthandler through the helper",
          "[integration][stall][torch]") {
  TempDir dir;
  ChildProcess run(cpprunCommand({"--nproc-per-node=2", "--stall-timeout=2",
                                  "--log-dir=" + dir.path(), "--rdzv-id=py", "--no-python",
                                  CPPRUN_PYTHON, sourcePath("tests/support/stall_worker.py"),
                                  sourcePath("examples/python"), "0"}));
  auto status = run.wait(60s);
  REQUIRE(status.has_value());
  INFO(run.output());
  CHECK(exitCodeOf(*status) == 1);
  const std::string report = run.output().substr(run.output().find("Root Cause"));
  CHECK_THAT(report, Catch::Contains("rank      : 0 (local_rank: 0)"));
  CHECK_THAT(report, Catch::Contains("Python stacks (faulthandler"));
  CHECK_THAT(report, Catch::Contains("in hang_in_collective"));
  CHECK_THAT(readFile(runDirectoryOf(dir.path(), "py") + "/attempt_0/0/python_stacks.txt"),
             Catch::Contains("stall_worker.py\", line"));
}

TEST_CASE("the event log records the rendezvous, every worker, the restart and the root cause",
          "[integration][events]") {
  TempDir dir;
  const std::string events = dir.path() + "/events.jsonl";
  ChildProcess run(
      cpprunCommand({"--nproc-per-node=2", "--max-restarts=1", "--event-log=" + events,
                     "--local-addr=nodeA", "--no-python", kWorker, "exit-if-rank", "1", "3"}));
  auto status = run.wait(60s);
  REQUIRE(status.has_value());
  INFO(run.output());
  REQUIRE(exitCodeOf(*status) == 1);
  const auto all = readEventLog(events);
  INFO(readFile(events));
  for (const Json& e : all) {
    CHECK(e["host"] == "nodeA");
    CHECK(e["time_us"].get<int64_t>() > 0);
    CHECK_THAT(e["time"].get<std::string>(), Catch::EndsWith("Z"));
  }
  std::vector<std::string> order;
  for (const Json& e : all) order.push_back(e["event"]);
  const std::vector<std::string> expected = {"rendezvous_started",
                                             "rendezvous_completed",
                                             "worker_started",
                                             "worker_started",
                                             "worker_exited",
                                             "worker_exited",
                                             "failure",
                                             "restart",
                                             "worker_started",
                                             "worker_started",
                                             "worker_exited",
                                             "worker_exited",
                                             "failure",
                                             "root_cause",
                                             "job_finished"};
  // The two ranks of an attempt exit in either order; the rest is fixed.
  CHECK(order == expected);
  auto failures = eventsNamed(all, "failure");
  REQUIRE(failures.size() == 2);
  CHECK(failures[0]["rank"] == 1);
  CHECK(failures[0]["exit_code"] == 3);
  auto root = eventsNamed(all, "root_cause").at(0);
  CHECK(root["rank"] == 1);
  CHECK(root["exit_code"] == 3);
  auto done = eventsNamed(all, "job_finished").at(0);
  CHECK(done["exit_code"] == 1);
  CHECK(done["restarts"] == 1);
  CHECK(eventsNamed(all, "rendezvous_completed").at(0)["world_size"] == 2);
}

TEST_CASE("the event log records a signal and the job it stopped", "[integration][events]") {
  TempDir dir;
  const std::string events = dir.path() + "/events.jsonl";
  ChildProcess run(cpprunCommand({"--nproc-per-node=1", "--event-log=" + events, "--no-python",
                                  kWorker, "print", "ready", "sleep-forever"}));
  REQUIRE(relayed(run, "[default0]:ready"));
  run.signal(SIGTERM);
  auto status = run.wait(60s);
  REQUIRE(status.has_value());
  INFO(run.output());
  CHECK(exitCodeOf(*status) == 128 + SIGTERM);
  const auto all = readEventLog(events);
  auto signals = eventsNamed(all, "signal_received");
  REQUIRE(signals.size() == 1);
  CHECK(signals[0]["signal"] == "SIGTERM");
  auto exits = eventsNamed(all, "worker_exited");
  REQUIRE(exits.size() == 1);
  CHECK(exits[0]["signal"] == "SIGTERM");
  CHECK(exits[0]["during_teardown"] == true);
  CHECK(eventsNamed(all, "job_finished").at(0)["outcome"] == "signalled");
}

TEST_CASE("an unwritable --event-log is named file and the job does not start",
          "[integration][events]") {
  ChildProcess run(cpprunCommand(
      {"--event-log=/nonexistent-dir/events.jsonl", "--no-python", kWorker, "exit", "0"}));
  auto status = run.wait(30s);
  REQUIRE(status.has_value());
  CHECK(exitCodeOf(*status) == 3);
  CHECK_THAT(run.output(), Catch::Contains("--event-log: cannot open /nonexistent-dir/events"));
}

TEST_CASE(
    "the metrics endpoint (--metrics-port) serves /healthz, /metrics and /status while the job "
    "runs",
    "[integration][metrics]") {
  TempDir dir;
  const std::string events = dir.path() + "/events.jsonl";
  // Each rank uses the store, writes progress 7, says ready and waits for the go file.
  ChildProcess run(cpprunCommand({"--nproc-per-node=2", "--metrics-port=0", "--event-log=" + events,
                                  "--rdzv-id=metrics", "--no-python", kWorker, "store-set",
                                  "k{rank}", "v", "progress", "7", "print", "ready {rank}",
                                  "wait-file", dir.path() + "/go", "30"}));
  REQUIRE(relayed(run, "[default0]:ready 0"));
  REQUIRE(relayed(run, "[default1]:ready 1"));
  auto listening = eventsNamed(readEventLog(events), "metrics_listening");
  REQUIRE(listening.size() == 1);
  const int port = listening[0]["port"];
  CHECK(listening[0]["address"] == "127.0.0.1");
  CHECK_THAT(run.output(),
             Catch::Contains("metrics on http://127.0.0.1:" + std::to_string(port) + "/metrics"));

  HttpReply health = httpGet(port, "/healthz");
  CHECK(health.status == 200);
  CHECK(health.body == "ok\n");

  HttpReply metrics = httpGet(port, "/metrics");
  REQUIRE(metrics.status == 200);
  INFO(metrics.body);
  CHECK_THAT(metrics.headers, Catch::Contains("text/plain; version=0.0.4"));
  CHECK(metricValue(metrics.body, "cpprun_workers_alive") == 2.0);
  CHECK(metricValue(metrics.body, "cpprun_restarts_total") == 0.0);
  CHECK(metricValue(metrics.body, "cpprun_state{state=\"running\"}") == 1.0);
  CHECK(metricValue(metrics.body, "cpprun_state_seconds_total{state=\"running\"}") > 0.0);
  CHECK(metricValue(metrics.body, "cpprun_rendezvous_rounds_total") == 1.0);
  CHECK(metricValue(metrics.body, "cpprun_world_size") == 2.0);
  CHECK(metricValue(metrics.body, "cpprun_store_connections_accepted_total") >= 2.0);
  CHECK(metricValue(metrics.body, "cpprun_store_operations_total") >= 2.0);
  CHECK(metricValue(metrics.body, "cpprun_worker_progress{rank=\"1\",local_rank=\"1\"}") == 7.0);
  // "ready 0\n" went through rank 0's stdout pipe.
  CHECK(metricValue(metrics.body,
                    "cpprun_worker_output_bytes{rank=\"0\",local_rank=\"0\",stream=\"stdout\"}") ==
        8.0);
  CHECK_THAT(metrics.body, Catch::Contains("# TYPE cpprun_restarts_total counter"));

  HttpReply status_reply = httpGet(port, "/status");
  REQUIRE(status_reply.status == 200);
  Json status = Json::parse(status_reply.body);
  CHECK(status["state"] == "running");
  CHECK(status["run_id"] == "metrics");
  REQUIRE(status["workers"].size() == 2);
  CHECK(status["workers"][0]["alive"] == true);
  CHECK(status["workers"][0]["progress"] == 7);
  CHECK(status["workers"][1]["pid"].get<int>() > 0);
  CHECK(status["rendezvous"]["nodes"] == 1);
  CHECK(status["store"]["keys"].get<int>() >= 2);

  CHECK(httpGet(port, "/nope").status == 404);

  std::ofstream(dir.path() + "/go").put('\n');
  auto exited = run.wait(60s);
  REQUIRE(exited.has_value());
  INFO(run.output());
  CHECK(exitCodeOf(*exited) == 0);
  CHECK(httpGet(port, "/healthz").status == 0);  // the endpoint ends with the job
}

TEST_CASE("a metrics port already taken is a launch error naming it", "[integration][metrics]") {
  const int taken = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(taken >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(taken, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(taken, 1) == 0);
  socklen_t len = sizeof addr;
  REQUIRE(::getsockname(taken, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  const int port = ntohs(addr.sin_port);
  ChildProcess run(cpprunCommand(
      {"--metrics-port=" + std::to_string(port), "--no-python", kWorker, "exit", "0"}));
  auto status = run.wait(30s);
  ::close(taken);
  REQUIRE(status.has_value());
  INFO(run.output());
  CHECK(exitCodeOf(*status) == 3);
  CHECK_THAT(run.output(), Catch::Contains("--metrics-port: "));
  CHECK_THAT(run.output(), Catch::Contains(std::to_string(port)));
}

TEST_CASE("a teardown that waits says on which ranks, and for how long until SIGKILL",
          "[integration][waiting]") {
  // Rank 1 ignores SIGTERM, then rank 0 fails (once the store says rank 1 ignores it), so the
  // teardown waits 7 s for SIGKILL.
  TempDir dir;
  ChildProcess run(
      cpprunCommand({"--nproc-per-node=2", "--shutdown-timeout=7", "--no-python", kWorker, "ignore",
                     "SIGTERM", "store-set", "ignoring{rank}", "1", "store-get", "ignoring1",
                     dir.path() + "/seen{rank}", "exit-if-rank", "0", "1", "sleep-forever"}));
  auto status = run.wait(60s);
  REQUIRE(status.has_value());
  INFO(run.output());
  CHECK(exitCodeOf(*status) == 1);
  CHECK_THAT(run.output(), Catch::Contains("waiting for 1 of 2 workers (ranks 1) to exit after "
                                           "SIGTERM for 5."));
}

TEST_CASE("an agent waiting for the others to join says which nodes it waits for",
          "[integration][waiting][multinode]") {
  const int port = freeTcpPort();
  // Node 1 first: nothing serves the store yet.
  auto node1 = startNode(port, 1);
  REQUIRE(agentSays(*node1, "waiting for the store host (node 0) at 127.0.0.1:" +
                                std::to_string(port) + " to accept connections for 5."));
  CHECK_THAT(node1->output(), Catch::Contains("timeout in 5"));
  auto node0 = startNode(port, 0);
  bothSucceed(*node0, *node1);
}

TEST_CASE("the store host waiting for a node to join names it",
          "[integration][waiting][multinode]") {
  const int port = freeTcpPort();
  auto node0 = startNode(port, 0);
  REQUIRE(agentSays(*node0, "waiting for 1 of 2 nodes (node 1) to join for 5."));
  CHECK_THAT(node0->output(), Catch::Contains("timeout in 5"));
  auto node1 = startNode(port, 1);
  bothSucceed(*node0, *node1);
}

// ---- hang detection with no trainer change (--python-progress,
// agent/supervision/python_progress.h) ----

TEST_CASE(
    "a Python rank hung in a real gloo collective is caught with no trainer change, and the next "
    "attempt starts within the stall timeout plus 2 s",
    "[integration][stall][torch][torch2]") {
  requireTorchPeer(torch2());
  TempDir dir;
  const std::string events = dir.path() + "/events.jsonl";
  // Three all-reduces; then rank 1 sleeps and rank 0 blocks in the next all_reduce (gloo). The
  // script never touches the progress file: only the automatic stamps can make progress.
  ChildProcess run(
      cpprunCommand({"--nproc-per-node=2", "--stall-timeout=3", "--max-restarts=1",
                     "--log-dir=" + dir.path(), "--rdzv-id=hang", "--event-log=" + events,
                     sourcePath("tests/torch/collective_hang_worker.py"), "hang-rank", "1"}),
      {{"PYTHON_EXEC", torch2().python}});
  auto status = run.wait(120s);
  REQUIRE(status.has_value());
  INFO(run.output());
  CHECK(exitCodeOf(*status) == 0);  // the second attempt finishes
  const double hang_at = printedTime(run.output(), "HANG_AT ");
  const auto all = readEventLog(events);
  auto stalls = eventsNamed(all, "stall_detected");
  REQUIRE(!stalls.empty());
  for (const Json& stall : stalls) {
    CHECK(stall["attempt"] == 0);
    // Within the timeout + 1 s of the hang; never before the timeout less one stamp interval.
    const double after = eventSeconds(stall) - hang_at;
    CHECK(after >= 3.0 - 0.35);
    CHECK(after <= 3.0 + 1.0);
  }
  // Whichever rank was found stalled first, the verdict names the culprit, rank 1 (it sleeps),
  // and rank 0, stuck inside gloo's all_reduce, waits for it.
  const auto verdicts = eventsNamed(all, "stall_verdict");
  REQUIRE(verdicts.size() == 1);
  REQUIRE(verdicts[0]["culprits"].size() == 1);
  CHECK(verdicts[0]["culprits"][0]["rank"] == 1);
  CHECK(verdicts[0]["waiting"] == Json::array({0}));
  double next_attempt = 0;
  for (const Json& started : eventsNamed(all, "worker_started")) {
    if (started["attempt"] == 1 && next_attempt == 0) next_attempt = eventSeconds(started);
  }
  REQUIRE(next_attempt > 0);
  CHECK(next_attempt - hang_at <= 3.0 + 2.0);
  // Rank 0's Python stack, from the faulthandler the stamps registered: inside all_reduce.
  CHECK_THAT(readFile(runDirectoryOf(dir.path(), "hang") + "/attempt_0/0/python_stacks.txt"),
             Catch::Contains("in all_reduce"));
}

TEST_CASE(
    "a Python rank busy in a pure-Python loop for longer than the stall timeout is left alone",
    "[integration][stall][torch][torch2]") {
  requireTorchPeer(torch2());
  TempDir dir;
  ChildProcess run(
      cpprunCommand({"--nproc-per-node=2", "--stall-timeout=1.5", "--log-dir=" + dir.path(),
                     sourcePath("tests/torch/collective_hang_worker.py"), "busy", "5"}),
      {{"PYTHON_EXEC", torch2().python}});
  auto status = run.wait(120s);
  REQUIRE(status.has_value());
  INFO(run.output());
  CHECK(exitCodeOf(*status) == 0);
  CHECK_THAT(run.output(),
             Catch::Contains("[default0]:DONE") && Catch::Contains("[default1]:DONE"));
  CHECK_THAT(run.output(), !Catch::Contains("is stalled:"));
}

TEST_CASE(
    "with --python-progress off a Python rank that never reports is caught at "
    "--stall-first-timeout, not at --stall-timeout",
    "[integration][stall][torch][torch2]") {
  requireTorchPeer(torch2());
  TempDir dir;
  const std::string events = dir.path() + "/events.jsonl";
  ChildProcess run(
      cpprunCommand({"--nproc-per-node=2", "--stall-timeout=1", "--stall-first-timeout=6",
                     "--python-progress=off", "--stall-stacks-timeout=off",
                     "--log-dir=" + dir.path(), "--event-log=" + events,
                     sourcePath("tests/torch/collective_hang_worker.py"), "hang-rank", "1"}),
      {{"PYTHON_EXEC", torch2().python}});
  auto status = run.wait(120s);
  REQUIRE(status.has_value());
  INFO(run.output());
  CHECK(exitCodeOf(*status) == 1);
  auto stalls = eventsNamed(readEventLog(events), "stall_detected");
  REQUIRE(!stalls.empty());
  // Counted from the workers' start (before the hang), at the first timeout: a run whose
  // stamps were on, or whose bound were --stall-timeout, is caught within ~1 s of the hang.
  for (const Json& stall : stalls) CHECK(stall["seconds_since_progress"].get<double>() >= 6.0);
  CHECK_THAT(run.output(), Catch::Contains("stalled: no first progress in"));
  CHECK_THAT(run.output(), Catch::Contains("--stall-stacks-timeout off"));
}

TEST_CASE("a slow start (no report for longer than --stall-timeout) is not a stall",
          "[integration][stall]") {
  TempDir dir;
  // 2.5 s before the first report (an import of torch under load) with a 1 s bound between
  // steps: the default first timeout (600 s) covers the start.
  ChildProcess run(cpprunCommand({"--nproc-per-node=2", "--stall-timeout=1",
                                  "--log-dir=" + dir.path(), "--no-python", kWorker, "sleep", "2.5",
                                  "progress-every", "5", "0.2", "exit", "0"}));
  auto status = run.wait(60s);
  REQUIRE(status.has_value());
  INFO(run.output());
  CHECK(exitCodeOf(*status) == 0);
  CHECK_THAT(run.output(), !Catch::Contains("is stalled:"));
}
