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

// At most kAcceptWarningsPerInterval warning lines (a refused connection, a failed accept)
// per kAcceptWarningInterval and server; the rest are counted and summed up in one line with
// the first warning after the interval, so a flood of connections cannot flood the log.
inline constexpr int kAcceptWarningsPerInterval = 5;
inline constexpr std::chrono::seconds kAcceptWarningInterval{10};

// The warning budget of one server's accept loop (loop thread only).
struct AcceptWarnings {
  std::chrono::steady_clock::time_point interval_start{};
  int lines = 0;            // written in this interval
  uint64_t suppressed = 0;  // not written in this interval
};

// What acceptConnections needs from its server. Every hook runs on the acceptor's loop thread.
struct AcceptHooks {
  std::string what;  // names the server in log lines: "store", "http"
  size_t max_connections = 0;
  std::function<bool()> stopped;                               // true: accept nothing more
  std::function<size_t()> open_connections;                    // counted against max_connections
  std::function<void(boost::asio::ip::tcp::socket)> accepted;  // one under the limit
  std::function<void()> refused = {};  // optional: one over the limit, already closed
  mutable AcceptWarnings warnings;     // the accept loop's own state
};

// Accepts on a listening `acceptor` until hooks->stopped(). A failed accept (typically EMFILE:
// out of descriptors) is retried after 50 ms on `retry_timer` instead of spinning; a connection
// over the limit is closed at once with a warning naming its peer (both warnings within the
// budget above). `owner`, the server that owns
// the acceptor and the timer, is held by every pending handler, so they outlive them; to stop,
// the server sets what stopped() reads and closes the acceptor and cancels the timer.
void acceptConnections(std::shared_ptr<void> owner, boost::asio::ip::tcp::acceptor& acceptor,
                       boost::asio::steady_timer& retry_timer,
                       std::shared_ptr<const AcceptHooks> hooks);

}  // namespace cpprun::rendezvous
