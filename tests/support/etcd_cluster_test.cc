// The etcd cluster fixture itself: a real 3-member cluster starts, elects one leader, replicates
// writes, survives the loss of its leader, takes a killed member back, leaves nothing running,
// and (with TLS) accepts only clients whose certificate its CA signed.
#include "tests/support/etcd_cluster.h"

#include <signal.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace cpprun::testing {
namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// True once no process has that pid (it was reaped, not merely a zombie).
bool gone(pid_t pid) { return ::kill(pid, 0) != 0 && errno == ESRCH; }

// `etcdctl get --print-value-only KEY` through one member only.
std::string getVia(const EtcdCluster& c, int member, const std::string& key) {
  const auto r = c.runEtcdctlAs(c.clientTls(), {"get", "--print-value-only", key},
                                {(c.tls() ? "https://" : "http://") + c.endpoint(member)});
  INFO("etcdctl get via member " << member << ": " << r.err);
  REQUIRE(r.ok());
  return r.out;
}

void putVia(const EtcdCluster& c, int member, const std::string& key, const std::string& value) {
  const auto r = c.runEtcdctlAs(c.clientTls(), {"put", key, value}, {c.clientUrl(member)});
  INFO("etcdctl put via member " << member << ": " << r.err);
  REQUIRE(r.ok());
  REQUIRE(r.out == "OK\n");
}

TEST_CASE("etcd cluster of three starts with one leader and replicates through every member",
          "[etcd]") {
  const auto t0 = Clock::now();
  std::vector<pid_t> pids;
  {
    EtcdCluster cluster;
    WARN("3-member plain etcd cluster healthy after " << secondsSince(t0) << " s");
    REQUIRE(cluster.members() == 3);
    REQUIRE(cluster.endpoints().size() == 3);
    REQUIRE(cluster.endpointsFlag() ==
            cluster.endpoint(0) + "," + cluster.endpoint(1) + "," + cluster.endpoint(2));
    for (int i = 0; i < 3; ++i) {
      REQUIRE(cluster.running(i));
      REQUIRE(cluster.endpoint(i).rfind("127.0.0.1:", 0) == 0);
      pids.push_back(cluster.pid(i));
    }
    REQUIRE(cluster.endpoint(0) != cluster.endpoint(1));

    const int leader = cluster.waitForLeader(std::chrono::seconds(10));
    REQUIRE(leader >= 0);
    REQUIRE(leader < 3);
    // Exactly one member is the leader in every member's view.
    const auto status =
        nlohmann::json::parse(cluster.etcdctl({"endpoint", "status", "-w", "json"}));
    INFO(status.dump());
    REQUIRE(status.size() == 3);
    int leaders = 0;
    for (const auto& s : status) {
      const auto& st = s.at("Status");
      if (st.at("leader") == st.at("header").at("member_id")) ++leaders;
      REQUIRE(st.at("leader") == status[0].at("Status").at("leader"));
    }
    REQUIRE(leaders == 1);

    for (int writer = 0; writer < 3; ++writer) {
      const std::string key = "/fixture/k" + std::to_string(writer);
      const std::string value = "v-from-" + std::to_string(writer);
      putVia(cluster, writer, key, value);
      for (int reader = 0; reader < 3; ++reader) {
        REQUIRE(getVia(cluster, reader, key) == value + "\n");
      }
    }
    REQUIRE(cluster.etcdctl({"get", "--print-value-only", "/fixture/missing"}).empty());
  }
  for (pid_t p : pids) REQUIRE(gone(p));
}

TEST_CASE("etcd cluster elects a new leader when the leader is killed and takes it back",
          "[etcd]") {
  std::vector<pid_t> pids;
  {
    EtcdCluster cluster;
    const int old_leader = cluster.waitForLeader(std::chrono::seconds(10));
    REQUIRE(old_leader >= 0);
    const pid_t old_pid = cluster.pid(old_leader);
    pids.push_back(old_pid);
    putVia(cluster, old_leader, "/fixture/before", "1");

    const auto t_kill = Clock::now();
    cluster.kill(old_leader);
    REQUIRE_FALSE(cluster.running(old_leader));
    REQUIRE(gone(old_pid));
    const int new_leader = cluster.waitForLeader(std::chrono::seconds(10), old_leader);
    const double failover = secondsSince(t_kill);
    WARN("new etcd leader " << new_leader << " after " << failover
                            << " s (election timeout 0.5 s)");
    REQUIRE(new_leader >= 0);
    REQUIRE(new_leader != old_leader);
    REQUIRE(failover < 10.0);
    putVia(cluster, new_leader, "/fixture/during", "2");

    const auto t_restart = Clock::now();
    cluster.restart(old_leader);
    WARN("killed member back and healthy after " << secondsSince(t_restart) << " s");
    REQUIRE(cluster.running(old_leader));
    REQUIRE(cluster.pid(old_leader) != old_pid);
    // It kept its data and caught up with what was written while it was away.
    REQUIRE(getVia(cluster, old_leader, "/fixture/before") == "1\n");
    REQUIRE(getVia(cluster, old_leader, "/fixture/during") == "2\n");
    REQUIRE(cluster.waitForLeader(std::chrono::seconds(10)) >= 0);
    for (int i = 0; i < 3; ++i) pids.push_back(cluster.pid(i));
  }
  for (pid_t p : pids) REQUIRE(gone(p));
}

TEST_CASE("etcd cluster member paused is silent and answers again when resumed", "[etcd]") {
  EtcdCluster cluster;
  const int leader = cluster.waitForLeader(std::chrono::seconds(10));
  REQUIRE(leader >= 0);
  const int follower = (leader + 1) % 3;
  cluster.pause(follower);
  REQUIRE(cluster.running(follower));
  REQUIRE(cluster.paused(follower));
  const auto silent = cluster.runEtcdctlAs(cluster.clientTls(), {"endpoint", "health"},
                                           {cluster.clientUrl(follower)});
  REQUIRE_FALSE(silent.ok());
  // The other two still make a quorum.
  putVia(cluster, leader, "/fixture/paused", "yes");
  cluster.resume(follower);
  REQUIRE_FALSE(cluster.paused(follower));
  // Resumed, it catches up (poll: it may take a few heartbeats).
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  std::string seen;
  while (Clock::now() < deadline) {
    const auto r =
        cluster.runEtcdctlAs(cluster.clientTls(), {"get", "--print-value-only", "/fixture/paused"},
                             {cluster.clientUrl(follower)});
    seen = r.out;
    if (r.ok() && seen == "yes\n") break;
  }
  REQUIRE(seen == "yes\n");
}

TEST_CASE("etcd cluster with TLS accepts only clients with a certificate from its CA", "[etcd]") {
  const auto t0 = Clock::now();
  EtcdCluster cluster(EtcdClusterOptions{3, true, std::chrono::milliseconds(30000)});
  WARN("3-member TLS etcd cluster (certificates included) healthy after " << secondsSince(t0)
                                                                          << " s");
  REQUIRE(cluster.tls());
  REQUIRE(cluster.clientUrl(0).rfind("https://127.0.0.1:", 0) == 0);
  const auto good = cluster.clientTls();
  REQUIRE_FALSE(good.ca.empty());
  REQUIRE(good.ca == cluster.caFile());
  for (const auto& path : {good.ca, good.cert, good.key}) REQUIRE(std::ifstream(path).good());

  REQUIRE(cluster.etcdctl({"put", "/fixture/tls", "secret"}) == "OK\n");
  REQUIRE(cluster.etcdctl({"get", "--print-value-only", "/fixture/tls"}) == "secret\n");

  const auto bad = cluster.untrustedClientTls();
  REQUIRE(bad.ca == cluster.caFile());
  REQUIRE(bad.cert != good.cert);
  const auto untrusted = cluster.runEtcdctlAs(bad, {"get", "/fixture/tls"}, {cluster.clientUrl(0)});
  INFO("untrusted client: exit " << untrusted.exit_code << " out " << untrusted.out << " err "
                                 << untrusted.err);
  REQUIRE_FALSE(untrusted.ok());
  REQUIRE(untrusted.out.find("secret") == std::string::npos);

  const auto no_cert = cluster.runEtcdctlAs(EtcdTlsFiles{cluster.caFile(), "", ""},
                                            {"get", "/fixture/tls"}, {cluster.clientUrl(1)});
  INFO("client without a certificate: exit " << no_cert.exit_code << " err " << no_cert.err);
  REQUIRE_FALSE(no_cert.ok());
  REQUIRE(no_cert.out.find("secret") == std::string::npos);
  // The server saw and refused them (not merely a client-side failure).
  const std::string logs = cluster.logTail(0, 400) + cluster.logTail(1, 400);
  REQUIRE(logs.find("rejected connection") != std::string::npos);
}

TEST_CASE("etcd cluster refuses a bad member count and names it", "[etcd]") {
  REQUIRE_THROWS_WITH(EtcdCluster(EtcdClusterOptions{0, false, std::chrono::milliseconds(1000)}),
                      Catch::Contains("members must be >= 1, got 0"));
}

}  // namespace
}  // namespace cpprun::testing
