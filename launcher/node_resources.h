// NodeResources: what this node offers the workers: its name, the GPUs they may use (and where
// that list came from), and the CPUs the agent may run on.
//
// GPUs come from, in order: the inherited CUDA_VISIBLE_DEVICES, read as CUDA reads it
// (parseCudaVisibleDevices); the scheduler's allocation (SLURM_STEP_GPUS, then SLURM_JOB_GPUS);
// else the CUDA driver's devices (launcher/cuda_driver.h: a machine without a driver has 0 GPUs;
// a driver that fails too, and gpu_error says why). The limits on descriptors and processes
// bound the workers the node can run (launch_limits.h).
// Thread safety: discoverNodeResources() reads process-wide state; call it from one thread.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "launcher/cuda_driver.h"
#include "launcher/launch_limits.h"

namespace cpprun::launcher {

struct NodeResources {
  std::string hostname;
  std::vector<std::string> gpus;  // entries as CUDA_VISIBLE_DEVICES spells them ("0", "GPU-…")
  std::string gpu_source;         // e.g. "CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "driver"
  // From "driver" only: why the list is empty although a driver is installed (cuInit failed,
  // ...); empty when the driver answered or there is none.
  std::string gpu_error;
  // Why CUDA sees fewer GPUs than the list names (CUDA_VISIBLE_DEVICES="0,-1,1": only GPU 0);
  // empty when it sees them all.
  std::string gpu_note;
  int usable_cpus = 1;   // CPUs in the agent's affinity mask
  ProcessLimits limits;  // what the agent may hold and start; default: unbounded
};

// CUDA_VISIBLE_DEVICES as CUDA (and torch.cuda's _parse_visible_devices) reads it: entries split
// on ',' and stripped of blanks; ordinals read as strtoul would ("1gpu2" is 1), or, when the
// first entry starts with GPU- or MIG-, UUIDs with that prefix. The list ends at the first entry
// that is not one (a negative or empty ordinal, "-1" being the usual way to hide every GPU, or
// an entry without the UUID prefix): CUDA sees only the devices before it. A device named twice
// makes CUDA see none. `devices` holds ordinals in decimal ("01" is "1") and UUIDs as given;
// `note` says what was dropped and why (empty when nothing was).
struct VisibleDevices {
  std::vector<std::string> devices;
  std::string note;
};
VisibleDevices parseCudaVisibleDevices(const std::string& value);

// `env` is the agent's environment. `driver`: what the driver says, used only when no list is
// set; nullopt asks it (queryCudaDriver()) then.
NodeResources discoverNodeResources(
    const std::map<std::string, std::string>& env,
    const std::optional<Result<CudaDriverInfo>>& driver = std::nullopt);

// Splits a CUDA_VISIBLE_DEVICES-style list ("0,1", "GPU-ab,GPU-cd"); empty entries are dropped.
std::vector<std::string> splitDeviceList(const std::string& list);

}  // namespace cpprun::launcher
