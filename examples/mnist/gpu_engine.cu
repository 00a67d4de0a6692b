// The GPU engine (see gpu_engine.h): cuBLAS and kernels on one device, NCCL between ranks.
//
// Layouts. Activations are NCHW, one sample after another, as on the CPU. A convolution over a
// batch of B images lays out im2col as colT[K][B*P] (K = in_channels*k*k, P = output pixels),
// so that forward is one product Yt[C][B*P] = W[C][K] colT, and backward two: dW = dYt colT^T
// and dcolT = W^T dYt. Small kernels move between Yt and NCHW, fused with the bias and ReLU.
// Parameters, gradients and optimizer buffers are flat arrays in the CPU Network's order, so a
// checkpoint from either engine loads in the other.
//
// The pass is planned from the host Network's layers (LayerSpec): shapes, kernels and buffer
// sizes come from there, so a network the CPU engine runs runs here too (max-pool 2x2 only).
// Every kernel goes through launchKernel (gpu_runtime.h) and uses no shared memory, so this
// same file also compiles against the host emulation and runs in CI on a CPU (docs/mnist.md).
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "examples/mnist/gpu_engine.h"
#include "examples/mnist/gpu_runtime.h"
#include "examples/mnist/network.h"
#include "examples/mnist/sample_math.h"
#include "rendezvous/store.h"

namespace cpprun::mnist {
namespace {

class GpuError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw GpuError(std::string(what) + ": " + cudaGetErrorString(e));
}
void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    throw GpuError(std::string(what) + ": cuBLAS status " + std::to_string(static_cast<int>(s)));
  }
}
void check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw GpuError(std::string(what) + ": " + ncclGetErrorString(r));
}

constexpr int kThreads = 256;
inline unsigned blocksFor(size_t n) {
  return static_cast<unsigned>(std::min<size_t>((n + kThreads - 1) / kThreads, 65535u * 16));
}

// ---- kernels ---------------------------------------------------------------------------------

__global__ void gatherImages(const float* __restrict__ images, const uint8_t* __restrict__ labels,
                             const int* __restrict__ indices, int batch, int image,
                             float* __restrict__ out, int* __restrict__ out_labels) {
  const size_t n = static_cast<size_t>(batch) * image;
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const int b = static_cast<int>(i / image);
    const int e = static_cast<int>(i % image);
    out[i] = images[static_cast<size_t>(indices[b]) * image + e];
    if (e == 0) out_labels[b] = labels[indices[b]];
  }
}

__global__ void copyLabels(const uint8_t* __restrict__ labels, int count, int* __restrict__ out) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) {
    out[i] = labels[i];
  }
}

// colT[(c*k + i)*k + j][b*P + oy*ow + ox] = x[b][c][oy + i][ox + j]
__global__ void im2colT(const float* __restrict__ x, int batch, int channels, int h, int w, int k,
                        float* __restrict__ col) {
  const int oh = h - k + 1;
  const int ow = w - k + 1;
  const int pixels = oh * ow;
  const size_t columns = static_cast<size_t>(batch) * pixels;
  const size_t n = static_cast<size_t>(channels) * k * k * columns;
  for (size_t idx = blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += gridDim.x * blockDim.x) {
    const size_t row = idx / columns;
    const size_t column = idx % columns;
    const int j = static_cast<int>(row % k);
    const int i = static_cast<int>((row / k) % k);
    const int c = static_cast<int>(row / (static_cast<size_t>(k) * k));
    const int b = static_cast<int>(column / pixels);
    const int p = static_cast<int>(column % pixels);
    const int oy = p / ow;
    const int ox = p % ow;
    col[idx] = x[((static_cast<size_t>(b) * channels + c) * h + oy + i) * w + ox + j];
  }
}

// dx[b][c][y][x] = sum over (i, j) with 0 <= y-i < oh, 0 <= x-j < ow of dcolT[(c*k+i)*k+j][b*P +
// (y-i)*ow + (x-j)]
__global__ void col2imT(const float* __restrict__ dcol, int batch, int channels, int h, int w,
                        int k, float* __restrict__ dx) {
  const int oh = h - k + 1;
  const int ow = w - k + 1;
  const int pixels = oh * ow;
  const size_t columns = static_cast<size_t>(batch) * pixels;
  const size_t n = static_cast<size_t>(batch) * channels * h * w;
  for (size_t idx = blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += gridDim.x * blockDim.x) {
    const int x = static_cast<int>(idx % w);
    const int y = static_cast<int>((idx / w) % h);
    const int c = static_cast<int>((idx / (static_cast<size_t>(w) * h)) % channels);
    const int b = static_cast<int>(idx / (static_cast<size_t>(w) * h * channels));
    float sum = 0.0f;
    for (int i = 0; i < k; ++i) {
      const int oy = y - i;
      if (oy < 0 || oy >= oh) continue;
      for (int j = 0; j < k; ++j) {
        const int ox = x - j;
        if (ox < 0 || ox >= ow) continue;
        const size_t row = static_cast<size_t>((c * k + i) * k + j);
        sum += dcol[row * columns + static_cast<size_t>(b) * pixels + oy * ow + ox];
      }
    }
    dx[idx] = sum;
  }
}

// y[b][c][p] = yt[c][b*P + p] + bias[c], through a ReLU when asked
__global__ void convEpilogue(const float* __restrict__ yt, const float* __restrict__ bias,
                             int batch, int channels, int pixels, bool relu,
                             float* __restrict__ y) {
  const size_t n = static_cast<size_t>(batch) * channels * pixels;
  for (size_t idx = blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += gridDim.x * blockDim.x) {
    const int p = static_cast<int>(idx % pixels);
    const int c = static_cast<int>((idx / pixels) % channels);
    const int b = static_cast<int>(idx / (static_cast<size_t>(pixels) * channels));
    const float v = yt[(static_cast<size_t>(c) * batch + b) * pixels + p] + bias[c];
    y[idx] = relu && !(v > 0.0f) ? 0.0f : v;
  }
}

// dyt[c][b*P + p] = dy[b][c][p], or 0 where a fused ReLU cut y[b][c][p] to 0
__global__ void convPrologueBackward(const float* __restrict__ y, const float* __restrict__ dy,
                                     int batch, int channels, int pixels, bool relu,
                                     float* __restrict__ dyt) {
  const size_t n = static_cast<size_t>(batch) * channels * pixels;
  for (size_t idx = blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += gridDim.x * blockDim.x) {
    const int p = static_cast<int>(idx % pixels);
    const int c = static_cast<int>((idx / pixels) % channels);
    const int b = static_cast<int>(idx / (static_cast<size_t>(pixels) * channels));
    dyt[(static_cast<size_t>(c) * batch + b) * pixels + p] =
        relu && !(y[idx] > 0.0f) ? 0.0f : dy[idx];
  }
}

__global__ void fill(float* __restrict__ x, size_t n, float value) {
  for (size_t idx = blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += gridDim.x * blockDim.x) {
    x[idx] = value;
  }
}

// out[c] = sum over rows of a rows x columns matrix (the bias gradient of a linear layer).
__global__ void columnSums(const float* __restrict__ m, int rows, int columns,
                           float* __restrict__ out) {
  for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < columns; c += gridDim.x * blockDim.x) {
    float sum = 0.0f;
    for (int r = 0; r < rows; ++r) sum += m[static_cast<size_t>(r) * columns + c];
    out[c] = sum;
  }
}

// y[b][o] += bias[o], then ReLU when asked.
__global__ void biasActivation(float* __restrict__ y, const float* __restrict__ bias, int batch,
                               int features, bool relu) {
  const size_t n = static_cast<size_t>(batch) * features;
  for (size_t idx = blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += gridDim.x * blockDim.x) {
    const float v = y[idx] + bias[idx % features];
    y[idx] = relu ? (v > 0.0f ? v : 0.0f) : v;
  }
}

__global__ void reluForward(const float* __restrict__ x, float* __restrict__ y, size_t n) {
  for (size_t idx = blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += gridDim.x * blockDim.x) {
    y[idx] = x[idx] > 0.0f ? x[idx] : 0.0f;
  }
}

__global__ void reluBackward(const float* __restrict__ y, float* __restrict__ dy, size_t n) {
  for (size_t idx = blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += gridDim.x * blockDim.x) {
    if (!(y[idx] > 0.0f)) dy[idx] = 0.0f;
  }
}

__global__ void maxPool2x2(const float* __restrict__ x, int planes, int h, int w,
                           float* __restrict__ y, int* __restrict__ argmax) {
  const int oh = h / 2;
  const int ow = w / 2;
  const size_t n = static_cast<size_t>(planes) * oh * ow;
  for (size_t idx = blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += gridDim.x * blockDim.x) {
    const int ox = static_cast<int>(idx % ow);
    const int oy = static_cast<int>((idx / ow) % oh);
    const size_t plane = idx / (static_cast<size_t>(ow) * oh);
    const float* src = x + plane * h * w;
    const int base = 2 * oy * w + 2 * ox;
    // The first maximum in row-major order wins, as on the CPU.
    int where = base;
    float best = src[base];
    if (src[base + 1] > best) {
      best = src[base + 1];
      where = base + 1;
    }
    if (src[base + w] > best) {
      best = src[base + w];
      where = base + w;
    }
    if (src[base + w + 1] > best) {
      best = src[base + w + 1];
      where = base + w + 1;
    }
    y[idx] = best;
    argmax[idx] = where;
  }
}

// Each input pixel belongs to exactly one 2x2 window: a gather, no atomics.
__global__ void maxPool2x2Backward(const float* __restrict__ dy, const int* __restrict__ argmax,
                                   int planes, int h, int w, float* __restrict__ dx) {
  const int ow = w / 2;
  const int oh = h / 2;
  const size_t n = static_cast<size_t>(planes) * h * w;
  for (size_t idx = blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += gridDim.x * blockDim.x) {
    const int x = static_cast<int>(idx % w);
    const int y = static_cast<int>((idx / w) % h);
    const size_t plane = idx / (static_cast<size_t>(w) * h);
    const size_t out = plane * oh * ow + (y / 2) * ow + (x / 2);
    dx[idx] = (argmax[out] == y * w + x) ? dy[out] : 0.0f;
  }
}

__global__ void dropoutForward(const float* __restrict__ x, float* __restrict__ y,
                               float* __restrict__ scale, const uint64_t* __restrict__ keys,
                               int batch, int per_sample, float probability, uint64_t salt) {
  const size_t n = static_cast<size_t>(batch) * per_sample;
  for (size_t idx = blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += gridDim.x * blockDim.x) {
    const int b = static_cast<int>(idx / per_sample);
    const uint64_t e = idx % per_sample;
    const float s = dropoutScale(keys[b], salt, e, probability);
    scale[idx] = s;
    y[idx] = x[idx] * s;
  }
}

__global__ void scaleInPlace(float* __restrict__ x, const float* __restrict__ scale, size_t n) {
  for (size_t idx = blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += gridDim.x * blockDim.x) {
    x[idx] *= scale[idx];
  }
}

// One thread per sample: loss, correctness and (when dlogits) d(mean loss)/d(logits).
__global__ void logSoftmaxNll(const float* __restrict__ logits, const int* __restrict__ labels,
                              int batch, int classes, float* __restrict__ dlogits,
                              float* __restrict__ losses, int* __restrict__ correct) {
  for (int b = blockIdx.x * blockDim.x + threadIdx.x; b < batch; b += gridDim.x * blockDim.x) {
    int best = 0;
    losses[b] = static_cast<float>(sampleLogSoftmaxNll(
        logits + static_cast<size_t>(b) * classes, labels[b], classes, batch,
        dlogits == nullptr ? nullptr : dlogits + static_cast<size_t>(b) * classes, &best));
    correct[b] = best == labels[b] ? 1 : 0;
  }
}

__global__ void toBf16(const float* __restrict__ in, __nv_bfloat16* __restrict__ out, size_t n) {
  for (size_t idx = blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += gridDim.x * blockDim.x) {
    out[idx] = __float2bfloat16(in[idx]);
  }
}

__global__ void adadeltaStep(float* p, const float* g, float* square_avg, float* acc_delta,
                             size_t n, float lr) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const float rho = 0.9f;
    const float eps = 1e-6f;
    square_avg[i] = rho * square_avg[i] + (1.0f - rho) * g[i] * g[i];
    const float delta = sqrtf(acc_delta[i] + eps) / sqrtf(square_avg[i] + eps) * g[i];
    acc_delta[i] = rho * acc_delta[i] + (1.0f - rho) * delta * delta;
    p[i] -= lr * delta;
  }
}

__global__ void sgdStep(float* p, const float* g, float* buf, size_t n, float lr, bool first) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    buf[i] = first ? g[i] : 0.9f * buf[i] + g[i];
    p[i] -= lr * buf[i];
  }
}

__global__ void adamwStep(float* p, const float* g, float* m, float* v, size_t n, float lr,
                          float bias1, float bias2_sqrt) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    p[i] *= 1.0f - lr * 0.01f;
    m[i] = 0.9f * m[i] + 0.1f * g[i];
    v[i] = 0.999f * v[i] + 0.001f * g[i] * g[i];
    p[i] -= (lr / bias1) * m[i] / (sqrtf(v[i]) / bias2_sqrt + 1e-8f);
  }
}

// ---- device memory -----------------------------------------------------------------------------

template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(size_t n) { resize(n); }
  ~DeviceArray() {
    if (data_ != nullptr) cudaFree(data_);
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  void resize(size_t n) {
    if (n <= capacity_) {
      size_ = n;
      return;
    }
    if (data_ != nullptr) cudaFree(data_);
    data_ = nullptr;
    check(cudaMalloc(&data_, n * sizeof(T)), "cudaMalloc");
    capacity_ = size_ = n;
  }
  void upload(const T* host, size_t n, cudaStream_t stream) {
    resize(n);
    check(cudaMemcpyAsync(data_, host, n * sizeof(T), cudaMemcpyHostToDevice, stream),
          "cudaMemcpyAsync to device");
  }
  std::vector<T> download(cudaStream_t stream) const {
    std::vector<T> host(size_);
    check(cudaMemcpyAsync(host.data(), data_, size_ * sizeof(T), cudaMemcpyDeviceToHost, stream),
          "cudaMemcpyAsync to host");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    return host;
  }
  void zero(cudaStream_t stream) {
    check(cudaMemsetAsync(data_, 0, size_ * sizeof(T), stream), "cudaMemsetAsync");
  }
  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  T* data_ = nullptr;
  size_t size_ = 0;
  size_t capacity_ = 0;
};

// Empty unless `hex` is an even number of hexadecimal digits.
std::vector<uint8_t> hexToBytes(const std::string& hex) {
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::vector<uint8_t> out;
  if (hex.size() % 2 != 0) return {};
  for (size_t i = 0; i < hex.size(); i += 2) {
    const int hi = digit(hex[i]);
    const int lo = digit(hex[i + 1]);
    if (hi < 0 || lo < 0) return {};
    out.push_back(static_cast<uint8_t>(hi * 16 + lo));
  }
  return out;
}

ncclUniqueId ncclIdFor(Communicator& comm) {
  ncclUniqueId id;
  const char* hex = std::getenv("CPPRUN_NCCL_UNIQUE_ID");
  if (hex != nullptr) {
    std::vector<uint8_t> bytes = hexToBytes(hex);
    if (bytes.size() != sizeof(id.internal)) {
      throw GpuError("CPPRUN_NCCL_UNIQUE_ID holds " + std::to_string(bytes.size()) +
                     " bytes, NCCL's id has " + std::to_string(sizeof(id.internal)));
    }
    std::memcpy(id.internal, bytes.data(), bytes.size());
    return id;
  }
  auto store = comm.store();
  if (comm.worldSize() == 1 || store == nullptr) {
    check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    return id;
  }
  const std::string key = comm.keyPrefix() + "nccl_unique_id";
  if (comm.rank() == 0) {
    check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    store->set(key, rendezvous::Bytes(id.internal, id.internal + sizeof(id.internal)));
  } else {
    rendezvous::Bytes bytes = store->get(key);
    if (bytes.size() != sizeof(id.internal)) throw GpuError("bad NCCL id in the store");
    std::memcpy(id.internal, bytes.data(), bytes.size());
  }
  return id;
}

// CPPRUN_NCCL_UNIQUE_IDS (the agent's ids for ncclCommInitRankScalable, comma-joined, when the
// job is above CPPRUN_NCCL_RANKS_PER_ID ranks); empty when unset.
std::vector<ncclUniqueId> ncclIdsFromEnv() {
  std::vector<ncclUniqueId> ids;
  const char* text = std::getenv("CPPRUN_NCCL_UNIQUE_IDS");
  if (text == nullptr || *text == '\0') return ids;
  std::string list = text;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t comma = std::min(list.find(',', start), list.size());
    std::vector<uint8_t> bytes = hexToBytes(list.substr(start, comma - start));
    ncclUniqueId id;
    if (bytes.size() != sizeof(id.internal)) {
      throw GpuError("CPPRUN_NCCL_UNIQUE_IDS: id " + std::to_string(ids.size()) + " holds " +
                     std::to_string(bytes.size()) + " bytes, NCCL's id has " +
                     std::to_string(sizeof(id.internal)));
    }
    std::memcpy(id.internal, bytes.data(), bytes.size());
    ids.push_back(id);
    start = comma + 1;
  }
  return ids;
}

// ncclCommInitRankScalable, resolved at run time: the trainer may run with a libnccl.so.2 older
// than the nccl.h it was built with (or built with one older than 2.23), so neither the header's
// NCCL_VERSION_CODE nor a link-time reference can say whether the call exists. dlsym finds it in
// the NCCL the process loaded; ncclGetVersion >= 2.23 (where NCCL added it) guards against a
// library that exports the name as an unsupported stub. Null when either fails. `config` is
// NCCL's ncclConfig_t*, passed as null (NCCL's defaults).
using InitRankScalableFn = ncclResult_t (*)(ncclComm_t*, int, int, int, ncclUniqueId*, void*);
InitRankScalableFn findInitRankScalable() {
  constexpr int kScalableSince = 22300;  // NCCL_VERSION(2, 23, 0)
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess || version < kScalableSince) return nullptr;
  return reinterpret_cast<InitRankScalableFn>(::dlsym(RTLD_DEFAULT, "ncclCommInitRankScalable"));
}

// Makes `*comm`: with the agent's ids through ncclCommInitRankScalable when there are several
// and the NCCL has the call, else ncclCommInitRank with the single id (ncclIdFor). Returns how,
// for describe().
std::string initNccl(ncclComm_t* comm, Communicator& world) {
  const std::vector<ncclUniqueId> ids = ncclIdsFromEnv();
  if (ids.size() > 1) {
    if (InitRankScalableFn scalable = findInitRankScalable()) {
      std::vector<ncclUniqueId> mutable_ids = ids;
      check(scalable(comm, world.worldSize(), world.rank(), static_cast<int>(ids.size()),
                     mutable_ids.data(), nullptr),
            "ncclCommInitRankScalable");
      return "ncclCommInitRankScalable with " + std::to_string(ids.size()) + " ids";
    }
  }
  ncclUniqueId id = ncclIdFor(world);
  check(ncclCommInitRank(comm, world.worldSize(), id, world.rank()), "ncclCommInitRank");
  return ids.size() > 1 ? "ncclCommInitRank (this NCCL has no ncclCommInitRankScalable)"
                        : "ncclCommInitRank";
}

// ---- the engine --------------------------------------------------------------------------------

// Owns one CUDA, cuBLAS or NCCL handle and releases it with `Release` (a failure to release at
// teardown has nobody left to tell, so it is ignored).
template <typename Handle, auto Release>
class Owned {
 public:
  Owned() = default;
  ~Owned() {
    if (handle_ != nullptr) Release(handle_);
  }
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  Handle get() const { return handle_; }
  // For the call that creates the handle. REQUIRES: nothing is owned yet.
  Handle* receive() { return &handle_; }

 private:
  Handle handle_ = nullptr;
};

using OwnedStream = Owned<cudaStream_t, cudaStreamDestroy>;
using OwnedEvent = Owned<cudaEvent_t, cudaEventDestroy>;
using OwnedBlas = Owned<cublasHandle_t, cublasDestroy>;
using OwnedNccl = Owned<ncclComm_t, ncclCommDestroy>;

// One step of the device pass: a layer of the host network, with a ReLU that follows a Linear
// folded into it.
struct Step {
  LayerSpec spec;
  size_t layer = 0;          // in the host network
  bool relu = false;         // Conv2d: fused by the layer; Linear: the next layer's ReLU
  size_t param_offset = 0;   // in the flat parameter and gradient buffers
  size_t param_count = 0;    // 0: no parameters
  DeviceArray<float> out;    // this step's output (unless it passes its input through)
  DeviceArray<float> scale;  // Dropout: the mask's factors
  DeviceArray<int> argmax;   // MaxPool2d: the winner of each window
};

// Gradients are all-reduced in buckets of about this many floats, in the order backward
// produces them (DDP's bucketing): a bucket's all-reduce runs while earlier layers compute.
constexpr size_t kBucketFloats = size_t{1} << 20;

class GpuEngine : public TrainingEngine {
 public:
  GpuEngine(const EngineOptions& options, const IdxDataset& train, const IdxDataset& test,
            Communicator& comm)
      : options_(options), comm_(comm) {
    int devices = 0;
    if (cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess || devices == 0) {
      throw GpuError(std::string("no usable GPU on this host (cudaGetDeviceCount: ") +
                     (e != cudaSuccess ? cudaGetErrorString(e) : "0 devices") + ")");
    }
    if (options.device >= devices) {
      throw GpuError("CUDA device " + std::to_string(options.device) + " requested, " +
                     std::to_string(devices) + " visible");
    }
    check(cudaSetDevice(options.device), "cudaSetDevice");
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, options.device), "cudaGetDeviceProperties");
    device_name_ = prop.name;
    check(cudaStreamCreateWithFlags(compute_.receive(), cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaStreamCreateWithFlags(communication_.receive(), cudaStreamNonBlocking),
          "cudaStreamCreate");
    check(cudaEventCreateWithFlags(bucket_ready_.receive(), cudaEventDisableTiming),
          "cudaEventCreate");
    check(cudaEventCreateWithFlags(grads_reduced_.receive(), cudaEventDisableTiming),
          "cudaEventCreate");
    check(cublasCreate(blas_.receive()), "cublasCreate");
    check(cublasSetStream(blas_.get(), compute_.get()), "cublasSetStream");

    // The host network gives the layers, the layout (offsets) and PyTorch's initialisation.
    Result<std::unique_ptr<Network>> net = Network::create(options.model);
    if (!net.isOk()) throw GpuError(net.status().message());
    host_net_ = std::move(net.value());
    host_net_->initialize(options.seed);
    planSteps();
    const size_t n = host_net_->parameterCount();
    params_.upload(host_net_->parameters().data(), n, stream());
    grads_.resize(n);
    grads_.zero(stream());
    const size_t buffers = options.optimizer == "sgd" ? 1 : 2;
    for (size_t b = 0; b < buffers; ++b) {
      optimizer_buffers_.emplace_back(new DeviceArray<float>(n));
      optimizer_buffers_.back()->zero(stream());
    }

    const std::vector<float> train_images = normalizeImages(train);
    const std::vector<float> test_images = normalizeImages(test);
    train_images_.upload(train_images.data(), train_images.size(), stream());
    test_images_.upload(test_images.data(), test_images.size(), stream());
    train_labels_.upload(train.labels.data(), train.labels.size(), stream());
    test_labels_.upload(test.labels.data(), test.labels.size(), stream());
    test_labels_int_.resize(test.labels.size());
    launchKernel(copyLabels, blocksFor(test.labels.size()), kThreads, stream(), test_labels_.data(),
                 static_cast<int>(test.labels.size()), test_labels_int_.data());
    check(cudaGetLastError(), "copyLabels");
    check(cudaStreamSynchronize(stream()), "upload");

    nccl_init_ = initNccl(nccl_.receive(), comm);
  }

  std::string describe() const override {
    int nccl_version = 0;
    ncclGetVersion(&nccl_version);
    return "GPU " + std::to_string(options_.device) + " (" + device_name_ + "), cuBLAS " +
           (options_.bf16 ? "bf16" : "fp32") + ", NCCL " + std::to_string(nccl_version) + " (" +
           nccl_init_ + "), dataset on the device";
  }
  size_t parameterCount() const override { return params_.size(); }
  std::vector<float> parameters() override { return params_.download(stream()); }
  std::vector<float> gradients() override { return grads_.download(stream()); }
  void setParameters(const std::vector<float>& p) override {
    params_.upload(p.data(), p.size(), stream());
    check(cudaStreamSynchronize(stream()), "upload parameters");
  }
  OptimizerState optimizerState() override {
    OptimizerState s;
    s.steps = steps_;
    for (auto& b : optimizer_buffers_) s.buffers.push_back(b->download(stream()));
    return s;
  }
  Status setOptimizerState(const OptimizerState& state) override {
    if (state.buffers.size() != optimizer_buffers_.size()) {
      return invalidArgument("optimizer state has " + std::to_string(state.buffers.size()) +
                             " buffers, " + options_.optimizer + " keeps " +
                             std::to_string(optimizer_buffers_.size()));
    }
    for (size_t b = 0; b < state.buffers.size(); ++b) {
      if (state.buffers[b].size() != params_.size()) return invalidArgument("buffer size");
      optimizer_buffers_[b]->upload(state.buffers[b].data(), state.buffers[b].size(), stream());
    }
    steps_ = state.steps;
    check(cudaStreamSynchronize(stream()), "upload optimizer state");
    return Status::ok();
  }

  void trainStep(const std::vector<int>& indices, const std::vector<uint64_t>& keys,
                 float lr) override {
    const int batch = static_cast<int>(indices.size());
    const int image = host_net_->inputShape().size();
    const int classes = host_net_->classes();
    indices_.upload(indices.data(), indices.size(), stream());
    keys_.upload(keys.data(), keys.size(), stream());
    input_.resize(static_cast<size_t>(batch) * image);
    labels_.resize(batch);
    launchKernel(gatherImages, blocksFor(input_.size()), kThreads, stream(), train_images_.data(),
                 train_labels_.data(), indices_.data(), batch, image, input_.data(),
                 labels_.data());
    const float* logits = forward(input_.data(), batch, true);
    dlogits_.resize(static_cast<size_t>(batch) * classes);
    losses_.resize(batch);
    correct_.resize(batch);
    launchKernel(logSoftmaxNll, blocksFor(batch), kThreads, stream(), logits, labels_.data(), batch,
                 classes, dlogits_.data(), losses_.data(), correct_.data());
    backward(batch);
    step(lr);
    loss_pending_ = true;
  }

  double lastLoss() override {
    if (loss_pending_) {
      const std::vector<float> losses = losses_.download(stream());
      last_loss_ = 0.0;
      for (float l : losses) last_loss_ += l;
      last_loss_ /= static_cast<double>(losses.size());
      loss_pending_ = false;
    }
    return last_loss_;
  }

  std::pair<double, int64_t> evaluate(int begin, int end) override {
    lastLoss();  // evaluation reuses the loss buffer
    double loss_sum = 0.0;
    int64_t correct = 0;
    const int chunk = std::min(options_.test_batch_size, 512);
    const size_t image = static_cast<size_t>(host_net_->inputShape().size());
    for (int start = begin; start < end; start += chunk) {
      const int batch = std::min(chunk, end - start);
      const float* logits = forward(test_images_.data() + start * image, batch, false);
      losses_.resize(batch);
      correct_.resize(batch);
      launchKernel(logSoftmaxNll, blocksFor(batch), kThreads, stream(), logits,
                   test_labels_int_.data() + start, batch, host_net_->classes(), nullptr,
                   losses_.data(), correct_.data());
      for (float l : losses_.download(stream())) loss_sum += l;
      for (int c : correct_.download(stream())) correct += c;
    }
    return {loss_sum, correct};
  }

  std::vector<float> testLogits(int begin, int end) override {
    const size_t image = static_cast<size_t>(host_net_->inputShape().size());
    const float* logits = forward(test_images_.data() + begin * image, end - begin, false);
    std::vector<float> host(static_cast<size_t>(end - begin) * host_net_->classes());
    check(cudaMemcpyAsync(host.data(), logits, host.size() * sizeof(float), cudaMemcpyDeviceToHost,
                          stream()),
          "cudaMemcpyAsync to host");
    check(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
    return host;
  }

 private:
  cudaStream_t stream() const { return compute_.get(); }

  // The device pass, from the host network's layers: one step per layer, except that a ReLU
  // right after a Linear runs inside the Linear's epilogue.
  void planSteps() {
    const auto& layers = host_net_->layers();
    for (size_t i = 0; i < layers.size(); ++i) {
      const LayerSpec spec = layers[i]->spec();
      if (spec.kind == LayerSpec::Kind::kRelu && !steps_plan_.empty() &&
          steps_plan_.back()->spec.kind == LayerSpec::Kind::kLinear && !steps_plan_.back()->relu) {
        steps_plan_.back()->relu = true;
        continue;
      }
      if (spec.kind == LayerSpec::Kind::kMaxPool2d && spec.kernel != 2) {
        throw GpuError("the GPU engine pools 2x2 windows only, layer " + std::to_string(i) + " (" +
                       layers[i]->name() + ") pools " + std::to_string(spec.kernel));
      }
      auto step = std::make_unique<Step>();
      step->spec = spec;
      step->layer = i;
      step->relu = spec.kind == LayerSpec::Kind::kConv2d && spec.relu;
      step->param_offset = host_net_->parameterOffset(i);
      step->param_count = layers[i]->parameterCount();
      steps_plan_.push_back(std::move(step));
    }
  }

  // Row-major C[M][N] = op(A)[M][K] op(B)[K][N] (+ beta C), in float or bf16 with float sums.
  void gemm(bool trans_a, bool trans_b, int m, int n, int k, const float* a, int lda,
            const float* b, int ldb, float beta, float* c, int ldc, size_t a_size, size_t b_size) {
    const float alpha = 1.0f;
    // Column-major view: C^T = op(B)^T op(A)^T.
    const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (!options_.bf16) {
      check(cublasSgemm(blas_.get(), op_b, op_a, n, m, k, &alpha, b, ldb, a, lda, &beta, c, ldc),
            "cublasSgemm");
      return;
    }
    bf16_a_.resize(a_size);
    bf16_b_.resize(b_size);
    launchKernel(toBf16, blocksFor(a_size), kThreads, stream(), a, bf16_a_.data(), a_size);
    launchKernel(toBf16, blocksFor(b_size), kThreads, stream(), b, bf16_b_.data(), b_size);
    check(cublasGemmEx(blas_.get(), op_b, op_a, n, m, k, &alpha, bf16_b_.data(), CUDA_R_16BF, ldb,
                       bf16_a_.data(), CUDA_R_16BF, lda, &beta, c, CUDA_R_32F, ldc,
                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx (bf16)");
  }

  float* param(const Step& s) { return params_.data() + s.param_offset; }
  float* grad(const Step& s) { return grads_.data() + s.param_offset; }

  // Conv2d (stride 1, no padding) + bias (+ ReLU) over a batch.
  void convForward(Step& s, const float* x, int batch) {
    const Shape in = s.spec.in;
    const Shape out = s.spec.out;
    const int k = s.spec.kernel;
    const int pixels = out.height * out.width;
    const int patch = in.channels * k * k;
    const size_t columns = static_cast<size_t>(batch) * pixels;
    col_.resize(static_cast<size_t>(patch) * columns);
    launchKernel(im2colT, blocksFor(col_.size()), kThreads, stream(), x, batch, in.channels,
                 in.height, in.width, k, col_.data());
    yt_.resize(static_cast<size_t>(out.channels) * columns);
    gemm(false, false, out.channels, static_cast<int>(columns), patch, param(s), patch, col_.data(),
         static_cast<int>(columns), 0.0f, yt_.data(), static_cast<int>(columns),
         static_cast<size_t>(out.channels) * patch, col_.size());
    s.out.resize(static_cast<size_t>(batch) * out.size());
    launchKernel(convEpilogue, blocksFor(s.out.size()), kThreads, stream(), yt_.data(),
                 param(s) + static_cast<size_t>(out.channels) * patch, batch, out.channels, pixels,
                 s.relu, s.out.data());
  }

  // Gradients of a Conv2d step from dy (its output's gradient); dx (its input's) unless null.
  void convBackward(Step& s, const float* x, const float* dy, int batch, float* dx) {
    const Shape in = s.spec.in;
    const Shape out = s.spec.out;
    const int k = s.spec.kernel;
    const int pixels = out.height * out.width;
    const int patch = in.channels * k * k;
    const size_t columns = static_cast<size_t>(batch) * pixels;
    yt_.resize(static_cast<size_t>(out.channels) * columns);
    launchKernel(convPrologueBackward, blocksFor(yt_.size()), kThreads, stream(), s.out.data(), dy,
                 batch, out.channels, pixels, s.relu, yt_.data());
    // dbias[c] = sum of row c of dYt: a product with a vector of ones.
    if (ones_.size() < columns) {
      ones_.resize(columns);
      launchKernel(fill, blocksFor(columns), kThreads, stream(), ones_.data(), columns, 1.0f);
    }
    const float one = 1.0f;
    const float zero = 0.0f;
    check(cublasSgemv(blas_.get(), CUBLAS_OP_T, static_cast<int>(columns), out.channels, &one,
                      yt_.data(), static_cast<int>(columns), ones_.data(), 1, &zero,
                      grad(s) + static_cast<size_t>(out.channels) * patch, 1),
          "cublasSgemv");
    col_.resize(static_cast<size_t>(patch) * columns);
    launchKernel(im2colT, blocksFor(col_.size()), kThreads, stream(), x, batch, in.channels,
                 in.height, in.width, k, col_.data());
    // dW[cout][patch] = dYt[cout][columns] colT^T
    gemm(false, true, out.channels, patch, static_cast<int>(columns), yt_.data(),
         static_cast<int>(columns), col_.data(), static_cast<int>(columns), 0.0f, grad(s), patch,
         yt_.size(), col_.size());
    if (dx == nullptr) return;
    // dcolT[patch][columns] = W^T dYt
    gemm(true, false, patch, static_cast<int>(columns), out.channels, param(s), patch, yt_.data(),
         static_cast<int>(columns), 0.0f, col_.data(), static_cast<int>(columns),
         static_cast<size_t>(out.channels) * patch, yt_.size());
    launchKernel(col2imT, blocksFor(static_cast<size_t>(batch) * in.size()), kThreads, stream(),
                 col_.data(), batch, in.channels, in.height, in.width, k, dx);
  }

  // y[batch][out] = x[batch][in] W^T + b (+ ReLU).
  void linearForward(Step& s, const float* x, int batch) {
    const int in = s.spec.in.size();
    const int out = s.spec.out.size();
    s.out.resize(static_cast<size_t>(batch) * out);
    gemm(false, true, batch, out, in, x, in, param(s), in, 0.0f, s.out.data(), out,
         static_cast<size_t>(batch) * in, static_cast<size_t>(out) * in);
    launchKernel(biasActivation, blocksFor(s.out.size()), kThreads, stream(), s.out.data(),
                 param(s) + static_cast<size_t>(out) * in, batch, out, s.relu);
  }

  // Gradients of a Linear step from dy, which it first masks by its ReLU when it has one.
  void linearBackward(Step& s, const float* x, float* dy, int batch, float* dx) {
    const int in = s.spec.in.size();
    const int out = s.spec.out.size();
    if (s.relu) {
      launchKernel(reluBackward, blocksFor(s.out.size()), kThreads, stream(), s.out.data(), dy,
                   s.out.size());
    }
    // dW[out][in] = dy^T[out][batch] x[batch][in]
    gemm(true, false, out, in, batch, dy, out, x, in, 0.0f, grad(s), in,
         static_cast<size_t>(batch) * out, static_cast<size_t>(batch) * in);
    launchKernel(columnSums, blocksFor(out), kThreads, stream(), dy, batch, out,
                 grad(s) + static_cast<size_t>(out) * in);
    if (dx != nullptr) {
      gemm(false, false, batch, in, out, dy, out, param(s), in, 0.0f, dx, in,
           static_cast<size_t>(batch) * out, static_cast<size_t>(out) * in);
    }
  }

  // Runs the steps over `batch` inputs at x; returns the logits (valid until the next pass).
  const float* forward(const float* x, int batch, bool training) {
    step_inputs_.assign(steps_plan_.size(), nullptr);
    const float* in = x;
    for (size_t i = 0; i < steps_plan_.size(); ++i) {
      Step& s = *steps_plan_[i];
      step_inputs_[i] = in;
      const size_t n = static_cast<size_t>(batch) * s.spec.out.size();
      switch (s.spec.kind) {
        case LayerSpec::Kind::kConv2d:
          convForward(s, in, batch);
          break;
        case LayerSpec::Kind::kLinear:
          linearForward(s, in, batch);
          break;
        case LayerSpec::Kind::kRelu:
          s.out.resize(n);
          launchKernel(reluForward, blocksFor(n), kThreads, stream(), in, s.out.data(), n);
          break;
        case LayerSpec::Kind::kMaxPool2d:
          s.out.resize(n);
          s.argmax.resize(n);
          launchKernel(maxPool2x2, blocksFor(n), kThreads, stream(), in, batch * s.spec.in.channels,
                       s.spec.in.height, s.spec.in.width, s.out.data(), s.argmax.data());
          break;
        case LayerSpec::Kind::kDropout:
          if (!training || s.spec.probability <= 0.0f)
            continue;  // the identity: the next
                       // step reads this input
          s.out.resize(n);
          s.scale.resize(n);
          launchKernel(dropoutForward, blocksFor(n), kThreads, stream(), in, s.out.data(),
                       s.scale.data(), keys_.data(), batch, s.spec.out.size(), s.spec.probability,
                       s.spec.salt);
          break;
      }
      in = s.out.data();
    }
    return in;
  }

  // Back-propagates dlogits_ through the steps, last first, all-reducing the gradients in
  // buckets as they become final.
  void backward(int batch) {
    float* dy = dlogits_.data();
    size_t bucket_floats = 0;
    for (size_t i = steps_plan_.size(); i-- > 0;) {
      Step& s = *steps_plan_[i];
      const float* x = step_inputs_[i];
      // The input's gradient goes to whichever delta buffer does not hold dy; none for the
      // first step (nobody needs the images' gradient).
      DeviceArray<float>& spare = dy == delta_a_.data() ? delta_b_ : delta_a_;
      float* dx = nullptr;
      if (i > 0) {
        spare.resize(static_cast<size_t>(batch) * s.spec.in.size());
        dx = spare.data();
      }
      const size_t n = static_cast<size_t>(batch) * s.spec.out.size();
      switch (s.spec.kind) {
        case LayerSpec::Kind::kConv2d:
          convBackward(s, x, dy, batch, dx);
          break;
        case LayerSpec::Kind::kLinear:
          linearBackward(s, x, dy, batch, dx);
          break;
        case LayerSpec::Kind::kRelu:
          // In place: dx = dy where the output is positive.
          launchKernel(reluBackward, blocksFor(n), kThreads, stream(), s.out.data(), dy, n);
          dx = dy;
          break;
        case LayerSpec::Kind::kMaxPool2d:
          if (dx != nullptr) {
            launchKernel(maxPool2x2Backward,
                         blocksFor(static_cast<size_t>(batch) * s.spec.in.size()), kThreads,
                         stream(), dy, s.argmax.data(), batch * s.spec.in.channels,
                         s.spec.in.height, s.spec.in.width, dx);
          }
          break;
        case LayerSpec::Kind::kDropout:
          // In place: dx = dy * the mask's factors.
          if (s.spec.probability > 0.0f) {
            launchKernel(scaleInPlace, blocksFor(n), kThreads, stream(), dy, s.scale.data(), n);
          }
          dx = dy;
          break;
      }
      if (s.param_count > 0) {
        bucket_floats += s.param_count;
        if (bucket_floats >= kBucketFloats || s.param_offset == 0) {
          reduce(s.param_offset, bucket_floats);
          bucket_floats = 0;
        }
      }
      dy = dx;
    }
  }

  // All-reduces (averages) grads[offset, offset + count) on the communication stream once the
  // compute stream has produced them.
  void reduce(size_t offset, size_t count) {
    check(cudaEventRecord(bucket_ready_.get(), stream()), "cudaEventRecord");
    check(cudaStreamWaitEvent(communication_.get(), bucket_ready_.get(), 0), "cudaStreamWaitEvent");
    check(ncclAllReduce(grads_.data() + offset, grads_.data() + offset, count, ncclFloat, ncclAvg,
                        nccl_.get(), communication_.get()),
          "ncclAllReduce");
  }

  void step(float lr) {
    check(cudaEventRecord(grads_reduced_.get(), communication_.get()), "cudaEventRecord");
    check(cudaStreamWaitEvent(stream(), grads_reduced_.get(), 0), "cudaStreamWaitEvent");
    const size_t n = params_.size();
    const bool first = steps_ == 0;
    ++steps_;
    if (options_.optimizer == "adadelta") {
      launchKernel(adadeltaStep, blocksFor(n), kThreads, stream(), params_.data(), grads_.data(),
                   optimizer_buffers_[0]->data(), optimizer_buffers_[1]->data(), n, lr);
    } else if (options_.optimizer == "sgd") {
      launchKernel(sgdStep, blocksFor(n), kThreads, stream(), params_.data(), grads_.data(),
                   optimizer_buffers_[0]->data(), n, lr, first);
    } else {
      const auto t = static_cast<double>(steps_);
      launchKernel(adamwStep, blocksFor(n), kThreads, stream(), params_.data(), grads_.data(),
                   optimizer_buffers_[0]->data(), optimizer_buffers_[1]->data(), n, lr,
                   static_cast<float>(1.0 - std::pow(0.9, t)),
                   static_cast<float>(std::sqrt(1.0 - std::pow(0.999, t))));
    }
    check(cudaGetLastError(), "optimizer kernel");
  }

  EngineOptions options_;
  Communicator& comm_;
  std::string device_name_;
  // Declared before every device array, so they are released after the arrays are freed.
  OwnedStream compute_;
  OwnedStream communication_;
  OwnedEvent bucket_ready_;
  OwnedEvent grads_reduced_;
  OwnedBlas blas_;
  OwnedNccl nccl_;
  std::string nccl_init_;  // how the communicator was made (describe())
  std::unique_ptr<Network> host_net_;
  std::vector<std::unique_ptr<Step>> steps_plan_;
  std::vector<const float*> step_inputs_;  // of the last forward pass, per step
  int64_t steps_ = 0;
  bool loss_pending_ = false;
  double last_loss_ = 0.0;

  DeviceArray<float> params_;
  DeviceArray<float> grads_;
  std::vector<std::unique_ptr<DeviceArray<float>>> optimizer_buffers_;
  DeviceArray<float> train_images_;
  DeviceArray<float> test_images_;
  DeviceArray<uint8_t> train_labels_;
  DeviceArray<uint8_t> test_labels_;
  DeviceArray<int> test_labels_int_;
  DeviceArray<int> indices_;
  DeviceArray<uint64_t> keys_;
  DeviceArray<float> input_;
  DeviceArray<int> labels_;
  DeviceArray<float> col_;
  DeviceArray<float> yt_;
  DeviceArray<float> ones_;
  DeviceArray<float> dlogits_;
  DeviceArray<float> losses_;
  DeviceArray<int> correct_;
  DeviceArray<float> delta_a_;
  DeviceArray<float> delta_b_;
  DeviceArray<__nv_bfloat16> bf16_a_;
  DeviceArray<__nv_bfloat16> bf16_b_;
};

}  // namespace

Result<std::unique_ptr<TrainingEngine>> makeGpuEngine(const EngineOptions& options,
                                                      const IdxDataset& train,
                                                      const IdxDataset& test, Communicator& comm) {
  try {
    return std::unique_ptr<TrainingEngine>(new GpuEngine(options, train, test, comm));
  } catch (const GpuError& e) {
    return Status(StatusCode::kUnavailable, std::string("--device cuda: ") + e.what());
  } catch (const rendezvous::StoreError& e) {
    return Status(StatusCode::kUnavailable,
                  std::string("--device cuda: sharing NCCL's id: ") + e.what());
  }
}

bool gpuEngineBuilt() { return true; }

int visibleGpuCount() {
  int devices = 0;
  return cudaGetDeviceCount(&devices) == cudaSuccess ? devices : 0;
}

}  // namespace cpprun::mnist
