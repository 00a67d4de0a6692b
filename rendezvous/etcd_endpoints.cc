#include "rendezvous/etcd_endpoints.h"

#include <algorithm>

#include "common/network_address.h"
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
  AddressSyntax syntax;
  syntax.min_port = 1;
  auto address = parseNetworkAddress(e, syntax);
  if (!address.isOk()) {
    return invalidArgument("bad etcd endpoint " + address.status().message() +
                           " (expected host:port, e.g. 127.0.0.1:2379)");
  }
  Endpoint out;
  out.host = address.value().host;
  out.port = std::to_string(address.value().port);
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
