#include "common/network_address.h"

#include <netdb.h>

#include <cstring>

#include "common/clip.h"

namespace cpprun {

bool isIpv6Literal(std::string_view host) { return host.find(':') != std::string_view::npos; }

std::string bracketedHost(const std::string& host) {
  return isIpv6Literal(host) ? "[" + host + "]" : host;
}

std::string formatHostPort(const std::string& host, int port) {
  return bracketedHost(host) + ":" + std::to_string(port);
}

Result<int> parsePort(std::string_view text, int min_port) {
  if (text.empty()) return invalidArgument("empty port");
  if (text.find_first_not_of("0123456789") != std::string_view::npos) {
    return invalidArgument("port '" + clipValue(text) + "' is not a number");
  }
  // Digits only: leading zeros aside, more than 5 of them is out of range whatever they say.
  size_t first = text.find_first_not_of('0');
  if (first == std::string_view::npos) first = text.size() - 1;
  long value = kMaxPort + 1L;
  if (text.size() - first <= 5) value = std::stol(std::string(text.substr(first)));
  if (value < min_port || value > kMaxPort) {
    return invalidArgument("port " + clipValue(text) + " is out of range " +
                           std::to_string(min_port) + "-" + std::to_string(kMaxPort));
  }
  return static_cast<int>(value);
}

Result<NetworkAddress> parseNetworkAddress(std::string_view text, const AddressSyntax& syntax) {
  const auto bad = [text](const std::string& why) -> Status {
    return invalidArgument("'" + clipValue(text) + "': " + why);
  };
  NetworkAddress out;
  std::optional<std::string_view> port;  // unset: none given
  if (!text.empty() && text.front() == '[') {
    const size_t close = text.find(']');
    if (close == std::string_view::npos) return bad("'[' without ']'");
    out.host = std::string(text.substr(1, close - 1));
    if (close + 1 < text.size()) {
      if (text[close + 1] != ':') return bad("expected ':PORT' after ']'");
      port = text.substr(close + 2);
    }
    if (out.host.empty()) return bad("no host");
  } else {
    const size_t colon = text.rfind(':');
    if (colon != std::string_view::npos && text.find(':') != colon) {
      if (!syntax.default_port || !syntax.bare_ipv6_host) {
        return bad("IPv6 addresses go in brackets ([ADDR]:PORT)");
      }
      out.host = std::string(text);  // a bare IPv6 address: no port
    } else if (colon != std::string_view::npos) {
      out.host = std::string(text.substr(0, colon));
      port = text.substr(colon + 1);
    } else {
      out.host = std::string(text);
    }
    if (out.host.empty()) return bad("no host");
  }
  if (!port) {
    if (!syntax.default_port) return bad("no port");
    out.port = *syntax.default_port;
    return out;
  }
  Result<int> value = parsePort(*port, syntax.min_port);
  if (!value.isOk()) return bad(value.status().message());
  out.port = value.value();
  return out;
}

Result<std::vector<ResolvedAddress>> resolveTcp(const std::string& host, int port,
                                                ResolveFor purpose) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (purpose == ResolveFor::kBind ? AI_PASSIVE : 0);
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const int rc =
      ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found);
  if (rc != 0) return invalidArgument(::gai_strerror(rc));
  std::vector<ResolvedAddress> out;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if (a->ai_addrlen > sizeof(sockaddr_storage)) continue;
    ResolvedAddress r;
    r.family = a->ai_family;
    std::memcpy(&r.address, a->ai_addr, a->ai_addrlen);
    r.length = a->ai_addrlen;
    out.push_back(r);
  }
  ::freeaddrinfo(found);
  if (out.empty()) return invalidArgument("no address");
  return out;
}

std::string numericHost(const ResolvedAddress& address) {
  char text[NI_MAXHOST] = {};
  if (::getnameinfo(address.sockaddrPtr(), address.length, text, sizeof text, nullptr, 0,
                    NI_NUMERICHOST) != 0) {
    return "";
  }
  return text;
}

}  // namespace cpprun
