// etcdStoreConnector (etcd_connector.h).
#include "agent/etcd_connector.h"

#include "rendezvous/etcd_client.h"
#include "rendezvous/etcd_store.h"

namespace cpprun::agent {

StoreConnector etcdStoreConnector(const EtcdConnectorOptions& options) {
  std::string list;
  for (const std::string& e : options.endpoints) list += (list.empty() ? "" : ",") + e;
  const std::string address = std::string(options.tls ? "https://" : "http://") + list;
  StoreConnector connector;
  connector.where = "etcd at " + address;
  connector.server = "etcd at " + address;
  connector.connect = [options](std::chrono::milliseconds connect_timeout,
                                std::chrono::milliseconds request_timeout) {
    rendezvous::EtcdClientOptions o;
    o.endpoints = options.endpoints;
    o.tls = options.tls;
    o.tls_files = {options.ca_file, options.cert_file, options.key_file};
    o.connect_timeout = connect_timeout;
    o.request_timeout = request_timeout;
    auto client = rendezvous::EtcdClient::connect(o);
    if (!client.isOk()) {
      const Status& s = client.status();
      // Nothing answers (yet): the caller retries until its join timeout. A bad file or a
      // refused certificate does not mend by waiting.
      if (s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kTimeout) {
        throw rendezvous::StoreTimeout(s.message());
      }
      throw rendezvous::StoreError(s.message());
    }
    auto store = std::make_unique<rendezvous::EtcdStore>(
        std::shared_ptr<rendezvous::EtcdClient>(std::move(client).value()),
        "/cpprun/" + options.run_id + "/");
    store->setTimeout(request_timeout);
    return std::unique_ptr<rendezvous::Store>(std::move(store));
  };
  return connector;
}

}  // namespace cpprun::agent
