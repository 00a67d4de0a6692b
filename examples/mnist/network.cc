#include "examples/mnist/network.h"

#include <algorithm>

#include "common/check.h"

namespace cpprun::mnist {

const std::vector<std::string>& Network::modelNames() {
  static const std::vector<std::string> names = {"cnn", "mlp"};
  return names;
}

Result<std::unique_ptr<Network>> Network::create(const std::string& model) {
  const Shape image{1, 28, 28};
  std::unique_ptr<Network> net(new Network(model, image));
  if (model == "cnn") {
    net->add(makeConv2d(image, 32, 3, /*relu=*/true));
    net->add(makeConv2d(net->layers_.back()->outputShape(), 64, 3, /*relu=*/true));
    net->add(makeMaxPool2d(net->layers_.back()->outputShape(), 2));
    net->add(makeDropout(net->layers_.back()->outputShape(), 0.25f, 1));
    net->add(makeLinear(net->layers_.back()->outputShape().size(), 128));
    net->add(makeRelu(net->layers_.back()->outputShape()));
    net->add(makeDropout(net->layers_.back()->outputShape(), 0.5f, 2));
    net->add(makeLinear(128, 10));
  } else if (model == "mlp") {
    net->add(makeLinear(image.size(), 128));
    net->add(makeRelu(net->layers_.back()->outputShape()));
    net->add(makeLinear(128, 10));
  } else {
    return invalidArgument("unknown model '" + model + "' (expected cnn or mlp)");
  }
  net->finalize();
  return net;
}

void Network::add(std::unique_ptr<Layer> layer) { layers_.push_back(std::move(layer)); }

void Network::finalize() {
  size_t total = 0;
  for (const auto& layer : layers_) {
    offsets_.push_back(total);
    total += layer->parameterCount();
  }
  params_.assign(total, 0.0f);
  grads_.assign(total, 0.0f);
  for (size_t i = 0; i < layers_.size(); ++i) {
    layers_[i]->bind(params_.data() + offsets_[i], grads_.data() + offsets_[i]);
  }
  activations_.resize(layers_.size());
}

void Network::initialize(uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (auto& layer : layers_) layer->initialize(rng);
}

void Network::setParameters(const std::vector<float>& values) {
  CPPRUN_CHECK(values.size() == params_.size());
  std::copy(values.begin(), values.end(), params_.begin());
}

void Network::zeroGradients() { std::fill(grads_.begin(), grads_.end(), 0.0f); }

const float* Network::forward(const float* input, int batch, const PassContext& context) {
  input_batch_ = input;
  const float* x = input;
  for (size_t i = 0; i < layers_.size(); ++i) {
    activations_[i].resize(static_cast<size_t>(batch) * layers_[i]->outputShape().size());
    layers_[i]->forward(x, activations_[i].data(), batch, context);
    x = activations_[i].data();
  }
  return x;
}

void Network::backward(const float* dlogits, int batch, const GradientsReady& on_gradients_ready) {
  const float* dy = dlogits;
  for (size_t i = layers_.size(); i-- > 0;) {
    const float* x = i == 0 ? input_batch_ : activations_[i - 1].data();
    float* dx = nullptr;
    if (i > 0) {
      std::vector<float>& next = (dy == delta_a_.data()) ? delta_b_ : delta_a_;
      next.resize(static_cast<size_t>(batch) * layers_[i - 1]->outputShape().size());
      dx = next.data();
    }
    layers_[i]->backward(x, activations_[i].data(), dy, dx, batch);
    if (on_gradients_ready && layers_[i]->parameterCount() > 0) {
      on_gradients_ready(offsets_[i], layers_[i]->parameterCount());
    }
    dy = dx;
  }
}

}  // namespace cpprun::mnist
