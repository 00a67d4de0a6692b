// The etcd rendezvous backend across network-namespace hosts (tests/support/netns_hosts.h):
// a 3-member etcd whose members run on different hosts and listen on their hosts' addresses,
// cpprun agents on the hosts, and failures made for real: an agent SIGKILLed (the round's node 0,
// found from the agents' output), and one etcd member's host cut off the bridge mid-job (its
// veth down: silence, not an error), the first-listed member and the leader among them.
// Every wait is bounded; every test checks that nothing it started is left running and that
// its namespaces and route are gone.
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "tests/support/cpprun_test_helpers.h"
#include "tests/support/etcd_cluster.h"
#include "tests/support/netns_hosts.h"
#include "tests/support/test_support.h"

namespace {

using namespace cpprun::testing;
using Clock = std::chrono::steady_clock;

// keep_alive_interval 0.3 s x 3 attempts: an agent or an etcd endpoint is given up after 0.9 s.
const std::string kConf = "--rdzv-conf=keep_alive_interval=0.3,last_call_timeout=1,join_timeout=30";
// The cut-member test's: 0.5 s x 3, an endpoint given up after 1.5 s, a lease TTL of 2 s. A
// renewal stuck on the cut member waits one interval there before it fails over, and after the
// leader's cut the other members hold renewals until they have elected a new one (0.5-1 s with
// the fixture's 500 ms election timeout): with 0.3 s x 3 (TTL 1 s) that left an ASan agent on a
// loaded machine a few hundred ms of slack before its lease expired.
const std::string kCutConf =
    "--rdzv-conf=keep_alive_interval=0.5,last_call_timeout=1,join_timeout=30";

// A cpprun agent on `host`, meeting in etcd at `endpoints`; its workers' store (if it becomes
// the round's node 0) on its host's address.
std::unique_ptr<ChildProcess> agentOn(const NetnsHosts& hosts, int host,
                                      const std::string& endpoints, const std::string& run_id,
                                      const std::string& nnodes,
                                      const std::vector<std::string>& worker_args,
                                      const std::string& conf = kConf) {
  std::vector<std::string> argv = {CPPRUN_BINARY,
                                   "--nnodes=" + nnodes,
                                   "--rdzv-backend=etcd-v2",
                                   "--rdzv-endpoint=" + endpoints,
                                   "--rdzv-id=" + run_id,
                                   conf,
                                   "--local-addr=" + hosts.address(host),
                                   "--nproc-per-node=1",
                                   "--no-python",
                                   kWorker};
  argv.insert(argv.end(), worker_args.begin(), worker_args.end());
  return std::make_unique<ChildProcess>(hosts.onHost(host, argv));
}

int waitExit(ChildProcess& agent, std::chrono::milliseconds bound = 60s) {
  auto status = agent.wait(bound);
  REQUIRE(status.has_value());
  return exitCodeOf(*status);
}

double secondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The node number of the first rendezvous this agent completed (-1: none).
int firstNodeNumber(const std::string& output) {
  const std::string marker = "this node is node ";
  const size_t at = output.find(marker);
  return at == std::string::npos ? -1 : std::atoi(output.c_str() + at + marker.size());
}

// Every path exists within `bound` (a worker's touch, polled).
bool waitForFiles(const std::vector<std::string>& paths, std::chrono::milliseconds bound) {
  const auto deadline = Clock::now() + bound;
  for (const std::string& p : paths) {
    while (::access(p.c_str(), F_OK) != 0) {
      if (Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(10ms);  // the pace of a bounded poll
    }
  }
  return true;
}

std::string uniqueRunId(const char* what) {
  return std::string(what) + "-" + std::to_string(::getpid()) + "-" + std::to_string(freeTcpPort());
}

// What the hosts leave in the system: their namespaces (named <prefix>N, <prefix>sw) and the
// guard route. Empty once they are removed.
std::string leftovers(const std::string& prefix, const std::string& subnet) {
  std::string netns, routes;
  runToEnd({"/usr/sbin/ip", "netns", "list"}, 10s, &netns);
  runToEnd({"/usr/sbin/ip", "route", "show", "type", "unreachable"}, 10s, &routes);
  std::string found;
  if (netns.find(prefix) != std::string::npos) found += "namespaces: " + netns;
  if (routes.find(subnet + ".0/24") != std::string::npos) found += "route: " + routes;
  return found;
}

// ---- a. the round's node 0 (its decider and workers' store) SIGKILLed mid-run.
void killNodeZero(bool elastic, std::vector<double>* took) {
  NetnsHosts hosts(3);
  EtcdClusterOptions options;
  options.hosts = &hosts;
  EtcdCluster cluster(options);  // member i on host i + 1
  TempDir dir;
  const std::string d = dir.path();
  // Attempt 0 waits forever; a re-formed attempt succeeds.
  const std::vector<std::string> args = {"env-json",
                                         d + "/env-{rank}-{restart}.json",
                                         "touch",
                                         d + "/up-{rank}",
                                         "print",
                                         "up {rank}",
                                         "exit-if-restart",
                                         "1",
                                         "0",
                                         "sleep-forever"};
  const std::string id = uniqueRunId(elastic ? "ns-elastic" : "ns-static");
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int h = 1; h <= 3; ++h) {
    agents.push_back(agentOn(hosts, h, cluster.endpointsFlag(), id, elastic ? "2:3" : "3", args));
  }
  requireEveryAgentRelays(agents);
  // The store host is whoever the round made node 0: from the agents' own words.
  size_t victim = agents.size();
  for (size_t i = 0; i < agents.size(); ++i) {
    if (firstNodeNumber(agents[i]->output()) == 0) victim = i;
  }
  REQUIRE(victim < agents.size());
  const std::string victim_address = hosts.address(static_cast<int>(victim) + 1);
  // ... and its workers were told so: MASTER_ADDR is the victim's host.
  REQUIRE(waitForFiles({d + "/env-0-0.json"}, 10s));
  const auto env = nlohmann::json::parse(readFile(d + "/env-0-0.json"), nullptr, false);
  REQUIRE(env.is_object());
  CHECK(env["MASTER_ADDR"] == victim_address);
  CHECK(env["WORLD_SIZE"] == "3");
  std::vector<pid_t> started = processesMentioning(d);
  for (auto& a : agents) started.push_back(a->pid());
  const auto killed_at = Clock::now();
  killAgentOf(*agents[victim]);
  for (size_t i = 0; i < agents.size(); ++i) {
    if (i == victim) continue;
    ChildProcess& a = *agents[i];
    const int code = waitExit(a);
    took->push_back(secondsSince(killed_at));
    INFO("agent on host " << i + 1 << " (victim: host " << victim + 1 << ")\n" << a.output());
    if (elastic) {
      CHECK(code == 0);
      CHECK_THAT(a.output(), Catch::Contains("rendezvous complete: 2 nodes") &&
                                 Catch::Contains("all 2 workers of 2 nodes succeeded"));
    } else {
      CHECK(code != 0);
      CHECK_THAT(a.output(), Catch::Contains("the agent of node 0"));
    }
  }
  waitExit(*agents[victim]);
  if (elastic) {
    // The re-formed round's store is one of the survivors' hosts, not the dead one's.
    for (int r = 0; r < 2; ++r) {
      const auto e = nlohmann::json::parse(readFile(d + "/env-" + std::to_string(r) + "-1.json"),
                                           nullptr, false);
      REQUIRE(e.is_object());
      CHECK(e["WORLD_SIZE"] == "2");
      CHECK(e["MASTER_ADDR"] != victim_address);
    }
  }
  CHECK(allGone(started));
  CHECK(allGone(processesMentioning(d)));
}

// ---- b. one etcd member's host cut off the network mid-job; the agents are elsewhere.
enum class CutCase {
  kFollowerListedFirst,
  kFollowerListedLast,
  kLeaderListedFirst,
  kLeaderListedLast
};

const char* nameOf(CutCase c) {
  switch (c) {
    case CutCase::kFollowerListedFirst:
      return "a follower listed first";
    case CutCase::kFollowerListedLast:
      return "a follower listed last";
    case CutCase::kLeaderListedFirst:
      return "the leader listed first";
    case CutCase::kLeaderListedLast:
      return "the leader listed last";
  }
  return "?";
}

struct CutTimes {
  double job = 0;        // from the cut to the last agent's exit
  double rejoined = -1;  // from the reconnect to the member's health
  double election = -1;  // from the cut to a new leader seen (the leader cases)
};

CutTimes cutMemberMidJob(CutCase which) {
  // Hosts 1-3 carry etcd members 0-2; the agents run on hosts 2, 3 and 4, so host 1 holds
  // member 0 and nothing else: cutting it cuts only that member.
  NetnsHosts hosts(4);
  EtcdClusterOptions options;
  options.hosts = &hosts;
  EtcdCluster cluster(options);
  constexpr int kCut = 0;  // the member cut off, on host 1
  const bool leader = which == CutCase::kLeaderListedFirst || which == CutCase::kLeaderListedLast;
  const bool last = which == CutCase::kFollowerListedLast || which == CutCase::kLeaderListedLast;
  if (leader) {
    REQUIRE(cluster.moveLeader(kCut, 10s));
  } else if (cluster.waitForLeader(10s) == kCut) {
    REQUIRE(cluster.moveLeader(1, 10s));
  }
  std::vector<std::string> eps = cluster.endpoints();  // 0, 1, 2
  if (last) eps = {eps[1], eps[2], eps[0]};
  std::string endpoints;
  for (const auto& e : eps) endpoints += (endpoints.empty() ? "" : ",") + e;

  TempDir dir;
  const std::string d = dir.path();
  // The workers run 5 s: the cut comes right after they start, so several lease renewals,
  // checks and keep-alive bounds (1.5 s) of every agent fall after it.
  const std::vector<std::string> args = {"touch", d + "/up-{rank}", "sleep", "5", "exit", "0"};
  const std::string id = uniqueRunId("ns-cut");
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int h = 2; h <= 4; ++h) {
    agents.push_back(agentOn(hosts, h, endpoints, id, "3", args, kCutConf));
  }
  const bool up = waitForFiles({d + "/up-0", d + "/up-1", d + "/up-2"}, 30s);
  if (!up) {
    for (auto& a : agents) UNSCOPED_INFO("agent (pid " << a->pid() << "):\n" << a->output());
  }
  REQUIRE(up);
  std::vector<pid_t> started = processesMentioning(d);
  for (auto& a : agents) started.push_back(a->pid());
  const auto cut_at = Clock::now();
  hosts.cutOff(cluster.hostOf(kCut));
  for (auto& a : agents) CHECK(alive(a->pid()));  // the cut came while the job ran
  CutTimes times;
  if (leader) {
    CHECK(cluster.waitForLeader(10s, kCut) >= 0);
    times.election = secondsSince(cut_at);
  }
  for (auto& a : agents) {
    const int code = waitExit(*a);
    INFO(nameOf(which) << " cut off; this agent exited " << secondsSince(cut_at)
                       << " s after the cut\n"
                       << a->output());
    CHECK(code == 0);
    // A static job of 3: had any agent been taken for lost, the job would have failed.
    CHECK_THAT(a->output(), Catch::Contains("rendezvous complete: 3 nodes") &&
                                Catch::Contains("all 3 workers of 3 nodes succeeded"));
    CHECK_THAT(a->output(), !Catch::Contains("stopped responding") &&
                                !Catch::Contains("declared this node lost") &&
                                !Catch::Contains("lost etcd"));
  }
  times.job = secondsSince(cut_at);
  CHECK(allGone(started));
  CHECK(allGone(processesMentioning(d)));
  // Back on the network, the member catches up and serves again.
  const auto reconnected_at = Clock::now();
  hosts.reconnect(cluster.hostOf(kCut));
  const auto deadline = reconnected_at + 20s;
  while (!cluster.healthy(kCut) && Clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);  // the pace of a bounded poll
  }
  CHECK(cluster.healthy(kCut));
  times.rejoined = secondsSince(reconnected_at);
  return times;
}

// Runs `body` with the hosts it makes, then checks they left nothing behind. The names derive
// from this process's pid (NetnsHosts), so they are known before and after.
template <typename Body>
void thenNothingLeft(Body body) {
  const int pid = static_cast<int>(::getpid());
  const std::string prefix = "cpt" + std::to_string(pid % 100000) + "h";
  const std::string subnet =
      "10." + std::to_string(200 + (pid >> 8) % 50) + "." + std::to_string(pid % 256);
  body();
  CHECK(leftovers(prefix, subnet).empty());
}

}  // namespace

TEST_CASE("etcd on three namespace hosts: the round's node 0 SIGKILLed re-forms an elastic job",
          "[integration][netns][etcd]") {
  std::vector<double> took;
  thenNothingLeft([&] { killNodeZero(true, &took); });
  REQUIRE(took.size() == 2);
  WARN("namespace hosts, elastic: node 0 killed; survivors exited 0 after " << took[0] << " s and "
                                                                            << took[1] << " s");
}

TEST_CASE("etcd on three namespace hosts: the round's node 0 SIGKILLed fails a static job",
          "[integration][netns][etcd]") {
  std::vector<double> took;
  thenNothingLeft([&] { killNodeZero(false, &took); });
  REQUIRE(took.size() == 2);
  WARN("namespace hosts, static: node 0 killed; survivors exited after " << took[0] << " s and "
                                                                         << took[1] << " s");
}

TEST_CASE("etcd on namespace hosts: one member cut off by the network mid-job does not stop it",
          "[integration][netns][etcd]") {
  const CutCase which = GENERATE(CutCase::kFollowerListedFirst, CutCase::kFollowerListedLast,
                                 CutCase::kLeaderListedFirst, CutCase::kLeaderListedLast);
  // Names the case in every failure of it (set-up, checks, leftovers, an exception).
  INFO("case: etcd member 0 (" << nameOf(which) << ") cut off mid-job");
  CutTimes times;
  thenNothingLeft([&] { times = cutMemberMidJob(which); });
  WARN("namespace hosts: etcd member 0 ("
       << nameOf(which) << ") cut off mid-job: job of 3 done " << times.job << " s after the cut"
       << (times.election >= 0 ? "; new leader seen after " + std::to_string(times.election) + " s"
                               : std::string())
       << "; member healthy " << times.rejoined << " s after the reconnect");
}
