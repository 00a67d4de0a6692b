#include "launcher/cuda_driver.h"

#include <dlfcn.h>

namespace cpprun::launcher {

namespace {

// The driver API's types (cuda.h): CUresult and CUdevice are ints.
using InitFn = int (*)(unsigned int);
using IntOutFn = int (*)(int*);
using DeviceGetFn = int (*)(int*, int);
using DeviceTextFn = int (*)(char*, int, int);
using ErrorTextFn = int (*)(int, const char**);

constexpr int kCudaErrorNoDevice = 100;  // CUDA_ERROR_NO_DEVICE

// Closes the library on every path out of queryCudaDriver().
class Library {
 public:
  explicit Library(void* handle) : handle_(handle) {}
  ~Library() {
    if (handle_ != nullptr) ::dlclose(handle_);
  }
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;
  template <typename Fn>
  Fn symbol(const char* name) const {
    return reinterpret_cast<Fn>(::dlsym(handle_, name));
  }

 private:
  void* handle_;
};

}  // namespace

std::string cudaVersionText(int version) {
  return std::to_string(version / 1000) + "." + std::to_string((version % 1000) / 10);
}

Result<CudaDriverInfo> queryCudaDriver(const std::string& library) {
  void* handle = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    return Status(StatusCode::kNotFound,
                  library + " does not load: " + (why ? why : "unknown error"));
  }
  Library lib(handle);
  auto init = lib.symbol<InitFn>("cuInit");
  auto driver_version = lib.symbol<IntOutFn>("cuDriverGetVersion");
  auto device_count = lib.symbol<IntOutFn>("cuDeviceGetCount");
  auto device_get = lib.symbol<DeviceGetFn>("cuDeviceGet");
  auto device_name = lib.symbol<DeviceTextFn>("cuDeviceGetName");
  auto bus_id = lib.symbol<DeviceTextFn>("cuDeviceGetPCIBusId");  // optional
  auto error_name = lib.symbol<ErrorTextFn>("cuGetErrorName");    // optional
  auto error_string = lib.symbol<ErrorTextFn>("cuGetErrorString");
  if (!init || !driver_version || !device_count || !device_get || !device_name) {
    return Status(StatusCode::kNotFound, library +
                                             " lacks the driver API (cuInit, cuDriverGetVersion, "
                                             "cuDeviceGetCount, cuDeviceGet, cuDeviceGetName)");
  }
  // "cuInit failed with CUDA_ERROR_NO_DEVICE (100: no CUDA-capable device is detected)".
  auto failed = [&](const std::string& call, int rc) {
    const char* name = nullptr;
    const char* text = nullptr;
    if (error_name == nullptr || error_name(rc, &name) != 0) name = nullptr;
    if (error_string == nullptr || error_string(rc, &text) != 0) text = nullptr;
    std::string what = call + " failed with " + (name ? name : "CUDA error") + " (" +
                       std::to_string(rc) + (text ? std::string(": ") + text : "") + ")";
    return unavailable(library + ": " + what);
  };

  CudaDriverInfo info;
  if (int rc = driver_version(&info.version); rc != 0) return failed("cuDriverGetVersion", rc);
  if (int rc = init(0); rc == kCudaErrorNoDevice) {
    return info;  // a driver without devices (GPUs removed, or none passed to a container)
  } else if (rc != 0) {
    return failed("cuInit", rc);
  }
  int count = 0;
  if (int rc = device_count(&count); rc != 0) return failed("cuDeviceGetCount", rc);
  for (int ordinal = 0; ordinal < count; ++ordinal) {
    int device = 0;
    if (int rc = device_get(&device, ordinal); rc != 0) {
      return failed("cuDeviceGet(" + std::to_string(ordinal) + ")", rc);
    }
    CudaDevice d;
    char text[256] = {};
    if (int rc = device_name(text, sizeof(text) - 1, device); rc != 0) {
      return failed("cuDeviceGetName(" + std::to_string(ordinal) + ")", rc);
    }
    d.name = text;
    char bus[64] = {};
    if (bus_id != nullptr && bus_id(bus, sizeof(bus) - 1, device) == 0) d.pci_bus_id = bus;
    info.devices.push_back(std::move(d));
  }
  return info;
}

}  // namespace cpprun::launcher
