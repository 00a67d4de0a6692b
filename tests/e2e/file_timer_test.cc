// torch's FileTimer watchdog end to end (TORCHELASTIC_ENABLE_FILE_TIMER=1): torch 2.x's real
// FileTimerClient (tests/torch/file_timer_worker.py) in workers under cpprun, and the same script
// under torch 2.x's real torchrun, side by side.
//
// Under cpprun an expired scope ends its worker within the timer's bound + 2 s, the failure
// report names the scope as the root cause, the job ends (exit 1) or restarts (--max-restarts),
// and the pipe is gone afterwards; released scopes never fire. Under torchrun the same expiry
// kills the worker and torchrun itself (SIGKILL: exit 137, no report); the test checks that and
// prints what it measured, for docs/torchrun-compatibility.md.
//
// Every wait is bounded; the launchers' exits, their event logs and the workers' lines are the
// only synchronisation. What torchrun leaves behind when it kills itself (a worker in a session
// of its own) is found by its TMPDIR and SIGKILLed.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/support/cpprun_test_helpers.h"
#include "tests/support/test_support.h"
#include "tests/support/torch_peers.h"

namespace {

using namespace cpprun::testing;
namespace fs = std::filesystem;

const std::string kScript = sourcePath("tests/torch/file_timer_worker.py");

double epochNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The number after `prefix` on the first line of `output` that holds it ("[default1]:ARMED_AT
// 1700000000.123"); 0 when there is none.
double printedNumber(const std::string& output, const std::string& prefix) {
  const size_t at = output.find(prefix);
  if (at == std::string::npos) return 0;
  return std::atof(output.c_str() + at + prefix.size());
}

double eventSeconds(const Json& event) { return event.at("time_us").get<double>() / 1e6; }

// SIGKILLs every live process whose environment holds `entry`; returns their command lines.
std::vector<std::string> killProcessesWithEnvironment(const std::string& entry) {
  std::vector<std::string> killed;
  for (pid_t pid : processesWithEnvironment(entry)) {
    std::ifstream cmdline_file("/proc/" + std::to_string(pid) + "/cmdline");
    std::string cmdline((std::istreambuf_iterator<char>(cmdline_file)), {});
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    ::kill(pid, SIGKILL);
    killed.push_back(std::to_string(pid) + " " + cmdline);
  }
  return killed;
}

std::string torchrunPath() {
  return (fs::path(torch2().python).parent_path() / "torchrun").string();
}

}  // namespace

TEST_CASE(
    "FileTimer: an expired scope ends its worker within the bound + 2 s and is the root cause, "
    "released scopes never fire",
    "[integration][torch][torch2]") {
  requireTorchPeer(torch2());
  TempDir dir;
  const std::string events = dir.path() + "/events.jsonl";
  ChildProcess run(cpprunCommand({"--nproc-per-node=2", "--log-dir=" + dir.path(), "--rdzv-id=ft",
                                  "--event-log=" + events, kScript, "hang", "1"}),
                   {{"PYTHON_EXEC", torch2().python}, {"TORCHELASTIC_ENABLE_FILE_TIMER", "1"}});
  auto status = run.wait(90s);
  const double ended = epochNow();
  REQUIRE(status.has_value());
  INFO(run.output());
  CHECK(exitCodeOf(*status) == 1);
  // Every worker got the pipe, and the pipe went with the job.
  const std::string pipe = runDirectoryOf(dir.path(), "ft") + "/watchdog_timer";  // <run dir>/
  CHECK_THAT(run.output(), Catch::Contains("[default0]:TIMER_FILE " + pipe) &&
                               Catch::Contains("[default1]:TIMER_FILE " + pipe));
  CHECK_FALSE(fs::exists(pipe));
  // The released "quick_step" scopes did not fire; rank 0 finished.
  CHECK_THAT(run.output(), Catch::Contains("[default0]:DONE"));
  const double armed = printedNumber(run.output(), "[default1]:ARMED_AT ");
  REQUIRE(armed > 0);

  auto expired = eventsNamed(readEventLog(events), "file_timer_expired");
  REQUIRE(expired.size() == 1);
  CHECK(expired[0]["rank"] == 1);
  CHECK(expired[0]["scope_id"] == "train_step");
  CHECK(expired[0]["signal"] == "SIGKILL");
  double exited_at = 0;
  for (const Json& e : eventsNamed(readEventLog(events), "worker_exited")) {
    if (e["rank"] == 1) exited_at = eventSeconds(e);
  }
  REQUIRE(exited_at > 0);
  const double after_expiry = exited_at - (armed + 1.0);
  CHECK(exited_at - armed <= 1.0 + 2.0);
  CHECK(after_expiry >= -0.05);  // never before the scope's bound
  // The report's root cause is the scope, not "Signal 9 received".
  const std::string out = run.output();
  const size_t root = out.find("Root Cause (first observed failure):");
  REQUIRE(root != std::string::npos);
  const std::string root_section = out.substr(root, out.find("=====", root) - root);
  CHECK_THAT(root_section, Catch::Contains("rank      : 1"));
  CHECK_THAT(root_section,
             Catch::Contains("FileTimer scope 'train_step' expired 1.0 s after it was armed"));
  CHECK_THAT(root_section, Catch::Contains("cpprun sent SIGKILL to pid"));
  auto roots = eventsNamed(readEventLog(events), "root_cause");
  REQUIRE(roots.size() == 1);
  CHECK_THAT(roots[0]["message"].get<std::string>(), Catch::Contains("'train_step'"));
  std::printf(
      "cpprun: FileTimer expiry -> signal sent %.3f s, worker gone %.3f s, cpprun exited %.3f s "
      "after the expiry; exit %d; report: root cause names the scope\n",
      eventSeconds(expired[0]) - (armed + 1.0), after_expiry, ended - (armed + 1.0),
      exitCodeOf(*status));
}

TEST_CASE("FileTimer: released scopes never fire and the job exits 0 (a pipe the user named)",
          "[integration][torch][torch2]") {
  requireTorchPeer(torch2());
  TempDir dir;
  const std::string named = dir.path() + "/my_timer_pipe";
  const double start = epochNow();
  ChildProcess ok(cpprunCommand({"--nproc-per-node=2", kScript, "release"}),
                  {{"PYTHON_EXEC", torch2().python},
                   {"TORCHELASTIC_ENABLE_FILE_TIMER", "1"},
                   {"TORCHELASTIC_TIMER_FILE", named}});
  auto ok_status = ok.wait(90s);
  REQUIRE(ok_status.has_value());
  INFO(ok.output());
  CHECK(exitCodeOf(*ok_status) == 0);
  CHECK_THAT(ok.output(), Catch::Contains("[default0]:TIMER_FILE " + named) &&
                              Catch::Contains("[default0]:DONE") &&
                              Catch::Contains("[default1]:DONE"));
  CHECK_THAT(ok.output(), !Catch::Contains("expired"));
  CHECK_FALSE(fs::exists(named));  // torch's server removes a named one too
  CHECK(epochNow() - start >= 3.0);
}

TEST_CASE("FileTimer: with --max-restarts=1 an expiry fails attempt 0 and attempt 1 runs afresh",
          "[integration][torch][torch2]") {
  requireTorchPeer(torch2());
  TempDir dir;
  const std::string events2 = dir.path() + "/events2.jsonl";
  ChildProcess again(cpprunCommand({"--nproc-per-node=2", "--max-restarts=1",
                                    "--event-log=" + events2, kScript, "hang-once", "0"}),
                     {{"PYTHON_EXEC", torch2().python}, {"TORCHELASTIC_ENABLE_FILE_TIMER", "1"}});
  auto again_status = again.wait(120s);
  REQUIRE(again_status.has_value());
  INFO(again.output());
  CHECK(exitCodeOf(*again_status) == 0);
  auto expired_again = eventsNamed(readEventLog(events2), "file_timer_expired");
  REQUIRE(expired_again.size() == 1);
  CHECK(expired_again[0]["attempt"] == 0);
  CHECK(expired_again[0]["rank"] == 0);
  CHECK(eventsNamed(readEventLog(events2), "restart").size() == 1);
}

TEST_CASE("FileTimer under torch 2.x's torchrun: the expiry kills the worker and torchrun itself",
          "[integration][torch][torch2]") {
  requireTorchPeer(torch2());
  TempDir dir;
  const std::string tmp = dir.path() + "/tmp";
  fs::create_directories(tmp);
  ChildProcess run(
      {torchrunPath(), "--nproc-per-node=2", kScript, "hang", "1"},
      {{"PYTHON_EXEC", torch2().python}, {"TORCHELASTIC_ENABLE_FILE_TIMER", "1"}, {"TMPDIR", tmp}});
  auto status = run.wait(90s);
  const double ended = epochNow();
  // torchrun's killed agent leaves its workers' sessions behind: end them by their TMPDIR.
  const std::vector<std::string> left_behind = killProcessesWithEnvironment("TMPDIR=" + tmp);
  REQUIRE(status.has_value());
  INFO(run.output());
  const double armed = printedNumber(run.output(), "ARMED_AT ");  // torchrun prefixes nothing
  REQUIRE(armed > 0);
  // torch's FileTimerServer SIGKILLs the worker, then its own process: exit 137, no report.
  CHECK(exitCodeOf(*status) == 128 + SIGKILL);
  CHECK_THAT(run.output(), !Catch::Contains("Root Cause"));
  CHECK(ended - armed <= 1.0 + 3.0);
  // Killed, it cannot remove its pipe: $TMPDIR/watchdog_timer_<uuid4> stays.
  int pipes_left = 0;
  for (const auto& entry : fs::directory_iterator(tmp)) {
    if (entry.path().filename().string().rfind("watchdog_timer_", 0) == 0) ++pipes_left;
  }
  CHECK(pipes_left == 1);
  std::printf(
      "torchrun 2.x: FileTimer expiry -> torchrun exited %.3f s after the expiry; exit %d; "
      "report: %s; pipes left behind: %d; processes left behind: %zu\n",
      ended - (armed + 1.0), exitCodeOf(*status),
      run.output().find("FAILED") == std::string::npos ? "none" : "yes", pipes_left,
      left_behind.size());
  for (const std::string& process : left_behind)
    std::printf("  left behind: %s\n", process.c_str());
}
