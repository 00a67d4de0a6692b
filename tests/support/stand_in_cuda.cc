// A stand-in for the CUDA driver (libcuda.so.1) with the entry points cpprun reaches through
// dlopen (launcher/cuda_driver.cc), so GPU discovery, --nproc-per-node gpu and --check's driver
// section run in tests on a machine without a GPU. tests/CMakeLists.txt builds it as
// stand-in-driver/libcuda.so.1; a test puts that directory first in LD_LIBRARY_PATH.
//
// The driver API's own types: CUresult and CUdevice are int. Like the real driver, every device
// call before a successful cuInit answers CUDA_ERROR_NOT_INITIALIZED, and cuInit on a machine
// without devices answers CUDA_ERROR_NO_DEVICE.
//
// Behaviour, from the environment of the process that loads it:
//   CPPRUN_STAND_IN_CUDA_DEVICES         devices reported (default 0, at most 64)
//   CPPRUN_STAND_IN_CUDA_INIT_ERROR      CUresult cuInit returns (default 0, or 100 with no
//                                        devices)
//   CPPRUN_STAND_IN_CUDA_DRIVER_VERSION  cuDriverGetVersion's value (default 12090: "12.9")
// Device i is named "Stand-in GPU <i>" with PCI bus id "0000:<0xA0 + i as %02X>:00.0".
// Thread safety: the state is one int written by cuInit; tests call it from one thread.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#define STAND_IN_EXPORT extern "C" __attribute__((visibility("default")))

enum {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_NOT_INITIALIZED = 3,
  CUDA_ERROR_NO_DEVICE = 100,
  CUDA_ERROR_INVALID_DEVICE = 101,
};

static int initialised = 0;

static int envInt(const char* name, int fallback) {
  const char* text = getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  return atoi(text);
}

static int deviceCount(void) {
  int n = envInt("CPPRUN_STAND_IN_CUDA_DEVICES", 0);
  return n < 0 ? 0 : (n > 64 ? 64 : n);
}

STAND_IN_EXPORT int cuInit(unsigned int flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  int rc = envInt("CPPRUN_STAND_IN_CUDA_INIT_ERROR", deviceCount() == 0 ? CUDA_ERROR_NO_DEVICE : 0);
  if (rc == CUDA_SUCCESS) initialised = 1;
  return rc;
}

STAND_IN_EXPORT int cuDriverGetVersion(int* version) {
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *version = envInt("CPPRUN_STAND_IN_CUDA_DRIVER_VERSION", 12090);
  return CUDA_SUCCESS;
}

STAND_IN_EXPORT int cuDeviceGetCount(int* count) {
  if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *count = deviceCount();
  return CUDA_SUCCESS;
}

STAND_IN_EXPORT int cuDeviceGet(int* device, int ordinal) {
  if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (ordinal < 0 || ordinal >= deviceCount()) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

STAND_IN_EXPORT int cuDeviceGetName(char* name, int len, int device) {
  if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
  if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (device < 0 || device >= deviceCount()) return CUDA_ERROR_INVALID_DEVICE;
  snprintf(name, static_cast<size_t>(len), "Stand-in GPU %d", device);
  return CUDA_SUCCESS;
}

STAND_IN_EXPORT int cuDeviceGetPCIBusId(char* bus_id, int len, int device) {
  if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
  if (bus_id == nullptr || len < 13) return CUDA_ERROR_INVALID_VALUE;
  if (device < 0 || device >= deviceCount()) return CUDA_ERROR_INVALID_DEVICE;
  snprintf(bus_id, static_cast<size_t>(len), "0000:%02X:00.0", 0xA0 + device);
  return CUDA_SUCCESS;
}

// Names and texts as the real driver spells them, for the codes the stand-in can return; like
// the real one, an unknown code is CUDA_ERROR_INVALID_VALUE and leaves *text nullptr.
static const struct {
  int code;
  const char* name;
  const char* text;
} kErrors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
     "system has unsupported display driver / cuda driver combination"},
    {999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static int lookup(int code, const char** out, int want_name) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < sizeof(kErrors) / sizeof(kErrors[0]); ++i) {
    if (kErrors[i].code == code) {
      *out = want_name ? kErrors[i].name : kErrors[i].text;
      return CUDA_SUCCESS;
    }
  }
  *out = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}

STAND_IN_EXPORT int cuGetErrorName(int error, const char** name) { return lookup(error, name, 1); }

STAND_IN_EXPORT int cuGetErrorString(int error, const char** text) {
  return lookup(error, text, 0);
}
