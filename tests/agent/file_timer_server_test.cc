// The FileTimer server on its own: the request parser and the timer table as pure functions, and
// the server on a real FIFO in a temporary directory with real timers on an io_context, a fake
// kill that records what it was asked and an owner map of made-up pids (so nothing real is ever
// signalled). The test writes request lines as torch's FileTimerClient does (O_WRONLY |
// O_NONBLOCK, one write, close). Every wait is an io_context run bounded by a deadline.
#include "agent/supervision/file_timer_server.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common/asio.h"
#include "tests/support/test_support.h"

namespace {

using namespace cpprun;
using namespace cpprun::agent;
using namespace std::chrono_literals;

double epochNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string requestLine(pid_t pid, const std::string& scope, double expiration, int signo) {
  return "{\"version\": 1, \"pid\": " + std::to_string(pid) + ", \"scope_id\": \"" + scope +
         "\", \"expiration_time\": " + std::to_string(expiration) +
         ", \"signal\": " + std::to_string(signo) + "}\n";
}

// As FileTimerClient._send_request: a non-blocking open (ENXIO without a reader), one write.
int sendToPipe(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return errno;
  const ssize_t n = ::write(fd, text.data(), text.size());
  const int err = n == static_cast<ssize_t>(text.size()) ? 0 : errno;
  ::close(fd);
  return err;
}

bool runUntil(boost::asio::io_context& io, const std::function<bool()>& done,
              std::chrono::milliseconds bound = 5s) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    io.run_one_for(20ms);
  }
  return true;
}

// A server on a FIFO in a temporary directory whose workers are made-up pids 7000001 (worker
// 0) and 7000002 (worker 1); kills are recorded, never sent.
struct Fixture {
  testing::TempDir dir;
  boost::asio::io_context io;
  std::string path = dir.path() + "/watchdog_timer";
  std::vector<std::pair<pid_t, int>> kills;
  std::vector<FileTimerServer::Expiry> expired;
  std::map<pid_t, size_t> workers = {{7000001, 0}, {7000002, 1}};
  FileTimerServer server{io, path, callbacks()};

  FileTimerServer::Callbacks callbacks() {
    FileTimerServer::Callbacks c;
    c.owner = [this](pid_t pid) -> std::optional<size_t> {
      auto it = workers.find(pid);
      if (it == workers.end()) return std::nullopt;
      return it->second;
    };
    c.on_expired = [this](const FileTimerServer::Expiry& e) { expired.push_back(e); };
    c.kill = [this](pid_t pid, int signo) {
      kills.emplace_back(pid, signo);
      return 0;
    };
    return c;
  }
};

}  // namespace

TEST_CASE("parseFileTimerRequest reads torch's FileTimerRequest.to_json()", "[unit]") {
  auto r = parseFileTimerRequest(
      R"({"version": 1, "pid": 4242, "scope_id": "train.py#12", "expiration_time": 1700000000.25, "signal": 9})");
  REQUIRE(r.isOk());
  CHECK(r.value().version == 1);
  CHECK(r.value().pid == 4242);
  CHECK(r.value().scope_id == "train.py#12");
  CHECK(r.value().expiration_time == 1700000000.25);
  CHECK(r.value().signal == 9);
  CHECK_FALSE(r.value().release());

  // release(): expiration_time -1, signal 0; an integer time is a number too.
  auto release = parseFileTimerRequest(
      R"({"version": 1, "pid": 4242, "scope_id": "step", "expiration_time": -1, "signal": 0})");
  REQUIRE(release.isOk());
  CHECK(release.value().release());
  // Fields torch does not write are ignored; "version" may be absent.
  CHECK(parseFileTimerRequest(
            R"({"pid": 1, "scope_id": "", "expiration_time": 5, "signal": -1, "extra": [1]})")
            .isOk());
}

TEST_CASE("parseFileTimerRequest refuses malformed requests, saying what is wrong", "[unit]") {
  struct Case {
    const char* line;
    const char* says;
  };
  const Case cases[] = {
      {"", "not JSON"},
      {"{\"pid\": 1,", "not JSON"},
      {"[1, 2]", "not a JSON object"},
      {R"({"scope_id": "s", "expiration_time": 1, "signal": 9})", "\"pid\""},
      {R"({"pid": "12", "scope_id": "s", "expiration_time": 1, "signal": 9})", "\"pid\""},
      {R"({"pid": 0, "scope_id": "s", "expiration_time": 1, "signal": 9})", "not a process id"},
      {R"({"pid": -1, "scope_id": "s", "expiration_time": 1, "signal": 9})", "not a process id"},
      {R"({"pid": 1.5, "scope_id": "s", "expiration_time": 1, "signal": 9})", "\"pid\""},
      {R"({"pid": 1, "scope_id": 3, "expiration_time": 1, "signal": 9})", "\"scope_id\""},
      {R"({"pid": 1, "scope_id": "s", "expiration_time": "soon", "signal": 9})",
       "\"expiration_time\""},
      {R"({"pid": 1, "scope_id": "s", "signal": 9})", "\"expiration_time\""},
      {R"({"pid": 1, "scope_id": "s", "expiration_time": 1})", "\"signal\""},
      {R"({"pid": 1, "scope_id": "s", "expiration_time": 1, "signal": 99})", "not a signal"},
      {R"({"version": "1", "pid": 1, "scope_id": "s", "expiration_time": 1, "signal": 9})",
       "\"version\""},
  };
  for (const Case& c : cases) {
    INFO(c.line);
    auto r = parseFileTimerRequest(c.line);
    REQUIRE_FALSE(r.isOk());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(r.status().message(), Catch::Contains(c.says));
  }
}

TEST_CASE("FileTimerTable: arm, re-arm, release and torch's reaping rules", "[unit]") {
  FileTimerTable table;
  CHECK_FALSE(table.earliest());
  table.apply({1, 100, "a", 50.0, 9}, 0, 10.0);
  table.apply({1, 100, "b", 40.0, 0}, 0, 10.0);
  table.apply({1, 200, "a", 45.0, 15}, 1, 11.0);
  CHECK(table.size() == 3);
  CHECK(table.earliest() == 40.0);
  // Arming the same pid and scope again replaces it.
  table.apply({1, 200, "a", 60.0, 15}, 1, 12.0);
  CHECK(table.size() == 3);
  CHECK(table.takeExpired(39.9).empty());

  // At 41 only pid 100's "b" is due; it asked for no signal, so pid 100 is not reaped, and
  // every timer of pid 100 goes (torch clears the pid's timers either way).
  auto at41 = table.takeExpired(41.0);
  REQUIRE(at41.size() == 1);
  CHECK(at41[0].pid == 100);
  CHECK(at41[0].timers.size() == 1);
  CHECK_FALSE(at41[0].reap);
  CHECK(table.size() == 1);

  // Several expired scopes of one pid: the first with a signal, in expiration order, names it.
  table.apply({1, 300, "late", 30.0, 15}, 0, 1.0);
  table.apply({1, 300, "early", 20.0, 0}, 0, 1.0);
  table.apply({1, 300, "middle", 25.0, 9}, 0, 1.0);
  auto at100 = table.takeExpired(100.0);
  REQUIRE(at100.size() == 2);  // pid 200 and pid 300, in pid order
  CHECK(at100[0].pid == 200);
  REQUIRE(at100[0].reap);
  CHECK(at100[0].reap->request.signal == 15);
  CHECK(at100[0].reap->armed_at == 12.0);
  CHECK(at100[1].pid == 300);
  REQUIRE(at100[1].timers.size() == 3);
  CHECK(at100[1].timers[0].request.scope_id == "early");
  REQUIRE(at100[1].reap);
  CHECK(at100[1].reap->request.scope_id == "middle");
  CHECK(table.size() == 0);

  // A release disarms; releasing what is not armed is fine; a worker's exit drops its timers.
  table.apply({1, 100, "a", 50.0, 9}, 0, 10.0);
  table.apply({1, 100, "a", -1, 0}, 0, 11.0);
  table.apply({1, 100, "never", -1, 0}, 0, 11.0);
  CHECK(table.size() == 0);
  table.apply({1, 100, "a", 50.0, 9}, 0, 10.0);
  table.apply({1, 101, "a", 50.0, 9}, 0, 10.0);  // a descendant of worker 0
  table.apply({1, 200, "a", 50.0, 9}, 1, 10.0);
  table.dropWorker(0);
  CHECK(table.size() == 1);
  CHECK(table.takeExpired(1e12).at(0).pid == 200);
}

TEST_CASE("findOwner: a worker itself, its descendants, nothing else", "[unit]") {
  const pid_t self = ::getpid();
  const pid_t parent = ::getppid();
  CHECK(findOwner(self, {-1, self}) == std::optional<size_t>(1));
  CHECK(findOwner(self, {parent}) == std::optional<size_t>(0));  // a child of "the worker"
  CHECK_FALSE(findOwner(parent, {self}));                        // an ancestor is not
  CHECK_FALSE(findOwner(self, {}));
  CHECK_FALSE(findOwner(7999999, {self, parent}));  // no such process
}

TEST_CASE("FileTimerServer: an expired scope gets its pid the requested signal, once", "[unit]") {
  Fixture f;
  REQUIRE(f.server.open().isOk());
  struct stat st {};
  REQUIRE(::stat(f.path.c_str(), &st) == 0);
  CHECK(S_ISFIFO(st.st_mode));
  f.server.beginAttempt();

  const double armed = epochNow();
  REQUIRE(sendToPipe(f.path, requestLine(7000002, "train_step", armed + 0.3, SIGKILL)) == 0);
  REQUIRE(runUntil(f.io, [&] { return !f.expired.empty(); }));
  const double acted = epochNow();
  CHECK(acted >= armed + 0.3);
  CHECK(acted < armed + 0.3 + 1.0);  // acted on when due, not at some later poll
  REQUIRE(f.kills.size() == 1);
  CHECK(f.kills[0] == std::make_pair(pid_t{7000002}, SIGKILL));
  const FileTimerServer::Expiry& e = f.expired.at(0);
  CHECK(e.worker == 1);
  CHECK(e.pid == 7000002);
  CHECK(e.scope_id == "train_step");
  CHECK(e.signal == SIGKILL);
  CHECK(e.expiration_time - e.armed_at == Approx(0.3).margin(0.1));
  CHECK(f.server.armedTimers() == 0);
  CHECK(f.server.requestsTotal() == 1);
}

TEST_CASE("FileTimerServer: a released scope is never acted on", "[unit]") {
  Fixture f;
  REQUIRE(f.server.open().isOk());
  f.server.beginAttempt();
  const double now = epochNow();
  // Armed and released in one write (two lines), and in two writes; then a sentinel due later.
  REQUIRE(sendToPipe(f.path, requestLine(7000001, "a", now + 0.2, SIGKILL) +
                                 requestLine(7000001, "a", -1, 0)) == 0);
  REQUIRE(sendToPipe(f.path, requestLine(7000001, "b", now + 0.2, SIGKILL)) == 0);
  REQUIRE(sendToPipe(f.path, requestLine(7000001, "b", -1, 0)) == 0);
  REQUIRE(sendToPipe(f.path, requestLine(7000002, "sentinel", now + 0.4, SIGTERM)) == 0);
  REQUIRE(runUntil(f.io, [&] { return !f.expired.empty(); }));
  REQUIRE(f.kills.size() == 1);
  CHECK(f.kills[0] == std::make_pair(pid_t{7000002}, SIGTERM));
  CHECK(f.server.requestsTotal() == 5);
}

TEST_CASE("FileTimerServer: bad lines and unknown pids are dropped, the rest is served", "[unit]") {
  Fixture f;
  REQUIRE(f.server.open().isOk());
  f.server.beginAttempt();
  const double now = epochNow();
  REQUIRE(sendToPipe(f.path, "this is not json\n") == 0);
  REQUIRE(sendToPipe(f.path, "{\"pid\": 7000001}\n") == 0);
  // Longer than PIPE_BUF: written in pieces by the kernel, dropped whole by the server.
  const std::string oversized = "{\"pid\": 7000001, \"scope_id\": \"" + std::string(10000, 'x') +
                                "\", \"expiration_time\": " + std::to_string(now) +
                                ", \"signal\": 9}\n";
  REQUIRE(sendToPipe(f.path, oversized) == 0);
  // A pid that is neither a worker nor a descendant of one: torch would signal it.
  REQUIRE(sendToPipe(f.path, requestLine(::getpid(), "evil", now, SIGKILL)) == 0);
  REQUIRE(sendToPipe(f.path, requestLine(1, "init", now, SIGKILL)) == 0);
  // Empty lines are skipped quietly; a good request after all that is served.
  REQUIRE(sendToPipe(f.path, "\n\n" + requestLine(7000001, "good", now + 0.1, SIGKILL)) == 0);
  REQUIRE(runUntil(f.io, [&] { return !f.expired.empty(); }));
  REQUIRE(f.kills.size() == 1);
  CHECK(f.kills[0] == std::make_pair(pid_t{7000001}, SIGKILL));
  CHECK(f.expired[0].scope_id == "good");
  CHECK(f.server.refusedTotal() == 5);
  CHECK(f.server.requestsTotal() == 3);  // well-formed: "evil", "init", "good"
}

TEST_CASE("FileTimerServer: between attempts timers are cleared and requests ignored", "[unit]") {
  Fixture f;
  REQUIRE(f.server.open().isOk());
  f.server.beginAttempt();
  const double now = epochNow();
  REQUIRE(sendToPipe(f.path, requestLine(7000001, "old", now + 0.2, SIGKILL)) == 0);
  REQUIRE(runUntil(f.io, [&] { return f.server.armedTimers() == 1; }));
  f.server.endAttempt();  // teardown: the armed timer goes
  CHECK(f.server.armedTimers() == 0);
  REQUIRE(sendToPipe(f.path, requestLine(7000001, "during_teardown", now, SIGKILL)) == 0);
  REQUIRE(runUntil(f.io, [&] { return f.server.requestsTotal() == 2; }));  // read, ignored
  CHECK(f.server.armedTimers() == 0);
  f.server.beginAttempt();
  // A worker's exit drops its timers: worker 0's scope never fires, worker 1's sentinel does.
  REQUIRE(sendToPipe(f.path, requestLine(7000001, "exits", now + 0.2, SIGKILL)) == 0);
  REQUIRE(runUntil(f.io, [&] { return f.server.armedTimers() == 1; }));
  f.server.workerExited(0);
  REQUIRE(sendToPipe(f.path, requestLine(7000002, "sentinel", now + 0.5, SIGTERM)) == 0);
  REQUIRE(runUntil(f.io, [&] { return !f.expired.empty(); }));
  REQUIRE(f.kills.size() == 1);
  CHECK(f.expired[0].scope_id == "sentinel");
  CHECK(f.server.requestsTotal() == 4);  // "during_teardown" among them, read and ignored
}

TEST_CASE("FileTimerServer: the pipe's life, and what it refuses to replace", "[unit]") {
  Fixture f;
  // Without a server the client's non-blocking open fails (torch: BrokenPipeError).
  CHECK(sendToPipe(f.path, "{}\n") == ENOENT);
  REQUIRE(f.server.open().isOk());
  REQUIRE(f.server.open().isOk());  // idempotent
  CHECK(sendToPipe(f.path, "\n") == 0);
  f.server.close();
  CHECK_FALSE(std::filesystem::exists(f.path));

  // A FIFO left behind by an earlier run is replaced, as torch's server does.
  REQUIRE(::mkfifo(f.path.c_str(), 0600) == 0);
  CHECK(sendToPipe(f.path, "\n") == ENXIO);  // nobody reads the stale one
  REQUIRE(f.server.open().isOk());
  CHECK(sendToPipe(f.path, "\n") == 0);
  f.server.close();

  // Anything else at the path is the user's: cpprun does not delete it (torch would).
  { std::ofstream(f.path) << "precious\n"; }
  auto refused = f.server.open();
  REQUIRE_FALSE(refused.isOk());
  CHECK_THAT(refused.message(), Catch::Contains("is not a named pipe"));
  CHECK_THAT(refused.message(), Catch::Contains(f.path));
  std::ifstream in(f.path);
  std::string kept;
  std::getline(in, kept);
  CHECK(kept == "precious");
}
