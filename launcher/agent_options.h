// AgentOptions: what `cpprun` asks of its agent — the store it serves or joins, the rendezvous
// with the other nodes, the supervisor's bounds, the observability switches — derived from the
// command line (after the scheduler's environment filled it in), the resolved rendezvous and
// this node. Pure: whatever needs the system (a unique agent id, gdb's path, a free port, which
// host names are this machine's) comes in as an input already looked up, so a test can build the
// options of any job without starting anything.
//
// Thread safety: pure functions on values.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "agent/console/worker_output.h"
#include "agent/local_agent.h"
#include "launcher/launch_config.h"
#include "launcher/node_resources.h"
#include "launcher/rendezvous_settings.h"

namespace cpprun::launcher {

struct AgentOptionsInputs {
  LaunchConfig config;
  RendezvousSettings rdzv;
  NodeResources node;
  int nproc = 0;                            // workers on this node (resolveNproc)
  std::map<std::string, std::string> env;   // the agent's environment
  int scheduler_rank = -1;                  // this agent's rank by the scheduler, -1: none
  std::vector<std::string> expected_hosts;  // the scheduler's node names by rank, or none
  std::string agent_id;                     // unique per agent process (multi-node)
  std::string gdb_path;                     // for stall stacks (--stall-timeout); "" none
  std::optional<int> worker_store_port;     // --worker-hosts-store without --master-port
  std::string secret;                       // the job's secret (jobSecret), or ""
  // Whether cpprun's stdout and stderr are terminals (isatty): worker ptys and open lines.
  bool stdout_is_terminal = false;
  bool stderr_is_terminal = false;
  // Whether a host name is this machine's (isLocalHost resolves names and lists interfaces).
  std::function<bool(const std::string& host)> is_local_host = isLocalHost;
};

// The node's name in the rendezvous, events and /status: --local-addr, else the host name.
std::string agentName(const LaunchConfig& config, const NodeResources& node);

// How the workers' output is prefixed, redirected and teed (--log-line-prefix-template, else
// $TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE; --redirects, --tee, --local-ranks-filter).
// --raw-output or an empty template given (flag or variable): no prefix. `stdout_is_terminal` and
// `stderr_is_terminal` (cpprun's own) turn on worker ptys (--worker-tty auto) and open lines.
agent::OutputOptions outputOptions(const LaunchConfig& config,
                                   const std::map<std::string, std::string>& env,
                                   bool stdout_is_terminal = false,
                                   bool stderr_is_terminal = false);

// REQUIRES: inputs.rdzv is resolveRendezvous(inputs.config); worker_store_port is set when
// --worker-hosts-store is given without --master-port.
agent::LocalAgentOptions makeAgentOptions(const AgentOptionsInputs& inputs);

}  // namespace cpprun::launcher
