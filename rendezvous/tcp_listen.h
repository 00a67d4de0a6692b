// listenTcp and acceptConnections: how every cpprun server (the store, the agent's HTTP
// endpoint) binds, listens and accepts, so they agree on host names, IPv6, SO_REUSEADDR, what a
// port in use means, running out of descriptors and their connection limit.
//
// For .cc files that already use Asio (it includes common/asio.h).
// Thread safety: free functions; use the acceptor from its loop thread as usual.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/asio.h"
#include "common/status.h"

namespace cpprun::rendezvous {

// "10.0.0.1:29500", "[::1]:29500".
std::string describeEndpoint(const boost::asio::ip::tcp::endpoint& endpoint);

struct BoundAddress {
  std::string host;   // the bound address, e.g. "127.0.0.1"
  uint16_t port = 0;  // the bound port (the kernel's pick for 0)
};

// Opens `acceptor` on `host`:`port` and listens. `host` is a literal address or a name (resolved,
// first address); "0.0.0.0" or "::" (both families) binds every interface. `what` names the
// server in errors ("store", "HTTP"). Errors: kInvalidArgument when the host does not resolve,
// kAlreadyExists when the port is in use (an elastic agent reads it as "another agent serves
// the store"), kUnavailable for anything else.
Result<BoundAddress> listenTcp(boost::asio::ip::tcp::acceptor& acceptor, const std::string& host,
                               uint16_t port, const std::string& what);

// WarningLimiter: one server's connection warnings (a connection closed for bad input or over a
// budget, one refused over the connection cap, a failed accept) within a budget: at most
// `per_interval` lines per `interval`. The first warning opens an interval; the ones past the
// allowance are only counted by category, and when the interval ends one line sums them up:
// "store: 295 more connections dropped in the last 10.0 s: 290 bad frame, 5 over the
// connection cap". Under a flood that is per_interval + 1 lines per interval, whatever the rate.
//
// Thread safety: the server's loop thread only.
class WarningLimiter {
 public:
  // `what` names the server at the start of every line ("store", "http").
  WarningLimiter(boost::asio::io_context& io, std::string what, size_t per_interval,
                 std::chrono::milliseconds interval);
  // Writes "<what>: <line>", or counts it under `category`; true when written. `owner` keeps
  // the limiter alive until the interval's timer has fired.
  bool warn(const std::shared_ptr<void>& owner, const std::string& category,
            const std::string& line);
  // Writes what the current interval has not reported yet (the server stops).
  void stop();

 private:
  void endInterval();

  boost::asio::steady_timer timer_;
  const std::string what_;
  const size_t per_interval_;
  const std::chrono::milliseconds interval_;
  bool open_ = false;
  std::chrono::steady_clock::time_point opened_;
  size_t logged_ = 0;
  std::vector<std::pair<std::string, uint64_t>> suppressed_;  // by category, first seen first
};

// The listen backlog servers ask for: net.core.somaxconn as /proc/sys/net/core/somaxconn says
// (the kernel's cap on every accept queue), or SOMAXCONN when unreadable. A connect burst of
// more clients than this overflows the queue: the kernel drops their SYNs and they retry after
// 1 s, 3 s, 7 s (the store warns at start when it expects more clients; see
// TcpStoreServerOptions::expected_clients).
int listenBacklog();

// How many listening sockets a server expecting `expected_clients` at once opens on its port:
// one while they fit one accept queue of `backlog` entries, otherwise enough queues for twice
// the clients (the kernel spreads connections over the sockets by a hash of their addresses, so
// the queues do not fill evenly), at most kMaxListeners. 0 clients (unknown): one.
inline constexpr size_t kMaxListeners = 32;
size_t listenersFor(size_t expected_clients, int backlog);

// Opens up to `count` more listening sockets on the address `first` listens on, sharing its
// port through SO_REUSEPORT: the kernel then spreads incoming connections over count + 1 accept
// queues of listenBacklog() entries each, so a connect burst of more clients than one queue
// holds is not left to SYN retries (1 s, 3 s, 7 s).
//
// `first` must be bound and listening through listenTcp(), without SO_REUSEPORT: so a port that
// another program (or another cpprun server) holds is reported as in use exactly as before, and
// another cpprun server trying this port later still gets kAlreadyExists (its first socket has
// no SO_REUSEPORT, which conflicts with ours). Only after that does `first` get SO_REUSEPORT and
// the others join it. What SO_REUSEPORT still allows: a program of the same user that itself
// sets SO_REUSEPORT could bind the port beside us and take a share of the connections.
//
// Returns the sockets opened, listening; fewer (none) when the kernel refused one, and then
// `why_not` says why (the server serves with what it has: one socket is today's behaviour).
std::vector<std::unique_ptr<boost::asio::ip::tcp::acceptor>> addReusePortListeners(
    boost::asio::ip::tcp::acceptor& first, size_t count, std::string* why_not);

// A server's default warning budget (the store's options can change its own).
inline constexpr size_t kWarningsPerInterval = 5;
inline constexpr std::chrono::milliseconds kWarningInterval{10000};

// What acceptConnections needs from its server. Every hook runs on the acceptor's loop thread.
struct AcceptHooks {
  std::string what;  // names the server in log lines: "store", "http"
  size_t max_connections = 0;
  std::function<bool()> stopped;                               // true: accept nothing more
  std::function<size_t()> open_connections;                    // counted against max_connections
  std::function<void(boost::asio::ip::tcp::socket)> accepted;  // one under the limit
  std::function<void()> refused = {};  // optional: one over the limit, already closed
  // The server's warning budget, which its other connection warnings share.
  std::shared_ptr<WarningLimiter> warnings;
};

// Accepts on a listening `acceptor` until hooks->stopped(); after each completed accept it
// empties the kernel's accept queue with non-blocking accepts before the loop serves anything
// else. A failed accept (typically EMFILE:
// out of descriptors) is retried after 50 ms on `retry_timer` instead of spinning; a connection
// over the limit is closed at once with a warning naming its peer (both warnings within
// hooks->warnings' budget). `owner`, the server that owns
// the acceptor and the timer, is held by every pending handler, so they outlive them; to stop,
// the server sets what stopped() reads and closes the acceptor and cancels the timer.
void acceptConnections(std::shared_ptr<void> owner, boost::asio::ip::tcp::acceptor& acceptor,
                       boost::asio::steady_timer& retry_timer,
                       std::shared_ptr<const AcceptHooks> hooks);

}  // namespace cpprun::rendezvous
