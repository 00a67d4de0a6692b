// The Store contract (store_contract.h) over the stores that need no etcd: MemoryStore,
// PrefixStore, and TcpStoreClient in both dialects against our real TCP server.
// tests/rendezvous/etcd_store_test.cc runs the same contract over EtcdStore.
#include <catch2/catch.hpp>

#include "rendezvous/memory_store.h"
#include "rendezvous/prefix_store.h"
#include "rendezvous/tcp_store_client.h"
#include "rendezvous/tcp_store_server.h"
#include "tests/rendezvous/store_contract.h"

namespace {

using namespace cpprun::rendezvous;
using cpprun::testing::StoreKinds;
using namespace std::chrono_literals;

// One TCP server and one MemoryStore per test case; every kind counts numKeys over the whole
// store (c10d), so a PrefixStore's "elsewhere" is the store beneath it under no prefix.
StoreKinds memoryAndTcpKinds() {
  auto started = BackgroundTcpStoreServer::start({});
  INFO(started.status().toString());
  REQUIRE(started.isOk());
  std::shared_ptr<BackgroundTcpStoreServer> server = std::move(started).value();
  auto memory = std::make_shared<MemoryStore>();
  auto tcp = [port = server->port()](wire::Dialect d) {
    return [port, d]() -> std::shared_ptr<Store> {
      TcpStoreClientOptions o;
      o.port = port;
      o.dialect = d;
      o.connect_timeout = 10s;
      o.timeout = 10s;
      return std::make_shared<TcpStoreClient>(o);
    };
  };
  auto memory_itself = [memory]() -> std::shared_ptr<Store> { return memory; };
  auto prefixed = [](std::string prefix, auto open_inner) {
    return [prefix, open_inner]() -> std::shared_ptr<Store> {
      return std::make_shared<PrefixStore>(prefix, open_inner());
    };
  };
  StoreKinds made;
  made.servers = server;
  made.kinds = {
      {"MemoryStore", memory_itself, prefixed("elsewhere", memory_itself)},
      {"PrefixStore(MemoryStore)", prefixed("job", memory_itself), memory_itself},
      {"TcpStoreClient torch>=2.2", tcp(wire::Dialect::kV2),
       prefixed("elsewhere", tcp(wire::Dialect::kV2))},
      {"TcpStoreClient torch<=2.0", tcp(wire::Dialect::kLegacy),
       prefixed("elsewhere", tcp(wire::Dialect::kLegacy))},
      {"PrefixStore(TcpStoreClient)", prefixed("p", tcp(wire::Dialect::kV2)),
       tcp(wire::Dialect::kV2)},
  };
  return made;
}

[[maybe_unused]] const bool kContractRegistered =
    cpprun::testing::registerStoreContract("", "[unit][integration]", &memoryAndTcpKinds);

}  // namespace
