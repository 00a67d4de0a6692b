// tcpStoreConnector (job_coordinator.h): the coordination seam over cpprun's TCP store.
#include "agent/coordination/job_coordinator.h"
#include "common/network_address.h"
#include "rendezvous/tcp_store_client.h"

namespace cpprun::agent {

StoreConnector tcpStoreConnector(const std::string& host, int port, const std::string& server_name,
                                 const std::string& secret) {
  const std::string address = formatHostPort(host, port);
  StoreConnector connector;
  connector.where = "the job's store at " + address + " (served by the store host's agent)";
  connector.server = server_name + " at " + address;
  connector.connect = [host, port, secret](std::chrono::milliseconds connect_timeout,
                                           std::chrono::milliseconds request_timeout) {
    rendezvous::TcpStoreClientOptions o;
    o.host = host;
    o.port = static_cast<uint16_t>(port);
    o.connect_timeout = connect_timeout;
    o.timeout = request_timeout;
    o.secret = secret;
    // Agents usually start within moments of each other: retry often, so node 0 coming up a
    // little later costs milliseconds, not a second of backoff.
    o.initial_backoff = std::chrono::milliseconds(5);
    o.max_backoff = std::chrono::milliseconds(100);
    return std::unique_ptr<rendezvous::Store>(std::make_unique<rendezvous::TcpStoreClient>(o));
  };
  return connector;
}

}  // namespace cpprun::agent
