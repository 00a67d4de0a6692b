// The trainer's CNN and optimizers against PyTorch 1.13 (Debian's python3-torch): the same
// parameters and images give the same logits, loss and autograd gradients, and three steps of
// Adadelta, SGD with momentum and AdamW give the same parameters. Needs /usr/bin/python3 with
// torch; without it the test fails.
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "examples/mnist/network.h"
#include "examples/mnist/optimizer.h"
#include "tests/support/test_support.h"
#include "tests/support/training_results.h"

using namespace cpprun::mnist;
using cpprun::testing::ChildProcess;
using cpprun::testing::exitCodeOf;
using cpprun::testing::relativeDistance;
using cpprun::testing::sourcePath;
using cpprun::testing::TempDir;
using namespace std::chrono_literals;

namespace {

template <typename T>
void writeRaw(const std::string& path, const std::vector<T>& v) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(v.data()),
            static_cast<std::streamsize>(sizeof(T) * v.size()));
  REQUIRE(out.good());
}

std::vector<float> readFloats(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

}  // namespace

TEST_CASE("the CNN and optimizers match PyTorch's Net, autograd and torch.optim",
          "[integration][mnist][torch]") {
  TempDir dir;
  auto created = Network::create("cnn");
  REQUIRE(created.isOk());
  Network& net = *created.value();
  REQUIRE(net.parameterCount() == 1199882u);  // as PyTorch's example Net
  net.initialize(11);
  const int batch = 4;
  std::mt19937_64 rng(12);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(batch) * 784);
  for (float& v : x) v = normal(rng);
  std::vector<uint8_t> labels = {3, 1, 4, 1};
  writeRaw(dir.path() + "/params.f32", net.parameters());
  writeRaw(dir.path() + "/x.f32", x);
  writeRaw(dir.path() + "/labels.u8", labels);

  ChildProcess torch({CPPRUN_PYTHON, sourcePath("tests/mnist/torch_reference.py"), dir.path(),
                      std::to_string(batch)});
  auto status = torch.wait(120s);
  REQUIRE(status.has_value());
  INFO(torch.output());
  REQUIRE(exitCodeOf(*status) == 0);

  net.zeroGradients();
  const float* logits = net.forward(x.data(), batch, PassContext{false, nullptr});
  std::vector<float> ours(logits, logits + batch * 10);
  std::vector<float> dlogits(batch * 10);
  const double loss = logSoftmaxNllLoss(logits, labels.data(), batch, 10, dlogits.data(), nullptr);
  net.backward(dlogits.data(), batch);

  // torch returns log-probabilities; ours are logits: compare after log-softmax.
  std::vector<float> log_probs = ours;
  for (int b = 0; b < batch; ++b) {
    float* row = log_probs.data() + b * 10;
    double max = row[0];
    for (int k = 1; k < 10; ++k) max = std::max<double>(max, row[k]);
    double sum = 0.0;
    for (int k = 0; k < 10; ++k) sum += std::exp(row[k] - max);
    for (int k = 0; k < 10; ++k) row[k] = static_cast<float>(row[k] - max - std::log(sum));
  }
  CHECK(relativeDistance(log_probs, readFloats(dir.path() + "/logits.f32")) < 1e-5);
  std::ifstream loss_file(dir.path() + "/loss.txt");
  double torch_loss = 0.0;
  loss_file >> torch_loss;
  CHECK(std::abs(loss - torch_loss) < 1e-5 * std::abs(torch_loss));
  const std::vector<float> torch_grads = readFloats(dir.path() + "/grads.f32");
  CHECK(relativeDistance(net.gradients(), torch_grads) < 1e-5);
  // Layer by layer, so that a wrong layer is named.
  for (size_t layer = 0; layer < net.layers().size(); ++layer) {
    const size_t count = net.layers()[layer]->parameterCount();
    if (count == 0) continue;
    const size_t at = net.parameterOffset(layer);
    INFO("layer " << net.layers()[layer]->name());
    CHECK(
        relativeDistance(
            std::vector<float>(net.gradients().begin() + at, net.gradients().begin() + at + count),
            std::vector<float>(torch_grads.begin() + at, torch_grads.begin() + at + count)) < 1e-4);
  }

  for (const std::string name : {"adadelta", "sgd", "adamw"}) {
    INFO("optimizer " << name);
    auto optimizer = makeOptimizer(name, net.parameterCount());
    REQUIRE(optimizer.isOk());
    std::vector<float> params = readFloats(dir.path() + "/params.f32");
    const std::vector<float> start = params;
    for (int step = 0; step < 3; ++step) {
      optimizer.value()->step(params.data(), torch_grads.data(), params.size(),
                              defaultLearningRate(name));
    }
    const std::vector<float> expected = readFloats(dir.path() + "/" + name + ".f32");
    // Distances relative to how far the parameters moved, not to their size.
    std::vector<float> moved(params.size());
    std::vector<float> expected_moved(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      moved[i] = params[i] - start[i];
      expected_moved[i] = expected[i] - start[i];
    }
    CHECK(relativeDistance(moved, expected_moved) < 1e-4);
  }
}
