#include "launcher/node_resources.h"

#include <sched.h>
#include <unistd.h>

namespace cpprun::launcher {

std::vector<std::string> splitDeviceList(const std::string& list) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    if (comma == std::string::npos) comma = list.size();
    std::string item = list.substr(start, comma - start);
    size_t b = item.find_first_not_of(" \t");
    size_t e = item.find_last_not_of(" \t");
    if (b != std::string::npos) out.push_back(item.substr(b, e - b + 1));
    start = comma + 1;
  }
  return out;
}

NodeResources discoverNodeResources(const std::map<std::string, std::string>& env,
                                    const std::optional<Result<CudaDriverInfo>>& driver) {
  NodeResources r;
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) == 0) r.hostname = host;

  auto lookup = [&](const char* name) -> const std::string* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : &it->second;
  };
  if (const std::string* cvd = lookup("CUDA_VISIBLE_DEVICES")) {
    // Set, even to an empty list: the user or the scheduler decided.
    r.gpus = splitDeviceList(*cvd);
    r.gpu_source = "CUDA_VISIBLE_DEVICES";
  } else if (const std::string* step = lookup("SLURM_STEP_GPUS")) {
    r.gpus = splitDeviceList(*step);
    r.gpu_source = "SLURM_STEP_GPUS";
  } else if (const std::string* job = lookup("SLURM_JOB_GPUS")) {
    r.gpus = splitDeviceList(*job);
    r.gpu_source = "SLURM_JOB_GPUS";
  } else {
    const Result<CudaDriverInfo> answer = driver ? *driver : queryCudaDriver();
    if (answer.isOk()) {
      for (size_t i = 0; i < answer.value().devices.size(); ++i) {
        r.gpus.push_back(std::to_string(i));
      }
    } else if (answer.status().code() != StatusCode::kNotFound) {
      r.gpu_error = answer.status().message();  // installed but failing: say so, not "0 GPUs"
    }
    r.gpu_source = "driver";
  }

  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) {
    r.usable_cpus = std::max(1, CPU_COUNT(&set));
  } else {
    r.usable_cpus = std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
  }
  return r;
}

}  // namespace cpprun::launcher
