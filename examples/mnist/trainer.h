// Trainer: data-parallel training of a Network on an IDX dataset, one rank of a group, the way
// PyTorch's DDP MNIST example does it:
//   - every rank starts from rank 0's initial weights (broadcast);
//   - each epoch, each rank trains on its DistributedSampler shard, in batches;
//   - gradients are summed across ranks in buckets while the backward pass goes on (a
//     communication thread), then divided by the world size; every rank takes the same step;
//   - after each epoch the ranks evaluate disjoint parts of the test set and sum the results;
//     rank 0 prints PyTorch's progress lines, appends JSON metrics and saves a checkpoint.
// A run resumes from the latest checkpoint when asked (TORCHELASTIC_RESTART_COUNT > 0 under
// cpprun, or --resume), so a restarted job continues from the last finished epoch.
// Thread safety: run() owns the calling thread (and one communication thread it starts).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "common/status.h"
#include "examples/mnist/communicator.h"

namespace cpprun::mnist {

struct TrainerOptions {
  std::string data_dir;
  std::string model = "cnn";
  std::string optimizer = "adadelta";
  std::optional<float> learning_rate;  // default: the optimizer's (adadelta 1.0)
  float gamma = 0.7f;                  // StepLR
  int step_size = 1;                   // StepLR, in epochs
  bool scale_lr = false;               // multiply the learning rate by the world size
  int epochs = 14;
  int batch_size = 64;  // per rank
  int test_batch_size = 1000;
  uint64_t seed = 1;
  int log_interval = 10;  // batches between progress lines
  int64_t max_steps = 0;  // stop after this many optimizer steps (0: no limit)
  int threads = 1;        // BLAS threads of this rank
  std::string checkpoint_dir;
  bool resume = false;
  std::string metrics_path;  // JSON lines (rank 0)
  bool quiet = false;        // no progress lines
  // "auto" (CUDA when this build has the GPU engine and the process sees a GPU, else the
  // CPU), "cpu" or "cuda" (builds with CUDA and NCCL).
  std::string device = "auto";
  int cuda_device = 0;  // which visible GPU (cpprun-mnist picks LOCAL_RANK)
  bool bf16 = false;    // GPU: bfloat16 matrix products, float accumulation
  // Polled after every step when set (cpprun-mnist: SIGUSR1, the pre-emption warning, was
  // received). The ranks agree through one all-reduce per step, so they stop after the same
  // step; rank 0 then writes a mid-epoch checkpoint and train() returns with `preempted`.
  std::function<bool()> stop_requested;
};

struct TrainResult {
  int epochs_done = 0;
  int64_t steps = 0;
  double test_loss = 0.0;
  double accuracy = 0.0;           // percent
  double images_per_second = 0.0;  // training images of all ranks per second, last epoch
  bool resumed = false;
  bool preempted = false;  // stopped early by stop_requested; latest.ckpt holds the progress
};

// What `--device` value `requested` means on this machine: "cpu" or "cuda". Every rank decides
// the same way on identical nodes; `auto` never mixes the two engines in a job whose ranks all
// see GPUs.
std::string resolveDevice(const std::string& requested);
// One line for the log: what auto chose and why.
std::string describeAutoDevice(const std::string& chosen);

Result<TrainResult> train(const TrainerOptions& options, Communicator& comm);

}  // namespace cpprun::mnist
