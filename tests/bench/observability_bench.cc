// observability_bench: what cpprun's operations features cost the agent — its CPU time and peak
// RSS with --stall-timeout, --metrics-port (scraped every second) and --event-log on, against
// the same job with all of them off, in the same run.
//
//   observability_bench [--seconds S] [--nproc N] [--step-ms MS] [--runs R]
//
// The job: cpprun --no-python --nproc-per-node=N cpprun_test_worker progress-every K MS/1000,
// i.e. N workers that each report progress every MS milliseconds (a training step) for S
// seconds. Defaults: 8 workers, 60 s, 10 ms steps (800 progress writes per second in all), one
// run of each variant; variants alternate order between runs.
//
// Measured on the agent process (the guardian's child), from /proc, once a second while the
// job runs: CPU = time on a CPU (schedstat, every thread, nanoseconds) over the window from
// 2 s after start to the last sample, divided by that window (fraction of one core); RSS =
// VmHWM (peak) at the last sample.
// Prints a table (median per variant over the runs) and:
//   RESULT agent_cpu_on <percent of a core> % peer=<off> ratio=<on/off>
//   RESULT agent_cpu_overhead <on - off> %-of-a-core (target < 1)
//   RESULT agent_rss_on <MiB> MiB peer=<off> ratio=<on/off>
// Every wait is bounded: a job still running 30 s after it should have ended is killed (by
// PID, its process group) and the benchmark exits 1.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "agent/processes/process_launcher.h"
#include "common/command_line.h"
#include "tests/bench/bench_flags.h"
#include "tests/support/http_get.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  int seconds = 60;
  int nproc = 8;
  int step_ms = 10;
  int runs = 1;
};

struct Sample {
  double cpu_s = 0;  // on a CPU, every thread
  double rss_mib = 0;
  Clock::time_point at;
};

// CPU time from the scheduler (/proc/<pid>/task/*/schedstat, nanoseconds on a CPU, every
// thread): the 10 ms ticks of /proc/<pid>/stat are too coarse for an agent that is idle most
// of the time. Peak RSS from /proc/<pid>/status.
std::optional<Sample> sampleProcess(pid_t pid) {
  const std::string proc = "/proc/" + std::to_string(pid);
  std::error_code ec;
  Sample s;
  bool any = false;
  for (const auto& task : std::filesystem::directory_iterator(proc + "/task", ec)) {
    std::ifstream stat(task.path() / "schedstat");
    unsigned long long ns = 0;
    if (stat >> ns) {
      s.cpu_s += static_cast<double>(ns) / 1e9;
      any = true;
    }
  }
  if (ec || !any) return std::nullopt;
  std::ifstream status(proc + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) s.rss_mib = std::stod(line.substr(6)) / 1024.0;
  }
  s.at = Clock::now();
  return s;
}

// One GET /metrics, to load the endpoint as a Prometheus scrape would.
bool scrape(int port) {
  const auto response = cpprun::testing::httpGetRaw(port, "/metrics", std::chrono::seconds(2));
  return response && !response->empty();
}

// The port from the event log's metrics_listening line, once it is there.
std::optional<int> metricsPort(const std::string& events) {
  std::ifstream in(events);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find("\"metrics_listening\"") == std::string::npos) continue;
    const size_t at = line.find("\"port\":");
    if (at != std::string::npos) return std::atoi(line.c_str() + at + 7);
  }
  return std::nullopt;
}

struct RunResult {
  double cpu_percent = 0;
  double rss_mib = 0;
  int scrapes = 0;
  bool ok = false;
};

RunResult runJob(const Options& o, bool on, const std::string& dir) {
  const int steps = o.seconds * 1000 / o.step_ms;
  char step_s[32];
  std::snprintf(step_s, sizeof step_s, "%.3f", o.step_ms / 1000.0);
  const std::string events = dir + "/events.jsonl";
  std::vector<std::string> argv = {CPPRUN_BINARY, "--no-python",
                                   "--nproc-per-node=" + std::to_string(o.nproc),
                                   "--log-dir=" + dir};
  if (on) {
    argv.insert(argv.end(), {"--stall-timeout=30", "--metrics-port=0", "--event-log=" + events});
  }
  argv.insert(argv.end(), {CPPRUN_TEST_WORKER, "progress-every", std::to_string(steps), step_s});
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    const int null = ::open("/dev/null", O_RDWR);
    ::dup2(null, 1);
    ::dup2(null, 2);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  RunResult result;
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::seconds(o.seconds + 30);
  std::optional<Sample> first;
  std::optional<Sample> last;
  pid_t agent = -1;
  int status = 0;
  while (true) {
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (Clock::now() > deadline) {
      ::kill(-pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      std::fprintf(stderr, "observability_bench: the job did not end in time; killed\n");
      return result;
    }
    if (agent < 0) {
      auto children = cpprun::agent::childrenOf(pid);
      if (!children.empty()) agent = children.front();
    }
    if (agent > 0) {
      auto s = sampleProcess(agent);
      if (s && s->at - start >= std::chrono::seconds(2)) {
        if (!first) first = s;
        last = s;
      }
    }
    if (on) {
      if (auto port = metricsPort(events)) result.scrapes += scrape(*port) ? 1 : 0;
    }
    std::this_thread::sleep_for(std::chrono::seconds(1));  // the sampling period, not a sync
  }
  result.ok =
      WIFEXITED(status) && WEXITSTATUS(status) == 0 && first && last && last->at > first->at;
  if (result.ok) {
    const double window = std::chrono::duration<double>(last->at - first->at).count();
    result.cpu_percent = 100.0 * (last->cpu_s - first->cpu_s) / window;
    result.rss_mib = last->rss_mib;
  }
  return result;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "observability_bench: %s\nusage: observability_bench [--seconds S] [--nproc N] "
               "[--step-ms MS] [--runs R]\n",
               why.c_str());
  std::exit(2);
}

int unsignedValue(const std::string& flag, const std::string& text, uint64_t min, uint64_t max) {
  return cpprun::bench::unsignedFlag(usage, flag, text, min, max);
}

Options parse(int argc, char** argv) {
  Options o;
  cpprun::OptionCursor args(argc, argv);
  while (args.next()) {
    const std::string flag = args.name();
    if (!args.isOption()) usage("unexpected argument " + flag);
    cpprun::Result<std::string> value = args.value();
    if (!value.isOk()) usage(value.status().message());
    const std::string& v = value.value();
    if (flag == "--seconds") {
      o.seconds = unsignedValue(flag, v, 5, 86'400);
    } else if (flag == "--nproc") {
      o.nproc = unsignedValue(flag, v, 1, 1024);
    } else if (flag == "--step-ms") {
      o.step_ms = unsignedValue(flag, v, 1, 3'600'000);
    } else if (flag == "--runs") {
      o.runs = unsignedValue(flag, v, 1, 1000);
    } else {
      usage("unknown flag " + flag);
    }
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  std::vector<double> cpu[2], rss[2];
  int scrapes = 0;
  for (int r = 0; r < o.runs; ++r) {
    for (int k = 0; k < 2; ++k) {
      const bool on = (k + r) % 2 == 1 ? false : true;
      const std::string dir = std::filesystem::temp_directory_path() /
                              ("cpprun-obs-bench-" + std::to_string(::getpid()));
      std::filesystem::create_directories(dir);
      RunResult res = runJob(o, on, dir);
      std::filesystem::remove_all(dir);
      if (!res.ok) {
        std::fprintf(stderr, "observability_bench: run %d (%s) failed\n", r, on ? "on" : "off");
        return 1;
      }
      std::printf("run %d %-3s agent CPU %.3f %% of a core, peak RSS %.1f MiB%s\n", r,
                  on ? "on" : "off", res.cpu_percent, res.rss_mib,
                  on ? (", " + std::to_string(res.scrapes) + " scrapes").c_str() : "");
      std::fflush(stdout);
      cpu[on ? 1 : 0].push_back(res.cpu_percent);
      rss[on ? 1 : 0].push_back(res.rss_mib);
      scrapes += res.scrapes;
    }
  }
  const double cpu_off = median(cpu[0]), cpu_on = median(cpu[1]);
  const double rss_off = median(rss[0]), rss_on = median(rss[1]);
  std::printf("\n%d workers, progress every %d ms, %d s, %d run(s) per variant (medians)\n",
              o.nproc, o.step_ms, o.seconds, o.runs);
  std::printf("%-34s %12s %12s\n", "", "off", "on");
  std::printf("%-34s %12.3f %12.3f\n", "agent CPU (% of one core)", cpu_off, cpu_on);
  std::printf("%-34s %12.1f %12.1f\n", "agent peak RSS (MiB)", rss_off, rss_on);
  std::printf("RESULT agent_cpu_on %.3f %% peer=%.3f ratio=%.2f\n", cpu_on, cpu_off,
              cpu_off > 0 ? cpu_on / cpu_off : 0.0);
  std::printf("RESULT agent_cpu_overhead %.3f %%-of-a-core (target < 1)\n", cpu_on - cpu_off);
  std::printf("RESULT agent_rss_on %.1f MiB peer=%.1f ratio=%.2f\n", rss_on, rss_off,
              rss_off > 0 ? rss_on / rss_off : 0.0);
  return 0;
}
