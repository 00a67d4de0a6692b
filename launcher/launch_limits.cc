#include "launcher/launch_limits.h"

#include <sys/resource.h>
#include <unistd.h>

#include <bitset>

namespace cpprun::launcher {

namespace {

uint64_t fromRlimit(rlim_t value) {
  return value == RLIM_INFINITY ? ProcessLimits::kUnlimited : static_cast<uint64_t>(value);
}

// The -r/-t modes any local rank may get, or-ed together (1 stdout, 2 stderr).
int outputModes(const LaunchConfig& config) {
  int modes = config.redirects_default | config.tee_default;
  for (const auto& [rank, mode] : config.redirects_by_rank) modes |= mode;
  for (const auto& [rank, mode] : config.tee_by_rank) modes |= mode;
  return modes & 3;
}

}  // namespace

std::string formatCount(uint64_t n) {
  std::string digits = std::to_string(n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

ProcessLimits currentProcessLimits() {
  ProcessLimits limits;
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) == 0) limits.open_files = fromRlimit(lim.rlim_max);
  if (::geteuid() != 0 && ::getrlimit(RLIMIT_NPROC, &lim) == 0) {
    limits.processes = fromRlimit(lim.rlim_cur);
  }
  return limits;
}

uint64_t agentDescriptorsPerWorker(const LaunchConfig& config) {
  const uint64_t pipes = 2;
  const uint64_t log_files = std::bitset<2>(static_cast<unsigned>(outputModes(config))).count();
  // torch opens up to two store clients per worker (as launcher/preflight.cc counts them); with
  // --worker-hosts-store they connect to worker rank 0 instead.
  const uint64_t store_connections = config.worker_hosts_store ? 0 : 2;
  return pipes + log_files + store_connections;
}

std::string sourceOf(const LaunchConfig& config, const std::string& option) {
  auto it = config.sources.find(option);
  return it == config.sources.end() ? option + " (default)" : it->second;
}

Status checkWorkerCount(const LaunchConfig& config, int nproc, const std::string& what,
                        const ProcessLimits& limits) {
  if (nproc > kMaxWorkersPerNode) {
    return invalidArgument(what + ": " + formatCount(static_cast<uint64_t>(nproc)) +
                           " workers on one node, more than cpprun's limit of " +
                           formatCount(kMaxWorkersPerNode) +
                           "; ask for fewer (one per GPU or per CPU is the usual count)");
  }
  const uint64_t world = static_cast<uint64_t>(nproc) * static_cast<uint64_t>(config.max_nodes);
  if (world > static_cast<uint64_t>(kMaxWorldSize)) {
    return invalidArgument(formatCount(static_cast<uint64_t>(nproc)) + " workers (" + what +
                           ") on each of " + formatCount(static_cast<uint64_t>(config.max_nodes)) +
                           " nodes (" + sourceOf(config, "--nnodes") + ") make a world of " +
                           formatCount(world) + " workers, more than cpprun's limit of " +
                           formatCount(kMaxWorldSize) + "; use fewer nodes or workers per node");
  }
  const uint64_t per_worker = agentDescriptorsPerWorker(config);
  const uint64_t descriptors = kAgentOwnDescriptors + per_worker * static_cast<uint64_t>(nproc);
  if (limits.open_files != ProcessLimits::kUnlimited && descriptors > limits.open_files) {
    const uint64_t fit = limits.open_files > kAgentOwnDescriptors
                             ? (limits.open_files - kAgentOwnDescriptors) / per_worker
                             : 0;
    return invalidArgument(
        what + ": " + formatCount(static_cast<uint64_t>(nproc)) + " workers need " +
        formatCount(descriptors) + " open files in the agent (" + std::to_string(per_worker) +
        " per worker + " + std::to_string(kAgentOwnDescriptors) +
        " of its own), more than this node's hard limit of " + formatCount(limits.open_files) +
        " (RLIMIT_NOFILE, ulimit -Hn); at most " + formatCount(fit) +
        " fit: ask for fewer workers or raise the limit");
  }
  // The agent and its workers (cpprun itself already counts).
  const uint64_t processes = static_cast<uint64_t>(nproc) + 1;
  if (limits.processes != ProcessLimits::kUnlimited && processes > limits.processes) {
    return invalidArgument(what + ": " + formatCount(static_cast<uint64_t>(nproc)) +
                           " workers and the agent are more processes than this user may run (" +
                           formatCount(limits.processes) +
                           ", RLIMIT_NPROC, ulimit -u); ask for fewer workers or raise the limit");
  }
  return Status::ok();
}

}  // namespace cpprun::launcher
