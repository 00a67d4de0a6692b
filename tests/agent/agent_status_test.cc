// /metrics and /status renderings of an agent's snapshot, the HTTP routes that serve them, the
// board that carries snapshots from the agent's loop to the HTTP thread, a whole agent's endpoint
// while its loop is blocked or flooded, the one-node rendezvous's events and progress, and the
// event log's lines.
#include "agent/observability/agent_status.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <functional>
#include <future>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "agent/coordination/single_node_rendezvous.h"
#include "agent/local_agent.h"
#include "agent/observability/agent_http_routes.h"
#include "agent/observability/event_log.h"
#include "agent/supervision/attempt_failures.h"
#include "agent/supervision/stall_verdict.h"
#include "common/asio.h"
#include "common/logging.h"
#include "rendezvous/tcp_store_client.h"
#include "tests/support/http_get.h"
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
  s.supervisor.console_lines_dropped_total = 17;
  s.supervisor.log_lines_dropped_total = 2;
  s.supervisor.workers_started_total = 4;
  s.supervisor.worker_failures_total = 1;
  s.rendezvous.round = 1;
  s.rendezvous.rounds_completed = 2;
  s.rendezvous.last_duration_s = 0.125;
  s.rendezvous.nodes = 2;
  s.rendezvous.world_size = 4;
  cpprun::rendezvous::TcpStoreServerStats store;
  store.connections_open = 5;
  store.dropped_by_reason[static_cast<size_t>(cpprun::rendezvous::DropReason::kBadFrame)] = 3;
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
  CHECK_THAT(text, Catch::Contains("cpprun_console_lines_dropped_total 17\n"));
  CHECK_THAT(text, Catch::Contains("cpprun_log_lines_dropped_total 2\n"));
  CHECK_THAT(text,
             Catch::Contains(
                 "cpprun_store_connections_dropped_by_reason_total{reason=\"bad_frame\"} 3\n"));
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

TEST_CASE("/status and /metrics: the last hang's culprits and waiting ranks", "[unit]") {
  AgentStatus s = twoWorkers();
  CHECK(statusJson(s)["last_hang"].is_null());
  // The verdict as applyStallVerdict leaves the failures: rank 3 the culprit, 0..2 waiting.
  std::vector<WorkerFailure> failures(4);
  for (int r = 0; r < 4; ++r) {
    failures[static_cast<size_t>(r)].rank = r;
    failures[static_cast<size_t>(r)].waiting = r != 3;
  }
  failures[3].message = std::string(kHangCulpritPrefix) + "rank 3 (node 1, b) did not enter ...";
  noteHangVerdict(s.supervisor.last_hang, 2, "hang: rank 3 (node 1, b) did not enter ...",
                  failures);
  noteHangVerdict(s.supervisor.last_hang, 3, "node 1: rank 2 exited with code 1", failures);
  const Json hang = statusJson(s)["last_hang"];
  CHECK(hang["attempt"] == 2);  // a failure that is no hang leaves the last hang as it was
  CHECK(hang["culprits"] == Json::array({3}));
  CHECK(hang["waiting"] == Json::array({0, 1, 2}));
  CHECK_THAT(hang["summary"].get<std::string>(), Catch::StartsWith("hang: rank 3"));
  const std::string metrics = prometheusText(s);
  CHECK_THAT(metrics, Catch::Contains("\ncpprun_hang_verdicts_total 1\n"));
  CHECK_THAT(metrics, Catch::Contains("\ncpprun_hang_culprits_total 1\n"));
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

TEST_CASE(
    "event log console (--event-log-handler console): the same lines through the log output, "
    "with or without a file, not below the INFO level",
    "[unit]") {
  cpprun::testing::TempDir dir;
  const std::string path = dir.path() + "/events.jsonl";
  std::vector<std::string> console;
  cpprun::setLogSink([&](std::string text) { console.push_back(std::move(text)); });
  {
    auto both = EventLog::open(path, "n1", true);
    REQUIRE(both.isOk());
    both.value()->emit("worker_started", {{"rank", 3}});
    auto console_only = EventLog::open("", "n1", true);
    REQUIRE(console_only.isOk());
    console_only.value()->emit("job_finished");
    cpprun::setLogLevel(cpprun::LogLevel::kWarn);
    console_only.value()->emit("hidden");
    cpprun::setLogLevel(cpprun::LogLevel::kInfo);
  }
  cpprun::setLogSink(nullptr);
  REQUIRE(console.size() == 2);
  std::ifstream in(path);
  std::string file_line;
  REQUIRE(std::getline(in, file_line));
  CHECK(console[0] == file_line + "\n");  // the file's line, whole, one write
  CHECK(Json::parse(console[1])["event"] == "job_finished");
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

namespace {

using namespace std::chrono_literals;
namespace asio = boost::asio;

// A stand-in for the agent's loop: an io_context on a thread of its own, whose work can be
// blocked until release() (a task that waits on a latch).
class FakeLoop {
 public:
  FakeLoop() : thread_([this] { io_.run(); }) {}
  ~FakeLoop() {
    release();
    work_.reset();
    thread_.join();
  }
  asio::io_context& io() { return io_; }
  void block() {
    asio::post(io_, [future = release_.get_future().share()] { future.wait_for(30s); });
  }
  void release() {
    if (!released_.exchange(true)) release_.set_value();
  }

 private:
  asio::io_context io_{1};
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work_{
      asio::make_work_guard(io_)};
  std::promise<void> release_;
  std::atomic<bool> released_{false};
  std::thread thread_;
};

AgentStatus withUptime(double uptime_s) {
  AgentStatus s = twoWorkers();
  s.uptime_s = uptime_s;
  return s;
}

}  // namespace

TEST_CASE("aged(): the clocks advance by the age and nothing else changes", "[unit]") {
  const AgentStatus before = twoWorkers();
  const AgentStatus after = aged(before, 2.5);
  CHECK(after.age_s == 2.5);
  CHECK(after.uptime_s == 15);
  CHECK(after.supervisor.seconds_in_state.at("running") == 13);  // the current state only
  CHECK(after.supervisor.seconds_in_state.at("waiting") == 0.25);
  CHECK(after.supervisor.workers[0].seconds_since_progress == 3);    // alive
  CHECK(after.supervisor.workers[1].seconds_since_progress == 0.5);  // exited: frozen
  CHECK(after.supervisor.restart_count == 1);
  CHECK(after.store->requests == 1234);
  CHECK(aged(before, 0).age_s == 0);
  CHECK_THAT(prometheusText(after), Catch::Contains("cpprun_status_age_seconds 2.5\n"));
  CHECK(statusJson(after)["status_age_s"] == 2.5);
}

TEST_CASE("status board: a read gets a snapshot the loop took after the read began", "[unit]") {
  // The board outlives the loop, which is joined first (its publish() may still be running).
  std::unique_ptr<StatusBoard> board;
  FakeLoop loop;
  std::atomic<int> taken{0};
  board = std::make_unique<StatusBoard>(withUptime(0), StatusBoard::Options{}, [&] {
    asio::post(loop.io(), [&] { board->publish(withUptime(++taken)); });
  });
  // The initial snapshot, taken before the loop ran, is never served however young: a whole
  // one-node start can take less than the reuse window (it once answered workers 0 while the
  // workers were running).
  const AgentStatus first = board->read();
  CHECK(taken == 1);
  CHECK(first.uptime_s >= 1);
  CHECK(first.uptime_s < 1.05);  // aged by the read's own few microseconds only
  CHECK(board->publications() == 2);
}

TEST_CASE("status board: a blocked loop costs one wait, then the last snapshot comes at once",
          "[unit]") {
  std::unique_ptr<StatusBoard> board;
  FakeLoop loop;
  std::atomic<int> asked{0};
  StatusBoard::Options options;
  options.max_wait = 200ms;
  options.reuse_within = 1ms;
  board = std::make_unique<StatusBoard>(withUptime(7), options, [&] {
    ++asked;
    asio::post(loop.io(), [&] { board->publish(withUptime(100)); });
  });
  loop.block();
  std::this_thread::sleep_for(5ms);  // past the reuse window, not a sync
  auto t0 = std::chrono::steady_clock::now();
  const AgentStatus first = board->read();
  const auto first_took = std::chrono::steady_clock::now() - t0;
  CHECK(first_took >= 150ms);
  CHECK(first_took < 5s);
  CHECK(first.uptime_s >= 7.15);  // the initial snapshot, aged
  CHECK(first.age_s >= 0.15);
  t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 20; ++i) {
    const AgentStatus again = board->read();
    CHECK(again.uptime_s < 100);
  }
  CHECK(std::chrono::steady_clock::now() - t0 < 150ms);  // no more waits: 20 would take 4 s
  CHECK(asked == 1);                                     // one request to the loop at a time
  loop.release();
  // Once the loop runs again, its snapshot arrives and the next read waits for a new one.
  for (auto deadline = std::chrono::steady_clock::now() + 5s;
       board->publications() < 2 && std::chrono::steady_clock::now() < deadline;) {
    std::this_thread::yield();
  }
  REQUIRE(board->publications() == 2);
  // The loop took 200 ms to answer: for a while (10x that, at most 1 s) its last snapshot is
  // served without asking it again.
  CHECK(board->read().uptime_s >= 100);
  CHECK(asked == 1);
}

TEST_CASE("status board: reads within the reuse window ask the loop once", "[unit]") {
  std::unique_ptr<StatusBoard> board;
  FakeLoop loop;
  std::atomic<int> asked{0};
  StatusBoard::Options options;
  options.reuse_within = 10s;
  board = std::make_unique<StatusBoard>(withUptime(1), options, [&] {
    ++asked;
    asio::post(loop.io(), [&] { board->publish(withUptime(2)); });
  });
  CHECK(board->read().uptime_s >= 2);  // the initial snapshot is not reused: the loop is asked
  for (int i = 0; i < 1000; ++i) CHECK(board->read().uptime_s >= 2);
  CHECK(asked == 1);
}

namespace {

// One node's agent (runLocalAgent) on a thread of the test, with --metrics-port 0 and a store
// on port 0; `make_attempt` is the caller's. REQUIRES (of the caller): the job ends.
class AgentInThread {
 public:
  // `metrics_token`: --metrics-token-file's token, or none.
  explicit AgentInThread(cpprun::agent::MakeAttempt make_attempt,
                         const std::string& metrics_token = "") {
    options_.metrics_token = metrics_token;
    options_.store_host = "127.0.0.1";
    options_.store_port = 0;
    options_.use_nccl = false;
    options_.host_name = "n1";
    options_.run_id = "http-test";
    options_.metrics_port = 0;
    options_.event_log_path = dir_.path() + "/events.jsonl";
    options_.supervisor.shutdown_timeout = 5000ms;
    thread_ = std::thread([this, make_attempt = std::move(make_attempt)] {
      auto outcome = cpprun::agent::runLocalAgent(options_, make_attempt);
      outcome_.set_value(outcome.isOk() ? outcome.value().exitCode() : -1);
    });
  }
  ~AgentInThread() {
    // The job ends by itself (the test releases it); a bounded wait, then the thread is joined.
    CHECK(done_.wait_for(60s) == std::future_status::ready);  // else ctest's timeout ends it
    thread_.join();
    ::prctl(PR_SET_CHILD_SUBREAPER, 0);  // runLocalAgent made this test process one
  }
  AgentInThread(const AgentInThread&) = delete;
  AgentInThread& operator=(const AgentInThread&) = delete;

  pthread_t loopThread() { return thread_.native_handle(); }
  // The metrics port from the event log's metrics_listening line (written before the loop runs).
  int metricsPort() {
    for (auto deadline = std::chrono::steady_clock::now() + 10s;
         std::chrono::steady_clock::now() < deadline;) {
      std::ifstream in(options_.event_log_path);
      std::string line;
      while (std::getline(in, line)) {
        const Json e = Json::parse(line);
        if (e.value("event", "") == "metrics_listening") return e.at("port").get<int>();
      }
      std::this_thread::sleep_for(10ms);  // a poll of a file another thread writes
    }
    FAIL("no metrics_listening event");
    return -1;
  }
  int exitCode() {
    REQUIRE(done_.wait_for(60s) == std::future_status::ready);
    return done_.get();
  }
  // The event log's lines so far, parsed.
  std::vector<Json> events() {
    std::vector<Json> out;
    std::ifstream in(options_.event_log_path);
    for (std::string line; std::getline(in, line);) out.push_back(Json::parse(line));
    return out;
  }

 private:
  cpprun::testing::TempDir dir_;
  cpprun::agent::LocalAgentOptions options_;
  std::promise<int> outcome_;
  std::shared_future<int> done_ = outcome_.get_future().share();
  std::thread thread_;
};

// The body of an HTTP response that httpGetRaw read; nullopt when no answer came.
std::optional<std::string> bodyOf(const std::optional<std::string>& raw) {
  if (!raw) return std::nullopt;
  const size_t split = raw->find("\r\n\r\n");
  if (split == std::string::npos || raw->rfind("HTTP/1.1 200", 0) != 0) return std::nullopt;
  return raw->substr(split + 4);
}

// A keep-alive HTTP client that sends GET `target` over and over until stop is set,
// reconnecting when the server closes; counts the whole responses it read.
void hammer(int port, const std::string& target, const std::atomic<bool>& stop,
            std::atomic<uint64_t>& responses) {
  const std::string request = "GET " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  while (!stop) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return;
    timeval tv{2, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      ::close(fd);
      return;
    }
    std::string pending;
    bool open = true;
    while (open && !stop) {
      if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
          static_cast<ssize_t>(request.size())) {
        break;
      }
      // One response: the header, then Content-Length bytes.
      size_t header_end;
      while ((header_end = pending.find("\r\n\r\n")) == std::string::npos) {
        char buf[16384];
        const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) {
          open = false;
          break;
        }
        pending.append(buf, static_cast<size_t>(n));
      }
      if (!open) break;
      const size_t at = pending.find("Content-Length: ");
      const size_t length = at < header_end ? std::stoul(pending.substr(at + 16)) : 0;
      while (pending.size() < header_end + 4 + length) {
        char buf[16384];
        const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) {
          open = false;
          break;
        }
        pending.append(buf, static_cast<size_t>(n));
      }
      if (!open) break;
      pending.erase(0, header_end + 4 + length);
      ++responses;
    }
    ::close(fd);
  }
}

// CPU time of `clock`: a thread's (threadClock) or the process's, in seconds.
double cpuSecondsOf(clockid_t clock) {
  timespec ts{};
  ::clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

clockid_t threadClock(pthread_t thread) {
  clockid_t clock = CLOCK_THREAD_CPUTIME_ID;
  ::pthread_getcpuclockid(thread, &clock);
  return clock;
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

}  // namespace

TEST_CASE("agent: /status and /metrics answer while the agent's event loop is blocked",
          "[integration][metrics]") {
  // The first attempt's preparation runs on the agent's loop; it blocks there until released.
  std::promise<void> entered;
  std::promise<void> release;
  auto released = release.get_future().share();
  AgentInThread agent(
      [&](const cpprun::agent::AttemptContext&) -> cpprun::Result<cpprun::agent::AttemptSpec> {
        entered.set_value();
        released.wait_for(30s);
        return cpprun::internalError("the test's attempt has no workers");
      });
  const int port = agent.metricsPort();
  REQUIRE(entered.get_future().wait_for(30s) == std::future_status::ready);

  const auto t0 = std::chrono::steady_clock::now();
  const auto status = bodyOf(cpprun::testing::httpGetRaw(port, "/status", 3s));
  const auto metrics = bodyOf(cpprun::testing::httpGetRaw(port, "/metrics", 3s));
  const auto healthz = bodyOf(cpprun::testing::httpGetRaw(port, "/healthz", 3s));
  const auto took = std::chrono::steady_clock::now() - t0;
  release.set_value();

  REQUIRE(status.has_value());
  const Json j = Json::parse(*status);
  CHECK(j["run_id"] == "http-test");
  CHECK(j["state"] == "waiting");
  CHECK(j["status_age_s"].get<double>() > 0);  // the loop had no time to take a new one
  REQUIRE(metrics.has_value());
  CHECK_THAT(*metrics, Catch::Contains("cpprun_up 1\n"));
  CHECK_THAT(*metrics, Catch::Contains("cpprun_status_age_seconds "));
  CHECK(healthz == std::optional<std::string>("ok\n"));
  // One wait for the blocked loop (StatusBoard's max_wait, 100 ms), not one per request.
  CHECK(took < 2s);
  CHECK(agent.exitCode() != 0);  // the attempt failed to start, as the test made it
}

TEST_CASE("agent: a flood of /status requests does not slow the store it serves",
          "[integration][metrics]") {
  cpprun::testing::TempDir work;
  std::promise<int> store_port;
  AgentInThread agent([&](const cpprun::agent::AttemptContext& context)
                          -> cpprun::Result<cpprun::agent::AttemptSpec> {
    store_port.set_value(context.store_port);
    cpprun::agent::AttemptSpec spec;
    spec.attempt_dir = work.path() + "/attempt_0";
    cpprun::agent::WorkerSpec worker;
    worker.argv = {CPPRUN_TEST_WORKER, "wait-file", work.path() + "/go", "60"};
    spec.workers.push_back(worker);
    return spec;
  });
  const int port = agent.metricsPort();
  auto store_port_future = store_port.get_future();
  REQUIRE(store_port_future.wait_for(30s) == std::future_status::ready);
  cpprun::rendezvous::TcpStoreClientOptions client_options;
  client_options.port = static_cast<uint16_t>(store_port_future.get());
  client_options.connect_timeout = 10s;
  client_options.timeout = 10s;
  cpprun::rendezvous::TcpStoreClient store(client_options);
  store.set("k", cpprun::testing::bytesOf("v"));

  // Store round trips (one GET each), in milliseconds: kRoundTrips, and more while `more()`
  // (for at most 30 s).
  constexpr size_t kRoundTrips = 1000;
  auto roundTrips = [&](const std::function<bool()>& more) {
    std::vector<double> ms;
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (ms.size() < kRoundTrips || (more() && std::chrono::steady_clock::now() < deadline)) {
      const auto t0 = std::chrono::steady_clock::now();
      store.get("k");
      ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    return ms;
  };
  const std::vector<double> baseline = roundTrips([] { return false; });

  // Four clients ask for /status as fast as the agent answers, while the store is used again,
  // then for 1000 answers more without it.
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> responses{0};
  std::vector<std::thread> flood;
  for (int i = 0; i < 4; ++i) {
    flood.emplace_back([&] { hammer(port, "/status", stop, responses); });
  }
  auto waitForResponses = [&](uint64_t n) {
    for (auto deadline = std::chrono::steady_clock::now() + 30s;
         responses < n && std::chrono::steady_clock::now() < deadline;) {
      std::this_thread::yield();
    }
  };
  waitForResponses(100);  // the flood is under way
  const uint64_t responses_before = responses;
  // Under a sanitizer /status is answered a few hundred times a second: go on until 200 were.
  const std::vector<double> flooded =
      roundTrips([&] { return responses - responses_before < 200; });
  const uint64_t flood_responses = responses - responses_before;
  // The agent's loop's share of this process's CPU time (the agent's threads and the clients')
  // while only HTTP comes in.
  const double loop_cpu_before = cpuSecondsOf(threadClock(agent.loopThread()));
  const double process_cpu_before = cpuSecondsOf(CLOCK_PROCESS_CPUTIME_ID);
  waitForResponses(responses + 1000);
  const double loop_cpu = cpuSecondsOf(threadClock(agent.loopThread())) - loop_cpu_before;
  const double process_cpu = cpuSecondsOf(CLOCK_PROCESS_CPUTIME_ID) - process_cpu_before;
  stop = true;
  for (auto& t : flood) t.join();
  std::ofstream(work.path() + "/go").put('\n');
  CHECK(agent.exitCode() == 0);

  const double base_p50 = percentile(baseline, 0.5), flood_p50 = percentile(flooded, 0.5);
  const double base_p90 = percentile(baseline, 0.9), flood_p90 = percentile(flooded, 0.9);
  const double loop_share = process_cpu > 0 ? loop_cpu / process_cpu : 1;
  INFO("store round trip p50 " << base_p50 << " ms alone, " << flood_p50
                               << " ms under the flood; p90 " << base_p90 << " / " << flood_p90
                               << " ms; " << flood_responses << " /status answers meanwhile; "
                               << "the loop's share of the CPU under the flood alone "
                               << loop_share);
  REQUIRE(flood_responses >= 100);  // the flood was real
  // A generous bound for a noisy 2-core machine (the flood's threads compete for the CPUs).
  CHECK(flood_p50 < 3 * base_p50 + 0.05);
  // The loop does no work per HTTP request, only a snapshot per reuse window (on the shared
  // loop the share was about half).
  CHECK(loop_share < 0.2);
}

TEST_CASE("agent: a foreign Host and a browser's POST /leave are refused, the token guards /leave",
          "[integration][metrics]") {
  const std::string token = "0123456789abcdef0123456789abcdef";
  cpprun::testing::TempDir work;
  AgentInThread agent(
      [&](const cpprun::agent::AttemptContext&) -> cpprun::Result<cpprun::agent::AttemptSpec> {
        cpprun::agent::AttemptSpec spec;
        spec.attempt_dir = work.path() + "/attempt_0";
        cpprun::agent::WorkerSpec worker;
        worker.argv = {CPPRUN_TEST_WORKER, "wait-file", work.path() + "/go", "60"};
        spec.workers.push_back(worker);
        return spec;
      },
      token);
  const int port = agent.metricsPort();
  const std::string here = "Host: 127.0.0.1:" + std::to_string(port) + "\r\n";
  auto request = [&](const std::string& method, const std::string& target,
                     const std::string& headers) {
    auto raw = cpprun::testing::httpRequestRaw(port, method, target, 20s, headers);
    REQUIRE(raw.has_value());
    return *raw;
  };
  // GET /status and /metrics: only through a name of this endpoint (DNS rebinding).
  CHECK_THAT(request("GET", "/status", "Host: evil.example:" + std::to_string(port) + "\r\n"),
             Catch::StartsWith("HTTP/1.1 403") && Catch::Contains("DNS rebinding"));
  CHECK_THAT(request("GET", "/metrics", "Host: evil.example\r\n"),
             Catch::StartsWith("HTTP/1.1 403"));
  const std::string status = request("GET", "/status", here);
  REQUIRE_THAT(status, Catch::StartsWith("HTTP/1.1 200"));
  CHECK(Json::parse(status.substr(status.find("\r\n\r\n") + 4))["run_id"] == "http-test");
  CHECK_THAT(request("GET", "/status", "Host: localhost\r\n"), Catch::StartsWith("HTTP/1.1 200"));
  // POST /leave: a browser's (Origin), through a foreign name, without or with a wrong token.
  const std::string bearer = "Authorization: Bearer " + token + "\r\n";
  CHECK_THAT(request("POST", "/leave", here + bearer + "Origin: http://evil.example\r\n"),
             Catch::StartsWith("HTTP/1.1 403") && Catch::Contains("Origin"));
  CHECK_THAT(request("POST", "/leave", "Host: evil.example\r\n" + bearer),
             Catch::StartsWith("HTTP/1.1 403"));
  CHECK_THAT(request("POST", "/leave", here),
             Catch::StartsWith("HTTP/1.1 401") && Catch::Contains("WWW-Authenticate: Bearer"));
  CHECK_THAT(request("POST", "/leave", here + "Authorization: Bearer wrong-token\r\n"),
             Catch::StartsWith("HTTP/1.1 401"));
  // None of them reached the agent's loop: no leave was even asked for.
  auto leaves = [&] {
    int n = 0;
    for (const Json& e : agent.events()) n += e.value("event", "") == "leave_requested";
    return n;
  };
  CHECK(leaves() == 0);
  // With the token and no Origin (curl's request), the route answers: one node cannot leave
  // its own job (409), which proves the request reached the agent.
  CHECK_THAT(request("POST", "/leave", here + bearer),
             Catch::StartsWith("HTTP/1.1 409") && Catch::Contains("job of one node"));
  CHECK(leaves() == 1);
  std::ofstream(work.path() + "/go").put('\n');
  CHECK(agent.exitCode() == 0);  // not drained: the job ran to its end
}
