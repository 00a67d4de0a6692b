// store_auth_bench: what the job's secret costs on cpprun's TCP store (rendezvous/store_auth.h),
// the same server with and without a secret, same client, same run.
//
//   store_auth_bench [--connects N] [--ops N] [--runs R]
//
// Two figures, each the median of R runs alternating which server goes first:
//   connect: a TcpStoreClient's construction (TCP connect, VALIDATE + PING, and with the secret
//            the CPPRUN_AUTH hello + proof: one more round trip and three HMAC-SHA256) to an
//            in-process server, N times, median per connection.
//   request: N round trips of one client in the agents' mix (SET of a job key "cpprun/..." then
//            GET of it; with the secret the server checks every write's key against the
//            protected prefix), per request.
// Prints a table and RESULT lines: RESULT <name> <value> <unit> peer=<without secret> ratio=<x>.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "rendezvous/tcp_store_client.h"
#include "rendezvous/tcp_store_server.h"

namespace {

using namespace cpprun::rendezvous;
using Clock = std::chrono::steady_clock;

const std::string kSecret = "0123456789abcdef0123456789abcdef";

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

TcpStoreClientOptions clientOptions(uint16_t port, bool secret) {
  TcpStoreClientOptions o;
  o.port = port;
  o.timeout = std::chrono::seconds(10);
  o.connect_timeout = std::chrono::seconds(10);
  if (secret) o.secret = kSecret;
  return o;
}

// Median microseconds per connection over `n`.
double connectMicros(uint16_t port, bool secret, int n) {
  std::vector<double> each;
  for (int i = 0; i < n; ++i) {
    const auto t0 = Clock::now();
    TcpStoreClient c(clientOptions(port, secret));
    each.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  return median(each);
}

// Microseconds per request over `n` SET + GET pairs of a job key.
double requestMicros(uint16_t port, bool secret, int n) {
  TcpStoreClient c(clientOptions(port, secret));
  const Bytes value(64, 'x');
  const auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    const std::string key = "cpprun/job/attempt/0/report/" + std::to_string(i % 64);
    c.set(key, value);
    if (c.get(key).size() != value.size()) {
      std::fprintf(stderr, "store_auth_bench: a GET returned the wrong value\n");
      std::exit(1);
    }
  }
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / (2.0 * n);
}

}  // namespace

int main(int argc, char** argv) {
  int connects = 400, ops = 20000, runs = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> int {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "store_auth_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      const int v = std::atoi(argv[++i]);
      if (v <= 0) {
        std::fprintf(stderr, "store_auth_bench: %s needs a positive number\n", a.c_str());
        std::exit(2);
      }
      return v;
    };
    if (a == "--connects") {
      connects = next();
    } else if (a == "--ops") {
      ops = next();
    } else if (a == "--runs") {
      runs = next();
    } else {
      std::fprintf(stderr, "usage: store_auth_bench [--connects N] [--ops N] [--runs R]\n");
      return 2;
    }
  }
  TcpStoreServerOptions open_options;
  TcpStoreServerOptions secret_options;
  secret_options.secret = kSecret;
  auto open = BackgroundTcpStoreServer::start(open_options);
  auto guarded = BackgroundTcpStoreServer::start(secret_options);
  if (!open.isOk() || !guarded.isOk()) {
    std::fprintf(stderr, "store_auth_bench: cannot start the servers\n");
    return 1;
  }
  const uint16_t open_port = open.value()->port();
  const uint16_t guarded_port = guarded.value()->port();
  std::vector<double> c_open, c_auth, r_open, r_auth;
  for (int run = 0; run < runs; ++run) {
    const bool auth_first = run % 2 == 1;
    for (int k = 0; k < 2; ++k) {
      if ((k == 0) == auth_first) {
        c_auth.push_back(connectMicros(guarded_port, true, connects));
        r_auth.push_back(requestMicros(guarded_port, true, ops));
      } else {
        c_open.push_back(connectMicros(open_port, false, connects));
        r_open.push_back(requestMicros(open_port, false, ops));
      }
    }
  }
  const double co = median(c_open), ca = median(c_auth), ro = median(r_open), ra = median(r_auth);
  std::printf("store auth cost (%d runs, medians; %d connects, %d requests per run)\n", runs,
              connects, 2 * ops);
  std::printf("  %-32s %12s %12s %8s\n", "", "no secret", "secret", "ratio");
  std::printf("  %-32s %10.1f us %10.1f us %8.2f\n", "connect + handshake", co, ca, ca / co);
  std::printf("  %-32s %10.2f us %10.2f us %8.2f\n", "request (SET/GET of a job key)", ro, ra,
              ra / ro);
  std::printf("RESULT store_auth_connect %.1f us peer=%.1f ratio=%.2f\n", ca, co, ca / co);
  std::printf("RESULT store_auth_request %.2f us peer=%.2f ratio=%.2f\n", ra, ro, ra / ro);
  return 0;
}
