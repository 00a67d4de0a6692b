#include "launcher/rendezvous_settings.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <utility>
#include <vector>

#include "common/clip.h"
#include "common/network_address.h"
#include "rendezvous/etcd_client.h"
#include "rendezvous/store_auth.h"

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
    return invalidArgument("--rdzv-conf " + key + "=" + clipValue(it->second) +
                           ": expected a positive number of seconds (at most 1e7)");
  }
  return std::chrono::milliseconds(static_cast<int64_t>(std::llround(seconds * 1000)));
}

// --rdzv-endpoint for etcd: "host[:port][,host[:port]...]", an entry without a port gets 2379.
Result<std::vector<std::string>> etcdEndpoints(const std::string& text) {
  if (text.empty()) {
    return invalidArgument(
        "--rdzv-endpoint: the etcd backend needs etcd's endpoints "
        "(HOST[:PORT][,HOST[:PORT]...], port " +
        std::to_string(kDefaultEtcdPort) + " by default)");
  }
  std::string with_ports;
  size_t begin = 0;
  while (true) {
    const size_t comma = text.find(',', begin);
    std::string entry = text.substr(begin, comma == std::string::npos ? comma : comma - begin);
    std::string bare = entry;
    for (const char* scheme : {"http://", "https://"}) {
      if (bare.rfind(scheme, 0) == 0) bare = bare.substr(std::strlen(scheme));
    }
    while (!bare.empty() && bare.back() == '/') bare.pop_back();
    // An entry that does not parse stays as given: parseEtcdEndpoints names what is wrong.
    AddressSyntax syntax;
    syntax.default_port = kDefaultEtcdPort;
    if (auto address = parseNetworkAddress(bare, syntax); address.isOk()) {
      entry = address.value().toString();
    }
    with_ports += (begin == 0 ? "" : ",") + entry;
    if (comma == std::string::npos) break;
    begin = comma + 1;
  }
  auto parsed = rendezvous::parseEtcdEndpoints(with_ports);
  if (!parsed.isOk()) {
    return invalidArgument("--rdzv-endpoint " + clipValue(text) + ": " +
                           clipValue(parsed.status().message(), 4 * kClipKeep));
  }
  return parsed.value();
}

// --rdzv-conf protocol, cacert, cert, key (the etcd backend).
Status applyEtcdConf(const LaunchConfig& config, RendezvousSettings& s) {
  const auto conf = [&](const char* key) {
    auto it = config.rdzv_conf.find(key);
    return it == config.rdzv_conf.end() ? std::string() : it->second;
  };
  const std::string protocol = conf("protocol");
  if (!protocol.empty() && protocol != "http" && protocol != "https") {
    return invalidArgument("--rdzv-conf protocol=" + clipValue(protocol) +
                           ": expected http or https");
  }
  s.etcd_tls = protocol == "https";
  s.etcd_cacert = conf("cacert");
  s.etcd_cert = conf("cert");
  s.etcd_key = conf("key");
  for (const auto& [key, file] : {std::pair<const char*, std::string>{"cacert", s.etcd_cacert},
                                  {"cert", s.etcd_cert},
                                  {"key", s.etcd_key}}) {
    if (file.empty()) continue;
    if (!s.etcd_tls) {
      return invalidArgument(std::string("--rdzv-conf ") + key + "=" + clipValue(file) +
                             ": only used with protocol=https");
    }
    if (::access(file.c_str(), R_OK) != 0) {
      return invalidArgument(std::string("--rdzv-conf ") + key + "=" + clipValue(file) + ": " +
                             std::strerror(errno));
    }
  }
  if (s.etcd_cert.empty() != s.etcd_key.empty()) {
    return invalidArgument(
        s.etcd_cert.empty() ? "--rdzv-conf key=" + clipValue(s.etcd_key) + ": needs cert as well"
                            : "--rdzv-conf cert=" + clipValue(s.etcd_cert) + ": needs key as well");
  }
  return Status::ok();
}

}  // namespace

bool isLocalHost(const std::string& host) {
  if (host.empty()) return false;  // resolveTcp would take it for the loopback
  auto resolved = resolveTcp(host, 0);
  if (!resolved.isOk()) return false;
  ifaddrs* interfaces = nullptr;
  if (::getifaddrs(&interfaces) != 0) interfaces = nullptr;
  bool local = false;
  for (auto a = resolved.value().begin(); a != resolved.value().end() && !local; ++a) {
    if (a->family == AF_INET) {
      const in_addr addr = reinterpret_cast<const sockaddr_in*>(a->sockaddrPtr())->sin_addr;
      if ((ntohl(addr.s_addr) >> 24) == 127) local = true;
      for (ifaddrs* i = interfaces; i != nullptr && !local; i = i->ifa_next) {
        if (i->ifa_addr != nullptr && i->ifa_addr->sa_family == AF_INET &&
            reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr == addr.s_addr) {
          local = true;
        }
      }
    } else if (a->family == AF_INET6) {
      const in6_addr addr = reinterpret_cast<const sockaddr_in6*>(a->sockaddrPtr())->sin6_addr;
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
  return local;
}

Result<Endpoint> parseEndpoint(const std::string& text, int default_port) {
  AddressSyntax syntax;
  syntax.default_port = default_port;
  syntax.bare_ipv6_host = true;  // "fe80::1": a host without a port
  auto address = parseNetworkAddress(text, syntax);
  if (!address.isOk()) return invalidArgument("endpoint " + address.status().message());
  return address;
}

Result<RendezvousSettings> resolveRendezvous(const LaunchConfig& config) {
  RendezvousSettings s;
  s.nnodes = config.max_nodes;
  s.node_rank = config.node_rank;
  s.etcd = config.rdzv_backend == "etcd" || config.rdzv_backend == "etcd-v2";
  // etcd: even a job of one node meets in etcd (as torchrun's does), rather than taking the
  // endpoint list for its own store's address.
  s.multi_node = config.max_nodes > 1 || s.etcd;
  s.elastic = s.multi_node && (config.rdzv_backend == "c10d" || s.etcd);
  // torchrun's static rendezvous takes MAX as the world size and ignores MIN
  // (static_tcp_rendezvous.py: world_size = params.max_nodes): --nnodes 1:2 waits for 2 nodes.
  s.min_nodes = s.elastic ? config.min_nodes : config.max_nodes;
  if (!s.elastic && config.node_rank >= config.max_nodes) {
    return invalidArgument("--node-rank " + std::to_string(config.node_rank) +
                           " must be below --nnodes " + std::to_string(config.max_nodes));
  }
  const int default_port = config.master_port_given ? config.master_port
                           : s.elastic              ? kDefaultC10dPort
                           : s.multi_node           ? kDefaultMasterPort
                                                    : 0;
  if (s.etcd && s.multi_node) {
    auto endpoints = etcdEndpoints(config.rdzv_endpoint);
    if (!endpoints.isOk()) return endpoints.status();
    s.etcd_endpoints = endpoints.value();
    Status conf = applyEtcdConf(config, s);
    if (!conf.isOk()) return conf;
    // Every agent serves its workers' store on a free port of its own host.
    s.store.host = config.master_addr;
    s.store.port = 0;
  } else if (!config.rdzv_endpoint.empty() && !config.standalone) {
    auto e = parseEndpoint(config.rdzv_endpoint, default_port);
    if (!e.isOk()) return invalidArgument("--rdzv-endpoint: " + e.status().message());
    s.store = e.value();
  } else {
    s.store.host = config.master_addr;
    s.store.port = default_port;
  }
  if (s.store.host == "localhost" && !s.multi_node) s.store.host = "127.0.0.1";
  if (s.multi_node) {
    if (s.store.port == 0 && !s.etcd) {
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
  std::vector<std::string> known = {"keep_alive_max_attempt", "is_host", "store_legacy_numbering",
                                    "secret_file"};
  if (auto secret = config.rdzv_conf.find("secret_file"); secret != config.rdzv_conf.end()) {
    if (secret->second.empty()) return invalidArgument("--rdzv-conf secret_file= is empty");
    s.secret_file = secret->second;
  }
  if (s.etcd) known.insert(known.end(), {"protocol", "cacert", "cert", "key"});
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
      return invalidArgument("--rdzv-conf keep_alive_max_attempt=" + clipValue(it->second) +
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
      return invalidArgument("--rdzv-conf is_host=" + clipValue(v) + ": expected true or false");
    }
  }
  auto numbering = config.rdzv_conf.find("store_legacy_numbering");
  if (numbering != config.rdzv_conf.end()) {
    if (numbering->second == "2.1") {
      s.store_torch21_numbering = true;
    } else if (numbering->second != "1.13") {
      return invalidArgument("--rdzv-conf store_legacy_numbering=" + clipValue(numbering->second) +
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

Result<std::string> jobSecret(const std::map<std::string, std::string>& env,
                              const std::string& secret_file) {
  if (auto it = env.find(kSecretVariable); it != env.end() && !it->second.empty()) {
    if (Status s = rendezvous::checkJobSecret(it->second, std::string("$") + kSecretVariable);
        !s.isOk()) {
      return s;
    }
    return it->second;
  }
  if (secret_file.empty()) return std::string();
  Result<std::string> secret = rendezvous::readJobSecret(secret_file);
  if (!secret.isOk())
    return invalidArgument("--rdzv-conf secret_file: " + secret.status().message());
  return secret;
}

}  // namespace cpprun::launcher
