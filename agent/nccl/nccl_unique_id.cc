#include "agent/nccl/nccl_unique_id.h"

#include <dlfcn.h>

namespace cpprun::agent {

namespace {
constexpr size_t kUniqueIdBytes = 128;  // sizeof(ncclUniqueId), fixed by NCCL's ABI
}  // namespace

std::string ncclLibrary(const std::map<std::string, std::string>& env) {
  auto it = env.find("CPPRUN_NCCL_LIBRARY");
  return it == env.end() || it->second.empty() ? kNcclLibrary : it->second;
}

Result<std::unique_ptr<NcclUniqueIdProvider>> NcclUniqueIdProvider::create(
    const std::string& library) {
  void* handle = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    return unavailable("cannot load " + library + ": " + (why ? why : "unknown error"));
  }
  auto get_id = reinterpret_cast<GetUniqueIdFn>(::dlsym(handle, "ncclGetUniqueId"));
  if (get_id == nullptr) {
    ::dlclose(handle);
    return unavailable(library + " has no ncclGetUniqueId");
  }
  auto error_string = reinterpret_cast<GetErrorStringFn>(::dlsym(handle, "ncclGetErrorString"));
  using GetVersionFn = int (*)(int*);
  auto get_version = reinterpret_cast<GetVersionFn>(::dlsym(handle, "ncclGetVersion"));
  int version = 0;
  if (get_version == nullptr || get_version(&version) != 0) version = 0;
  return std::unique_ptr<NcclUniqueIdProvider>(
      new NcclUniqueIdProvider(handle, get_id, error_string, version));
}

NcclUniqueIdProvider::NcclUniqueIdProvider(void* handle, GetUniqueIdFn get_id,
                                           GetErrorStringFn error_string, int version)
    : handle_(handle), get_unique_id_(get_id), error_string_(error_string), version_(version) {}

// The library stays loaded: each ncclGetUniqueId starts a bootstrap-root thread inside NCCL
// that serves the workers' ncclCommInitRank, and unloading its code under it would crash.
NcclUniqueIdProvider::~NcclUniqueIdProvider() = default;

Result<std::string> NcclUniqueIdProvider::next() {
  unsigned char id[kUniqueIdBytes] = {};
  int rc;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    rc = get_unique_id_(id);
  }
  if (rc != 0) {
    std::string why = error_string_ != nullptr ? error_string_(rc) : "error";
    return unavailable("ncclGetUniqueId failed with " + std::to_string(rc) + " (" + why +
                       "); check NCCL_SOCKET_IFNAME");
  }
  static const char* digits = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * kUniqueIdBytes);
  for (unsigned char b : id) {
    hex += digits[b >> 4];
    hex += digits[b & 15];
  }
  return hex;
}

}  // namespace cpprun::agent
