// Optimizers over a flat parameter array, with PyTorch's update rules and defaults:
//   adadelta  rho 0.9, eps 1e-6 (the MNIST example's choice, with lr 1.0)
//   sgd       momentum 0.9 (heavy ball, the first step seeds the buffer with the gradient)
//   adamw     betas (0.9, 0.999), eps 1e-8, decoupled weight decay 0.01
// and StepLR: lr = base_lr * gamma^(epoch / step_size), computed from the epoch so that a
// resumed run gets the rate an uninterrupted one had.
//
// state() exposes the optimizer's buffers and step count so a checkpoint can save and restore
// them bit for bit.
// Thread safety: one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace cpprun::mnist {

struct OptimizerState {
  int64_t steps = 0;
  std::vector<std::vector<float>> buffers;  // each parameterCount() long
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual std::string name() const = 0;
  // One update of params from grads (both `count` long) at learning rate lr.
  virtual void step(float* params, const float* grads, size_t count, float lr) = 0;
  virtual OptimizerState& state() = 0;
};

// "adadelta", "sgd" or "adamw".
Result<std::unique_ptr<Optimizer>> makeOptimizer(const std::string& name, size_t parameter_count);
// The learning rate each optimizer is used with when none is given.
float defaultLearningRate(const std::string& name);
const std::vector<std::string>& optimizerNames();

float stepLrRate(float base_lr, float gamma, int step_size, int epoch_index);

}  // namespace cpprun::mnist
