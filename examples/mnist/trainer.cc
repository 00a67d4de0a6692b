#include "examples/mnist/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
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
  // Appends to `path`; an empty path writes nothing.
  void open(const std::string& path) {
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

namespace {

Status checkImageShape(const IdxDataset& train_data, const IdxDataset& test_data) {
  if (train_data.rows != 28 || train_data.cols != 28 || test_data.rows != 28 ||
      test_data.cols != 28) {
    return invalidArgument("the networks take 28x28 images; " + train_data.source + " holds " +
                           std::to_string(train_data.rows) + "x" + std::to_string(train_data.cols));
  }
  return Status::ok();
}

// The CPU or the GPU engine, as --device asks. The engine keeps references to the datasets.
Result<std::unique_ptr<TrainingEngine>> makeEngine(const TrainerOptions& o,
                                                   const IdxDataset& train_data,
                                                   const IdxDataset& test_data,
                                                   Communicator& comm) {
  const bool leader = comm.rank() == 0;
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
  if (made.isOk() && leader && !o.quiet) {
    std::printf("cpprun-mnist: compute: %s\n", made.value()->describe().c_str());
  }
  return made;
}

// One rank's training run over a ready engine, in the order a reader follows it:
//   run()            rank 0's weights everywhere, resume(), then per epoch:
//     trainEpoch()   the batches, each followed by stopRequested() (pre-emption) and
//                    logProgress();
//     endEpoch()     evaluation, the test line and metrics, saveEpochCheckpoints().
// Thread safety: one thread (the engine's communication thread is the engine's business).
class TrainingRun {
 public:
  TrainingRun(const TrainerOptions& o, Communicator& comm, const IdxDataset& train_data,
              const IdxDataset& test_data, TrainingEngine& engine, Clock::time_point run_start)
      : o_(o),
        comm_(comm),
        train_data_(train_data),
        test_data_(test_data),
        engine_(engine),
        run_start_(run_start),
        leader_(comm.rank() == 0),
        world_(comm.worldSize()),
        latest_(o.checkpoint_dir.empty() ? std::string() : latestCheckpointPath(o.checkpoint_dir)) {
  }

  Result<TrainResult> run() {
    // Every rank starts from rank 0's weights, as DDP does.
    std::vector<float> initial = engine_.parameters();
    comm_.broadcast(initial.data(), initial.size(), 0);
    engine_.setParameters(initial);

    if (leader_ && !o_.checkpoint_dir.empty()) {
      if (Status s = makeCheckpointDirectory(o_.checkpoint_dir); !s.isOk()) return s;
    }
    if (Status s = resume(); !s.isOk()) return s;
    metrics_.open(leader_ ? o_.metrics_path : std::string());
    if (leader_ && metrics_.failed(o_.metrics_path)) {
      return invalidArgument("--metrics: cannot open " + o_.metrics_path + " for appending");
    }
    base_lr_ = o_.learning_rate.value_or(defaultLearningRate(o_.optimizer)) *
               (o_.scale_lr ? static_cast<float>(world_) : 1.0f);
    per_rank_ = shardSize(train_data_.count, world_);
    batches_ = (per_rank_ + o_.batch_size - 1) / o_.batch_size;
    // One pwrite per step to $CPPRUN_PROGRESS_FILE, for the launcher's --stall-timeout.
    progress_ = ProgressReporter::fromEnvironment();

    for (int epoch = start_epoch_; epoch < o_.epochs && !stop_; ++epoch) {
      Result<EpochTraining> trained = trainEpoch(epoch);
      if (!trained.isOk()) return trained.status();
      if (result_.preempted) break;  // no evaluation: the grace time before SIGKILL is short
      if (Status s = endEpoch(epoch, trained.value()); !s.isOk()) return s;
    }
    comm_.finish();
    return result_;
  }

 private:
  // What one epoch's batches did.
  struct EpochTraining {
    int next_batch = 0;  // batches_ when the epoch ran to its end
    int64_t images = 0;  // this rank's
    double seconds = 0;
  };

  // With --resume (or a restart) and a checkpoint: continue where it ends.
  Status resume() {
    if (o_.resume && !latest_.empty() && ::access(latest_.c_str(), F_OK) == 0) {
      Result<Checkpoint> loaded = loadCheckpoint(latest_);
      if (!loaded.isOk()) return loaded.status();
      Checkpoint& c = loaded.value();
      OptimizerState state;
      state.steps = c.optimizer_steps;
      state.buffers = std::move(c.optimizer_buffers);
      if (c.model != o_.model || c.optimizer != o_.optimizer ||
          c.parameters.size() != engine_.parameterCount() ||
          !engine_.setOptimizerState(state).isOk()) {
        return invalidArgument("checkpoint " + latest_ + " holds model " + c.model + " with " +
                               c.optimizer + ", " + std::to_string(c.parameters.size()) +
                               " parameters; this run trains " + o_.model + " with " +
                               o_.optimizer + " (use another --checkpoint-dir)");
      }
      engine_.setParameters(c.parameters);
      start_epoch_ = c.epochs_done;
      start_batch_ = c.batches_done;
      result_.resumed = true;
      result_.steps = c.optimizer_steps;
      if (leader_ && !o_.quiet) {
        std::printf("Resuming from %s: %d epochs and %d batches done, %lld steps\n",
                    latest_.c_str(), c.epochs_done, c.batches_done,
                    static_cast<long long>(c.optimizer_steps));
      }
    } else if (o_.resume && leader_ && !o_.quiet) {
      std::printf("No checkpoint at %s; starting afresh\n",
                  latest_.empty() ? "(no --checkpoint-dir)" : latest_.c_str());
    }
    return Status::ok();
  }

  // The epoch's batches of this rank's shard, from where a mid-epoch checkpoint left off.
  Result<EpochTraining> trainEpoch(int epoch) {
    const float lr = stepLrRate(base_lr_, o_.gamma, o_.step_size, epoch);
    const std::vector<int> shard =
        distributedShard(train_data_.count, world_, comm_.rank(), o_.seed, epoch);
    const auto epoch_start = Clock::now();
    interval_start_ = epoch_start;
    EpochTraining done;
    const int first_batch = epoch == start_epoch_ ? std::min(start_batch_, batches_) : 0;
    done.next_batch = first_batch;
    for (int b = first_batch; b < batches_ && !stop_; ++b) {
      const int first = b * o_.batch_size;
      const int batch = std::min(o_.batch_size, per_rank_ - first);
      indices_.assign(shard.begin() + first, shard.begin() + first + batch);
      keys_.resize(batch);
      for (int i = 0; i < batch; ++i) keys_[i] = sampleKey(o_.seed, epoch, indices_[i]);
      engine_.trainStep(indices_, keys_, lr);
      ++result_.steps;
      progress_.bump(static_cast<uint64_t>(result_.steps));
      done.images += batch;
      done.next_batch = b + 1;
      if (o_.max_steps > 0 && result_.steps >= o_.max_steps) stop_ = true;
      Result<bool> preempted = stopRequested(epoch, b);
      if (!preempted.isOk()) return preempted.status();
      if (preempted.value()) break;
      logProgress(epoch, b, first + batch, lr);
    }
    done.seconds = std::chrono::duration<double>(Clock::now() - epoch_start).count();
    return done;
  }

  // Pre-emption: true when any rank was asked to stop after batch `b`; rank 0 then saves a
  // mid-epoch checkpoint. Every rank stops after the same step (a signal reaches the ranks at
  // different steps): they agree through one all-reduce.
  Result<bool> stopRequested(int epoch, int b) {
    if (!o_.stop_requested) return false;
    float asked = o_.stop_requested() ? 1.0f : 0.0f;
    comm_.allreduceSum(&asked, 1);
    if (asked <= 0.0f) return false;
    result_.preempted = true;
    stop_ = true;
    if (leader_ && !o_.checkpoint_dir.empty()) {
      const bool last = b + 1 == batches_;
      const Checkpoint c =
          snapshot(o_, engine_, world_, last ? epoch + 1 : epoch, last ? 0 : b + 1, result_.steps);
      if (Status s = saveCheckpoint(latest_, c); !s.isOk()) return s;
      std::printf("Stop requested: checkpoint at epoch %d batch %d/%d (step %lld) in %s\n",
                  epoch + 1, b + 1, batches_, static_cast<long long>(result_.steps),
                  latest_.c_str());
      std::fflush(stdout);
    }
    return true;
  }

  // Rank 0, every --log-interval batches and after the last: PyTorch's progress line and a
  // "train" metrics record. `end` is the end of batch `b` in this rank's shard.
  void logProgress(int epoch, int b, int end, float lr) {
    if (!leader_ || (b % o_.log_interval != 0 && b != batches_ - 1)) return;
    const double loss = engine_.lastLoss();
    const auto now = Clock::now();
    const double seconds = std::chrono::duration<double>(now - interval_start_).count();
    interval_start_ = now;
    const int64_t seen = std::min<int64_t>(static_cast<int64_t>(end) * world_, train_data_.count);
    if (!o_.quiet) {
      std::printf("Train Epoch: %d [%lld/%d (%.0f%%)]\tLoss: %.6f\n", epoch + 1,
                  static_cast<long long>(seen), train_data_.count, 100.0 * (b + 1) / batches_,
                  loss);
      std::fflush(stdout);
    }
    metrics_.write({{"event", "train"},
                    {"epoch", epoch + 1},
                    {"step", result_.steps},
                    {"loss", loss},
                    {"lr", lr},
                    {"seconds_since_last", seconds},
                    {"world_size", world_},
                    {"threads", o_.threads}});
  }

  // After the epoch's batches: evaluate on every rank; rank 0 prints, records and checkpoints.
  Status endEpoch(int epoch, const EpochTraining& trained) {
    result_.images_per_second =
        static_cast<double>(trained.images) * world_ / std::max(1e-9, trained.seconds);
    const Evaluation eval = evaluate(engine_, test_data_.count, comm_);
    result_.test_loss = eval.loss;
    result_.accuracy = eval.accuracy;
    const bool epoch_complete = trained.next_batch == batches_;
    if (epoch_complete) result_.epochs_done = epoch + 1;
    if (!leader_) return Status::ok();
    if (!o_.quiet) {
      std::printf("\nTest set: Average loss: %.4f, Accuracy: %lld/%lld (%.2f%%)\n\n", eval.loss,
                  static_cast<long long>(eval.correct), static_cast<long long>(eval.count),
                  eval.accuracy);
      std::fflush(stdout);
    }
    metrics_.write({{"event", "test"},
                    {"epoch", epoch + 1},
                    {"step", result_.steps},
                    {"test_loss", eval.loss},
                    {"accuracy", eval.accuracy},
                    {"images_per_s", result_.images_per_second},
                    {"train_seconds", trained.seconds},
                    {"elapsed_s", std::chrono::duration<double>(Clock::now() - run_start_).count()},
                    {"world_size", world_},
                    {"threads", o_.threads},
                    {"device", o_.device},
                    {"model", o_.model},
                    {"optimizer", o_.optimizer}});
    return saveEpochCheckpoints(epoch, epoch_complete);
  }

  // Rank 0: latest.ckpt after a whole epoch (what a restart resumes from), final.ckpt after
  // the last epoch or when the run stops early.
  Status saveEpochCheckpoints(int epoch, bool epoch_complete) {
    if (o_.checkpoint_dir.empty()) return Status::ok();
    const Checkpoint c = snapshot(o_, engine_, world_, result_.epochs_done, 0, result_.steps);
    if (epoch_complete) {
      if (Status s = saveCheckpoint(latest_, c); !s.isOk()) return s;
    }
    if (epoch + 1 == o_.epochs || stop_) {
      if (Status s = saveCheckpoint(o_.checkpoint_dir + "/final.ckpt", c); !s.isOk()) return s;
    }
    return Status::ok();
  }

  const TrainerOptions& o_;
  Communicator& comm_;
  const IdxDataset& train_data_;
  const IdxDataset& test_data_;
  TrainingEngine& engine_;
  const Clock::time_point run_start_;
  const bool leader_;
  const int world_;
  const std::string latest_;  // latest.ckpt in --checkpoint-dir; empty without one

  int start_epoch_ = 0;
  int start_batch_ = 0;  // of start_epoch_: non-zero after a mid-epoch (pre-emption) checkpoint
  MetricsWriter metrics_;
  float base_lr_ = 0;
  int per_rank_ = 0;  // samples of this rank's shard per epoch
  int batches_ = 0;   // per epoch
  ProgressReporter progress_{std::string()};
  std::vector<int> indices_;  // of the batch, reused
  std::vector<uint64_t> keys_;
  Clock::time_point interval_start_;  // of the current progress line's interval
  bool stop_ = false;                 // --max-steps reached or pre-empted
  TrainResult result_;
};

}  // namespace

Result<TrainResult> train(const TrainerOptions& o, Communicator& comm) {
  const auto run_start = Clock::now();
  Result<IdxDataset> train_set = loadMnistSplit(o.data_dir, "train");
  if (!train_set.isOk()) return train_set.status();
  Result<IdxDataset> test_set = loadMnistSplit(o.data_dir, "t10k");
  if (!test_set.isOk()) return test_set.status();
  if (Status s = checkImageShape(train_set.value(), test_set.value()); !s.isOk()) return s;
  Result<std::unique_ptr<TrainingEngine>> engine =
      makeEngine(o, train_set.value(), test_set.value(), comm);
  if (!engine.isOk()) return engine.status();
  return TrainingRun(o, comm, train_set.value(), test_set.value(), *engine.value(), run_start)
      .run();
}

}  // namespace cpprun::mnist
