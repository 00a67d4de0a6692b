// CudaDriver: what the CUDA driver says about this node — its version and every device's name
// and PCI bus id — read through dlopen("libcuda.so.1"), so cpprun links nothing from CUDA and a
// machine without a driver runs unchanged. Node discovery (--nproc-per-node gpu) and --check
// both read the driver here.
//
// Errors are values: kNotFound when the library does not load or lacks the driver API (no
// driver installed: a CPU machine), kUnavailable when the driver is there but fails (cuInit or
// a device query returns an error; the message names the call and CUDA's error name). cuInit's
// CUDA_ERROR_NO_DEVICE (100) is not an error: the driver answers, with zero devices.
// Tests load a stand-in driver built by tests/CMakeLists.txt (tests/support/stand_in_cuda.c),
// placed first in LD_LIBRARY_PATH.
// Thread safety: queryCudaDriver() may be called from any thread; the driver serialises itself.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace cpprun::launcher {

struct CudaDevice {
  std::string name;        // cuDeviceGetName, e.g. "NVIDIA H100 80GB HBM3"
  std::string pci_bus_id;  // cuDeviceGetPCIBusId as the driver spells it, e.g. "0000:1B:00.0";
                           // empty when the driver does not say
};

struct CudaDriverInfo {
  int version = 0;                  // cuDriverGetVersion, e.g. 12040 for 12.4
  std::vector<CudaDevice> devices;  // in the driver's order (device ordinal = index)
};

inline constexpr const char* kCudaDriverLibrary = "libcuda.so.1";

// Loads `library` (a name dlopen searches for, or a path), calls cuInit(0) and reads the driver
// version and every device. The library is closed again before returning.
Result<CudaDriverInfo> queryCudaDriver(const std::string& library = kCudaDriverLibrary);

// "12.4" for 12040 (CUDA's major*1000 + minor*10).
std::string cudaVersionText(int version);

}  // namespace cpprun::launcher
