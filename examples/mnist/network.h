// Network: a sequence of layers whose parameters and gradients live in two flat buffers, in
// layer order, so that an optimizer, a checkpoint or an all-reduce sees one array.
//
// Models: "cnn" is PyTorch's MNIST example net (conv 1->32 3x3, ReLU, conv 32->64 3x3, ReLU,
// max-pool 2, dropout 0.25, fc 9216->128, ReLU, dropout 0.5, fc 128->10; 1,199,882 parameters;
// the convolutions' ReLUs are fused into them);
// "mlp" is a small net for quick runs (fc 784->128, ReLU, fc 128->10).
//
// backward() calls on_gradients_ready(offset, count) as soon as a layer's gradients are final,
// last layer first, so that a data-parallel trainer can all-reduce them while the earlier
// layers are still computing (DDP's bucketing).
// Thread safety: one thread at a time; the callback runs on the calling thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "examples/mnist/layers.h"

namespace cpprun::mnist {

class Network {
 public:
  using GradientsReady = std::function<void(size_t offset, size_t count)>;

  // "cnn" or "mlp", for 1x28x28 inputs and 10 classes.
  static Result<std::unique_ptr<Network>> create(const std::string& model);
  static const std::vector<std::string>& modelNames();

  const std::string& model() const { return model_; }
  Shape inputShape() const { return input_; }
  int classes() const { return 10; }
  size_t parameterCount() const { return params_.size(); }
  // The flat buffers never move or resize (the layers point into them), so they are handed out
  // read-only or as element pointers, never as vectors one could assign to.
  const std::vector<float>& parameters() const { return params_; }
  const std::vector<float>& gradients() const { return grads_; }
  float* parameterData() { return params_.data(); }
  float* gradientData() { return grads_.data(); }
  // Copies `values` into the parameters. REQUIRES: values.size() == parameterCount().
  void setParameters(const std::vector<float>& values);
  const std::vector<std::unique_ptr<Layer>>& layers() const { return layers_; }
  // Which slice of the flat buffers layer i owns.
  size_t parameterOffset(size_t layer) const { return offsets_[layer]; }

  void initialize(uint64_t seed);
  void zeroGradients();
  // Returns the logits (batch x classes), valid until the next call.
  const float* forward(const float* input, int batch, const PassContext& context);
  // After forward() with the same batch: back-propagates dlogits, adding to gradients().
  void backward(const float* dlogits, int batch, const GradientsReady& on_gradients_ready = {});

 private:
  Network(std::string model, Shape input) : model_(std::move(model)), input_(input) {}
  void add(std::unique_ptr<Layer> layer);
  void finalize();

  std::string model_;
  Shape input_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<size_t> offsets_;
  std::vector<float> params_;
  std::vector<float> grads_;
  const float* input_batch_ = nullptr;
  std::vector<std::vector<float>> activations_;  // output of each layer
  std::vector<float> delta_a_;
  std::vector<float> delta_b_;
};

}  // namespace cpprun::mnist
