// NcclUniqueIdProvider: makes a fresh ncclUniqueId for every attempt, so workers can build their
// NCCL communicator without an extra exchange (CPPRUN_NCCL_UNIQUE_ID, docs/environment.md).
//
// NCCL is reached only through dlopen("libnccl.so.2", or CPPRUN_NCCL_LIBRARY): the agent links
// nothing from CUDA, and on a machine without NCCL the provider reports that once and the
// variable is left out.
// ncclGetUniqueId needs no GPU, only a network interface NCCL can use (NCCL_SOCKET_IFNAME). The
// id names a bootstrap root that NCCL runs inside this process, so the agent must outlive the
// workers' communicator set-up (it does: it supervises them), and the library is never unloaded.
// Thread safety: create() and next() may be called from any thread; next() is serialised.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "common/status.h"

namespace cpprun::agent {

inline constexpr const char* kNcclLibrary = "libnccl.so.2";

// The library the agent and --check load: $CPPRUN_NCCL_LIBRARY (a path, or a name dlopen
// searches for, e.g. the libnccl.so.2 inside torch's nvidia-nccl wheel) when set and not empty,
// else libnccl.so.2.
std::string ncclLibrary(const std::map<std::string, std::string>& env);

class NcclUniqueIdProvider {
 public:
  // Loads `library` (default libnccl.so.2). kUnavailable, naming the library and dlerror(),
  // when it cannot be loaded or lacks ncclGetUniqueId.
  static Result<std::unique_ptr<NcclUniqueIdProvider>> create(
      const std::string& library = "libnccl.so.2");
  ~NcclUniqueIdProvider();
  NcclUniqueIdProvider(const NcclUniqueIdProvider&) = delete;
  NcclUniqueIdProvider& operator=(const NcclUniqueIdProvider&) = delete;

  // A new id as 256 lowercase hex digits (the 128 bytes of ncclUniqueId), or NCCL's error.
  Result<std::string> next();
  // NCCL's version code (e.g. 22809 for 2.28.9), 0 when it does not say.
  int version() const { return version_; }

 private:
  using GetUniqueIdFn = int (*)(void*);
  using GetErrorStringFn = const char* (*)(int);
  NcclUniqueIdProvider(void* handle, GetUniqueIdFn get_id, GetErrorStringFn error_string,
                       int version);

  void* handle_;  // never closed, see the destructor
  GetUniqueIdFn get_unique_id_;
  GetErrorStringFn error_string_;
  int version_;
  std::mutex mutex_;
};

}  // namespace cpprun::agent
