#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "examples/mnist/engine.h"
#include "examples/mnist/network.h"

namespace cpprun::mnist {
namespace {

// Averages gradient buckets across ranks on its own thread while backward() goes on. Buckets are
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
        if (!error_) {
          comm_.allreduceSum(grads_ + offset, count);
          // The sum becomes DDP's average here, off the compute thread's path.
          const float inverse_world = 1.0f / static_cast<float>(comm_.worldSize());
          for (size_t i = offset; i < offset + count; ++i) grads_[i] *= inverse_world;
        }
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

class CpuEngine : public TrainingEngine {
 public:
  CpuEngine(const EngineOptions& options, const IdxDataset& train, const IdxDataset& test,
            Communicator& comm, std::unique_ptr<Network> net, std::unique_ptr<Optimizer> optimizer)
      : options_(options),
        train_images_(normalizeImages(train)),
        test_images_(normalizeImages(test)),
        train_labels_(train.labels),
        test_labels_(test.labels),
        image_(train.imageSize()),
        net_(std::move(net)),
        optimizer_(std::move(optimizer)),
        // Two buckets for the CNN: the fully connected layers (4.7 MB) while conv2's backward
        // runs, then the convolutions.
        reducer_(comm, net_->gradientData(), 1 << 18) {
    setComputeThreads(options.threads);
    net_->initialize(options.seed);
    batch_images_.resize(static_cast<size_t>(options.max_batch) * image_);
    batch_labels_.resize(options.max_batch);
    dlogits_.resize(static_cast<size_t>(options.max_batch) * net_->classes());
  }

  std::string describe() const override {
    return "CPU, OpenBLAS with " + std::to_string(options_.threads) + " thread(s) per rank";
  }
  size_t parameterCount() const override { return net_->parameterCount(); }
  std::vector<float> parameters() override { return net_->parameters(); }
  void setParameters(const std::vector<float>& p) override { net_->setParameters(p); }
  OptimizerState optimizerState() override { return optimizer_->state(); }
  Status setOptimizerState(const OptimizerState& state) override {
    OptimizerState& mine = optimizer_->state();
    if (state.buffers.size() != mine.buffers.size()) {
      return invalidArgument(optimizer_->name() + " keeps " + std::to_string(mine.buffers.size()) +
                             " buffers, the state has " + std::to_string(state.buffers.size()));
    }
    for (const auto& b : state.buffers) {
      if (b.size() != net_->parameterCount()) return invalidArgument("optimizer buffer size");
    }
    mine = state;
    return Status::ok();
  }

  void trainStep(const std::vector<int>& indices, const std::vector<uint64_t>& keys,
                 float lr) override {
    const int batch = static_cast<int>(indices.size());
    for (int i = 0; i < batch; ++i) {
      std::copy_n(train_images_.data() + static_cast<size_t>(indices[i]) * image_, image_,
                  batch_images_.data() + static_cast<size_t>(i) * image_);
      batch_labels_[i] = train_labels_[indices[i]];
    }
    PassContext training{true, keys.data()};
    net_->zeroGradients();
    const float* logits = net_->forward(batch_images_.data(), batch, training);
    last_loss_ = logSoftmaxNllLoss(logits, batch_labels_.data(), batch, net_->classes(),
                                   dlogits_.data(), nullptr);
    net_->backward(dlogits_.data(), batch,
                   [this](size_t offset, size_t count) { reducer_.ready(offset, count); });
    reducer_.finish();
    optimizer_->step(net_->parameterData(), net_->gradientData(), net_->parameterCount(), lr);
  }

  double lastLoss() override { return last_loss_; }

  std::pair<double, int64_t> evaluate(int begin, int end) override {
    double loss_sum = 0.0;
    int64_t correct = 0;
    PassContext eval;
    for (int start = begin; start < end; start += options_.test_batch_size) {
      const int batch = std::min(options_.test_batch_size, end - start);
      const float* logits =
          net_->forward(test_images_.data() + static_cast<size_t>(start) * image_, batch, eval);
      int hits = 0;
      loss_sum += logSoftmaxNllLoss(logits, test_labels_.data() + start, batch, net_->classes(),
                                    nullptr, &hits) *
                  batch;
      correct += hits;
    }
    return {loss_sum, correct};
  }

  std::vector<float> gradients() override { return net_->gradients(); }

  std::vector<float> testLogits(int begin, int end) override {
    const int batch = end - begin;
    const float* logits = net_->forward(test_images_.data() + static_cast<size_t>(begin) * image_,
                                        batch, PassContext{});
    return std::vector<float>(logits, logits + static_cast<size_t>(batch) * net_->classes());
  }

 private:
  EngineOptions options_;
  std::vector<float> train_images_;
  std::vector<float> test_images_;
  std::vector<uint8_t> train_labels_;
  std::vector<uint8_t> test_labels_;
  int image_;
  std::unique_ptr<Network> net_;
  std::unique_ptr<Optimizer> optimizer_;
  GradientReducer reducer_;
  std::vector<float> batch_images_;
  std::vector<uint8_t> batch_labels_;
  std::vector<float> dlogits_;
  double last_loss_ = 0.0;
};

}  // namespace

std::vector<float> normalizeImages(const IdxDataset& d) {
  // PyTorch's MNIST example normalisation.
  constexpr float kMean = 0.1307f;
  constexpr float kStd = 0.3081f;
  std::vector<float> out(d.pixels.size());
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = (static_cast<float>(d.pixels[i]) / 255.0f - kMean) / kStd;
  }
  return out;
}

Result<std::unique_ptr<TrainingEngine>> makeCpuEngine(const EngineOptions& options,
                                                      const IdxDataset& train,
                                                      const IdxDataset& test, Communicator& comm) {
  Result<std::unique_ptr<Network>> net = Network::create(options.model);
  if (!net.isOk()) return net.status();
  Result<std::unique_ptr<Optimizer>> optimizer =
      makeOptimizer(options.optimizer, net.value()->parameterCount());
  if (!optimizer.isOk()) return optimizer.status();
  return std::unique_ptr<TrainingEngine>(new CpuEngine(
      options, train, test, comm, std::move(net.value()), std::move(optimizer.value())));
}

}  // namespace cpprun::mnist
