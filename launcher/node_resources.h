// NodeResources: what this node offers the workers: its name, the GPUs they may use (and where
// that list came from), and the CPUs the agent may run on.
//
// GPUs come from, in order: the inherited CUDA_VISIBLE_DEVICES; the scheduler's allocation
// (SLURM_STEP_GPUS, then SLURM_JOB_GPUS); else the CUDA driver's devices (launcher/cuda_driver.h:
// a machine without a driver has 0 GPUs; a driver that fails too, and gpu_error says why).
// Thread safety: discoverNodeResources() reads process-wide state; call it from one thread.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "launcher/cuda_driver.h"

namespace cpprun::launcher {

struct NodeResources {
  std::string hostname;
  std::vector<std::string> gpus;  // entries as CUDA_VISIBLE_DEVICES spells them ("0", "GPU-…")
  std::string gpu_source;         // e.g. "CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "driver"
  // From "driver" only: why the list is empty although a driver is installed (cuInit failed,
  // ...); empty when the driver answered or there is none.
  std::string gpu_error;
  int usable_cpus = 1;  // CPUs in the agent's affinity mask
};

// `env` is the agent's environment. `driver`: what the driver says, used only when no list is
// set; nullopt asks it (queryCudaDriver()) then.
NodeResources discoverNodeResources(
    const std::map<std::string, std::string>& env,
    const std::optional<Result<CudaDriverInfo>>& driver = std::nullopt);

// Splits a CUDA_VISIBLE_DEVICES-style list ("0,1", "GPU-ab,GPU-cd"); empty entries are dropped.
std::vector<std::string> splitDeviceList(const std::string& list);

}  // namespace cpprun::launcher
