// Layers of the trainer's CPU networks: Conv2d, ReLU, MaxPool2d, Dropout, Linear, and the
// log-softmax + negative-log-likelihood loss, with forward and backward passes.
//
// Tensors are float arrays in NCHW order, one sample after another. Every matrix product goes
// to BLAS (OpenBLAS's cblas_sgemm): a convolution lays each image out with im2col and does
// one product forward and two backward; a linear layer is one product each way. What is left
// in loops is linear in the data (bias, activation, pooling, copies).
//
// Dropout draws its mask from a counter-based hash of (the sample's key, the layer, the
// element), not from a generator shared by the batch: a sample gets the same mask whichever
// rank trains it and in whatever batch, which is what makes world size 2 with batch b train
// exactly like world size 1 with batch 2b.
// Thread safety: a layer keeps per-batch state (masks, pooling indices, workspaces); one thread
// at a time per layer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace cpprun::mnist {

struct Shape {
  int channels = 1;
  int height = 1;
  int width = 1;
  int size() const { return channels * height * width; }
};

struct PassContext {
  bool training = false;
  const uint64_t* sample_keys = nullptr;  // one per sample of the batch; needed when training
};

// What a layer computes, for engines that implement the layers themselves (the GPU engine
// builds its kernel sequence and buffer sizes from these, never from literals).
struct LayerSpec {
  enum class Kind { kConv2d, kLinear, kRelu, kMaxPool2d, kDropout };
  Kind kind = Kind::kRelu;
  Shape in;                  // per sample
  Shape out;                 // per sample
  int kernel = 0;            // Conv2d, MaxPool2d: the square window (stride 1 resp. `kernel`)
  bool relu = false;         // Conv2d: a ReLU fused into the output
  float probability = 0.0f;  // Dropout
  uint64_t salt = 0;         // Dropout: tells a network's dropout layers apart
};

class Layer {
 public:
  virtual ~Layer() = default;
  virtual std::string name() const = 0;
  virtual Shape outputShape() const = 0;
  virtual LayerSpec spec() const = 0;
  virtual size_t parameterCount() const { return 0; }
  // Points the layer at its slices of the model's parameter and gradient buffers.
  virtual void bind(float* /*params*/, float* /*grads*/) {}
  // PyTorch's default initialisation: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias.
  virtual void initialize(std::mt19937_64& /*rng*/) {}
  virtual void forward(const float* x, float* y, int batch, const PassContext& context) = 0;
  // Adds this batch's parameter gradients to the gradient buffer; writes dx unless null.
  virtual void backward(const float* x, const float* y, const float* dy, float* dx, int batch) = 0;
};

// With `relu`, the convolution's output goes through a ReLU in the same pass (one sweep over
// the largest activations instead of three).
std::unique_ptr<Layer> makeConv2d(Shape in, int out_channels, int kernel, bool relu = false);
std::unique_ptr<Layer> makeLinear(int in_features, int out_features);
std::unique_ptr<Layer> makeRelu(Shape in);
std::unique_ptr<Layer> makeMaxPool2d(Shape in, int kernel);
// `salt` tells dropout layers of one network apart.
std::unique_ptr<Layer> makeDropout(Shape in, float probability, uint64_t salt);

// Mean over the batch of -log_softmax(logits)[label]. Writes d(loss)/d(logits) into dlogits
// (may be null) and returns the loss; `correct` (may be null) gets the number of argmax hits.
double logSoftmaxNllLoss(const float* logits, const uint8_t* labels, int batch, int classes,
                         float* dlogits, int* correct);

// Sets the BLAS threads of this process.
void setComputeThreads(int threads);
int computeThreads();

}  // namespace cpprun::mnist
