#include "examples/mnist/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "common/progress_file.h"
#include "examples/mnist/checkpoint.h"
#include "examples/mnist/distributed_sampler.h"
#include "examples/mnist/engine.h"
#include "examples/mnist/gpu_engine.h"
#include "examples/mnist/idx_dataset.h"
#include "examples/mnist/sample_math.h"

namespace cpprun::mnist {
namespace {

using Clock = std::chrono::steady_clock;

// The training state a checkpoint holds: `epochs_done` whole epochs plus `batches_done` batches
// of the next one (non-zero only when stopped mid-epoch).
Checkpoint snapshot(const TrainerOptions& o, TrainingEngine& engine, int world, int epochs_done,
                    int batches_done, int64_t steps) {
  Checkpoint c;
  c.model = o.model;
  c.optimizer = o.optimizer;
  c.epochs_done = epochs_done;
  c.batches_done = batches_done;
  c.optimizer_steps = steps;
  c.seed = o.seed;
  c.world_size = world;
  c.parameters = engine.parameters();
  c.optimizer_buffers = engine.optimizerState().buffers;
  return c;
}

uint64_t sampleKey(uint64_t seed, int epoch, int index) {
  return mix64(seed * 0xD1B54A32D192ED03ULL + static_cast<uint64_t>(epoch) * 0x9E3779B97F4A7C15ULL +
               static_cast<uint64_t>(index));
}

class MetricsWriter {
 public:
  explicit MetricsWriter(const std::string& path) {
    if (!path.empty()) out_.open(path, std::ios::app);
  }
  bool failed(const std::string& path) const { return !path.empty() && !out_.is_open(); }
  void write(const nlohmann::json& record) {
    if (!out_.is_open()) return;
    out_ << record.dump() << '\n';
    out_.flush();
  }

 private:
  std::ofstream out_;
};

struct Evaluation {
  double loss = 0.0;
  double accuracy = 0.0;
  int64_t correct = 0;
  int64_t count = 0;
};

// Rank r evaluates the contiguous r-th part of the test set; the sums are all-reduced.
Evaluation evaluate(TrainingEngine& engine, int n, Communicator& comm) {
  const int begin = static_cast<int>(static_cast<int64_t>(n) * comm.rank() / comm.worldSize());
  const int end = static_cast<int>(static_cast<int64_t>(n) * (comm.rank() + 1) / comm.worldSize());
  const auto [loss_sum, correct] = engine.evaluate(begin, end);
  double sums[3] = {loss_sum, static_cast<double>(correct), static_cast<double>(end - begin)};
  comm.allreduceSum(sums, 3);
  Evaluation e;
  e.count = static_cast<int64_t>(sums[2]);
  e.correct = static_cast<int64_t>(sums[1]);
  e.loss = sums[0] / std::max(1.0, sums[2]);
  e.accuracy = 100.0 * sums[1] / std::max(1.0, sums[2]);
  return e;
}

}  // namespace

std::string resolveDevice(const std::string& requested) {
  if (requested != "auto") return requested;
  return gpuEngineBuilt() && visibleGpuCount() > 0 ? "cuda" : "cpu";
}

std::string describeAutoDevice(const std::string& chosen) {
  if (chosen == "cuda") {
    return "CUDA (" + std::to_string(visibleGpuCount()) + " GPU(s) visible to this rank)";
  }
  return gpuEngineBuilt() ? "CPU (this build has the GPU engine, but no GPU is visible)"
                          : "CPU (this build has no GPU engine)";
}

Result<TrainResult> train(const TrainerOptions& o, Communicator& comm) {
  const bool leader = comm.rank() == 0;
  const int world = comm.worldSize();
  const auto run_start = Clock::now();

  Result<IdxDataset> train_set = loadMnistSplit(o.data_dir, "train");
  if (!train_set.isOk()) return train_set.status();
  Result<IdxDataset> test_set = loadMnistSplit(o.data_dir, "t10k");
  if (!test_set.isOk()) return test_set.status();
  const IdxDataset& train_data = train_set.value();
  const IdxDataset& test_data = test_set.value();
  if (train_data.rows != 28 || train_data.cols != 28 || test_data.rows != 28 ||
      test_data.cols != 28) {
    return invalidArgument("the networks take 28x28 images; " + train_data.source + " holds " +
                           std::to_string(train_data.rows) + "x" + std::to_string(train_data.cols));
  }

  EngineOptions engine_options;
  engine_options.model = o.model;
  engine_options.optimizer = o.optimizer;
  engine_options.seed = o.seed;
  engine_options.max_batch = o.batch_size;
  engine_options.test_batch_size = o.test_batch_size;
  engine_options.threads = o.threads;
  engine_options.bf16 = o.bf16;
  engine_options.device = o.cuda_device;
  const std::string device = resolveDevice(o.device);
  if (o.device == "auto" && leader && !o.quiet) {
    std::printf("cpprun-mnist: --device auto: %s\n", describeAutoDevice(device).c_str());
  }
  if (device != "cuda" && o.bf16) {
    return invalidArgument("--bf16 needs the GPU engine (--device " + o.device + " chose " +
                           device + ")");
  }
  Result<std::unique_ptr<TrainingEngine>> made =
      device == "cuda" ? makeGpuEngine(engine_options, train_data, test_data, comm)
                       : makeCpuEngine(engine_options, train_data, test_data, comm);
  if (!made.isOk()) return made.status();
  TrainingEngine& engine = *made.value();
  if (leader && !o.quiet) std::printf("cpprun-mnist: compute: %s\n", engine.describe().c_str());

  // Every rank starts from rank 0's weights, as DDP does.
  std::vector<float> initial = engine.parameters();
  comm.broadcast(initial.data(), initial.size(), 0);
  engine.setParameters(initial);

  if (leader && !o.checkpoint_dir.empty()) {
    if (Status s = makeCheckpointDirectory(o.checkpoint_dir); !s.isOk()) return s;
  }
  TrainResult result;
  int start_epoch = 0;
  int start_batch = 0;  // of start_epoch: non-zero after a mid-epoch (pre-emption) checkpoint
  const std::string latest =
      o.checkpoint_dir.empty() ? std::string() : latestCheckpointPath(o.checkpoint_dir);
  if (o.resume && !latest.empty() && ::access(latest.c_str(), F_OK) == 0) {
    Result<Checkpoint> loaded = loadCheckpoint(latest);
    if (!loaded.isOk()) return loaded.status();
    Checkpoint& c = loaded.value();
    OptimizerState state;
    state.steps = c.optimizer_steps;
    state.buffers = std::move(c.optimizer_buffers);
    if (c.model != o.model || c.optimizer != o.optimizer ||
        c.parameters.size() != engine.parameterCount() || !engine.setOptimizerState(state).isOk()) {
      return invalidArgument("checkpoint " + latest + " holds model " + c.model + " with " +
                             c.optimizer + ", " + std::to_string(c.parameters.size()) +
                             " parameters; this run trains " + o.model + " with " + o.optimizer +
                             " (use another --checkpoint-dir)");
    }
    engine.setParameters(c.parameters);
    start_epoch = c.epochs_done;
    start_batch = c.batches_done;
    result.resumed = true;
    result.steps = c.optimizer_steps;
    if (leader && !o.quiet) {
      std::printf("Resuming from %s: %d epochs and %d batches done, %lld steps\n", latest.c_str(),
                  c.epochs_done, c.batches_done, static_cast<long long>(c.optimizer_steps));
    }
  } else if (o.resume && leader && !o.quiet) {
    std::printf("No checkpoint at %s; starting afresh\n",
                latest.empty() ? "(no --checkpoint-dir)" : latest.c_str());
  }

  MetricsWriter metrics(leader ? o.metrics_path : std::string());
  if (leader && metrics.failed(o.metrics_path)) {
    return invalidArgument("--metrics: cannot open " + o.metrics_path + " for appending");
  }
  const float base_lr = o.learning_rate.value_or(defaultLearningRate(o.optimizer)) *
                        (o.scale_lr ? static_cast<float>(world) : 1.0f);
  const int per_rank = shardSize(train_data.count, world);
  const int batches = (per_rank + o.batch_size - 1) / o.batch_size;
  std::vector<int> indices;
  std::vector<uint64_t> keys;
  bool stop = false;
  // One pwrite per step to $CPPRUN_PROGRESS_FILE, for the launcher's --stall-timeout.
  ProgressReporter progress = ProgressReporter::fromEnvironment();

  for (int epoch = start_epoch; epoch < o.epochs && !stop; ++epoch) {
    const float lr = stepLrRate(base_lr, o.gamma, o.step_size, epoch);
    const std::vector<int> shard =
        distributedShard(train_data.count, world, comm.rank(), o.seed, epoch);
    const auto epoch_start = Clock::now();
    auto interval_start = epoch_start;
    int64_t images_done = 0;
    const int first_batch = epoch == start_epoch ? std::min(start_batch, batches) : 0;
    int next_batch = first_batch;
    for (int b = first_batch; b < batches && !stop; ++b) {
      const int first = b * o.batch_size;
      const int batch = std::min(o.batch_size, per_rank - first);
      indices.assign(shard.begin() + first, shard.begin() + first + batch);
      keys.resize(batch);
      for (int i = 0; i < batch; ++i) keys[i] = sampleKey(o.seed, epoch, indices[i]);
      engine.trainStep(indices, keys, lr);
      ++result.steps;
      progress.bump(static_cast<uint64_t>(result.steps));
      images_done += batch;
      next_batch = b + 1;
      if (o.max_steps > 0 && result.steps >= o.max_steps) stop = true;
      if (o.stop_requested) {
        // Every rank stops after the same step: a signal reaches the ranks at different steps.
        float asked = o.stop_requested() ? 1.0f : 0.0f;
        comm.allreduceSum(&asked, 1);
        if (asked > 0.0f) {
          result.preempted = true;
          stop = true;
          if (leader && !o.checkpoint_dir.empty()) {
            const bool last = b + 1 == batches;
            const Checkpoint c = snapshot(o, engine, world, last ? epoch + 1 : epoch,
                                          last ? 0 : b + 1, result.steps);
            if (Status s = saveCheckpoint(latest, c); !s.isOk()) return s;
            std::printf("Stop requested: checkpoint at epoch %d batch %d/%d (step %lld) in %s\n",
                        epoch + 1, b + 1, batches, static_cast<long long>(result.steps),
                        latest.c_str());
            std::fflush(stdout);
          }
          break;
        }
      }

      if (leader && (b % o.log_interval == 0 || b == batches - 1)) {
        const double loss = engine.lastLoss();
        const auto now = Clock::now();
        const double seconds = std::chrono::duration<double>(now - interval_start).count();
        interval_start = now;
        const int64_t seen =
            std::min<int64_t>(static_cast<int64_t>(first + batch) * world, train_data.count);
        if (!o.quiet) {
          std::printf("Train Epoch: %d [%lld/%d (%.0f%%)]\tLoss: %.6f\n", epoch + 1,
                      static_cast<long long>(seen), train_data.count, 100.0 * (b + 1) / batches,
                      loss);
          std::fflush(stdout);
        }
        metrics.write({{"event", "train"},
                       {"epoch", epoch + 1},
                       {"step", result.steps},
                       {"loss", loss},
                       {"lr", lr},
                       {"seconds_since_last", seconds},
                       {"world_size", world},
                       {"threads", o.threads}});
      }
    }
    if (result.preempted) break;  // no evaluation: the grace time before SIGKILL is short
    const double train_seconds = std::chrono::duration<double>(Clock::now() - epoch_start).count();
    result.images_per_second =
        static_cast<double>(images_done) * world / std::max(1e-9, train_seconds);

    const Evaluation eval = evaluate(engine, test_data.count, comm);
    result.test_loss = eval.loss;
    result.accuracy = eval.accuracy;
    const bool epoch_complete = next_batch == batches;
    if (epoch_complete) result.epochs_done = epoch + 1;
    if (leader) {
      if (!o.quiet) {
        std::printf("\nTest set: Average loss: %.4f, Accuracy: %lld/%lld (%.2f%%)\n\n", eval.loss,
                    static_cast<long long>(eval.correct), static_cast<long long>(eval.count),
                    eval.accuracy);
        std::fflush(stdout);
      }
      metrics.write({{"event", "test"},
                     {"epoch", epoch + 1},
                     {"step", result.steps},
                     {"test_loss", eval.loss},
                     {"accuracy", eval.accuracy},
                     {"images_per_s", result.images_per_second},
                     {"train_seconds", train_seconds},
                     {"elapsed_s", std::chrono::duration<double>(Clock::now() - run_start).count()},
                     {"world_size", world},
                     {"threads", o.threads},
                     {"device", o.device},
                     {"model", o.model},
                     {"optimizer", o.optimizer}});
      if (!o.checkpoint_dir.empty()) {
        const Checkpoint c = snapshot(o, engine, world, result.epochs_done, 0, result.steps);
        // Only whole epochs go to the checkpoint a restart resumes from.
        if (epoch_complete) {
          if (Status s = saveCheckpoint(latest, c); !s.isOk()) return s;
        }
        if (epoch + 1 == o.epochs || stop) {
          if (Status s = saveCheckpoint(o.checkpoint_dir + "/final.ckpt", c); !s.isOk()) return s;
        }
      }
    }
  }
  comm.finish();
  return result;
}

}  // namespace cpprun::mnist
