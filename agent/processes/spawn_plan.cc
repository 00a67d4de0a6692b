// prepareSpawn and the child's errors: everything about starting a worker that needs no child.
#include "agent/processes/spawn_plan.h"

#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "common/cpu_list.h"

namespace cpprun::agent {
namespace {

// The agent's environment with `overrides` applied, as "NAME=value" strings.
std::vector<std::string> mergedEnvironment(char* const* agent_environ,
                                           const std::map<std::string, std::string>& overrides) {
  std::vector<std::string> merged;
  merged.reserve(overrides.size() + 64);
  for (char* const* e = agent_environ; e != nullptr && *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq == nullptr) continue;
    if (!overrides.empty() && overrides.count(std::string(*e, static_cast<size_t>(eq - *e))) != 0) {
      continue;
    }
    merged.emplace_back(*e);
  }
  for (const auto& [name, value] : overrides) merged.push_back(name + "=" + value);
  return merged;
}

// PATH of the environment the child gets (what execvp in the child would search); unset:
// execvp's default.
std::string searchPathOf(const std::vector<std::string>& env) {
  for (const std::string& entry : env) {
    if (entry.compare(0, 5, "PATH=") == 0) return entry.substr(5);
  }
  return "/usr/local/bin:/usr/bin:/bin";
}

bool isExecutableFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

// The first regular executable file named `program` in the directories of `path` (an empty
// entry is the current directory); "" when there is none.
std::string lookUpInPath(const std::string& program, const std::string& path) {
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find(':', start);
    if (end == std::string::npos) end = path.size();
    const std::string dir = end > start ? path.substr(start, end - start) : ".";
    std::string candidate = dir + "/" + program;
    if (isExecutableFile(candidate)) return candidate;
    start = end + 1;
  }
  return "";
}

// The highest of `values`, or an error naming the first one outside 0..`max`.
Result<int> highestInRange(const std::string& program, const std::vector<int>& values, int max,
                           const std::string& one, const std::string& list) {
  int highest = 0;
  for (int v : values) {
    if (v < 0 || v > max) {
      return invalidArgument("cannot run '" + program + "': " + one + " " + std::to_string(v) +
                             " in its " + list + " " + formatIndexList(values) +
                             " is out of range (0 to " + std::to_string(max) + ")");
    }
    highest = std::max(highest, v);
  }
  return highest;
}

constexpr int kBits = static_cast<int>(8 * sizeof(unsigned long));

// The binding, as the kernel takes it.
Status planBinding(const ProcessSpec& spec, SpawnPlan& plan) {
  if (!spec.cpus.empty()) {
    Result<int> highest = highestInRange(plan.program, spec.cpus, kMaxCpu, "CPU", "CPU list");
    if (!highest.isOk()) return highest.status();
    plan.cpu_mask.assign(static_cast<size_t>(highest.value() / kBits + 1), 0UL);
    for (int cpu : spec.cpus) {
      plan.cpu_mask[static_cast<size_t>(cpu / kBits)] |= 1UL << (cpu % kBits);
    }
  }
  if (spec.memory_policy != ProcessSpec::MemoryPolicy::kInherit && !spec.memory_nodes.empty()) {
    Result<int> highest =
        highestInRange(plan.program, spec.memory_nodes, kMaxNode, "NUMA node", "memory nodes");
    if (!highest.isOk()) return highest.status();
    plan.mempolicy_mode =
        spec.memory_policy == ProcessSpec::MemoryPolicy::kBind ? kMpolBind : kMpolPreferred;
    plan.nodemask.assign(static_cast<size_t>(highest.value() / kBits + 1), 0UL);
    for (int node : spec.memory_nodes) {
      plan.nodemask[static_cast<size_t>(node / kBits)] |= 1UL << (node % kBits);
    }
    // The kernel reads maxnode - 1 bits.
    plan.maxnode = static_cast<unsigned long>(plan.nodemask.size() * kBits + 1);
  }
  return Status::ok();
}

// How the child makes `from` its descriptor `to` (childMoveFd), for errors.
std::string moveFdCall(int from, int to) {
  if (from == to) return "fcntl(" + std::to_string(to) + ", F_SETFD)";
  return "dup3(" + std::to_string(from) + ", " + std::to_string(to) + ")";
}

}  // namespace

std::string errnoText(int error) {
  // strerrorname_np is glibc 2.32's; the wheel's binaries link against 2.28 (RHEL 8), so it is
  // looked up where it exists and the number is said where it does not.
  using NameFn = const char* (*)(int);
  static const auto name_of = reinterpret_cast<NameFn>(::dlsym(RTLD_DEFAULT, "strerrorname_np"));
  const char* abbrev = name_of != nullptr ? name_of(error) : nullptr;
  return std::string(std::strerror(error)) + " (" +
         (abbrev != nullptr ? std::string(abbrev) : "errno " + std::to_string(error)) + ")";
}

Result<SpawnPlan> prepareSpawn(const ProcessSpec& spec, char* const* agent_environ,
                               int dev_null_fd) {
  if (spec.argv.empty() || spec.argv[0].empty()) return invalidArgument("no program to run");
  SpawnPlan plan;
  plan.program = spec.argv[0];
  plan.env = mergedEnvironment(agent_environ, spec.env);
  plan.path = plan.program;
  if (plan.program.find('/') == std::string::npos) {
    plan.path = lookUpInPath(plan.program, searchPathOf(plan.env));
    if (plan.path.empty()) {
      return invalidArgument("cannot run '" + plan.program + "': not found in PATH");
    }
  }
  if (Status s = planBinding(spec, plan); !s.isOk()) return s;
  plan.args = spec.argv;
  plan.argv.reserve(plan.args.size() + 1);
  for (auto& a : plan.args) plan.argv.push_back(a.data());
  plan.argv.push_back(nullptr);
  plan.envp.reserve(plan.env.size() + 1);
  for (auto& e : plan.env) plan.envp.push_back(e.data());
  plan.envp.push_back(nullptr);
  plan.stdin_fd = spec.stdin_fd >= 0 ? spec.stdin_fd : dev_null_fd;
  plan.stdout_fd = spec.stdout_fd;
  plan.stderr_fd = spec.stderr_fd;
  plan.controlling_tty_fd = spec.controlling_tty_fd;
  return plan;
}

Status spawnStepError(const SpawnPlan& plan, const ProcessSpec& spec,
                      const std::string& cgroup_procs, SpawnStep step, int error) {
  const std::string head = "cannot run '" + plan.program + "': ";
  const std::string why = errnoText(error);
  auto internal = [&](const std::string& what, const std::string& call) {
    return internalError(head + what + ": " + call + ": " + why);
  };
  switch (step) {
    case SpawnStep::kExec:
      return invalidArgument(head + "execve(" + plan.path + "): " + why);
    case SpawnStep::kCpuAffinity:
      return Status(StatusCode::kUnavailable, head + "cannot bind it to CPUs " +
                                                  formatIndexList(spec.cpus) +
                                                  ": sched_setaffinity: " + why);
    case SpawnStep::kMemoryPolicy:
      return Status(StatusCode::kUnavailable,
                    head + "cannot set its memory policy to " +
                        (plan.mempolicy_mode == kMpolBind ? "bind" : "preferred") +
                        " on NUMA nodes " + formatIndexList(spec.memory_nodes) +
                        ": set_mempolicy: " + why);
    case SpawnStep::kSignals:
      return internal("cannot reset its signal handlers", "rt_sigaction");
    case SpawnStep::kSession:
      return internal("cannot give it a session of its own", "setsid");
    case SpawnStep::kControllingTerminal:
      return internal("cannot give it its terminal",
                      "ioctl(" + std::to_string(plan.controlling_tty_fd) + ", TIOCSCTTY)");
    case SpawnStep::kProcessGroup:
      return internal("cannot give it a process group of its own", "setpgid");
    case SpawnStep::kCgroupOpen:
      return internal("cannot move it into the job's cgroup", "openat(" + cgroup_procs + ")");
    case SpawnStep::kCgroupWrite:
      return internal("cannot move it into the job's cgroup", "write(" + cgroup_procs + ")");
    case SpawnStep::kParentDeathSignal:
      return internal("cannot set its parent-death signal", "prctl(PR_SET_PDEATHSIG)");
    case SpawnStep::kAgentGone:
      return internalError(head + "the agent was gone before the worker started (getppid)");
    case SpawnStep::kStdin:
      return internal("cannot set up its stdin", moveFdCall(plan.stdin_fd, 0));
    case SpawnStep::kStdout:
      return internal("cannot set up its stdout", moveFdCall(plan.stdout_fd, 1));
    case SpawnStep::kStderr:
      return internal("cannot set up its stderr", moveFdCall(plan.stderr_fd, 2));
    case SpawnStep::kNone:
      break;
  }
  return internalError(head + why);
}

}  // namespace cpprun::agent
