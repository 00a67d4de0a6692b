#include "launcher/scheduler_env.h"

#include <climits>

#include "common/clip.h"
#include "launcher/hostlist.h"
#include "launcher/launch_limits.h"

namespace cpprun::launcher {

namespace {

using Env = std::map<std::string, std::string>;

const std::string* lookup(const Env& env, const std::string& name) {
  auto it = env.find(name);
  return it == env.end() || it->second.empty() ? nullptr : &it->second;
}

// `name`=`value` as a source or an error names it.
std::string sourceText(const std::string& name, const std::string& value) {
  return name + "=" + clipValue(value);
}

// An integer variable in [min, INT_MAX].
Result<Discovered<int>> intVar(const Env& env, const std::string& name, int min) {
  const std::string& text = *lookup(env, name);
  long long v = 0;
  size_t used = 0;
  try {
    v = std::stoll(text, &used);
  } catch (...) {
    used = 0;
  }
  if (used != text.size() || text.empty() || v < min || v > INT_MAX) {
    return invalidArgument("environment variable " + name + "='" + clipValue(text) +
                           "': expected an integer >= " + std::to_string(min));
  }
  return Discovered<int>{static_cast<int>(v), sourceText(name, text)};
}

// A count of agents (a job's task count): at most kMaxNodes, as --nnodes; a larger number, even
// one past INT_MAX, is named as over the limit.
Result<Discovered<int>> agentCountVar(const Env& env, const std::string& name) {
  const std::string& text = *lookup(env, name);
  const size_t first = text.find_first_not_of('0');
  const bool digits = text.find_first_not_of("0123456789") == std::string::npos;
  const std::string significant = first == std::string::npos ? "" : text.substr(first);
  if (digits &&
      (significant.size() > 9 || (!significant.empty() && std::stoll(significant) > kMaxNodes))) {
    return invalidArgument(
        "environment variable " + sourceText(name, text) + ": more than cpprun's limit of " +
        formatCount(kMaxNodes) +
        " nodes; start one agent per node (srun --ntasks-per-node=1, mpirun --map-by ppr:1:node) "
        "and let it start the node's workers, or give --nnodes");
  }
  return intVar(env, name, 1);
}

// Launchers that give every task a rank and a size, in the order they are tried.
struct RankSource {
  const char* scheduler;
  const char* rank;
  const char* size;  // nullptr: the launcher does not export it
};
constexpr RankSource kRankSources[] = {
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
    {"mvapich", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE"},
    {"pmi", "PMI_RANK", "PMI_SIZE"},
    {"flux", "FLUX_TASK_RANK", "FLUX_JOB_SIZE"},
    {"jsm", "JSM_NAMESPACE_RANK", "JSM_NAMESPACE_SIZE"},
    {"pmix", "PMIX_RANK", nullptr},
};

Status discoverSlurm(const Env& env, SchedulerEnvironment& s) {
  s.scheduler = "slurm";
  const bool in_step = lookup(env, "SLURM_STEP_ID") != nullptr;
  if (in_step) {
    auto rank = intVar(env, "SLURM_PROCID", 0);
    if (!rank.isOk()) return rank.status();
    s.agent_rank = rank.value();
    const char* count_var =
        lookup(env, "SLURM_STEP_NUM_TASKS") != nullptr ? "SLURM_STEP_NUM_TASKS" : "SLURM_NTASKS";
    if (lookup(env, count_var) != nullptr) {
      auto count = agentCountVar(env, count_var);
      if (!count.isOk()) return count.status();
      s.agent_count = count.value();
    }
  } else {
    s.notes.push_back(
        "Slurm job without an srun step (SLURM_STEP_ID unset): this agent is the job's only "
        "one; start one agent per node with `srun --ntasks-per-node=1 cpprun ...`");
  }
  for (const char* var : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
    if (const std::string* list = lookup(env, var)) {
      auto hosts = expandHostlist(*list);
      if (!hosts.isOk()) {
        return invalidArgument("environment variable " + std::string(var) + ": " +
                               hosts.status().message());
      }
      s.hosts = Discovered<std::vector<std::string>>{hosts.value(), sourceText(var, *list)};
      s.endpoint_host =
          Discovered<std::string>{hosts.value().front(), std::string("first host of ") + var};
      break;
    }
  }
  if (const std::string* job = lookup(env, "SLURM_JOB_ID")) {
    s.run_id = Discovered<std::string>{*job, sourceText("SLURM_JOB_ID", *job)};
    auto id = intVar(env, "SLURM_JOB_ID", 0);
    if (!id.isOk()) return id.status();
    s.endpoint_port =
        Discovered<int>{portForSlurmJob(static_cast<unsigned long long>(id.value().value)),
                        "10000 + SLURM_JOB_ID % 20000"};
  }
  return Status::ok();
}

}  // namespace

int portForSlurmJob(unsigned long long job_id) { return static_cast<int>(10000 + job_id % 20000); }

Result<SchedulerEnvironment> discoverScheduler(const Env& env) {
  SchedulerEnvironment s;
  if (lookup(env, "SLURM_JOB_ID") != nullptr) {
    if (Status st = discoverSlurm(env, s); !st.isOk()) return st;
    return s;
  }
  for (const RankSource& source : kRankSources) {
    if (lookup(env, source.rank) == nullptr) continue;
    s.scheduler = source.scheduler;
    auto rank = intVar(env, source.rank, 0);
    if (!rank.isOk()) return rank.status();
    s.agent_rank = rank.value();
    if (source.size != nullptr && lookup(env, source.size) != nullptr) {
      auto size = agentCountVar(env, source.size);
      if (!size.isOk()) return size.status();
      s.agent_count = size.value();
    }
    break;
  }
  if (s.scheduler.empty()) return s;
  // Under mpirun and friends the endpoint is the user's: MASTER_ADDR / MASTER_PORT, as
  // cluster guides export them before mpirun (-x MASTER_ADDR).
  if (const std::string* addr = lookup(env, "MASTER_ADDR")) {
    s.endpoint_host = Discovered<std::string>{*addr, sourceText("MASTER_ADDR", *addr)};
  }
  if (lookup(env, "MASTER_PORT") != nullptr) {
    auto port = intVar(env, "MASTER_PORT", 1);
    if (!port.isOk()) return port.status();
    if (port.value().value > 65535) {
      return invalidArgument("environment variable " + port.value().source +
                             ": expected a port number (1-65535)");
    }
    s.endpoint_port = port.value();
  }
  for (const char* var : {"PMIX_NAMESPACE", "OMPI_MCA_orte_ess_jobid", "FLUX_JOB_ID"}) {
    if (const std::string* id = lookup(env, var)) {
      s.run_id = Discovered<std::string>{*id, sourceText(var, *id)};
      break;
    }
  }
  return s;
}

Status applySchedulerEnvironment(const SchedulerEnvironment& sched, LaunchConfig& config,
                                 Provenance& provenance) {
  auto given = [&](const char* option) { return config.given.count(option) != 0; };
  for (const std::string& note : sched.notes) provenance["note"] += note + "\n";
  if (sched.agent_count && !given("--nnodes")) {
    config.min_nodes = config.max_nodes = sched.agent_count->value;
    provenance["--nnodes"] = sched.agent_count->source;
    config.sources["--nnodes"] = sched.agent_count->source;
  }
  if (sched.agent_rank && !given("--node-rank")) {
    config.node_rank = sched.agent_rank->value;
    provenance["--node-rank"] = sched.agent_rank->source;
    config.sources["--node-rank"] = sched.agent_rank->source;
  }
  if (config.node_rank >= config.max_nodes) {
    return invalidArgument("node rank " + std::to_string(config.node_rank) + " (" +
                           sourceOf(config, "--node-rank") + ") is not below the number of nodes " +
                           std::to_string(config.max_nodes) + " (" + sourceOf(config, "--nnodes") +
                           ")");
  }
  if (sched.run_id && !given("--rdzv-id")) {
    config.rdzv_id = sched.run_id->value;
    provenance["--rdzv-id"] = sched.run_id->source;
  }
  const bool endpoint_given =
      given("--rdzv-endpoint") || given("--master-addr") || config.standalone;
  if (sched.endpoint_host && !endpoint_given) {
    config.master_addr = sched.endpoint_host->value;
    provenance["--master-addr"] = sched.endpoint_host->source;
  }
  if (config.max_nodes > 1 && !sched.endpoint_host && !endpoint_given && !sched.scheduler.empty()) {
    // Under mpirun or PMI without a host list nothing says where node 0 is, and the agents run
    // on several hosts: torchrun's 127.0.0.1 would leave every other node waiting for the join
    // timeout. Started by hand, cpprun takes torchrun's defaults (127.0.0.1, port 29500 static
    // or 29400 c10d), as a job of several agents on one host needs.
    return invalidArgument("this " + sched.scheduler + " job has " +
                           std::to_string(config.max_nodes) + " agents (" +
                           sourceOf(config, "--nnodes") +
                           ") but no rendezvous endpoint: give --rdzv-endpoint HOST:PORT or "
                           "--master-addr, or export MASTER_ADDR (and MASTER_PORT) to every rank, "
                           "e.g. mpirun -x MASTER_ADDR=$(hostname) -x MASTER_PORT=29500 ...");
  }
  if (sched.endpoint_port && !given("--master-port") && !given("--rdzv-endpoint") &&
      !config.standalone) {
    config.master_port = sched.endpoint_port->value;
    config.master_port_given = true;
    provenance["--master-port"] = sched.endpoint_port->source;
  }
  return Status::ok();
}

}  // namespace cpprun::launcher
