#include "launcher/rendezvous_settings.h"

#include <catch2/catch.hpp>

using namespace cpprun::launcher;

TEST_CASE("endpoints: host, host:port, IPv6 in brackets, bad ports named", "[unit]") {
  CHECK(parseEndpoint("n1", 7).value().host == "n1");
  CHECK(parseEndpoint("n1", 7).value().port == 7);
  CHECK(parseEndpoint("n1:29400", 7).value().port == 29400);
  CHECK(parseEndpoint("[::1]:5000", 7).value().host == "::1");
  CHECK(parseEndpoint("[::1]:5000", 7).value().port == 5000);
  CHECK(parseEndpoint("[fe80::1]", 7).value().port == 7);
  CHECK(parseEndpoint("fe80::1", 7).value().host == "fe80::1");
  CHECK_THAT(parseEndpoint("n1:http", 7).status().message(), Catch::Contains("'http'"));
  CHECK_THAT(parseEndpoint("n1:70000", 7).status().message(), Catch::Contains("0-65535"));
  CHECK_THAT(parseEndpoint("[::1", 7).status().message(), Catch::Contains("without ']'"));
  CHECK_THAT(parseEndpoint(":5", 7).status().message(), Catch::Contains("no host"));
  CHECK_THAT(parseEndpoint("n1:", 7).status().message(), Catch::Contains("empty port"));
}

TEST_CASE("one node: loopback and a kernel-picked port unless one is given", "[unit]") {
  LaunchConfig c;
  auto s = resolveRendezvous(c).value();
  CHECK_FALSE(s.multi_node);
  CHECK(s.store.host == "127.0.0.1");
  CHECK(s.store.port == 0);
  CHECK(s.bind_host.empty());
  c.master_port = 4242;
  c.master_port_given = true;
  CHECK(resolveRendezvous(c).value().store.port == 4242);
}

TEST_CASE("several nodes: torchrun's port, every interface, the endpoint wins", "[unit]") {
  LaunchConfig c;
  c.min_nodes = c.max_nodes = 3;
  c.node_rank = 2;
  c.master_addr = "10.0.0.1";
  auto s = resolveRendezvous(c).value();
  CHECK(s.multi_node);
  CHECK(s.nnodes == 3);
  CHECK(s.store.host == "10.0.0.1");
  CHECK(s.store.port == kDefaultMasterPort);
  CHECK(s.bind_host == "0.0.0.0");
  c.rdzv_endpoint = "head:1234";
  s = resolveRendezvous(c).value();
  CHECK(s.store.host == "head");
  CHECK(s.store.port == 1234);
  c.rdzv_endpoint = "[fd00::1]:99";
  CHECK(resolveRendezvous(c).value().bind_host == "::");
}

TEST_CASE("rendezvous bounds come from --rdzv-conf and bad ones are named", "[unit]") {
  LaunchConfig c;
  c.min_nodes = c.max_nodes = 2;
  c.rdzv_conf = {
      {"join_timeout", "30"}, {"keep_alive_interval", "0.5"}, {"keep_alive_max_attempt", "4"}};
  auto s = resolveRendezvous(c).value();
  CHECK(s.join_timeout == std::chrono::seconds(30));
  CHECK(s.keep_alive_interval == std::chrono::milliseconds(500));
  CHECK(s.keep_alive_max_attempt == 4);
  c.rdzv_conf = {{"join_timeout", "soon"}};
  CHECK_THAT(resolveRendezvous(c).status().message(), Catch::Contains("join_timeout=soon"));
  c.rdzv_conf = {{"keep_alive_max_attempt", "0"}};
  CHECK_THAT(resolveRendezvous(c).status().message(), Catch::Contains("keep_alive_max_attempt=0"));
}

TEST_CASE("a static --nnodes MIN:MAX waits for MAX nodes, as torchrun's static rendezvous",
          "[unit]") {
  LaunchConfig c;
  c.min_nodes = 1;
  c.max_nodes = 2;
  c.node_rank = 1;
  auto s = resolveRendezvous(c).value();
  CHECK(s.multi_node);
  CHECK_FALSE(s.elastic);
  CHECK(s.nnodes == 2);
  CHECK(s.min_nodes == 2);  // torchrun: world_size = max_nodes, MIN unused
  CHECK(s.node_rank == 1);
  CHECK(s.store.host == "127.0.0.1");
  CHECK(s.store.port == kDefaultMasterPort);
  c.node_rank = 2;
  CHECK_THAT(resolveRendezvous(c).status().message(), Catch::Contains("must be below --nnodes 2"));
}

TEST_CASE("inconsistent multi-node settings are refused", "[unit]") {
  LaunchConfig c;
  c.min_nodes = 1;
  c.max_nodes = 4;
  c.rdzv_backend = "c10d";
  auto elastic = resolveRendezvous(c).value();
  CHECK(elastic.elastic);
  CHECK(elastic.min_nodes == 1);
  CHECK(elastic.nnodes == 4);
  CHECK(elastic.store.port == kDefaultC10dPort);
  c.rdzv_backend = "static";
  c.min_nodes = 4;
  c.node_rank = 4;
  CHECK_THAT(resolveRendezvous(c).status().message(), Catch::Contains("must be below"));
  c.node_rank = 0;
  c.master_port = 0;
  c.master_port_given = true;
  CHECK_THAT(resolveRendezvous(c).status().message(), Catch::Contains("port is 0"));
}

TEST_CASE("elastic settings: last call, close timeout, store hosting, unknown keys", "[unit]") {
  LaunchConfig c;
  c.min_nodes = 2;
  c.max_nodes = 3;
  c.rdzv_backend = "c10d";
  c.rdzv_conf = {{"last_call_timeout", "2"},
                 {"close_timeout", "3"},
                 {"heartbeat", "0.25"},
                 {"is_host", "false"},
                 {"timeout", "9"}};
  auto s = resolveRendezvous(c).value();
  CHECK(s.last_call_timeout == std::chrono::seconds(2));
  CHECK(s.close_timeout == std::chrono::seconds(3));
  CHECK(s.keep_alive_interval == std::chrono::milliseconds(250));
  CHECK(s.store_hosting == RendezvousSettings::StoreHosting::kNever);
  CHECK(s.ignored_conf_keys == std::vector<std::string>{"timeout"});
  c.rdzv_conf = {{"is_host", "perhaps"}};
  CHECK_THAT(resolveRendezvous(c).status().message(), Catch::Contains("is_host=perhaps"));
}

TEST_CASE("rdzv-conf store_legacy_numbering picks how the store reads old clients", "[unit]") {
  LaunchConfig c;
  CHECK_FALSE(resolveRendezvous(c).value().store_torch21_numbering);
  c.rdzv_conf = {{"store_legacy_numbering", "2.1"}};
  auto s = resolveRendezvous(c).value();
  CHECK(s.store_torch21_numbering);
  CHECK(s.ignored_conf_keys.empty());
  c.rdzv_conf = {{"store_legacy_numbering", "1.13"}};
  CHECK_FALSE(resolveRendezvous(c).value().store_torch21_numbering);
  c.rdzv_conf = {{"store_legacy_numbering", "2.0"}};
  CHECK_THAT(resolveRendezvous(c).status().message(),
             Catch::Contains("store_legacy_numbering=2.0: expected 1.13 or 2.1"));
}

TEST_CASE("local hosts: loopback and this machine's addresses, not others", "[unit]") {
  CHECK(isLocalHost("127.0.0.1"));
  CHECK(isLocalHost("localhost"));
  CHECK(isLocalHost("::1"));
  CHECK_FALSE(isLocalHost("192.0.2.1"));  // TEST-NET-1: never assigned here
  CHECK_FALSE(isLocalHost("no-such-host.invalid"));
}

TEST_CASE("etcd settings: endpoints with the default port and TLS keys, bad ones named", "[unit]") {
  LaunchConfig c;
  c.min_nodes = 2;
  c.max_nodes = 3;
  c.rdzv_backend = "etcd-v2";
  c.rdzv_endpoint = "e1,e2:2380,http://e3:12/";
  auto s = resolveRendezvous(c).value();
  CHECK(s.etcd);
  CHECK(s.elastic);
  CHECK(s.min_nodes == 2);
  CHECK(s.etcd_endpoints == std::vector<std::string>{"e1:2379", "e2:2380", "e3:12"});
  CHECK_FALSE(s.etcd_tls);
  c.rdzv_backend = "etcd";
  c.min_nodes = 3;
  CHECK(resolveRendezvous(c).value().elastic);  // --nnodes 3: rounds of exactly 3

  c.rdzv_endpoint = "";
  CHECK_THAT(resolveRendezvous(c).status().message(),
             Catch::Contains("--rdzv-endpoint") && Catch::Contains("2379"));
  c.rdzv_endpoint = "e1,,e2";
  CHECK_THAT(resolveRendezvous(c).status().message(), Catch::Contains("--rdzv-endpoint e1,,e2"));
  c.rdzv_endpoint = "e1:99999";
  CHECK_THAT(resolveRendezvous(c).status().message(), Catch::Contains("e1:99999"));

  c.rdzv_endpoint = "e1";
  c.rdzv_conf = {{"protocol", "ftp"}};
  CHECK_THAT(resolveRendezvous(c).status().message(),
             Catch::Contains("--rdzv-conf protocol=ftp") && Catch::Contains("http or https"));
  c.rdzv_conf = {{"protocol", "https"}, {"cacert", "/nonexistent/ca.pem"}};
  CHECK_THAT(resolveRendezvous(c).status().message(),
             Catch::Contains("--rdzv-conf cacert=/nonexistent/ca.pem"));
  c.rdzv_conf = {{"cacert", "/etc/hostname"}};
  CHECK_THAT(resolveRendezvous(c).status().message(), Catch::Contains("protocol=https"));
  c.rdzv_conf = {{"protocol", "https"}, {"cert", "/etc/hostname"}};
  CHECK_THAT(resolveRendezvous(c).status().message(),
             Catch::Contains("cert=/etc/hostname") && Catch::Contains("needs key"));
  c.rdzv_conf = {{"protocol", "https"},
                 {"cacert", "/etc/hostname"},
                 {"cert", "/etc/hostname"},
                 {"key", "/etc/hostname"},
                 {"join_timeout", "5"}};
  s = resolveRendezvous(c).value();
  CHECK(s.etcd_tls);
  CHECK(s.etcd_cacert == "/etc/hostname");
  CHECK(s.join_timeout == std::chrono::seconds(5));
  CHECK(s.ignored_conf_keys.empty());
}
