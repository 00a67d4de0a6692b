// EtcdClient::Impl: a client's endpoints, its TLS settings and its one keep-alive connection,
// and the failover that carries a request to a member that answers: a connection error, a
// timeout, or etcd's "no leader" answers move the request to the next endpoint (members gone
// silent skipped for a while), round after round with a doubling pause, until the call's budget
// (request_timeout x endpoints) is spent; a txn whose reply was lost is not sent again.
// KV and lease calls (etcd_client.cc) go through call(); a watch (etcd_watch.cc) opens its own
// connection and uses the rotation and the notes here.
// Thread safety: call() serialises requests on the one connection (a mutex); the rotation has
// its own mutex; the rest is immutable after init().
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "rendezvous/etcd_client.h"
#include "rendezvous/etcd_codec.h"
#include "rendezvous/etcd_connection.h"
#include "rendezvous/etcd_endpoints.h"

namespace cpprun::rendezvous {

class EtcdClient::Impl {
 public:
  explicit Impl(EtcdClientOptions options) : options_(std::move(options)) {}

  // Validates the options, loads the TLS files and connects to the first endpoint that
  // answers GET /version (see EtcdClient::connect).
  Status init();

  // One request with failover; the reply's JSON object. `idempotent`: may be sent again after
  // its reply was lost.
  Result<etcd::Json> call(const std::string& target, const etcd::Json& body, bool idempotent);

  std::string currentEndpoint();
  size_t currentIndex();
  const EtcdClientOptions& options() const { return options_; }
  const std::vector<etcd::Endpoint>& endpoints() const { return endpoints_; }
  etcd::TlsContext* tls() { return tls_.get(); }
  etcd::EndpointRotation& rotation() { return *rotation_; }
  // "plain HTTP" or the TLS files, for error messages.
  std::string tlsNote() const;
  static bool wentSilent(etcd::FailKind kind) {
    return kind == etcd::FailKind::kTimeout || kind == etcd::FailKind::kConnect;
  }

  void countRequest() { requests_.fetch_add(1, std::memory_order_relaxed); }
  uint64_t requestsMade() const { return requests_.load(std::memory_order_relaxed); }

 private:
  // One request on the current endpoint, connecting first when needed. REQUIRES: mutex_ held.
  Result<etcd::HttpReply> attempt(etcd::Connection::Verb verb, const std::string& target,
                                  const std::string& body, etcd::Clock::time_point deadline,
                                  etcd::ConnError* error);

  EtcdClientOptions options_;
  std::vector<etcd::Endpoint> endpoints_;
  std::unique_ptr<etcd::TlsContext> tls_;  // nullptr: plain HTTP
  std::unique_ptr<etcd::EndpointRotation> rotation_;
  std::atomic<uint64_t> requests_{0};  // calls and watches made (requestsMade())
  std::mutex mutex_;
  size_t current_ = 0;                      // REQUIRES: mutex_
  std::unique_ptr<etcd::Connection> conn_;  // REQUIRES: mutex_
};

}  // namespace cpprun::rendezvous
