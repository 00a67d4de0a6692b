// The GPU engine (see gpu_engine.h): cuBLAS and kernels on one device, NCCL between ranks.
//
// Layouts. Activations are NCHW, one sample after another, as on the CPU. A convolution over a
// batch of B images lays out im2col as colT[K][B*P] (K = in_channels*k*k, P = output pixels),
// so that forward is one product Yt[C][B*P] = W[C][K] colT, and backward two: dW = dYt colT^T
// and dcolT = W^T dYt. Small kernels move between Yt and NCHW, fused with the bias and ReLU.
// Parameters, gradients and optimizer buffers are flat arrays in the CPU Network's order, so a
// checkpoint from either engine loads in the other.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "examples/mnist/gpu_engine.h"
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

// y[b][c][p] = relu(yt[c][b*P + p] + bias[c])
__global__ void convEpilogue(const float* __restrict__ yt, const float* __restrict__ bias,
                             int batch, int channels, int pixels, float* __restrict__ y) {
  const size_t n = static_cast<size_t>(batch) * channels * pixels;
  for (size_t idx = blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += gridDim.x * blockDim.x) {
    const int p = static_cast<int>(idx % pixels);
    const int c = static_cast<int>((idx / pixels) % channels);
    const int b = static_cast<int>(idx / (static_cast<size_t>(pixels) * channels));
    const float v = yt[(static_cast<size_t>(c) * batch + b) * pixels + p] + bias[c];
    y[idx] = v > 0.0f ? v : 0.0f;
  }
}

// dyt[c][b*P + p] = y[b][c][p] > 0 ? dy[b][c][p] : 0   (through the fused ReLU)
__global__ void convPrologueBackward(const float* __restrict__ y, const float* __restrict__ dy,
                                     int batch, int channels, int pixels, float* __restrict__ dyt) {
  const size_t n = static_cast<size_t>(batch) * channels * pixels;
  for (size_t idx = blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += gridDim.x * blockDim.x) {
    const int p = static_cast<int>(idx % pixels);
    const int c = static_cast<int>((idx / pixels) % channels);
    const int b = static_cast<int>(idx / (static_cast<size_t>(pixels) * channels));
    dyt[(static_cast<size_t>(c) * batch + b) * pixels + p] = y[idx] > 0.0f ? dy[idx] : 0.0f;
  }
}

// out[r] = sum of row r of a rows x columns matrix (one block per row).
__global__ void rowSums(const float* __restrict__ m, int rows, size_t columns,
                        float* __restrict__ out) {
  __shared__ float partial[kThreads];
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    float sum = 0.0f;
    for (size_t c = threadIdx.x; c < columns; c += blockDim.x) sum += m[r * columns + c];
    partial[threadIdx.x] = sum;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
      if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
      __syncthreads();
    }
    if (threadIdx.x == 0) out[r] = partial[0];
    __syncthreads();
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

__global__ void dropoutForward(float* __restrict__ x, float* __restrict__ scale,
                               const uint64_t* __restrict__ keys, int batch, int per_sample,
                               float probability, uint64_t salt) {
  const size_t n = static_cast<size_t>(batch) * per_sample;
  for (size_t idx = blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += gridDim.x * blockDim.x) {
    const int b = static_cast<int>(idx / per_sample);
    const uint64_t e = idx % per_sample;
    const float s = dropoutScale(keys[b], salt, e, probability);
    scale[idx] = s;
    x[idx] *= s;
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

// ---- the engine --------------------------------------------------------------------------------

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
    check(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaStreamCreateWithFlags(&communication_, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaEventCreateWithFlags(&fc_grads_ready_, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventCreateWithFlags(&grads_reduced_, cudaEventDisableTiming), "cudaEventCreate");
    check(cublasCreate(&blas_), "cublasCreate");
    check(cublasSetStream(blas_, compute_), "cublasSetStream");

    // The host network gives the layout (offsets) and PyTorch's initialisation.
    Result<std::unique_ptr<Network>> net = Network::create(options.model);
    if (!net.isOk()) throw GpuError(net.status().message());
    host_net_ = std::move(net.value());
    host_net_->initialize(options.seed);
    cnn_ = options.model == "cnn";
    for (size_t i = 0; i < host_net_->layers().size(); ++i) {
      if (host_net_->layers()[i]->parameterCount() > 0) {
        offsets_.push_back(host_net_->parameterOffset(i));
      }
    }
    const size_t n = host_net_->parameterCount();
    params_.upload(host_net_->parameters().data(), n, compute_);
    grads_.resize(n);
    grads_.zero(compute_);
    const size_t buffers = options.optimizer == "sgd" ? 1 : 2;
    for (size_t b = 0; b < buffers; ++b) {
      optimizer_buffers_.emplace_back(new DeviceArray<float>(n));
      optimizer_buffers_.back()->zero(compute_);
    }

    const std::vector<float> train_images = normalizeImages(train);
    const std::vector<float> test_images = normalizeImages(test);
    train_images_.upload(train_images.data(), train_images.size(), compute_);
    test_images_.upload(test_images.data(), test_images.size(), compute_);
    train_labels_.upload(train.labels.data(), train.labels.size(), compute_);
    test_labels_.upload(test.labels.data(), test.labels.size(), compute_);
    test_labels_int_.resize(test.labels.size());
    copyLabels<<<blocksFor(test.labels.size()), kThreads, 0, compute_>>>(
        test_labels_.data(), static_cast<int>(test.labels.size()), test_labels_int_.data());
    check(cudaGetLastError(), "copyLabels");
    check(cudaStreamSynchronize(compute_), "upload");

    ncclUniqueId id = ncclIdFor(comm);
    check(ncclCommInitRank(&nccl_, comm.worldSize(), id, comm.rank()), "ncclCommInitRank");
  }

  ~GpuEngine() override {
    if (nccl_ != nullptr) ncclCommDestroy(nccl_);
    if (blas_ != nullptr) cublasDestroy(blas_);
    cudaEventDestroy(fc_grads_ready_);
    cudaEventDestroy(grads_reduced_);
    cudaStreamDestroy(compute_);
    cudaStreamDestroy(communication_);
  }

  std::string describe() const override {
    int nccl_version = 0;
    ncclGetVersion(&nccl_version);
    return "GPU " + std::to_string(options_.device) + " (" + device_name_ + "), cuBLAS " +
           (options_.bf16 ? "bf16" : "fp32") + ", NCCL " + std::to_string(nccl_version) +
           ", dataset on the device";
  }
  size_t parameterCount() const override { return params_.size(); }
  std::vector<float> parameters() override { return params_.download(compute_); }
  void setParameters(const std::vector<float>& p) override {
    params_.upload(p.data(), p.size(), compute_);
    check(cudaStreamSynchronize(compute_), "upload parameters");
  }
  OptimizerState optimizerState() override {
    OptimizerState s;
    s.steps = steps_;
    for (auto& b : optimizer_buffers_) s.buffers.push_back(b->download(compute_));
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
      optimizer_buffers_[b]->upload(state.buffers[b].data(), state.buffers[b].size(), compute_);
    }
    steps_ = state.steps;
    check(cudaStreamSynchronize(compute_), "upload optimizer state");
    return Status::ok();
  }

  void trainStep(const std::vector<int>& indices, const std::vector<uint64_t>& keys,
                 float lr) override {
    const int batch = static_cast<int>(indices.size());
    indices_.upload(indices.data(), indices.size(), compute_);
    keys_.upload(keys.data(), keys.size(), compute_);
    input_.resize(static_cast<size_t>(batch) * 784);
    labels_.resize(batch);
    gatherImages<<<blocksFor(input_.size()), kThreads, 0, compute_>>>(
        train_images_.data(), train_labels_.data(), indices_.data(), batch, 784, input_.data(),
        labels_.data());
    forward(input_.data(), batch, true);
    dlogits_.resize(static_cast<size_t>(batch) * 10);
    losses_.resize(batch);
    correct_.resize(batch);
    logSoftmaxNll<<<blocksFor(batch), kThreads, 0, compute_>>>(
        logits(), labels_.data(), batch, 10, dlogits_.data(), losses_.data(), correct_.data());
    backward(batch);
    step(lr);
    loss_pending_ = true;
  }

  double lastLoss() override {
    if (loss_pending_) {
      const std::vector<float> losses = losses_.download(compute_);
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
    for (int start = begin; start < end; start += chunk) {
      const int batch = std::min(chunk, end - start);
      forward(test_images_.data() + static_cast<size_t>(start) * 784, batch, false);
      losses_.resize(batch);
      correct_.resize(batch);
      logSoftmaxNll<<<blocksFor(batch), kThreads, 0, compute_>>>(
          logits(), test_labels_int_.data() + start, batch, 10, nullptr, losses_.data(),
          correct_.data());
      for (float l : losses_.download(compute_)) loss_sum += l;
      for (int c : correct_.download(compute_)) correct += c;
    }
    return {loss_sum, correct};
  }

 private:
  // Row-major C[M][N] = op(A)[M][K] op(B)[K][N] (+ beta C), in float or bf16 with float sums.
  void gemm(bool trans_a, bool trans_b, int m, int n, int k, const float* a, int lda,
            const float* b, int ldb, float beta, float* c, int ldc, size_t a_size, size_t b_size) {
    const float alpha = 1.0f;
    // Column-major view: C^T = op(B)^T op(A)^T.
    const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (!options_.bf16) {
      check(cublasSgemm(blas_, op_b, op_a, n, m, k, &alpha, b, ldb, a, lda, &beta, c, ldc),
            "cublasSgemm");
      return;
    }
    bf16_a_.resize(a_size);
    bf16_b_.resize(b_size);
    toBf16<<<blocksFor(a_size), kThreads, 0, compute_>>>(a, bf16_a_.data(), a_size);
    toBf16<<<blocksFor(b_size), kThreads, 0, compute_>>>(b, bf16_b_.data(), b_size);
    check(cublasGemmEx(blas_, op_b, op_a, n, m, k, &alpha, bf16_b_.data(), CUDA_R_16BF, ldb,
                       bf16_a_.data(), CUDA_R_16BF, lda, &beta, c, CUDA_R_32F, ldc,
                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx (bf16)");
  }

  float* param(size_t layer) { return params_.data() + offsets_[layer]; }
  float* grad(size_t layer) { return grads_.data() + offsets_[layer]; }
  const float* logits() const { return act_[cnn_ ? 4 : 1].data(); }

  // conv (no padding, stride 1) + bias + ReLU over a batch; `layer` indexes offsets_.
  void convForward(size_t layer, const float* x, int batch, int cin, int h, int w, int cout,
                   DeviceArray<float>& y) {
    const int k = 3;
    const int oh = h - k + 1;
    const int ow = w - k + 1;
    const int pixels = oh * ow;
    const int patch = cin * k * k;
    const size_t columns = static_cast<size_t>(batch) * pixels;
    col_.resize(static_cast<size_t>(patch) * columns);
    im2colT<<<blocksFor(col_.size()), kThreads, 0, compute_>>>(x, batch, cin, h, w, k, col_.data());
    yt_.resize(static_cast<size_t>(cout) * columns);
    gemm(false, false, cout, static_cast<int>(columns), patch, param(layer), patch, col_.data(),
         static_cast<int>(columns), 0.0f, yt_.data(), static_cast<int>(columns),
         static_cast<size_t>(cout) * patch, col_.size());
    y.resize(static_cast<size_t>(batch) * cout * pixels);
    convEpilogue<<<blocksFor(y.size()), kThreads, 0, compute_>>>(
        yt_.data(), param(layer) + static_cast<size_t>(cout) * patch, batch, cout, pixels,
        y.data());
  }

  // Gradients of conv `layer`; dx (the input's gradient) unless null.
  void convBackward(size_t layer, const float* x, const DeviceArray<float>& y, const float* dy,
                    int batch, int cin, int h, int w, int cout, float* dx) {
    const int k = 3;
    const int pixels = (h - k + 1) * (w - k + 1);
    const int patch = cin * k * k;
    const size_t columns = static_cast<size_t>(batch) * pixels;
    yt_.resize(static_cast<size_t>(cout) * columns);
    convPrologueBackward<<<blocksFor(yt_.size()), kThreads, 0, compute_>>>(
        y.data(), dy, batch, cout, pixels, yt_.data());
    rowSums<<<cout, kThreads, 0, compute_>>>(yt_.data(), cout, columns,
                                             grad(layer) + static_cast<size_t>(cout) * patch);
    col_.resize(static_cast<size_t>(patch) * columns);
    im2colT<<<blocksFor(col_.size()), kThreads, 0, compute_>>>(x, batch, cin, h, w, k, col_.data());
    // dW[cout][patch] = dYt[cout][columns] colT^T
    gemm(false, true, cout, patch, static_cast<int>(columns), yt_.data(), static_cast<int>(columns),
         col_.data(), static_cast<int>(columns), 0.0f, grad(layer), patch, yt_.size(), col_.size());
    if (dx == nullptr) return;
    // dcolT[patch][columns] = W^T dYt
    gemm(true, false, patch, static_cast<int>(columns), cout, param(layer), patch, yt_.data(),
         static_cast<int>(columns), 0.0f, col_.data(), static_cast<int>(columns),
         static_cast<size_t>(cout) * patch, yt_.size());
    col2imT<<<blocksFor(static_cast<size_t>(batch) * cin * h * w), kThreads, 0, compute_>>>(
        col_.data(), batch, cin, h, w, k, dx);
  }

  // y[batch][out] = x[batch][in] W^T + b (ReLU when asked).
  void linearForward(size_t layer, const float* x, int batch, int in, int out, bool relu,
                     DeviceArray<float>& y) {
    y.resize(static_cast<size_t>(batch) * out);
    gemm(false, true, batch, out, in, x, in, param(layer), in, 0.0f, y.data(), out,
         static_cast<size_t>(batch) * in, static_cast<size_t>(out) * in);
    biasActivation<<<blocksFor(y.size()), kThreads, 0, compute_>>>(
        y.data(), param(layer) + static_cast<size_t>(out) * in, batch, out, relu);
  }

  void linearBackward(size_t layer, const float* x, const float* dy, int batch, int in, int out,
                      float* dx) {
    // dW[out][in] = dy^T[out][batch] x[batch][in]
    gemm(true, false, out, in, batch, dy, out, x, in, 0.0f, grad(layer), in,
         static_cast<size_t>(batch) * out, static_cast<size_t>(batch) * in);
    columnSums<<<blocksFor(out), kThreads, 0, compute_>>>(
        dy, batch, out, grad(layer) + static_cast<size_t>(out) * in);
    if (dx != nullptr) {
      gemm(false, false, batch, in, out, dy, out, param(layer), in, 0.0f, dx, in,
           static_cast<size_t>(batch) * out, static_cast<size_t>(out) * in);
    }
  }

  // act_: cnn: 0 conv1, 1 conv2, 2 pool(+dropout1), 3 fc1(+dropout2), 4 logits;
  //       mlp: 0 fc1, 1 logits.
  void forward(const float* x, int batch, bool training) {
    if (!cnn_) {
      linearForward(0, x, batch, 784, 128, true, act_[0]);
      linearForward(1, act_[0].data(), batch, 128, 10, false, act_[1]);
      input_ptr_ = x;
      return;
    }
    input_ptr_ = x;
    convForward(0, x, batch, 1, 28, 28, 32, act_[0]);
    convForward(1, act_[0].data(), batch, 32, 26, 26, 64, act_[1]);
    act_[2].resize(static_cast<size_t>(batch) * 9216);
    argmax_.resize(act_[2].size());
    maxPool2x2<<<blocksFor(act_[2].size()), kThreads, 0, compute_>>>(
        act_[1].data(), batch * 64, 24, 24, act_[2].data(), argmax_.data());
    if (training) {
      scale1_.resize(act_[2].size());
      dropoutForward<<<blocksFor(act_[2].size()), kThreads, 0, compute_>>>(
          act_[2].data(), scale1_.data(), keys_.data(), batch, 9216, 0.25f, 1);
    }
    linearForward(2, act_[2].data(), batch, 9216, 128, true, act_[3]);
    if (training) {
      scale2_.resize(act_[3].size());
      dropoutForward<<<blocksFor(act_[3].size()), kThreads, 0, compute_>>>(
          act_[3].data(), scale2_.data(), keys_.data(), batch, 128, 0.5f, 2);
    }
    linearForward(3, act_[3].data(), batch, 128, 10, false, act_[4]);
  }

  void backward(int batch) {
    if (!cnn_) {
      delta_a_.resize(static_cast<size_t>(batch) * 128);
      linearBackward(1, act_[0].data(), dlogits_.data(), batch, 128, 10, delta_a_.data());
      reluBackward<<<blocksFor(delta_a_.size()), kThreads, 0, compute_>>>(
          act_[0].data(), delta_a_.data(), delta_a_.size());
      linearBackward(0, input_ptr_, delta_a_.data(), batch, 784, 128, nullptr);
      reduce(0, params_.size());
      return;
    }
    // fc2
    delta_a_.resize(static_cast<size_t>(batch) * 128);
    linearBackward(3, act_[3].data(), dlogits_.data(), batch, 128, 10, delta_a_.data());
    scaleInPlace<<<blocksFor(delta_a_.size()), kThreads, 0, compute_>>>(
        delta_a_.data(), scale2_.data(), delta_a_.size());
    // Through the ReLU, masked by fc1's output after dropout: where dropout kept an element it
    // has the ReLU's sign, and where it dropped one the gradient is already 0.
    reluBackward<<<blocksFor(delta_a_.size()), kThreads, 0, compute_>>>(
        act_[3].data(), delta_a_.data(), delta_a_.size());
    // fc1
    delta_b_.resize(static_cast<size_t>(batch) * 9216);
    linearBackward(2, act_[2].data(), delta_a_.data(), batch, 9216, 128, delta_b_.data());
    // The fully connected layers' gradients are final: reduce them while the convolutions run.
    reduce(offsets_[2], params_.size() - offsets_[2]);
    scaleInPlace<<<blocksFor(delta_b_.size()), kThreads, 0, compute_>>>(
        delta_b_.data(), scale1_.data(), delta_b_.size());
    delta_a_.resize(static_cast<size_t>(batch) * 64 * 24 * 24);
    maxPool2x2Backward<<<blocksFor(delta_a_.size()), kThreads, 0, compute_>>>(
        delta_b_.data(), argmax_.data(), batch * 64, 24, 24, delta_a_.data());
    delta_b_.resize(static_cast<size_t>(batch) * 32 * 26 * 26);
    convBackward(1, act_[0].data(), act_[1], delta_a_.data(), batch, 32, 26, 26, 64,
                 delta_b_.data());
    convBackward(0, input_ptr_, act_[0], delta_b_.data(), batch, 1, 28, 28, 32, nullptr);
    reduce(0, offsets_[2]);
  }

  // All-reduces (averages) grads[offset, offset + count) on the communication stream once the
  // compute stream has produced them.
  void reduce(size_t offset, size_t count) {
    check(cudaEventRecord(fc_grads_ready_, compute_), "cudaEventRecord");
    check(cudaStreamWaitEvent(communication_, fc_grads_ready_, 0), "cudaStreamWaitEvent");
    check(ncclAllReduce(grads_.data() + offset, grads_.data() + offset, count, ncclFloat, ncclAvg,
                        nccl_, communication_),
          "ncclAllReduce");
  }

  void step(float lr) {
    check(cudaEventRecord(grads_reduced_, communication_), "cudaEventRecord");
    check(cudaStreamWaitEvent(compute_, grads_reduced_, 0), "cudaStreamWaitEvent");
    const size_t n = params_.size();
    const bool first = steps_ == 0;
    ++steps_;
    if (options_.optimizer == "adadelta") {
      adadeltaStep<<<blocksFor(n), kThreads, 0, compute_>>>(params_.data(), grads_.data(),
                                                            optimizer_buffers_[0]->data(),
                                                            optimizer_buffers_[1]->data(), n, lr);
    } else if (options_.optimizer == "sgd") {
      sgdStep<<<blocksFor(n), kThreads, 0, compute_>>>(params_.data(), grads_.data(),
                                                       optimizer_buffers_[0]->data(), n, lr, first);
    } else {
      const auto t = static_cast<double>(steps_);
      adamwStep<<<blocksFor(n), kThreads, 0, compute_>>>(
          params_.data(), grads_.data(), optimizer_buffers_[0]->data(),
          optimizer_buffers_[1]->data(), n, lr, static_cast<float>(1.0 - std::pow(0.9, t)),
          static_cast<float>(std::sqrt(1.0 - std::pow(0.999, t))));
    }
    check(cudaGetLastError(), "optimizer kernel");
  }

  EngineOptions options_;
  Communicator& comm_;
  std::string device_name_;
  cudaStream_t compute_ = nullptr;
  cudaStream_t communication_ = nullptr;
  cudaEvent_t fc_grads_ready_ = nullptr;
  cudaEvent_t grads_reduced_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  ncclComm_t nccl_ = nullptr;
  std::unique_ptr<Network> host_net_;
  bool cnn_ = true;
  std::vector<size_t> offsets_;  // of the layers with parameters
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
  const float* input_ptr_ = nullptr;
  DeviceArray<float> act_[5];
  DeviceArray<int> argmax_;
  DeviceArray<float> scale1_;
  DeviceArray<float> scale2_;
  DeviceArray<float> col_;
  DeviceArray<float> yt_;
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

}  // namespace cpprun::mnist
