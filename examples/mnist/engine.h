// TrainingEngine: where the trainer's arithmetic happens — the network, its optimizer, the
// dataset in the engine's memory, and the all-reduce of gradients — behind one interface, so
// that the training loop (trainer.cc: epochs, shards, progress, metrics, checkpoints) is the
// same on CPUs and GPUs.
//
// The CPU engine (makeCpuEngine) computes with OpenBLAS and reduces gradients with gloo through
// the Communicator; the GPU engine (gpu_engine.h, built when CUDA and NCCL are found) keeps the
// dataset on the device, computes with cuBLAS and its own kernels and reduces with NCCL.
// Thread safety: one thread at a time; an engine may run its own helper threads or streams.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "examples/mnist/communicator.h"
#include "examples/mnist/idx_dataset.h"
#include "examples/mnist/optimizer.h"

namespace cpprun::mnist {

struct EngineOptions {
  std::string model = "cnn";
  std::string optimizer = "adadelta";
  uint64_t seed = 1;
  int max_batch = 64;  // the largest training batch trainStep will be given
  int test_batch_size = 1000;
  int threads = 1;    // CPU: BLAS threads
  bool bf16 = false;  // GPU: matrix products in bfloat16 with float accumulation
  int device = 0;     // GPU: the CUDA device (an index into CUDA_VISIBLE_DEVICES)
};

class TrainingEngine {
 public:
  virtual ~TrainingEngine() = default;
  virtual std::string describe() const = 0;
  virtual size_t parameterCount() const = 0;
  // Host copies in and out (initial broadcast, checkpoints).
  virtual std::vector<float> parameters() = 0;
  virtual void setParameters(const std::vector<float>& parameters) = 0;
  virtual OptimizerState optimizerState() = 0;
  // Fails when the state does not fit this optimizer (buffer count or sizes).
  virtual Status setOptimizerState(const OptimizerState& state) = 0;
  // One data-parallel step: forward and backward over this rank's training samples `indices`
  // (dropout keyed by `keys`), gradients averaged over every rank, one optimizer step at `lr`.
  // Throws on a communication failure.
  virtual void trainStep(const std::vector<int>& indices, const std::vector<uint64_t>& keys,
                         float lr) = 0;
  // This rank's mean loss in the last trainStep. Asked for only when it is reported, because on
  // a GPU reading it waits for the step to finish.
  virtual double lastLoss() = 0;
  // Test samples [begin, end): the sum of their losses and how many were classified right.
  virtual std::pair<double, int64_t> evaluate(int begin, int end) = 0;
  // For checks that compare engines: the gradients of the last trainStep, averaged over the
  // ranks (what the optimizer used), and the logits of test samples [begin, end) in eval mode
  // (batch-major, classes per sample).
  virtual std::vector<float> gradients() = 0;
  virtual std::vector<float> testLogits(int begin, int end) = 0;
};

// Normalises as PyTorch's MNIST example does: (x / 255 - 0.1307) / 0.3081.
std::vector<float> normalizeImages(const IdxDataset& data);

// `comm` must outlive the engine; the engine uses it for gradients only.
Result<std::unique_ptr<TrainingEngine>> makeCpuEngine(const EngineOptions& options,
                                                      const IdxDataset& train,
                                                      const IdxDataset& test, Communicator& comm);

}  // namespace cpprun::mnist
