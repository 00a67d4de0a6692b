// store_scale_clients: N ranks bootstrapping against one TCPStore server, as torch 2.15's
// init_process_group("gloo", "env://") does with TORCHELASTIC_USE_AGENT_STORE=True — the
// driver of tests/bench/store_scale_bench.py (issue 26).
//
//   store_scale_clients --port P --ranks N [--mode paced|burst] [--window W] [--sources K]
//                       [--timeout-s T] [--script bootstrap|connect]
//
// One thread drives every rank over non-blocking sockets and epoll. Each rank sends exactly the
// requests of the torch 2.15 transcript (tests/rendezvous/data/torch-2.15.json, scenario
// init_process_group_env_agent_store_both_ranks), one send() per request as torch's client
// does, and waits for each reply before the next request:
//   VALIDATE, PING                          (TCPStore's handshake)
//   ADD init/ 1                             (the store object made with the world size)
//   SET /default_pg/0//cpu//0/<rank>        (gloo's address, 170 bytes)
//   per peer: WAIT, WAIT, GET of its key    (gloo's full mesh, cut to the two ring neighbours:
//                                            N-1 peers would be N^2 requests, 268 M at 16 k)
//   ADD  /default_pg/store_based_barrier_key:0 1, ADD ... 0, SET ...:last_worker if the count is
//   N, WAIT ...:last_worker                 (torch's _store_based_barrier: the one barrier)
// and then stays connected, as a rank does. --script connect stops after the handshake (N idle
// connections, for the memory an idle connection costs).
//
// Connections come from 127.0.1.1, 127.0.1.2, ... (--sources, default one per 1,024 ranks;
// IP_BIND_ADDRESS_NO_PORT) so that ephemeral ports never run out. --mode burst calls connect()
// for every rank at once; --mode paced keeps at most --window (default 512, under the usual
// net.core.somaxconn of 4,096) ranks between connect() and their PING reply.
//
// Prints "DONE wall_s=<s> connected_s=<s> done=<n> ranks=<N> connect_retries=<r>
// connect_over_1s=<a> connect_over_3s=<b> connect_over_7s=<c>" (connects that waited on SYN
// retransmissions) once every
// rank finished its barrier (or --timeout-s passed: done < N), then keeps every connection open
// until stdin closes, so the caller can measure the server with N idle connections. Exit 0 when
// every rank finished, 1 otherwise, 2 on a bad flag.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/command_line.h"
#include "tests/bench/bench_flags.h"

namespace {

using cpprun::OptionCursor;
using cpprun::parseUnsigned;
using cpprun::Result;

using Clock = std::chrono::steady_clock;
using Bytes = std::vector<uint8_t>;

// torch >= 2.2 numbering (wire.h's QueryType, V2).
constexpr uint8_t kValidate = 0, kSet = 1, kGet = 3, kAdd = 4, kWait = 6, kPing = 13;
constexpr uint32_t kMagic = 0x3C85F7CE;

struct Options {
  uint16_t port = 0;
  int ranks = 0;
  bool burst = false;
  int window = 512;
  int sources = 0;
  double timeout_s = 120;
  bool connect_only = false;  // --script connect: the handshake only (idle connections)
};

void putU64(Bytes* b, uint64_t v) {
  for (int i = 0; i < 8; ++i) b->push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void putStr(Bytes* b, const std::string& s) {
  putU64(b, s.size());
  b->insert(b->end(), s.begin(), s.end());
}
Bytes request(uint8_t type) { return Bytes{type}; }

std::string gloAddressKey(int rank) { return "/default_pg/0//cpu//0/" + std::to_string(rank); }
const std::string kBarrierKey = "/default_pg/store_based_barrier_key:0";
const std::string kLastWorkerKey = kBarrierKey + ":last_worker";

// What a step waits for after sending its requests.
enum class Reply : uint8_t { kNone, kFixed, kValue };

struct Step {
  std::vector<Bytes> requests;  // each sent with its own send(), in order
  Reply reply = Reply::kNone;
  size_t fixed = 0;  // bytes of a kFixed reply
};

Step fixedStep(std::vector<Bytes> requests, size_t reply_bytes) {
  return Step{std::move(requests), Reply::kFixed, reply_bytes};
}

Bytes addRequest(const std::string& key, int64_t delta) {
  Bytes b = request(kAdd);
  putStr(&b, key);
  putU64(&b, static_cast<uint64_t>(delta));
  return b;
}
Bytes setRequest(const std::string& key, const std::string& value) {
  Bytes b = request(kSet);
  putStr(&b, key);
  putStr(&b, value);
  return b;
}
Bytes waitRequest(const std::string& key) {
  Bytes b = request(kWait);
  putU64(&b, 1);
  putStr(&b, key);
  return b;
}
Bytes getRequest(const std::string& key) {
  Bytes b = request(kGet);
  putStr(&b, key);
  return b;
}

// The steps of one rank up to the barrier's count (the barrier's end depends on the count).
std::vector<Step> bootstrapSteps(int rank, int ranks, bool connect_only) {
  std::vector<Step> steps;
  Bytes validate = request(kValidate);
  for (int i = 0; i < 4; ++i) validate.push_back(static_cast<uint8_t>(kMagic >> (8 * i)));
  Bytes ping = request(kPing);
  uint32_t nonce = static_cast<uint32_t>(rank) + 1000;
  for (int i = 0; i < 4; ++i) ping.push_back(static_cast<uint8_t>(nonce >> (8 * i)));
  steps.push_back(fixedStep({validate, ping}, 4));
  if (connect_only) return steps;
  steps.push_back(fixedStep({addRequest("init/", 1)}, 8));
  std::string address(170, 'a');  // gloo's serialized address is 170 bytes
  address.replace(0, std::to_string(rank).size(), std::to_string(rank));
  steps.push_back(Step{{setRequest(gloAddressKey(rank), address)}, Reply::kNone, 0});
  for (int peer : {(rank + 1) % ranks, (rank + ranks - 1) % ranks}) {
    steps.push_back(fixedStep({waitRequest(gloAddressKey(peer))}, 1));
    steps.push_back(fixedStep({waitRequest(gloAddressKey(peer))}, 1));
    steps.push_back(Step{{getRequest(gloAddressKey(peer))}, Reply::kValue, 0});
  }
  steps.push_back(fixedStep({addRequest(kBarrierKey, 1)}, 8));
  steps.push_back(fixedStep({addRequest(kBarrierKey, 0)}, 8));
  return steps;
}

struct Rank {
  int fd = -1;
  int index = 0;
  bool connecting = false;
  bool connected = false;  // PING answered
  bool done = false;
  bool barrier_tail = false;  // the last WAIT was added
  Clock::time_point connect_start;
  size_t step = 0;
  std::vector<Step> steps;
  Bytes in;  // reply bytes of the current step
};

class Driver {
 public:
  explicit Driver(Options opt) : opt_(opt), ranks_(static_cast<size_t>(opt.ranks)) {}
  int run();

 private:
  bool startConnect(Rank* r);
  void onEvent(Rank* r, uint32_t events);
  void sendStep(Rank* r);
  bool replyComplete(Rank* r, int64_t* number);
  void finishStep(Rank* r);
  void fail(Rank* r, const char* what);
  void startMore();
  void countConnectTime(const Rank* r);
  double elapsed() const { return std::chrono::duration<double>(Clock::now() - t0_).count(); }

  Options opt_;
  std::vector<Rank> ranks_;
  int epfd_ = -1;
  int next_ = 0;        // next rank to connect
  int in_connect_ = 0;  // between connect() and the PING reply
  int done_ = 0;
  int connected_ = 0;
  uint64_t retries_ = 0;
  // Connects that took over 0.9 s, 2.9 s, 6.9 s: their SYN was dropped (an accept queue
  // overflow) and retransmitted after 1 s, then 3 s, then 7 s. Counted here because the
  // kernel's ListenOverflows counter is not kept everywhere (gVisor keeps none).
  uint64_t syn_retried_[3] = {0, 0, 0};
  double connected_s_ = 0;
  Clock::time_point t0_;
};

bool Driver::startConnect(Rank* r) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    std::fprintf(stderr, "socket: %s\n", std::strerror(errno));
    return false;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one));
  sockaddr_in src{};
  src.sin_family = AF_INET;
  int source = r->index % opt_.sources;
  src.sin_addr.s_addr = htonl((127u << 24) | (1u << 8) | static_cast<uint32_t>(1 + source));
  if (bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof(src)) != 0) {
    std::fprintf(stderr, "bind: %s\n", std::strerror(errno));
    close(fd);
    return false;
  }
  sockaddr_in dst{};
  dst.sin_family = AF_INET;
  dst.sin_port = htons(opt_.port);
  dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&dst), sizeof(dst)) != 0 && errno != EINPROGRESS) {
    std::fprintf(stderr, "connect: %s\n", std::strerror(errno));
    close(fd);
    return false;
  }
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLOUT | EPOLLET;
  ev.data.ptr = r;
  epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev);
  r->fd = fd;
  r->connecting = true;
  r->connect_start = Clock::now();
  r->step = 0;
  r->in.clear();
  return true;
}

void Driver::fail(Rank* r, const char* what) {
  // A reset or refused connection is retried from the start, as torch's client reconnects.
  ++retries_;
  if (retries_ <= 5) std::fprintf(stderr, "rank %d: %s; reconnecting\n", r->index, what);
  close(r->fd);
  r->fd = -1;
  if (!startConnect(r)) std::exit(1);
}

void Driver::sendStep(Rank* r) {
  for (const Bytes& req : r->steps[r->step].requests) {
    ssize_t n = send(r->fd, req.data(), req.size(), MSG_NOSIGNAL);
    if (n != static_cast<ssize_t>(req.size())) {  // small requests: the socket takes them whole
      fail(r, n < 0 ? std::strerror(errno) : "short send");
      return;
    }
  }
  if (r->steps[r->step].reply == Reply::kNone) finishStep(r);
}

// Whether the current step's reply is complete; an ADD's result goes to *number.
bool Driver::replyComplete(Rank* r, int64_t* number) {
  const Step& s = r->steps[r->step];
  if (s.reply == Reply::kFixed) {
    if (r->in.size() < s.fixed) return false;
    if (s.fixed == 8) std::memcpy(number, r->in.data(), 8);
    return true;
  }
  if (r->in.size() < 8) return false;
  uint64_t len = 0;
  std::memcpy(&len, r->in.data(), 8);
  return r->in.size() >= 8 + len;
}

void Driver::finishStep(Rank* r) {
  int64_t number = 0;
  if (r->steps[r->step].reply != Reply::kNone && !replyComplete(r, &number)) return;
  r->in.clear();
  if (r->step == 0 && !r->connected) {  // PING answered: connected
    r->connected = true;
    --in_connect_;
    if (++connected_ == opt_.ranks) connected_s_ = elapsed();
  }
  bool was_count = !opt_.connect_only && !r->barrier_tail && r->step + 1 == r->steps.size();
  if (was_count) {  // ADD barrier 0 answered: the count decides whether this rank sets the key
    r->barrier_tail = true;
    if (number == opt_.ranks) r->steps.push_back(Step{{setRequest(kLastWorkerKey, "1")}});
    r->steps.push_back(fixedStep({waitRequest(kLastWorkerKey)}, 1));
  }
  if (++r->step == r->steps.size()) {
    r->done = true;
    ++done_;
    return;
  }
  sendStep(r);
}

void Driver::onEvent(Rank* r, uint32_t events) {
  if (r->connecting) {
    if (!(events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) return;
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(r->fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return fail(r, std::strerror(err));
    r->connecting = false;
    countConnectTime(r);
    sendStep(r);
    if (r->connecting) return;  // the send failed and the rank reconnects
  }
  if (!(events & (EPOLLIN | EPOLLHUP | EPOLLERR)) || r->done || r->fd < 0) return;
  uint8_t buf[4096];
  while (true) {
    ssize_t n = recv(r->fd, buf, sizeof(buf), 0);
    if (n > 0) {
      r->in.insert(r->in.end(), buf, buf + n);
      if (static_cast<size_t>(n) < sizeof(buf)) break;
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    return fail(r, n == 0 ? "closed by the server" : std::strerror(errno));
  }
  finishStep(r);
}

void Driver::countConnectTime(const Rank* r) {
  double took = std::chrono::duration<double>(Clock::now() - r->connect_start).count();
  if (took > 0.9) ++syn_retried_[0];
  if (took > 2.9) ++syn_retried_[1];
  if (took > 6.9) ++syn_retried_[2];
}

void Driver::startMore() {
  while (next_ < opt_.ranks && (opt_.burst || in_connect_ < opt_.window)) {
    Rank* r = &ranks_[static_cast<size_t>(next_)];
    r->index = next_++;
    r->steps = bootstrapSteps(r->index, opt_.ranks, opt_.connect_only);
    if (!startConnect(r)) std::exit(1);
    ++in_connect_;
  }
}

int Driver::run() {
  epfd_ = epoll_create1(EPOLL_CLOEXEC);
  t0_ = Clock::now();
  std::vector<epoll_event> events(1024);
  while (done_ < opt_.ranks && elapsed() < opt_.timeout_s) {
    startMore();
    int n = epoll_wait(epfd_, events.data(), static_cast<int>(events.size()), 100);
    for (int i = 0; i < n; ++i) {
      onEvent(static_cast<Rank*>(events[static_cast<size_t>(i)].data.ptr),
              events[static_cast<size_t>(i)].events);
    }
  }
  std::printf(
      "DONE wall_s=%.3f connected_s=%.3f done=%d ranks=%d connect_retries=%llu "
      "connect_over_1s=%llu connect_over_3s=%llu connect_over_7s=%llu\n",
      elapsed(), connected_s_, done_, opt_.ranks, static_cast<unsigned long long>(retries_),
      static_cast<unsigned long long>(syn_retried_[0]),
      static_cast<unsigned long long>(syn_retried_[1]),
      static_cast<unsigned long long>(syn_retried_[2]));
  std::fflush(stdout);
  char c;
  while (read(0, &c, 1) > 0) {
  }
  for (Rank& r : ranks_) {
    if (r.fd >= 0) close(r.fd);
  }
  return done_ == opt_.ranks ? 0 : 1;
}

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "store_scale_clients: %s\nusage: store_scale_clients --port P --ranks N "
               "[--mode paced|burst] [--window W] [--sources K] [--timeout-s T] "
               "[--script bootstrap|connect]\n",
               why);
  std::exit(2);
}

int unsignedValue(const std::string& flag, const std::string& text, uint64_t max) {
  return cpprun::bench::unsignedFlag([](const std::string& why) { usage(why.c_str()); }, flag, text,
                                     0, max);
}

Options parse(int argc, char** argv) {
  Options o;
  OptionCursor args(argc, argv);
  while (args.next()) {
    const std::string flag = args.name();
    if (!args.isOption()) usage(("unexpected argument " + flag).c_str());
    Result<std::string> value = args.value();
    if (!value.isOk()) usage(value.status().message().c_str());
    const std::string& v = value.value();
    if (flag == "--port") {
      o.port = static_cast<uint16_t>(unsignedValue(flag, v, 65535));
    } else if (flag == "--ranks") {
      o.ranks = unsignedValue(flag, v, 1'000'000);
    } else if (flag == "--mode") {
      if (v != "paced" && v != "burst") usage("--mode is paced or burst");
      o.burst = v == "burst";
    } else if (flag == "--window") {
      o.window = unsignedValue(flag, v, 1'000'000);
    } else if (flag == "--sources") {
      o.sources = unsignedValue(flag, v, 254);
    } else if (flag == "--script") {
      if (v != "bootstrap" && v != "connect") usage("--script is bootstrap or connect");
      o.connect_only = v == "connect";
    } else if (flag == "--timeout-s") {
      o.timeout_s = unsignedValue(flag, v, 86'400);
    } else {
      usage(("unknown flag " + flag).c_str());
    }
  }
  if (o.port == 0 || o.ranks < 2 || o.window < 1) usage("--port and --ranks (>= 2) are needed");
  if (o.sources <= 0) o.sources = (o.ranks + 1023) / 1024;
  if (o.sources > 254) usage("--sources is at most 254");
  return o;
}

}  // namespace

int main(int argc, char** argv) { return Driver(parse(argc, argv)).run(); }
