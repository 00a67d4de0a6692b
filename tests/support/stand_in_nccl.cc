// A stand-in for NCCL (libnccl.so.2) with the entry points cpprun reaches through dlopen
// (agent/nccl/nccl_unique_id.cc): ncclGetVersion, ncclGetUniqueId, ncclGetErrorString. Built by
// tests/CMakeLists.txt as stand-in-nccl/libnccl.so.2; a test puts that directory first in
// LD_LIBRARY_PATH (or names the file in CPPRUN_NCCL_LIBRARY) so the version cpprun reports and
// the ids it hands out are the stand-in's, which no real NCCL would produce.
//
// ncclResult_t is an int. Behaviour, from the environment of the process that loads it:
//   CPPRUN_STAND_IN_NCCL_VERSION         ncclGetVersion's code (default 21903: "2.19.3")
//   CPPRUN_STAND_IN_NCCL_UNIQUE_ID_ERROR ncclResult_t ncclGetUniqueId returns (default 0)
// Each id is 128 bytes: "cpprun-stand-in-nccl-id " then the call's number (from 0) in decimal,
// the process id, and zeros — fresh per call, recognisable in hex.
// ncclCommInitRankScalable (NCCL >= 2.23's many-root init) is exported too, so a program that
// resolves it with dlsym finds it: it checks its arguments as NCCL does (nId in 1..nranks, rank
// in 0..nranks-1, ids given) and, without a GPU, makes no communicator: it returns
// ncclInvalidUsage after writing "nranks rank nId" and each id's text (up to its first zero
// byte), one per line, to $CPPRUN_STAND_IN_NCCL_RECORD when that names a file.
// Thread safety: ncclGetUniqueId's counter is not locked; the agent serialises its calls.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#define STAND_IN_EXPORT extern "C" __attribute__((visibility("default")))

enum { ncclSuccess = 0, ncclSystemError = 2, ncclInvalidArgument = 4, ncclInvalidUsage = 5 };

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

STAND_IN_EXPORT int ncclCommInitRankScalable(void** comm, int nranks, int rank, int nid, void* ids,
                                             void* /*config*/) {
  if (comm == nullptr || ids == nullptr || nranks < 1 || rank < 0 || rank >= nranks || nid < 1 ||
      nid > nranks) {
    return ncclInvalidArgument;
  }
  *comm = nullptr;
  const char* record = getenv("CPPRUN_STAND_IN_NCCL_RECORD");
  if (record != nullptr && *record != '\0') {
    FILE* out = fopen(record, "w");
    if (out != nullptr) {
      fprintf(out, "%d %d %d\n", nranks, rank, nid);
      for (int i = 0; i < nid; ++i) {
        char text[129];
        memcpy(text, static_cast<const char*>(ids) + 128 * i, 128);
        text[128] = '\0';
        fprintf(out, "%s\n", text);
      }
      fclose(out);
    }
  }
  return ncclInvalidUsage;  // no GPU: no communicator
}

STAND_IN_EXPORT const char* ncclGetErrorString(int result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclSystemError:
      return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInvalidArgument:
      return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
      return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    default:
      return "unknown result code";
  }
}
