#include "rendezvous/etcd_endpoints.h"

#include <algorithm>
#include <charconv>

#include "rendezvous/etcd_client.h"

namespace cpprun::rendezvous {
namespace etcd {

Result<Endpoint> parseEtcdEndpoint(const std::string& entry) {
  std::string e = entry;
  auto trim = [](std::string& s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.erase(s.begin());
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.pop_back();
  };
  trim(e);
  auto bad = [&entry](const std::string& why) -> Status {
    return invalidArgument("bad etcd endpoint '" + entry + "': " + why +
                           " (expected host:port, e.g. 127.0.0.1:2379)");
  };
  if (e.empty()) return bad("empty entry");
  for (const char* scheme : {"http://", "https://"}) {
    if (e.rfind(scheme, 0) == 0) e.erase(0, std::char_traits<char>::length(scheme));
  }
  while (!e.empty() && e.back() == '/') e.pop_back();
  if (e.empty()) return bad("no host");
  if (e.find('/') != std::string::npos) return bad("a path is not allowed");
  Endpoint out;
  std::string port;
  if (e.front() == '[') {
    auto close = e.find(']');
    if (close == std::string::npos) return bad("unclosed '[' in IPv6 address");
    out.host = e.substr(1, close - 1);
    if (close + 1 >= e.size() || e[close + 1] != ':') return bad("no port");
    port = e.substr(close + 2);
  } else {
    auto colon = e.rfind(':');
    if (colon == std::string::npos) return bad("no port");
    out.host = e.substr(0, colon);
    if (out.host.find(':') != std::string::npos) return bad("IPv6 addresses go in brackets");
    port = e.substr(colon + 1);
  }
  if (out.host.empty()) return bad("no host");
  if (port.empty()) return bad("no port");
  int value = 0;
  auto [p, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (ec != std::errc() || p != port.data() + port.size()) {
    return bad("port '" + port + "' is not a number");
  }
  if (value < 1 || value > 65535) return bad("port " + port + " is out of range 1-65535");
  out.port = std::to_string(value);
  out.name = e;
  return out;
}

void EndpointRotation::markSilent(size_t i, Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  silent_until_[i] = now + silence_;
}

void EndpointRotation::markAnswered(size_t i) {
  std::lock_guard<std::mutex> lock(mutex_);
  silent_until_[i] = Clock::time_point{};
}

size_t EndpointRotation::next(size_t from, Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  const size_t n = silent_until_.size();
  for (size_t k = 1; k <= n; ++k) {
    const size_t c = (from + k) % n;
    if (silent_until_[c] <= now) return c;
  }
  return (from + 1) % n;
}

size_t EndpointRotation::answering(Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t n = 0;
  for (const auto& t : silent_until_) n += t <= now ? 1 : 0;
  return std::max<size_t>(n, 1);
}

}  // namespace etcd

Result<std::vector<std::string>> parseEtcdEndpoints(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t comma = text.find(',', start);
    std::string entry =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    auto ep = etcd::parseEtcdEndpoint(entry);
    if (!ep.isOk()) {
      if (entry.empty() && !text.empty()) {
        return invalidArgument("bad etcd endpoint list '" + text + "': empty entry " +
                               std::to_string(out.size() + 1) +
                               " (expected host:port[,host:port...])");
      }
      return ep.status();
    }
    out.push_back(ep.value().name);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace cpprun::rendezvous
