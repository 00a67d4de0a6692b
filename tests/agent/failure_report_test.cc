// The failure report: reading torch's two error-file shapes, describing how a worker ended,
// choosing the root cause, torchrun's summary layout and the root-cause file cpprun writes.
#include "agent/supervision/failure_report.h"

#include <dirent.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/clip.h"

namespace {

using cpprun::agent::ErrorFileContents;
using cpprun::agent::WorkerFailure;
using Clock = std::chrono::system_clock;

// A fresh directory under $TMPDIR (or /tmp), removed with what is in it.
class TempDir {
 public:
  TempDir() {
    const char* base = ::getenv("TMPDIR");
    std::string tmpl = std::string(base != nullptr && *base != '\0' ? base : "/tmp") +
                       "/cpprun-failure-report-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    for (const std::string& name : entries()) ::unlink((path_ + "/" + name).c_str());
    ::rmdir(path_.c_str());
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream out(file(name), std::ios::binary);
    out << text;
    return file(name);
  }
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    DIR* dir = ::opendir(path_.c_str());
    if (dir == nullptr) return names;
    while (dirent* e = ::readdir(dir)) {
      std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    ::closedir(dir);
    return names;
  }

 private:
  std::string path_;
};

std::string readAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Wait statuses in the Linux encoding, checked against the <sys/wait.h> macros.
int exitedStatus(int code) {
  int status = code << 8;
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == code);
  return status;
}
int signaledStatus(int signo) {
  int status = signo;
  REQUIRE(WIFSIGNALED(status));
  REQUIRE(WTERMSIG(status) == signo);
  return status;
}

// A time point at this local wall-clock time.
Clock::time_point localTime(int year, int month, int day, int hour, int minute, int second) {
  std::tm tm{};
  tm.tm_year = year - 1900;
  tm.tm_mon = month - 1;
  tm.tm_mday = day;
  tm.tm_hour = hour;
  tm.tm_min = minute;
  tm.tm_sec = second;
  tm.tm_isdst = -1;
  return Clock::from_time_t(::mktime(&tm));
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string line;
  while (std::getline(ss, line)) out.push_back(line);
  return out;
}

const char* const kNested = R"({"message": {"message": "ValueError: boom", "extraInfo": {
  "py_callstack": "Traceback (most recent call last):\n  File \"t.py\", line 1\nValueError: boom\n",
  "timestamp": "1700000000"}}})";
const char* const kFlat = R"({"message": "worker gave up", "timestamp": 1700000123})";

WorkerFailure failureAt(int rank, Clock::time_point time, bool teardown = false) {
  WorkerFailure f;
  f.rank = rank;
  f.local_rank = rank;
  f.pid = 1000 + rank;
  f.exit_code = 1;
  f.time = time;
  f.teardown = teardown;
  f.message = "failure of rank " + std::to_string(rank);
  return f;
}

}  // namespace

TEST_CASE("an error file in torch's nested record shape is parsed", "[unit]") {
  TempDir dir;
  auto read = cpprun::agent::readErrorFile(dir.write("error.json", kNested));
  REQUIRE(read.isOk());
  REQUIRE(read.value().has_value());
  const ErrorFileContents& c = *read.value();
  CHECK(c.message == "ValueError: boom");
  CHECK(c.traceback ==
        "Traceback (most recent call last):\n  File \"t.py\", line 1\n"
        "ValueError: boom\n");
  REQUIRE(c.timestamp_s.has_value());
  CHECK(*c.timestamp_s == 1700000000);
  CHECK(c.raw == nlohmann::json::parse(kNested));
}

TEST_CASE("an error file in torch's flat message shape is parsed", "[unit]") {
  TempDir dir;
  auto read = cpprun::agent::readErrorFile(dir.write("error.json", kFlat));
  REQUIRE(read.isOk());
  REQUIRE(read.value().has_value());
  const ErrorFileContents& c = *read.value();
  CHECK(c.message == "worker gave up");
  CHECK(c.traceback.empty());
  REQUIRE(c.timestamp_s.has_value());
  CHECK(*c.timestamp_s == 1700000123);
  CHECK(c.raw["timestamp"] == 1700000123);
}

TEST_CASE("an error file without a timestamp parses with none", "[unit]") {
  auto parsed = cpprun::agent::parseErrorFile("x.json", R"({"message": {"message": "E: m"}})");
  REQUIRE(parsed.isOk());
  CHECK(parsed.value().message == "E: m");
  CHECK_FALSE(parsed.value().timestamp_s.has_value());
  auto bad_ts = cpprun::agent::parseErrorFile(
      "x.json", R"({"message": {"message": "E: m", "extraInfo": {"timestamp": "soon"}}})");
  REQUIRE(bad_ts.isOk());
  CHECK_FALSE(bad_ts.value().timestamp_s.has_value());
}

TEST_CASE("a missing or empty error file is no error file", "[unit]") {
  TempDir dir;
  auto missing = cpprun::agent::readErrorFile(dir.file("never-written.json"));
  REQUIRE(missing.isOk());
  CHECK_FALSE(missing.value().has_value());
  auto empty = cpprun::agent::readErrorFile(dir.write("empty.json", ""));
  REQUIRE(empty.isOk());
  CHECK_FALSE(empty.value().has_value());
  auto blank = cpprun::agent::readErrorFile(dir.write("blank.json", " \n"));
  REQUIRE(blank.isOk());
  CHECK_FALSE(blank.value().has_value());
}

TEST_CASE("a corrupt error file is an error naming the path", "[unit]") {
  TempDir dir;
  const std::string path = dir.write("error.json", R"({"message": "trunc)");
  auto read = cpprun::agent::readErrorFile(path);
  REQUIRE_FALSE(read.isOk());
  CHECK(read.status().code() == cpprun::StatusCode::kInvalidArgument);
  CHECK_THAT(read.status().message(), Catch::Contains(path));
  CHECK_THAT(read.status().message(), Catch::Contains("not valid JSON"));
}

TEST_CASE("an error file of neither shape is an error naming the path", "[unit]") {
  TempDir dir;
  for (const char* text :
       {R"([1, 2])", R"({"msg": "x"})", R"({"message": 7})", R"({"message": {"extraInfo": {}}})"}) {
    const std::string path = dir.write("odd.json", text);
    auto read = cpprun::agent::readErrorFile(path);
    INFO(text);
    REQUIRE_FALSE(read.isOk());
    CHECK(read.status().code() == cpprun::StatusCode::kInvalidArgument);
    CHECK_THAT(read.status().message(), Catch::Contains(path));
    CHECK_THAT(read.status().message(), Catch::Contains("expected"));
  }
}

TEST_CASE("an error file that is a directory is an error naming the path", "[unit]") {
  TempDir dir;
  auto read = cpprun::agent::readErrorFile(dir.path());
  REQUIRE_FALSE(read.isOk());
  CHECK_THAT(read.status().message(), Catch::Contains(dir.path()));
}

TEST_CASE("signals are named from a table with a numeric fallback", "[unit]") {
  CHECK(cpprun::agent::signalName(9) == "SIGKILL");
  CHECK(cpprun::agent::signalName(15) == "SIGTERM");
  CHECK(cpprun::agent::signalName(11) == "SIGSEGV");
  CHECK(cpprun::agent::signalName(6) == "SIGABRT");
  CHECK(cpprun::agent::signalName(2) == "SIGINT");
  CHECK(cpprun::agent::signalName(10) == "SIGUSR1");
  CHECK(cpprun::agent::signalName(200) == "SIG200");
  CHECK(cpprun::agent::signalName(0) == "SIG0");
  CHECK(cpprun::agent::signalText(9, 123) == "Signal 9 (SIGKILL) received by PID 123");
}

TEST_CASE("a worker that exited non-zero without an error file gets the record hint", "[unit]") {
  TempDir dir;
  const Clock::time_point observed = Clock::now();
  WorkerFailure f = cpprun::agent::describeFailure(1, 5, 4242, exitedStatus(3), observed,
                                                   dir.file("missing.json"), {"oops"}, false);
  CHECK(f.local_rank == 1);
  CHECK(f.rank == 5);
  CHECK(f.pid == 4242);
  CHECK(f.exit_code == 3);
  CHECK(f.signal == 0);
  CHECK(cpprun::agent::torchExitCode(f) == 3);
  CHECK(f.time == observed);
  CHECK(f.error_file.empty());
  CHECK_THAT(f.message, Catch::StartsWith("exit code 3 "));
  CHECK_THAT(f.message, Catch::Contains("torch.distributed.elastic.multiprocessing.errors.record"));
  CHECK(f.traceback.empty());
  CHECK(f.stderr_tail == std::vector<std::string>{"oops"});
  CHECK_FALSE(f.teardown);
  CHECK(f.error_document.is_null());
}

TEST_CASE("a worker killed by a signal is described by torchrun's signal text", "[unit]") {
  const Clock::time_point observed = Clock::now();
  WorkerFailure f =
      cpprun::agent::describeFailure(0, 0, 123, signaledStatus(9), observed, "", {}, true);
  CHECK(f.signal == 9);
  CHECK(f.exit_code == 0);
  CHECK(cpprun::agent::torchExitCode(f) == -9);
  CHECK(f.message == "Signal 9 (SIGKILL) received by PID 123");
  CHECK(f.error_file.empty());
  CHECK(f.teardown);
  CHECK(f.time == observed);
}

TEST_CASE("a worker's error file supplies message traceback and time", "[unit]") {
  TempDir dir;
  const std::string path = dir.write("error.json", kNested);
  WorkerFailure f =
      cpprun::agent::describeFailure(0, 2, 77, signaledStatus(6), Clock::now(), path, {}, false);
  CHECK(f.signal == 6);
  CHECK(f.error_file == path);
  CHECK(f.message == "ValueError: boom");
  CHECK_THAT(f.traceback, Catch::StartsWith("Traceback (most recent call last):"));
  CHECK(f.time == Clock::from_time_t(1700000000));
  CHECK(f.error_document == nlohmann::json::parse(kNested));
}

TEST_CASE("a corrupt error file is reported in the message and is not fatal", "[unit]") {
  TempDir dir;
  const std::string path = dir.write("error.json", "{not json");
  const Clock::time_point observed = Clock::now();
  WorkerFailure f =
      cpprun::agent::describeFailure(0, 0, 9, exitedStatus(1), observed, path, {}, false);
  CHECK(f.exit_code == 1);
  CHECK(f.error_file == path);
  CHECK_THAT(f.message, Catch::StartsWith("exit code 1; "));
  CHECK_THAT(f.message, Catch::Contains(path));
  CHECK_THAT(f.message, Catch::Contains("not valid JSON"));
  CHECK(f.time == observed);
  CHECK(f.error_document.is_null());
}

TEST_CASE("the root cause is the earliest failure", "[unit]") {
  const Clock::time_point t0 = Clock::from_time_t(1700000000);
  std::vector<WorkerFailure> failures = {failureAt(0, t0 + std::chrono::seconds(3)),
                                         failureAt(1, t0 + std::chrono::seconds(1)),
                                         failureAt(2, t0 + std::chrono::seconds(2))};
  CHECK(cpprun::agent::rootCauseIndex(failures) == 1);
}

TEST_CASE("teardown failures are never the root cause while another exists", "[unit]") {
  const Clock::time_point t0 = Clock::from_time_t(1700000000);
  std::vector<WorkerFailure> failures = {failureAt(0, t0, true),
                                         failureAt(1, t0 + std::chrono::seconds(5)),
                                         failureAt(2, t0 + std::chrono::seconds(1), true)};
  CHECK(cpprun::agent::rootCauseIndex(failures) == 1);
}

TEST_CASE("when all failures are teardown the earliest is the root cause", "[unit]") {
  const Clock::time_point t0 = Clock::from_time_t(1700000000);
  std::vector<WorkerFailure> failures = {failureAt(0, t0 + std::chrono::seconds(2), true),
                                         failureAt(1, t0 + std::chrono::seconds(1), true)};
  CHECK(cpprun::agent::rootCauseIndex(failures) == 1);
}

TEST_CASE("root cause ties are broken by the lowest rank", "[unit]") {
  const Clock::time_point t0 = Clock::from_time_t(1700000000);
  std::vector<WorkerFailure> failures = {failureAt(7, t0), failureAt(3, t0), failureAt(5, t0),
                                         failureAt(1, t0 + std::chrono::seconds(1))};
  CHECK(cpprun::agent::rootCauseIndex(failures) == 1);
}

TEST_CASE("a single failure report has torchrun's exact layout", "[unit]") {
  WorkerFailure f;
  f.rank = 2;
  f.local_rank = 1;
  f.pid = 4242;
  f.exit_code = 1;
  f.time = localTime(2024, 3, 5, 7, 8, 9);
  f.error_file = "/tmp/e.json";
  f.message = "ValueError: boom";
  f.traceback = "Traceback (most recent call last):\n  File \"t.py\", line 1\nValueError: boom\n";
  f.stderr_tail = {"warn: x", "fatal: y"};
  const std::string report = cpprun::agent::formatFailureReport("train.py", "node1", {f});
  // The widest line is the traceback's first (48 columns), below the cap of 60.
  const std::string eq(48, '=');
  const std::string dash(48, '-');
  const std::string expected = eq + "\n" + "train.py FAILED\n" + dash + "\n" +
                               "Failures:\n"
                               "  <NO_OTHER_FAILURES>\n" +
                               dash + "\n" +
                               "Root Cause (first observed failure):\n"
                               "[0]:\n"
                               "  time      : 2024-03-05_07:08:09\n"
                               "  host      : node1\n"
                               "  rank      : 2 (local_rank: 1)\n"
                               "  exitcode  : 1 (pid: 4242)\n"
                               "  error_file: /tmp/e.json\n"
                               "  traceback : Traceback (most recent call last):\n"
                               "      File \"t.py\", line 1\n"
                               "    ValueError: boom\n"
                               "  stderr (last 2 lines):\n"
                               "    warn: x\n"
                               "    fatal: y\n" +
                               eq + "\n";
  CHECK(report == expected);
}

TEST_CASE("a report lists the other failures and labels signals and teardown", "[unit]") {
  const Clock::time_point t0 = Clock::from_time_t(1700000000);
  WorkerFailure root = failureAt(1, t0);
  root.message = "RuntimeError: NCCL error\nsecond line";
  WorkerFailure killed = failureAt(0, t0 + std::chrono::seconds(2), true);
  killed.signal = 15;
  killed.pid = 55;
  killed.message = "Signal 15 (SIGTERM) received by PID 55";
  const std::string report =
      cpprun::agent::formatFailureReport("/usr/bin/trainer", "host-a", {root, killed});
  const std::vector<std::string> got = lines(report);
  REQUIRE(got.size() > 10);
  CHECK(got[1] == "/usr/bin/trainer FAILED");
  CHECK(got[3] == "Failures:");
  // Numbered in rank order: rank 0 (the teardown victim) is [0] among the other failures.
  CHECK(got[4] == "[0]:");
  CHECK(got[7] == "  rank      : 0 (local_rank: 0)");
  CHECK(got[8] == "  exitcode  : -15 (pid: 55) SIGTERM (stopped by cpprun during teardown)");
  CHECK(got[9] == "  error_file: <N/A>");
  CHECK(got[10] == "  traceback : Signal 15 (SIGTERM) received by PID 55");
  CHECK(got[12] == "Root Cause (first observed failure):");
  CHECK(got[13] == "[1]:");
  CHECK(got[16] == "  rank      : 1 (local_rank: 1)");
  CHECK(got[17] == "  exitcode  : 1 (pid: 1001)");
  CHECK(got[19] == "  traceback : RuntimeError: NCCL error");
  CHECK(got[20] == "    second line");
  CHECK(got.back() == got.front());
  CHECK(got[11] == got[2]);
  CHECK(report.find("<NO_OTHER_FAILURES>") == std::string::npos);
  CHECK(report.find("stderr (last") == std::string::npos);
  // The teardown exitcode line is 71 columns: the rules stop at 60.
  CHECK(got.front() == std::string(60, '='));
  CHECK(got[2] == std::string(60, '-'));
}

TEST_CASE("report rules are capped at 60 columns", "[unit]") {
  WorkerFailure f = failureAt(0, Clock::from_time_t(1700000000));
  f.stderr_tail = {std::string(200, 'x')};
  const std::string report = cpprun::agent::formatFailureReport("train.py", "node1", {f});
  const std::vector<std::string> got = lines(report);
  CHECK(got.front() == std::string(60, '='));
  CHECK(got[2] == std::string(60, '-'));
  CHECK(got.back() == std::string(60, '='));
  CHECK_THAT(report, Catch::Contains("  stderr (last 1 line):\n    " + std::string(200, 'x')));
}

// What the report quotes of a worker is bounded (failure_report.h): it reaches the console past
// the budget worker lines have, so a worker cannot make it large (or, once, make it vanish).
TEST_CASE("the report clips each quoted line and bounds the stderr tail", "[unit]") {
  using cpprun::agent::kReportLineBytes;
  using cpprun::agent::kReportTailBytes;
  WorkerFailure f = failureAt(0, Clock::from_time_t(1700000000));
  f.stderr_tail = {"first", std::string(1100 * 1000, 'x'), "last"};
  std::string report = cpprun::agent::formatFailureReport("train.py", "node1", {f});
  CHECK_THAT(report, Catch::Contains("  stderr (last 3 lines):\n    first\n    " +
                                     std::string(kReportLineBytes, 'x') + "\xE2\x80\xA6 (" +
                                     std::to_string(1100 * 1000 - kReportLineBytes) +
                                     " bytes clipped)\n    last\n"));
  CHECK(report.size() < 2 * kReportLineBytes);

  // Twenty 4 KiB lines: the newest that fit in kReportTailBytes, the rest counted.
  f.stderr_tail.clear();
  for (int i = 0; i < 20; ++i) f.stderr_tail.push_back(std::to_string(i) + std::string(4000, '.'));
  report = cpprun::agent::formatFailureReport("train.py", "node1", {f});
  const size_t kept = kReportTailBytes / (4002 + 5);  // each line indented, with its '\n'
  CHECK_THAT(report, Catch::Contains("  stderr (last 20 lines):\n    \xE2\x80\xA6 (" +
                                     std::to_string(20 - kept) + " earlier lines left out)\n    " +
                                     std::to_string(20 - kept) + "...."));
  CHECK_THAT(report, Catch::Contains("\n    19....") && !Catch::Contains("\n    0...."));
  CHECK(report.size() < kReportTailBytes + 2048);
}

TEST_CASE("the report keeps a traceback's first and last lines within its bound", "[unit]") {
  using cpprun::agent::kReportTracebackBytes;
  WorkerFailure f = failureAt(0, Clock::from_time_t(1700000000));
  f.traceback = "Traceback (most recent call last):\n";
  for (int i = 0; i < 100000; ++i)
    f.traceback += "  File \"x.py\", line " + std::to_string(i) + "\n";
  f.traceback += "RecursionError: maximum recursion depth exceeded\n";
  const std::string report = cpprun::agent::formatFailureReport("train.py", "node1", {f});
  CHECK_THAT(report, Catch::Contains("  traceback : Traceback (most recent call last):\n    "
                                     "\xE2\x80\xA6 (") &&
                         Catch::Contains(" lines left out)\n") &&
                         Catch::Contains("line 99999\n    RecursionError: maximum recursion"));
  CHECK(report.size() < kReportTracebackBytes + 2048);
  CHECK(report.size() > kReportTracebackBytes / 2);
}

TEST_CASE("a clipped line never splits a UTF-8 character and says what it left out", "[unit]") {
  const std::string line = "a" + [] {
    std::string s;
    for (int i = 0; i < 3000; ++i) s += "\xC3\xA9";  // é
    return s;
  }();
  // Byte 4096 is the second byte of an é: the cut moves back to its first.
  const std::string clipped = cpprun::clipQuotedLine(line, 4096, line.size());
  CHECK(clipped == line.substr(0, 4095) + "\xE2\x80\xA6 (1906 bytes clipped)");
  CHECK(cpprun::clipQuotedLine("short", 4096, 5) == "short");
  // The caller holds only the head of a longer line.
  CHECK(cpprun::clipQuotedLine("abcdef", 4, 1000) == "abcd\xE2\x80\xA6 (996 bytes clipped)");
}

TEST_CASE("the root cause document copies a nested error file and sets errorCode", "[unit]") {
  WorkerFailure f = failureAt(0, Clock::from_time_t(1700000999));
  f.signal = 6;
  f.error_document = nlohmann::json::parse(kNested);
  nlohmann::json doc = cpprun::agent::rootCauseDocument(f);
  nlohmann::json want = nlohmann::json::parse(kNested);
  want["message"]["errorCode"] = -6;
  CHECK(doc == want);
}

TEST_CASE("the root cause document of a flat error file is nested with errorCode", "[unit]") {
  WorkerFailure f = failureAt(0, Clock::from_time_t(1700000123));
  f.exit_code = 2;
  f.message = "worker gave up";
  f.error_document = nlohmann::json::parse(kFlat);
  nlohmann::json doc = cpprun::agent::rootCauseDocument(f);
  CHECK(doc["message"]["message"] == "worker gave up");
  CHECK(doc["message"]["errorCode"] == 2);
  CHECK(doc["message"]["extraInfo"]["timestamp"] == "1700000123");
  CHECK_FALSE(doc["message"]["extraInfo"].contains("py_callstack"));
}

TEST_CASE("without an error file the root cause document is synthesised", "[unit]") {
  WorkerFailure f = failureAt(3, Clock::from_time_t(1700000456));
  f.signal = 9;
  f.message = "Signal 9 (SIGKILL) received by PID 1003";
  f.traceback = "tb";
  nlohmann::json doc = cpprun::agent::rootCauseDocument(f);
  nlohmann::json want = {{"message",
                          {{"message", "Signal 9 (SIGKILL) received by PID 1003"},
                           {"extraInfo", {{"py_callstack", "tb"}, {"timestamp", "1700000456"}}},
                           {"errorCode", -9}}}};
  CHECK(doc == want);
}

TEST_CASE("writeRootCauseFile writes the document atomically and readably", "[unit]") {
  TempDir dir;
  const std::string path = dir.write("root.json", "stale contents");
  WorkerFailure f = failureAt(0, Clock::from_time_t(1700000000));
  f.exit_code = 3;
  f.message = "E: m";
  f.traceback = "line1\nline2";
  REQUIRE(cpprun::agent::writeRootCauseFile(path, f).isOk());
  CHECK(nlohmann::json::parse(readAll(path)) == cpprun::agent::rootCauseDocument(f));
  CHECK(dir.entries() == std::vector<std::string>{"root.json"});  // no temporary left behind
  // cpprun's own file reads back like a worker's.
  auto read = cpprun::agent::readErrorFile(path);
  REQUIRE(read.isOk());
  REQUIRE(read.value().has_value());
  CHECK(read.value()->message == "E: m");
  CHECK(read.value()->traceback == "line1\nline2");
  CHECK(read.value()->timestamp_s == std::optional<int64_t>(1700000000));
}

TEST_CASE("writeRootCauseFile reports an unwritable path naming it", "[unit]") {
  TempDir dir;
  const std::string path = dir.file("no/such/dir/root.json");
  cpprun::Status s =
      cpprun::agent::writeRootCauseFile(path, failureAt(0, Clock::from_time_t(1700000000)));
  REQUIRE_FALSE(s.isOk());
  CHECK_THAT(s.message(), Catch::Contains(path));
  CHECK(dir.entries().empty());
}
