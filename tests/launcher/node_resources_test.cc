// Where the node's GPU list comes from, in order, and the CPU count.
#include "launcher/node_resources.h"

#include <sys/resource.h>
#include <unistd.h>

#include <catch2/catch.hpp>

using cpprun::Result;
using cpprun::Status;
using cpprun::StatusCode;
using cpprun::launcher::CudaDriverInfo;
using cpprun::launcher::discoverNodeResources;
using cpprun::launcher::parseCudaVisibleDevices;
using cpprun::launcher::splitDeviceList;
using cpprun::launcher::VisibleDevices;

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

TEST_CASE("CUDA_VISIBLE_DEVICES is read as CUDA reads it", "[unit]") {
  using List = std::vector<std::string>;
  const auto devices = [](const std::string& value) {
    return parseCudaVisibleDevices(value).devices;
  };
  CHECK(devices("0,1,3") == List{"0", "1", "3"});
  CHECK(devices(" 2 , 1 ") == List{"2", "1"});  // order kept: 2 is CUDA's device 0
  CHECK(devices("01,+2") == List{"1", "2"});    // as strtoul reads them
  CHECK(devices("1gpu2,2ampere") == List{"1", "2"});
  // The list ends at the first entry that is not an ordinal >= 0.
  CHECK(devices("-1").empty());
  CHECK(devices("0,-1,1") == List{"0"});
  CHECK(devices("0,2,-1,1") == List{"0", "2"});
  CHECK(devices("0,,1") == List{"0"});
  CHECK(devices("0,1,") == List{"0", "1"});
  CHECK(devices("0,GPU-ab") == List{"0"});
  CHECK(devices("none").empty());
  CHECK(devices("").empty());
  CHECK(devices("99999999999").empty());  // no device has that ordinal
  // UUIDs: the first entry's prefix (GPU- or MIG-) holds for the list.
  CHECK(devices("GPU-ab12,GPU-cd34") == List{"GPU-ab12", "GPU-cd34"});
  CHECK(devices("MIG-ab12/1/0,MIG-cd34") == List{"MIG-ab12/1/0", "MIG-cd34"});
  CHECK(devices("GPU-ab12,0,GPU-cd34") == List{"GPU-ab12"});
  CHECK(devices("GPU-ab12,MIG-cd34") == List{"GPU-ab12"});
  // A device named twice: CUDA sees none.
  CHECK(devices("0,0,0").empty());
  CHECK(devices("1,01").empty());
  CHECK(devices("GPU-a,GPU-a").empty());

  // What was dropped, and why, in one line.
  CHECK(parseCudaVisibleDevices("0,1").note.empty());
  CHECK(parseCudaVisibleDevices("0,1,").note.empty());
  CHECK(parseCudaVisibleDevices("").note.empty());
  CHECK(parseCudaVisibleDevices("0,-1,1").note ==
        "CUDA_VISIBLE_DEVICES=0,-1,1: CUDA reads no device from '-1' on (not a device ordinal "
        ">= 0), so it sees GPU 0 only");
  CHECK(parseCudaVisibleDevices("GPU-a,GPU-b,7").note ==
        "CUDA_VISIBLE_DEVICES=GPU-a,GPU-b,7: CUDA reads no device from '7' on (not a GPU- UUID), "
        "so it sees GPUs GPU-a,GPU-b only");
  CHECK(parseCudaVisibleDevices("0,0,0").note ==
        "CUDA_VISIBLE_DEVICES=0,0,0 names GPU 0 twice: CUDA then sees no GPU");
  // A 128 KiB value stays a short line.
  std::string huge;
  while (huge.size() < 128 * 1024) huge += "0,";
  const VisibleDevices v = parseCudaVisibleDevices(huge);
  CHECK(v.devices.empty());
  CHECK(v.note.size() < 200);
}

TEST_CASE("CUDA_VISIBLE_DEVICES=-1 leaves the node no GPU and says why", "[unit]") {
  auto r = discoverNodeResources({{"CUDA_VISIBLE_DEVICES", "-1"}}, driverWith(8));
  CHECK(r.gpus.empty());
  CHECK(r.gpu_source == "CUDA_VISIBLE_DEVICES");
  CHECK_THAT(r.gpu_note, Catch::Contains("it sees no GPU"));
  r = discoverNodeResources({{"CUDA_VISIBLE_DEVICES", "0,0,0"}}, driverWith(8));
  CHECK(r.gpus.empty());
}

TEST_CASE("the node's descriptor and process limits are read", "[unit]") {
  auto r = discoverNodeResources({}, driverWith(0));
  rlimit files{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &files) == 0);
  CHECK(r.limits.open_files == (files.rlim_max == RLIM_INFINITY
                                    ? cpprun::launcher::ProcessLimits::kUnlimited
                                    : static_cast<uint64_t>(files.rlim_max)));
}
