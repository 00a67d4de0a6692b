// TcpStoreServer: serves the store over TCP in PyTorch's TCPStore wire protocol, every dialect
// (torch <= 2.0, 2.1 and >= 2.2), chosen per connection from its bytes (wire::RequestDecoder).
//
// Runs on one Asio event loop thread (the agent's, or its own via BackgroundTcpStoreServer).
// Every connection is read asynchronously and parsed incrementally, so a client that sends
// half a request and goes silent stalls nobody. Replies, including WAIT replies deferred until
// another client writes the key, go through a per-connection write queue. A malformed frame,
// an unknown query type or a request over the limits closes that one connection; every other
// client keeps being served.
//
// Connections read into a 128-byte buffer of their own and, past it, one buffer shared by the
// loop; a connection keeps the unfinished request it has sent (in its decoder) and its unsent
// replies, so an idle client costs no 4 KiB read buffer. Accepting drains the kernel's accept
// queue in one go (tcp_listen.h); a server expecting more clients than one accept queue holds
// listens on several sockets sharing the port (SO_REUSEPORT, TcpStoreServerOptions).
//
// Memory per connection is bounded by two byte budgets: what it may have buffered of a request
// it has not finished sending (max_request_bytes), and what may be queued of replies it has not
// read (max_pending_output_bytes, checked before a reply is built, so one MULTI_GET naming an
// 8 MiB value 100,000 times costs nothing). Over either, the connection is closed.
//
// Each closed connection is counted by reason (TcpStoreServerStats::dropped_by_reason) and
// logged with one warning line naming the peer, at most drop_warnings_per_interval lines per
// drop_warning_interval; drops beyond that are counted and summarised in one line when the
// interval ends, so a flood of garbage cannot flood the log.
//
// Thread safety: TcpStoreServer is used from its loop thread only (create() may run before the
// loop starts). BackgroundTcpStoreServer's methods may be called from any thread.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "rendezvous/wire.h"

namespace boost::asio {
class io_context;
}

namespace cpprun::rendezvous {

// The default per-connection budget for an unfinished request: about four times the largest
// request with one key that torch's limits allow (a COMPARE_SET of an 8 KiB key and two 8 MiB
// values, 16 MiB + 8 KiB), so any single SET, GET or COMPARE_SET of torch's maximal sizes and a
// MULTI_SET of seven maximal values fit.
inline constexpr size_t kDefaultMaxRequestBytes = 64 * 1024 * 1024;

// The largest request with one key that `limits` allow: a COMPARE_SET (type byte, key, expected
// and desired values, each length-prefixed). max_request_bytes may not be below it.
size_t largestSingleKeyRequest(const wire::Limits& limits);

// Why the server closed a connection.
enum class DropReason : uint8_t {
  kBadFrame,       // malformed frame, unknown query type, or a field over wire::Limits
  kRefused,        // a request torch's server answers by closing (e.g. a legacy GET of a
                   // missing key, ADD on a value that is not a number)
  kRequestBudget,  // an unfinished request over max_request_bytes
  kReplyBudget,    // replies queued and unread over max_pending_output_bytes
};
inline constexpr size_t kDropReasonCount = 4;
// "bad frame", "refused request", "request budget", "reply budget".
const char* dropReasonName(DropReason reason);

struct TcpStoreServerOptions {
  // Address to bind. A specific address binds only that interface; "0.0.0.0" or "::" (both
  // families) binds every interface. Host names are resolved and the first address is used.
  std::string host = "127.0.0.1";
  uint16_t port = 0;  // 0: the kernel picks a free port; see TcpStoreServer::port()
  wire::Limits limits;
  // Connections beyond this are accepted and closed at once, with a warning.
  size_t max_connections = 65536;
  // Bytes one connection may have buffered of a request it has not finished sending (a
  // MULTI_SET announcing 131,072 values of 8 MiB is cut off here, not after 1 TiB). Checked
  // after every read, so a connection holds at most this plus one read (64 KiB). REQUIRES:
  // at least largestSingleKeyRequest(limits) (create() says InvalidArgument otherwise).
  size_t max_request_bytes = kDefaultMaxRequestBytes;
  // Bytes of replies that may be queued for one connection and not yet taken by the kernel (a
  // client that does not read its replies, or asks for more than this in one MULTI_GET or
  // LIST_KEYS). Checked before a reply is queued or built.
  size_t max_pending_output_bytes = 64 * 1024 * 1024;
  // Drop warnings: at most this many lines per interval, one per closed connection; the drops
  // beyond are counted and summarised in one line at the end of the interval.
  size_t drop_warnings_per_interval = 5;
  std::chrono::milliseconds drop_warning_interval{10000};
  // How a connection without the torch >= 2.2 handshake is read: kLegacy (torch 1.13 numbering,
  // switching to 2.1 on requests only torch 2.1 sends) or kV21 (torch 2.1 from the first byte,
  // for jobs whose clients are all torch 2.1). See wire::RequestDecoder.
  wire::Dialect no_handshake_dialect = wire::Dialect::kLegacy;
  // How many clients the job will connect (0: unknown). When more than one accept queue holds
  // (net.core.somaxconn, listenBacklog()), the server listens on several sockets sharing the
  // port (SO_REUSEPORT, each with a queue of its own; listenersFor() in tcp_listen.h), so a
  // connect burst of that many clients does not overflow the queue and wait on SYN retries; if
  // even those queues are too few, create() logs one warning naming the numbers.
  size_t expected_clients = 0;
  // The job's secret (store_auth.h): when set, only connections that prove it may write keys
  // under "cpprun/". Empty: every client may write every key (torch's TCPStore).
  std::string secret;
  // Listening sockets on the port: 0 picks them from expected_clients (one when it is unknown
  // or fits one queue). The first is bound alone, so a port in use is reported as before.
  size_t listen_sockets = 0;
};

struct TcpStoreServerStats {
  uint64_t connections_open = 0;
  uint64_t connections_accepted = 0;
  uint64_t connections_rejected = 0;  // over max_connections
  uint64_t connections_dropped = 0;   // closed by the server for a protocol or limit violation
  // connections_dropped by reason, indexed by DropReason.
  std::array<uint64_t, kDropReasonCount> dropped_by_reason{};
  // Drops not logged one by one (over drop_warnings_per_interval), only in a summary line.
  uint64_t drop_warnings_suppressed = 0;
  uint64_t requests = 0;
  uint64_t bytes_received = 0;
  uint64_t bytes_sent = 0;
  uint64_t keys = 0;
  uint64_t pending_waits = 0;
  uint64_t listen_sockets = 0;  // sockets listening on the port (SO_REUSEPORT when above 1)
  // Connections closed for writing the job's keys without proving its secret, or for a wrong
  // proof (a part of dropped(kRefused)).
  uint64_t refused_unauthenticated = 0;

  uint64_t dropped(DropReason reason) const {
    return dropped_by_reason[static_cast<size_t>(reason)];
  }
};

class TcpStoreServer {
 public:
  // Binds and listens now, so a bad address or a port in use (kAlreadyExists) is reported here,
  // as are inconsistent options (kInvalidArgument); serving starts when `io` runs. REQUIRES: `io`
  // outlives the returned server.
  static Result<std::unique_ptr<TcpStoreServer>> create(boost::asio::io_context& io,
                                                        TcpStoreServerOptions options);
  ~TcpStoreServer();  // stops (see stop())
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  // The bound address, e.g. "127.0.0.1" and the port the kernel picked.
  const std::string& host() const;
  uint16_t port() const;
  // Stops accepting and closes every connection. Idempotent.
  void stop();
  TcpStoreServerStats stats() const;
  // The owner's own writes, applied as a client's SET would be (waiters wake).
  void set(const std::string& key, const std::string& value);
  // Removes every key that does not start with `keep_prefix`; returns how many went.
  size_t eraseKeysExcept(const std::string& keep_prefix);
  // Removes every key that starts with `prefix`; returns how many went. The loop's thread.
  size_t eraseKeysWithPrefix(const std::string& prefix);

  class Impl;

 private:
  explicit TcpStoreServer(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

// A TcpStoreServer on a thread of its own: for the standalone daemon, tests and benchmarks.
class BackgroundTcpStoreServer {
 public:
  static Result<std::unique_ptr<BackgroundTcpStoreServer>> start(TcpStoreServerOptions options);
  ~BackgroundTcpStoreServer();  // stops the server and joins the thread
  BackgroundTcpStoreServer(const BackgroundTcpStoreServer&) = delete;
  BackgroundTcpStoreServer& operator=(const BackgroundTcpStoreServer&) = delete;

  const std::string& host() const;
  uint16_t port() const;
  // A consistent snapshot, taken on the loop thread.
  TcpStoreServerStats stats() const;

  struct State;

 private:
  explicit BackgroundTcpStoreServer(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace cpprun::rendezvous
