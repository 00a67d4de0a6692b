// The store server with many connections (issue 26): what an idle connection costs, and a
// connect burst answered in full. Raw sockets speak the torch >= 2.2 handshake (VALIDATE, PING).
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "rendezvous/tcp_listen.h"
#include "rendezvous/tcp_store_server.h"

namespace {

using namespace cpprun::rendezvous;

// Raises the soft descriptor limit to the hard one; false when `needed` still do not fit.
bool descriptorsFor(size_t needed) {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return false;
  lim.rlim_cur = lim.rlim_max;
  setrlimit(RLIMIT_NOFILE, &lim);
  getrlimit(RLIMIT_NOFILE, &lim);
  return lim.rlim_cur == RLIM_INFINITY || lim.rlim_cur >= needed + 64;
}

long rssKib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

// VALIDATE (type 0, magic 0x3C85F7CE) then PING (type 13) with `nonce`: 10 bytes.
std::vector<uint8_t> handshake(uint32_t nonce) {
  std::vector<uint8_t> b{0, 0xCE, 0xF7, 0x85, 0x3C, 13};
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(nonce >> (8 * i)));
  return b;
}

// A non-blocking connect to 127.0.0.1:port; -1 on failure.
int startConnect(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 && errno != EINPROGRESS) {
    close(fd);
    return -1;
  }
  return fd;
}

// One raw client of handshakeAll.
struct RawClient {
  int stage = 0;  // 0: connecting, 1: handshake sent, 2: nonce read back
  std::array<uint8_t, 4> reply{};
  size_t got = 0;
};

// Sends the handshake once connected, or reads the reply; false on a failure.
bool step(int fd, uint32_t nonce, RawClient* c) {
  if (c->stage == 0) {
    auto bytes = handshake(nonce);
    if (send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) != 10) return false;
    c->stage = 1;
    return true;
  }
  ssize_t n = recv(fd, c->reply.data() + c->got, c->reply.size() - c->got, 0);
  if (n <= 0) return false;
  c->got += static_cast<size_t>(n);
  if (c->got < c->reply.size()) return true;
  uint32_t echoed = 0;
  std::memcpy(&echoed, c->reply.data(), 4);
  c->stage = 2;
  return echoed == nonce;
}

// Drives every socket through connect, handshake and the PING reply, all at once (a burst).
// Returns how many got their nonce back before `deadline`.
size_t handshakeAll(const std::vector<int>& fds, std::chrono::steady_clock::time_point deadline) {
  std::vector<RawClient> clients(fds.size());
  size_t answered = 0;
  std::vector<pollfd> pfds;
  std::vector<size_t> which;
  while (answered < fds.size() && std::chrono::steady_clock::now() < deadline) {
    pfds.clear();
    which.clear();
    for (size_t i = 0; i < fds.size(); ++i) {
      if (clients[i].stage == 2) continue;
      short events = clients[i].stage == 0 ? POLLOUT : POLLIN;
      pfds.push_back(pollfd{fds[i], events, 0});
      which.push_back(i);
    }
    if (poll(pfds.data(), pfds.size(), 100) <= 0) continue;
    for (size_t k = 0; k < pfds.size(); ++k) {
      if (pfds[k].revents == 0) continue;
      size_t i = which[k];
      if (!step(fds[i], static_cast<uint32_t>(i), &clients[i])) return answered;
      if (clients[i].stage == 2) ++answered;
    }
  }
  return answered;
}

// How much resident memory a byte of the program's own costs: ThreadSanitizer's shadow and
// metadata multiply it (an idle connection measured 6.1 KiB under TSan against 0.95 KiB
// without); ASan's 1/8 shadow stays inside the bound. Under TSan the bound is 6 times larger,
// as the measure is: the old 4 KiB read buffer per connection (5 KiB in all) fails either bound.
#if defined(__SANITIZE_THREAD__)
constexpr double kResidentPerByte = 6.0;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
constexpr double kResidentPerByte = 6.0;
#else
constexpr double kResidentPerByte = 1.0;
#endif
#else
constexpr double kResidentPerByte = 1.0;
#endif

}  // namespace

TEST_CASE("an idle connection costs the store server under 2 KiB", "[integration]") {
  // Before issue 26 every connection held a 4 KiB read buffer (about 5 KiB in all); the read
  // buffer is now one per loop. Measured in this process: the server's memory and the test's
  // few bytes per socket (the sockets themselves are kernel memory, outside RSS).
  constexpr size_t kConnections = 2000;
  if (!descriptorsFor(4 * kConnections)) {
    WARN("SKIPPED: needs 8,064 file descriptors");
    return;
  }
  auto server = BackgroundTcpStoreServer::start({});
  REQUIRE(server.isOk());
  // A first batch grows the server's tables (and the allocator's arenas); the second batch,
  // measured, then adds only what a connection itself holds.
  std::vector<int> fds;
  double per_connection_kib = 0;
  for (int batch = 0; batch < 2; ++batch) {
    long before = rssKib();
    std::vector<int> batch_fds;
    for (size_t i = 0; i < kConnections; ++i) {
      batch_fds.push_back(startConnect(server.value()->port()));
    }
    REQUIRE(std::count(batch_fds.begin(), batch_fds.end(), -1) == 0);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    REQUIRE(handshakeAll(batch_fds, deadline) == kConnections);
    REQUIRE(server.value()->stats().connections_open == (batch + 1) * kConnections);
    per_connection_kib = static_cast<double>(rssKib() - before) / kConnections;
    fds.insert(fds.end(), batch_fds.begin(), batch_fds.end());
  }
  INFO(per_connection_kib << " KiB per idle connection");
  CHECK(per_connection_kib < 2.0 * kResidentPerByte);
  for (int fd : fds) close(fd);
}

TEST_CASE("a connect burst larger than the accept queue is served in full", "[integration]") {
  // Every client calls connect() before any is answered, so the accept queue fills; the server
  // empties it in one go per wake-up, and every client gets its PING answered.
  int backlog = listenBacklog();
  CHECK(backlog > 0);
  const size_t clients = std::min<size_t>(static_cast<size_t>(backlog) + 1000, 6000);
  if (!descriptorsFor(2 * clients)) {
    WARN("SKIPPED: needs " << 2 * clients + 64 << " file descriptors");
    return;
  }
  // Unknown (one listening socket), then told to expect them: several sockets sharing the
  // port (SO_REUSEPORT), each with a queue of its own.
  for (size_t expected : {size_t{0}, clients}) {
    INFO(expected << " clients expected");
    TcpStoreServerOptions options;
    options.expected_clients = expected;
    auto server = BackgroundTcpStoreServer::start(options);
    REQUIRE(server.isOk());
    CHECK(server.value()->stats().listen_sockets == listenersFor(expected, backlog));
    std::vector<int> fds;
    for (size_t i = 0; i < clients; ++i) fds.push_back(startConnect(server.value()->port()));
    REQUIRE(std::count(fds.begin(), fds.end(), -1) == 0);
    // SYN retries after an overflow come at 1 s, 3 s, 7 s, 15 s: 60 s covers four of them.
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    CHECK(handshakeAll(fds, deadline) == clients);
    auto stats = server.value()->stats();
    CHECK(stats.connections_accepted == clients);
    CHECK(stats.connections_open == clients);
    for (int fd : fds) close(fd);
  }
}
