// NodeResources: what this node offers the workers: its name, the GPUs they may use (and where
// that list came from), and the CPUs the agent may run on.
//
// GPUs come from, in order: the inherited CUDA_VISIBLE_DEVICES; the scheduler's allocation
// (SLURM_STEP_GPUS, then SLURM_JOB_GPUS); else the CUDA driver's device count, read through
// dlopen("libcuda.so.1") so a machine without a driver runs unchanged (0 GPUs).
// Thread safety: discoverNodeResources() reads process-wide state; call it from one thread.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace cpprun::launcher {

struct NodeResources {
  std::string hostname;
  std::vector<std::string> gpus;  // entries as CUDA_VISIBLE_DEVICES spells them ("0", "GPU-…")
  std::string gpu_source;         // e.g. "CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "driver"
  int usable_cpus = 1;            // CPUs in the agent's affinity mask
};

// `env` is the agent's environment; `driver_gpu_count` < 0 means "ask the driver".
NodeResources discoverNodeResources(const std::map<std::string, std::string>& env,
                                    int driver_gpu_count = -1);

// Splits a CUDA_VISIBLE_DEVICES-style list ("0,1", "GPU-ab,GPU-cd"); empty entries are dropped.
std::vector<std::string> splitDeviceList(const std::string& list);

// Devices the CUDA driver reports, or 0 when there is no driver or no device.
int driverGpuCount();

}  // namespace cpprun::launcher
