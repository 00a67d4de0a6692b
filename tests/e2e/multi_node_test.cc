// Several cpprun agents forming one job on this host (one "node" each, all on 127.0.0.1): the
// static rendezvous, job-wide restarts from one budget, one root cause on every node, lost
// agents and a lost store host, scheduler discovery. Every wait is bounded; synchronisation
// goes through relayed worker lines and process exits.
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "agent/processes/process_launcher.h"
#include "rendezvous/tcp_store_client.h"
#include "tests/support/cpprun_test_helpers.h"
#include "tests/support/test_support.h"

namespace {

using namespace cpprun::testing;

struct Node {
  int rank;
  int nproc;
  std::vector<std::string> worker_args;
  std::map<std::string, std::string> env = {};
};

// Starts one agent per node, node 0 last (the others must wait for its store).
std::vector<std::unique_ptr<ChildProcess>> startJob(int port, const std::vector<Node>& nodes,
                                                    const std::vector<std::string>& extra = {}) {
  std::vector<std::unique_ptr<ChildProcess>> agents(nodes.size());
  for (size_t i = nodes.size(); i-- > 0;) {
    const Node& n = nodes[i];
    std::vector<std::string> args = {"--nnodes=" + std::to_string(nodes.size()),
                                     "--node-rank=" + std::to_string(n.rank),
                                     "--nproc-per-node=" + std::to_string(n.nproc),
                                     "--master-addr=127.0.0.1",
                                     "--master-port=" + std::to_string(port),
                                     "--rdzv-conf=keep_alive_interval=0.3,join_timeout=60"};
    args.insert(args.end(), extra.begin(), extra.end());
    args.push_back("--no-python");
    args.push_back(kWorker);
    args.insert(args.end(), n.worker_args.begin(), n.worker_args.end());
    agents[i] = std::make_unique<ChildProcess>(cpprunCommand(args), n.env);
  }
  return agents;
}

// The failure report's root-cause section of an agent's output (it must have one).
std::string rootCauseSection(const std::string& out) {
  const size_t root = out.find("Root Cause (first observed failure):");
  REQUIRE(root != std::string::npos);
  return out.substr(root, out.find("=====", root) - root);
}

int waitExit(ChildProcess& agent, std::chrono::milliseconds bound = 60s) {
  auto status = agent.wait(bound);
  REQUIRE(status.has_value());
  return exitCodeOf(*status);
}

}  // namespace

TEST_CASE("three agents form one job: ranks contiguous in node order, one store, one NCCL id",
          "[integration][multinode]") {
  TempDir dir;
  const std::string d = dir.path();
  const std::vector<std::string> env_json = {"env-json", d + "/env-{rank}.json"};
  // Node 2's last worker writes a key; node 0's first worker reads it through the same store.
  std::vector<std::string> writer = env_json;
  writer.insert(writer.end(), {"store-set", "from-{rank}", "hello"});
  std::vector<std::string> reader = env_json;
  reader.insert(reader.end(), {"store-get", "from-5", d + "/read-{rank}"});
  auto agents = startJob(freeTcpPort(), {{0, 2, reader}, {1, 1, env_json}, {2, 3, writer}},
                         {"--rdzv-id=three"});
  for (auto& a : agents) {
    INFO(a->output());
    CHECK(waitExit(*a) == 0);
  }
  const int group_of[] = {0, 0, 1, 2, 2, 2};
  const int local_of[] = {0, 1, 0, 0, 1, 2};
  const int local_size_of[] = {2, 2, 1, 3, 3, 3};
  std::set<std::string> ports;
  std::set<std::string> nccl_ids;
  for (int r = 0; r < 6; ++r) {
    Json e = readJson(d + "/env-" + std::to_string(r) + ".json");
    INFO("rank " << r);
    CHECK(e["RANK"] == std::to_string(r));
    CHECK(e["WORLD_SIZE"] == "6");
    CHECK(e["LOCAL_RANK"] == std::to_string(local_of[r]));
    CHECK(e["LOCAL_WORLD_SIZE"] == std::to_string(local_size_of[r]));
    CHECK(e["GROUP_RANK"] == std::to_string(group_of[r]));
    CHECK(e["GROUP_WORLD_SIZE"] == "3");
    CHECK(e["ROLE_RANK"] == std::to_string(r));
    CHECK(e["ROLE_WORLD_SIZE"] == "6");
    CHECK(e["MASTER_ADDR"] == "127.0.0.1");
    CHECK(e["TORCHELASTIC_RUN_ID"] == "three");
    ports.insert(e["MASTER_PORT"].get<std::string>());
    if (e.contains("CPPRUN_NCCL_UNIQUE_ID")) nccl_ids.insert(e["CPPRUN_NCCL_UNIQUE_ID"]);
  }
  CHECK(ports.size() == 1);
  CHECK(nccl_ids.size() <= 1);  // one id for the whole job (none without NCCL)
  CHECK(readFile(d + "/read-0") == "hello");
}

TEST_CASE("a worker failure on one node restarts every node from one job-wide budget",
          "[integration][multinode]") {
  TempDir dir;
  const std::string d = dir.path();
  // Rank 2 (node 1) fails in attempts 0 and 1; the budget of 2 restarts is the job's, so
  // attempt 2 runs everywhere and succeeds.
  std::vector<std::string> failing = {"env-json",
                                      d + "/env-{rank}-{restart}.json",
                                      "exit-if-restart",
                                      "0",
                                      "3",
                                      "exit-if-restart",
                                      "1",
                                      "4"};
  auto agents = startJob(freeTcpPort(),
                         {{0, 2, {"env-json", d + "/env-{rank}-{restart}.json"}}, {1, 1, failing}},
                         {"--max-restarts=2"});
  for (auto& a : agents) {
    INFO(a->output());
    CHECK(waitExit(*a) == 0);
    CHECK(a->output().find("restarting every node (restart 2 of 2)") != std::string::npos);
  }
  for (int r = 0; r < 3; ++r) {
    Json e = readJson(d + "/env-" + std::to_string(r) + "-2.json");
    CHECK(e["TORCHELASTIC_RESTART_COUNT"] == "2");
    CHECK(e["TORCHELASTIC_MAX_RESTARTS"] == "2");
  }
}

TEST_CASE("with no restart left every node names the same root cause and exits 1",
          "[integration][multinode]") {
  TempDir dir;
  const std::string d = dir.path();
  // Node 0's workers exit on their own when stopped (143, as a worker whose collective broke
  // would), so they are collateral; rank 2 fails only once they are armed for that.
  auto agents =
      startJob(freeTcpPort(), {{0,
                                2,
                                {"on-signal", "TERM", d + "/term-{rank}", "store-set",
                                 "armed-{rank}", "1", "sleep-forever"}},
                               {1,
                                1,
                                {"store-get", "armed-0", d + "/seen-0", "store-get", "armed-1",
                                 d + "/seen-1", "eprint", "loading shard 9", "write-error-file",
                                 "nested", "ValueError: shard 9 is corrupt", "exit", "7"}}});
  std::string root_cause_lines[2];
  for (size_t i = 0; i < agents.size(); ++i) {
    ChildProcess& a = *agents[i];
    INFO(a.output());
    CHECK(waitExit(a) == 1);
    const std::string& out = a.output();
    root_cause_lines[i] = rootCauseSection(out);
    CHECK_THAT(root_cause_lines[i], Catch::Contains("rank      : 2 (local_rank: 0)") &&
                                        Catch::Contains("ValueError: shard 9 is corrupt") &&
                                        Catch::Contains("loading shard 9"));
    // Node 0's workers failed because of it: listed as collateral, never the root cause.
    CHECK_THAT(out,
               Catch::Contains("(collateral: failed after the root cause had stopped the job)"));
    CHECK(root_cause_lines[i].find("collateral") == std::string::npos);
  }
  // The same root cause on every node (the time line is formatted in local time, the same
  // here); only the order of the other entries may differ.
  CHECK(root_cause_lines[0] == root_cause_lines[1]);
}

TEST_CASE("a killed agent is named by every node and the job ends within the heartbeat bound",
          "[integration][multinode]") {
  TempDir dir;
  const std::string d = dir.path();
  // The directory in every worker's command line lets the test find them wherever they are.
  const std::vector<std::string> wait_args = {"touch", d + "/up-{rank}", "print", "ready {rank}",
                                              "sleep-forever"};
  auto agents = startJob(freeTcpPort(), {{0, 2, wait_args}, {1, 1, wait_args}});
  REQUIRE(relayed(*agents[1], "[default2]:ready"));
  REQUIRE(relayed(*agents[0], "[default0]:ready"));
  const auto killed = std::chrono::steady_clock::now();
  killAgentOf(*agents[1]);
  INFO(agents[0]->output());
  CHECK(waitExit(*agents[0]) == 1);
  // keep_alive_interval 0.3 s x 3 attempts, plus one interval of checking and the teardown.
  CHECK(std::chrono::steady_clock::now() - killed < 5s);
  CHECK_THAT(agents[0]->output(),
             Catch::Contains("the agent of node 1") && Catch::Contains("stopped responding"));
  waitExit(*agents[1]);
  CHECK(allGone(processesMentioning(d)));
}

TEST_CASE("a signal one node receives reaches every node's workers as that signal",
          "[integration][multinode]") {
  // Slurm signals the agents one by one; the first to get SIGUSR1 (a pre-emption warning)
  // must not have the other nodes' workers SIGTERMed before they can checkpoint.
  TempDir dir;
  const std::string d = dir.path();
  const std::vector<std::string> args = {"on-signal", "USR1",         d + "/sig-{rank}",
                                         "print",     "ready {rank}", "sleep-forever"};
  auto agents = startJob(freeTcpPort(), {{0, 1, args}, {1, 2, args}},
                         {"--signals-to-handle=SIGTERM,SIGUSR1"});
  REQUIRE(relayed(*agents[1], "[default2]:ready"));
  REQUIRE(relayed(*agents[1], "[default1]:ready"));
  REQUIRE(relayed(*agents[0], "[default0]:ready"));
  agents[0]->signal(SIGUSR1);  // node 0 only
  INFO(agents[0]->output() << "\n--- node 1 ---\n" << agents[1]->output());
  CHECK(waitExit(*agents[0]) == 128 + SIGUSR1);
  CHECK(waitExit(*agents[1]) == 128 + SIGUSR1);
  CHECK_THAT(agents[1]->output(), Catch::Contains("forwarding SIGUSR1 to the workers"));
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r);
    CHECK_THAT(readFile(d + "/sig-" + std::to_string(r)), Catch::StartsWith("SIGUSR1 "));
  }
}

TEST_CASE("a node whose workers finish long before the others' waits for them, not join_timeout",
          "[integration][multinode]") {
  // join_timeout bounds joining; after that, only liveness bounds the wait for the outcome.
  TempDir dir;
  auto agents =
      startJob(freeTcpPort(),
               {{0, 1, {"sleep", "3", "print", "done {rank}"}}, {1, 1, {"print", "done {rank}"}}},
               {"--rdzv-conf=keep_alive_interval=0.3,join_timeout=1"});
  const int node1 = waitExit(*agents[1]);
  const int node0 = waitExit(*agents[0]);
  INFO(agents[0]->output() << "\n--- node 1 ---\n" << agents[1]->output());
  CHECK(node1 == 0);
  CHECK(node0 == 0);
  CHECK_THAT(agents[1]->output(), Catch::Contains("all 2 workers of 2 nodes succeeded"));
}

TEST_CASE("the store host killed: the other nodes stop their workers and exit 4",
          "[integration][multinode]") {
  TempDir dir;
  const std::string d = dir.path();
  // The directory in every worker's command line lets the test find them wherever they are.
  const std::vector<std::string> wait_args = {"touch", d + "/up-{rank}", "print", "ready {rank}",
                                              "sleep-forever"};
  auto agents = startJob(freeTcpPort(), {{0, 1, wait_args}, {1, 2, wait_args}});
  REQUIRE(relayed(*agents[0], "[default0]:ready"));
  REQUIRE(relayed(*agents[1], "[default2]:ready"));
  // The agent itself dies (an OOM kill, say), not the cpprun process above it, which would
  // first pass a SIGTERM on to the agent and let it stop the job in order.
  const auto killed = std::chrono::steady_clock::now();
  killAgentOf(*agents[0]);
  INFO(agents[1]->output());
  CHECK(waitExit(*agents[1]) == 4);
  CHECK(std::chrono::steady_clock::now() - killed < 5s);
  CHECK_THAT(agents[1]->output(), Catch::Contains("lost the job's store at 127.0.0.1:"));
  waitExit(*agents[0]);
  CHECK(allGone(processesMentioning(d)));
}

TEST_CASE("a store host stopped for less than the keep-alive bound blames nobody, the job goes on",
          "[integration][multinode]") {
  TempDir dir;
  const std::string d = dir.path();
  const std::vector<std::string> args = {"print", "ready {rank}", "wait-file", d + "/go", "60"};
  auto agents = startJob(freeTcpPort(), {{0, 1, args}, {1, 1, args}});
  requireEveryAgentRelays(agents);
  // keep_alive_interval 0.3 s x 3: the bound is 0.9 s. Stop the store host's agent (and the
  // store with it) three times for 0.7 s: longer than two intervals, shorter than the bound.
  // Before, node 0 blamed node 1 on waking, for the heartbeats queued behind its own stop.
  std::vector<pid_t> host_agent = cpprun::agent::childrenOf(agents[0]->pid());
  REQUIRE(host_agent.size() == 1);
  for (int i = 0; i < 3; ++i) {
    REQUIRE(::kill(host_agent[0], SIGSTOP) == 0);
    std::this_thread::sleep_for(700ms);  // the stimulus: how long the host stays stopped
    REQUIRE(::kill(host_agent[0], SIGCONT) == 0);
    std::this_thread::sleep_for(300ms);  // and how long it runs in between
  }
  // Nothing to wait for: a false loss would show within one check after waking. Give the
  // heartbeat checks a full bound and an interval to (wrongly) find one.
  std::this_thread::sleep_for(1200ms);
  std::ofstream(d + "/go").put('\n');
  for (auto& a : agents) {
    INFO(a->output());
    CHECK(waitExit(*a) == 0);
    CHECK_THAT(a->output(),
               !Catch::Contains("stopped responding") && !Catch::Contains("lost the job's store"));
  }
}

TEST_CASE("a node that never comes: the join times out naming it", "[integration][multinode]") {
  ChildProcess alone(
      cpprunCommand({"--nnodes=3", "--node-rank=0", "--master-addr=127.0.0.1",
                     "--master-port=" + std::to_string(freeTcpPort()), "--rdzv-conf=join_timeout=1",
                     "--no-python", kWorker, "exit", "0"}));
  INFO(alone.output());
  CHECK(waitExit(alone) == 4);
  CHECK_THAT(alone.output(), Catch::Contains("nodes 1, 2 did not join within 1"));
}

TEST_CASE("a join of 50,000 nodes ends on its timeout with short log lines",
          "[integration][multinode]") {
  // Before: one key per node in every wait and one CHECK round trip per missing node at the
  // timeout (and per notice), and every missing node named in one line: with --nnodes=100000
  // a 1 s join timeout took several seconds and printed megabyte lines.
  const auto began = std::chrono::steady_clock::now();
  ChildProcess alone(
      cpprunCommand({"--nnodes=50000", "--node-rank=0", "--master-addr=127.0.0.1",
                     "--master-port=" + std::to_string(freeTcpPort()), "--rdzv-conf=join_timeout=1",
                     "--no-python", kWorker, "exit", "0"}));
  const int code = waitExit(alone);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  INFO(alone.output().substr(0, 4000));
  CHECK(code == 4);
  CHECK_THAT(alone.output(), Catch::Contains("49,999 of 50,000 nodes (1, 2, 3, 4, 5, 6, 7, 8 and "
                                             "49,991 more) did not join within 1"));
  // The timeout plus the agent's start and end (generous for the sanitizer builds on 2 cores).
  CHECK(seconds < 1 + 2.0);
  size_t longest = 0;
  std::istringstream lines(alone.output());
  for (std::string line; std::getline(lines, line);) longest = std::max(longest, line.size());
  CHECK(longest < 1000);
}

TEST_CASE("mpirun's and srun's variables form the job without rendezvous flags",
          "[integration][multinode]") {
  TempDir dir;
  const std::string d = dir.path();
  const std::string port = std::to_string(freeTcpPort());
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int r = 1; r >= 0; --r) {
    agents.push_back(std::make_unique<ChildProcess>(
        cpprunCommand({"--no-python", kWorker, "env-json", d + "/env-{rank}.json"}),
        std::map<std::string, std::string>{{"OMPI_COMM_WORLD_RANK", std::to_string(r)},
                                           {"OMPI_COMM_WORLD_SIZE", "2"},
                                           {"PMIX_NAMESPACE", "prterun-test@1"},
                                           {"MASTER_ADDR", "127.0.0.1"},
                                           {"MASTER_PORT", port}}));
  }
  for (auto& a : agents) {
    INFO(a->output());
    CHECK(waitExit(*a) == 0);
  }
  for (int r = 0; r < 2; ++r) {
    Json e = readJson(d + "/env-" + std::to_string(r) + ".json");
    CHECK(e["WORLD_SIZE"] == "2");
    CHECK(e["GROUP_RANK"] == std::to_string(r));
    CHECK(e["MASTER_PORT"] == port);
    CHECK(e["TORCHELASTIC_RUN_ID"] == "prterun-test@1");
  }

  // Slurm: --dry-run shows each discovered value and where it came from.
  ChildProcess dry(cpprunCommand({"--dry-run", "--no-python", kWorker}),
                   {{"SLURM_JOB_ID", "4242"},
                    {"SLURM_STEP_ID", "0"},
                    {"SLURM_PROCID", "1"},
                    {"SLURM_STEP_NUM_TASKS", "2"},
                    {"SLURM_STEP_NODELIST", "gpu[07-08]"}});
  INFO(dry.output());
  CHECK(waitExit(dry) == 0);
  CHECK_THAT(dry.output(), Catch::Contains("discovered  slurm") &&
                               Catch::Contains("--node-rank from SLURM_PROCID=1") &&
                               Catch::Contains("--nnodes    from SLURM_STEP_NUM_TASKS=2") &&
                               Catch::Contains("--master-addr from first host of "
                                               "SLURM_STEP_NODELIST") &&
                               Catch::Contains("store       gpu07:14242"));
}

TEST_CASE("mpirun -np 2 cpprun: one agent per rank forms one job", "[integration][mpi]") {
  // Open MPI comes from the set-up script: missing here is a failure, not a skip.
  REQUIRE(::access("/usr/bin/mpirun", X_OK) == 0);
  TempDir dir;
  const std::string d = dir.path();
  const std::string port = std::to_string(freeTcpPort());
  ChildProcess run(
      {"/usr/bin/mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none", "-x",
       "MASTER_ADDR=127.0.0.1", "-x", "MASTER_PORT=" + port, CPPRUN_BINARY, "--nproc-per-node=2",
       "--no-python", kWorker, "env-json", d + "/env-{rank}.json"},
      {{"OMPI_ALLOW_RUN_AS_ROOT", "1"}, {"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"}});
  INFO(run.output());
  CHECK(waitExit(run) == 0);
  std::set<std::string> run_ids;
  for (int r = 0; r < 4; ++r) {
    Json e = readJson(d + "/env-" + std::to_string(r) + ".json");
    INFO("rank " << r);
    CHECK(e["WORLD_SIZE"] == "4");
    CHECK(e["GROUP_RANK"] == std::to_string(r / 2));
    CHECK(e["GROUP_WORLD_SIZE"] == "2");
    CHECK(e["LOCAL_RANK"] == std::to_string(r % 2));
    CHECK(e["MASTER_PORT"] == port);
    run_ids.insert(e["TORCHELASTIC_RUN_ID"].get<std::string>());
  }
  CHECK(run_ids.size() == 1);
  CHECK(run_ids.count("none") == 0);  // the job id came from mpirun (PMIX_NAMESPACE)

  // The recipe users copy (examples/mpi/), with its agents on this one host.
  ChildProcess recipe({sourcePath("examples/mpi/cpprun-mpirun.sh"), "-np", "2", "--oversubscribe",
                       "--", "--no-python", kWorker, "env-json", d + "/recipe-{rank}.json"},
                      {{"OMPI_ALLOW_RUN_AS_ROOT", "1"},
                       {"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"},
                       {"MPIRUN_MAP_BY", "slot"},
                       {"CPPRUN", CPPRUN_BINARY},
                       {"CPPRUN_NPROC", "1"},
                       {"MASTER_ADDR", "127.0.0.1"},
                       {"MASTER_PORT", std::to_string(freeTcpPort())}});
  INFO(recipe.output());
  CHECK(waitExit(recipe) == 0);
  for (int r = 0; r < 2; ++r) {
    Json e = readJson(d + "/recipe-" + std::to_string(r) + ".json");
    CHECK(e["GROUP_RANK"] == std::to_string(r));
    CHECK(e["WORLD_SIZE"] == "2");
  }
}

namespace {

// An elastic agent on 127.0.0.1: the first of them to bind the endpoint serves the store.
// `run_id`: its --rdzv-id, when not empty.
std::unique_ptr<ChildProcess> elasticAgent(int port, const std::string& nnodes,
                                           const std::vector<std::string>& worker_args,
                                           const std::map<std::string, std::string>& env = {},
                                           const std::string& run_id = "") {
  std::vector<std::string> args = {"--nnodes=" + nnodes, "--rdzv-backend=c10d",
                                   "--rdzv-endpoint=127.0.0.1:" + std::to_string(port),
                                   "--rdzv-conf=keep_alive_interval=0.3,last_call_timeout=1",
                                   "--nproc-per-node=1"};
  if (!run_id.empty()) args.push_back("--rdzv-id=" + run_id);
  args.insert(args.end(), {"--no-python", kWorker});
  args.insert(args.end(), worker_args.begin(), worker_args.end());
  return std::make_unique<ChildProcess>(cpprunCommand(args), env);
}

// The node number of every rendezvous this agent completed, in order.
std::vector<int> nodeNumbers(const std::string& output) {
  std::vector<int> numbers;
  const std::string marker = "this node is node ";
  for (size_t at = output.find(marker); at != std::string::npos; at = output.find(marker, at + 1)) {
    numbers.push_back(std::atoi(output.c_str() + at + marker.size()));
  }
  return numbers;
}

bool servesStore(ChildProcess& cpprun) {
  return cpprun.output().find("this agent serves the job's store") != std::string::npos;
}

}  // namespace

TEST_CASE("elastic: a killed agent leaves the others to re-form with fewer nodes and finish",
          "[integration][multinode][elastic]") {
  TempDir dir;
  const std::string d = dir.path();
  const int port = freeTcpPort();
  // Attempt 0 waits forever; the re-formed attempt 1 writes its environment and succeeds.
  const std::vector<std::string> args = {"print", "up {rank} {restart}", "exit-if-restart", "1",
                                         "0",     "sleep-forever"};
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int i = 0; i < 3; ++i) agents.push_back(elasticAgent(port, "2:3", args));
  requireEveryAgentRelays(agents);
  // Kill an agent that does not serve the store.
  size_t victim = servesStore(*agents[0]) ? 1 : 0;
  killAgentOf(*agents[victim]);
  for (size_t i = 0; i < agents.size(); ++i) {
    if (i == victim) continue;
    ChildProcess& a = *agents[i];
    INFO(a.output());
    CHECK(waitExit(a) == 0);
    CHECK_THAT(a.output(), Catch::Contains("stopped responding") &&
                               Catch::Contains("re-forming the group") &&
                               Catch::Contains("rendezvous complete: 2 nodes") &&
                               Catch::Contains("all 2 workers of 2 nodes succeeded"));
  }
  waitExit(*agents[victim]);
}

TEST_CASE("elastic: an agent that comes late joins the running job, which re-forms with it",
          "[integration][multinode][elastic]") {
  TempDir dir;
  const std::string d = dir.path();
  const int port = freeTcpPort();
  const std::vector<std::string> args = {"env-json",
                                         d + "/env-{rank}-{restart}.json",
                                         "print",
                                         "up {rank} {restart}",
                                         "exit-if-restart",
                                         "1",
                                         "0",
                                         "sleep-forever"};
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int i = 0; i < 2; ++i) agents.push_back(elasticAgent(port, "2:3", args));
  // Both run attempt 0 (the round closed with 2 after the last call) ...
  requireEveryAgentRelays(agents);
  // ... when a third agent arrives.
  agents.push_back(elasticAgent(port, "2:3", args));
  for (auto& a : agents) {
    INFO(a->output());
    CHECK(waitExit(*a) == 0);
    CHECK_THAT(a->output(), Catch::Contains("all 3 workers of 3 nodes succeeded"));
  }
  CHECK_THAT(agents[0]->output() + agents[1]->output(),
             Catch::Contains("waiting to join; re-forming the group"));
  for (int r = 0; r < 3; ++r) {
    Json e = readJson(d + "/env-" + std::to_string(r) + "-1.json");
    CHECK(e["WORLD_SIZE"] == "3");
    CHECK(e["GROUP_WORLD_SIZE"] == "3");
  }
  // The two original nodes keep their order; the newcomer comes after them.
  CHECK(nodeNumbers(agents[0]->output()).size() == 2);
  CHECK(nodeNumbers(agents[0]->output())[0] == nodeNumbers(agents[0]->output())[1]);
  CHECK(nodeNumbers(agents[1]->output())[0] == nodeNumbers(agents[1]->output())[1]);
  CHECK(nodeNumbers(agents[2]->output()) == std::vector<int>{2});
}

TEST_CASE("elastic: nodes are ordered by the scheduler's rank, not by join order",
          "[integration][multinode][elastic]") {
  TempDir dir;
  const std::string d = dir.path();
  const int port = freeTcpPort();
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int r = 2; r >= 0; --r) {  // rank 2 joins first
    agents.push_back(elasticAgent(port, "3", {"env-json", d + "/env-{rank}.json"},
                                  {{"OMPI_COMM_WORLD_RANK", std::to_string(r)},
                                   {"OMPI_COMM_WORLD_SIZE", "3"},
                                   {"MASTER_ADDR", "127.0.0.1"}}));
  }
  for (auto& a : agents) {
    INFO(a->output());
    CHECK(waitExit(*a) == 0);
  }
  for (int r = 0; r < 3; ++r) {
    Json e = readJson(d + "/env-" + std::to_string(r) + ".json");
    CHECK(e["GROUP_RANK"] == e["OMPI_COMM_WORLD_RANK"]);
  }
}

TEST_CASE("elastic: a joiner that took a slot and never wrote its record does not block the round",
          "[integration][multinode][elastic]") {
  const int port = freeTcpPort();
  const std::vector<std::string> args = {"print", "up {rank}"};
  std::vector<std::unique_ptr<ChildProcess>> agents;
  agents.push_back(elasticAgent(port, "2:3", args));
  // Once the first agent has joined round 0, a joiner takes slot 2 and dies before writing its
  // record (or its reply was lost and it joined again): what a store host stopped at the wrong
  // moment leaves. The round used to wait for slot 2 until the join timeout.
  cpprun::rendezvous::TcpStoreClientOptions o;
  o.host = "127.0.0.1";
  o.port = static_cast<uint16_t>(port);
  o.connect_timeout = 30s;
  o.timeout = 30s;
  cpprun::rendezvous::TcpStoreClient dead_joiner(o);
  // The job's keys are in its run's namespace (no --rdzv-id: "none").
  dead_joiner.wait({"cpprun/none/rdzv/round/0/agent/1"}, 30s);
  REQUIRE(dead_joiner.add("cpprun/none/rdzv/round/0/joined", 1) == 2);
  agents.push_back(elasticAgent(port, "2:3", args));
  requireEveryAgentRelays(agents);
  for (auto& a : agents) {
    INFO(a->output());
    CHECK(waitExit(*a) == 0);
    CHECK_THAT(a->output(), Catch::Contains("rendezvous complete: 2 nodes"));
  }
}

TEST_CASE("elastic: a node declared lost while alive stops its workers and joins again",
          "[integration][multinode][elastic]") {
  TempDir dir;
  const std::string d = dir.path();
  const int port = freeTcpPort();
  const std::vector<std::string> args = {"print", "ready {restart}", "wait-file", d + "/go", "60"};
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int i = 0; i < 2; ++i) agents.push_back(elasticAgent(port, "1:2", args));
  requireEveryAgentRelays(agents);
  const size_t host = servesStore(*agents[0]) ? 0 : 1;
  ChildProcess& other = *agents[1 - host];
  // Stop the other agent for longer than the keep-alive bound (0.3 s x 3): the host declares
  // it lost and goes on alone (MIN is 1). Its workers, left running, would be outside the job.
  std::vector<pid_t> other_agent = cpprun::agent::childrenOf(other.pid());
  REQUIRE(other_agent.size() == 1);
  REQUIRE(::kill(other_agent[0], SIGSTOP) == 0);
  std::this_thread::sleep_for(1500ms);  // the stimulus: how long the agent stays stopped
  REQUIRE(::kill(other_agent[0], SIGCONT) == 0);
  // Once awake it stops its workers and joins again: its workers start anew.
  const bool started_again = other.waitForLine("[default", 30s).has_value();
  std::ofstream(d + "/go").put('\n');
  for (auto& a : agents) {
    INFO(a->output());
    CHECK(started_again);
    CHECK(waitExit(*a) == 0);
  }
  CHECK_THAT(agents[host]->output(), Catch::Contains("stopped responding"));
  CHECK_THAT(other.output(), Catch::Contains("the store host declared this node lost"));
}

TEST_CASE("elastic: with fewer than MIN nodes left the job fails naming the lost one",
          "[integration][multinode][elastic]") {
  const int port = freeTcpPort();
  const std::vector<std::string> args = {"print", "up {rank}", "sleep-forever"};
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int i = 0; i < 2; ++i) agents.push_back(elasticAgent(port, "2:3", args));
  requireEveryAgentRelays(agents);
  size_t victim = servesStore(*agents[0]) ? 1 : 0;
  size_t survivor = 1 - victim;
  killAgentOf(*agents[victim]);
  INFO(agents[survivor]->output());
  CHECK(waitExit(*agents[survivor]) == 1);
  CHECK_THAT(agents[survivor]->output(),
             Catch::Contains("stopped responding") &&
                 Catch::Contains("1 nodes left, fewer than the minimum 2"));
  waitExit(*agents[victim]);
}

TEST_CASE("a rank stalled on one node stops every node and is every node's root cause",
          "[integration][multinode][stall]") {
  TempDir dir;  // $TMPDIR of both agents: the run directories kept for the stall reports
  // Every rank reports progress once; rank 2 (node 1) then hangs, the others keep sleeping in
  // steps well under the bound (they must be stopped by the stall, not end on their own).
  auto agents = startJob(freeTcpPort(),
                         {{0, 2, {"progress-every", "60", "0.5"}, {{"TMPDIR", dir.path()}}},
                          {1,
                           1,
                           {"progress", "1", "stall-if-rank", "2", "progress-every", "60", "0.5"},
                           {{"TMPDIR", dir.path()}}}},
                         {"--stall-timeout=2", "--stall-stacks-timeout=30"});
  for (size_t i = 0; i < agents.size(); ++i) {
    ChildProcess& a = *agents[i];
    INFO(a.output());
    CHECK(waitExit(a) == 1);
    const std::string& out = a.output();
    const std::string root_cause = rootCauseSection(out);
    CHECK_THAT(root_cause, Catch::Contains("rank      : 2 (local_rank: 0)") &&
                               Catch::Contains("stalled: no progress for") &&
                               Catch::Contains("pauseForever"));
  }
  // Only node 1 detected it; node 0 was stopped by the announcement.
  CHECK_THAT(agents[1]->output(), Catch::Contains("rank 2 (local_rank 0, pid"));
  CHECK_THAT(agents[0]->output(), Catch::Contains("another node stopped attempt 0"));
}

TEST_CASE("elastic: an agent of another run id on the endpoint refuses the job there, naming both",
          "[integration][multinode][elastic]") {
  TempDir dir;
  const std::string d = dir.path();
  const int port = freeTcpPort();
  // Job a's first agent serves the store and waits for its second node ...
  auto a0 = elasticAgent(port, "2", {"env-json", d + "/a-{rank}.json"}, {}, "job-a");
  REQUIRE(a0->waitForText("this agent serves the job's store", 30s));
  // ... when an agent of job b comes to the same endpoint. Before, it joined job a's round and
  // the two ran as one job whose workers' TORCHELASTIC_RUN_ID differed between nodes.
  auto b = elasticAgent(port, "2", {"env-json", d + "/b-{rank}.json"}, {}, "job-b");
  {
    INFO(b->output());
    CHECK(waitExit(*b, 30s) == 4);
    CHECK_THAT(b->output(), Catch::Contains("serves the job with run id 'job-a'") &&
                                Catch::Contains("--rdzv-id 'job-b'"));
  }
  auto a1 = elasticAgent(port, "2", {"env-json", d + "/a-{rank}.json"}, {}, "job-a");
  for (auto* a : {a0.get(), a1.get()}) {
    INFO(a->output());
    CHECK(waitExit(*a) == 0);
    CHECK_THAT(a->output(), Catch::Contains("rendezvous complete: 2 nodes"));
  }
  for (int r = 0; r < 2; ++r) {
    Json e = readJson(d + "/a-" + std::to_string(r) + ".json");
    CHECK(e["TORCHELASTIC_RUN_ID"] == "job-a");
    CHECK(e["WORLD_SIZE"] == "2");
  }
  CHECK(readFile(d + "/b-0.json").empty());
  CHECK(readFile(d + "/b-1.json").empty());
}

TEST_CASE(
    "NCCL bootstrap at scale: above CPPRUN_NCCL_RANKS_PER_ID each id is made by the agent of "
    "its first rank's node and every rank of every node gets the same list",
    "[integration][multinode][nccl]") {
  TempDir dir;
  const std::string d = dir.path();
  const std::string stand_ins = CPPRUN_STAND_IN_DIR;
  auto node_env = [&](int devices) {
    return std::map<std::string, std::string>{
        {"LD_LIBRARY_PATH", stand_ins + "/driver"},
        {"CPPRUN_STAND_IN_CUDA_DEVICES", std::to_string(devices)},
        {"CPPRUN_NCCL_LIBRARY", stand_ins + "/nccl/libnccl.so.2"},
        {"NCCL_SOCKET_IFNAME", "lo"},
        {"CPPRUN_NCCL_RANKS_PER_ID", "2"}};
  };
  const std::vector<std::string> env_json = {"env-json", d + "/env-{rank}.json"};
  // 2 + 1 + 3 ranks, 2 per id: nId 3, blocks starting at ranks 0, 2 and 4: nodes 0, 1 and 2.
  auto agents = startJob(
      freeTcpPort(),
      {{0, 2, env_json, node_env(2)}, {1, 1, env_json, node_env(1)}, {2, 3, env_json, node_env(3)}},
      {"--rdzv-id=scalable"});
  for (auto& a : agents) {
    INFO(a->output());
    CHECK(waitExit(*a) == 0);
  }
  const Json e0 = readJson(d + "/env-0.json");
  const std::string ids = e0["CPPRUN_NCCL_UNIQUE_IDS"];
  REQUIRE(ids.size() == 3 * 256 + 2);
  // "cpprun-stand-in-nccl-id <call> <pid>": the pid is the agent that made the id.
  auto maker = [](const std::string& hex) {
    const Bytes bytes = fromHex(hex);
    const std::string text(bytes.begin(), bytes.end());
    REQUIRE_THAT(text, Catch::StartsWith("cpprun-stand-in-nccl-id "));
    const std::string until_nul(text.c_str());
    return until_nul.substr(until_nul.rfind(' ') + 1);
  };
  std::set<std::string> makers;
  for (int i = 0; i < 3; ++i) makers.insert(maker(ids.substr(static_cast<size_t>(i) * 257, 256)));
  CHECK(makers.size() == 3);  // one root per node, not all on node 0
  CHECK(maker(ids.substr(0, 256)) == maker(e0["CPPRUN_NCCL_UNIQUE_ID"]));  // node 0's agent
  for (int r = 1; r < 6; ++r) {
    INFO("rank " << r);
    CHECK(readJson(d + "/env-" + std::to_string(r) + ".json")["CPPRUN_NCCL_UNIQUE_IDS"] == ids);
  }
}
