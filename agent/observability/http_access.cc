#include "agent/observability/http_access.h"

#include <arpa/inet.h>
#include <limits.h>
#include <unistd.h>

#include <cstring>

#include "common/clip.h"
#include "common/network_address.h"

namespace cpprun::agent {

namespace {

// An IP literal as the 16 bytes of an IPv6 address (IPv4 mapped), or nullopt for a name.
struct IpLiteral {
  unsigned char bytes[16] = {};
  bool v4 = false;
};

std::optional<IpLiteral> ipLiteral(const std::string& text) {
  IpLiteral ip;
  in_addr v4{};
  if (::inet_pton(AF_INET, text.c_str(), &v4) == 1) {
    ip.v4 = true;
    ip.bytes[10] = ip.bytes[11] = 0xff;
    std::memcpy(ip.bytes + 12, &v4, 4);
    return ip;
  }
  if (::inet_pton(AF_INET6, text.c_str(), ip.bytes) == 1) return ip;
  return std::nullopt;
}

bool sameIp(const IpLiteral& a, const IpLiteral& b) {
  return std::memcmp(a.bytes, b.bytes, sizeof a.bytes) == 0;
}

bool isUnspecified(const IpLiteral& ip) {
  static const IpLiteral zero_v6{};
  IpLiteral zero_v4;
  zero_v4.bytes[10] = zero_v4.bytes[11] = 0xff;
  return sameIp(ip, zero_v6) || sameIp(ip, zero_v4);
}

bool isLoopback(const IpLiteral& ip) {
  if (ip.v4) return ip.bytes[12] == 127;
  IpLiteral one;
  one.bytes[15] = 1;
  return sameIp(ip, one);
}

char lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

bool equalsIgnoringCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

// The token of an `Authorization: Bearer <token>` value; nullopt for another scheme.
std::optional<std::string_view> bearerToken(std::string_view value) {
  constexpr std::string_view kScheme = "bearer";
  if (value.size() <= kScheme.size() || !equalsIgnoringCase(value.substr(0, 6), kScheme) ||
      value[kScheme.size()] != ' ') {
    return std::nullopt;
  }
  std::string_view token = value.substr(kScheme.size());
  while (!token.empty() && token.front() == ' ') token.remove_prefix(1);
  while (!token.empty() && (token.back() == ' ' || token.back() == '\t')) token.remove_suffix(1);
  return token;
}

}  // namespace

bool hostAllowed(std::string_view host_field, const std::string& configured_host,
                 const std::string& bound_address, const std::vector<std::string>& host_names) {
  AddressSyntax syntax;
  syntax.default_port = 80;
  Result<NetworkAddress> parsed = parseNetworkAddress(host_field, syntax);
  if (!parsed.isOk()) return false;
  const std::string& host = parsed.value().host;
  const bool bracketed = host_field.front() == '[';
  const std::optional<IpLiteral> bound = ipLiteral(bound_address);
  const bool bound_everywhere = bound && isUnspecified(*bound);
  const bool bound_loopback = bound && (bound_everywhere || isLoopback(*bound));
  if (const std::optional<IpLiteral> ip = ipLiteral(host)) {
    // IPv6 only in brackets ("[::1]"), IPv4 never ("[127.0.0.1]" is no Host).
    if (bracketed == ip->v4) return false;
    // A literal address cannot be re-pointed: any of this endpoint's addresses is fine.
    if (bound_everywhere) return true;
    if (bound && sameIp(*ip, *bound)) return true;
    return bound_loopback && isLoopback(*ip);
  }
  if (bracketed) return false;
  if (equalsIgnoringCase(host, configured_host)) return true;
  if (bound_loopback && equalsIgnoringCase(host, "localhost")) return true;
  for (const std::string& name : host_names) {
    if (!name.empty() && equalsIgnoringCase(host, name)) return true;
  }
  return false;
}

bool tokenMatches(std::string_view presented, std::string_view expected) {
  // Every byte of `expected` is looked at whatever `presented` holds; only presented's length
  // (which its sender knows) decides which bytes are read.
  volatile unsigned char diff = presented.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    const unsigned char p = i < presented.size() ? static_cast<unsigned char>(presented[i]) : 0;
    diff = diff | (p ^ static_cast<unsigned char>(expected[i]));
  }
  return diff == 0;
}

std::vector<std::string> nodeHostNames() {
  char name[HOST_NAME_MAX + 1] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return {};
  std::vector<std::string> names{name};
  const size_t dot = names.front().find('.');
  if (dot != std::string::npos && dot > 0) names.push_back(names.front().substr(0, dot));
  return names;
}

std::optional<HttpRefusal> refuseRequest(const HttpAccessOptions& options,
                                         const HttpRequestHead& head,
                                         const std::string& configured_host,
                                         const std::string& bound_address) {
  if (options.check_host) {
    if (head.hosts.empty()) {
      return HttpRefusal{400, "no Host header: a request must name the host it is for\n"};
    }
    if (head.hosts.size() > 1) {
      return HttpRefusal{
          400, std::to_string(head.hosts.size()) + " Host headers: a request names one host\n"};
    }
    if (!hostAllowed(head.hosts.front(), configured_host, bound_address, options.host_names)) {
      return HttpRefusal{403, "Host '" + clipValue(head.hosts.front()) +
                                  "' does not name this endpoint (listening on " +
                                  bracketedHost(bound_address) +
                                  "): refused against DNS rebinding; use the address it "
                                  "listens on or this node's name\n"};
    }
  }
  if (!head.post) return std::nullopt;
  if (options.refuse_browser_posts && head.has_origin) {
    return HttpRefusal{403,
                       "a POST with an Origin header (a web browser's) is refused: send it "
                       "with curl or another client that sends none\n"};
  }
  if (!options.post_token.empty()) {
    if (!head.authorization) {
      return HttpRefusal{401, "POST needs 'Authorization: Bearer <token>' (--metrics-token-file)\n",
                         true};
    }
    const std::optional<std::string_view> token = bearerToken(*head.authorization);
    if (!token || !tokenMatches(*token, options.post_token)) {
      return HttpRefusal{401, "wrong bearer token (--metrics-token-file)\n", true};
    }
  }
  return std::nullopt;
}

}  // namespace cpprun::agent
