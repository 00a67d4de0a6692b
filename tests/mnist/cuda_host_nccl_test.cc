// The emulated NCCL: one rank is the identity; two ranks under the real cpprun (the agent's
// store, gloo between two processes) give the mean and the sum of rank-dependent data.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "examples/mnist/cuda_host/cuda_host.h"
#include "tests/support/test_support.h"

using cpprun::testing::ChildProcess;
using cpprun::testing::exitCodeOf;
using namespace std::chrono_literals;

TEST_CASE("cuda_host NCCL: one rank's all-reduce is the identity, sum and avg", "[unit]") {
  ncclUniqueId id{};
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclComm_t comm = nullptr;
  REQUIRE(ncclCommInitRank(&comm, 1, id, 0) == ncclSuccess);
  int count = 0, rank = -1;
  REQUIRE(ncclCommCount(comm, &count) == ncclSuccess);
  REQUIRE(ncclCommUserRank(comm, &rank) == ncclSuccess);
  CHECK(count == 1);
  CHECK(rank == 0);
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  const std::vector<float> data = {1.5f, -2.0f, 3.25f};
  float* in = nullptr;
  float* out = nullptr;
  REQUIRE(cudaMalloc(&in, 3 * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMalloc(&out, 3 * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(in, data.data(), 3 * sizeof(float), cudaMemcpyHostToDevice, s) ==
          cudaSuccess);
  for (ncclRedOp_t op : {ncclSum, ncclAvg}) {
    REQUIRE(cudaMemsetAsync(out, 0, 3 * sizeof(float), s) == cudaSuccess);
    REQUIRE(ncclAllReduce(in, out, 3, ncclFloat, op, comm, s) == ncclSuccess);
    std::vector<float> back(3);
    REQUIRE(cudaMemcpyAsync(back.data(), out, 3 * sizeof(float), cudaMemcpyDeviceToHost, s) ==
            cudaSuccess);
    CHECK(back == data);
  }
  // What the emulation does not reduce, and what is not device memory, are refused by name.
  CHECK(ncclAllReduce(in, out, 3, ncclInt32, ncclSum, comm, s) == ncclInvalidArgument);
  CHECK(ncclAllReduce(in, out, 3, ncclFloat, ncclMax, comm, s) == ncclInvalidArgument);
  CHECK(std::string(ncclGetLastError(comm)).find("ncclSum or ncclAvg") != std::string::npos);
  CHECK(ncclAllReduce(in, out, 4, ncclFloat, ncclSum, comm, s) == ncclInvalidArgument);
  CHECK(ncclAllReduce(data.data(), out, 3, ncclFloat, ncclSum, comm, s) == ncclInvalidArgument);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  REQUIRE(ncclCommDestroy(comm) == ncclSuccess);
  cudaFree(in);
  cudaFree(out);
  cudaStreamDestroy(s);
  int version = 0;
  REQUIRE(ncclGetVersion(&version) == ncclSuccess);
  CHECK(version == NCCL_VERSION_CODE);
}

TEST_CASE("cuda_host NCCL: bad ranks and a missing MASTER_ADDR are errors with a message",
          "[unit]") {
  ncclUniqueId id{};
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclComm_t comm = nullptr;
  CHECK(ncclCommInitRank(&comm, 2, id, 2) == ncclInvalidArgument);
  CHECK(ncclCommInitRank(&comm, 0, id, 0) == ncclInvalidArgument);
  CHECK(comm == nullptr);
  const char* saved = std::getenv("MASTER_ADDR");
  const std::optional<std::string> master =
      saved == nullptr ? std::nullopt : std::optional<std::string>(saved);
  unsetenv("MASTER_ADDR");
  CHECK(ncclCommInitRank(&comm, 2, id, 0) == ncclInvalidArgument);
  CHECK(std::string(ncclGetLastError(nullptr)).find("MASTER_ADDR") != std::string::npos);
  if (master) setenv("MASTER_ADDR", master->c_str(), 1);
}

namespace {

std::string freshIdHex() {
  ncclUniqueId id{};
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  std::string hex;
  for (char c : id.internal) {
    static const char kHex[] = "0123456789abcdef";
    hex += kHex[static_cast<unsigned char>(c) >> 4];
    hex += kHex[static_cast<unsigned char>(c) & 0xf];
  }
  return hex;
}

}  // namespace

TEST_CASE("cuda_host NCCL: two ranks under cpprun average and sum through the agent's store",
          "[integration]") {
  const std::string hex = freshIdHex();
  ChildProcess run(
      {CPPRUN_BINARY, "--nproc-per-node=2", "--no-python", CPPRUN_CUDA_HOST_NCCL_WORKER, hex});
  const std::optional<int> status = run.wait(90s);
  INFO(run.output());
  REQUIRE(status.has_value());
  CHECK(exitCodeOf(*status) == 0);
  // Rank r holds (r + 1) * 10 + i: the mean over two ranks is 15 + i, the sum 30 + 2i.
  for (int rank : {0, 1}) {
    CHECK(run.output().find("rank " + std::to_string(rank) +
                            " avg 15.000000 16.000000 17.000000 18.000000 19.000000 sum "
                            "30.000000 32.000000 34.000000 36.000000 38.000000") !=
          std::string::npos);
  }
}

TEST_CASE("cuda_host NCCL: a peer gone mid-job fails the all-reduce, with gloo's reason",
          "[integration]") {
  ChildProcess run({CPPRUN_BINARY, "--nproc-per-node=2", "--no-python",
                    CPPRUN_CUDA_HOST_NCCL_WORKER, freshIdHex(), "peer-vanishes"});
  const std::optional<int> status = run.wait(90s);
  INFO(run.output());
  REQUIRE(status.has_value());
  CHECK(exitCodeOf(*status) == 0);
  CHECK(run.output().find("rank 0 saw the all-reduce fail: unhandled system error: "
                          "ncclAllReduce: ") != std::string::npos);
}
