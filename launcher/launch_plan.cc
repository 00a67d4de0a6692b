#include "launcher/launch_plan.h"

#include <filesystem>
#include <sstream>

#include "agent/supervision/failure_report.h"
#include "common/environment.h"
#include "common/network_address.h"
#include "launcher/python_interpreter.h"

namespace cpprun::launcher {

namespace {

bool endsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string substituteLocalRank(std::string arg, int local_rank) {
  static const std::string token = "${local_rank}";
  for (size_t pos = arg.find(token); pos != std::string::npos; pos = arg.find(token, pos + 1)) {
    arg.replace(pos, token.size(), std::to_string(local_rank));
  }
  return arg;
}

// torchrun's spelling of a signal list ("SIGTERM,SIGINT,SIGHUP,SIGQUIT").
std::string signalListText(const std::vector<int>& signals) {
  std::string out;
  for (int signo : signals) {
    out += (out.empty() ? "" : ",") + agent::signalName(signo);
  }
  return out;
}

std::string joinList(const std::vector<std::string>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? "," : "") + items[i];
  return out;
}

// Slurm's "tasks per node" form: "4" on one node, "4(x2)" on two.
std::string slurmTasksPerNode(int nproc, int nodes) {
  std::string out = std::to_string(nproc);
  if (nodes > 1) out += "(x" + std::to_string(nodes) + ")";
  return out;
}

// Under a scheduler that started the agent as one task per node, the inherited task variables
// describe the agent (SLURM_PROCID = node rank). Scripts written for that scheduler read them to
// find their rank, so each worker gets them rewritten as if the scheduler had started one task
// per worker. Node-level and job-level variables (node lists, job id, GPUs) stay inherited.
void rewriteSchedulerTaskVariables(const std::map<std::string, std::string>& agent_env,
                                   const RendezvousOutcome& rdzv, int nproc, int local_rank,
                                   int rank, std::map<std::string, std::string>& e) {
  if (agent_env.count("SLURM_JOB_ID") != 0) {
    const std::string world = std::to_string(rdzv.world_size);
    const std::string per_node = slurmTasksPerNode(nproc, rdzv.group_world_size);
    e["SLURM_PROCID"] = std::to_string(rank);
    e["SLURM_LOCALID"] = std::to_string(local_rank);
    e["SLURM_NODEID"] = std::to_string(rdzv.group_rank);
    e["SLURM_NTASKS"] = world;
    e["SLURM_NPROCS"] = world;
    e["SLURM_STEP_NUM_TASKS"] = world;
    e["SLURM_STEP_NUM_NODES"] = std::to_string(rdzv.group_world_size);
    e["SLURM_NTASKS_PER_NODE"] = std::to_string(nproc);
    e["SLURM_TASKS_PER_NODE"] = per_node;
    e["SLURM_STEP_TASKS_PER_NODE"] = per_node;
  }
  if (agent_env.count("OMPI_COMM_WORLD_RANK") != 0) {
    e["OMPI_COMM_WORLD_RANK"] = std::to_string(rank);
    e["OMPI_COMM_WORLD_SIZE"] = std::to_string(rdzv.world_size);
    e["OMPI_COMM_WORLD_LOCAL_RANK"] = std::to_string(local_rank);
    e["OMPI_COMM_WORLD_LOCAL_SIZE"] = std::to_string(nproc);
    e["OMPI_COMM_WORLD_NODE_RANK"] = std::to_string(local_rank);
  }
}

// The workers --nproc-per-node asks for on this node.
Result<int> nprocOf(const LaunchConfig& config, const NodeResources& node) {
  int gpus = static_cast<int>(node.gpus.size());
  switch (config.nproc_kind) {
    case NprocKind::kNumber:
      return config.nproc;
    case NprocKind::kGpu:
      if (gpus == 0) {
        if (!node.gpu_error.empty()) {
          return invalidArgument("--nproc-per-node gpu: the CUDA driver on " + node.hostname +
                                 " is installed but fails: " + node.gpu_error +
                                 "; fix the driver, or use a number or cpu");
        }
        return invalidArgument(
            "--nproc-per-node gpu: no GPU is visible on " + node.hostname + " (" +
            (node.gpu_note.empty() ? "GPU list from " + node.gpu_source + " is empty"
                                   : node.gpu_note) +
            "); use a number or cpu");
      }
      return gpus;
    case NprocKind::kCpu:
      return node.usable_cpus;
    case NprocKind::kAuto:
      return gpus > 0 ? gpus : node.usable_cpus;
  }
  return internalError("unknown nproc kind");
}

// How --nproc-per-node was resolved, for the limits' messages.
std::string nprocWhat(const LaunchConfig& config, const NodeResources& node) {
  const std::string source = sourceOf(config, "--nproc-per-node");
  switch (config.nproc_kind) {
    case NprocKind::kNumber:
      return source;
    case NprocKind::kGpu:
      return source + " gpu (" + std::to_string(node.gpus.size()) + " GPUs from " +
             node.gpu_source + ")";
    case NprocKind::kCpu:
      return source + " cpu (" + std::to_string(node.usable_cpus) + " usable CPUs)";
    case NprocKind::kAuto:
      return source + " auto (" +
             (node.gpus.empty()
                  ? std::to_string(node.usable_cpus) + " usable CPUs"
                  : std::to_string(node.gpus.size()) + " GPUs from " + node.gpu_source) +
             ")";
  }
  return source;
}

}  // namespace

Result<int> resolveNproc(const LaunchConfig& config, const NodeResources& node) {
  auto nproc = nprocOf(config, node);
  if (!nproc.isOk()) return nproc;
  // Before anything is planned or started per worker.
  if (Status s = checkWorkerCount(config, nproc.value(), nprocWhat(config, node), node.limits);
      !s.isOk()) {
    return s;
  }
  const size_t gpus = node.gpus.size();
  if (nproc.isOk() && config.virtual_local_rank && gpus > 0 &&
      static_cast<size_t>(nproc.value()) > gpus) {
    return invalidArgument("--virtual-local-rank gives each worker one GPU, but " +
                           std::to_string(nproc.value()) + " workers were asked for and " +
                           node.hostname + " has " + std::to_string(gpus) + " GPUs (" +
                           joinList(node.gpus) + ")");
  }
  return nproc;
}

std::vector<std::string> workerCommand(const LaunchConfig& config,
                                       const std::map<std::string, std::string>& agent_env,
                                       int local_rank) {
  std::vector<std::string> argv;
  bool python = !config.no_python && (config.module || endsWith(config.entrypoint, ".py"));
  if (python) {
    argv.push_back(pythonInterpreter(agent_env, selfExecutable()));
    argv.push_back("-u");
    if (config.module) argv.push_back("-m");
  }
  argv.push_back(config.entrypoint);
  for (const auto& a : config.entrypoint_args) argv.push_back(substituteLocalRank(a, local_rank));
  return argv;
}

std::optional<std::string> fileTimerPath(const std::map<std::string, std::string>& agent_env,
                                         const std::string& run_dir) {
  if (envOr(agent_env, "TORCHELASTIC_ENABLE_FILE_TIMER", "") != "1") return std::nullopt;
  std::string path = envOr(agent_env, "TORCHELASTIC_TIMER_FILE", "");
  if (!path.empty()) return path;
  // Absolute: a worker opens it for every request, whatever its working directory is by then.
  // (The dry run's "<temporary run dir>" placeholder stays as it is.)
  std::error_code ec;
  const std::filesystem::path dir = run_dir.rfind('<', 0) == 0
                                        ? std::filesystem::path(run_dir)
                                        : std::filesystem::absolute(run_dir, ec);
  return (ec ? run_dir : dir.string()) + "/watchdog_timer";
}

Result<LaunchPlan> makeLaunchPlan(const LaunchConfig& config, const NodeResources& node,
                                  const RendezvousOutcome& rdzv,
                                  const std::map<std::string, std::string>& agent_env,
                                  const std::string& run_dir) {
  auto nproc = resolveNproc(config, node);
  if (!nproc.isOk()) return nproc.status();
  LaunchPlan plan;
  plan.nproc = nproc.value();

  std::string omp_threads;
  if (agent_env.count("OMP_NUM_THREADS") == 0) {
    omp_threads = std::to_string(std::max(1, node.usable_cpus / std::max(1, plan.nproc)));
    plan.notes.push_back("OMP_NUM_THREADS is unset: each worker gets " + omp_threads + " (" +
                         std::to_string(node.usable_cpus) + " usable CPUs / " +
                         std::to_string(plan.nproc) + " workers)");
  }
  if (!node.gpu_error.empty()) {
    plan.notes.push_back("the CUDA driver fails (" + node.gpu_error + "): the workers get no GPUs");
  }
  if (!node.gpu_note.empty()) plan.notes.push_back(node.gpu_note);
  if (rdzv.nccl_unique_id_hex.empty() && !node.gpus.empty()) {  // without GPUs none is made
    plan.notes.push_back(
        "no NCCL id: CPPRUN_NCCL_UNIQUE_ID is not set (NCCL does not load here, or "
        "ncclGetUniqueId failed)");
  }

  const std::optional<std::string> timer_file = fileTimerPath(agent_env, run_dir);
  for (int local_rank = 0; local_rank < plan.nproc; ++local_rank) {
    WorkerPlan w;
    w.local_rank = local_rank;
    w.rank = rdzv.base_rank + local_rank;
    w.argv = workerCommand(config, agent_env, local_rank);
    auto& e = w.env;
    e["LOCAL_RANK"] = std::to_string(config.virtual_local_rank ? 0 : local_rank);
    e["RANK"] = std::to_string(w.rank);
    e["GROUP_RANK"] = std::to_string(rdzv.group_rank);
    e["GROUP_WORLD_SIZE"] = std::to_string(rdzv.group_world_size);
    e["ROLE_NAME"] = config.role;
    e["ROLE_RANK"] = std::to_string(w.rank);
    e["ROLE_WORLD_SIZE"] = std::to_string(rdzv.world_size);
    e["LOCAL_WORLD_SIZE"] = std::to_string(plan.nproc);
    e["WORLD_SIZE"] = std::to_string(rdzv.world_size);
    e["MASTER_ADDR"] = rdzv.master_addr;
    e["MASTER_PORT"] = std::to_string(rdzv.master_port);
    e["TORCHELASTIC_RESTART_COUNT"] = std::to_string(rdzv.restart_count);
    e["TORCHELASTIC_MAX_RESTARTS"] = std::to_string(config.max_restarts);
    e["TORCHELASTIC_RUN_ID"] = rdzv.run_id;
    e["TORCHELASTIC_USE_AGENT_STORE"] = config.worker_hosts_store ? "False" : "True";
    e["TORCHELASTIC_ERROR_FILE"] = run_dir + "/attempt_" + std::to_string(rdzv.restart_count) +
                                   "/" + std::to_string(local_rank) + "/error.json";
    e["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = envOr(agent_env, "TORCH_NCCL_ASYNC_ERROR_HANDLING", "1");
    e["NCCL_ASYNC_ERROR_HANDLING"] = envOr(agent_env, "NCCL_ASYNC_ERROR_HANDLING", "1");
    if (!omp_threads.empty()) e["OMP_NUM_THREADS"] = omp_threads;
    // torchrun exports it in its own environment (for torch's signal handlers), so its workers
    // inherit it.
    if (!config.signals_to_handle.empty()) {
      e["TORCHELASTIC_SIGNALS_TO_HANDLE"] = signalListText(config.signals_to_handle);
    }
    if (!node.gpus.empty()) {
      // Default: every worker sees the node's list in order, so LOCAL_RANK indexes its GPU and
      // NCCL keeps peer-to-peer between them. Virtual: only its own GPU.
      e["CUDA_VISIBLE_DEVICES"] = config.virtual_local_rank
                                      ? node.gpus[static_cast<size_t>(local_rank)]
                                      : joinList(node.gpus);
    }
    if (!rdzv.nccl_unique_id_hex.empty()) e["CPPRUN_NCCL_UNIQUE_ID"] = rdzv.nccl_unique_id_hex;
    if (!rdzv.nccl_unique_ids_hex.empty()) e["CPPRUN_NCCL_UNIQUE_IDS"] = rdzv.nccl_unique_ids_hex;
    if (timer_file) e["TORCHELASTIC_TIMER_FILE"] = *timer_file;
    rewriteSchedulerTaskVariables(agent_env, rdzv, plan.nproc, local_rank, w.rank, e);
    plan.workers.push_back(std::move(w));
  }
  return plan;
}

RendezvousOutcome rendezvousOutcome(const std::string& run_id, int nproc,
                                    const agent::AttemptContext& context) {
  RendezvousOutcome rdzv;
  rdzv.group_rank = 0;
  rdzv.group_world_size = 1;
  rdzv.base_rank = 0;
  rdzv.world_size = nproc;
  if (context.membership) {
    rdzv.group_rank = context.membership->group_rank;
    rdzv.group_world_size = context.membership->group_world_size;
    rdzv.base_rank = context.membership->base_rank;
    rdzv.world_size = context.membership->world_size;
  }
  rdzv.master_addr = context.store_host;
  rdzv.master_port = context.store_port;
  rdzv.run_id = run_id;
  rdzv.restart_count = context.restart_count;
  rdzv.nccl_unique_id_hex = context.nccl_unique_id_hex;
  rdzv.nccl_unique_ids_hex = context.nccl_unique_ids_hex;
  return rdzv;
}

agent::AttemptContext dryRunAttempt(const LaunchConfig& config, const RendezvousSettings& rdzv,
                                    int nproc, bool makes_nccl_id) {
  agent::AttemptContext context;
  agent::Membership membership;
  membership.group_rank = config.node_rank;
  membership.group_world_size = config.max_nodes;
  membership.base_rank = 0;
  membership.world_size = nproc;
  context.membership = membership;
  context.store_host = rdzv.store.host;
  context.store_port = rdzv.store.port;
  if (makes_nccl_id) context.nccl_unique_id_hex = "<a fresh ncclUniqueId per attempt>";
  return context;
}

std::string describeLaunchPlan(const LaunchConfig& config, const NodeResources& node,
                               const RendezvousOutcome& rdzv, const LaunchPlan& plan) {
  std::ostringstream out;
  out << "cpprun launch plan (dry run: nothing is started)\n";
  out << "  node        " << node.hostname << ": group rank " << rdzv.group_rank << " of "
      << rdzv.group_world_size << " (nnodes " << config.min_nodes;
  if (config.max_nodes != config.min_nodes) out << ":" << config.max_nodes;
  out << ", rdzv backend " << config.rdzv_backend << ")\n";
  out << "  run id      " << rdzv.run_id << ", attempt " << rdzv.restart_count << ", max restarts "
      << config.max_restarts << "\n";
  out << "  store       " << formatHostPort(rdzv.master_addr, rdzv.master_port)
      << (config.worker_hosts_store ? " (hosted by worker rank 0)" : " (served by the agent)")
      << "\n";
  out << "  GPUs        " << (node.gpus.empty() ? "none" : joinList(node.gpus)) << " (from "
      << node.gpu_source << ")\n";
  out << "  CPUs        " << node.usable_cpus << " usable\n";
  out << "  workers     " << plan.nproc << " here, ranks " << rdzv.base_rank << ".."
      << rdzv.base_rank + plan.nproc - 1 << " of world size " << rdzv.world_size << "\n";
  for (const auto& note : plan.notes) out << "  note        " << note << "\n";
  for (const auto& w : plan.workers) {
    out << "  worker local_rank " << w.local_rank << " rank " << w.rank << ":";
    for (const auto& a : w.argv) out << " " << a;
    out << "\n";
    if (!w.binding.empty()) out << "      numa binding: " << w.binding << "\n";
    for (const auto& kv : w.env) out << "      " << kv.first << "=" << kv.second << "\n";
  }
  return out.str();
}

std::string describeDryRun(const LaunchConfig& config, const RendezvousSettings& settings,
                           const NodeResources& node, const RendezvousOutcome& rdzv,
                           const LaunchPlan& plan, const std::string& scheduler,
                           const Provenance& provenance) {
  std::string out = describeLaunchPlan(config, node, rdzv, plan);
  if (scheduler.empty()) {
    out += "  discovered  no scheduler or MPI launcher in the environment\n";
  } else {
    out += "  discovered  " + scheduler + "\n";
  }
  for (const auto& [option, source] : provenance) {
    if (option == "note") {
      out += "  note        " + source;
    } else {
      std::string name = option;  // left-aligned in 11 columns, as printf's %-11s
      if (name.size() < 11) name.resize(11, ' ');
      out += "  " + name + " from " + source + "\n";
    }
  }
  if (settings.etcd && settings.multi_node) {
    std::string endpoints;
    for (const std::string& e : settings.etcd_endpoints) {
      endpoints += (endpoints.empty() ? "" : ",") + e;
    }
    out += "  rendezvous  " + config.rdzv_backend + ": etcd v3 at " +
           (settings.etcd_tls ? "https" : "http") + "://" + endpoints + ", keys under /cpprun/" +
           config.rdzv_id + "/, " + std::to_string(settings.min_nodes) + ".." +
           std::to_string(settings.nnodes) + " nodes\n";
    out +=
        "  (ranks shown as if this node came first: every agent serves a workers' store on a "
        "free port; each round's node 0's is MASTER_ADDR:MASTER_PORT)\n";
  } else if (settings.multi_node) {
    out +=
        "  (ranks shown as if this node came first: the rendezvous decides the base rank and "
        "the world size; node 0 serves the store on " +
        formatHostPort(settings.bind_host, settings.store.port) + ")\n";
  }
  if (rdzv.master_port == 0) {
    out += "  (store port 0: the agent binds a free port at start; MASTER_PORT is that port)\n";
  }
  return out;
}

}  // namespace cpprun::launcher
