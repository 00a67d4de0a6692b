// http_flood_bench: the store's round-trip time while /status is flooded, for this build's
// cpprun and, with --peer PATH, another cpprun binary (a build of an earlier commit), in the
// same run. Issue 22's probe found the store's p99 went from 0.95 to 4.1 ms under a full-rate
// /status loop when HTTP shared the agent's event loop.
//
//   http_flood_bench [--peer CPPRUN] [--clients C] [--round-trips M] [--runs R] [--nproc N]
//
// Per binary and run: `cpprun --no-python --nproc-per-node=N --metrics-port=0 --event-log=E
// cpprun_test_worker wait-file GO 300`. The bench reads the store's address from /status, makes
// M store GETs alone, then M more while C clients send GET /status over keep-alive connections
// as fast as they are answered; then it creates GO and waits for the job. Defaults: 4 workers,
// 4 clients, 2000 round trips, 3 runs per binary, binaries alternating.
// Prints per run p50/p99 of each phase and the /status answers per second, then the medians
// over the runs and:
//   RESULT store_p99_flood <ms> ms peer=<peer's> ratio=<ours/peer>
//   RESULT store_p50_flood <ms> ms peer=... ratio=...
//   RESULT store_p99_alone <ms> ms peer=... ratio=...
//   RESULT status_answers_per_s <n> 1/s peer=... ratio=...
// Every wait is bounded: a job that does not end 30 s after GO is killed (its process group,
// by PID) and the benchmark exits 1.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/command_line.h"
#include "common/network_address.h"
#include "rendezvous/tcp_store_client.h"
#include "tests/bench/bench_flags.h"
#include "tests/support/http_get.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

struct Options {
  std::string peer;
  int clients = 4;
  int round_trips = 2000;
  int runs = 3;
  int nproc = 4;
};

struct RunResult {
  double alone_p50 = 0, alone_p99 = 0, flood_p50 = 0, flood_p99 = 0, answers_per_s = 0;
  bool ok = false;
};

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

double median(std::vector<double> v) { return percentile(std::move(v), 0.5); }

// GET `target` over one keep-alive connection after another until `stop`; counts answers.
void hammer(int port, const std::string& target, const std::atomic<bool>& stop,
            std::atomic<uint64_t>& answers) {
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
    auto readUntil = [&](size_t size) {
      while (pending.size() < size) {
        char buf[16384];
        const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) return false;
        pending.append(buf, static_cast<size_t>(n));
      }
      return true;
    };
    while (!stop) {
      if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
          static_cast<ssize_t>(request.size())) {
        break;
      }
      size_t end;
      bool open = true;
      while (open && (end = pending.find("\r\n\r\n")) == std::string::npos) {
        open = readUntil(pending.size() + 1);
      }
      if (!open) break;
      const size_t at = pending.find("Content-Length: ");
      const size_t length = at < end ? std::stoul(pending.substr(at + 16)) : 0;
      if (!readUntil(end + 4 + length)) break;
      pending.erase(0, end + 4 + length);
      ++answers;
    }
    ::close(fd);
  }
}

std::optional<int> metricsPort(const std::string& events) {
  std::ifstream in(events);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find("\"metrics_listening\"") == std::string::npos) continue;
    return nlohmann::json::parse(line).at("port").get<int>();
  }
  return std::nullopt;
}

RunResult runJob(const Options& o, const std::string& cpprun, const std::string& dir) {
  RunResult result;
  const std::string events = dir + "/events.jsonl", go = dir + "/go";
  std::vector<std::string> argv = {cpprun,
                                   "--no-python",
                                   "--nproc-per-node=" + std::to_string(o.nproc),
                                   "--metrics-port=0",
                                   "--event-log=" + events,
                                   CPPRUN_TEST_WORKER,
                                   "wait-file",
                                   go,
                                   "300"};
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
  auto fail = [&](const char* why) {
    std::fprintf(stderr, "http_flood_bench: %s: %s\n", cpprun.c_str(), why);
    ::kill(-pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    return result;
  };
  // The metrics port, then the store's address from /status once the workers run.
  std::optional<int> port;
  std::string store_endpoint;
  for (auto deadline = Clock::now() + 30s; Clock::now() < deadline && store_endpoint.empty();) {
    if (!port) port = metricsPort(events);
    if (port) {
      auto raw = cpprun::testing::httpGetRaw(*port, "/status", 2s);
      const size_t split = raw ? raw->find("\r\n\r\n") : std::string::npos;
      if (split != std::string::npos) {
        auto j = nlohmann::json::parse(raw->substr(split + 4), nullptr, false);
        if (!j.is_discarded() && j.value("state", "") == "running") {
          store_endpoint = j.value("store_endpoint", "");
        }
      }
    }
    if (store_endpoint.empty()) std::this_thread::sleep_for(20ms);  // a poll of the job's start
  }
  if (store_endpoint.empty()) return fail("the job did not start in 30 s");
  auto store_address = cpprun::parseNetworkAddress(store_endpoint);
  if (!store_address.isOk()) {
    return fail(("/status store_endpoint " + store_address.status().message()).c_str());
  }
  cpprun::rendezvous::TcpStoreClientOptions co;
  co.host = store_address.value().host;
  co.port = static_cast<uint16_t>(store_address.value().port);
  co.connect_timeout = 10s;
  co.timeout = 10s;
  std::vector<double> alone, flooded;
  std::atomic<uint64_t> answers{0};
  double flood_s = 0;
  try {
    cpprun::rendezvous::TcpStoreClient store(co);
    store.set("bench", std::string("v"));
    auto roundTrips = [&](std::vector<double>& ms) {
      for (int i = 0; i < o.round_trips; ++i) {
        const auto t0 = Clock::now();
        store.get("bench");
        ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      }
    };
    roundTrips(alone);
    std::atomic<bool> stop{false};
    std::vector<std::thread> flood;
    for (int i = 0; i < o.clients; ++i) {
      flood.emplace_back([&] { hammer(*port, "/status", stop, answers); });
    }
    while (answers < static_cast<uint64_t>(10 * o.clients)) std::this_thread::yield();
    const uint64_t answers_before = answers;
    const auto t0 = Clock::now();
    roundTrips(flooded);
    flood_s = std::chrono::duration<double>(Clock::now() - t0).count();
    answers -= answers_before;
    stop = true;
    for (auto& t : flood) t.join();
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  std::ofstream(go).put('\n');
  int status = 0;
  for (auto deadline = Clock::now() + 30s; ::waitpid(pid, &status, WNOHANG) != pid;) {
    if (Clock::now() > deadline) return fail("the job did not end 30 s after GO");
    std::this_thread::sleep_for(10ms);  // a poll of the job's end
  }
  result.ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  result.alone_p50 = percentile(alone, 0.5);
  result.alone_p99 = percentile(alone, 0.99);
  result.flood_p50 = percentile(flooded, 0.5);
  result.flood_p99 = percentile(flooded, 0.99);
  result.answers_per_s = flood_s > 0 ? static_cast<double>(answers) / flood_s : 0;
  return result;
}

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "http_flood_bench: %s\nusage: http_flood_bench [--peer CPPRUN] [--clients C] "
               "[--round-trips M] [--runs R] [--nproc N]\n",
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
    if (flag == "--peer") {
      o.peer = v;
    } else if (flag == "--clients") {
      o.clients = unsignedValue(flag, v, 1, 100'000);
    } else if (flag == "--round-trips") {
      o.round_trips = unsignedValue(flag, v, 100, 100'000'000);
    } else if (flag == "--runs") {
      o.runs = unsignedValue(flag, v, 1, 1000);
    } else if (flag == "--nproc") {
      o.nproc = unsignedValue(flag, v, 1, 1024);
    } else {
      usage("unknown flag " + flag);
    }
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  std::vector<std::string> binaries = {CPPRUN_BINARY};
  if (!o.peer.empty()) binaries.push_back(o.peer);
  std::vector<std::vector<RunResult>> results(binaries.size());
  for (int r = 0; r < o.runs; ++r) {
    for (size_t k = 0; k < binaries.size(); ++k) {
      const size_t b = (k + static_cast<size_t>(r)) % binaries.size();  // alternate the order
      const std::string dir = std::filesystem::temp_directory_path() /
                              ("cpprun-http-flood-" + std::to_string(::getpid()));
      std::filesystem::create_directories(dir);
      RunResult res = runJob(o, binaries[b], dir);
      std::filesystem::remove_all(dir);
      if (!res.ok) return 1;
      std::printf(
          "run %d %-5s store p50/p99 alone %.3f/%.3f ms, under the flood %.3f/%.3f ms, "
          "%.0f /status answers/s\n",
          r, b == 0 ? "ours" : "peer", res.alone_p50, res.alone_p99, res.flood_p50, res.flood_p99,
          res.answers_per_s);
      std::fflush(stdout);
      results[b].push_back(res);
    }
  }
  auto med = [&](size_t b, double RunResult::*field) {
    std::vector<double> v;
    for (const auto& r : results[b]) v.push_back(r.*field);
    return median(v);
  };
  std::printf("\n%d workers, %d /status clients, %d store GETs per phase, %d run(s) (medians)\n",
              o.nproc, o.clients, o.round_trips, o.runs);
  std::printf("%-32s %12s %12s\n", "", "ours", o.peer.empty() ? "" : "peer");
  struct Row {
    const char* name;
    const char* result;
    const char* unit;
    double RunResult::*field;
  };
  const Row rows[] = {
      {"store p50 alone (ms)", "store_p50_alone", "ms", &RunResult::alone_p50},
      {"store p99 alone (ms)", "store_p99_alone", "ms", &RunResult::alone_p99},
      {"store p50 under flood (ms)", "store_p50_flood", "ms", &RunResult::flood_p50},
      {"store p99 under flood (ms)", "store_p99_flood", "ms", &RunResult::flood_p99},
      {"/status answers per s", "status_answers_per_s", "1/s", &RunResult::answers_per_s}};
  for (const Row& row : rows) {
    if (binaries.size() > 1) {
      std::printf("%-32s %12.3f %12.3f\n", row.name, med(0, row.field), med(1, row.field));
    } else {
      std::printf("%-32s %12.3f\n", row.name, med(0, row.field));
    }
  }
  for (const Row& row : rows) {
    const double ours = med(0, row.field);
    if (binaries.size() > 1) {
      const double peer = med(1, row.field);
      std::printf("RESULT %s %.3f %s peer=%.3f ratio=%.2f\n", row.result, ours, row.unit, peer,
                  peer > 0 ? ours / peer : 0.0);
    } else {
      std::printf("RESULT %s %.3f %s\n", row.result, ours, row.unit);
    }
  }
  return 0;
}
