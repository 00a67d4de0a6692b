// etcdStoreConnector (etcd_connector.h).
#include "agent/coordination/etcd_connector.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "agent/coordination/job_keys.h"
#include "agent/coordination/lease_liveness.h"
#include "rendezvous/etcd_client.h"
#include "rendezvous/etcd_store.h"

namespace cpprun::agent {

namespace {

// The coordinator roots the job's keys in its namespace ("cpprun/<run id>/", job_keys.h), as
// on the TCP store: the store's own prefix is etcd's root, so a job's keys are
// "/cpprun/<run id>/...".
constexpr const char* kEtcdRoot = "/";

// A client of the first endpoint that answers. Nothing answers (yet): try again, with a growing
// pause, until connect_timeout, as the TCP store's client does; a refused connection fails in
// microseconds and the caller would otherwise spin. Then StoreTimeout: the caller retries until
// its join timeout. A bad file or a refused certificate does not mend by waiting: StoreError at
// once.
std::shared_ptr<rendezvous::EtcdClient> connectClient(const EtcdConnectorOptions& options,
                                                      std::chrono::milliseconds connect_timeout,
                                                      std::chrono::milliseconds request_timeout) {
  rendezvous::EtcdClientOptions o;
  o.endpoints = options.endpoints;
  o.tls = options.tls;
  o.tls_files = {options.ca_file, options.cert_file, options.key_file};
  o.connect_timeout = connect_timeout;
  o.request_timeout = request_timeout;
  const auto give_up = std::chrono::steady_clock::now() + connect_timeout;
  auto pause = std::chrono::milliseconds(5);
  auto client = rendezvous::EtcdClient::connect(o);
  while (!client.isOk()) {
    const Status& s = client.status();
    if (s.code() != StatusCode::kUnavailable && s.code() != StatusCode::kTimeout) {
      throw rendezvous::StoreError(s.message());
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        give_up - std::chrono::steady_clock::now());
    if (left.count() <= 0) throw rendezvous::StoreTimeout(s.message());
    std::this_thread::sleep_for(std::min(pause, left));
    pause = std::min(pause * 2, std::chrono::milliseconds(100));
    client = rendezvous::EtcdClient::connect(o);
  }
  return std::shared_ptr<rendezvous::EtcdClient>(std::move(client).value());
}

}  // namespace

StoreConnector etcdStoreConnector(const EtcdConnectorOptions& options) {
  std::string list;
  for (const std::string& e : options.endpoints) list += (list.empty() ? "" : ",") + e;
  const std::string address = std::string(options.tls ? "https://" : "http://") + list;
  StoreConnector connector;
  connector.where = "etcd at " + address;
  connector.server = "etcd at " + address;
  connector.connect = [options](std::chrono::milliseconds connect_timeout,
                                std::chrono::milliseconds request_timeout) {
    auto store = std::make_unique<rendezvous::EtcdStore>(
        connectClient(options, connect_timeout, request_timeout), kEtcdRoot);
    store->setTimeout(request_timeout);
    return std::unique_ptr<rendezvous::Store>(std::move(store));
  };
  // Liveness by leases and a watch of deletions (lease_liveness.h), on a client of its own: its
  // keep-alive and a store request of the coordinator's never wait for each other. One interval
  // per request and endpoint: a renewal stuck on a silent member fails over within the TTL.
  connector.liveness = [options](const LivenessOptions& liveness) {
    return std::unique_ptr<MemberLiveness>(std::make_unique<LeaseLiveness>(
        connectClient(options, liveness.bound, std::min(liveness.interval, liveness.bound)),
        kEtcdRoot + namespacedKey(options.run_id, kAliveKeyPrefix), liveness,
        liveness.bound * static_cast<int>(std::max<size_t>(options.endpoints.size(), 1))));
  };
  return connector;
}

}  // namespace cpprun::agent
