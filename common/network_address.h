// NetworkAddress: a TCP endpoint as cpprun's users and logs write it, "host:port".
//
// The one place that reads and writes that text: a host name, an IPv4 address or an IPv6
// address in brackets ("[::1]:29500"), and a port checked to be a decimal number in range (no
// sign, no spaces, no atoi). Formatting puts an IPv6 host back in brackets, so every log line,
// error and /status field reads "[::1]:29500", never the ambiguous "::1:29500".
// resolveTcp() is the one getaddrinfo() wrapper for code that needs socket addresses.
// Thread safety: value types and pure functions, except resolveTcp(), which is reentrant.
#pragma once

#include <sys/socket.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace cpprun {

inline constexpr int kMaxPort = 65535;

// True when `host` is an IPv6 literal (it holds a ':'; no name or IPv4 address does).
bool isIpv6Literal(std::string_view host);

// `host` as it goes before ":port": "[::1]" for an IPv6 literal, otherwise unchanged.
std::string bracketedHost(const std::string& host);

// "host:port", "[::1]:29500".
std::string formatHostPort(const std::string& host, int port);

// How much of "host:port" a caller's syntax lets the user leave out.
struct AddressSyntax {
  // Set: "host" and "[::1]" mean this port. Unset: the port is required.
  std::optional<int> default_port;
  // With a default port: a bare IPv6 literal ("fe80::1") is a host without a port. Otherwise
  // (and always without a default port) it is an error: "IPv6 addresses go in brackets".
  bool bare_ipv6_host = false;
  // The lowest port accepted (etcd's endpoints need 1; a server's own port may be 0: any).
  int min_port = 0;
};

struct NetworkAddress {
  std::string host;  // without brackets: "::1", "10.0.0.1", "node-7"
  int port = 0;      // 0..65535

  // "host:port" with an IPv6 host in brackets: "[::1]:29500".
  std::string toString() const { return formatHostPort(host, port); }
  bool operator==(const NetworkAddress& o) const { return host == o.host && port == o.port; }
  bool operator!=(const NetworkAddress& o) const { return !(*this == o); }
};

// Parses "host:port", "[v6]:port" and, as `syntax` allows, "host", "[v6]", "v6". The error
// (kInvalidArgument) names the text, clipped, and what is wrong with it:
// "'[::1': '[' without ']'", "'n1:70000': port 70000 is out of range 0-65535",
// "'n1:': empty port", "':5': no host", "'host': no port", "'n1:http': port 'http' is not a
// number", "'::1:80': IPv6 addresses go in brackets ([ADDR]:PORT)".
Result<NetworkAddress> parseNetworkAddress(std::string_view text, const AddressSyntax& syntax = {});

// A port alone: decimal digits only, in [min_port, 65535]. The error names the text:
// "port 'http' is not a number", "port 70000 is out of range 0-65535", "empty port".
Result<int> parsePort(std::string_view text, int min_port = 0);

// One socket address getaddrinfo() found.
struct ResolvedAddress {
  int family = 0;  // AF_INET or AF_INET6
  sockaddr_storage address{};
  socklen_t length = 0;
  const sockaddr* sockaddrPtr() const { return reinterpret_cast<const sockaddr*>(&address); }
};

enum class ResolveFor {
  kConnect,  // an empty host is the loopback address
  kBind,     // AI_PASSIVE: an empty host is every interface
};

// The TCP addresses of `host` (a name or a literal, without brackets) and a numeric `port`, in
// getaddrinfo()'s order. An empty host is getaddrinfo()'s null node: every interface to bind,
// the loopback to connect to. The error (kInvalidArgument) is getaddrinfo's own text ("Name or
// service not known") and no more: every caller names the host in its own line.
Result<std::vector<ResolvedAddress>> resolveTcp(const std::string& host, int port,
                                                ResolveFor purpose = ResolveFor::kConnect);

// The numeric text of a resolved address ("10.0.0.1", "::1"), without the port.
std::string numericHost(const ResolvedAddress& address);

}  // namespace cpprun
