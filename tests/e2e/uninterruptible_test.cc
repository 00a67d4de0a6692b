// Workers stuck in uninterruptible sleep (Linux D state), for real: a worker is put into a cgroup
// v1 freezer group made by the test and frozen there. A frozen task shows state D in /proc and a
// SIGKILL does not end it until the group is thawed (checked on Linux 6.18; the CI machines are
// of the same kind and run as root with the v1 freezer mounted at /sys/fs/cgroup/freezer, so a
// missing freezer FAILS these tests instead of skipping them).
//
//  - running: with --uninterruptible-state-timeout 2 a worker frozen in D fails the attempt as
//    torchrun's TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT marks the group UNHEALTHY (no restart);
//  - teardown: a worker still frozen after SIGKILL is given up on at --reap-timeout: cpprun exits
//    7 naming pid, state D and wchan, with everything else killed;
//  - torchrun 2.15 on the same case, bounded by the test: what it does is printed as a finding.
//
// Every wait polls /proc or the output with a deadline; the freezer group is thawed and removed,
// and every worker the test's launcher started is ended by pid, on every path.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "agent/processes/process_launcher.h"
#include "tests/support/cpprun_test_helpers.h"
#include "tests/support/torch_peers.h"

namespace cpprun::testing {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr const char* kFreezerRoot = "/sys/fs/cgroup/freezer";

bool writeFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.flush();
  return static_cast<bool>(out);
}

std::string trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// Polls `done` every 10 ms until it holds or `bound` passes; returns whether it held.
template <typename F>
bool pollUntil(F done, milliseconds bound) {
  const auto deadline = Clock::now() + bound;
  while (!done()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(milliseconds(10));  // a /proc poll, not a synchronisation
  }
  return true;
}

double secondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// A cgroup v1 freezer group of the test's own. The destructor thaws it, ends what is left in it
// (the test's workers only: nothing else is ever put there), waits for it to empty (bounded) and
// removes it.
class FreezerGroup {
 public:
  FreezerGroup() {
    dir_ = std::string(kFreezerRoot) + "/cpprun_test_" + std::to_string(::getpid()) + "_" +
           std::to_string(counter()++);
    struct stat st {};
    INFO(
        "the cgroup v1 freezer is not mounted at /sys/fs/cgroup/freezer: these tests need it to "
        "hold a worker in uninterruptible sleep");
    REQUIRE(::stat((std::string(kFreezerRoot) + "/cgroup.procs").c_str(), &st) == 0);
    INFO("cannot create the freezer group " + dir_ + " (needs root)");
    REQUIRE(::mkdir(dir_.c_str(), 0755) == 0);
    made_ = true;
    REQUIRE(::stat((dir_ + "/freezer.state").c_str(), &st) == 0);
  }
  ~FreezerGroup() {
    if (!made_) return;
    writeFile(dir_ + "/freezer.state", "THAWED");
    // What a launcher left in it (torchrun that the test had to kill): the test's own workers.
    for (pid_t pid : pidsIn(dir_ + "/cgroup.procs")) ::kill(pid, SIGKILL);
    pollUntil([&] { return pidsIn(dir_ + "/cgroup.procs").empty(); }, seconds(10));
    ::rmdir(dir_.c_str());
  }
  FreezerGroup(const FreezerGroup&) = delete;
  FreezerGroup& operator=(const FreezerGroup&) = delete;

  // Moves `pid` in and freezes the group; true once /proc shows it in D (within 5 s).
  bool freeze(pid_t pid) {
    if (!writeFile(dir_ + "/cgroup.procs", std::to_string(pid))) return false;
    if (!writeFile(dir_ + "/freezer.state", "FROZEN")) return false;
    return pollUntil([&] { return agent::processState(pid) == 'D'; }, seconds(5));
  }
  void thaw() { writeFile(dir_ + "/freezer.state", "THAWED"); }

 private:
  static int& counter() {
    static int n = 0;
    return n;
  }
  std::string dir_;
  bool made_ = false;
};

// The cgroup v2 directory `pid` is in when it is cpprun's job cgroup (cpprun-<guardian pid>,
// agent/processes/job_containment.h), else "". cpprun cannot remove it while a stuck worker is
// inside: the test does, once the worker is gone.
std::string jobCgroupOf(pid_t pid, pid_t guardian) {
  std::string path;
  {
    std::ifstream in("/proc/" + std::to_string(pid) + "/cgroup");
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("0::", 0) == 0) path = line.substr(3);
    }
  }
  if (path.find("/cpprun-" + std::to_string(guardian)) == std::string::npos) return "";
  std::ifstream mounts("/proc/self/mountinfo");
  for (std::string line; std::getline(mounts, line);) {
    if (line.find(" - cgroup2 ") == std::string::npos) continue;
    std::istringstream fields(line);
    std::string id, parent, dev, root, mount_point;
    fields >> id >> parent >> dev >> root >> mount_point;
    return mount_point + path;
  }
  return "";
}

// The job cgroup a stuck worker kept cpprun from removing: removed once empty (bounded).
struct LeftCgroup {
  std::string path;
  bool remove() const {
    return path.empty() ||
           pollUntil([&] { return ::rmdir(path.c_str()) == 0 || errno == ENOENT; }, seconds(10));
  }
  ~LeftCgroup() { remove(); }
};

// The worker: records its pid in <prefix>.<RANK>, then sleeps (a plain S-state process until the
// test freezes it).
std::vector<std::string> sleeperWorker(const std::string& pid_prefix) {
  // The shell's pid from /proc/self/stat (read is a builtin): torchrun substitutes its macros
  // with Python's string.Template, which would turn "$$" into "$".
  return {"/bin/sh", "-c",
          "read -r p rest < /proc/self/stat && echo \"$p\" > \"$0.$RANK.tmp\" && "
          "mv \"$0.$RANK.tmp\" \"$0.$RANK\" && exec sleep 1000",
          pid_prefix};
}

pid_t waitForPid(const std::string& path, milliseconds bound) {
  pid_t pid = -1;
  pollUntil(
      [&] {
        auto pids = pidsIn(path);
        if (!pids.empty()) pid = pids.front();
        return pid > 0;
      },
      bound);
  return pid;
}

// Ends the workers a launcher left (by the pids they recorded) and waits for them to go.
void endWorkers(const std::vector<pid_t>& pids) {
  for (pid_t pid : pids) {
    if (pid > 0 && alive(pid)) ::kill(pid, SIGKILL);
  }
  allGone(pids, seconds(10));
}

// cpprun with two sleeper workers (sleeperWorker), the D-state check at 2 s and the given
// teardown bounds in seconds, its events into `events`.
std::vector<std::string> sleeperJob(int shutdown_s, int reap_s, const std::string& events,
                                    const std::string& pid_prefix) {
  std::vector<std::string> argv = {"--nproc-per-node=2",
                                   "--max-restarts=2",
                                   "--shutdown-timeout=" + std::to_string(shutdown_s),
                                   "--reap-timeout=" + std::to_string(reap_s),
                                   "--uninterruptible-state-timeout=2",
                                   "--event-log=" + events,
                                   "--no-python"};
  for (const std::string& a : sleeperWorker(pid_prefix)) argv.push_back(a);
  return argv;
}

// The pids ranks 0 and 1 wrote to <pid_prefix>.<rank> (each within 30 s).
std::pair<pid_t, pid_t> waitForBothRanks(const std::string& pid_prefix) {
  const pid_t rank0 = waitForPid(pid_prefix + ".0", seconds(30));
  const pid_t rank1 = waitForPid(pid_prefix + ".1", seconds(30));
  REQUIRE(rank0 > 0);
  REQUIRE(rank1 > 0);
  return {rank0, rank1};
}

TEST_CASE(
    "uninterruptible sleep: a running worker in D state for the timeout fails the attempt "
    "without a restart",
    "[integration]") {
  TempDir dir;
  FreezerGroup freezer;
  const std::string pid_prefix = dir.path() + "/pid";
  const std::string events = dir.path() + "/events.jsonl";
  ChildProcess run(cpprunCommand(sleeperJob(5, 5, events, pid_prefix)));
  const auto [rank0, rank1] = waitForBothRanks(pid_prefix);
  REQUIRE(freezer.freeze(rank0));
  const auto entered_d = Clock::now();

  // Detected within the timeout plus a check interval (0.5 s for 2 s) and a margin.
  const bool detected = run.waitForText("stuck in uninterruptible sleep", seconds(6));
  const double detect_s = secondsSince(entered_d);
  INFO(run.output());
  REQUIRE(detected);
  CHECK(detect_s >= 1.9);
  // The worker leaves D: the teardown's SIGTERM (pending while it was frozen) ends it.
  freezer.thaw();
  auto status = run.wait(seconds(20));
  const double exit_s = secondsSince(entered_d);
  if (!status) run.readAvailable(milliseconds(200));
  REQUIRE(status.has_value());
  std::printf("RESULT uninterruptible_detect_s %.2f s (timeout 2 s); exit after %.2f s\n", detect_s,
              exit_s);
  CHECK(exitCodeOf(*status) == 1);
  // torch disables the restarts: a wedged worker holds a GPU a new group would need.
  CHECK(run.output().find("not restarting it") != std::string::npos);
  CHECK(run.output().find("attempt 1") == std::string::npos);
  // The report's root cause is the worker in D, named with its pid and state.
  const std::string report = run.output().substr(run.output().find("Root Cause"));
  CHECK(report.find("rank      : 0") != std::string::npos);
  CHECK(report.find("pid " + std::to_string(rank0)) != std::string::npos);
  CHECK(report.find("state D (uninterruptible sleep)") != std::string::npos);
  const auto log = readEventLog(events);
  CHECK(eventsNamed(log, "worker_uninterruptible").size() == 1);
  const auto timeouts = eventsNamed(log, "worker_uninterruptible_timeout");
  REQUIRE(timeouts.size() == 1);
  CHECK(timeouts[0]["process"]["pid"] == rank0);
  CHECK(timeouts[0]["process"]["state"] == "D");
  CHECK(eventsNamed(log, "restart").empty());
  CHECK(eventsNamed(log, "job_finished").at(0)["exit_code"] == 1);
  CHECK(allGone({rank0, rank1}, seconds(10)));
}

TEST_CASE(
    "uninterruptible sleep: a worker still in D after SIGKILL is named and cpprun exits 7 "
    "at the reap bound",
    "[integration]") {
  TempDir dir;
  LeftCgroup job_cgroup;  // destroyed after the freezer group: its worker is gone by then
  FreezerGroup freezer;
  const std::string pid_prefix = dir.path() + "/pid";
  const std::string events = dir.path() + "/events.jsonl";
  ChildProcess run(cpprunCommand(sleeperJob(1, 2, events, pid_prefix)));
  const auto [rank0, rank1] = waitForBothRanks(pid_prefix);
  REQUIRE(freezer.freeze(rank0));
  const auto entered_d = Clock::now();
  // Its wait channel once it reads as one: just frozen, the task can show "0" for a moment
  // (seen under load), while cpprun reads it seconds later.
  std::string wchan;
  pollUntil(
      [&] {
        wchan = trimmed(readFile("/proc/" + std::to_string(rank0) + "/wchan"));
        return !wchan.empty() && wchan != "0";
      },
      seconds(5));
  job_cgroup.path = jobCgroupOf(rank0, run.pid());

  // D timeout 2 s (+ a 0.5 s check), SIGTERM grace 1 s, reap bound 2 s: about 5.5 s.
  auto status = run.wait(seconds(20));
  const double exit_s = secondsSince(entered_d);
  if (!status) run.readAvailable(milliseconds(200));
  INFO(run.output());
  REQUIRE(status.has_value());
  std::printf("RESULT d_state_to_cpprun_exit_s %.2f s (D timeout 2 s, shutdown 1 s, reap 2 s)\n",
              exit_s);
  CHECK(exitCodeOf(*status) == 7);
  CHECK(exit_s < 2 + 1 + 1 + 2 + 4);
  // It is still there, in D: cpprun did not wait for it; rank 1 (killable) is gone.
  CHECK(agent::processState(rank0) == 'D');
  CHECK(allGone({rank1}, seconds(5)));
  // The report names it: pid, state, wait channel; and says it was not reaped.
  const std::string& out = run.output();
  CHECK(out.find("<not reaped> (pid: " + std::to_string(rank0) + ") state D") != std::string::npos);
  CHECK(out.find("still alive 2.0 s after SIGKILL") != std::string::npos);
  if (!wchan.empty() && wchan != "0") CHECK(out.find("wchan " + wchan) != std::string::npos);
  CHECK(out.find("attempt 1") == std::string::npos);
  const auto log = readEventLog(events);
  const auto unreaped = eventsNamed(log, "worker_unreaped");
  REQUIRE(unreaped.size() == 1);
  CHECK(unreaped[0]["pid"] == rank0);
  CHECK(unreaped[0]["process"]["state"] == "D");
  CHECK(unreaped[0]["process"]["wchan"].get<std::string>() == wchan);
  CHECK(unreaped[0]["seconds_after_sigkill"].get<double>() >= 1.9);
  const auto finished = eventsNamed(log, "job_finished");
  REQUIRE(finished.size() == 1);
  CHECK(finished[0]["outcome"] == "unreaped");
  CHECK(finished[0]["exit_code"] == 7);
  // Thawed, the pending SIGKILL ends it; then its job cgroup (if any) can go.
  freezer.thaw();
  CHECK(allGone({rank0}, seconds(10)));
  endWorkers({rank0, rank1});
  CHECK(job_cgroup.remove());
}

TEST_CASE(
    "uninterruptible sleep: without the D-state check, a worker frozen in D while another "
    "fails is given up on at the reap bound, exit 7, root cause the failed rank",
    "[integration]") {
  TempDir dir;
  LeftCgroup job_cgroup;
  FreezerGroup freezer;
  const std::string pid_prefix = dir.path() + "/pid";
  const std::string fail_now = dir.path() + "/fail-now";
  // Rank 1 exits 3 once the test says so; rank 0 sleeps (and is frozen by the test).
  std::vector<std::string> argv = {
      "--nproc-per-node=2",
      "--max-restarts=2",
      "--shutdown-timeout=1",
      "--reap-timeout=2",
      "--no-python",
      "/bin/sh",
      "-c",
      "read -r p rest < /proc/self/stat && echo \"$p\" > \"$0.$RANK.tmp\" && "
      "mv \"$0.$RANK.tmp\" \"$0.$RANK\" && if [ \"$RANK\" = 1 ]; then "
      "while [ ! -e \"$1\" ]; do sleep 0.05; done; exit 3; fi; exec sleep 1000",
      pid_prefix,
      fail_now};
  ChildProcess run(cpprunCommand(argv));
  const auto [rank0, rank1] = waitForBothRanks(pid_prefix);
  REQUIRE(freezer.freeze(rank0));
  job_cgroup.path = jobCgroupOf(rank0, run.pid());
  const auto failed_at = Clock::now();
  REQUIRE(writeFile(fail_now, ""));
  // SIGTERM grace 1 s, reap bound 2 s: about 3 s after rank 1's exit.
  auto status = run.wait(seconds(20));
  const double exit_s = secondsSince(failed_at);
  if (!status) run.readAvailable(milliseconds(200));
  INFO(run.output());
  REQUIRE(status.has_value());
  std::printf("RESULT teardown_failure_to_cpprun_exit_s %.2f s (shutdown 1 s, reap 2 s)\n", exit_s);
  CHECK(exitCodeOf(*status) == 7);
  CHECK(exit_s < 1 + 2 + 4);
  const std::string& out = run.output();
  const std::string root = out.substr(out.find("Root Cause"));
  CHECK(root.find("rank      : 1") != std::string::npos);
  CHECK(root.find("exitcode  : 3") != std::string::npos);
  CHECK(out.find("<not reaped> (pid: " + std::to_string(rank0) + ") state D") != std::string::npos);
  CHECK(out.find("(stopped by cpprun during teardown)") != std::string::npos);
  CHECK(agent::processState(rank0) == 'D');
  freezer.thaw();
  CHECK(allGone({rank0, rank1}, seconds(10)));
  CHECK(job_cgroup.remove());
}

// torchrun 2.15 on the teardown case: not a check of torchrun, a record of what it does.
TEST_CASE(
    "torch 2.x: torchrun with TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT and a worker "
    "stuck in D state (finding, bounded at 150 s)",
    "[integration][torch][slow]") {
  requireTorchPeer(torch2());
  const std::string python = torch2().python;
  const std::string torchrun = python.substr(0, python.rfind('/')) + "/torchrun";
  TempDir dir;
  FreezerGroup freezer;
  const std::string pid_prefix = dir.path() + "/pid";
  std::vector<std::string> argv = {torchrun,
                                   "--nproc-per-node=2",
                                   "--max-restarts=2",
                                   "--shutdown-timeout=1",
                                   "--monitor-interval=0.1",
                                   "--no-python"};
  for (const std::string& a : sleeperWorker(pid_prefix)) argv.push_back(a);
  ChildProcess run(argv, {{"TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT", "2"}});
  const pid_t rank0 = waitForPid(pid_prefix + ".0", seconds(60));
  const pid_t rank1 = waitForPid(pid_prefix + ".1", seconds(60));
  if (rank0 <= 0 || rank1 <= 0) run.readAvailable(milliseconds(500));
  INFO(run.output());
  REQUIRE(rank0 > 0);
  REQUIRE(rank1 > 0);
  REQUIRE(freezer.freeze(rank0));
  const auto entered_d = Clock::now();
  auto status = run.wait(seconds(150));
  const double exit_s = secondsSince(entered_d);
  const bool still_in_d = agent::processState(rank0) == 'D';
  if (!status) run.readAvailable(milliseconds(500));
  const std::string& out = run.output();
  const bool said_d = out.find("uninterruptible") != std::string::npos;
  const bool said_abandon = out.find("abandoning") != std::string::npos;
  if (status) {
    std::printf(
        "FINDING torchrun 2.15: exited %d %.1f s after the worker entered D; worker still in D: "
        "%s; logged the D state: %s; logged abandoning it: %s\n",
        exitCodeOf(*status), exit_s, still_in_d ? "yes" : "no", said_d ? "yes" : "no",
        said_abandon ? "yes" : "no");
  } else {
    std::printf("FINDING torchrun 2.15: still running %.1f s after the worker entered D; killed\n",
                exit_s);
  }
  std::printf("---- torchrun output ----\n%s---- end ----\n", out.c_str());
  // The mechanism held (the worker was really in D through torchrun's teardown).
  CHECK(still_in_d);
  run.signal(SIGKILL);
  freezer.thaw();
  endWorkers({rank0, rank1});
}

}  // namespace
}  // namespace cpprun::testing
