// cpprun: the torchrun-compatible launcher. Parses the command line, discovers the node,
// prints the plan (--dry-run) or runs the job: a guardian process, the agent under it (store,
// supervisor, event loop), the workers under the agent. Exit codes: README "Exit codes".
#include <linux/magic.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "agent/local_agent.h"
#include "agent/nccl/nccl_id_groups.h"
#include "agent/nccl/nccl_unique_id.h"
#include "agent/processes/guardian.h"
#include "agent/processes/signal_policy.h"
#include "agent/supervision/failure_report.h"
#include "agent/supervision/python_progress.h"
#include "common/clip.h"
#include "common/environment.h"
#include "common/logging.h"
#include "common/network_address.h"
#include "common/private_directory.h"
#include "common/system.h"
#include "launcher/agent_options.h"
#include "launcher/cli.h"
#include "launcher/launch_plan.h"
#include "launcher/node_resources.h"
#include "launcher/numa_binding.h"
#include "launcher/preflight.h"
#include "launcher/rendezvous_settings.h"
#include "launcher/scheduler_env.h"

extern char** environ;

#ifndef CPPRUN_VERSION
#define CPPRUN_VERSION "0.0.0"
#endif

namespace {

using namespace cpprun;
using namespace cpprun::launcher;

constexpr int kExitUsage = 2;
constexpr int kExitLaunchError = 3;
constexpr int kExitLostPeers = 4;

std::map<std::string, std::string> processEnvironment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry = *e;
    size_t eq = entry.find('=');
    if (eq != std::string::npos) env.emplace(entry.substr(0, eq), entry.substr(eq + 1));
  }
  return env;
}

// A port the kernel considers free right now (for --worker-hosts-store, where worker rank 0
// binds it; racy by nature, as torchrun's equivalent).
Result<int> pickFreePort(const std::string& host) {
  const int port = pickFreeTcpPort();
  if (port <= 0) return unavailable("cannot pick a free port on " + host);
  return port;
}

// The run's directory: a new <log dir>/<run id>_<random> when --log-dir is given (as torchrun's:
// never one that exists, so nothing another user put there is used; common/private_directory.h),
// else a fresh temporary one (removed at the end) for the error files. Both are mode 0700. It is
// made before the guardian forks, and both processes remove a temporary one when they are done:
// the guardian after the agent is gone (even when the agent was SIGKILLed), the agent when its
// job ends (even when the guardian was).
struct RunDirectory {
  std::string path;
  bool temporary = false;
  ~RunDirectory() {
    if (temporary && !path.empty()) (void)removeTree(path);
  }
};

// Where a run directory that is removed at the end goes when $TMPDIR does not say: /dev/shm when
// it is a tmpfs this process may write, else /tmp. A run makes a directory per rank there and
// removes them all at the end; on a disk file system each removal can wait for the disk (on an
// ext4 mounted with `discard` here: 3-15 ms per 8 workers, more when the disk is busy), on tmpfs
// it is memory only. The files in it are small (error files, progress files).
std::string defaultTemporaryBase() {
  struct statfs fs {};
  if (::statfs("/dev/shm", &fs) == 0 && fs.f_type == TMPFS_MAGIC &&
      ::access("/dev/shm", W_OK | X_OK) == 0) {
    return "/dev/shm";
  }
  return "/tmp";
}

// `kept`: a temporary directory that outlives the job (worker logs, stall reports) stays off
// /dev/shm.
Status makeRunDirectory(const LaunchConfig& config, bool kept, RunDirectory* dir) {
  std::error_code ec;
  if (!config.log_dir.empty()) {
    // As torchrun: the log dir is made if missing, the run's directory in it is a new one.
    std::filesystem::create_directories(config.log_dir, ec);
    if (ec) {
      return unavailable("--log-dir: cannot create " + clipValue(config.log_dir, 4 * kClipKeep) +
                         ": " + ec.message());
    }
    const ParentCheck parent = checkParentDirectory(config.log_dir, "--log-dir");
    if (!parent.status.isOk()) return parent.status;  // exit 2: the flag names a bad place
    if (!parent.warning.empty()) {
      CPPRUN_LOG(kWarn) << parent.warning;
    }
    auto made = makeFreshDirectory(config.log_dir, config.rdzv_id + "_");
    if (!made.isOk()) return unavailable("--log-dir: " + made.status().message());
    dir->path = std::move(made).value();
    CPPRUN_LOG(kInfo) << "this run's logs and error files are in " << dir->path;
    return Status::ok();
  }
  std::string base = envOr(processEnvironment(), "TMPDIR", "");
  if (base.empty()) base = kept ? "/tmp" : defaultTemporaryBase();
  std::string templ = base + "/cpprun-XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) {
    const int err = errno;
    return unavailable("cannot create a run directory under " + clipValue(base, 4 * kClipKeep) +
                       ": " + std::strerror(err));
  }
  dir->path = buf.data();
  dir->temporary = true;
  return Status::ok();
}

// A name no other agent of the job has: host, pid and 32 random bits.
std::string uniqueAgentId(const std::string& host) {
  std::random_device rd;
  char suffix[16];
  std::snprintf(suffix, sizeof suffix, "%08x", rd());
  return host + "-" + std::to_string(::getpid()) + "-" + suffix;
}

// Makes the run directory and decides whether a temporary one is kept (in the guardian, before
// the fork, so the guardian and the agent agree on it).
Status prepareRunDirectory(const LaunchConfig& config,
                           const std::map<std::string, std::string>& env, RunDirectory* run_dir) {
  const bool kept = config.log_dir.empty() &&
                    (agent::anyRedirect(outputOptions(config, env)) || config.stall_timeout > 0);
  Status made = makeRunDirectory(config, kept, run_dir);
  if (!made.isOk()) return made;
  if (agent::anyRedirect(outputOptions(config, env)) && config.log_dir.empty()) {
    // torchrun does the same: redirected output needs a place; say where it is and keep it.
    run_dir->temporary = false;
    CPPRUN_LOG(kInfo) << "no --log-dir: worker logs are in " << run_dir->path;
  } else if (config.stall_timeout > 0 && config.log_dir.empty()) {
    // Stall reports (stacks) must outlive the job.
    run_dir->temporary = false;
    CPPRUN_LOG(kInfo) << "no --log-dir: progress files and stall reports are in " << run_dir->path;
  }
  return Status::ok();
}

// The job as the command line, the scheduler's environment and this node define it.
struct Job {
  LaunchConfig config;
  std::map<std::string, std::string> env;
  SchedulerEnvironment sched;
  Provenance provenance;
  RendezvousSettings rdzv;
  NodeResources node;
  Result<int> nproc{0};     // an error is reported by --check, or stops a run or a dry run
  int scheduler_rank = -1;  // this agent's rank as the scheduler gave it (elastic ordering)
};

// What --numa-binding makes of this node, planned once for the job (the topology and the GPUs
// do not change between attempts).
struct NumaDecision {
  std::optional<NumaBindingPlan> plan;
  std::string notice;  // why some or all workers start unbound; empty when none does
};

int usageError(const Status& status) {
  std::fprintf(stderr, "cpprun: error: %s\n", status.message().c_str());
  return kExitUsage;
}

// Fills the command line in from the scheduler, resolves the rendezvous and discovers the node.
// Errors are usage errors (exit 2).
Result<Job> resolveJob(LaunchConfig config, std::map<std::string, std::string> env) {
  Job job;
  job.env = std::move(env);
  auto sched = discoverScheduler(job.env);
  if (!sched.isOk()) return sched.status();
  job.sched = std::move(sched).value();
  Status applied = applySchedulerEnvironment(job.sched, config, job.provenance);
  if (!applied.isOk()) return applied;
  applyOneNodeRunId(config, job.provenance.count("--rdzv-id") != 0);
  auto rdzv = resolveRendezvous(config);
  if (!rdzv.isOk()) return rdzv.status();
  job.rdzv = std::move(rdzv).value();
  // The scheduler's rank orders an elastic job's nodes (flags do not: torchrun ignores
  // --node-rank with c10d).
  if (job.provenance.count("--node-rank") && job.sched.agent_rank) {
    job.scheduler_rank = job.sched.agent_rank->value;
  }
  if (job.rdzv.multi_node && config.worker_hosts_store) {
    return invalidArgument(
        "--worker-hosts-store is for one node: the agents of a multi-node job meet in the store "
        "the agent of node 0 serves");
  }
  // A bad CPPRUN_NCCL_RANKS_PER_ID stops the job before anything starts (exit 2, named).
  if (auto ranks_per_id = agent::ncclRanksPerId(job.env); !ranks_per_id.isOk()) {
    return ranks_per_id.status();
  }
  job.node = discoverNodeResources(job.env);
  job.nproc = resolveNproc(config, job.node);
  job.config = std::move(config);
  return job;
}

// --check: the preflight report; exit 1 when something fails.
int runCheck(const Job& job) {
  const LaunchConfig& config = job.config;
  raiseOpenFileLimit();  // as a run does: the workers inherit the raised limit
  SystemFacts facts = probeSystem(config, job.rdzv, job.env);
  // A number over this node's limits is still what the job asks for: the other checks (open
  // files, CPUs) are made for it. (Numbers are at most kMaxWorkersPerNode by then.)
  const int nproc = job.nproc.isOk()                          ? job.nproc.value()
                    : config.nproc_kind == NprocKind::kNumber ? config.nproc
                                                              : 0;
  PreflightReport report = runPreflight(config, job.rdzv, job.node, nproc, job.env, facts);
  // Each worker's GPU, NUMA node and nearest NIC; its CPUs too with --numa-binding.
  const bool numa_requested = !config.numa_binding.empty();
  const int numa_workers = job.nproc.isOk()
                               ? job.nproc.value()
                               : static_cast<int>(std::max<size_t>(job.node.gpus.size(), 1));
  for (auto& finding : numaBindingFindings(
           prepareNumaBinding(
               numa_requested ? *parseNumaBindingMode(config.numa_binding) : NumaBindingMode::kNode,
               job.node, numa_workers, job.env),
           numa_requested, config.strict_numa_binding)) {
    report.findings.push_back(std::move(finding));
  }
  if (!job.nproc.isOk()) {
    report.findings.insert(report.findings.begin(),
                           {CheckLevel::kFail, "workers", job.nproc.status().message()});
  }
  std::fputs(report
                 .format("cpprun --check on " + job.node.hostname + " (cpprun " + CPPRUN_VERSION +
                         ", node " + std::to_string(job.rdzv.node_rank) + " of " +
                         std::to_string(job.rdzv.nnodes) + ")")
                 .c_str(),
             stdout);
  return report.failures() > 0 ? 1 : 0;
}

// --numa-binding: a worker that cannot be bound is reported once, and stops the start (an
// error) only under --strict-numa-binding. REQUIRES: job.nproc is a number.
Result<NumaDecision> planNumaBinding(const Job& job) {
  const LaunchConfig& config = job.config;
  NumaDecision numa;
  if (config.numa_binding.empty()) return numa;
  const NumaBindingMode mode = *parseNumaBindingMode(config.numa_binding);
  auto planned = prepareNumaBinding(mode, job.node, job.nproc.value(), job.env);
  if (!planned.isOk()) {
    numa.notice = "--numa-binding=" + config.numa_binding + ": no topology (" +
                  planned.status().message() + ")";
  } else {
    numa.plan = std::move(planned).value();
    numa.notice = numa.plan->unboundSummary();
  }
  if (numa.notice.empty()) return numa;
  if (config.strict_numa_binding) {
    return unavailable(numa.notice + "; --strict-numa-binding: not starting");
  }
  const auto unbound = numa.plan
                           ? std::count_if(numa.plan->workers.begin(), numa.plan->workers.end(),
                                           [](const WorkerBinding& w) { return !w.bound(); })
                           : 0;
  numa.notice += !numa.plan    ? "; starting unbound"
                 : unbound > 1 ? "; starting them unbound"
                               : "; starting it unbound";
  return numa;
}

// --dry-run: the first attempt's plan, nothing started.
int dryRun(const Job& job, const NumaDecision& numa) {
  const LaunchConfig& config = job.config;
  // The agent makes a fresh NCCL id per attempt when the workers see a GPU; the dry run loads
  // NCCL and says whether the agent would make one, or why not, without making one.
  auto nccl = agent::NcclUniqueIdProvider::create(agent::ncclLibrary(job.env));
  const RendezvousOutcome rdzv = rendezvousOutcome(
      config.rdzv_id, job.nproc.value(),
      dryRunAttempt(config, job.rdzv, job.nproc.value(), nccl.isOk() && !job.node.gpus.empty()));
  std::string run_dir =
      (config.log_dir.empty() ? std::string("<temporary run dir>")
                              : config.log_dir + "/" + config.rdzv_id + "_<random>");
  auto plan = makeLaunchPlan(config, job.node, rdzv, job.env, run_dir);
  if (!plan.isOk()) return usageError(plan.status());
  if (!nccl.isOk()) {
    plan.value().notes.push_back(nccl.status().message());
  } else if (job.node.gpus.empty()) {
    plan.value().notes.push_back(
        "no GPU for the workers: the agent loads no NCCL and sets no CPPRUN_NCCL_UNIQUE_ID");
  }
  if (numa.plan) {
    applyNumaBinding(*numa.plan, plan.value());
    plan.value().notes.push_back("--numa-binding=" + config.numa_binding + ": topology from " +
                                 numa.plan->topology_source + ", GPUs from " +
                                 numa.plan->gpu_source);
  }
  if (!numa.notice.empty()) plan.value().notes.push_back(numa.notice);
  std::fputs(describeDryRun(config, job.rdzv, job.node, rdzv, plan.value(), job.sched.scheduler,
                            job.provenance)
                 .c_str(),
             stdout);
  return 0;
}

// The agent's options for this job: the system looked up here (a unique agent id, gdb, a free
// port), the rest by makeAgentOptions. Runs in the agent process (the id names its pid).
Result<agent::LocalAgentOptions> agentOptions(const Job& job) {
  const LaunchConfig& config = job.config;
  AgentOptionsInputs in;
  in.config = config;
  in.rdzv = job.rdzv;
  in.node = job.node;
  in.nproc = job.nproc.value();
  in.env = job.env;
  in.scheduler_rank = job.scheduler_rank;
  in.stdout_is_terminal = ::isatty(STDOUT_FILENO) != 0;
  in.stderr_is_terminal = ::isatty(STDERR_FILENO) != 0;
  // The scheduler's node names, by node rank, for "waiting for" notices (static ranks only).
  if (job.sched.hosts && !job.rdzv.elastic && job.provenance.count("--node-rank")) {
    in.expected_hosts = job.sched.hosts->value;
  }
  if (job.rdzv.multi_node) in.agent_id = uniqueAgentId(agentName(config, job.node));
  Result<std::string> secret = jobSecret(job.env, job.rdzv.secret_file);
  if (!secret.isOk()) return secret.status();
  in.secret = std::move(secret).value();
  // The workers inherit the agent's environment at spawn: the secret stays with the agent.
  ::unsetenv(kSecretVariable);
  if (job.rdzv.multi_node && in.secret.empty() && !job.rdzv.etcd) {
    CPPRUN_LOG(kWarn) << "the job's store is open: anyone who can reach "
                      << formatHostPort(job.rdzv.store.host, job.rdzv.store.port)
                      << " can write its keys; give every agent the same " << kSecretVariable
                      << " or --rdzv-conf secret_file (docs/security.md)";
  }
  // On one node too: a key cpprun does not know is as ignored there as on many.
  for (const std::string& key : job.rdzv.ignored_conf_keys) {
    CPPRUN_LOG(kWarn) << "--rdzv-conf " << clipValue(key) << ": not a key cpprun uses; ignored";
  }
  if (config.stall_timeout > 0) {
    in.gdb_path = findExecutable("gdb", envOr(job.env, "PATH", ""));
    CPPRUN_LOG(kInfo) << "stall detection: a rank is stalled after " << config.stall_timeout
                      << " s without progress; stacks by "
                      << (in.gdb_path.empty() ? "Python faulthandler only (gdb not found)"
                                              : in.gdb_path + " and Python faulthandler");
  }
  if (config.worker_hosts_store && !config.master_port_given) {
    auto port = pickFreePort(config.master_addr);
    if (!port.isOk()) return port.status();
    in.worker_store_port = port.value();
  }
  return makeAgentOptions(in);
}

// The failure report: cpprun's own message, bounded in size (failure_report.h), so it goes to
// the console past the budget that drops worker and log lines when the console does not keep up
// (OutputSinks::writeReport); without the agent's writers, where log lines go.
void showReport(agent::OutputSinks* sinks, std::string report) {
  if (sinks != nullptr) {
    sinks->writeReport(std::move(report));
  } else {
    logText(std::move(report));
  }
}

// The job's end as the user reads it (and the root cause in $TORCHELASTIC_ERROR_FILE); the
// agent's exit code.
int reportOutcome(const Job& job, const agent::JobOutcome& outcome, int world_size,
                  int group_world_size, agent::OutputSinks* sinks) {
  switch (outcome.kind) {
    case agent::JobOutcome::Kind::kSucceeded:
      CPPRUN_LOG(kInfo)
          << "all " << world_size << " workers"
          << (job.rdzv.multi_node ? " of " + std::to_string(group_world_size) + " nodes"
                                  : std::string())
          << " succeeded"
          << (outcome.restarts ? " after " + std::to_string(outcome.restarts) + " restart(s)" : "");
      break;
    case agent::JobOutcome::Kind::kWorkersFailed: {
      if (outcome.summary.rfind("hang: ", 0) == 0) {
        // The stall verdict (agent/supervision/stall_verdict.h): who caused the hang.
        CPPRUN_LOG(kError) << "the job failed; " << outcome.summary;
      } else if (job.rdzv.multi_node && !outcome.summary.empty()) {
        CPPRUN_LOG(kError) << "the job failed; first failure: " << outcome.summary;
      }
      showReport(sinks, agent::formatFailureReport(job.config.entrypoint, job.node.hostname,
                                                   outcome.failures));
      auto own_error_file = job.env.find("TORCHELASTIC_ERROR_FILE");
      if (own_error_file != job.env.end() && !own_error_file->second.empty() &&
          !outcome.failures.empty()) {
        const auto& root = outcome.failures[agent::rootCauseIndex(outcome.failures)];
        Status s = agent::writeRootCauseFile(own_error_file->second, root);
        if (!s.isOk()) {
          CPPRUN_LOG(kWarn) << s.message();
        }
      }
      break;
    }
    case agent::JobOutcome::Kind::kSignalled:
      CPPRUN_LOG(kWarn) << "stopped by " << agent::signalName(outcome.signal);
      break;
    case agent::JobOutcome::Kind::kStartFailed:
      CPPRUN_LOG(kError) << "cannot start the workers: " << outcome.error.message();
      break;
    case agent::JobOutcome::Kind::kLostPeers:
      CPPRUN_LOG(kError) << "the job cannot go on without the other nodes: "
                         << outcome.error.message();
      return kExitLostPeers;
    case agent::JobOutcome::Kind::kLeft:
      CPPRUN_LOG(kInfo) << "this node left the job as asked (" << outcome.summary
                        << "); the other nodes go on without it";
      break;
    case agent::JobOutcome::Kind::kNotNeeded:
      CPPRUN_LOG(kInfo) << "this node waited as a spare and the job did not need it ("
                        << outcome.summary << ")";
      break;
    case agent::JobOutcome::Kind::kUnhealthy:
      CPPRUN_LOG(kError) << outcome.error.message()
                         << " (exit 5: this node failed its health check; see docs/operations.md)";
      break;
    case agent::JobOutcome::Kind::kUnreaped: {
      if (!outcome.failures.empty()) {
        showReport(sinks, agent::formatFailureReport(job.config.entrypoint, job.node.hostname,
                                                     outcome.failures));
        auto own_error_file = job.env.find("TORCHELASTIC_ERROR_FILE");
        if (own_error_file != job.env.end() && !own_error_file->second.empty()) {
          const auto& root = outcome.failures[agent::rootCauseIndex(outcome.failures)];
          if (Status s = agent::writeRootCauseFile(own_error_file->second, root); !s.isOk()) {
            CPPRUN_LOG(kWarn) << s.message();
          }
        }
      }
      int left = 0;
      for (const auto& f : outcome.failures) left += f.unreaped ? 1 : 0;
      CPPRUN_LOG(kError) << left
                         << " worker(s) still alive after SIGKILL (stuck in the kernel; named in "
                            "the report above); everything else was killed (exit 7: see "
                            "docs/troubleshooting.md)";
      break;
    }
    case agent::JobOutcome::Kind::kExcluded:
      if (!outcome.failures.empty()) {
        showReport(sinks, agent::formatFailureReport(job.config.entrypoint, job.node.hostname,
                                                     outcome.failures));
      }
      CPPRUN_LOG(kError) << outcome.error.message()
                         << " (exit 6: this node left the job; see docs/operations.md)";
      break;
  }
  for (const std::string& departure : outcome.departures) {
    CPPRUN_LOG(kWarn) << "left the job: " << departure;
  }
  return outcome.exitCode();
}

// What the agent process runs: the job, its NUMA plan, the run directory the guardian made (the
// agent removes a temporary one when the job ends) and the agent's options.
struct AgentRun {
  const Job& job;
  const NumaDecision& numa;
  const RunDirectory& shared_run_dir;
  agent::LocalAgentOptions options;
};

int runJob(const AgentRun& run) {
  const Job& job = run.job;
  RunDirectory run_dir{run.shared_run_dir.path, run.shared_run_dir.temporary};
  bool logged_notes = false;
  int world_size = job.nproc.value();
  int group_world_size = 1;
  auto make_attempt = [&](const agent::AttemptContext& context) -> Result<agent::AttemptSpec> {
    const RendezvousOutcome rdzv =
        rendezvousOutcome(job.config.rdzv_id, job.nproc.value(), context);
    world_size = rdzv.world_size;
    group_world_size = rdzv.group_world_size;
    auto plan = makeLaunchPlan(job.config, job.node, rdzv, job.env, run_dir.path);
    if (!plan.isOk()) return plan.status();
    if (run.numa.plan) applyNumaBinding(*run.numa.plan, plan.value());
    if (!logged_notes) {
      for (const auto& note : plan.value().notes) CPPRUN_LOG(kInfo) << note;
      logged_notes = true;
    }
    agent::AttemptSpec attempt;
    // Made fresh, as torchrun wipes it too; nothing in it is followed or removed through a link.
    auto attempt_dir =
        makeFreshSubdirectory(run_dir.path, "attempt_" + std::to_string(context.restart_count));
    if (!attempt_dir.isOk()) return attempt_dir.status();
    attempt.attempt_dir = std::move(attempt_dir).value();
    attempt.workers = std::move(plan.value().workers);
    return attempt;
  };
  agent::LocalAgentOptions options = run.options;
  if (options.supervisor.warm_restart) {
    agent::WarmStartOptions warm;
    warm.module_dir = agent::pythonModuleDirectory(run_dir.path);  // beside the sitecustomize
    // What a hot spare's warm process starts from: local rank 0 as the first attempt would run
    // it here, with the sitecustomize on PYTHONPATH as the supervisor's wiring adds it.
    auto like = makeLaunchPlan(job.config, job.node,
                               rendezvousOutcome(job.config.rdzv_id, job.nproc.value(), {}),
                               job.env, run_dir.path);
    if (like.isOk() && !like.value().workers.empty()) {
      const auto& worker = like.value().workers.front();
      warm.spare_like.argv = worker.argv;
      warm.spare_like.env = worker.env;
      agent::addPythonProgress(warm.spare_like.env, warm.module_dir, std::chrono::milliseconds(0),
                               std::getenv("PYTHONPATH"));
    }
    options.warm_start = warm;
  }
  if (auto timer_file = fileTimerPath(job.env, run_dir.path)) {
    options.supervisor.file_timer = {true, *timer_file};
  }
  auto result = agent::runLocalAgent(options, make_attempt);
  if (!result.isOk()) {
    CPPRUN_LOG(kError) << result.status().message();
    return kExitLaunchError;
  }
  return reportOutcome(job, result.value(), world_size, group_world_size,
                       options.supervisor.sinks.get());
}

// A run: the run directory, then the agent under its guardian.
int launch(const Job& job, const NumaDecision& numa) {
  const LaunchConfig& config = job.config;
  // From the run directory's creation on, no signal may end this process by its default action
  // (it would leave the directory behind): they stay pending until the guardian waits for them
  // and passes them on (agent/processes/signal_policy.h).
  std::vector<int> taken_over = agent::signalsToTakeOver();
  taken_over.insert(taken_over.end(), config.signals_to_handle.begin(),
                    config.signals_to_handle.end());
  const sigset_t held = agent::signalSetOf(taken_over);
  ::sigprocmask(SIG_BLOCK, &held, nullptr);
  RunDirectory run_dir;
  if (Status s = prepareRunDirectory(config, job.env, &run_dir); !s.isOk()) {
    std::fprintf(stderr, "cpprun: error: %s\n", s.message().c_str());
    return s.code() == StatusCode::kInvalidArgument ? kExitUsage : kExitLaunchError;
  }
  raiseOpenFileLimit();
  if (!numa.notice.empty()) {
    CPPRUN_LOG(kWarn) << numa.notice;
  }
  if (numa.plan) {
    CPPRUN_LOG(kInfo) << "--numa-binding=" << config.numa_binding << ": topology from "
                      << numa.plan->topology_source << ", GPUs from " << numa.plan->gpu_source;
    for (const WorkerBinding& w : numa.plan->workers) {
      if (w.bound()) {
        CPPRUN_LOG(kInfo) << "local rank " << w.local_rank << ": " << describeWorkerBinding(w);
      }
    }
  }
  int code = agent::runUnderGuardian(
      [&](const agent::WorkerContainment& containment) {
        // The agent's console (its log, the workers' lines, the final report) is written by
        // threads of its own from here to the end, so no stalled reader blocks the agent.
        auto sinks = std::make_shared<agent::OutputSinks>(STDOUT_FILENO, STDERR_FILENO);
        sinks->routeLogHere();
        int agent_code = kExitLaunchError;
        auto options = agentOptions(job);
        if (!options.isOk()) {
          CPPRUN_LOG(kError) << options.status().message();
        } else {
          options.value().supervisor.sinks = sinks;
          options.value().containment = containment;
          agent_code = runJob(AgentRun{job, numa, run_dir, std::move(options).value()});
        }
        // A job ended by a signal: the user wants it over, not the console caught up.
        const bool signalled = agent_code > 128;
        sinks->close(signalled ? agent::kConsoleExitFlushAfterSignal : agent::kConsoleExitFlush,
                     agent::kFileExitFlush);
        return agent_code;
      },
      agent::GuardianOptions{
          config.signals_to_handle, run_dir.temporary ? run_dir.path : std::string(),
          std::chrono::milliseconds(static_cast<int64_t>(config.reap_timeout * 1000))});
  if (code < 0) {
    std::perror("cpprun: fork");
    return kExitLaunchError;
  }
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  setLogProgramName("cpprun");
  std::vector<std::string> args(argv + 1, argv + argc);
  auto env = processEnvironment();
  auto parsed = parseCommandLine(args, env);
  if (!parsed.isOk()) {
    std::fprintf(stderr, "cpprun: error: %s\nTry 'cpprun --help'.\n",
                 parsed.status().message().c_str());
    return kExitUsage;
  }
  if (parsed.value().show_help) {
    std::fputs(usageText(), stdout);
    return 0;
  }
  if (parsed.value().show_version) {
    std::printf("cpprun %s\n", CPPRUN_VERSION);
    return 0;
  }
  auto job = resolveJob(parsed.value().config, std::move(env));
  if (!job.isOk()) return usageError(job.status());
  if (job.value().config.check) return runCheck(job.value());
  if (!job.value().nproc.isOk()) return usageError(job.value().nproc.status());
  auto numa = planNumaBinding(job.value());
  if (!numa.isOk()) {
    std::fprintf(stderr, "cpprun: error: %s\n", numa.status().message().c_str());
    return kExitLaunchError;
  }
  if (job.value().config.dry_run) return dryRun(job.value(), numa.value());
  return launch(job.value(), numa.value());
}
