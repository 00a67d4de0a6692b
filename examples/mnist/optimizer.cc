#include "examples/mnist/optimizer.h"

#include <algorithm>
#include <cmath>

namespace cpprun::mnist {
namespace {

class Adadelta : public Optimizer {
 public:
  explicit Adadelta(size_t n) { state_.buffers.assign(2, std::vector<float>(n, 0.0f)); }
  std::string name() const override { return "adadelta"; }
  void step(float* params, const float* grads, size_t count, float lr) override {
    constexpr float kRho = 0.9f;
    constexpr float kEps = 1e-6f;
    float* square_avg = state_.buffers[0].data();
    float* acc_delta = state_.buffers[1].data();
    for (size_t i = 0; i < count; ++i) {
      const float g = grads[i];
      square_avg[i] = kRho * square_avg[i] + (1.0f - kRho) * g * g;
      const float delta = std::sqrt(acc_delta[i] + kEps) / std::sqrt(square_avg[i] + kEps) * g;
      acc_delta[i] = kRho * acc_delta[i] + (1.0f - kRho) * delta * delta;
      params[i] -= lr * delta;
    }
    ++state_.steps;
  }
  OptimizerState& state() override { return state_; }

 private:
  OptimizerState state_;
};

class SgdMomentum : public Optimizer {
 public:
  explicit SgdMomentum(size_t n) { state_.buffers.assign(1, std::vector<float>(n, 0.0f)); }
  std::string name() const override { return "sgd"; }
  void step(float* params, const float* grads, size_t count, float lr) override {
    constexpr float kMomentum = 0.9f;
    float* buf = state_.buffers[0].data();
    const bool first = state_.steps == 0;
    for (size_t i = 0; i < count; ++i) {
      buf[i] = first ? grads[i] : kMomentum * buf[i] + grads[i];
      params[i] -= lr * buf[i];
    }
    ++state_.steps;
  }
  OptimizerState& state() override { return state_; }

 private:
  OptimizerState state_;
};

class AdamW : public Optimizer {
 public:
  explicit AdamW(size_t n) { state_.buffers.assign(2, std::vector<float>(n, 0.0f)); }
  std::string name() const override { return "adamw"; }
  void step(float* params, const float* grads, size_t count, float lr) override {
    constexpr float kBeta1 = 0.9f;
    constexpr float kBeta2 = 0.999f;
    constexpr float kEps = 1e-8f;
    constexpr float kWeightDecay = 0.01f;
    ++state_.steps;
    const auto t = static_cast<double>(state_.steps);
    const auto bias1 = static_cast<float>(1.0 - std::pow(kBeta1, t));
    const auto bias2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(kBeta2, t)));
    float* m = state_.buffers[0].data();
    float* v = state_.buffers[1].data();
    for (size_t i = 0; i < count; ++i) {
      const float g = grads[i];
      params[i] *= 1.0f - lr * kWeightDecay;
      m[i] = kBeta1 * m[i] + (1.0f - kBeta1) * g;
      v[i] = kBeta2 * v[i] + (1.0f - kBeta2) * g * g;
      params[i] -= (lr / bias1) * m[i] / (std::sqrt(v[i]) / bias2_sqrt + kEps);
    }
  }
  OptimizerState& state() override { return state_; }

 private:
  OptimizerState state_;
};

}  // namespace

const std::vector<std::string>& optimizerNames() {
  static const std::vector<std::string> names = {"adadelta", "sgd", "adamw"};
  return names;
}

float defaultLearningRate(const std::string& name) {
  if (name == "adadelta") return 1.0f;
  if (name == "sgd") return 0.01f;
  return 1e-3f;
}

Result<std::unique_ptr<Optimizer>> makeOptimizer(const std::string& name, size_t n) {
  if (name == "adadelta") return std::unique_ptr<Optimizer>(new Adadelta(n));
  if (name == "sgd") return std::unique_ptr<Optimizer>(new SgdMomentum(n));
  if (name == "adamw") return std::unique_ptr<Optimizer>(new AdamW(n));
  return invalidArgument("unknown optimizer '" + name + "' (expected adadelta, sgd or adamw)");
}

float stepLrRate(float base_lr, float gamma, int step_size, int epoch_index) {
  return base_lr * static_cast<float>(
                       std::pow(static_cast<double>(gamma), epoch_index / std::max(1, step_size)));
}

}  // namespace cpprun::mnist
