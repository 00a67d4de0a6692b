// etcd endpoints: the one parser of an endpoint's "host:port" text, and the rotation that
// picks which member a request tries next (members that went silent are skipped for a while).
// No I/O.
// Thread safety: parseEtcdEndpoint is reentrant; EndpointRotation's methods may be called from
// several threads (a mutex).
#pragma once

#include <chrono>
#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"

namespace cpprun::rendezvous::etcd {

struct Endpoint {
  std::string host;  // without brackets
  std::string port;
  std::string name;  // "host:port" as given (brackets kept)
};

// One entry of an endpoint list: "host:port", optionally with "http://" or "https://" (dropped)
// and a trailing "/"; IPv6 hosts in brackets. The error names the entry and what was wrong.
// (parseEtcdEndpoints in etcd_client.h splits a list and calls this for each entry.)
Result<Endpoint> parseEtcdEndpoint(const std::string& entry);

// Which endpoint a request goes to next. Endpoints that went silent (a connection or a
// request timed out, or was refused) are skipped for `silence` as long as another one is not:
// one member cut off by the network must not eat a call's whole budget (one request timeout
// per try) while the others elect a leader. An endpoint that answers is trusted again at once.
class EndpointRotation {
 public:
  using Clock = std::chrono::steady_clock;
  // REQUIRES: count > 0.
  EndpointRotation(size_t count, Clock::duration silence)
      : silent_until_(count), silence_(silence) {}

  void markSilent(size_t i, Clock::time_point now);
  void markAnswered(size_t i);
  // The next endpoint after `from` that is not silent (the one after `from` if all are).
  size_t next(size_t from, Clock::time_point now);
  // How many endpoints are not silent (at least 1): one round of tries.
  size_t answering(Clock::time_point now);

 private:
  std::mutex mutex_;
  std::vector<Clock::time_point> silent_until_;  // REQUIRES: mutex_; by endpoint index
  const Clock::duration silence_;
};

}  // namespace cpprun::rendezvous::etcd
