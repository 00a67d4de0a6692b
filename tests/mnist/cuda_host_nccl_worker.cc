// One rank of the emulated-NCCL test (cuda_host_nccl_test.cc), run under cpprun: all-reduces
// rank-dependent data with ncclAvg and ncclSum through the emulated NCCL (gloo through the
// agent's store) and prints what it got.
//
// Usage: cuda_host_nccl_worker <hex of a 128-byte ncclUniqueId> [peer-vanishes]
// (RANK, WORLD_SIZE from cpprun). Prints "rank R avg v0 v1 ... sum v0 v1 ..." and exits 0, or
// says what failed and exits 1. With peer-vanishes, the last rank leaves right after
// ncclCommInitRank and the others print "rank R saw the all-reduce fail: <NCCL's error>: <NCCL's
// last error>" and exit 0 when an all-reduce reports the failure.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "examples/mnist/cuda_host/cuda_host.h"

namespace {

int fail(const std::string& what) {
  std::fprintf(stderr, "cuda_host_nccl_worker: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const char* rank_text = std::getenv("RANK");
  const char* world_text = std::getenv("WORLD_SIZE");
  if (argc < 2 || argc > 3 || rank_text == nullptr || world_text == nullptr) {
    return fail("usage: RANK=r WORLD_SIZE=w cuda_host_nccl_worker <hex id> [peer-vanishes]");
  }
  const bool peer_vanishes = argc == 3 && std::string(argv[2]) == "peer-vanishes";
  const int rank = std::atoi(rank_text);
  const int world = std::atoi(world_text);
  const std::string hex = argv[1];
  ncclUniqueId id{};
  if (hex.size() != 2 * sizeof(id.internal)) return fail("the id must be 256 hex digits");
  for (size_t i = 0; i < sizeof(id.internal); ++i) {
    id.internal[i] = static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  }

  ncclComm_t comm = nullptr;
  if (ncclResult_t r = ncclCommInitRank(&comm, world, id, rank); r != ncclSuccess) {
    return fail(std::string("ncclCommInitRank: ") + ncclGetErrorString(r) + ": " +
                ncclGetLastError(nullptr));
  }
  cudaStream_t stream = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    return fail("cudaStreamCreateWithFlags");
  }
  const size_t n = 5;
  std::vector<float> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<float>((rank + 1) * 10 + i);
  float* avg = nullptr;
  float* sum = nullptr;
  if (cudaMalloc(&avg, n * sizeof(float)) != cudaSuccess ||
      cudaMalloc(&sum, n * sizeof(float)) != cudaSuccess) {
    return fail("cudaMalloc");
  }
  cudaMemcpyAsync(avg, host.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream);
  cudaMemcpyAsync(sum, host.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream);
  std::vector<float> avg_out(n);
  std::vector<float> sum_out(n);
  if (peer_vanishes) {
    // One all-reduce first: when the last rank has its result, every rank is past
    // ncclCommInitRank. Then the last rank leaves without a word (no ncclCommDestroy), and the
    // others' all-reduces fail: this one already (gloo resets its sockets on exit, so bytes not
    // yet read may be lost) or the next.
    ncclResult_t r = ncclAllReduce(sum, sum, n, ncclFloat, ncclSum, comm, stream);
    if (rank == world - 1) {
      if (r != ncclSuccess) return fail("the first all-reduce failed");
      std::_Exit(0);
    }
    if (r == ncclSuccess) r = ncclAllReduce(avg, avg, n, ncclFloat, ncclAvg, comm, stream);
    if (r == ncclSuccess) return fail("the all-reduce with a vanished peer succeeded");
    std::printf("rank %d saw the all-reduce fail: %s: %s\n", rank, ncclGetErrorString(r),
                ncclGetLastError(comm));
    std::fflush(stdout);
    std::_Exit(0);  // ncclCommDestroy's barrier would wait for the vanished peer
  }
  if (ncclAllReduce(avg, avg, n, ncclFloat, ncclAvg, comm, stream) != ncclSuccess ||
      ncclAllReduce(sum, sum, n, ncclFloat, ncclSum, comm, stream) != ncclSuccess) {
    return fail(std::string("ncclAllReduce: ") + ncclGetLastError(comm));
  }
  if (cudaMemcpyAsync(avg_out.data(), avg, n * sizeof(float), cudaMemcpyDeviceToHost, stream) !=
          cudaSuccess ||
      cudaMemcpyAsync(sum_out.data(), sum, n * sizeof(float), cudaMemcpyDeviceToHost, stream) !=
          cudaSuccess) {
    return fail(std::string("copy back: ") + ncclGetLastError(comm));
  }
  std::string line = "rank " + std::to_string(rank) + " avg";
  for (float v : avg_out) line += " " + std::to_string(v);
  line += " sum";
  for (float v : sum_out) line += " " + std::to_string(v);
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  cudaFree(avg);
  cudaFree(sum);
  cudaStreamDestroy(stream);
  if (ncclCommDestroy(comm) != ncclSuccess) return fail("ncclCommDestroy");
  return 0;
}
