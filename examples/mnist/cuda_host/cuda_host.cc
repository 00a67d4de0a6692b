// The emulated CUDA runtime: device memory, streams, events, copies and kernel launches (see
// cuda_host.h for the execution model).
//
// State: one Device (allocations, streams, events) under one mutex. A stream is a deque of
// Operations; an event points at the completion flag of its latest record. Draining runs
// operations while holding the lock: an operation (a kernel body, a BLAS call, a gloo
// all-reduce) never calls back into this API.
#include "examples/mnist/cuda_host/cuda_host.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "common/check.h"

namespace cuda_host {

// A queued operation. `issued` orders all operations of all streams by their call; `done` (when
// set) becomes true once it ran; `after` (when set) is the record it waits for: it may run only
// once that is true.
struct Operation {
  uint64_t issued = 0;
  std::function<cudaError_t()> run;
  std::shared_ptr<bool> done;
  std::shared_ptr<bool> after;
};

}  // namespace cuda_host

// The opaque handle types.
struct CUstream_st {
  std::deque<cuda_host::Operation> queue;
};

struct CUevent_st {
  // Done flag of the most recent record issued (null before the first record).
  std::shared_ptr<bool> latest;
};

namespace cuda_host {
namespace {

struct Device {
  std::mutex mutex;
  std::map<uintptr_t, size_t> allocations;  // begin -> bytes
  std::set<CUstream_st*> streams;
  std::set<CUevent_st*> events;
  CUstream_st null_stream;
  uint64_t issued = 0;  // operations queued so far, over all streams
  int device_count = 1;
  int current_device = 0;
};

Device& device() {
  static Device* d = new Device();  // never destroyed: worker threads may outlive statics
  return *d;
}

thread_local cudaError_t last_error = cudaSuccess;

cudaError_t fail(cudaError_t e) {
  if (e != cudaSuccess) last_error = e;
  return e;
}

// The stream a handle names (0 is the null stream), or null when the handle is unknown.
// REQUIRES: d.mutex held.
CUstream_st* streamFor(Device& d, cudaStream_t stream) {
  if (stream == nullptr) return &d.null_stream;
  return d.streams.count(stream) != 0 ? stream : nullptr;
}

// Whether [pointer, pointer + bytes) lies in one live allocation. REQUIRES: d.mutex held.
bool inDeviceRange(Device& d, const void* pointer, size_t bytes) {
  const auto p = reinterpret_cast<uintptr_t>(pointer);
  auto it = d.allocations.upper_bound(p);
  if (it == d.allocations.begin()) return false;
  --it;
  return bytes <= it->second && p - it->first <= it->second - bytes;
}

// Queues an operation on `s`. REQUIRES: d.mutex held.
void push(Device& d, CUstream_st* s, std::function<cudaError_t()> run,
          std::shared_ptr<bool> done = nullptr, std::shared_ptr<bool> after = nullptr) {
  s->queue.push_back(Operation{++d.issued, std::move(run), std::move(done), std::move(after)});
}

// Runs queued operations until `done()` holds, one at a time, in an adversarial but legal
// order: of the streams whose next operation may run (it waits for nothing, or for a record
// that ran), the one whose next operation was issued LAST runs it. So every operation runs as
// late, relative to work issued earlier on other streams, as the events allow: work issued
// after a write on another stream, without an event wait between them, runs before the write
// and reads stale data. Returns the first failing operation's error (that operation is
// dropped). Cannot block forever: a wait names only a record issued before it, so the
// earliest-issued pending operation can always run. REQUIRES: d.mutex held.
template <typename Done>
cudaError_t drainUntil(Device& d, Done done) {
  while (!done()) {
    CUstream_st* next = nullptr;
    auto consider = [&next](CUstream_st* s) {
      if (s->queue.empty()) return;
      const Operation& head = s->queue.front();
      if (head.after != nullptr && !*head.after) return;
      if (next == nullptr || head.issued > next->queue.front().issued) next = s;
    };
    consider(&d.null_stream);
    for (CUstream_st* s : d.streams) consider(s);
    CPPRUN_CHECK(next != nullptr);
    Operation operation = std::move(next->queue.front());
    next->queue.pop_front();
    const cudaError_t e = operation.run();
    if (operation.done != nullptr) *operation.done = true;
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace

// ---- what the emulation adds ------------------------------------------------------------------

cudaError_t enqueue(cudaStream_t stream, std::function<cudaError_t()> operation) {
  Device& d = device();
  std::lock_guard<std::mutex> lock(d.mutex);
  CUstream_st* s = streamFor(d, stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  push(d, s, std::move(operation));
  return cudaSuccess;
}

cudaError_t enqueueAndWait(cudaStream_t stream, std::function<cudaError_t()> operation) {
  Device& d = device();
  std::lock_guard<std::mutex> lock(d.mutex);
  CUstream_st* s = streamFor(d, stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  auto ran = std::make_shared<bool>(false);
  push(d, s, std::move(operation), ran);
  return drainUntil(d, [&ran] { return *ran; });
}

void enqueueKernel(cudaStream_t stream, unsigned blocks, unsigned threads,
                   std::function<void()> body) {
  if (threads < 1 || threads > 1024 || blocks < 1 || blocks > 0x7fffffffU) {
    fail(cudaErrorInvalidConfiguration);
    return;
  }
  enqueue(stream, [blocks, threads, body = std::move(body)]() {
    gridDim = dim3(blocks);
    blockDim = dim3(threads);
    for (unsigned b = 0; b < blocks; ++b) {
      blockIdx.x = b;
      for (unsigned t = 0; t < threads; ++t) {
        threadIdx.x = t;
        body();
      }
    }
    return cudaSuccess;
  });
}

bool isDeviceRange(const void* pointer, size_t bytes) {
  Device& d = device();
  std::lock_guard<std::mutex> lock(d.mutex);
  return inDeviceRange(d, pointer, bytes);
}

void setDeviceCount(int count) {
  Device& d = device();
  std::lock_guard<std::mutex> lock(d.mutex);
  d.device_count = count;
}

size_t pendingOperations() {
  Device& d = device();
  std::lock_guard<std::mutex> lock(d.mutex);
  size_t n = d.null_stream.queue.size();
  for (CUstream_st* s : d.streams) n += s->queue.size();
  return n;
}

}  // namespace cuda_host

using cuda_host::device;
using cuda_host::Device;
using cuda_host::fail;
using cuda_host::inDeviceRange;

// ---- errors
// ---------------------------------------------------------------------------------------

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError:
      return "cudaErrorInitializationError";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer:
      return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection:
      return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorNoDevice:
      return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    case cudaErrorUnknown:
      return "cudaErrorUnknown";
  }
  return "unrecognized error code";
}

// CUDA's own wording.
const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInitializationError:
      return "initialization error";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer:
      return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection:
      return "invalid copy direction for memcpy";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle";
    case cudaErrorNotReady:
      return "device not ready";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure";
    case cudaErrorUnknown:
      return "unknown error";
  }
  return "unrecognized error code";
}

cudaError_t cudaGetLastError() {
  const cudaError_t e = cuda_host::last_error;
  cuda_host::last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError() { return cuda_host::last_error; }

// ---- device -----------------------------------------------------------------------------------

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return fail(cudaErrorInvalidValue);
  Device& d = device();
  std::lock_guard<std::mutex> lock(d.mutex);
  *count = d.device_count;
  return d.device_count == 0 ? fail(cudaErrorNoDevice) : cudaSuccess;
}

cudaError_t cudaSetDevice(int ordinal) {
  Device& d = device();
  std::lock_guard<std::mutex> lock(d.mutex);
  if (d.device_count == 0) return fail(cudaErrorNoDevice);
  if (ordinal < 0 || ordinal >= d.device_count) return fail(cudaErrorInvalidDevice);
  d.current_device = ordinal;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* ordinal) {
  if (ordinal == nullptr) return fail(cudaErrorInvalidValue);
  Device& d = device();
  std::lock_guard<std::mutex> lock(d.mutex);
  if (d.device_count == 0) return fail(cudaErrorNoDevice);
  *ordinal = d.current_device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int ordinal) {
  if (prop == nullptr) return fail(cudaErrorInvalidValue);
  Device& d = device();
  std::lock_guard<std::mutex> lock(d.mutex);
  if (d.device_count == 0) return fail(cudaErrorNoDevice);
  if (ordinal < 0 || ordinal >= d.device_count) return fail(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof(prop->name), "host emulation");
  prop->maxThreadsPerBlock = 1024;
  prop->maxGridSize[0] = 0x7fffffff;
  prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
  prop->multiProcessorCount = 1;
  prop->pciBusID = ordinal;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  Device& d = device();
  std::lock_guard<std::mutex> lock(d.mutex);
  auto all_empty = [&d] {
    if (!d.null_stream.queue.empty()) return false;
    for (CUstream_st* s : d.streams) {
      if (!s->queue.empty()) return false;
    }
    return true;
  };
  return fail(cuda_host::drainUntil(d, all_empty));
}

// ---- memory -----------------------------------------------------------------------------------

cudaError_t cudaMalloc(void** pointer, size_t bytes) {
  if (pointer == nullptr) return fail(cudaErrorInvalidValue);
  *pointer = nullptr;
  if (bytes == 0) return cudaSuccess;
  {
    Device& d = device();
    std::lock_guard<std::mutex> lock(d.mutex);
    if (d.device_count == 0) return fail(cudaErrorNoDevice);
  }
  // CUDA aligns allocations to 256 bytes. Exactly `bytes` are allocated (posix_memalign takes
  // any size), so AddressSanitizer flags the first byte past them.
  void* p = nullptr;
  if (posix_memalign(&p, 256, bytes) != 0) return fail(cudaErrorMemoryAllocation);
  Device& d = device();
  std::lock_guard<std::mutex> lock(d.mutex);
  d.allocations[reinterpret_cast<uintptr_t>(p)] = bytes;
  *pointer = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* pointer) {
  if (pointer == nullptr) return cudaSuccess;
  Device& d = device();
  std::lock_guard<std::mutex> lock(d.mutex);
  auto it = d.allocations.find(reinterpret_cast<uintptr_t>(pointer));
  if (it == d.allocations.end()) return fail(cudaErrorInvalidDevicePointer);
  // CUDA's cudaFree synchronises the device: work still queued may use the memory.
  auto all_empty = [&d] {
    if (!d.null_stream.queue.empty()) return false;
    for (CUstream_st* s : d.streams) {
      if (!s->queue.empty()) return false;
    }
    return true;
  };
  const cudaError_t e = cuda_host::drainUntil(d, all_empty);
  d.allocations.erase(reinterpret_cast<uintptr_t>(pointer));
  std::free(pointer);
  return fail(e);
}

namespace {

// Queues `operation` on `s` and, when `wait` is set, drains until it ran.
// REQUIRES: d.mutex held.
cudaError_t queueAndMaybeWait(Device& d, CUstream_st* s, std::function<cudaError_t()> operation,
                              bool wait) {
  auto ran = std::make_shared<bool>(false);
  cuda_host::push(d, s, std::move(operation), ran);
  if (!wait) return cudaSuccess;
  return cuda_host::drainUntil(d, [&ran] { return *ran; });
}

}  // namespace

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  Device& d = device();
  std::lock_guard<std::mutex> lock(d.mutex);
  CUstream_st* s = cuda_host::streamFor(d, stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return fail(cudaErrorInvalidValue);
  const bool dst_device = inDeviceRange(d, dst, bytes);
  const bool src_device = inDeviceRange(d, src, bytes);
  if (kind == cudaMemcpyDefault) {
    kind = dst_device ? (src_device ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                      : (src_device ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
  }
  switch (kind) {
    case cudaMemcpyHostToDevice: {
      if (!dst_device) return fail(cudaErrorInvalidValue);
      // Pageable memory: the bytes are staged now, the caller may reuse its buffer.
      auto staged = std::make_shared<std::vector<unsigned char>>(
          static_cast<const unsigned char*>(src), static_cast<const unsigned char*>(src) + bytes);
      return fail(queueAndMaybeWait(
          d, s,
          [dst, staged] {
            std::memcpy(dst, staged->data(), staged->size());
            return cudaSuccess;
          },
          false));
    }
    case cudaMemcpyDeviceToDevice:
      if (!dst_device || !src_device) return fail(cudaErrorInvalidValue);
      return fail(queueAndMaybeWait(
          d, s,
          [dst, src, bytes] {
            std::memmove(dst, src, bytes);
            return cudaSuccess;
          },
          false));
    case cudaMemcpyDeviceToHost:
      if (!src_device || dst_device) return fail(cudaErrorInvalidValue);
      [[fallthrough]];
    case cudaMemcpyHostToHost:
      // The call returns once the copy ran: everything queued before it on `s` ran too.
      return fail(queueAndMaybeWait(
          d, s,
          [dst, src, bytes] {
            std::memmove(dst, src, bytes);
            return cudaSuccess;
          },
          true));
    case cudaMemcpyDefault:
      break;
  }
  return fail(cudaErrorInvalidMemcpyDirection);
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  // On the null stream, and the host waits for it whatever the direction.
  const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
  if (e != cudaSuccess) return e;
  return cudaStreamSynchronize(nullptr);
}

cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream) {
  Device& d = device();
  std::lock_guard<std::mutex> lock(d.mutex);
  CUstream_st* s = cuda_host::streamFor(d, stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (bytes == 0) return cudaSuccess;
  if (!inDeviceRange(d, dst, bytes)) return fail(cudaErrorInvalidValue);
  return fail(queueAndMaybeWait(
      d, s,
      [dst, value, bytes] {
        std::memset(dst, value, bytes);
        return cudaSuccess;
      },
      false));
}

// ---- streams ----------------------------------------------------------------------------------

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  if (stream == nullptr || (flags & ~cudaStreamNonBlocking) != 0) {
    return fail(cudaErrorInvalidValue);
  }
  Device& d = device();
  std::lock_guard<std::mutex> lock(d.mutex);
  auto* s = new CUstream_st();
  d.streams.insert(s);
  *stream = s;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  Device& d = device();
  std::lock_guard<std::mutex> lock(d.mutex);
  CUstream_st* s = cuda_host::streamFor(d, stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  return fail(cuda_host::drainUntil(d, [s] { return s->queue.empty(); }));
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  Device& d = device();
  std::lock_guard<std::mutex> lock(d.mutex);
  if (stream == nullptr || d.streams.count(stream) == 0) {
    return fail(cudaErrorInvalidResourceHandle);
  }
  // CUDA lets queued work finish after the call; here it runs now, before the queue goes.
  const cudaError_t e = cuda_host::drainUntil(d, [stream] { return stream->queue.empty(); });
  d.streams.erase(stream);
  delete stream;
  return fail(e);
}

// ---- events -----------------------------------------------------------------------------------

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  if (event == nullptr || (flags & ~(cudaEventBlockingSync | cudaEventDisableTiming)) != 0) {
    return fail(cudaErrorInvalidValue);
  }
  Device& d = device();
  std::lock_guard<std::mutex> lock(d.mutex);
  auto* e = new CUevent_st();
  d.events.insert(e);
  *event = e;
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  Device& d = device();
  std::lock_guard<std::mutex> lock(d.mutex);
  if (event == nullptr || d.events.count(event) == 0) return fail(cudaErrorInvalidResourceHandle);
  // Queued records and waits hold their flags themselves: destroying is safe at any time.
  d.events.erase(event);
  delete event;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  Device& d = device();
  std::lock_guard<std::mutex> lock(d.mutex);
  CUstream_st* s = cuda_host::streamFor(d, stream);
  if (s == nullptr || event == nullptr || d.events.count(event) == 0) {
    return fail(cudaErrorInvalidResourceHandle);
  }
  auto done = std::make_shared<bool>(false);
  event->latest = done;
  cuda_host::push(
      d, s, [] { return cudaSuccess; }, done);
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  Device& d = device();
  std::lock_guard<std::mutex> lock(d.mutex);
  CUstream_st* s = cuda_host::streamFor(d, stream);
  if (s == nullptr || event == nullptr || d.events.count(event) == 0) {
    return fail(cudaErrorInvalidResourceHandle);
  }
  if (flags != 0) return fail(cudaErrorInvalidValue);
  // The record issued most recently before this call; a later re-record does not move it.
  std::shared_ptr<bool> record = event->latest;
  if (record == nullptr) return cudaSuccess;  // never recorded: nothing to wait for
  cuda_host::push(
      d, s, [] { return cudaSuccess; }, nullptr, record);
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  Device& d = device();
  std::lock_guard<std::mutex> lock(d.mutex);
  if (event == nullptr || d.events.count(event) == 0) return fail(cudaErrorInvalidResourceHandle);
  std::shared_ptr<bool> record = event->latest;
  if (record == nullptr) return cudaSuccess;
  return fail(cuda_host::drainUntil(d, [&record] { return *record; }));
}
