// RendezvousSettings: where the job's store is and how long its agents wait for each other,
// resolved from the LaunchConfig (after scheduler discovery): --rdzv-endpoint (host[:port],
// IPv6 as [addr]:port) wins over --master-addr/--master-port; --rdzv-conf carries the bounds
// (join_timeout, keep_alive_interval, keep_alive_max_attempt, torchrun's names; seconds); with
// --rdzv-backend etcd/etcd-v2, --rdzv-endpoint lists etcd's endpoints and --rdzv-conf adds
// protocol (http|https), cacert, cert and key.
// Errors name the flag and the bad value (the caller exits 2).
// Thread safety: pure functions on values.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "common/network_address.h"
#include "common/status.h"
#include "launcher/launch_config.h"

namespace cpprun::launcher {

// The store's address (common/network_address.h: toString() brackets an IPv6 host).
using Endpoint = NetworkAddress;

// "host", "host:port", "[v6]", "[v6]:port", a bare IPv6 address ("fe80::1"); `default_port`
// when the port is left out. The error names the text: "endpoint 'n1:x': port 'x' is not a
// number".
Result<Endpoint> parseEndpoint(const std::string& text, int default_port);

struct RendezvousSettings {
  bool multi_node = false;  // more than one agent
  int nnodes = 1;
  int node_rank = 0;
  Endpoint store;         // the workers' MASTER_ADDR:MASTER_PORT and the agents' meeting place
  std::string bind_host;  // where node 0's store listens (empty: store.host)
  std::chrono::milliseconds join_timeout{std::chrono::seconds(600)};
  std::chrono::milliseconds keep_alive_interval{std::chrono::seconds(5)};
  int keep_alive_max_attempt = 3;
  // Elastic (--rdzv-backend c10d with several nodes): min..max agents per round.
  bool elastic = false;
  int min_nodes = 1;
  std::chrono::milliseconds last_call_timeout{std::chrono::seconds(30)};
  // How long the store host keeps serving after the job's outcome for the others to read it.
  std::chrono::milliseconds close_timeout{std::chrono::seconds(10)};
  // Elastic: who serves the store. kAuto: the first agent on the endpoint's host to bind it.
  enum class StoreHosting { kAuto, kAlways, kNever };
  StoreHosting store_hosting = StoreHosting::kAuto;
  // --rdzv-conf store_legacy_numbering=2.1: the agent's store reads every client without the
  // torch >= 2.2 handshake as torch 2.1 (default 1.13: see docs/protocol.md, torch 2.1 clients).
  bool store_torch21_numbering = false;
  std::vector<std::string> ignored_conf_keys;  // --rdzv-conf keys cpprun does not use
  // --rdzv-conf secret_file=PATH: the job's secret (jobSecret; docs/security.md).
  std::string secret_file;
  // --rdzv-backend etcd / etcd-v2: the agents meet in etcd (elastic rounds, min..max nodes;
  // --nnodes N is a round of exactly N), every agent serves a workers' store, and each round's
  // node 0's is MASTER_ADDR:MASTER_PORT. `store` is then unused.
  bool etcd = false;
  std::vector<std::string> etcd_endpoints;       // --rdzv-endpoint, "host:port" (default port 2379)
  bool etcd_tls = false;                         // --rdzv-conf protocol=https
  std::string etcd_cacert, etcd_cert, etcd_key;  // --rdzv-conf cacert, cert, key
};

// torchrun's default ports when a multi-node job names none: static, and c10d's endpoint.
inline constexpr int kDefaultMasterPort = 29500;
inline constexpr int kDefaultC10dPort = 29400;
inline constexpr int kDefaultEtcdPort = 2379;

// True when `host` names this machine: a loopback address, or an address of one of its
// interfaces (after resolving a name).
bool isLocalHost(const std::string& host);

Result<RendezvousSettings> resolveRendezvous(const LaunchConfig& config);

// The job's secret, which the agents prove to the store host and it to them
// (rendezvous/store_auth.h): $CPPRUN_RDZV_SECRET from `env` when set, else the contents of
// `secret_file` (--rdzv-conf secret_file; a regular file of this user's, mode 0600 or stricter),
// else none (""). Reads the file. An error names the variable or the file (exit 2).
inline constexpr const char* kSecretVariable = "CPPRUN_RDZV_SECRET";
Result<std::string> jobSecret(const std::map<std::string, std::string>& env,
                              const std::string& secret_file);

}  // namespace cpprun::launcher
