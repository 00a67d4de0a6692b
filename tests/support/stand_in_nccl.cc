// A stand-in for NCCL (libnccl.so.2) with the entry points cpprun reaches through dlopen
// (agent/nccl_unique_id.cc): ncclGetVersion, ncclGetUniqueId, ncclGetErrorString. Built by
// tests/CMakeLists.txt as stand-in-nccl/libnccl.so.2; a test puts that directory first in
// LD_LIBRARY_PATH (or names the file in CPPRUN_NCCL_LIBRARY) so the version cpprun reports and
// the ids it hands out are the stand-in's, which no real NCCL would produce.
//
// ncclResult_t is an int. Behaviour, from the environment of the process that loads it:
//   CPPRUN_STAND_IN_NCCL_VERSION         ncclGetVersion's code (default 21903: "2.19.3")
//   CPPRUN_STAND_IN_NCCL_UNIQUE_ID_ERROR ncclResult_t ncclGetUniqueId returns (default 0)
// Each id is 128 bytes: "cpprun-stand-in-nccl-id " then the call's number (from 0) in decimal,
// the process id, and zeros — fresh per call, recognisable in hex.
// Thread safety: ncclGetUniqueId's counter is not locked; the agent serialises its calls.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#define STAND_IN_EXPORT extern "C" __attribute__((visibility("default")))

enum { ncclSuccess = 0, ncclSystemError = 2, ncclInvalidArgument = 4 };

static unsigned long calls = 0;

static int envInt(const char* name, int fallback) {
  const char* text = getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  return atoi(text);
}

STAND_IN_EXPORT int ncclGetVersion(int* version) {
  if (version == nullptr) return ncclInvalidArgument;
  *version = envInt("CPPRUN_STAND_IN_NCCL_VERSION", 21903);
  return ncclSuccess;
}

STAND_IN_EXPORT int ncclGetUniqueId(void* id) {
  if (id == nullptr) return ncclInvalidArgument;
  int rc = envInt("CPPRUN_STAND_IN_NCCL_UNIQUE_ID_ERROR", ncclSuccess);
  if (rc != ncclSuccess) return rc;
  char bytes[128];
  memset(bytes, 0, sizeof bytes);
  snprintf(bytes, sizeof bytes, "cpprun-stand-in-nccl-id %lu %ld", calls++,
           static_cast<long>(getpid()));
  memcpy(id, bytes, sizeof bytes);
  return ncclSuccess;
}

STAND_IN_EXPORT const char* ncclGetErrorString(int result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclSystemError:
      return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInvalidArgument:
      return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    default:
      return "unknown result code";
  }
}
