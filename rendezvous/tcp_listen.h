// listenTcp: how every cpprun server (the store, the agent's HTTP endpoint) binds and listens,
// so they agree on host names, IPv6, SO_REUSEADDR and what a port in use means.
//
// For .cc files that already use Asio (it includes common/asio.h).
// Thread safety: free functions; use the acceptor from its loop thread as usual.
#pragma once

#include <cstdint>
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

}  // namespace cpprun::rendezvous
