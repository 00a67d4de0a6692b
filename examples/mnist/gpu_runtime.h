// The CUDA surface the GPU engine (gpu_engine.cu) is written against, and the one way it
// launches kernels.
//
// Under nvcc this is the real thing: the CUDA runtime, cuBLAS, bfloat16 and NCCL headers, and
// launchKernel() is a real <<<blocks, threads, 0, stream>>> launch.
// Compiled by a host C++ compiler, the same names come from the host emulation in
// examples/mnist/cuda_host/ (docs/mnist.md): allocations in host memory, streams and events as
// in-order queues, cuBLAS on OpenBLAS's column-major calls, bfloat16 rounded to nearest even,
// NCCL's all-reduce on gloo through the agent's store, and launchKernel() a loop over blocks and
// threads. That is how CI runs every kernel of the engine, from this same source, on a CPU.
//
// Kernels launched this way must not use shared memory or barriers (__shared__,
// __syncthreads): the emulation runs a block's threads one after another, and does not define
// them, so such a kernel does not compile there.
// Thread safety: as CUDA's: one host thread drives the engine.
#pragma once

#if defined(__CUDACC__)

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nccl.h>

namespace cpprun::mnist {

// Launches `kernel` over `blocks` x `threads` on `stream` (no dynamic shared memory).
template <typename... Params, typename... Args>
inline void launchKernel(void (*kernel)(Params...), unsigned blocks, unsigned threads,
                         cudaStream_t stream, Args... args) {
  kernel<<<blocks, threads, 0, stream>>>(args...);
}

}  // namespace cpprun::mnist

#else

#include "examples/mnist/cuda_host/cuda_host.h"

namespace cpprun::mnist {

// The emulation's launch: queued on `stream`, run later as a loop over blocks and threads.
template <typename... Params, typename... Args>
inline void launchKernel(void (*kernel)(Params...), unsigned blocks, unsigned threads,
                         cudaStream_t stream, Args... args) {
  cuda_host::enqueueKernel(stream, blocks, threads, [=] { kernel(static_cast<Params>(args)...); });
}

}  // namespace cpprun::mnist

#endif
