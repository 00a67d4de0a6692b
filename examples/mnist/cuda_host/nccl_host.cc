// The emulated NCCL: a communicator is a cpprun::mnist::Communicator (a single process for one
// rank, gloo through the agent's store for more), and ncclAllReduce is its allreduceSum queued on
// the stream and run at the call (a synchronisation point), divided by the ranks for ncclAvg.
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "examples/mnist/communicator.h"
#include "examples/mnist/cuda_host/cuda_host.h"

struct ncclComm {
  int rank = 0;
  int nranks = 1;
  std::unique_ptr<cpprun::mnist::Communicator> communicator;
  std::string last_error;  // of the last operation that failed on this communicator
};

namespace {

std::mutex init_error_mutex;
std::string init_error;  // the last ncclCommInitRank failure

void setInitError(const std::string& message) {
  std::lock_guard<std::mutex> lock(init_error_mutex);
  init_error = message;
}

// "emulated-nccl/<hex of the id>/": ranks holding the same id meet under it.
std::string prefixFor(const ncclUniqueId& id) {
  static const char kHex[] = "0123456789abcdef";
  std::string prefix = "emulated-nccl/";
  for (char c : id.internal) {
    const auto byte = static_cast<unsigned char>(c);
    prefix += kHex[byte >> 4];
    prefix += kHex[byte & 0xf];
  }
  return prefix + "/";
}

ncclResult_t initThrough(ncclComm_t* comm, int nranks, int rank, const std::string& prefix);
void recordInit(const char* call, int nranks, int rank, int nid, const ncclUniqueId* ids);

template <typename T>
void reduceInPlace(ncclComm* comm, const void* send, void* recv, size_t count, ncclRedOp_t op) {
  auto* data = static_cast<T*>(recv);
  if (send != recv) std::memcpy(recv, send, count * sizeof(T));
  comm->communicator->allreduceSum(data, count);
  if (op == ncclAvg) {
    for (size_t i = 0; i < count; ++i) data[i] /= static_cast<T>(comm->nranks);
  }
}

}  // namespace

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error";
    case ncclSystemError:
      return "unhandled system error";
    case ncclInternalError:
      return "internal error";
    case ncclInvalidArgument:
      return "invalid argument";
    case ncclInvalidUsage:
      return "invalid usage";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
  }
  return "unknown result code";
}

const char* ncclGetLastError(ncclComm_t comm) {
  if (comm != nullptr) return comm->last_error.c_str();
  std::lock_guard<std::mutex> lock(init_error_mutex);
  return init_error.c_str();
}

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return ncclInvalidArgument;
  const char* forced = std::getenv("CPPRUN_EMULATED_NCCL_VERSION");
  *version = forced != nullptr && *forced != '\0' ? std::atoi(forced) : NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (id == nullptr) return ncclInvalidArgument;
  std::random_device random;
  for (size_t i = 0; i < sizeof(id->internal); i += sizeof(unsigned int)) {
    const unsigned int r = random();
    std::memcpy(id->internal + i, &r, sizeof(r));
  }
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  recordInit("ncclCommInitRank", nranks, rank, 1, &id);
  return initThrough(comm, nranks, rank, prefixFor(id));
}

namespace {

ncclResult_t initThrough(ncclComm_t* comm, int nranks, int rank, const std::string& prefix) {
  if (comm == nullptr) return ncclInvalidArgument;
  *comm = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    setInitError("ncclCommInitRank: rank " + std::to_string(rank) + " of " +
                 std::to_string(nranks) + " ranks");
    return ncclInvalidArgument;
  }
  auto created = std::make_unique<ncclComm>();
  created->rank = rank;
  created->nranks = nranks;
  if (nranks == 1) {
    created->communicator = cpprun::mnist::makeSingleProcessCommunicator();
  } else {
    // NCCL reports a vanished peer as an error; gloo writes without MSG_NOSIGNAL, so a write to
    // a reset connection would kill the process with SIGPIPE instead. Ignore it, unless the
    // program chose a disposition of its own.
    struct sigaction current {};
    if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      std::signal(SIGPIPE, SIG_IGN);
    }
    try {
      auto gloo = cpprun::mnist::makeGlooCommunicatorThroughMasterStore(rank, nranks, prefix);
      if (!gloo.isOk()) {
        setInitError("ncclCommInitRank: " + gloo.status().message());
        return ncclInvalidArgument;
      }
      created->communicator = std::move(gloo.value());
    } catch (const std::exception& e) {
      setInitError(std::string("ncclCommInitRank: ") + e.what());
      return ncclSystemError;
    }
  }
  *comm = created.release();
  return ncclSuccess;
}

// The digest of nId ids (FNV-1a, 64 bits), as 4 chunks of 16 bits and their squares: summed over
// the ranks, sum(x) == n*x and sum(x*x) == n*x*x for every chunk only when every rank's x is the
// same (exact in doubles).
std::vector<double> digestTerms(const ncclUniqueId* ids, int nid) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < nid; ++i) {
    for (char c : ids[i].internal) {
      h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
    }
  }
  std::vector<double> terms;
  for (int chunk = 0; chunk < 4; ++chunk) {
    const double x = static_cast<double>((h >> (16 * chunk)) & 0xffff);
    terms.push_back(x);
    terms.push_back(x * x);
  }
  return terms;
}

// With CPPRUN_EMULATED_NCCL_RECORD=DIR, each init writes DIR/init-<rank>.txt: the call, nranks,
// rank, nId and the ids in hex, comma-joined (what a test compares with the agent's ids).
void recordInit(const char* call, int nranks, int rank, int nid, const ncclUniqueId* ids) {
  const char* dir = std::getenv("CPPRUN_EMULATED_NCCL_RECORD");
  if (dir == nullptr || *dir == '\0') return;
  std::ofstream out(std::string(dir) + "/init-" + std::to_string(rank) + ".txt");
  out << "call " << call << "\nnranks " << nranks << "\nrank " << rank << "\nnid " << nid
      << "\nids ";
  for (int i = 0; i < nid; ++i) {
    const std::string prefix = prefixFor(ids[i]);  // "emulated-nccl/<hex>/"
    out << (i > 0 ? "," : "") << prefix.substr(14, prefix.size() - 15);
  }
  out << "\n";
}

}  // namespace

ncclResult_t ncclCommInitRankScalable(ncclComm_t* comm, int nranks, int rank, int nId,
                                      ncclUniqueId* ids, void* /*config*/) {
  if (comm == nullptr) return ncclInvalidArgument;
  *comm = nullptr;
  if (ids == nullptr || nId < 1 || nId > nranks) {
    setInitError("ncclCommInitRankScalable: " + std::to_string(nId) + " ids for " +
                 std::to_string(nranks) + " ranks");
    return ncclInvalidArgument;
  }
  recordInit("ncclCommInitRankScalable", nranks, rank, nId, ids);
  const ncclResult_t made = initThrough(comm, nranks, rank, prefixFor(ids[0]));
  if (made != ncclSuccess || nranks == 1) return made;
  const std::vector<double> mine = digestTerms(ids, nId);
  std::vector<double> sums = mine;
  try {
    (*comm)->communicator->allreduceSum(sums.data(), sums.size());
  } catch (const std::exception& e) {
    setInitError(std::string("ncclCommInitRankScalable: ") + e.what());
    delete *comm;
    *comm = nullptr;
    return ncclSystemError;
  }
  for (size_t i = 0; i < mine.size(); ++i) {
    if (sums[i] != mine[i] * nranks) {
      setInitError("ncclCommInitRankScalable: the ranks gave different lists of " +
                   std::to_string(nId) + " ncclUniqueIds");
      delete *comm;
      *comm = nullptr;
      return ncclInvalidUsage;
    }
  }
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  // NCCL finalises first: operations already queued complete.
  ncclResult_t result =
      cudaDeviceSynchronize() == cudaSuccess ? ncclSuccess : ncclUnhandledCudaError;
  try {
    comm->communicator->finish();  // gloo's sockets close with a reset: the peers must be done
  } catch (const std::exception&) {
    result = ncclSystemError;
  }
  delete comm;
  return result;
}

ncclResult_t ncclCommCount(ncclComm_t comm, int* count) {
  if (comm == nullptr || count == nullptr) return ncclInvalidArgument;
  *count = comm->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(ncclComm_t comm, int* rank) {
  if (comm == nullptr || rank == nullptr) return ncclInvalidArgument;
  *rank = comm->rank;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  if (comm == nullptr) return ncclInvalidArgument;
  if ((type != ncclFloat && type != ncclDouble) || (op != ncclSum && op != ncclAvg)) {
    comm->last_error =
        "ncclAllReduce: the emulation reduces ncclFloat and ncclDouble with "
        "ncclSum or ncclAvg (type " +
        std::to_string(static_cast<int>(type)) + ", op " + std::to_string(static_cast<int>(op)) +
        ")";
    return ncclInvalidArgument;
  }
  if (count == 0) return ncclSuccess;
  const size_t bytes = count * (type == ncclFloat ? sizeof(float) : sizeof(double));
  if (!cuda_host::isDeviceRange(send, bytes) || !cuda_host::isDeviceRange(recv, bytes)) {
    comm->last_error =
        "ncclAllReduce: buffers are not device memory of " + std::to_string(bytes) + " bytes";
    return ncclInvalidArgument;
  }
  // A synchronisation point of the emulation (cuda_host::enqueueAndWait says why).
  const cudaError_t ran = cuda_host::enqueueAndWait(stream, [=] {
    try {
      if (type == ncclFloat) {
        reduceInPlace<float>(comm, send, recv, count, op);
      } else {
        reduceInPlace<double>(comm, send, recv, count, op);
      }
    } catch (const std::exception& e) {
      comm->last_error = std::string("ncclAllReduce: ") + e.what();
      return cudaErrorLaunchFailure;
    }
    return cudaSuccess;
  });
  if (ran == cudaErrorInvalidResourceHandle) {
    comm->last_error = std::string("ncclAllReduce: stream: ") + cudaGetErrorString(ran);
    return ncclInvalidArgument;
  }
  if (ran != cudaSuccess) {
    if (comm->last_error.empty()) {
      comm->last_error =
          std::string("ncclAllReduce: earlier work failed: ") + cudaGetErrorString(ran);
    }
    return ncclSystemError;
  }
  return ncclSuccess;
}
