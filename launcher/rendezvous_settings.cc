#include "launcher/rendezvous_settings.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <utility>
#include <vector>

namespace cpprun::launcher {

namespace {

Result<std::chrono::milliseconds> confSeconds(const LaunchConfig& config, const std::string& key,
                                              std::chrono::milliseconds fallback) {
  auto it = config.rdzv_conf.find(key);
  if (it == config.rdzv_conf.end()) return fallback;
  char* end = nullptr;
  const double seconds = std::strtod(it->second.c_str(), &end);
  if (end == it->second.c_str() || *end != '\0' || !std::isfinite(seconds) || seconds <= 0 ||
      seconds > 1e7) {
    return invalidArgument("--rdzv-conf " + key + "=" + it->second +
                           ": expected a positive number of seconds");
  }
  return std::chrono::milliseconds(static_cast<int64_t>(std::llround(seconds * 1000)));
}

bool isIpv6Literal(const std::string& host) { return host.find(':') != std::string::npos; }

}  // namespace

bool isLocalHost(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* resolved = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &resolved) != 0) return false;
  ifaddrs* interfaces = nullptr;
  if (::getifaddrs(&interfaces) != 0) interfaces = nullptr;
  bool local = false;
  for (addrinfo* a = resolved; a != nullptr && !local; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      const in_addr addr = reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr;
      if ((ntohl(addr.s_addr) >> 24) == 127) local = true;
      for (ifaddrs* i = interfaces; i != nullptr && !local; i = i->ifa_next) {
        if (i->ifa_addr != nullptr && i->ifa_addr->sa_family == AF_INET &&
            reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr == addr.s_addr) {
          local = true;
        }
      }
    } else if (a->ai_family == AF_INET6) {
      const in6_addr addr = reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr;
      if (IN6_IS_ADDR_LOOPBACK(&addr)) local = true;
      for (ifaddrs* i = interfaces; i != nullptr && !local; i = i->ifa_next) {
        if (i->ifa_addr != nullptr && i->ifa_addr->sa_family == AF_INET6 &&
            std::memcmp(&reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr, &addr,
                        sizeof addr) == 0) {
          local = true;
        }
      }
    }
  }
  if (interfaces != nullptr) ::freeifaddrs(interfaces);
  ::freeaddrinfo(resolved);
  return local;
}

Result<Endpoint> parseEndpoint(const std::string& text, int default_port) {
  Endpoint e;
  std::string port_text;
  if (!text.empty() && text[0] == '[') {
    const size_t close = text.find(']');
    if (close == std::string::npos) {
      return invalidArgument("endpoint '" + text + "': '[' without ']'");
    }
    e.host = text.substr(1, close - 1);
    if (close + 1 < text.size()) {
      if (text[close + 1] != ':') {
        return invalidArgument("endpoint '" + text + "': expected ':PORT' after ']'");
      }
      port_text = text.substr(close + 2);
      if (port_text.empty()) return invalidArgument("endpoint '" + text + "': empty port");
    }
  } else {
    const size_t colon = text.rfind(':');
    if (colon != std::string::npos && text.find(':') != colon) {
      e.host = text;  // a bare IPv6 address: no port
    } else if (colon != std::string::npos) {
      e.host = text.substr(0, colon);
      port_text = text.substr(colon + 1);
      if (port_text.empty()) return invalidArgument("endpoint '" + text + "': empty port");
    } else {
      e.host = text;
    }
  }
  if (e.host.empty()) return invalidArgument("endpoint '" + text + "': no host");
  e.port = default_port;
  if (!port_text.empty()) {
    char* end = nullptr;
    const long port = std::strtol(port_text.c_str(), &end, 10);
    if (*end != '\0' || port < 0 || port > 65535) {
      return invalidArgument("endpoint '" + text + "': port '" + port_text +
                             "' is not a number in 0-65535");
    }
    e.port = static_cast<int>(port);
  }
  return e;
}

Result<RendezvousSettings> resolveRendezvous(const LaunchConfig& config) {
  RendezvousSettings s;
  s.nnodes = config.max_nodes;
  s.min_nodes = config.min_nodes;
  s.node_rank = config.node_rank;
  s.multi_node = config.max_nodes > 1;
  s.elastic = s.multi_node && config.rdzv_backend == "c10d";
  if (s.multi_node && !s.elastic && config.min_nodes != config.max_nodes) {
    return invalidArgument("--nnodes " + std::to_string(config.min_nodes) + ":" +
                           std::to_string(config.max_nodes) +
                           ": a node range needs the elastic rendezvous (--rdzv-backend c10d); "
                           "the static one has a fixed number of nodes");
  }
  if (!s.elastic && config.node_rank >= config.max_nodes) {
    return invalidArgument("--node-rank " + std::to_string(config.node_rank) +
                           " must be below --nnodes " + std::to_string(config.max_nodes));
  }
  const int default_port = config.master_port_given ? config.master_port
                           : s.elastic              ? kDefaultC10dPort
                           : s.multi_node           ? kDefaultMasterPort
                                                    : 0;
  if (!config.rdzv_endpoint.empty() && !config.standalone) {
    auto e = parseEndpoint(config.rdzv_endpoint, default_port);
    if (!e.isOk()) return invalidArgument("--rdzv-endpoint: " + e.status().message());
    s.store = e.value();
  } else {
    s.store.host = config.master_addr;
    s.store.port = default_port;
  }
  if (s.store.host == "localhost" && !s.multi_node) s.store.host = "127.0.0.1";
  if (s.multi_node) {
    if (s.store.port == 0) {
      return invalidArgument(
          "the store port is 0: the nodes of a multi-node job must know it "
          "in advance (--master-port or --rdzv-endpoint HOST:PORT)");
    }
    // Node 0 serves every node: listen on every interface, as torch's TCPStore does.
    s.bind_host = isIpv6Literal(s.store.host) ? "::" : "0.0.0.0";
  }
  // Durations, in seconds. "heartbeat" is another name for the keep-alive interval (the later
  // entry wins when both are given).
  const std::pair<const char*, std::chrono::milliseconds*> durations[] = {
      {"join_timeout", &s.join_timeout},
      {"last_call_timeout", &s.last_call_timeout},
      {"close_timeout", &s.close_timeout},
      {"heartbeat", &s.keep_alive_interval},
      {"keep_alive_interval", &s.keep_alive_interval}};
  std::vector<std::string> known = {"keep_alive_max_attempt", "is_host", "store_legacy_numbering"};
  for (const auto& [key, field] : durations) {
    auto value = confSeconds(config, key, *field);
    if (!value.isOk()) return value.status();
    *field = value.value();
    known.push_back(key);
  }
  auto it = config.rdzv_conf.find("keep_alive_max_attempt");
  if (it != config.rdzv_conf.end()) {
    char* end = nullptr;
    const long n = std::strtol(it->second.c_str(), &end, 10);
    if (*end != '\0' || n < 1 || n > 1000) {
      return invalidArgument("--rdzv-conf keep_alive_max_attempt=" + it->second +
                             ": expected an integer in 1-1000");
    }
    s.keep_alive_max_attempt = static_cast<int>(n);
  }
  auto is_host = config.rdzv_conf.find("is_host");
  if (is_host != config.rdzv_conf.end()) {
    const std::string& v = is_host->second;
    if (v == "1" || v == "true" || v == "True" || v == "yes") {
      s.store_hosting = RendezvousSettings::StoreHosting::kAlways;
    } else if (v == "0" || v == "false" || v == "False" || v == "no") {
      s.store_hosting = RendezvousSettings::StoreHosting::kNever;
    } else {
      return invalidArgument("--rdzv-conf is_host=" + v + ": expected true or false");
    }
  }
  auto numbering = config.rdzv_conf.find("store_legacy_numbering");
  if (numbering != config.rdzv_conf.end()) {
    if (numbering->second == "2.1") {
      s.store_torch21_numbering = true;
    } else if (numbering->second != "1.13") {
      return invalidArgument("--rdzv-conf store_legacy_numbering=" + numbering->second +
                             ": expected 1.13 or 2.1");
    }
  }
  for (const auto& entry : config.rdzv_conf) {
    if (std::find(known.begin(), known.end(), entry.first) == known.end()) {
      s.ignored_conf_keys.push_back(entry.first);
    }
  }
  return s;
}

}  // namespace cpprun::launcher
