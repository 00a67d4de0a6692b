#include "launcher/agent_options.h"

#include <algorithm>
#include <chrono>
#include <cstdint>

#include "agent/coordination/etcd_connector.h"
#include "agent/nccl/nccl_id_groups.h"
#include "agent/nccl/nccl_unique_id.h"
#include "common/environment.h"
#include "common/network_address.h"
#include "launcher/node_health.h"

namespace cpprun::launcher {

namespace {

std::chrono::milliseconds milliseconds(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

// The coordination with the other agents, and what it changes about the store (multi-node).
agent::StoreCoordinatorOptions coordinatorOptions(const AgentOptionsInputs& in,
                                                  agent::LocalAgentOptions& options) {
  const LaunchConfig& config = in.config;
  const RendezvousSettings& rdzv = in.rdzv;
  options.store_bind_host = rdzv.bind_host;
  agent::StoreCoordinatorOptions co;
  co.group_rank = rdzv.node_rank;
  co.group_world_size = rdzv.nnodes;
  co.run_id = config.rdzv_id;
  co.self = agent::AgentInfo{agentName(config, in.node), in.nproc, in.agent_id, in.scheduler_rank};
  co.join_timeout = rdzv.join_timeout;
  co.keep_alive_interval = rdzv.keep_alive_interval;
  co.keep_alive_max_attempt = rdzv.keep_alive_max_attempt;
  co.final_linger = rdzv.close_timeout;
  co.expected_hosts = in.expected_hosts;
  co.secret = in.secret;
  if (rdzv.elastic) {
    co.elastic = true;
    co.min_nodes = rdzv.min_nodes;
    co.max_nodes = rdzv.nnodes;
    co.last_call_timeout = rdzv.last_call_timeout;
    using Hosting = RendezvousSettings::StoreHosting;
    options.host_store = rdzv.store_hosting == Hosting::kAlways;
    options.host_store_if_free =
        rdzv.store_hosting == Hosting::kAuto && in.is_local_host(rdzv.store.host);
  }
  if (rdzv.etcd) {
    // The agents meet in etcd; every one serves a workers' store on a free port of its host
    // (the round's node 0's is the workers'), reachable at --local-addr, else at this host's
    // name (127.0.0.1 when etcd too runs only on this machine).
    agent::EtcdConnectorOptions eo;
    eo.endpoints = rdzv.etcd_endpoints;
    eo.tls = rdzv.etcd_tls;
    eo.ca_file = rdzv.etcd_cacert;
    eo.cert_file = rdzv.etcd_cert;
    eo.key_file = rdzv.etcd_key;
    eo.run_id = config.rdzv_id;
    co.store = agent::etcdStoreConnector(eo);
    co.host_per_round = true;
    bool etcd_local = true;
    for (const std::string& e : eo.endpoints) {
      auto parsed = parseEndpoint(e, kDefaultEtcdPort);
      etcd_local = etcd_local && parsed.isOk() && in.is_local_host(parsed.value().host);
    }
    options.host_store = true;
    options.host_store_if_free = false;
    options.store_port = 0;
    options.store_host = !config.local_addr.empty() ? config.local_addr
                         : etcd_local               ? "127.0.0.1"
                                                    : in.node.hostname;
    options.store_bind_host = isIpv6Literal(options.store_host) ? "::" : "0.0.0.0";
  }
  return co;
}

}  // namespace

std::string agentName(const LaunchConfig& config, const NodeResources& node) {
  return config.local_addr.empty() ? node.hostname : config.local_addr;
}

agent::OutputOptions outputOptions(const LaunchConfig& config,
                                   const std::map<std::string, std::string>& env,
                                   bool stdout_is_terminal, bool stderr_is_terminal) {
  agent::OutputOptions o;
  const bool template_given = config.given.count("--log-line-prefix-template") != 0;
  o.prefix_template = !config.log_line_prefix_template.empty() || template_given
                          ? config.log_line_prefix_template
                          : envOr(env, "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", o.prefix_template);
  if (config.raw_output) o.prefix_template.clear();
  o.console_stdout_terminal = stdout_is_terminal;
  o.console_stderr_terminal = stderr_is_terminal;
  o.stdout_pty = config.worker_tty && stdout_is_terminal;
  o.stderr_pty = config.worker_tty && stderr_is_terminal;
  o.role_name = config.role;
  o.redirects_default = config.redirects_default;
  o.redirects_by_rank = config.redirects_by_rank;
  o.tee_default = config.tee_default;
  o.tee_by_rank = config.tee_by_rank;
  o.local_ranks_filter = config.local_ranks_filter;
  o.duplicate_stdout_filters = config.duplicate_stdout_filters;
  o.duplicate_stderr_filters = config.duplicate_stderr_filters;
  return o;
}

agent::LocalAgentOptions makeAgentOptions(const AgentOptionsInputs& in) {
  const LaunchConfig& config = in.config;
  const RendezvousSettings& rdzv = in.rdzv;
  agent::LocalAgentOptions options;
  options.host_store = !config.worker_hosts_store && rdzv.node_rank == 0;
  options.store_host = rdzv.store.host;
  options.store_port = rdzv.store.port;
  if (rdzv.store_torch21_numbering) {
    options.store_no_handshake_dialect = rendezvous::wire::Dialect::kV21;
  }
  options.store_secret = in.secret;
  if (rdzv.multi_node) options.multi_node = coordinatorOptions(in, options);
  options.nccl_library = agent::ncclLibrary(in.env);
  // NCCL needs a GPU: workers that see none cannot use an NCCL id, so the agent does not load
  // the library (~200 MB; with its first ncclGetUniqueId ~3 ms of a job's start here).
  options.use_nccl = !in.node.gpus.empty();
  // Checked before (resolveJob): a bad value never gets here; the default if it does.
  const auto ranks_per_id = agent::ncclRanksPerId(in.env);
  options.nccl_ranks_per_id =
      ranks_per_id.isOk() ? ranks_per_id.value() : agent::kDefaultNcclRanksPerId;
  options.nproc = in.nproc;
  options.host_name = agentName(config, in.node);
  options.run_id = config.rdzv_id;
  options.event_log_path = config.event_log;
  options.event_log_console = config.event_log_handler == "console";
  options.metrics_host = config.metrics_host;
  options.metrics_port = config.metrics_port;
  options.metrics_token = config.metrics_token;
  options.supervisor.warm_restart = config.warm_restart;
  if (config.stall_timeout > 0) {
    auto& stall = options.supervisor.stall;
    stall.timeout = milliseconds(config.stall_timeout);
    const double first = config.stall_first_timeout > 0
                             ? config.stall_first_timeout
                             : std::max(kDefaultStallFirstTimeoutSeconds, config.stall_timeout);
    stall.first_timeout = milliseconds(first);
    stall.stacks_timeout = milliseconds(config.stall_stacks_timeout);
    stall.python_progress = config.python_progress;
    stall.gdb_path = in.gdb_path;
  }
  // --health-check runs before every attempt on one node too; the built-in checks are the
  // multi-node round's (docs/operations.md, "Health checks").
  options.health.command = config.health_check;
  options.health.timeout = milliseconds(config.health_check_timeout);
  if (options.multi_node) {
    if (config.builtin_health_checks) {
      options.health.builtin = makeBuiltinHealthCheck(config, in.node, in.env);
    }
    options.multi_node->exclude_after = config.exclude_after;
    options.multi_node->exclude_window =
        std::chrono::seconds(static_cast<int64_t>(config.exclude_window));
  }
  options.signals_to_handle = config.signals_to_handle;
  options.supervisor.max_restarts = config.max_restarts;
  options.supervisor.shutdown_timeout = milliseconds(config.shutdown_timeout);
  options.supervisor.reap_timeout = milliseconds(config.reap_timeout);
  options.supervisor.uninterruptible_timeout = milliseconds(config.uninterruptible_state_timeout);
  options.supervisor.output =
      outputOptions(config, in.env, in.stdout_is_terminal, in.stderr_is_terminal);
  options.stdin_mode = config.stdin_mode == "none"  ? agent::StdinMode::kNone
                       : config.stdin_mode == "all" ? agent::StdinMode::kAll
                                                    : agent::StdinMode::kRank0;
  if (config.worker_hosts_store && !config.master_port_given && in.worker_store_port) {
    options.store_port = *in.worker_store_port;
  }
  return options;
}

}  // namespace cpprun::launcher
