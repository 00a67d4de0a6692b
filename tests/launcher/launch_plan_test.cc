// The launch plan: nproc resolution, worker command lines and torchrun's environment contract.
#include "launcher/launch_plan.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <csignal>
#include <map>
#include <optional>
#include <string>

namespace {

using namespace cpprun::launcher;

NodeResources node(std::vector<std::string> gpus, int cpus = 8) {
  NodeResources n;
  n.hostname = "n1";
  n.gpus = std::move(gpus);
  n.gpu_source = "test";
  n.usable_cpus = cpus;
  return n;
}

RendezvousOutcome singleNode(int world_size) {
  RendezvousOutcome r;
  r.world_size = world_size;
  r.master_addr = "127.0.0.1";
  r.master_port = 29500;
  r.run_id = "job7";
  return r;
}

LaunchConfig script(int nproc) {
  LaunchConfig c;
  c.nproc = nproc;
  c.entrypoint = "train.py";
  c.entrypoint_args = {"--lr", "0.1", "--out=ckpt-${local_rank}"};
  return c;
}

}  // namespace

TEST_CASE("nproc resolves from a number or the node's GPUs or CPUs", "[unit]") {
  LaunchConfig c;
  c.nproc = 3;
  CHECK(resolveNproc(c, node({})).value() == 3);
  c.nproc_kind = NprocKind::kGpu;
  CHECK(resolveNproc(c, node({"0", "1"})).value() == 2);
  auto none = resolveNproc(c, node({}));
  REQUIRE_FALSE(none.isOk());
  CHECK_THAT(none.status().message(), Catch::Contains("--nproc-per-node gpu: no GPU is visible"));
  c.nproc_kind = NprocKind::kCpu;
  CHECK(resolveNproc(c, node({"0"}, 6)).value() == 6);
  c.nproc_kind = NprocKind::kAuto;
  CHECK(resolveNproc(c, node({"0", "1", "2"}, 6)).value() == 3);
  CHECK(resolveNproc(c, node({}, 6)).value() == 6);
}

TEST_CASE("worker command lines follow torchrun's entry point rules", "[unit]") {
  LaunchConfig c = script(2);
  CHECK(workerCommand(c, {}, 1) ==
        std::vector<std::string>{"python3", "-u", "train.py", "--lr", "0.1", "--out=ckpt-1"});
  CHECK(workerCommand(c, {{"PYTHON_EXEC", "/usr/bin/python3"}}, 0).front() == "/usr/bin/python3");
  c.module = true;
  c.entrypoint = "pkg.train";
  CHECK(workerCommand(c, {}, 0) == std::vector<std::string>{"python3", "-u", "-m", "pkg.train",
                                                            "--lr", "0.1", "--out=ckpt-0"});
  c.module = false;
  c.entrypoint = "/opt/bin/trainer";  // not a .py: executed directly
  CHECK(workerCommand(c, {}, 0).front() == "/opt/bin/trainer");
  c.entrypoint = "train.py";
  c.no_python = true;
  CHECK(workerCommand(c, {}, 0).front() == "train.py");
}

TEST_CASE("every worker gets torchrun's variables", "[unit]") {
  LaunchConfig c = script(2);
  c.max_restarts = 3;
  c.role = "trainer";
  RendezvousOutcome r = singleNode(4);
  r.group_rank = 1;
  r.group_world_size = 2;
  r.base_rank = 2;
  r.restart_count = 1;
  r.nccl_unique_id_hex = "abcd";
  auto plan = makeLaunchPlan(c, node({"0", "1"}, 8), r, {}, "/logs/job7");
  REQUIRE(plan.isOk());
  REQUIRE(plan.value().workers.size() == 2);
  const auto& e = plan.value().workers[1].env;
  CHECK(e.at("LOCAL_RANK") == "1");
  CHECK(e.at("RANK") == "3");
  CHECK(e.at("GROUP_RANK") == "1");
  CHECK(e.at("GROUP_WORLD_SIZE") == "2");
  CHECK(e.at("ROLE_NAME") == "trainer");
  CHECK(e.at("ROLE_RANK") == "3");
  CHECK(e.at("ROLE_WORLD_SIZE") == "4");
  CHECK(e.at("LOCAL_WORLD_SIZE") == "2");
  CHECK(e.at("WORLD_SIZE") == "4");
  CHECK(e.at("MASTER_ADDR") == "127.0.0.1");
  CHECK(e.at("MASTER_PORT") == "29500");
  CHECK(e.at("TORCHELASTIC_RESTART_COUNT") == "1");
  CHECK(e.at("TORCHELASTIC_MAX_RESTARTS") == "3");
  CHECK(e.at("TORCHELASTIC_RUN_ID") == "job7");
  CHECK(e.at("TORCHELASTIC_USE_AGENT_STORE") == "True");
  CHECK(e.at("TORCHELASTIC_ERROR_FILE") == "/logs/job7/attempt_1/1/error.json");
  CHECK(e.at("TORCH_NCCL_ASYNC_ERROR_HANDLING") == "1");
  CHECK(e.at("NCCL_ASYNC_ERROR_HANDLING") == "1");
  CHECK(e.at("CUDA_VISIBLE_DEVICES") == "0,1");
  CHECK(e.at("OMP_NUM_THREADS") == "4");
  CHECK(e.at("CPPRUN_NCCL_UNIQUE_ID") == "abcd");
}

TEST_CASE("inherited settings win and absent ones stay absent", "[unit]") {
  LaunchConfig c = script(2);
  c.worker_hosts_store = true;
  auto plan = makeLaunchPlan(c, node({}, 8), singleNode(2),
                             {{"OMP_NUM_THREADS", "7"}, {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "0"}},
                             "/tmp/run");
  REQUIRE(plan.isOk());
  const auto& e = plan.value().workers[0].env;
  CHECK(e.count("OMP_NUM_THREADS") == 0);  // inherited as is
  CHECK(e.at("TORCH_NCCL_ASYNC_ERROR_HANDLING") == "0");
  CHECK(e.count("CUDA_VISIBLE_DEVICES") == 0);  // no GPUs: not invented
  CHECK(e.count("CPPRUN_NCCL_UNIQUE_ID") == 0);
  CHECK(e.at("TORCHELASTIC_USE_AGENT_STORE") == "False");
  // Without GPUs the agent makes no NCCL id: nothing is missing, nothing to note. With GPUs a
  // missing id is worth a note.
  auto nccl_note = [](const LaunchPlan& p) {
    bool found = false;
    for (const auto& n : p.notes) found |= n.find("NCCL") != std::string::npos;
    return found;
  };
  CHECK_FALSE(nccl_note(plan.value()));
  auto with_gpu = makeLaunchPlan(c, node({"0"}, 8), singleNode(1), {}, "/tmp/run");
  REQUIRE(with_gpu.isOk());
  CHECK(with_gpu.value().workers[0].env.count("CPPRUN_NCCL_UNIQUE_ID") == 0);
  CHECK(nccl_note(with_gpu.value()));
}

TEST_CASE("TORCHELASTIC_TIMER_FILE: read as torchrun reads it, given to every worker", "[unit]") {
  // Off unless TORCHELASTIC_ENABLE_FILE_TIMER is exactly "1".
  CHECK_FALSE(fileTimerPath({}, "/tmp/run"));
  CHECK_FALSE(fileTimerPath({{"TORCHELASTIC_ENABLE_FILE_TIMER", "true"}}, "/tmp/run"));
  CHECK_FALSE(fileTimerPath(
      {{"TORCHELASTIC_ENABLE_FILE_TIMER", "0"}, {"TORCHELASTIC_TIMER_FILE", "/tmp/mine"}},
      "/tmp/run"));
  CHECK(fileTimerPath({{"TORCHELASTIC_ENABLE_FILE_TIMER", "1"}}, "/tmp/run") ==
        std::optional<std::string>("/tmp/run/watchdog_timer"));
  // A relative --log-dir: the workers get an absolute path (they may change directory).
  const auto relative = fileTimerPath({{"TORCHELASTIC_ENABLE_FILE_TIMER", "1"}}, "logs/job");
  REQUIRE(relative);
  CHECK(relative->front() == '/');
  CHECK(relative->size() > std::string("/logs/job/watchdog_timer").size());
  CHECK(relative->rfind("/logs/job/watchdog_timer") ==
        relative->size() - std::string("/logs/job/watchdog_timer").size());
  CHECK(fileTimerPath({{"TORCHELASTIC_ENABLE_FILE_TIMER", "1"}, {"TORCHELASTIC_TIMER_FILE", ""}},
                      "/tmp/run") == std::optional<std::string>("/tmp/run/watchdog_timer"));
  const std::map<std::string, std::string> named = {{"TORCHELASTIC_ENABLE_FILE_TIMER", "1"},
                                                    {"TORCHELASTIC_TIMER_FILE", "/tmp/mine"}};
  CHECK(fileTimerPath(named, "/tmp/run") == std::optional<std::string>("/tmp/mine"));
  auto plan = makeLaunchPlan(script(2), node({}, 8), singleNode(2), named, "/tmp/run");
  REQUIRE(plan.isOk());
  for (const auto& w : plan.value().workers)
    CHECK(w.env.at("TORCHELASTIC_TIMER_FILE") == "/tmp/mine");
  auto off = makeLaunchPlan(script(1), node({}, 8), singleNode(1), {}, "/tmp/run");
  REQUIRE(off.isOk());
  CHECK(off.value().workers[0].env.count("TORCHELASTIC_TIMER_FILE") == 0);
}

TEST_CASE("OMP_NUM_THREADS divides the usable CPUs and is at least 1", "[unit]") {
  auto plan = makeLaunchPlan(script(4), node({}, 2), singleNode(4), {}, "/tmp/run");
  REQUIRE(plan.isOk());
  CHECK(plan.value().workers[3].env.at("OMP_NUM_THREADS") == "1");
  CHECK_THAT(plan.value().notes.front(), Catch::Contains("OMP_NUM_THREADS is unset"));
}

TEST_CASE("virtual local rank gives each worker its own GPU and LOCAL_RANK 0", "[unit]") {
  LaunchConfig c = script(2);
  c.virtual_local_rank = true;
  auto plan = makeLaunchPlan(c, node({"GPU-a", "GPU-b"}), singleNode(2), {}, "/tmp/run");
  REQUIRE(plan.isOk());
  CHECK(plan.value().workers[1].env.at("LOCAL_RANK") == "0");
  CHECK(plan.value().workers[1].env.at("RANK") == "1");
  CHECK(plan.value().workers[1].env.at("CUDA_VISIBLE_DEVICES") == "GPU-b");
  c.nproc = 3;
  auto too_many = makeLaunchPlan(c, node({"GPU-a", "GPU-b"}), singleNode(3), {}, "/tmp/run");
  REQUIRE_FALSE(too_many.isOk());
  CHECK_THAT(too_many.status().message(), Catch::Contains("--virtual-local-rank"));
}

TEST_CASE("the dry-run description names the store and every worker", "[unit]") {
  LaunchConfig c = script(2);
  auto plan = makeLaunchPlan(c, node({"0", "1"}), singleNode(2), {}, "/tmp/run");
  REQUIRE(plan.isOk());
  std::string text = describeLaunchPlan(c, node({"0", "1"}), singleNode(2), plan.value());
  CHECK_THAT(text, Catch::Contains("store       127.0.0.1:29500 (served by the agent)"));
  CHECK_THAT(text, Catch::Contains("worker local_rank 1 rank 1: python3 -u train.py"));
  CHECK_THAT(text, Catch::Contains("RANK=1"));
  CHECK_THAT(text, Catch::Contains("GPUs        0,1 (from test)"));
  RendezvousOutcome v6 = singleNode(2);
  v6.master_addr = "::1";
  const std::string v6_text = describeLaunchPlan(c, node({"0", "1"}), v6, plan.value());
  CHECK_THAT(v6_text, Catch::Contains("store       [::1]:29500 (served by the agent)"));
}

TEST_CASE("under Slurm each worker's task variables describe the worker, not the agent", "[unit]") {
  // Node 1 of 2 under `srun --ntasks-per-node=1 cpprun`: srun gave the agent SLURM_PROCID=1.
  RendezvousOutcome r = singleNode(4);
  r.group_rank = 1;
  r.group_world_size = 2;
  r.base_rank = 2;
  std::map<std::string, std::string> agent_env = {{"SLURM_JOB_ID", "42"},
                                                  {"SLURM_PROCID", "1"},
                                                  {"SLURM_NTASKS", "2"},
                                                  {"SLURM_JOB_NODELIST", "n[1-2]"}};
  auto plan = makeLaunchPlan(script(2), node({}), r, agent_env, "/tmp/run");
  REQUIRE(plan.isOk());
  for (int local = 0; local < 2; ++local) {
    const auto& e = plan.value().workers[static_cast<size_t>(local)].env;
    INFO("local rank " << local);
    CHECK(e.at("SLURM_PROCID") == std::to_string(2 + local));
    CHECK(e.at("SLURM_LOCALID") == std::to_string(local));
    CHECK(e.at("SLURM_NODEID") == "1");
    CHECK(e.at("SLURM_NTASKS") == "4");
    CHECK(e.at("SLURM_NPROCS") == "4");
    CHECK(e.at("SLURM_STEP_NUM_TASKS") == "4");
    CHECK(e.at("SLURM_STEP_NUM_NODES") == "2");
    CHECK(e.at("SLURM_NTASKS_PER_NODE") == "2");
    CHECK(e.at("SLURM_TASKS_PER_NODE") == "2(x2)");
    CHECK(e.at("SLURM_STEP_TASKS_PER_NODE") == "2(x2)");
    CHECK(e.count("SLURM_JOB_NODELIST") == 0);  // inherited unchanged, not overridden
    CHECK(e.count("OMPI_COMM_WORLD_RANK") == 0);
  }
  // One node: Slurm writes plain "2".
  auto single = makeLaunchPlan(script(2), node({}), singleNode(2), agent_env, "/tmp/run");
  CHECK(single.value().workers[0].env.at("SLURM_TASKS_PER_NODE") == "2");
}

TEST_CASE("under mpirun each worker's OMPI_COMM_WORLD_* describe the worker", "[unit]") {
  RendezvousOutcome r = singleNode(6);
  r.group_rank = 2;
  r.group_world_size = 3;
  r.base_rank = 4;
  auto plan =
      makeLaunchPlan(script(2), node({}), r,
                     {{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "3"}}, "/tmp/run");
  REQUIRE(plan.isOk());
  const auto& e = plan.value().workers[1].env;
  CHECK(e.at("OMPI_COMM_WORLD_RANK") == "5");
  CHECK(e.at("OMPI_COMM_WORLD_SIZE") == "6");
  CHECK(e.at("OMPI_COMM_WORLD_LOCAL_RANK") == "1");
  CHECK(e.at("OMPI_COMM_WORLD_LOCAL_SIZE") == "2");
  CHECK(e.at("OMPI_COMM_WORLD_NODE_RANK") == "1");
  CHECK(e.count("SLURM_PROCID") == 0);
}

TEST_CASE("outside a scheduler no scheduler variable is invented", "[unit]") {
  auto plan = makeLaunchPlan(script(2), node({}), singleNode(2), {}, "/tmp/run");
  for (const auto& kv : plan.value().workers[0].env) {
    INFO(kv.first);
    CHECK(kv.first.rfind("SLURM_", 0) != 0);
    CHECK(kv.first.rfind("OMPI_", 0) != 0);
  }
}

TEST_CASE("workers get the signals the agent handles, spelled as torchrun 2.x exports them",
          "[unit]") {
  LaunchConfig c = script(1);
  c.signals_to_handle = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};  // the CLI's default
  auto plan = makeLaunchPlan(c, node({}), singleNode(1), {}, "/tmp/run");
  REQUIRE(plan.isOk());
  CHECK(plan.value().workers[0].env.at("TORCHELASTIC_SIGNALS_TO_HANDLE") ==
        "SIGTERM,SIGINT,SIGHUP,SIGQUIT");
  c.signals_to_handle = {SIGUSR1, SIGTERM};
  plan = makeLaunchPlan(c, node({}), singleNode(1), {}, "/tmp/run");
  REQUIRE(plan.isOk());
  CHECK(plan.value().workers[0].env.at("TORCHELASTIC_SIGNALS_TO_HANDLE") == "SIGUSR1,SIGTERM");
}

TEST_CASE("rendezvous outcome: node 0 of 1 on one node and the agreement on several", "[unit]") {
  cpprun::agent::AttemptContext context;
  context.restart_count = 2;
  context.store_host = "10.0.0.1";
  context.store_port = 29500;
  context.nccl_unique_id_hex = "abcd";
  RendezvousOutcome one = rendezvousOutcome("job7", 4, context);
  CHECK(one.group_rank == 0);
  CHECK(one.group_world_size == 1);
  CHECK(one.base_rank == 0);
  CHECK(one.world_size == 4);
  CHECK(one.master_addr == "10.0.0.1");
  CHECK(one.master_port == 29500);
  CHECK(one.run_id == "job7");
  CHECK(one.restart_count == 2);
  CHECK(one.nccl_unique_id_hex == "abcd");
  cpprun::agent::Membership m;
  m.group_rank = 1;
  m.group_world_size = 3;
  m.base_rank = 4;
  m.world_size = 12;
  context.membership = m;
  RendezvousOutcome several = rendezvousOutcome("job7", 4, context);
  CHECK(several.group_rank == 1);
  CHECK(several.group_world_size == 3);
  CHECK(several.base_rank == 4);
  CHECK(several.world_size == 12);
}

TEST_CASE("dry run: this node first with the settings' store and an NCCL placeholder", "[unit]") {
  LaunchConfig c = script(2);
  c.min_nodes = c.max_nodes = 2;
  c.node_rank = 1;
  c.master_addr = "10.0.0.1";
  auto settings = resolveRendezvous(c);
  REQUIRE(settings.isOk());
  auto context = dryRunAttempt(c, settings.value(), 2, true);
  REQUIRE(context.membership.has_value());
  CHECK(context.membership->group_rank == 1);
  CHECK(context.membership->group_world_size == 2);
  CHECK(context.membership->base_rank == 0);
  CHECK(context.membership->world_size == 2);
  CHECK(context.restart_count == 0);
  CHECK(context.store_host == "10.0.0.1");
  CHECK(context.store_port == settings.value().store.port);
  CHECK(context.nccl_unique_id_hex == "<a fresh ncclUniqueId per attempt>");
  CHECK(dryRunAttempt(c, settings.value(), 2, false).nccl_unique_id_hex.empty());

  const RendezvousOutcome rdzv = rendezvousOutcome(c.rdzv_id, 2, context);
  auto plan = makeLaunchPlan(c, node({"0", "1"}), rdzv, {}, "/logs");
  REQUIRE(plan.isOk());
  Provenance provenance = {{"--rdzv-id", "SLURM_JOB_ID=77"},
                           {"note", "a note with its own newline\n"}};
  const std::string text = describeDryRun(c, settings.value(), node({"0", "1"}), rdzv, plan.value(),
                                          "slurm", provenance);
  CHECK_THAT(text, Catch::StartsWith(describeLaunchPlan(c, node({"0", "1"}), rdzv, plan.value())));
  CHECK_THAT(text, Catch::Contains("  discovered  slurm\n"));
  CHECK_THAT(text, Catch::Contains("  --rdzv-id   from SLURM_JOB_ID=77\n"));
  CHECK_THAT(text, Catch::Contains("  note        a note with its own newline\n"));
  CHECK_THAT(text, Catch::Contains("node 0 serves the store on 0.0.0.0:29500)\n"));
  CHECK_THAT(describeDryRun(c, settings.value(), node({}), rdzv, plan.value(), "", {}),
             Catch::Contains("  discovered  no scheduler or MPI launcher in the environment\n"));
}

TEST_CASE("worker counts over the node's limits are refused before anything is planned", "[unit]") {
  LaunchConfig c;
  c.nproc = 100;
  c.sources["--nproc-per-node"] = "--nproc-per-node";
  NodeResources n = node({});
  // Descriptors: 2 pipes + 2 store connections per worker, + 64 for the agent itself.
  n.limits.open_files = 464;
  CHECK(resolveNproc(c, n).value() == 100);
  n.limits.open_files = 463;
  auto r = resolveNproc(c, n);
  REQUIRE_FALSE(r.isOk());
  CHECK(r.status().message() ==
        "--nproc-per-node: 100 workers need 464 open files in the agent (4 per worker + 64 of its "
        "own), more than this node's hard limit of 463 (RLIMIT_NOFILE, ulimit -Hn); at most 99 "
        "fit: ask for fewer workers or raise the limit");
  // Redirected output adds the two log files per worker.
  c.redirects_default = 3;
  n.limits.open_files = 664;
  CHECK(resolveNproc(c, n).isOk());
  c.redirects_default = 0;
  c.tee_by_rank = {{7, 2}};
  n.limits.open_files = 563;
  CHECK_FALSE(resolveNproc(c, n).isOk());
  c.tee_by_rank.clear();

  // Processes: the workers and the agent.
  n.limits.open_files = ProcessLimits::kUnlimited;
  n.limits.processes = 100;
  auto p = resolveNproc(c, n);
  REQUIRE_FALSE(p.isOk());
  CHECK_THAT(p.status().message(), Catch::Contains("RLIMIT_NPROC, ulimit -u"));
  n.limits.processes = 101;
  CHECK(resolveNproc(c, n).isOk());
}

TEST_CASE("a node's GPU or CPU count and the world size are held to cpprun's limits", "[unit]") {
  LaunchConfig c;
  c.nproc_kind = NprocKind::kGpu;
  c.sources["--nproc-per-node"] = "PET_NPROC_PER_NODE (--nproc-per-node)";
  std::vector<std::string> many;
  for (int i = 0; i < 5000; ++i) many.push_back(std::to_string(i));
  auto gpus = resolveNproc(c, node(many));
  REQUIRE_FALSE(gpus.isOk());
  CHECK(gpus.status().message() ==
        "PET_NPROC_PER_NODE (--nproc-per-node) gpu (5000 GPUs from test): 5,000 workers on one "
        "node, more than cpprun's limit of 4,096; ask for fewer (one per GPU or per CPU is the "
        "usual count)");
  c.nproc_kind = NprocKind::kCpu;
  CHECK_THAT(resolveNproc(c, node({}, 4097)).status().message(),
             Catch::StartsWith("PET_NPROC_PER_NODE (--nproc-per-node) cpu (4097 usable CPUs)"));

  // 16 workers on each of 65,536 nodes is the largest world; one more worker per node is not.
  c.nproc_kind = NprocKind::kNumber;
  c.nproc = 16;
  c.max_nodes = 65536;
  c.sources["--nnodes"] = "SLURM_NTASKS=65536";
  CHECK(resolveNproc(c, node({})).value() == 16);
  c.nproc = 17;
  auto world = resolveNproc(c, node({}));
  REQUIRE_FALSE(world.isOk());
  CHECK(world.status().message() ==
        "17 workers (PET_NPROC_PER_NODE (--nproc-per-node)) on each of 65,536 nodes "
        "(SLURM_NTASKS=65536) make a world of 1,114,112 workers, more than cpprun's limit of "
        "1,048,576; use fewer nodes or workers per node");
}

TEST_CASE("nproc-per-node gpu with CUDA_VISIBLE_DEVICES hiding every GPU is an error saying why",
          "[unit]") {
  LaunchConfig c;
  c.nproc_kind = NprocKind::kGpu;
  for (const char* cvd : {"-1", "0,0,0", "", "none"}) {
    NodeResources n = discoverNodeResources({{"CUDA_VISIBLE_DEVICES", cvd}});
    auto r = resolveNproc(c, n);
    REQUIRE_FALSE(r.isOk());
    INFO(r.status().message());
    CHECK_THAT(r.status().message(), Catch::StartsWith("--nproc-per-node gpu: no GPU is visible"));
    CHECK_THAT(r.status().message(), Catch::Contains("CUDA_VISIBLE_DEVICES"));
  }
  // auto falls back to the CPUs, and the plan says why there is no GPU.
  c.nproc_kind = NprocKind::kAuto;
  NodeResources n = discoverNodeResources({{"CUDA_VISIBLE_DEVICES", "-1"}});
  auto plan = makeLaunchPlan(c, n, singleNode(n.usable_cpus), {}, "/tmp/run");
  REQUIRE(plan.isOk());
  CHECK(plan.value().nproc == n.usable_cpus);
  CHECK(plan.value().workers[0].env.count("CUDA_VISIBLE_DEVICES") == 0);
  CHECK(std::find(plan.value().notes.begin(), plan.value().notes.end(),
                  "CUDA_VISIBLE_DEVICES=-1: CUDA reads no device from '-1' on (not a device "
                  "ordinal >= 0), so it sees no GPU") != plan.value().notes.end());
  // "0,-1,1" is GPU 0 alone: one worker, which sees GPU 0 only.
  c.nproc_kind = NprocKind::kGpu;
  n = discoverNodeResources({{"CUDA_VISIBLE_DEVICES", "0,-1,1"}});
  auto one = makeLaunchPlan(c, n, singleNode(1), {}, "/tmp/run");
  REQUIRE(one.isOk());
  REQUIRE(one.value().workers.size() == 1);
  CHECK(one.value().workers[0].env.at("CUDA_VISIBLE_DEVICES") == "0");
}
