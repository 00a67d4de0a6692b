// TcpStoreServer: serves the store over TCP in PyTorch's TCPStore wire protocol, every dialect
// (torch <= 2.0, 2.1 and >= 2.2), chosen per connection from its bytes (wire::RequestDecoder).
//
// Runs on one Asio event loop thread (the agent's, or its own via BackgroundTcpStoreServer).
// Every connection is read asynchronously and parsed incrementally, so a client that sends
// half a request and goes silent stalls nobody. Replies, including WAIT replies deferred until
// another client writes the key, go through a per-connection write queue. A malformed frame,
// an unknown query type or a request over the limits closes that one connection with one
// warning line; every other client keeps being served.
//
// Thread safety: TcpStoreServer is used from its loop thread only (create() may run before the
// loop starts). BackgroundTcpStoreServer's methods may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "rendezvous/wire.h"

namespace boost::asio {
class io_context;
}

namespace cpprun::rendezvous {

struct TcpStoreServerOptions {
  // Address to bind. A specific address binds only that interface; "0.0.0.0" or "::" (both
  // families) binds every interface. Host names are resolved and the first address is used.
  std::string host = "127.0.0.1";
  uint16_t port = 0;  // 0: the kernel picks a free port; see TcpStoreServer::port()
  wire::Limits limits;
  // Connections beyond this are accepted and closed at once, with a warning.
  size_t max_connections = 65536;
  // A client that does not read its replies is dropped once this much output is queued for it.
  size_t max_pending_output_bytes = 64 * 1024 * 1024;
  // How a connection without the torch >= 2.2 handshake is read: kLegacy (torch 1.13 numbering,
  // switching to 2.1 on requests only torch 2.1 sends) or kV21 (torch 2.1 from the first byte,
  // for jobs whose clients are all torch 2.1). See wire::RequestDecoder.
  wire::Dialect no_handshake_dialect = wire::Dialect::kLegacy;
};

struct TcpStoreServerStats {
  uint64_t connections_open = 0;
  uint64_t connections_accepted = 0;
  uint64_t connections_rejected = 0;  // over max_connections
  uint64_t connections_dropped = 0;   // closed by the server for a protocol or limit violation
  uint64_t requests = 0;
  uint64_t bytes_received = 0;
  uint64_t bytes_sent = 0;
  uint64_t keys = 0;
  uint64_t pending_waits = 0;
};

class TcpStoreServer {
 public:
  // Binds and listens now, so a bad address or a port in use (kAlreadyExists) is reported here;
  // serving starts when `io` runs. REQUIRES: `io` outlives the returned server.
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
