// EtcdClient against real etcd clusters (tests/support/etcd_cluster.h): every operation, a real
// watch woken by another client, lease expiry, failover when the member in use dies, TLS with
// trusted and untrusted client certificates, and endpoint parsing. One timing case prints
// median latencies on a 3-member loopback cluster (reported, not asserted).
#include "rendezvous/etcd_client.h"

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <thread>

#include "tests/support/etcd_cluster.h"

namespace {

using namespace cpprun::rendezvous;
using cpprun::StatusCode;
using cpprun::testing::EtcdCluster;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

std::unique_ptr<EtcdClient> connectTo(const std::vector<std::string>& endpoints,
                                      std::chrono::milliseconds request_timeout = 5s) {
  EtcdClientOptions o;
  o.endpoints = endpoints;
  o.request_timeout = request_timeout;
  auto c = EtcdClient::connect(o);
  INFO(c.status().toString());
  REQUIRE(c.isOk());
  return std::move(c).value();
}

template <typename T>
T ok(cpprun::Result<T> r) {
  INFO(r.status().toString());
  REQUIRE(r.isOk());
  return std::move(r).value();
}

cpprun::testing::EtcdClusterOptions clusterOptions(int members, bool tls) {
  cpprun::testing::EtcdClusterOptions o;
  o.members = members;
  o.tls = tls;
  return o;
}

double msSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

TEST_CASE("etcd endpoints parse and a bad entry is named", "[etcd][unit]") {
  auto good = parseEtcdEndpoints("127.0.0.1:2379,http://h2:2380,https://h3:1/,[::1]:4");
  INFO(good.status().toString());
  REQUIRE(good.isOk());
  CHECK(good.value() == std::vector<std::string>{"127.0.0.1:2379", "h2:2380", "h3:1", "[::1]:4"});

  struct Bad {
    std::string text, named, why;
  };
  for (const Bad& bad : std::vector<Bad>{{"", "''", "empty"},
                                         {"host", "'host'", "no port"},
                                         {"host:99999", "'host:99999'", "out of range"},
                                         {"host:", "'host:'", "empty port"},
                                         {"host:abc", "'host:abc'", "not a number"},
                                         {"h:1,", "'h:1,'", "empty entry 2"},
                                         {"h:p,", "'h:p'", "not a number"},
                                         {"h:1,,h:2", "'h:1,,h:2'", "empty entry 2"},
                                         {"h:1,nope", "'nope'", "no port"}}) {
    auto r = parseEtcdEndpoints(bad.text);
    INFO("input '" << bad.text << "' -> " << r.status().toString());
    REQUIRE_FALSE(r.isOk());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK(r.status().message().find(bad.named) != std::string::npos);
    CHECK(r.status().message().find(bad.why) != std::string::npos);
  }
  EtcdClientOptions none;
  auto no_endpoints = EtcdClient::connect(none);
  REQUIRE_FALSE(no_endpoints.isOk());
  CHECK(no_endpoints.status().message().find("no etcd endpoints") != std::string::npos);
  // The client refuses them too, before any network traffic.
  EtcdClientOptions o;
  o.endpoints = {"127.0.0.1:2379", "bad:0"};
  auto c = EtcdClient::connect(o);
  REQUIRE_FALSE(c.isOk());
  CHECK(c.status().message().find("'bad:0'") != std::string::npos);
}

TEST_CASE("etcd client connect names every endpoint it could not reach", "[etcd]") {
  EtcdCluster cluster(clusterOptions(1, false));
  // A port nobody listens on: the member's peer port speaks no etcd client API on /version
  // either way, so take a client port of a killed member instead.
  std::string dead = cluster.endpoint(0);
  cluster.kill(0);
  EtcdClientOptions o;
  o.endpoints = {dead};
  o.connect_timeout = 1s;
  auto t0 = Clock::now();
  auto c = EtcdClient::connect(o);
  REQUIRE_FALSE(c.isOk());
  INFO(c.status().toString());
  CHECK(c.status().code() == StatusCode::kUnavailable);
  CHECK(c.status().message().find(dead) != std::string::npos);
  CHECK(c.status().message().find("refused") != std::string::npos);
  CHECK(msSince(t0) < 3000);
}

TEST_CASE("etcd client put get delete and prefix reads with binary values", "[etcd]") {
  EtcdCluster cluster(clusterOptions(1, false));
  auto a = connectTo(cluster.endpoints());
  auto b = connectTo(cluster.endpoints());

  int64_t r1 = ok(a->put("/t/k", "v"));
  CHECK(r1 > 0);
  int64_t r2 = ok(a->put("/t/k", "v2"));
  CHECK(r2 == r1 + 1);
  int64_t read_rev = 0;
  auto kv = ok(b->get("/t/k", &read_rev));
  REQUIRE(kv.has_value());
  CHECK(kv->value == "v2");
  CHECK(kv->key == "/t/k");
  CHECK(kv->version == 2);
  CHECK(kv->create_revision == r1);
  CHECK(kv->mod_revision == r2);
  CHECK(kv->lease == 0);
  CHECK(read_rev == r2);

  const std::string binary("\0\x01\xff\xfe\0z", 6);
  ok(a->put(std::string("/t/bin\xff\0", 8), binary));
  auto bin = ok(b->get(std::string("/t/bin\xff\0", 8)));
  REQUIRE(bin.has_value());
  CHECK(bin->value == binary);
  ok(a->put("/t/empty", ""));
  auto empty = ok(b->get("/t/empty"));
  REQUIRE(empty.has_value());
  CHECK(empty->value.empty());
  CHECK_FALSE(ok(b->get("/t/missing")).has_value());
  const std::string big(1 << 20, 'x');
  ok(a->put("/t/big", big));
  CHECK(ok(b->get("/t/big"))->value == big);

  ok(a->put("/t0", "outside"));  // shares the text prefix "/t" but not "/t/"
  auto all = ok(b->getPrefix("/t/"));
  std::vector<std::string> keys;
  for (const auto& e : all) keys.push_back(e.key);
  CHECK(keys ==
        std::vector<std::string>{"/t/big", std::string("/t/bin\xff\0", 8), "/t/empty", "/t/k"});
  CHECK(ok(b->countPrefix("/t/")) == 4);
  CHECK(ok(b->countPrefix("/nothing/")) == 0);

  CHECK(ok(a->deleteKey("/t/k")) == 1);
  CHECK(ok(a->deleteKey("/t/k")) == 0);
  CHECK_FALSE(ok(b->get("/t/k")).has_value());
  CHECK(ok(b->countPrefix("/t/")) == 3);
}

TEST_CASE("etcd client txn compares and runs the matching branch", "[etcd]") {
  EtcdCluster cluster(clusterOptions(1, false));
  auto c = connectTo(cluster.endpoints());

  // Create only when absent.
  EtcdTxn create;
  create.compare = {EtcdCompare::versionIs("/x", 0)};
  create.success = {EtcdOp::put("/x", "1")};
  create.failure = {EtcdOp::range("/x")};
  auto first = ok(c->txn(create));
  CHECK(first.succeeded);
  REQUIRE(first.responses.size() == 1);
  CHECK(first.responses[0].kind == EtcdOp::Kind::kPut);
  auto second = ok(c->txn(create));
  CHECK_FALSE(second.succeeded);
  REQUIRE(second.responses.size() == 1);
  REQUIRE(second.responses[0].kvs.size() == 1);
  CHECK(second.responses[0].kvs[0].value == "1");
  const int64_t mod = second.responses[0].kvs[0].mod_revision;
  CHECK(mod == first.revision);

  // Compare-and-swap on mod_revision: the stale one loses.
  EtcdTxn cas;
  cas.compare = {EtcdCompare::modRevisionIs("/x", mod)};
  cas.success = {EtcdOp::put("/x", "2"), EtcdOp::put("/y", "y")};
  CHECK(ok(c->txn(cas)).succeeded);
  CHECK_FALSE(ok(c->txn(cas)).succeeded);
  CHECK(ok(c->get("/x"))->value == "2");
  CHECK(ok(c->get("/y"))->value == "y");

  // Value compare, delete with prefix, several ranges in one snapshot.
  EtcdTxn by_value;
  by_value.compare = {EtcdCompare::valueIs("/x", "2")};
  by_value.success = {EtcdOp::range("/x"), EtcdOp::range("/y"), EtcdOp::range("/none")};
  auto read = ok(c->txn(by_value));
  CHECK(read.succeeded);
  REQUIRE(read.responses.size() == 3);
  CHECK(read.responses[0].kvs.at(0).value == "2");
  CHECK(read.responses[1].kvs.at(0).value == "y");
  CHECK(read.responses[2].kvs.empty());
  EtcdTxn not_equal;
  not_equal.compare = {EtcdCompare::valueIs("/x", "nope")};
  not_equal.failure = {EtcdOp::remove("/", true)};
  auto removed = ok(c->txn(not_equal));
  CHECK_FALSE(removed.succeeded);
  REQUIRE(removed.responses.size() == 1);
  CHECK(removed.responses[0].deleted == 2);
  CHECK(ok(c->countPrefix("/")) == 0);

  // etcd's own refusal comes back as an error naming the request, not as a failover.
  EtcdTxn duplicate;
  duplicate.success = {EtcdOp::put("/d", "1"), EtcdOp::put("/d", "2")};
  auto dup = c->txn(duplicate);
  REQUIRE_FALSE(dup.isOk());
  INFO(dup.status().toString());
  CHECK(dup.status().message().find("duplicate key") != std::string::npos);
  CHECK(dup.status().message().find("/v3/kv/txn") != std::string::npos);
}

TEST_CASE("etcd client watch wakes on a put by another client", "[etcd]") {
  EtcdCluster cluster(clusterOptions(1, false));
  auto watcher = connectTo(cluster.endpoints());
  auto writer = connectTo(cluster.endpoints());

  // The put is made only once etcd confirmed the watch, so the event must be pushed live.
  auto t0 = Clock::now();
  std::thread put_thread;
  cpprun::Status put_status;  // Catch's assertions belong to the test's own thread
  auto events = ok(watcher->watch("/w/key", false, 0, 20s, [&] {
    put_thread = std::thread([&] { put_status = writer->put("/w/key", "hello").status(); });
  }));
  const double waited = msSince(t0);
  REQUIRE(put_thread.joinable());
  put_thread.join();
  INFO(put_status.toString());
  REQUIRE(put_status.isOk());
  REQUIRE(events.size() == 1);
  CHECK(events[0].type == EtcdEvent::Type::kPut);
  CHECK(events[0].kv.key == "/w/key");
  CHECK(events[0].kv.value == "hello");
  CHECK(waited < 10000);  // woken by the event, not by the 20 s timeout

  // From a revision: a change already made is delivered at once; deletes carry their type.
  int64_t rev = 0;
  ok(writer->get("/w/key", &rev));
  ok(writer->deleteKey("/w/key"));
  auto deleted = ok(watcher->watch("/w/key", false, rev + 1, 20s));
  REQUIRE(deleted.size() == 1);
  CHECK(deleted[0].type == EtcdEvent::Type::kDelete);
  CHECK(deleted[0].kv.key == "/w/key");

  // A prefix watch sees keys under the prefix only.
  ok(writer->get("/w/", &rev));
  ok(writer->put("/wx", "outside"));
  ok(writer->put("/w/sub/a", "inside"));
  auto under = ok(watcher->watch("/w/", true, rev + 1, 20s));
  REQUIRE(under.size() == 1);
  CHECK(under[0].kv.key == "/w/sub/a");

  // Nothing happens: empty after the timeout, not before.
  auto quiet_t0 = Clock::now();
  auto none = ok(watcher->watch("/w/silent", false, 0, 300ms));
  CHECK(none.empty());
  CHECK(msSince(quiet_t0) >= 300);
  CHECK(msSince(quiet_t0) < 3000);
}

TEST_CASE("etcd client lease keeps a key alive until it expires or is revoked", "[etcd]") {
  EtcdCluster cluster(clusterOptions(1, false));
  auto c = connectTo(cluster.endpoints());

  const int64_t lease = ok(c->grantLease(2s));
  CHECK(lease != 0);
  ok(c->put("/l/alive", "1", lease));
  CHECK(ok(c->get("/l/alive"))->lease == lease);
  auto ttl = ok(c->keepAlive(lease));
  const auto renewed = Clock::now();
  CHECK(ttl >= 1s);
  CHECK(ttl <= 2s);

  // Expiry: the key disappears within TTL + 1 s of the last renewal (seen by a watch).
  int64_t rev = 0;
  ok(c->get("/l/alive", &rev));
  std::vector<EtcdEvent> events;
  while (events.empty() && msSince(renewed) < 10000) {
    events = ok(c->watch("/l/alive", false, rev + 1, 10s));
  }
  const double gone_after = msSince(renewed);
  REQUIRE(events.size() == 1);
  CHECK(events[0].type == EtcdEvent::Type::kDelete);
  WARN("leased key removed " << gone_after << " ms after the keep-alive (TTL " << ttl.count()
                             << " s)");
  CHECK(gone_after <= std::chrono::duration<double, std::milli>(ttl + 1s).count());
  CHECK_FALSE(ok(c->get("/l/alive")).has_value());
  auto expired = c->keepAlive(lease);
  REQUIRE_FALSE(expired.isOk());
  CHECK(expired.status().code() == StatusCode::kNotFound);
  CHECK(expired.status().message().find(std::to_string(lease)) != std::string::npos);

  // Revocation removes the key at once.
  const int64_t other = ok(c->grantLease(60s));
  ok(c->put("/l/revoked", "1", other));
  REQUIRE(c->revokeLease(other).isOk());
  CHECK_FALSE(ok(c->get("/l/revoked")).has_value());
  CHECK_FALSE(c->revokeLease(other).isOk());
  CHECK_FALSE(c->grantLease(0s).isOk());
}

TEST_CASE("etcd client fails over when the member in use is killed", "[etcd]") {
  EtcdCluster cluster(clusterOptions(3, false));
  // The member in use is the leader, the hard case: the next call also waits out an election.
  const int leader = cluster.waitForLeader(10s);
  REQUIRE(leader >= 0);
  std::vector<std::string> endpoints = {cluster.endpoint(leader)};
  for (int i = 0; i < 3; ++i) {
    if (i != leader) endpoints.push_back(cluster.endpoint(i));
  }
  auto c = connectTo(endpoints, 2s);
  ok(c->put("/f/a", "1"));
  const std::string in_use = c->currentEndpoint();
  int member = -1;
  for (int i = 0; i < 3; ++i) {
    if (cluster.endpoint(i) == in_use) member = i;
  }
  REQUIRE(member == leader);
  cluster.kill(member);

  auto t0 = Clock::now();
  ok(c->put("/f/b", "2"));
  const double failover_ms = msSince(t0);
  WARN("put after the member in use (the leader) was killed took " << failover_ms << " ms");
  CHECK(c->currentEndpoint() != in_use);
  CHECK(ok(c->get("/f/a"))->value == "1");
  CHECK(ok(c->get("/f/b"))->value == "2");
  // A watch started now goes to a live member too.
  int64_t rev = 0;
  ok(c->get("/f/b", &rev));
  ok(c->put("/f/b", "3"));
  auto events = ok(c->watch("/f/b", false, rev + 1, 10s));
  REQUIRE(events.size() == 1);
  CHECK(events[0].kv.value == "3");

  // Without a quorum every member fails, and the error says which were tried and why.
  int second = (member + 1) % 3;
  cluster.kill(second);
  auto no_quorum = c->put("/f/c", "4");
  REQUIRE_FALSE(no_quorum.isOk());
  INFO(no_quorum.status().toString());
  CHECK(no_quorum.status().code() == StatusCode::kUnavailable);
  for (int i = 0; i < 3; ++i) {
    CHECK(no_quorum.status().message().find(cluster.endpoint(i)) != std::string::npos);
  }
  CHECK(no_quorum.status().message().find("last error") != std::string::npos);
}

TEST_CASE("etcd client over TLS works with the cluster's client certificate", "[etcd]") {
  EtcdCluster cluster(clusterOptions(1, true));
  const auto files = cluster.clientTls();
  EtcdClientOptions o;
  o.endpoints = cluster.endpoints();
  o.tls = true;
  o.tls_files = {files.ca, files.cert, files.key};
  auto c = EtcdClient::connect(o);
  INFO(c.status().toString());
  REQUIRE(c.isOk());
  auto& client = *c.value();
  ok(client.put("/tls/k", "secret"));
  CHECK(ok(client.get("/tls/k"))->value == "secret");
  int64_t rev = 0;
  ok(client.get("/tls/k", &rev));
  ok(client.put("/tls/k", "again"));
  auto events = ok(client.watch("/tls/k", false, rev + 1, 10s));
  REQUIRE(events.size() == 1);
  CHECK(events[0].kv.value == "again");

  // Plain HTTP to a TLS member is refused with an error, not a hang.
  EtcdClientOptions plain;
  plain.endpoints = cluster.endpoints();
  plain.request_timeout = 2s;
  CHECK_FALSE(EtcdClient::connect(plain).isOk());
}

TEST_CASE("etcd client over TLS refuses an untrusted certificate with a clear error", "[etcd]") {
  EtcdCluster cluster(clusterOptions(1, true));
  const auto untrusted = cluster.untrustedClientTls();
  EtcdClientOptions o;
  o.endpoints = cluster.endpoints();
  o.tls = true;
  o.tls_files = {untrusted.ca, untrusted.cert, untrusted.key};
  auto t0 = Clock::now();
  auto c = EtcdClient::connect(o);
  REQUIRE_FALSE(c.isOk());
  INFO(c.status().toString());
  CHECK(c.status().message().find("TLS handshake failed") != std::string::npos);
  CHECK(c.status().message().find(cluster.endpoint(0)) != std::string::npos);
  CHECK(c.status().message().find(untrusted.cert) != std::string::npos);
  CHECK(msSince(t0) < 5000);

  // A server the client's CA did not sign: refused on the client's side.
  const auto good = cluster.clientTls();
  EtcdClientOptions wrong_ca = o;
  wrong_ca.tls_files = {"/etc/ssl/certs/ca-certificates.crt", good.cert, good.key};
  auto w = EtcdClient::connect(wrong_ca);
  REQUIRE_FALSE(w.isOk());
  INFO(w.status().toString());
  CHECK(w.status().message().find("TLS handshake failed") != std::string::npos);
  CHECK(w.status().message().find("certificate verify failed") != std::string::npos);

  // Files that are not there are named.
  EtcdClientOptions missing = o;
  missing.tls_files.ca_file = "/nonexistent/ca.pem";
  auto m = EtcdClient::connect(missing);
  REQUIRE_FALSE(m.isOk());
  CHECK(m.status().code() == StatusCode::kInvalidArgument);
  CHECK(m.status().message().find("/nonexistent/ca.pem") != std::string::npos);
}

TEST_CASE("etcd client median latencies on a 3-member loopback cluster", "[etcd][timing]") {
  EtcdCluster cluster(clusterOptions(3, false));
  auto c = connectTo(cluster.endpoints());
  auto writer = connectTo(cluster.endpoints());
  constexpr int kRounds = 100;
  std::vector<double> put_ms, get_ms, txn_ms, wake_ms;
  for (int i = 0; i < kRounds; ++i) {
    auto t0 = Clock::now();
    ok(c->put("/bench/k", std::to_string(i)));
    put_ms.push_back(msSince(t0));
    t0 = Clock::now();
    REQUIRE(ok(c->get("/bench/k")).has_value());
    get_ms.push_back(msSince(t0));
    EtcdTxn txn;
    txn.compare = {EtcdCompare::valueIs("/bench/k", std::to_string(i))};
    txn.success = {EtcdOp::put("/bench/k", "x")};
    t0 = Clock::now();
    CHECK(ok(c->txn(txn)).succeeded);
    txn_ms.push_back(msSince(t0));
  }
  for (int i = 0; i < kRounds / 4; ++i) {
    Clock::time_point put_start;
    std::thread put_thread;
    cpprun::Status put_status;
    auto events = ok(c->watch("/bench/w", false, 0, 10s, [&] {
      put_thread = std::thread([&] {
        put_start = Clock::now();
        put_status = writer->put("/bench/w", std::to_string(i)).status();
      });
    }));
    const auto woke = Clock::now();
    put_thread.join();
    INFO(put_status.toString());
    REQUIRE(put_status.isOk());
    REQUIRE(events.size() == 1);
    wake_ms.push_back(std::chrono::duration<double, std::milli>(woke - put_start).count());
  }
  char line[256];
  std::snprintf(line, sizeof(line),
                "etcd 3-member loopback medians: put %.2f ms, get %.2f ms, txn %.2f ms, "
                "put->watch wake %.2f ms (%d rounds, %d wakes)",
                median(put_ms), median(get_ms), median(txn_ms), median(wake_ms), kRounds,
                kRounds / 4);
  WARN(line);
  CHECK(put_ms.size() == kRounds);
}
