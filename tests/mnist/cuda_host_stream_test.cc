// The emulated runtime: lazy in-order streams, event ordering between streams (and the
// adversarial order that makes a missing wait visible), copies' pageable-memory semantics,
// kernel launch configuration and sticky launch errors.
#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "examples/mnist/cuda_host/cuda_host.h"

// Kernels needing shared memory or barriers must not compile under the emulation: it defines
// neither name (nor declares either anywhere).
#if defined(__shared__) || defined(__syncthreads)
#error "the emulation must leave __shared__ and __syncthreads undefined"
#endif

namespace {

__global__ void countVisits(int* hits, size_t n) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    hits[i] += 1;
  }
}

__global__ void fill(float* x, size_t n, float value) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    x[i] = value;
  }
}

__global__ void copy(const float* from, float* to, size_t n) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    to[i] = from[i];
  }
}

void launchFill(cudaStream_t s, float* x, size_t n, float value) {
  cuda_host::enqueueKernel(s, 2, 32, [=] { fill(x, n, value); });
}
void launchCopy(cudaStream_t s, const float* from, float* to, size_t n) {
  cuda_host::enqueueKernel(s, 3, 16, [=] { copy(from, to, n); });
}

std::vector<float> download(const float* device, size_t n) {
  std::vector<float> host(n);
  REQUIRE(cudaMemcpy(host.data(), device, n * sizeof(float), cudaMemcpyDeviceToHost) ==
          cudaSuccess);
  return host;
}

struct Streams {
  Streams() {
    REQUIRE(cudaStreamCreateWithFlags(&first, cudaStreamNonBlocking) == cudaSuccess);
    REQUIRE(cudaStreamCreateWithFlags(&second, cudaStreamNonBlocking) == cudaSuccess);
    REQUIRE(cudaEventCreateWithFlags(&event, cudaEventDisableTiming) == cudaSuccess);
  }
  ~Streams() {
    cudaEventDestroy(event);
    cudaStreamDestroy(first);
    cudaStreamDestroy(second);
  }
  cudaStream_t first = nullptr;
  cudaStream_t second = nullptr;
  cudaEvent_t event = nullptr;
};

struct Buffer {
  explicit Buffer(size_t count, float value = 0.0f) : n(count) {
    REQUIRE(cudaMalloc(&p, n * sizeof(float)) == cudaSuccess);
    const std::vector<float> init(n, value);
    REQUIRE(cudaMemcpy(p, init.data(), n * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  ~Buffer() { cudaFree(p); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  float* p = nullptr;
  size_t n;
};

}  // namespace

TEST_CASE("cuda_host: a kernel runs once per element, only when the host synchronises", "[unit]") {
  const size_t n = 1000;  // not a multiple of blocks x threads: the grid-stride tail matters
  int* hits = nullptr;
  REQUIRE(cudaMalloc(&hits, n * sizeof(int)) == cudaSuccess);
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaMemsetAsync(hits, 0, n * sizeof(int), s) == cudaSuccess);
  cuda_host::enqueueKernel(s, 3, 64, [=] { countVisits(hits, n); });
  REQUIRE(cudaGetLastError() == cudaSuccess);
  CHECK(cuda_host::pendingOperations() == 2);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(cuda_host::pendingOperations() == 0);
  std::vector<int> host(n);
  REQUIRE(cudaMemcpyAsync(host.data(), hits, n * sizeof(int), cudaMemcpyDeviceToHost, s) ==
          cudaSuccess);
  CHECK(host == std::vector<int>(n, 1));
  // Queued again: device memory (host memory here) does not change until the host waits.
  cuda_host::enqueueKernel(s, 1, 1, [=] { countVisits(hits, n); });
  CHECK(hits[0] == 1);
  REQUIRE(cudaMemcpyAsync(host.data(), hits, n * sizeof(int), cudaMemcpyDeviceToHost, s) ==
          cudaSuccess);
  CHECK(host == std::vector<int>(n, 2));
  // cudaFree, cudaEventSynchronize and cudaStreamDestroy wait for queued work too.
  void* other = nullptr;
  REQUIRE(cudaMalloc(&other, 4) == cudaSuccess);
  cuda_host::enqueueKernel(s, 1, 1, [=] { countVisits(hits, n); });
  REQUIRE(cudaFree(other) == cudaSuccess);
  CHECK(cuda_host::pendingOperations() == 0);
  CHECK(hits[n - 1] == 3);
  cudaEvent_t done = nullptr;
  REQUIRE(cudaEventCreateWithFlags(&done, cudaEventDisableTiming) == cudaSuccess);
  cuda_host::enqueueKernel(s, 1, 1, [=] { countVisits(hits, n); });
  REQUIRE(cudaEventRecord(done, s) == cudaSuccess);
  cuda_host::enqueueKernel(s, 1, 1, [=] { countVisits(hits, n); });
  REQUIRE(cudaEventSynchronize(done) == cudaSuccess);
  CHECK(hits[0] == 4);  // up to the record, not past it
  CHECK(cuda_host::pendingOperations() == 1);
  REQUIRE(cudaEventDestroy(done) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
  CHECK(cuda_host::pendingOperations() == 0);
  CHECK(hits[0] == 5);
  REQUIRE(cudaFree(hits) == cudaSuccess);
}

TEST_CASE("cuda_host: a stream that waits on an event sees the other stream's writes", "[unit]") {
  for (bool producer_created_first : {true, false}) {
    INFO("producer stream created " << (producer_created_first ? "first" : "second"));
    Streams st;
    cudaStream_t producer = producer_created_first ? st.first : st.second;
    cudaStream_t consumer = producer_created_first ? st.second : st.first;
    Buffer x(100), y(100);
    launchFill(producer, x.p, x.n, 1.0f);
    REQUIRE(cudaEventRecord(st.event, producer) == cudaSuccess);
    REQUIRE(cudaStreamWaitEvent(consumer, st.event, 0) == cudaSuccess);
    launchCopy(consumer, x.p, y.p, y.n);
    REQUIRE(cudaStreamSynchronize(consumer) == cudaSuccess);
    CHECK(download(y.p, y.n) == std::vector<float>(100, 1.0f));
  }
}

TEST_CASE("cuda_host: without the wait, the consumer reads stale data (a missing wait shows)",
          "[unit]") {
  for (bool producer_created_first : {true, false}) {
    INFO("producer stream created " << (producer_created_first ? "first" : "second"));
    Streams st;
    cudaStream_t producer = producer_created_first ? st.first : st.second;
    cudaStream_t consumer = producer_created_first ? st.second : st.first;
    Buffer x(100), y(100);
    launchFill(producer, x.p, x.n, 1.0f);
    launchCopy(consumer, x.p, y.p, y.n);  // no event between them: legal to run first
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(download(y.p, y.n) == std::vector<float>(100, 0.0f));
    CHECK(download(x.p, x.n) == std::vector<float>(100, 1.0f));
  }
}

TEST_CASE("cuda_host: a wait is for the record issued before it, not for a later re-record",
          "[unit]") {
  Streams st;
  cudaEvent_t back = nullptr;
  REQUIRE(cudaEventCreateWithFlags(&back, cudaEventDisableTiming) == cudaSuccess);
  Buffer x(10), y(10), z(10);
  launchFill(st.first, x.p, x.n, 1.0f);
  REQUIRE(cudaEventRecord(st.event, st.first) == cudaSuccess);  // record 1
  REQUIRE(cudaStreamWaitEvent(st.second, st.event, 0) == cudaSuccess);
  launchCopy(st.second, x.p, y.p, y.n);
  REQUIRE(cudaEventRecord(back, st.second) == cudaSuccess);
  // The first stream refills x only after the copy to y, then records the event again. The
  // wait queued above must still mean record 1: if it meant the latest record, it would wait
  // for work that waits for it (a deadlock); if waits meant nothing, y would see x's old value.
  REQUIRE(cudaStreamWaitEvent(st.first, back, 0) == cudaSuccess);
  launchFill(st.first, x.p, x.n, 2.0f);
  REQUIRE(cudaEventRecord(st.event, st.first) == cudaSuccess);  // record 2
  REQUIRE(cudaStreamWaitEvent(st.second, st.event, 0) == cudaSuccess);
  launchCopy(st.second, x.p, z.p, z.n);
  REQUIRE(cudaStreamSynchronize(st.second) == cudaSuccess);
  CHECK(download(y.p, y.n) == std::vector<float>(10, 1.0f));
  CHECK(download(z.p, z.n) == std::vector<float>(10, 2.0f));
  REQUIRE(cudaEventDestroy(back) == cudaSuccess);
  // A wait on an event never recorded waits for nothing.
  cudaEvent_t fresh = nullptr;
  REQUIRE(cudaEventCreateWithFlags(&fresh, cudaEventDisableTiming) == cudaSuccess);
  REQUIRE(cudaStreamWaitEvent(st.second, fresh, 0) == cudaSuccess);
  launchFill(st.second, y.p, y.n, 5.0f);
  REQUIRE(cudaStreamSynchronize(st.second) == cudaSuccess);
  CHECK(download(y.p, y.n) == std::vector<float>(10, 5.0f));
  REQUIRE(cudaEventDestroy(fresh) == cudaSuccess);
}

TEST_CASE("cuda_host: a host-to-device copy takes the host bytes at the call", "[unit]") {
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  Buffer x(4);
  std::vector<float> host = {1, 2, 3, 4};
  REQUIRE(cudaMemcpyAsync(x.p, host.data(), 4 * sizeof(float), cudaMemcpyHostToDevice, s) ==
          cudaSuccess);
  host = {9, 9, 9, 9};  // reused before the copy ran
  CHECK(cuda_host::pendingOperations() == 1);
  std::vector<float> back(4);
  REQUIRE(cudaMemcpyAsync(back.data(), x.p, 4 * sizeof(float), cudaMemcpyDeviceToHost, s) ==
          cudaSuccess);
  CHECK(back == std::vector<float>{1, 2, 3, 4});
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
}

TEST_CASE("cuda_host: a bad launch configuration is a sticky error read once", "[unit]") {
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  Buffer x(8);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  for (auto [blocks, threads] :
       std::vector<std::pair<unsigned, unsigned>>{{1, 0}, {1, 1025}, {0, 32}, {0x80000000U, 32}}) {
    INFO(blocks << " blocks x " << threads << " threads");
    cuda_host::enqueueKernel(s, blocks, threads, [p = x.p, n = x.n] { fill(p, n, 7.0f); });
    CHECK(cuda_host::pendingOperations() == 0);  // nothing queued
    CHECK(cudaPeekAtLastError() == cudaErrorInvalidConfiguration);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    CHECK(cudaGetLastError() == cudaSuccess);
  }
  // The error was read: a good launch after it runs and reports success.
  cuda_host::enqueueKernel(s, 1, 1024, [p = x.p, n = x.n] { fill(p, n, 7.0f); });
  CHECK(cudaGetLastError() == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(download(x.p, x.n) == std::vector<float>(8, 7.0f));
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
}

TEST_CASE("cuda_host: bad handles and pointers are errors, not crashes", "[unit]") {
  float* p = nullptr;
  REQUIRE(cudaMalloc(&p, 16) == cudaSuccess);
  float host[8] = {};
  CHECK(cudaMemcpyAsync(p, host, 32, cudaMemcpyHostToDevice, nullptr) == cudaErrorInvalidValue);
  CHECK(cudaMemcpyAsync(host, host + 4, 16, cudaMemcpyDeviceToHost, nullptr) ==
        cudaErrorInvalidValue);
  CHECK(cudaMemsetAsync(p + 1, 0, 16, nullptr) == cudaErrorInvalidValue);
  CHECK(cudaFree(p + 1) == cudaErrorInvalidDevicePointer);
  CHECK(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(host)) ==
        cudaErrorInvalidResourceHandle);
  CHECK(cudaEventRecord(reinterpret_cast<cudaEvent_t>(host), nullptr) ==
        cudaErrorInvalidResourceHandle);
  CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle);
  CHECK(cudaFree(p) == cudaSuccess);
  int count = 0;
  CHECK(cudaGetDeviceCount(&count) == cudaSuccess);
  CHECK(count == 1);
  CHECK(cudaSetDevice(1) == cudaErrorInvalidDevice);
  cudaDeviceProp prop{};
  REQUIRE(cudaGetDeviceProperties(&prop, 0) == cudaSuccess);
  CHECK(std::string(prop.name) == "host emulation");
  cuda_host::setDeviceCount(0);
  CHECK(cudaGetDeviceCount(&count) == cudaErrorNoDevice);
  CHECK(count == 0);
  CHECK(cudaSetDevice(0) == cudaErrorNoDevice);
  CHECK(cudaMalloc(&p, 16) == cudaErrorNoDevice);
  cuda_host::setDeviceCount(1);
  CHECK(std::string(cudaGetErrorString(cudaErrorInvalidConfiguration)) ==
        "invalid configuration argument");
  cudaGetLastError();
}
