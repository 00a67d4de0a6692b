// A host emulation of the CUDA surface the GPU engine (examples/mnist/gpu_engine.cu) uses: the
// runtime (one device, allocations, copies, streams, events), kernel launches, bfloat16, cuBLAS
// (on OpenBLAS) and NCCL's all-reduce (on gloo through the agent's store). With it, g++ compiles
// the engine's source unchanged (through examples/mnist/gpu_runtime.h) and CI runs every kernel
// on a CPU. Test infrastructure: never linked into the production cpprun-mnist.
//
// The names live in the global namespace and spell CUDA's (same enumerator values), so the
// engine's source compiles as is. What the emulation adds is in namespace cuda_host.
//
// Execution model (cuda_host.cc has the details):
// - Device memory is host memory (exactly the bytes asked for, 256-byte aligned), so
//   AddressSanitizer sees a kernel's out-of-bounds access. Device pointers are checked against the
//   live allocations.
// - Every stream is an in-order queue. Work runs LAZILY, only when the host must observe it:
//   cudaStreamSynchronize, cudaEventSynchronize, cudaDeviceSynchronize, a copy to the host,
//   cudaFree, cudaStreamDestroy, ncclCommDestroy.
// - Streams are ordered among themselves only by events: cudaEventRecord queues a marker,
//   cudaStreamWaitEvent queues a wait for the most recent record issued before it (a wait on a
//   never-recorded event is a no-op). No implicit synchronisation with the null stream is
//   emulated: every stream, blocking or not, behaves as cudaStreamNonBlocking.
// - Draining order is adversarial but legal: one operation at a time, of the streams whose next
//   operation may run (it waits for nothing, or for a record that already ran), the one whose
//   next operation was issued LAST runs it. Every operation thus runs as late, relative to work
//   issued earlier on other streams, as the events allow: a read issued after another stream's
//   write, with no event wait between them, runs before the write and sees stale data, whichever
//   stream was created first. A missing wait gives wrong numbers instead of passing by luck.
// - Copies follow CUDA's pageable-memory rules: host-to-device copies the host bytes at the call
//   (the caller may reuse its buffer at once); device-to-host and host-to-host return after the
//   copy ran (the stream drained up to it).
// - Kernels (cuda_host::enqueueKernel) loop blockIdx.x over the blocks and threadIdx.x over the
//   threads of a block, one after another: kernels must not use shared memory or barriers, and
//   __shared__ and __syncthreads are deliberately left undefined so such a kernel does not compile.
//
// Thread safety: every call may come from any thread (one lock); as with CUDA, one host thread
// should drive one engine. The launch-error state (cudaGetLastError) is per host thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

// ---- qualifiers --------------------------------------------------------------------------------

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline

// ---- grid coordinates --------------------------------------------------------------------------

struct uint3 {
  unsigned int x = 0;
  unsigned int y = 0;
  unsigned int z = 0;
};

struct dim3 {
  unsigned int x;
  unsigned int y;
  unsigned int z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
      : x(vx), y(vy), z(vz) {}
};

// Set by the emulation around every call of a kernel body (only .x varies).
inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;

// ---- runtime -----------------------------------------------------------------------------------

// CUDA's values.
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInitializationError = 3,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorLaunchFailure = 719,
  cudaErrorUnknown = 999,
};
using cudaError = cudaError_t;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

constexpr unsigned int cudaStreamDefault = 0x0;
constexpr unsigned int cudaStreamNonBlocking = 0x1;
constexpr unsigned int cudaEventDefault = 0x0;
constexpr unsigned int cudaEventBlockingSync = 0x1;
constexpr unsigned int cudaEventDisableTiming = 0x2;

struct CUstream_st;
struct CUevent_st;
using cudaStream_t = CUstream_st*;
using cudaEvent_t = CUevent_st*;

struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  int major;
  int minor;
  int multiProcessorCount;
  int maxThreadsPerBlock;
  int maxGridSize[3];
  int pciBusID;
  int pciDeviceID;
  int pciDomainID;
};

const char* cudaGetErrorString(cudaError_t error);
const char* cudaGetErrorName(cudaError_t error);
// The calling thread's last error (from a launch or any failed call), reset to cudaSuccess.
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();

cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaDeviceSynchronize();

cudaError_t cudaMalloc(void** pointer, size_t bytes);
template <typename T>
cudaError_t cudaMalloc(T** pointer, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(pointer), bytes);
}
cudaError_t cudaFree(void* pointer);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream = nullptr);

cudaError_t cudaStreamCreate(cudaStream_t* stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);

cudaError_t cudaEventCreate(cudaEvent_t* event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags = 0);

// ---- bfloat16 ----------------------------------------------------------------------------------

// 16-bit storage: the top half of a float. A plain struct without member functions, so that a
// test may link this beside a translation unit that includes CUDA's own <cuda_bf16.h>.
struct __nv_bfloat16 {
  unsigned short __x;
};

// Round to nearest, ties to even, as cuda_bf16.hpp's host path and the hardware's cvt.rn.bf16.f32:
// NaN becomes the canonical NaN 0x7fff, a value past the largest finite bf16 becomes infinity.
inline __nv_bfloat16 __float2bfloat16(float value) {
  uint32_t bits = 0;
  __builtin_memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7fffffffU) > 0x7f800000U) return __nv_bfloat16{0x7fff};
  const uint32_t lower = bits & 0xffffU;
  uint32_t upper = bits >> 16;
  if (lower > 0x8000U || (lower == 0x8000U && (upper & 1U) != 0)) ++upper;  // carries may
  return __nv_bfloat16{static_cast<unsigned short>(upper)};  // reach the exponent: exact
}
inline __nv_bfloat16 __float2bfloat16_rn(float value) { return __float2bfloat16(value); }

inline float __bfloat162float(__nv_bfloat16 value) {
  const uint32_t bits = static_cast<uint32_t>(value.__x) << 16;
  float out = 0.0f;
  __builtin_memcpy(&out, &bits, sizeof(out));
  return out;
}

// ---- cuBLAS
// --------------------------------------------------------------------------------------

enum cublasStatus_t {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_ARCH_MISMATCH = 8,
  CUBLAS_STATUS_MAPPING_ERROR = 11,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
  CUBLAS_STATUS_INTERNAL_ERROR = 14,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
};

enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 };

enum cudaDataType_t {
  CUDA_R_32F = 0,
  CUDA_R_64F = 1,
  CUDA_R_16F = 2,
  CUDA_R_8I = 3,
  CUDA_R_32I = 10,
  CUDA_R_16BF = 14,
};
using cudaDataType = cudaDataType_t;

enum cublasComputeType_t {
  CUBLAS_COMPUTE_16F = 64,
  CUBLAS_COMPUTE_32F = 68,
  CUBLAS_COMPUTE_32F_FAST_16F = 74,
  CUBLAS_COMPUTE_32F_FAST_16BF = 75,
  CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
  CUBLAS_COMPUTE_64F = 70,
  CUBLAS_COMPUTE_32I = 72,
};

enum cublasGemmAlgo_t { CUBLAS_GEMM_DEFAULT = -1, CUBLAS_GEMM_DEFAULT_TENSOR_OP = 99 };

struct cublasContext;
using cublasHandle_t = cublasContext*;

const char* cublasGetStatusString(cublasStatus_t status);
cublasStatus_t cublasCreate(cublasHandle_t* handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t* stream);

// Column-major, as cuBLAS: C = alpha op(A) op(B) + beta C with op(A) m x k, op(B) k x n.
// alpha and beta are host pointers read at the call; the product runs on the handle's stream.
cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, int k, const float* alpha,
                           const float* a, int lda, const float* b, int ldb, const float* beta,
                           float* c, int ldc);
// y = alpha op(A) x + beta y with A m x n.
cublasStatus_t cublasSgemv(cublasHandle_t handle, cublasOperation_t trans, int m, int n,
                           const float* alpha, const float* a, int lda, const float* x, int incx,
                           const float* beta, float* y, int incy);
// Only A, B = CUDA_R_16BF, C = CUDA_R_32F, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT (alpha and
// beta float); anything else is CUBLAS_STATUS_NOT_SUPPORTED.
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* a, cudaDataType_t a_type, int lda, const void* b,
                            cudaDataType_t b_type, int ldb, const void* beta, void* c,
                            cudaDataType_t c_type, int ldc, cublasComputeType_t compute_type,
                            cublasGemmAlgo_t algo);

// ---- NCCL
// ----------------------------------------------------------------------------------------

// The NCCL API level the emulation mirrors (what ncclGetVersion reports).
#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 9
#define NCCL_VERSION_CODE 22809

enum ncclResult_t {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
};

enum ncclDataType_t {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
};

enum ncclRedOp_t { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 };

#define NCCL_UNIQUE_ID_BYTES 128
struct ncclUniqueId {
  char internal[NCCL_UNIQUE_ID_BYTES];
};

struct ncclComm;
using ncclComm_t = ncclComm*;

const char* ncclGetErrorString(ncclResult_t result);
// The message of the last failure on `comm` (or of the last failed ncclCommInitRank when comm
// is null); "" when none.
const char* ncclGetLastError(ncclComm_t comm);
// NCCL_VERSION_CODE, or $CPPRUN_EMULATED_NCCL_VERSION when set (to emulate an older NCCL).
ncclResult_t ncclGetVersion(int* version);
// 128 random bytes.
ncclResult_t ncclGetUniqueId(ncclUniqueId* id);
// nranks 1: a local communicator. More: gloo, meeting the other ranks through the store at
// MASTER_ADDR:MASTER_PORT under a key prefix made from the id, so ranks holding the same id
// meet. Blocks until every rank arrived (as NCCL does). With more than one rank, SIGPIPE is
// ignored from then on when it was at its default (a peer gone is an error, as in NCCL, not a
// signal: gloo writes without MSG_NOSIGNAL).
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank);
// NCCL >= 2.23's many-root init, with C linkage as NCCL's (the trainer finds it with dlsym, so
// the emulated binary exports its symbols). nId in 1..nranks ids; the ranks meet under the first
// id, then check that every rank gave the same nId ids (an all-reduce of their digest): a rank
// that did not fails with ncclInvalidUsage. `config` is not read (NCCL's ncclConfig_t*).
extern "C" ncclResult_t ncclCommInitRankScalable(ncclComm_t* comm, int nranks, int rank, int nId,
                                                 ncclUniqueId* ids, void* config);
// Runs the work still queued (on every stream), then a barrier with the other ranks, then frees.
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommCount(ncclComm_t comm, int* count);
ncclResult_t ncclCommUserRank(ncclComm_t comm, int* rank);
// ncclFloat and ncclDouble with ncclSum or ncclAvg; queued on `stream` and run before the call
// returns, after the work it depends on (cuda_host::enqueueAndWait). A failure (a peer gone)
// returns ncclSystemError, and ncclGetLastError(comm) says why.
ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);

// ---- what the emulation adds -------------------------------------------------------------------

namespace cuda_host {

// Queues `body` to run blocks x threads times on `stream` with blockIdx.x, threadIdx.x,
// blockDim.x = threads and gridDim.x = blocks set. As CUDA, a bad configuration (threads not in
// 1..1024, blocks not in 1..2^31-1) or an unknown stream queues nothing and leaves the error for
// cudaGetLastError (cudaErrorInvalidConfiguration, cudaErrorInvalidResourceHandle).
void enqueueKernel(cudaStream_t stream, unsigned blocks, unsigned threads,
                   std::function<void()> body);

// Queues a host operation on `stream` (the building block of cuBLAS's and NCCL's emulation). A
// non-success return stops the draining call, which returns it (the operation is dropped).
// Operations run, and are destroyed, under the emulation's lock: neither an operation nor what
// it captures may call this API (a lambda capturing an object whose destructor calls cudaFree
// would deadlock; capture the pointers).
cudaError_t enqueue(cudaStream_t stream, std::function<cudaError_t()> operation);

// Queues `operation` on `stream` and runs queued work (in the order above) until it has run;
// returns its error or the first error met on the way. The emulation's collectives use it: on a
// GPU, streams progress without the host, so a rank whose host waits on something else (rank 0
// reading the loss, a host-side barrier) never holds up a collective its peers wait in. A lazy
// queue would run the collective only when that rank's host next synchronises, and two ranks
// could each wait in a different collective for the other: a deadlock no GPU has. Every rank
// issues the same collectives in the same order, so running each at its call keeps that order.
cudaError_t enqueueAndWait(cudaStream_t stream, std::function<cudaError_t()> operation);

// Whether [pointer, pointer + bytes) lies inside one live device allocation.
bool isDeviceRange(const void* pointer, size_t bytes);

// How many devices cudaGetDeviceCount reports (default 1; 0 emulates a host without GPU).
void setDeviceCount(int count);

// Operations queued and not yet run, over all streams (for tests of the lazy execution).
size_t pendingOperations();

}  // namespace cuda_host
