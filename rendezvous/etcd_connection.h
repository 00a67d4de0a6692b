// One HTTP/1.1 connection to one etcd endpoint, plain or TLS (Boost.Beast over Asio, OpenSSL),
// and the TLS settings it uses. The only translation unit of cpprun_etcd that includes Beast
// and Asio is etcd_connection.cc: this header hides them (pimpl), so failover, KV, lease and
// watch build without them.
// Every operation is bounded by a deadline; a failure says what failed (ConnError) and whether
// the request had been written (a txn whose request was written is not sent again).
// Thread safety: a Connection belongs to one thread at a time; a TlsContext is shared by the
// connections of one client and only read by them.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "common/status.h"
#include "rendezvous/etcd_client.h"
#include "rendezvous/etcd_endpoints.h"

namespace cpprun::rendezvous::etcd {

using Clock = std::chrono::steady_clock;

struct HttpReply {
  unsigned status = 0;
  std::string body;
};

enum class FailKind { kNone, kConnect, kTls, kIo, kTimeout };

// A failed exchange: what failed and whether the request bytes had been written.
struct ConnError {
  FailKind kind = FailKind::kNone;
  std::string message;
  bool request_written = false;
};

// The CA, client certificate and key a client's TLS connections use.
class TlsContext {
 public:
  // kInvalidArgument naming the file that could not be loaded. An empty CA file: the system's.
  static Result<std::unique_ptr<TlsContext>> load(const EtcdTls& files);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  explicit TlsContext(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class Connection {
 public:
  enum class Verb { kGet, kPost };

  // `tls` nullptr: plain HTTP. REQUIRES: `tls` outlives the connection.
  Connection(const Endpoint& ep, TlsContext* tls);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  const Endpoint& endpoint() const;
  // How many replies this connection has carried.
  int exchanges() const;

  // Resolves, connects and (TLS) handshakes.
  std::optional<ConnError> open(Clock::time_point deadline);
  // Sends one request and reads the whole reply.
  Result<HttpReply> exchange(Verb verb, const std::string& target, const std::string& body,
                             Clock::time_point deadline, ConnError* error);
  // Starts a streamed request (a watch): sends it as a POST and reads the reply's header;
  // returns the HTTP status.
  Result<unsigned> startStream(const std::string& target, const std::string& body,
                               Clock::time_point deadline, ConnError* error);
  // The next newline-delimited message of a started stream; nullopt with error->kind set on
  // failure (kTimeout when the deadline passed), or when the stream ended (kIo).
  std::optional<std::string> readLine(Clock::time_point deadline, ConnError* error);
  // The rest of a started stream (an error reply), bounded by the deadline.
  std::string readRest(Clock::time_point deadline);
  void close();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cpprun::rendezvous::etcd
