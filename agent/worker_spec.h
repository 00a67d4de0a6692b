// WorkerSpec: one worker of one attempt — its ranks, command line and the environment cpprun
// gives it. The launcher's launch plan makes them; the supervisor starts them.
// Thread safety: a value type.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace cpprun::agent {

struct WorkerSpec {
  int local_rank = 0;
  int rank = 0;
  std::vector<std::string> argv;
  // Variables set on top of the agent's environment (TORCHELASTIC_ERROR_FILE among them).
  std::map<std::string, std::string> env;
};

}  // namespace cpprun::agent
