// Where the node's GPU list comes from, in order, and the CPU count.
#include "launcher/node_resources.h"

#include <unistd.h>

#include <catch2/catch.hpp>

using cpprun::Result;
using cpprun::Status;
using cpprun::StatusCode;
using cpprun::launcher::CudaDriverInfo;
using cpprun::launcher::discoverNodeResources;
using cpprun::launcher::splitDeviceList;

namespace {

// What a driver with `n` devices answers.
Result<CudaDriverInfo> driverWith(int n) {
  CudaDriverInfo info;
  info.version = 12040;
  for (int i = 0; i < n; ++i) info.devices.push_back({"GPU " + std::to_string(i), ""});
  return info;
}

}  // namespace

TEST_CASE("device lists split on commas and ignore blanks", "[unit]") {
  CHECK(splitDeviceList("0,1,3") == std::vector<std::string>{"0", "1", "3"});
  CHECK(splitDeviceList(" GPU-a , GPU-b ") == std::vector<std::string>{"GPU-a", "GPU-b"});
  CHECK(splitDeviceList("").empty());
  CHECK(splitDeviceList("0,,1") == std::vector<std::string>{"0", "1"});
}

TEST_CASE("GPUs come from CUDA_VISIBLE_DEVICES then Slurm then the driver", "[unit]") {
  auto r = discoverNodeResources(
      {{"CUDA_VISIBLE_DEVICES", "2,3"}, {"SLURM_STEP_GPUS", "0"}, {"SLURM_JOB_GPUS", "5"}},
      driverWith(8));
  CHECK(r.gpus == std::vector<std::string>{"2", "3"});
  CHECK(r.gpu_source == "CUDA_VISIBLE_DEVICES");
  r = discoverNodeResources({{"SLURM_STEP_GPUS", "0,1"}, {"SLURM_JOB_GPUS", "5"}}, driverWith(8));
  CHECK(r.gpus == std::vector<std::string>{"0", "1"});
  CHECK(r.gpu_source == "SLURM_STEP_GPUS");
  r = discoverNodeResources({{"SLURM_JOB_GPUS", "5"}}, driverWith(8));
  CHECK(r.gpus == std::vector<std::string>{"5"});
  r = discoverNodeResources({}, driverWith(3));
  CHECK(r.gpus == std::vector<std::string>{"0", "1", "2"});
  CHECK(r.gpu_source == "driver");
  // Set but empty means "no GPUs", as CUDA reads it.
  r = discoverNodeResources({{"CUDA_VISIBLE_DEVICES", ""}}, driverWith(8));
  CHECK(r.gpus.empty());
}

TEST_CASE("the CPU count is the affinity mask and the host name is set", "[unit]") {
  auto r = discoverNodeResources({}, driverWith(0));
  CHECK(r.usable_cpus >= 1);
  CHECK(r.usable_cpus <= sysconf(_SC_NPROCESSORS_ONLN));
  CHECK_FALSE(r.hostname.empty());
}
