#include "examples/mnist/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "examples/mnist/checkpoint.h"
#include "examples/mnist/distributed_sampler.h"
#include "examples/mnist/idx_dataset.h"
#include "examples/mnist/network.h"
#include "examples/mnist/optimizer.h"

namespace cpprun::mnist {
namespace {

using Clock = std::chrono::steady_clock;

// PyTorch's MNIST example normalisation.
constexpr float kMean = 0.1307f;
constexpr float kStd = 0.3081f;

std::vector<float> normalize(const IdxDataset& d) {
  std::vector<float> out(d.pixels.size());
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = (static_cast<float>(d.pixels[i]) / 255.0f - kMean) / kStd;
  }
  return out;
}

uint64_t sampleKey(uint64_t seed, int epoch, int index) {
  uint64_t z = seed * 0xD1B54A32D192ED03ULL + static_cast<uint64_t>(epoch) * 0x9E3779B97F4A7C15ULL +
               static_cast<uint64_t>(index);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// Sums gradient buckets across ranks on its own thread while backward() goes on. Buckets are
// handed over in the same order on every rank (the layer order), which is all gloo needs.
class GradientReducer {
 public:
  GradientReducer(Communicator& comm, float* grads, size_t bucket_floats)
      : comm_(comm), grads_(grads), bucket_floats_(bucket_floats) {
    if (comm_.worldSize() > 1) thread_ = std::thread([this] { loop(); });
  }
  ~GradientReducer() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  // A layer's gradients [offset, offset + count) are final. Layers arrive last to first.
  void ready(size_t offset, size_t count) {
    if (comm_.worldSize() == 1) return;
    pending_begin_ = offset;
    if (pending_end_ == 0) pending_end_ = offset + count;
    if (pending_end_ - pending_begin_ >= bucket_floats_) flush();
  }

  // Hands over what is pending, waits for every bucket, rethrows a communication error.
  void finish() {
    if (comm_.worldSize() == 1) return;
    if (pending_end_ != 0) flush();
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [this] { return queue_.empty() && !busy_; });
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void flush() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.emplace_back(pending_begin_, pending_end_ - pending_begin_);
    }
    cv_.notify_all();
    pending_begin_ = pending_end_ = 0;
  }

  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      auto [offset, count] = queue_.front();
      queue_.pop_front();
      busy_ = true;
      lock.unlock();
      try {
        if (!error_) comm_.allreduceSum(grads_ + offset, count);
      } catch (...) {
        error_ = std::current_exception();
      }
      lock.lock();
      busy_ = false;
      cv_.notify_all();
    }
  }

  Communicator& comm_;
  float* grads_;
  size_t bucket_floats_;
  size_t pending_begin_ = 0;
  size_t pending_end_ = 0;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::pair<size_t, size_t>> queue_;
  bool busy_ = false;
  bool stopping_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

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

Evaluation evaluate(Network& net, const std::vector<float>& images, const IdxDataset& data,
                    int batch_size, Communicator& comm) {
  // Rank r evaluates the contiguous r-th part; the sums are all-reduced.
  const int n = data.count;
  const int begin = static_cast<int>(static_cast<int64_t>(n) * comm.rank() / comm.worldSize());
  const int end = static_cast<int>(static_cast<int64_t>(n) * (comm.rank() + 1) / comm.worldSize());
  const int image = data.imageSize();
  double sums[3] = {0.0, 0.0, 0.0};  // loss sum, correct, count
  PassContext eval;
  for (int start = begin; start < end; start += batch_size) {
    const int batch = std::min(batch_size, end - start);
    const float* logits =
        net.forward(images.data() + static_cast<size_t>(start) * image, batch, eval);
    int correct = 0;
    const double mean = logSoftmaxNllLoss(logits, data.labels.data() + start, batch, net.classes(),
                                          nullptr, &correct);
    sums[0] += mean * batch;
    sums[1] += correct;
    sums[2] += batch;
  }
  comm.allreduceSum(sums, 3);
  Evaluation e;
  e.count = static_cast<int64_t>(sums[2]);
  e.correct = static_cast<int64_t>(sums[1]);
  e.loss = sums[0] / std::max(1.0, sums[2]);
  e.accuracy = 100.0 * sums[1] / std::max(1.0, sums[2]);
  return e;
}

}  // namespace

Result<TrainResult> train(const TrainerOptions& o, Communicator& comm) {
  const bool leader = comm.rank() == 0;
  const int world = comm.worldSize();
  const auto run_start = Clock::now();
  setComputeThreads(o.threads);

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
  const std::vector<float> train_images = normalize(train_data);
  const std::vector<float> test_images = normalize(test_data);

  Result<std::unique_ptr<Network>> created = Network::create(o.model);
  if (!created.isOk()) return created.status();
  Network& net = *created.value();
  Result<std::unique_ptr<Optimizer>> made = makeOptimizer(o.optimizer, net.parameterCount());
  if (!made.isOk()) return made.status();
  Optimizer& optimizer = *made.value();

  net.initialize(o.seed);
  comm.broadcast(net.parameters().data(), net.parameterCount(), 0);

  TrainResult result;
  int start_epoch = 0;
  const std::string latest =
      o.checkpoint_dir.empty() ? std::string() : latestCheckpointPath(o.checkpoint_dir);
  if (o.resume && !latest.empty() && ::access(latest.c_str(), F_OK) == 0) {
    Result<Checkpoint> loaded = loadCheckpoint(latest);
    if (!loaded.isOk()) return loaded.status();
    Checkpoint& c = loaded.value();
    if (c.model != o.model || c.optimizer != o.optimizer ||
        c.parameters.size() != net.parameterCount() ||
        c.optimizer_buffers.size() != optimizer.state().buffers.size()) {
      return invalidArgument("checkpoint " + latest + " holds model " + c.model + " with " +
                             c.optimizer + ", " + std::to_string(c.parameters.size()) +
                             " parameters; this run trains " + o.model + " with " + o.optimizer +
                             " (use another --checkpoint-dir)");
    }
    // Into the existing buffer: the layers hold pointers into it.
    std::copy(c.parameters.begin(), c.parameters.end(), net.parameters().begin());
    optimizer.state().buffers = std::move(c.optimizer_buffers);
    optimizer.state().steps = c.optimizer_steps;
    start_epoch = c.epochs_done;
    result.resumed = true;
    result.steps = c.optimizer_steps;
    if (leader && !o.quiet) {
      std::printf("Resuming from %s: %d epochs done, %lld steps\n", latest.c_str(), c.epochs_done,
                  static_cast<long long>(c.optimizer_steps));
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
  const int image = train_data.imageSize();
  const int per_rank = shardSize(train_data.count, world);
  const int batches = (per_rank + o.batch_size - 1) / o.batch_size;
  std::vector<float> batch_images(static_cast<size_t>(o.batch_size) * image);
  std::vector<uint8_t> batch_labels(o.batch_size);
  std::vector<uint64_t> keys(o.batch_size);
  std::vector<float> dlogits(static_cast<size_t>(o.batch_size) * net.classes());
  // Two buckets for the CNN: the fully connected layers (4.7 MB) while conv2's backward runs,
  // then the convolutions.
  GradientReducer reducer(comm, net.gradients().data(), 1 << 18);
  const float inverse_world = 1.0f / static_cast<float>(world);
  bool stop = false;

  for (int epoch = start_epoch; epoch < o.epochs && !stop; ++epoch) {
    const float lr = stepLrRate(base_lr, o.gamma, o.step_size, epoch);
    const std::vector<int> shard =
        distributedShard(train_data.count, world, comm.rank(), o.seed, epoch);
    const auto epoch_start = Clock::now();
    auto interval_start = epoch_start;
    int64_t images_done = 0;
    for (int b = 0; b < batches && !stop; ++b) {
      const int first = b * o.batch_size;
      const int batch = std::min(o.batch_size, per_rank - first);
      for (int i = 0; i < batch; ++i) {
        const int index = shard[first + i];
        std::copy_n(train_images.data() + static_cast<size_t>(index) * image, image,
                    batch_images.data() + static_cast<size_t>(i) * image);
        batch_labels[i] = train_data.labels[index];
        keys[i] = sampleKey(o.seed, epoch, index);
      }
      PassContext training{true, keys.data()};
      net.zeroGradients();
      const float* logits = net.forward(batch_images.data(), batch, training);
      const double loss = logSoftmaxNllLoss(logits, batch_labels.data(), batch, net.classes(),
                                            dlogits.data(), nullptr);
      net.backward(dlogits.data(), batch,
                   [&reducer](size_t offset, size_t count) { reducer.ready(offset, count); });
      reducer.finish();
      if (world > 1) {
        for (float& g : net.gradients()) g *= inverse_world;
      }
      optimizer.step(net.parameters().data(), net.gradients().data(), net.parameterCount(), lr);
      ++result.steps;
      images_done += batch;
      if (o.max_steps > 0 && result.steps >= o.max_steps) stop = true;

      if (leader && (b % o.log_interval == 0 || b == batches - 1)) {
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
    const double train_seconds = std::chrono::duration<double>(Clock::now() - epoch_start).count();
    result.images_per_second =
        static_cast<double>(images_done) * world / std::max(1e-9, train_seconds);

    const Evaluation eval = evaluate(net, test_images, test_data, o.test_batch_size, comm);
    result.test_loss = eval.loss;
    result.accuracy = eval.accuracy;
    const bool epoch_complete = !stop || images_done == per_rank;
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
                     {"model", o.model},
                     {"optimizer", o.optimizer}});
      if (!o.checkpoint_dir.empty()) {
        Checkpoint c;
        c.model = o.model;
        c.optimizer = o.optimizer;
        c.epochs_done = result.epochs_done;
        c.optimizer_steps = result.steps;
        c.seed = o.seed;
        c.world_size = world;
        c.parameters = net.parameters();
        c.optimizer_buffers = optimizer.state().buffers;
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
