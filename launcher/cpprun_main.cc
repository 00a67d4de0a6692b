// cpprun: the torchrun-compatible launcher. Parses the command line, discovers the node,
// prints the plan (--dry-run) or runs the job: a guardian process, the agent under it (store,
// supervisor, event loop), the workers under the agent. Exit codes: README "Exit codes".
#include <linux/magic.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "agent/etcd_connector.h"
#include "agent/failure_report.h"
#include "agent/guardian.h"
#include "agent/local_agent.h"
#include "agent/nccl_unique_id.h"
#include "common/logging.h"
#include "common/system.h"
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

std::string envOr(const std::map<std::string, std::string>& env, const std::string& name,
                  const std::string& fallback) {
  auto it = env.find(name);
  return it == env.end() ? fallback : it->second;
}

// A port the kernel considers free right now (for --worker-hosts-store, where worker rank 0
// binds it; racy by nature, as torchrun's equivalent).
Result<int> pickFreePort(const std::string& host) {
  const int port = pickFreeTcpPort();
  if (port <= 0) return unavailable("cannot pick a free port on " + host);
  return port;
}

agent::OutputOptions outputOptions(const LaunchConfig& config,
                                   const std::map<std::string, std::string>& env) {
  agent::OutputOptions o;
  o.prefix_template = !config.log_line_prefix_template.empty()
                          ? config.log_line_prefix_template
                          : envOr(env, "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", o.prefix_template);
  o.role_name = config.role;
  o.redirects_default = config.redirects_default;
  o.redirects_by_rank = config.redirects_by_rank;
  o.tee_default = config.tee_default;
  o.tee_by_rank = config.tee_by_rank;
  o.local_ranks_filter = config.local_ranks_filter;
  return o;
}

// The run's directory: <log dir>/<run id> when --log-dir is given, else a fresh temporary one
// (removed at the end) for the error files. It is made before the guardian forks, and both
// processes remove a temporary one when they are done: the guardian after the agent is gone
// (even when the agent was SIGKILLed), the agent when its job ends (even when the guardian was).
struct RunDirectory {
  std::string path;
  bool temporary = false;
  ~RunDirectory() {
    if (temporary && !path.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
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
    dir->path = config.log_dir + "/" + config.rdzv_id;
    std::filesystem::create_directories(dir->path, ec);
    if (ec) return invalidArgument("--log-dir: cannot create " + dir->path + ": " + ec.message());
    return Status::ok();
  }
  std::string base = envOr(processEnvironment(), "TMPDIR", "");
  if (base.empty()) base = kept ? "/tmp" : defaultTemporaryBase();
  std::string templ = base + "/cpprun-XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) {
    return invalidArgument("cannot create a run directory under " + base);
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

// `scheduler_rank`: this agent's rank as the scheduler gave it (elastic ordering), -1 if none.
// `shared_run_dir`: made by prepareRunDirectory in the guardian; the agent removes a temporary
// one when the job ends.
int runJob(const LaunchConfig& config, const RendezvousSettings& rdzv_settings,
           const NodeResources& node, int nproc, const std::map<std::string, std::string>& env,
           int scheduler_rank, const std::vector<std::string>& expected_hosts,
           const RunDirectory& shared_run_dir, const std::optional<NumaBindingPlan>& numa) {
  RunDirectory run_dir{shared_run_dir.path, shared_run_dir.temporary};

  agent::LocalAgentOptions options;
  options.host_store = !config.worker_hosts_store && rdzv_settings.node_rank == 0;
  options.store_host = rdzv_settings.store.host;
  options.store_port = rdzv_settings.store.port;
  if (rdzv_settings.store_torch21_numbering) {
    options.store_no_handshake_dialect = rendezvous::wire::Dialect::kV21;
  }
  if (rdzv_settings.multi_node) {
    options.store_bind_host = rdzv_settings.bind_host;
    agent::StoreCoordinatorOptions co;
    co.group_rank = rdzv_settings.node_rank;
    co.group_world_size = rdzv_settings.nnodes;
    const std::string name = config.local_addr.empty() ? node.hostname : config.local_addr;
    co.self = agent::AgentInfo{name, nproc, uniqueAgentId(name), scheduler_rank};
    co.join_timeout = rdzv_settings.join_timeout;
    co.keep_alive_interval = rdzv_settings.keep_alive_interval;
    co.keep_alive_max_attempt = rdzv_settings.keep_alive_max_attempt;
    co.final_linger = rdzv_settings.close_timeout;
    co.expected_hosts = expected_hosts;
    if (rdzv_settings.elastic) {
      co.elastic = true;
      co.min_nodes = rdzv_settings.min_nodes;
      co.max_nodes = rdzv_settings.nnodes;
      co.last_call_timeout = rdzv_settings.last_call_timeout;
      using Hosting = RendezvousSettings::StoreHosting;
      options.host_store = rdzv_settings.store_hosting == Hosting::kAlways;
      options.host_store_if_free =
          rdzv_settings.store_hosting == Hosting::kAuto && isLocalHost(rdzv_settings.store.host);
    }
    if (rdzv_settings.etcd) {
      // The agents meet in etcd; every one serves a workers' store on a free port of its host
      // (the round's node 0's is the workers'), reachable at --local-addr, else at this host's
      // name (127.0.0.1 when etcd too runs only on this machine).
      agent::EtcdConnectorOptions eo;
      eo.endpoints = rdzv_settings.etcd_endpoints;
      eo.tls = rdzv_settings.etcd_tls;
      eo.ca_file = rdzv_settings.etcd_cacert;
      eo.cert_file = rdzv_settings.etcd_cert;
      eo.key_file = rdzv_settings.etcd_key;
      eo.run_id = config.rdzv_id;
      co.store = agent::etcdStoreConnector(eo);
      co.host_per_round = true;
      bool etcd_local = true;
      for (const std::string& e : eo.endpoints) {
        auto parsed = parseEndpoint(e, kDefaultEtcdPort);
        etcd_local = etcd_local && parsed.isOk() && isLocalHost(parsed.value().host);
      }
      options.host_store = true;
      options.host_store_if_free = false;
      options.store_port = 0;
      options.store_host = !config.local_addr.empty() ? config.local_addr
                           : etcd_local               ? "127.0.0.1"
                                                      : node.hostname;
      options.store_bind_host =
          options.store_host.find(':') != std::string::npos ? "::" : "0.0.0.0";
    }
    for (const std::string& key : rdzv_settings.ignored_conf_keys) {
      CPPRUN_LOG(kWarn) << "--rdzv-conf " << key << ": not a key cpprun uses; ignored";
    }
    options.multi_node = co;
  }
  options.nccl_library = agent::ncclLibrary(env);
  // NCCL needs a GPU: workers that see none cannot use an NCCL id, so the agent does not load
  // the library (~200 MB; with its first ncclGetUniqueId ~3 ms of a job's start here).
  options.use_nccl = !node.gpus.empty();
  options.host_name = config.local_addr.empty() ? node.hostname : config.local_addr;
  options.run_id = config.rdzv_id;
  options.event_log_path = config.event_log;
  options.metrics_host = config.metrics_host;
  options.metrics_port = config.metrics_port;
  if (config.stall_timeout > 0) {
    options.supervisor.stall.timeout =
        std::chrono::milliseconds(static_cast<int64_t>(config.stall_timeout * 1000));
    options.supervisor.stall.gdb_path = findExecutable("gdb", envOr(env, "PATH", ""));
    CPPRUN_LOG(kInfo) << "stall detection: a rank is stalled after " << config.stall_timeout
                      << " s without progress; stacks by "
                      << (options.supervisor.stall.gdb_path.empty()
                              ? "Python faulthandler only (gdb not found)"
                              : options.supervisor.stall.gdb_path + " and Python faulthandler");
  }
  options.signals_to_handle = config.signals_to_handle;
  options.supervisor.max_restarts = config.max_restarts;
  options.supervisor.shutdown_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(config.shutdown_timeout * 1000));
  options.supervisor.output = outputOptions(config, env);
  if (config.worker_hosts_store && !config.master_port_given) {
    auto port = pickFreePort(config.master_addr);
    if (!port.isOk()) {
      CPPRUN_LOG(kError) << port.status().message();
      return kExitLaunchError;
    }
    options.store_port = port.value();
  }

  bool logged_notes = false;
  int world_size = nproc;
  int group_world_size = 1;
  auto make_attempt = [&](const agent::AttemptContext& context) -> Result<agent::AttemptSpec> {
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
    world_size = rdzv.world_size;
    group_world_size = rdzv.group_world_size;
    rdzv.master_addr = context.store_host;
    rdzv.master_port = context.store_port;
    rdzv.run_id = config.rdzv_id;
    rdzv.restart_count = context.restart_count;
    rdzv.nccl_unique_id_hex = context.nccl_unique_id_hex;
    auto plan = makeLaunchPlan(config, node, rdzv, env, run_dir.path);
    if (!plan.isOk()) return plan.status();
    if (numa) applyNumaBinding(*numa, plan.value());
    if (!logged_notes) {
      for (const auto& note : plan.value().notes) CPPRUN_LOG(kInfo) << note;
      logged_notes = true;
    }
    agent::AttemptSpec attempt;
    attempt.attempt_dir = run_dir.path + "/attempt_" + std::to_string(context.restart_count);
    std::error_code ec;
    std::filesystem::remove_all(attempt.attempt_dir, ec);  // torchrun wipes it too
    attempt.workers = std::move(plan.value().workers);
    return attempt;
  };

  auto result = agent::runLocalAgent(options, make_attempt);
  if (!result.isOk()) {
    CPPRUN_LOG(kError) << result.status().message();
    return kExitLaunchError;
  }
  const agent::JobOutcome& outcome = result.value();
  switch (outcome.kind) {
    case agent::JobOutcome::Kind::kSucceeded:
      CPPRUN_LOG(kInfo)
          << "all " << world_size << " workers"
          << (rdzv_settings.multi_node ? " of " + std::to_string(group_world_size) + " nodes"
                                       : std::string())
          << " succeeded"
          << (outcome.restarts ? " after " + std::to_string(outcome.restarts) + " restart(s)" : "");
      break;
    case agent::JobOutcome::Kind::kWorkersFailed: {
      if (rdzv_settings.multi_node && !outcome.summary.empty()) {
        CPPRUN_LOG(kError) << "the job failed; first failure: " << outcome.summary;
      }
      std::fputs(
          agent::formatFailureReport(config.entrypoint, node.hostname, outcome.failures).c_str(),
          stderr);
      std::fflush(stderr);
      auto own_error_file = env.find("TORCHELASTIC_ERROR_FILE");
      if (own_error_file != env.end() && !own_error_file->second.empty() &&
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
  }
  return outcome.exitCode();
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
  LaunchConfig config = parsed.value().config;
  auto sched = discoverScheduler(env);
  Provenance provenance;
  Status discovered =
      sched.isOk() ? applySchedulerEnvironment(sched.value(), config, provenance) : sched.status();
  if (!discovered.isOk()) {
    std::fprintf(stderr, "cpprun: error: %s\n", discovered.message().c_str());
    return kExitUsage;
  }
  applyOneNodeRunId(config, provenance.count("--rdzv-id") != 0);
  auto rdzv_settings = resolveRendezvous(config);
  if (!rdzv_settings.isOk()) {
    std::fprintf(stderr, "cpprun: error: %s\n", rdzv_settings.status().message().c_str());
    return kExitUsage;
  }
  // The scheduler's rank orders an elastic job's nodes (flags do not: torchrun ignores
  // --node-rank with c10d).
  const int scheduler_rank = provenance.count("--node-rank") && sched.value().agent_rank
                                 ? sched.value().agent_rank->value
                                 : -1;
  if (rdzv_settings.value().multi_node && config.worker_hosts_store) {
    std::fprintf(stderr,
                 "cpprun: error: --worker-hosts-store is for one node: the agents of a "
                 "multi-node job meet in the store the agent of node 0 serves\n");
    return kExitUsage;
  }
  NodeResources node = discoverNodeResources(env);
  auto nproc = resolveNproc(config, node);
  if (config.check) {
    raiseOpenFileLimit();  // as a run does: the workers inherit the raised limit
    SystemFacts facts = probeSystem(config, rdzv_settings.value(), env);
    PreflightReport report = runPreflight(config, rdzv_settings.value(), node,
                                          nproc.isOk() ? nproc.value() : 0, env, facts);
    // Each worker's GPU, NUMA node and nearest NIC; its CPUs too with --numa-binding.
    const bool numa_requested = !config.numa_binding.empty();
    const int numa_workers =
        nproc.isOk() ? nproc.value() : static_cast<int>(std::max<size_t>(node.gpus.size(), 1));
    for (auto& finding : numaBindingFindings(
             prepareNumaBinding(numa_requested ? *parseNumaBindingMode(config.numa_binding)
                                               : NumaBindingMode::kNode,
                                node, numa_workers, env),
             numa_requested, config.strict_numa_binding)) {
      report.findings.push_back(std::move(finding));
    }
    if (!nproc.isOk()) {
      report.findings.insert(report.findings.begin(),
                             {CheckLevel::kFail, "workers", nproc.status().message()});
    }
    std::fputs(report
                   .format("cpprun --check on " + node.hostname + " (cpprun " + CPPRUN_VERSION +
                           ", node " + std::to_string(rdzv_settings.value().node_rank) + " of " +
                           std::to_string(rdzv_settings.value().nnodes) + ")")
                   .c_str(),
               stdout);
    return report.failures() > 0 ? 1 : 0;
  }
  if (!nproc.isOk()) {
    std::fprintf(stderr, "cpprun: error: %s\n", nproc.status().message().c_str());
    return kExitUsage;
  }

  // --numa-binding: planned once for the job (the topology and the GPUs do not change between
  // attempts); a worker that cannot be bound is reported once, and stops the start only under
  // --strict-numa-binding.
  std::optional<NumaBindingPlan> numa;
  std::string numa_notice;
  if (!config.numa_binding.empty()) {
    const NumaBindingMode mode = *parseNumaBindingMode(config.numa_binding);
    auto planned = prepareNumaBinding(mode, node, nproc.value(), env);
    if (!planned.isOk()) {
      numa_notice = "--numa-binding=" + config.numa_binding + ": no topology (" +
                    planned.status().message() + ")";
    } else {
      numa = std::move(planned).value();
      numa_notice = numa->unboundSummary();
    }
    if (!numa_notice.empty() && config.strict_numa_binding) {
      std::fprintf(stderr, "cpprun: error: %s; --strict-numa-binding: not starting\n",
                   numa_notice.c_str());
      return kExitLaunchError;
    }
    if (!numa_notice.empty()) {
      const auto unbound = numa ? std::count_if(numa->workers.begin(), numa->workers.end(),
                                                [](const WorkerBinding& w) { return !w.bound(); })
                                : 0;
      numa_notice += !numa         ? "; starting unbound"
                     : unbound > 1 ? "; starting them unbound"
                                   : "; starting it unbound";
    }
  }

  if (config.dry_run) {
    RendezvousOutcome rdzv;
    rdzv.group_rank = config.node_rank;
    rdzv.group_world_size = config.max_nodes;
    rdzv.world_size = nproc.value();
    rdzv.master_addr = rdzv_settings.value().store.host;
    rdzv.master_port = rdzv_settings.value().store.port;
    rdzv.run_id = config.rdzv_id;
    // The agent makes a fresh NCCL id per attempt when the workers see a GPU; the dry run loads
    // NCCL and says whether the agent would make one, or why not, without making one.
    auto nccl = agent::NcclUniqueIdProvider::create(agent::ncclLibrary(env));
    if (nccl.isOk() && !node.gpus.empty()) {
      rdzv.nccl_unique_id_hex = "<a fresh ncclUniqueId per attempt>";
    }
    std::string run_dir = (config.log_dir.empty() ? std::string("<temporary run dir>")
                                                  : config.log_dir + "/" + config.rdzv_id);
    auto plan = makeLaunchPlan(config, node, rdzv, env, run_dir);
    if (!plan.isOk()) {
      std::fprintf(stderr, "cpprun: error: %s\n", plan.status().message().c_str());
      return kExitUsage;
    }
    if (!nccl.isOk()) {
      plan.value().notes.push_back(nccl.status().message());
    } else if (node.gpus.empty()) {
      plan.value().notes.push_back(
          "no GPU for the workers: the agent loads no NCCL and sets no CPPRUN_NCCL_UNIQUE_ID");
    }
    if (numa) {
      applyNumaBinding(*numa, plan.value());
      plan.value().notes.push_back("--numa-binding=" + config.numa_binding + ": topology from " +
                                   numa->topology_source + ", GPUs from " + numa->gpu_source);
    }
    if (!numa_notice.empty()) plan.value().notes.push_back(numa_notice);
    std::fputs(describeLaunchPlan(config, node, rdzv, plan.value()).c_str(), stdout);
    if (sched.value().scheduler.empty()) {
      std::puts("  discovered  no scheduler or MPI launcher in the environment");
    } else {
      std::printf("  discovered  %s\n", sched.value().scheduler.c_str());
    }
    for (const auto& [option, source] : provenance) {
      if (option == "note") {
        std::printf("  note        %s", source.c_str());
      } else {
        std::printf("  %-11s from %s\n", option.c_str(), source.c_str());
      }
    }
    if (rdzv_settings.value().etcd && rdzv_settings.value().multi_node) {
      const RendezvousSettings& rs = rdzv_settings.value();
      std::string endpoints;
      for (const std::string& e : rs.etcd_endpoints)
        endpoints += (endpoints.empty() ? "" : ",") + e;
      std::printf("  rendezvous  %s: etcd v3 at %s://%s, keys under /cpprun/%s/, %d..%d nodes\n",
                  config.rdzv_backend.c_str(), rs.etcd_tls ? "https" : "http", endpoints.c_str(),
                  config.rdzv_id.c_str(), rs.min_nodes, rs.nnodes);
      std::puts(
          "  (ranks shown as if this node came first: every agent serves a workers' store on a "
          "free port; each round's node 0's is MASTER_ADDR:MASTER_PORT)");
    } else if (rdzv_settings.value().multi_node) {
      std::printf(
          "  (ranks shown as if this node came first: the rendezvous decides the base rank and "
          "the world size; node 0 serves the store on %s:%d)\n",
          rdzv_settings.value().bind_host.c_str(), rdzv_settings.value().store.port);
    }
    if (rdzv.master_port == 0) {
      std::puts("  (store port 0: the agent binds a free port at start; MASTER_PORT is that port)");
    }
    return 0;
  }

  RunDirectory run_dir;
  if (Status s = prepareRunDirectory(config, env, &run_dir); !s.isOk()) {
    std::fprintf(stderr, "cpprun: error: %s\n", s.message().c_str());
    return kExitLaunchError;
  }
  raiseOpenFileLimit();
  if (!numa_notice.empty()) {
    CPPRUN_LOG(kWarn) << numa_notice;
  }
  if (numa) {
    CPPRUN_LOG(kInfo) << "--numa-binding=" << config.numa_binding << ": topology from "
                      << numa->topology_source << ", GPUs from " << numa->gpu_source;
    for (const WorkerBinding& w : numa->workers) {
      if (w.bound()) {
        CPPRUN_LOG(kInfo) << "local rank " << w.local_rank << ": " << describeWorkerBinding(w);
      }
    }
  }
  // The scheduler's node names, by node rank, for "waiting for" notices (static ranks only).
  std::vector<std::string> expected_hosts;
  if (sched.value().hosts && !rdzv_settings.value().elastic && provenance.count("--node-rank"))
    expected_hosts = sched.value().hosts->value;
  int code = agent::runUnderGuardian(
      [&] {
        return runJob(config, rdzv_settings.value(), node, nproc.value(), env, scheduler_rank,
                      expected_hosts, run_dir, numa);
      },
      config.signals_to_handle);
  if (code < 0) {
    std::perror("cpprun: fork");
    return kExitLaunchError;
  }
  return code;
}
