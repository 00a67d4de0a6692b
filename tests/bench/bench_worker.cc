// cpprun_bench_worker: the worker launch_bench starts under cpprun, under torch 1.13's elastic
// launcher and under torch 2.x's torchrun. It reads the torchrun environment (RANK, WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT) and talks to the launcher's store with
// TcpStoreClient in the dialect named by its optional third argument: "legacy" (the default; the
// one torch 1.13's TCPStore speaks) or "v2" (torch >= 2.2, which torchrun 2.x's libuv store
// requires). Our server speaks both.
//
//   cpprun_bench_worker MODE DIR [legacy|v2]
//
//   cpprun_bench_worker started DIR  write the start time to DIR/start.<rank>, exit 0 (the
//                                    trivial worker of rendezvous_bench)
//   cpprun_bench_worker launch DIR   connect to the store, set bench/launch/<rank>, exit 0
//   cpprun_bench_worker hold DIR     connect, add bench/hold/ready (the last one sets
//                                    bench/hold/all_ready), wait up to 60 s for
//                                    bench/hold/release, exit 0 (3 when it never came)
//   cpprun_bench_worker fail DIR     attempt 0: every rank but 1 opens DIR/term.<rank>, installs
//                                    a SIGTERM handler that writes CLOCK_MONOTONIC ns there and
//                                    dies by SIGTERM, sets bench/fail/ready/<rank> and blocks
//                                    (at most 60 s, then exits 4); rank 1 waits for rank 0's
//                                    key, writes its time to DIR/death and SIGKILLs itself.
//                                    Attempt >= 1: like launch. Every rank of every attempt first
//                                    writes its start time to DIR/start.<attempt>.<rank>.
//
// Times are CLOCK_MONOTONIC nanoseconds as decimal text (one host: comparable across processes).
// Exit status: 0 done, 1 store error, 2 bad usage or environment, 3/4 a bounded wait ran out.
#include <fcntl.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "rendezvous/store.h"
#include "rendezvous/tcp_store_client.h"
#include "rendezvous/wire.h"

namespace {

using cpprun::rendezvous::StoreTimeout;
using cpprun::rendezvous::TcpStoreClient;
using cpprun::rendezvous::TcpStoreClientOptions;
using cpprun::rendezvous::toBytes;
using namespace std::chrono_literals;

int g_term_fd = -1;

int64_t monotonicNs() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// Formats `v` (>= 0) as decimal plus '\n' into buf; returns the length. Async-signal-safe.
size_t formatNs(int64_t v, char* buf) {
  char tmp[24];
  size_t n = 0;
  do {
    tmp[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v > 0 && n < sizeof(tmp));
  for (size_t i = 0; i < n; ++i) buf[i] = tmp[n - 1 - i];
  buf[n] = '\n';
  return n + 1;
}

void writeAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t w = ::write(fd, data, size);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    data += w;
    size -= static_cast<size_t>(w);
  }
}

// Records the time, then dies by SIGTERM as a worker without a handler would.
void onSigterm(int) {
  int64_t now = monotonicNs();
  char buf[32];
  size_t n = formatNs(now, buf);
  writeAll(g_term_fd, buf, n);
  ::signal(SIGTERM, SIG_DFL);
  ::raise(SIGTERM);
}

bool writeTimeFile(const std::string& path, int64_t ns) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  char buf[32];
  writeAll(fd, buf, formatNs(ns, buf));
  ::close(fd);
  return true;
}

std::string envOr(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : fallback;
}

int envInt(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') {
    std::fprintf(stderr, "cpprun_bench_worker: %s is not set\n", name);
    std::exit(2);
  }
  return std::atoi(v);
}

// The dialect of every store connection (third argument; legacy unless "v2").
cpprun::rendezvous::wire::Dialect g_dialect = cpprun::rendezvous::wire::Dialect::kLegacy;

TcpStoreClientOptions storeOptions() {
  TcpStoreClientOptions o;
  o.host = envOr("MASTER_ADDR", "127.0.0.1");
  o.port = static_cast<uint16_t>(envInt("MASTER_PORT"));
  o.dialect = g_dialect;
  o.connect_timeout = 30s;
  o.timeout = 60s;
  return o;
}

int run(const std::string& mode, const std::string& dir, int64_t start_ns) {
  const int rank = envInt("RANK");
  const int world_size = envInt("WORLD_SIZE");
  const int attempt = envInt("TORCHELASTIC_RESTART_COUNT");
  const std::string r = std::to_string(rank);

  if (mode == "started") {
    writeTimeFile(dir + "/start." + r, start_ns);
    return 0;
  }

  if (mode == "launch" || (mode == "fail" && attempt > 0)) {
    if (mode == "fail") {
      writeTimeFile(dir + "/start." + std::to_string(attempt) + "." + r, start_ns);
    }
    TcpStoreClient store(storeOptions());
    store.set("bench/" + mode + "/" + std::to_string(attempt) + "/" + r, toBytes("1"));
    return 0;
  }

  if (mode == "hold") {
    TcpStoreClient store(storeOptions());
    if (store.add("bench/hold/ready", 1) == world_size) {
      store.set("bench/hold/all_ready", toBytes("1"));
    }
    try {
      store.wait({"bench/hold/release"}, 60s);
    } catch (const StoreTimeout&) {
      std::fprintf(stderr, "cpprun_bench_worker: rank %d: no release within 60 s\n", rank);
      return 3;
    }
    return 0;
  }

  if (mode == "fail") {
    writeTimeFile(dir + "/start.0." + r, start_ns);
    if (rank == 1) {
      TcpStoreClient store(storeOptions());
      store.wait({"bench/fail/ready/0"}, 60s);
      int64_t death = monotonicNs();
      writeTimeFile(dir + "/death", death);
      ::kill(::getpid(), SIGKILL);
      return 5;  // not reached
    }
    std::string term_path = dir + "/term." + r;
    g_term_fd = ::open(term_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (g_term_fd < 0) {
      std::fprintf(stderr, "cpprun_bench_worker: cannot create %s: %s\n", term_path.c_str(),
                   std::strerror(errno));
      return 2;
    }
    struct sigaction sa {};
    sa.sa_handler = onSigterm;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGTERM, &sa, nullptr);
    TcpStoreClient store(storeOptions());
    store.set("bench/fail/ready/" + r, toBytes("1"));
    // Block until the launcher's SIGTERM (bounded: a launcher that never sends it fails the run).
    timespec left{60, 0};
    while (::nanosleep(&left, &left) != 0 && errno == EINTR) {
    }
    std::fprintf(stderr, "cpprun_bench_worker: rank %d: no SIGTERM within 60 s\n", rank);
    return 4;
  }

  std::fprintf(stderr, "cpprun_bench_worker: unknown mode '%s'\n", mode.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t start_ns = monotonicNs();
  if (argc != 3 && argc != 4) {
    std::fprintf(stderr, "usage: cpprun_bench_worker started|launch|hold|fail DIR [legacy|v2]\n");
    return 2;
  }
  if (argc == 4) {
    const std::string dialect = argv[3];
    if (dialect == "v2") {
      g_dialect = cpprun::rendezvous::wire::Dialect::kV2;
    } else if (dialect != "legacy") {
      std::fprintf(stderr, "cpprun_bench_worker: unknown dialect '%s' (legacy or v2)\n",
                   dialect.c_str());
      return 2;
    }
  }
  try {
    return run(argv[1], argv[2], start_ns);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cpprun_bench_worker: %s\n", e.what());
    return 1;
  }
}
