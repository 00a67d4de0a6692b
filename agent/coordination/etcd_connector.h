// etcdStoreConnector: the coordination seam (job_coordinator.h's StoreConnector) over etcd v3,
// for --rdzv-backend etcd / etcd-v2. Every connection is an EtcdStore (rendezvous/etcd_store.h)
// with the job's keys under "/cpprun/<run id>/", so one etcd cluster serves many jobs.
//
// Connecting tries every endpoint, again and again with a growing pause (5 ms up to 100 ms),
// until one answers or connect_timeout passes; then it fails with StoreTimeout (the coordinator
// retries until the join timeout, saying what it waits for). It fails with StoreError at once
// for what retrying cannot mend (a TLS file that cannot be read, a certificate every endpoint
// refused). Its liveness is etcd's own (lease_liveness.h): a lease per agent and a watch of
// their deletions, on a client of its own.
//
// Thread safety: the returned connector's connect() may be called from any thread; each call
// opens its own client.
#pragma once

#include <string>
#include <vector>

#include "agent/coordination/job_coordinator.h"

namespace cpprun::agent {

struct EtcdConnectorOptions {
  std::vector<std::string> endpoints;  // "host:port", as parseEtcdEndpoints() returns them
  bool tls = false;                    // --rdzv-conf protocol=https
  std::string ca_file;                 // --rdzv-conf cacert
  std::string cert_file;               // --rdzv-conf cert
  std::string key_file;                // --rdzv-conf key
  std::string run_id;                  // keys live under "/cpprun/<run_id>/"
};

StoreConnector etcdStoreConnector(const EtcdConnectorOptions& options);

}  // namespace cpprun::agent
