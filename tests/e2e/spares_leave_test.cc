// Hot spares and graceful leave (drain) with real agents on loopback, over both rendezvous
// backends (c10d: one agent serves the store; etcd: a 3-member cluster): a spare takes the
// place of a SIGKILLed node and the world size stays MAX with no restart used; a second spare
// the job never needs exits 0; one node drained by POST /leave or SIGPWR leaves (exit 0, the
// event log says so) while the others re-form without it and finish with --max-restarts=0;
// the store host and a leave below MIN are refused; a browser's POST /leave (Origin), one
// through a foreign Host and, with --metrics-token-file, one without the token drain nothing,
// and a token file others can read stops cpprun at start (exit 2); and a spare on another
// network-namespace host takes the place of a node cut off the network. Every wait is bounded and
// waits on lines or exits, never on time.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tests/support/cpprun_test_helpers.h"
#include "tests/support/etcd_cluster.h"
#include "tests/support/http_get.h"
#include "tests/support/netns_hosts.h"
#include "tests/support/test_support.h"

namespace {

using namespace cpprun::testing;
using Agents = std::vector<std::unique_ptr<ChildProcess>>;

// An elastic agent of one worker. `backend`: "c10d" (endpoint 127.0.0.1:port) or "etcd"
// (endpoint: the cluster's).
std::unique_ptr<ChildProcess> agent(const std::string& backend, const std::string& endpoint,
                                    const std::string& run_id, const std::string& nnodes,
                                    const std::vector<std::string>& worker_args,
                                    const std::vector<std::string>& extra = {},
                                    const std::string& rdzv_conf =
                                        "keep_alive_interval=0.3,"
                                        "last_call_timeout=1,"
                                        "join_timeout=60") {
  std::vector<std::string> args = {"--nnodes=" + nnodes,          "--rdzv-backend=" + backend,
                                   "--rdzv-endpoint=" + endpoint, "--rdzv-id=" + run_id,
                                   "--rdzv-conf=" + rdzv_conf,    "--nproc-per-node=1"};
  args.insert(args.end(), extra.begin(), extra.end());
  // No restart budget unless a test gives one: a membership change must not need it.
  if (std::none_of(extra.begin(), extra.end(),
                   [](const std::string& a) { return a.rfind("--max-restarts", 0) == 0; })) {
    args.push_back("--max-restarts=0");
  }
  args.insert(args.end(), {"--no-python", kWorker});
  args.insert(args.end(), worker_args.begin(), worker_args.end());
  return std::make_unique<ChildProcess>(cpprunCommand(args));
}

int waitExit(ChildProcess& a, std::chrono::milliseconds bound = 60s) {
  auto status = a.wait(bound);
  REQUIRE(status.has_value());
  return exitCodeOf(*status);
}

std::string runId(const char* what) {
  return std::string(what) + "-" + std::to_string(::getpid()) + "-" + std::to_string(freeTcpPort());
}

bool servesStore(const ChildProcess& a) {
  return a.output().find("this agent serves the job's store") != std::string::npos;
}

// Reads the agents' output until `count` of them relay a worker line and the others say they
// wait as spares (bounded: 30 s); returns the indices of the active ones.
std::vector<size_t> activeAndSpares(Agents& agents, size_t count) {
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (true) {
    std::vector<size_t> active;
    size_t spares = 0;
    for (size_t i = 0; i < agents.size(); ++i) {
      agents[i]->readAvailable(20ms);
      if (agents[i]->output().find("[default") != std::string::npos) {
        active.push_back(i);
      } else if (agents[i]->output().find("waits as a spare") != std::string::npos) {
        ++spares;
      }
    }
    if (active.size() == count && spares == agents.size() - count) return active;
    if (std::chrono::steady_clock::now() >= deadline) {
      std::string outputs;
      for (auto& a : agents) outputs += "---\n" + a->output();
      FAIL("not " << count << " active agents and the rest spares within 30 s:\n" << outputs);
    }
  }
}

// The agent's metrics port, from its "metrics on http://127.0.0.1:PORT/metrics" line.
int metricsPort(ChildProcess& a) {
  REQUIRE(a.waitForText("/metrics (also", 30s));
  const std::string marker = "metrics on http://127.0.0.1:";
  const size_t at = a.output().find(marker);
  REQUIRE(at != std::string::npos);
  return std::atoi(a.output().c_str() + at + marker.size());
}

std::vector<nlohmann::json> events(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    out.push_back(nlohmann::json::parse(line, nullptr, false));
  }
  return out;
}

nlohmann::json readEnvJson(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str(), nullptr, false);
}

// A node SIGKILLed (its agent; its workers die by their parent-death signal) while 2 spares
// wait in a job of exactly 2 (--nnodes=2:2): one spare takes its place in the next round, the
// world size stays 2, the restart budget (0) is not used, the other spare exits 0 unneeded.
void spareReplacesLostNode(const std::string& backend, const std::string& endpoint,
                           const std::function<void()>& before_loss = {}) {
  TempDir dir;
  const std::string d = dir.path();
  const std::string id = runId("spare");
  // Attempt 0 runs until killed; attempt 1 writes its environment and succeeds.
  const std::vector<std::string> args = {"env-json",
                                         d + "/env-{rank}-{restart}.json",
                                         "print",
                                         "up {rank} {restart}",
                                         "exit-if-restart",
                                         "1",
                                         "0",
                                         "sleep-forever"};
  Agents agents;
  for (int i = 0; i < 4; ++i) agents.push_back(agent(backend, endpoint, id, "2:2", args));
  std::vector<size_t> active = activeAndSpares(agents, 2);
  // c10d: not the store host (its loss is the store's: exit 4 everywhere, by design).
  const size_t victim =
      backend == "c10d" && servesStore(*agents[active[0]]) ? active[1] : active[0];
  if (before_loss) before_loss();
  killAgentOf(*agents[victim]);
  int used_spares = 0;
  for (size_t i = 0; i < agents.size(); ++i) {
    if (i == victim) continue;
    ChildProcess& a = *agents[i];
    INFO(a.output());
    CHECK(waitExit(a) == 0);
    const bool spare = std::find(active.begin(), active.end(), i) == active.end();
    if (!spare) {
      CHECK_THAT(a.output(), Catch::Contains("spare node(s) waiting") &&
                                 Catch::Contains("restarts used: 0 of 0") &&
                                 Catch::Contains("all 2 workers of 2 nodes succeeded"));
    } else if (a.output().find("[default") != std::string::npos) {
      ++used_spares;
      CHECK_THAT(a.output(), Catch::Contains("rendezvous complete: 2 nodes") &&
                                 Catch::Contains("all 2 workers of 2 nodes succeeded"));
      CHECK(a.output().find("up 0 0") == std::string::npos);
      CHECK(a.output().find("up 1 0") == std::string::npos);
    } else {
      CHECK_THAT(a.output(), Catch::Contains("this node waited as a spare and the job did not "
                                             "need it"));
    }
  }
  waitExit(*agents[victim]);
  CHECK(used_spares == 1);
  for (int r = 0; r < 2; ++r) {
    nlohmann::json e = readEnvJson(d + "/env-" + std::to_string(r) + "-1.json");
    REQUIRE(e.is_object());
    CHECK(e["WORLD_SIZE"] == "2");
    CHECK(e["TORCHELASTIC_RESTART_COUNT"] == "1");
  }
  CHECK(allGone(processesMentioning(d)));
}

// Writes `token` to a file only this user can read (--metrics-token-file) in `dir`.
std::string tokenFile(const std::string& dir, const std::string& token, mode_t mode = 0600) {
  const std::string path = dir + "/metrics-token";
  std::ofstream(path) << token << "\n";
  REQUIRE(::chmod(path.c_str(), mode) == 0);
  return path;
}

// Three nodes of a 2:3 job; one asked to leave (`how`: "http" or "signal"): it exits 0 saying
// so, the others re-form on 2 nodes and succeed with --max-restarts=0; the event log has it.
// Over HTTP, a browser's POST /leave (Origin) and one through a foreign name (DNS rebinding)
// are refused first and drain nothing; with `token` (--metrics-token-file) a POST without it or
// with a wrong one too. Every legitimate request is curl's: Host as connected to, no Origin.
void drainOneNode(const std::string& backend, const std::string& endpoint, const std::string& how,
                  const std::function<void()>& before_leave = {}, const std::string& token = "") {
  TempDir dir;
  const std::string d = dir.path();
  const std::string id = runId("drain");
  const std::string log = d + "/events.jsonl";
  std::vector<std::string> http_args = {"--metrics-port=0", "--event-log=" + log};
  if (!token.empty()) http_args.push_back("--metrics-token-file=" + tokenFile(d, token));
  const std::string auth = token.empty() ? "" : "Authorization: Bearer " + token + "\r\n";
  const std::vector<std::string> args = {"env-json",
                                         d + "/env-{rank}-{restart}.json",
                                         "print",
                                         "up {rank} {restart}",
                                         "exit-if-restart",
                                         "1",
                                         "0",
                                         "sleep-forever"};
  Agents agents;
  for (int i = 0; i < 3; ++i) {
    agents.push_back(agent(backend, endpoint, id, "2:3", args, http_args));
  }
  requireEveryAgentRelays(agents);
  size_t leaver = 0;
  if (backend == "c10d") {
    const size_t host = servesStore(*agents[0]) ? 0 : servesStore(*agents[1]) ? 1 : 2;
    leaver = (host + 1) % 3;
    // The store host is refused: its store serves the others.
    auto refused = httpRequestRaw(metricsPort(*agents[host]), "POST", "/leave", 20s,
                                  "Host: localhost\r\n" + auth);
    REQUIRE(refused.has_value());
    CHECK_THAT(*refused,
               Catch::StartsWith("HTTP/1.1 409") && Catch::Contains("serves the job's store"));
  }
  if (before_leave) before_leave();
  if (how == "http") {
    const int port = metricsPort(*agents[leaver]);
    const std::string here = "Host: 127.0.0.1:" + std::to_string(port) + "\r\n";
    auto refusedWith = [&](const std::string& method, const std::string& target,
                           const std::string& headers, const std::string& status) {
      auto answer = httpRequestRaw(port, method, target, 20s, headers);
      REQUIRE(answer.has_value());
      INFO(headers);
      CHECK_THAT(*answer, Catch::StartsWith("HTTP/1.1 " + status));
    };
    refusedWith("POST", "/leave", here + auth + "Origin: http://evil.example\r\n", "403");
    refusedWith("POST", "/leave", "Host: evil.example:" + std::to_string(port) + "\r\n" + auth,
                "403");
    refusedWith("GET", "/status", "Host: evil.example\r\n", "403");
    if (!token.empty()) {
      refusedWith("POST", "/leave", here, "401");
      refusedWith("POST", "/leave", here + "Authorization: Bearer " + std::string(32, 'x') + "\r\n",
                  "401");
    }
    // Not drained by any of them: this one is the first to ask, and is accepted.
    auto answer = httpRequestRaw(port, "POST", "/leave", 20s, here + auth);
    REQUIRE(answer.has_value());
    CHECK_THAT(*answer, Catch::StartsWith("HTTP/1.1 202") && Catch::Contains("leaving"));
  } else {
    // To the launcher's pid, as a scheduler or operator would: the guardian passes it on.
    agents[leaver]->signal(SIGPWR);
  }
  for (size_t i = 0; i < agents.size(); ++i) {
    ChildProcess& a = *agents[i];
    INFO(a.output());
    CHECK(waitExit(a) == 0);
    if (i == leaver) {
      CHECK_THAT(a.output(), Catch::Contains("this node left the job as asked"));
      CHECK(a.output().find("up 0 1") == std::string::npos);
    } else {
      CHECK_THAT(a.output(), Catch::Contains("left the job") &&
                                 Catch::Contains("restarts used: 0 of 0") &&
                                 Catch::Contains("all 2 workers of 2 nodes succeeded"));
    }
  }
  int left = 0, accepted = 0, asked = 0, membership_restarts = 0;
  for (const nlohmann::json& e : events(log)) {
    REQUIRE(e.is_object());
    if (e["event"] == "job_finished" && e["outcome"] == "left") ++left;
    if (e["event"] == "leave_requested") ++asked;
    if (e["event"] == "leave_requested" && e["accepted"] == true) {
      ++accepted;
      CHECK(e["source"] == (how == "http" ? "POST /leave" : "SIGPWR"));
    }
    if (e["event"] == "restart") {
      CHECK(e["membership_change"] == true);
      CHECK(e["restarts_used"] == 0);
      ++membership_restarts;
    }
  }
  CHECK(left == 1);
  CHECK(accepted == 1);
  // The refused requests never reached an agent: the leave asked of the store host (c10d) and
  // the one accepted are all there is.
  CHECK(asked == (backend == "c10d" ? 2 : 1));
  CHECK(membership_restarts == 2);
  for (int r = 0; r < 2; ++r) {
    nlohmann::json e = readEnvJson(d + "/env-" + std::to_string(r) + "-1.json");
    REQUIRE(e.is_object());
    CHECK(e["WORLD_SIZE"] == "2");
  }
  CHECK(allGone(processesMentioning(d)));
}

}  // namespace

TEST_CASE("hot spares (c10d): a spare takes a SIGKILLed node's place, world size stays MAX",
          "[integration][multinode][elastic][spares]") {
  spareReplacesLostNode("c10d", "127.0.0.1:" + std::to_string(freeTcpPort()));
}

TEST_CASE("hot spares (etcd): a spare takes a SIGKILLed node's place, world size stays MAX",
          "[integration][multinode][etcd][spares]") {
  EtcdCluster cluster;
  spareReplacesLostNode("etcd", cluster.endpointsFlag());
}

TEST_CASE("hot spares (etcd): with the etcd leader killed first, a spare still replaces a node",
          "[integration][multinode][etcd][spares]") {
  EtcdCluster cluster;
  spareReplacesLostNode("etcd", cluster.endpointsFlag(), [&] {
    const int leader = cluster.waitForLeader(10s);
    REQUIRE(leader >= 0);
    cluster.kill(leader);  // 2 of 3 members left: a quorum, a new leader soon
  });
}

TEST_CASE("drain (etcd): with an etcd member killed first, POST /leave still drains one node",
          "[integration][multinode][etcd][drain]") {
  EtcdCluster cluster;
  drainOneNode("etcd", cluster.endpointsFlag(), "http", [&] { cluster.kill(0); });
}

TEST_CASE(
    "drain (c10d): POST /leave with the token makes one node leave, the store host is refused, "
    "a browser's or a foreign Host's POST drains nothing",
    "[integration][multinode][elastic][drain]") {
  drainOneNode("c10d", "127.0.0.1:" + std::to_string(freeTcpPort()), "http", {},
               "0123456789abcdef0123456789abcdef");
}

TEST_CASE("drain: a --metrics-token-file others can read stops cpprun at start (exit 2), named",
          "[integration][drain]") {
  TempDir dir;
  const std::string file = tokenFile(dir.path(), "0123456789abcdef0123456789abcdef", 0644);
  ChildProcess run(cpprunCommand(
      {"--metrics-port=0", "--metrics-token-file=" + file, "--no-python", kWorker, "exit", "0"}));
  auto status = run.wait(30s);
  REQUIRE(status.has_value());
  INFO(run.output());
  CHECK(exitCodeOf(*status) == 2);
  CHECK_THAT(run.output(), Catch::Contains("--metrics-token-file " + file + " has mode 0644") &&
                               Catch::Contains("chmod 600"));
  CHECK(run.output().find("metrics on http://") == std::string::npos);  // nothing started
}

TEST_CASE("drain (etcd): SIGPWR makes one node leave and the others go on without it",
          "[integration][multinode][etcd][drain]") {
  EtcdCluster cluster;
  drainOneNode("etcd", cluster.endpointsFlag(), "signal");
}

TEST_CASE("drain: a leave that would drop the job below MIN is refused and the job goes on",
          "[integration][multinode][elastic][drain]") {
  TempDir dir;
  const std::string d = dir.path();
  const std::string id = runId("below");
  const std::string endpoint = "127.0.0.1:" + std::to_string(freeTcpPort());
  const std::vector<std::string> args = {"print", "up {rank} {restart}", "wait-file", d + "/go",
                                         "60"};
  Agents agents;
  for (int i = 0; i < 2; ++i) {
    agents.push_back(agent("c10d", endpoint, id, "2:3", args, {"--event-log=" + d + "/ev.jsonl"}));
  }
  requireEveryAgentRelays(agents);
  const size_t other = servesStore(*agents[0]) ? 1 : 0;
  agents[other]->signal(SIGPWR);
  REQUIRE(agents[other]->waitForText("fewer than the minimum 2", 30s));
  std::ofstream(d + "/go").put('\n');
  for (auto& a : agents) {
    INFO(a->output());
    CHECK(waitExit(*a) == 0);
    CHECK_THAT(a->output(), Catch::Contains("all 2 workers of 2 nodes succeeded"));
    CHECK(a->output().find("left the job") == std::string::npos);
  }
  bool refused = false;
  for (const nlohmann::json& e : events(d + "/ev.jsonl")) {
    if (e["event"] == "leave_requested") refused = e["accepted"] == false;
  }
  CHECK(refused);
}

// Across hosts with a real network cut (tests/support/netns_hosts.h): the store on host 1, one
// agent on each of hosts 1..3 for a job of exactly 2 nodes. The active node that does not serve
// the store is cut off the bridge (silence, no error): the store host declares it lost after the
// keep-alive bound, and the spare on the third host takes its place, world size 2, no restart
// used; the cut node's agent finds the store gone and exits 4.
TEST_CASE("netns hot spare: a node cut off the network is replaced by the spare on another host",
          "[integration][netns][spares]") {
  NetnsHosts hosts(3);
  TempDir dir;
  const std::string d = dir.path();
  const std::vector<std::string> worker = {"env-json",
                                           d + "/env-{rank}-{restart}.json",
                                           "print",
                                           "up {rank} {restart}",
                                           "exit-if-restart",
                                           "1",
                                           "0",
                                           "sleep-forever"};
  Agents agents;
  for (int h = 1; h <= 3; ++h) {  // host 1 first: its agent binds the endpoint and serves it
    std::vector<std::string> argv = {
        CPPRUN_BINARY,
        "--nnodes=2:2",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=" + hosts.address(1) + ":29400",
        "--rdzv-conf=keep_alive_interval=0.5,last_call_timeout=1,join_timeout=60",
        "--max-restarts=0",
        "--nproc-per-node=1",
        "--no-python",
        kWorker};
    argv.insert(argv.end(), worker.begin(), worker.end());
    agents.push_back(std::make_unique<ChildProcess>(hosts.onHost(h, argv)));
    if (h == 1) REQUIRE(agents[0]->waitForText("this agent serves the job's store", 30s));
  }
  std::vector<size_t> active = activeAndSpares(agents, 2);
  REQUIRE(std::find(active.begin(), active.end(), size_t{0}) != active.end());
  const size_t cut = active[0] == 0 ? active[1] : active[0];
  const size_t spare = 3 - cut;  // of 1 and 2, the one not cut
  hosts.cutOff(static_cast<int>(cut) + 1);
  for (size_t i : {size_t{0}, spare}) {
    INFO(agents[i]->output());
    CHECK(waitExit(*agents[i], 90s) == 0);
    CHECK_THAT(agents[i]->output(), Catch::Contains("all 2 workers of 2 nodes succeeded"));
  }
  CHECK_THAT(agents[0]->output(),
             Catch::Contains("stopped responding") && Catch::Contains("1 spare node(s) waiting"));
  CHECK_THAT(agents[spare]->output(), Catch::Contains("waits as a spare") &&
                                          Catch::Contains("rendezvous complete: 2 nodes"));
  INFO(agents[cut]->output());
  CHECK(waitExit(*agents[cut], 90s) == 4);
  for (int r = 0; r < 2; ++r) {
    nlohmann::json e = readEnvJson(d + "/env-" + std::to_string(r) + "-1.json");
    REQUIRE(e.is_object());
    CHECK(e["WORLD_SIZE"] == "2");
  }
}

TEST_CASE("drain: a spare asked to leave gives up its place and exits 0, the job goes on",
          "[integration][multinode][elastic][drain][spares]") {
  TempDir dir;
  const std::string d = dir.path();
  const std::string endpoint = "127.0.0.1:" + std::to_string(freeTcpPort());
  const std::string id = runId("spare-drain");
  const std::vector<std::string> args = {"print", "up {rank} {restart}", "wait-file", d + "/go",
                                         "60"};
  Agents agents;
  for (int i = 0; i < 3; ++i) {
    agents.push_back(agent("c10d", endpoint, id, "2:2", args, {"--metrics-port=0"}));
  }
  std::vector<size_t> active = activeAndSpares(agents, 2);
  const size_t spare = 3 - active[0] - active[1];
  auto answer = httpRequestRaw(metricsPort(*agents[spare]), "POST", "/leave", 20s);
  REQUIRE(answer.has_value());
  CHECK_THAT(*answer, Catch::StartsWith("HTTP/1.1 202"));
  {
    INFO(agents[spare]->output());
    CHECK(waitExit(*agents[spare]) == 0);
    CHECK_THAT(agents[spare]->output(), Catch::Contains("this spare gave up its place") &&
                                            Catch::Contains("this node left the job as asked"));
  }
  std::ofstream(d + "/go").put('\n');
  for (size_t i : active) {
    INFO(agents[i]->output());
    CHECK(waitExit(*agents[i]) == 0);
    CHECK_THAT(agents[i]->output(), Catch::Contains("all 2 workers of 2 nodes succeeded"));
  }
}

namespace {

// A job of exactly 2 with one spare; rank 0's worker fails in attempt 0 (--max-restarts=1): the
// same two nodes restart (a spare replaces lost or departed nodes, never live ones, though it
// holds the first slot of the round they re-form in), and the spare exits 0 unneeded.
void failureKeepsTheNodes(const std::string& backend, const std::string& endpoint) {
  TempDir dir;
  const std::string d = dir.path();
  const std::string id = runId("keep");
  const std::vector<std::string> args = {
      "print", "up {rank} {restart}", "wait-file", d + "/go", "60", "exit-if-restart", "1",
      "0",     "exit-if-rank",        "0",         "3"};
  Agents agents;
  for (int i = 0; i < 3; ++i) {
    std::vector<std::string> extra = {"--max-restarts=1"};
    agents.push_back(agent(backend, endpoint, id, "2:2", args, extra));
  }
  std::vector<size_t> active = activeAndSpares(agents, 2);
  const size_t spare = 3 - active[0] - active[1];
  std::ofstream(d + "/go").put('\n');
  for (size_t i : active) {
    INFO(agents[i]->output());
    CHECK(waitExit(*agents[i]) == 0);
    CHECK_THAT(agents[i]->output(), Catch::Contains("restarting every node (restart 1 of 1)") &&
                                        Catch::Contains("all 2 workers of 2 nodes succeeded"));
  }
  INFO(agents[spare]->output());
  CHECK(waitExit(*agents[spare]) == 0);
  CHECK(agents[spare]->output().find("[default") == std::string::npos);
  CHECK_THAT(agents[spare]->output(), Catch::Contains("the job did not need it"));
}

}  // namespace

TEST_CASE("hot spares (c10d): a worker failure restarts the same nodes, the spare stays a spare",
          "[integration][multinode][elastic][spares]") {
  failureKeepsTheNodes("c10d", "127.0.0.1:" + std::to_string(freeTcpPort()));
}

// At torchrun's default keep-alive (5 s x 3): a SIGKILLed node never acknowledges the stop its
// peer's failure claims, so the decider gives it up after kStopAckBound (1 s), not the 15 s
// heartbeat bound, and the spare's worker of the next attempt runs within 5 s of the kill.
TEST_CASE("hot spares (c10d): at the default keep-alive a spare runs within 5 s of a node's kill",
          "[integration][multinode][elastic][spares]") {
  TempDir dir;
  const std::string d = dir.path();
  const std::string id = runId("fastloss");
  const std::string endpoint = "127.0.0.1:" + std::to_string(freeTcpPort());
  // Attempt 0 runs until its peer is gone ("peer-gone": what a collective's connection reset
  // is to a real trainer), then fails; attempt 1 prints and succeeds.
  const std::vector<std::string> args = {"print",
                                         "up {rank} {restart}",
                                         "exit-if-restart",
                                         "1",
                                         "0",
                                         "wait-file",
                                         d + "/peer-gone",
                                         "120",
                                         "exit",
                                         "1"};
  Agents agents;
  for (int i = 0; i < 3; ++i) {
    agents.push_back(
        agent("c10d", endpoint, id, "2:2", args, {}, "last_call_timeout=1,join_timeout=60"));
  }
  std::vector<size_t> active = activeAndSpares(agents, 2);
  const size_t host = servesStore(*agents[active[0]]) ? active[0] : active[1];
  REQUIRE(servesStore(*agents[host]));
  const size_t victim = host == active[0] ? active[1] : active[0];
  const size_t spare = 3 - active[0] - active[1];
  const auto killed_at = std::chrono::steady_clock::now();
  killAgentOf(*agents[victim]);  // its worker dies by its parent-death signal
  std::ofstream(d + "/peer-gone").put('\n');
  const bool spare_ran = agents[spare]->waitForLine("[default", 30s).has_value();
  const auto took = std::chrono::steady_clock::now() - killed_at;
  INFO(agents[host]->output());
  INFO(agents[spare]->output());
  REQUIRE(spare_ran);
  CHECK(took < 5s);
  for (size_t i : {host, spare}) {
    ChildProcess& a = *agents[i];
    CHECK(waitExit(a) == 0);
    CHECK_THAT(a.output(), Catch::Contains("all 2 workers of 2 nodes succeeded"));
  }
  CHECK_THAT(agents[host]->output(),
             Catch::Contains("did not acknowledge the stop of attempt 0 within 1.0 s") &&
                 Catch::Contains("restarts used: 0 of 0"));
  waitExit(*agents[victim]);
  CHECK(allGone(processesMentioning(d)));
}

// The same with the node's agent stopped (SIGSTOP) instead of killed: given up after 1 s like a
// dead one, it acknowledges late once resumed and goes on as an agent lost by heartbeat does:
// it stops its workers and, the group full, waits in the next round as a spare the job did not
// need (exit 0), as a node lost by heartbeat does.
TEST_CASE("hot spares (c10d): an agent stopped past the stop's acknowledgement is given up",
          "[integration][multinode][elastic][spares]") {
  TempDir dir;
  const std::string d = dir.path();
  const std::string id = runId("lateack");
  const std::string endpoint = "127.0.0.1:" + std::to_string(freeTcpPort());
  // Each rank waits for its gate; attempt 0 then fails (the store host's rank: its peer is gone;
  // the stopped node's rank is stopped by that, never by its own gate), attempt 1 succeeds.
  const std::vector<std::string> args = {"print",     "up {rank} {restart}",
                                         "wait-file", d + "/gate-{restart}-{rank}",
                                         "120",       "exit-if-restart",
                                         "0",         "1",
                                         "exit",      "0"};
  Agents agents;
  for (int i = 0; i < 3; ++i) {
    agents.push_back(
        agent("c10d", endpoint, id, "2:2", args, {}, "last_call_timeout=1,join_timeout=60"));
  }
  std::vector<size_t> active = activeAndSpares(agents, 2);
  const size_t host = servesStore(*agents[active[0]]) ? active[0] : active[1];
  REQUIRE(servesStore(*agents[host]));
  const size_t victim = host == active[0] ? active[1] : active[0];
  const size_t spare = 3 - active[0] - active[1];
  std::vector<pid_t> victim_agent = cpprun::agent::childrenOf(agents[victim]->pid());
  REQUIRE(victim_agent.size() == 1);
  REQUIRE(::kill(victim_agent[0], SIGSTOP) == 0);
  // The store host's rank in attempt 0, from its worker's "up <rank> 0".
  const size_t up = agents[host]->output().find("up ");
  REQUIRE(up != std::string::npos);
  const char host_rank = agents[host]->output()[up + 3];
  std::ofstream(d + "/gate-0-" + host_rank).put('\n');
  const bool spare_ran = agents[spare]->waitForLine("[default", 30s).has_value();
  REQUIRE(::kill(victim_agent[0], SIGCONT) == 0);
  INFO(agents[victim]->output());
  const bool victim_waits = agents[victim]->waitForText("waits as a spare", 30s);
  for (const char* gate : {"/gate-1-0", "/gate-1-1"}) std::ofstream(d + gate).put('\n');
  for (size_t i : {host, spare}) {
    ChildProcess& a = *agents[i];
    INFO(a.output());
    CHECK(spare_ran);
    CHECK(victim_waits);
    CHECK(waitExit(a) == 0);
  }
  CHECK(waitExit(*agents[victim]) == 0);
  CHECK_THAT(agents[host]->output(),
             Catch::Contains("did not acknowledge the stop of attempt 0 within 1.0 s") &&
                 Catch::Contains("restarts used: 0 of 0") &&
                 Catch::Contains("all 2 workers of 2 nodes succeeded"));
  CHECK_THAT(agents[victim]->output(),
             Catch::Contains("another node stopped attempt 0") &&
                 Catch::Contains("this node waited as a spare and the job did not need it"));
  CHECK(allGone(processesMentioning(d)));
}

TEST_CASE("hot spares (etcd): a worker failure restarts the same nodes, the spare stays a spare",
          "[integration][multinode][etcd][spares]") {
  EtcdCluster cluster;
  failureKeepsTheNodes("etcd", cluster.endpointsFlag());
}
