// WorkerSpec: one worker of one attempt — its ranks, command line and the environment cpprun
// gives it. The launcher's launch plan makes them; the supervisor starts them.
// Thread safety: a value type.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "agent/processes/process_launcher.h"

namespace cpprun::agent {

struct WorkerSpec {
  int local_rank = 0;
  int rank = 0;
  std::vector<std::string> argv;
  // Variables set on top of the agent's environment (TORCHELASTIC_ERROR_FILE among them).
  std::map<std::string, std::string> env;
  // --numa-binding (launcher/numa_binding.h): the CPUs and memory policy applied in the child
  // before exec (empty: inherit the agent's), and a one-line description for the log, /status
  // and the event log (empty: not bound).
  std::vector<int> cpus;
  ProcessSpec::MemoryPolicy memory_policy = ProcessSpec::MemoryPolicy::kInherit;
  std::vector<int> memory_nodes;
  std::string binding;
};

}  // namespace cpprun::agent
