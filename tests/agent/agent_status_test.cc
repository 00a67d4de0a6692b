// /metrics and /status renderings of an agent's snapshot, the HTTP routes that serve them, the
// one-node rendezvous's events and progress, and the event log's lines.
#include "agent/agent_status.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "agent/agent_http_routes.h"
#include "agent/event_log.h"
#include "agent/single_node_rendezvous.h"
#include "tests/support/test_support.h"

namespace {

using namespace cpprun::agent;
using Json = nlohmann::json;

AgentStatus twoWorkers() {
  AgentStatus s;
  s.host = "n1";
  s.run_id = "job7";
  s.agent_pid = 42;
  s.uptime_s = 12.5;
  s.max_restarts = 3;
  s.stall_timeout_s = 30;
  s.supervisor.state = "running";
  s.supervisor.restart_count = 1;
  s.supervisor.seconds_in_state = {
      {"waiting", 0.25}, {"running", 10.5}, {"stopping", 1}, {"draining", 0}, {"done", 0}};
  WorkerSnapshot a;
  a.rank = 4;
  a.local_rank = 0;
  a.pid = 100;
  a.alive = true;
  a.progress = 900;
  a.seconds_since_progress = 0.5;
  a.stdout_bytes = 10;
  a.stderr_bytes = 3;
  WorkerSnapshot b = a;
  b.rank = 5;
  b.local_rank = 1;
  b.pid = 101;
  b.alive = false;
  b.signal = 9;
  b.progress.reset();
  s.supervisor.workers = {a, b};
  s.supervisor.output_bytes_total = 99;
  s.supervisor.workers_started_total = 4;
  s.supervisor.worker_failures_total = 1;
  s.rendezvous.round = 1;
  s.rendezvous.rounds_completed = 2;
  s.rendezvous.last_duration_s = 0.125;
  s.rendezvous.nodes = 2;
  s.rendezvous.world_size = 4;
  cpprun::rendezvous::TcpStoreServerStats store;
  store.connections_open = 5;
  store.connections_accepted = 9;
  store.requests = 1234;
  store.keys = 17;
  s.store = store;
  s.store_endpoint = "n1:29500";
  return s;
}

// Every line is a comment or "name[{labels}] value" with a number (the text format's grammar).
void checkExposition(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    INFO(line);
    if (line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0) continue;
    const size_t space = line.rfind(' ');
    REQUIRE(space != std::string::npos);
    const std::string value = line.substr(space + 1);
    CHECK_NOTHROW(std::stod(value));
    const std::string name = line.substr(0, line.find_first_of("{ "));
    CHECK(name.rfind("cpprun_", 0) == 0);
  }
}

}  // namespace

TEST_CASE("/metrics: Prometheus text with every family the issue names", "[unit]") {
  const std::string text = prometheusText(twoWorkers());
  INFO(text);
  checkExposition(text);
  CHECK_THAT(text,
             Catch::Contains("# TYPE cpprun_restarts_total counter\ncpprun_restarts_total 1\n"));
  CHECK_THAT(text, Catch::Contains("cpprun_workers_alive 1\n"));
  CHECK_THAT(text, Catch::Contains("cpprun_workers 2\n"));
  CHECK_THAT(text, Catch::Contains("cpprun_rendezvous_round 1\n"));
  CHECK_THAT(text, Catch::Contains("cpprun_rendezvous_duration_seconds 0.125\n"));
  CHECK_THAT(text, Catch::Contains("cpprun_state{state=\"running\"} 1\n"));
  CHECK_THAT(text, Catch::Contains("cpprun_state{state=\"waiting\"} 0\n"));
  CHECK_THAT(text, Catch::Contains("cpprun_state_seconds_total{state=\"running\"} 10.5\n"));
  CHECK_THAT(text, Catch::Contains("cpprun_store_connections 5\n"));
  CHECK_THAT(text, Catch::Contains("cpprun_store_operations_total 1234\n"));
  CHECK_THAT(text, Catch::Contains("cpprun_worker_output_bytes_total 99\n"));
  CHECK_THAT(text,
             Catch::Contains(
                 "cpprun_worker_output_bytes{rank=\"4\",local_rank=\"0\",stream=\"stderr\"} 3\n"));
  CHECK_THAT(text, Catch::Contains("cpprun_worker_progress{rank=\"4\",local_rank=\"0\"} 900\n"));
  CHECK_THAT(text, !Catch::Contains("cpprun_worker_progress{rank=\"5\""));  // never reported
  CHECK_THAT(text, Catch::Contains("cpprun_worker_alive{rank=\"5\",local_rank=\"1\"} 0\n"));
}

TEST_CASE("/metrics: no store families on an agent that does not serve the store", "[unit]") {
  AgentStatus s = twoWorkers();
  s.store.reset();
  const std::string text = prometheusText(s);
  checkExposition(text);
  CHECK_THAT(text, !Catch::Contains("cpprun_store_"));
}

TEST_CASE("/status: the snapshot as JSON", "[unit]") {
  const Json j = statusJson(twoWorkers());
  CHECK(j["host"] == "n1");
  CHECK(j["run_id"] == "job7");
  CHECK(j["state"] == "running");
  CHECK(j["restarts"] == 1);
  CHECK(j["waiting_for"].is_null());
  CHECK(j["workers"][0]["progress"] == 900);
  CHECK(j["workers"][0]["seconds_since_progress"] == 0.5);
  CHECK(j["workers"][1]["progress"].is_null());
  CHECK(j["workers"][1]["signal"] == 9);
  CHECK(j["rendezvous"]["world_size"] == 4);
  CHECK(j["store"]["operations"] == 1234);
  AgentStatus waiting = twoWorkers();
  waiting.rendezvous.waiting_for = "waiting for 1 of 2 nodes (n2) to join";
  CHECK(statusJson(waiting)["waiting_for"] == "waiting for 1 of 2 nodes (n2) to join");
}

TEST_CASE("/status: a worker's --numa-binding only when it has one", "[unit]") {
  AgentStatus s = twoWorkers();
  s.supervisor.workers[0].numa_binding =
      "node: GPU 0 (0000:1b:00.0), NUMA node 0: CPUs 0-55,112-167, memory preferred on node 0";
  const Json j = statusJson(s);
  CHECK(j["workers"][0]["numa_binding"] == s.supervisor.workers[0].numa_binding);
  CHECK_FALSE(j["workers"][1].contains("numa_binding"));
}

TEST_CASE("event log: one JSON object per line with time, host and pid, appended", "[unit]") {
  cpprun::testing::TempDir dir;
  const std::string path = dir.path() + "/events.jsonl";
  {
    auto log = EventLog::open(path, "n1");
    REQUIRE(log.isOk());
    log.value()->emit("worker_started", {{"rank", 3}});
    // Bytes that are not UTF-8 (a worker's output) do not break the line.
    log.value()->emit("failure", {{"message", std::string("bad \xff byte")}});
  }
  {
    auto again = EventLog::open(path, "n1");
    REQUIRE(again.isOk());
    again.value()->emit("job_finished");
  }
  std::ifstream in(path);
  std::vector<Json> lines;
  std::string line;
  while (std::getline(in, line)) lines.push_back(Json::parse(line));
  REQUIRE(lines.size() == 3);
  CHECK(lines[0]["event"] == "worker_started");
  CHECK(lines[0]["rank"] == 3);
  CHECK(lines[0]["host"] == "n1");
  CHECK(lines[0]["agent_pid"] == static_cast<int>(::getpid()));
  CHECK(lines[0]["time"].get<std::string>().size() ==
        std::string("2026-11-22T10:00:00.123456Z").size());
  CHECK(lines[1]["message"].get<std::string>().rfind("bad ", 0) == 0);
  CHECK(lines[2]["event"] == "job_finished");
  CHECK(lines[2]["time_us"].get<int64_t>() >= lines[0]["time_us"].get<int64_t>());
  auto bad = EventLog::open(dir.path() + "/no/such/dir/events.jsonl", "n1");
  REQUIRE_FALSE(bad.isOk());
  CHECK_THAT(bad.status().message(), Catch::StartsWith("--event-log: cannot open "));
}

TEST_CASE("routes: /healthz /metrics and /status from a fresh snapshot and 404 elsewhere",
          "[unit]") {
  int snapshots = 0;
  HttpHandler routes = agentStatusRoutes([&] {
    ++snapshots;
    return twoWorkers();
  });
  HttpResponse health = routes("/healthz");
  CHECK(health.status == 200);
  CHECK(health.body == "ok\n");
  CHECK(snapshots == 0);  // liveness needs no snapshot

  HttpResponse metrics = routes("/metrics?x=1");  // the query is not part of the path
  CHECK(metrics.status == 200);
  CHECK(metrics.content_type == "text/plain; version=0.0.4; charset=utf-8");
  CHECK(metrics.body == prometheusText(twoWorkers()));

  HttpResponse status = routes("/status");
  CHECK(status.status == 200);
  CHECK(status.content_type == "application/json");
  CHECK(status.body == statusJson(twoWorkers()).dump(2) + "\n");
  CHECK(snapshots == 2);

  HttpResponse other = routes("/statusz");
  CHECK(other.status == 404);
  CHECK(other.body == "not found; cpprun serves /healthz, /metrics and /status\n");
  CHECK(snapshots == 2);
}

TEST_CASE("single-node rendezvous: started and completed once with the first world", "[unit]") {
  cpprun::testing::TempDir dir;
  const std::string path = dir.path() + "/events.jsonl";
  auto log = EventLog::open(path, "n1");
  REQUIRE(log.isOk());
  SingleNodeRendezvous rendezvous(log.value().get(), "n1");
  CHECK(rendezvous.progress().round == -1);
  CHECK(rendezvous.progress().rounds_completed == 0);
  rendezvous.begin();
  rendezvous.complete(3);
  // A restart does not rendezvous again, whatever its world.
  rendezvous.begin();
  rendezvous.complete(5);
  const RendezvousProgress p = rendezvous.progress();
  CHECK(p.round == 0);
  CHECK(p.rounds_completed == 1);
  CHECK(p.nodes == 1);
  CHECK(p.world_size == 3);
  CHECK(p.waiting_for.empty());

  std::ifstream in(path);
  std::vector<Json> lines;
  std::string line;
  while (std::getline(in, line)) lines.push_back(Json::parse(line));
  REQUIRE(lines.size() == 2);
  CHECK(lines[0]["event"] == "rendezvous_started");
  CHECK(lines[0]["backend"] == "single-node");
  CHECK(lines[0]["round"] == 0);
  CHECK(lines[0]["min_nodes"] == 1);
  CHECK(lines[0]["max_nodes"] == 1);
  CHECK(lines[1]["event"] == "rendezvous_completed");
  CHECK(lines[1]["round"] == 0);
  CHECK(lines[1]["nodes"] == 1);
  CHECK(lines[1]["world_size"] == 3);
  CHECK(lines[1]["group_rank"] == 0);
  CHECK(lines[1]["base_rank"] == 0);
  CHECK(lines[1]["hosts"] == Json::array({"n1"}));
  CHECK(lines[1]["duration_s"] == 0.0);

  // Without an event log it still keeps its progress.
  SingleNodeRendezvous quiet(nullptr, "n1");
  quiet.begin();
  quiet.complete(2);
  CHECK(quiet.progress().world_size == 2);
}
