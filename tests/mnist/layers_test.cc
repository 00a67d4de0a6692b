// Gradient checks: every layer's backward pass against central finite differences of its
// forward pass (double-checked on a scalar function L = sum(w_i * y_i) with fixed random w).
#include "examples/mnist/layers.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "examples/mnist/network.h"

using namespace cpprun::mnist;

namespace {

std::vector<float> randomVector(size_t n, std::mt19937_64& rng, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

struct GradientCheck {
  double worst_input = 0.0;
  double worst_parameter = 0.0;
  int checked = 0;
};

// Relative error |a - n| / max(1e-3, |a| + |n|) between analytic and numeric derivatives.
double relError(double analytic, double numeric) {
  return std::abs(analytic - numeric) / std::max(1e-3, std::abs(analytic) + std::abs(numeric));
}

GradientCheck checkLayer(Layer& layer, Shape in, int batch, uint64_t seed, float eps = 1e-2f) {
  const bool training = true;
  std::mt19937_64 rng(seed);
  std::vector<float> params(layer.parameterCount());
  std::vector<float> grads(layer.parameterCount(), 0.0f);
  layer.bind(params.data(), grads.data());
  layer.initialize(rng);
  std::vector<float> x = randomVector(static_cast<size_t>(batch) * in.size(), rng);
  const size_t out_n = static_cast<size_t>(batch) * layer.outputShape().size();
  std::vector<float> weights = randomVector(out_n, rng);
  std::vector<uint64_t> keys(batch);
  for (int b = 0; b < batch; ++b) keys[b] = 1000 + static_cast<uint64_t>(b);
  PassContext context{training, keys.data()};
  std::vector<float> y(out_n);

  auto objective = [&]() {
    layer.forward(x.data(), y.data(), batch, context);
    double sum = 0.0;
    for (size_t i = 0; i < out_n; ++i) sum += static_cast<double>(weights[i]) * y[i];
    return sum;
  };
  objective();
  std::vector<float> dx(x.size());
  layer.backward(x.data(), y.data(), weights.data(), dx.data(), batch);

  GradientCheck result;

  auto numeric = [&](float& value) {
    const float saved = value;
    value = saved + eps;
    const double plus = objective();
    value = saved - eps;
    const double minus = objective();
    value = saved;
    return (plus - minus) / (2.0 * eps);
  };
  // Sample up to 40 coordinates of each, spread over the arrays.
  for (size_t k = 0; k < 40 && k < x.size(); ++k) {
    const size_t i = (k * 7919) % x.size();
    result.worst_input = std::max(result.worst_input, relError(dx[i], numeric(x[i])));
    ++result.checked;
  }
  for (size_t k = 0; k < 40 && k < params.size(); ++k) {
    const size_t i = (k * 104729) % params.size();
    result.worst_parameter =
        std::max(result.worst_parameter, relError(grads[i], numeric(params[i])));
    ++result.checked;
  }
  // The last coordinate too: for conv and linear layers that is a bias.
  if (!params.empty()) {
    const size_t i = params.size() - 1;
    result.worst_parameter =
        std::max(result.worst_parameter, relError(grads[i], numeric(params[i])));
  }
  return result;
}

}  // namespace

TEST_CASE("gradient check: conv2d, input and parameters", "[unit][mnist][gradcheck]") {
  const Shape in{3, 8, 7};
  auto conv = makeConv2d(in, 4, 3);
  CHECK(conv->outputShape().channels == 4);
  CHECK(conv->outputShape().height == 6);
  CHECK(conv->outputShape().width == 5);
  CHECK(conv->parameterCount() == 4u * 27 + 4);
  const GradientCheck g = checkLayer(*conv, in, 2, 1);
  CHECK(g.worst_input < 2e-3);
  CHECK(g.worst_parameter < 2e-3);
  CHECK(g.checked == 80);
}

TEST_CASE("gradient check: conv2d with its fused relu", "[unit][mnist][gradcheck]") {
  const Shape in{2, 6, 6};
  auto conv = makeConv2d(in, 3, 3, /*relu=*/true);
  // A smaller step: a bias moves every output of its channel, and none may cross the kink.
  const GradientCheck g = checkLayer(*conv, in, 2, 21, 3e-3f);
  CHECK(g.worst_input < 2e-3);
  CHECK(g.worst_parameter < 2e-3);
}

TEST_CASE("gradient check: linear", "[unit][mnist][gradcheck]") {
  auto fc = makeLinear(37, 11);
  const GradientCheck g = checkLayer(*fc, {37, 1, 1}, 3, 2);
  CHECK(g.worst_input < 2e-3);
  CHECK(g.worst_parameter < 2e-3);
}

TEST_CASE("gradient check: relu, max-pool, dropout", "[unit][mnist][gradcheck]") {
  const Shape in{2, 6, 6};
  auto relu = makeRelu(in);
  CHECK(checkLayer(*relu, in, 2, 3).worst_input < 2e-3);
  auto pool = makeMaxPool2d(in, 2);
  CHECK(pool->outputShape().height == 3);
  CHECK(checkLayer(*pool, in, 2, 4).worst_input < 2e-3);
  auto dropout = makeDropout(in, 0.5f, 7);
  CHECK(checkLayer(*dropout, in, 2, 5).worst_input < 2e-3);
}

TEST_CASE("dropout: the mask follows the sample, not its place in the batch",
          "[unit][mnist][dropout]") {
  const Shape in{1, 4, 4};
  auto dropout = makeDropout(in, 0.5f, 1);
  std::vector<float> x(32, 1.0f);
  std::vector<float> y(32);
  std::vector<uint64_t> keys = {11, 22};
  dropout->forward(x.data(), y.data(), 2, {true, keys.data()});
  std::vector<float> swapped(32);
  std::vector<uint64_t> swapped_keys = {22, 11};
  dropout->forward(x.data(), swapped.data(), 2, {true, swapped_keys.data()});
  CHECK(std::vector<float>(y.begin(), y.begin() + 16) ==
        std::vector<float>(swapped.begin() + 16, swapped.end()));
  int zeros = 0;
  for (float v : y) {
    CHECK((v == 0.0f || v == 2.0f));
    zeros += v == 0.0f;
  }
  CHECK(zeros > 4);
  CHECK(zeros < 28);
  std::vector<float> eval(32);
  dropout->forward(x.data(), eval.data(), 2, {false, nullptr});
  CHECK(eval == x);
}

TEST_CASE("gradient check: log-softmax + NLL loss", "[unit][mnist][gradcheck]") {
  std::mt19937_64 rng(9);
  std::vector<float> logits = randomVector(3 * 10, rng, 2.0f);
  std::vector<uint8_t> labels = {3, 0, 9};
  std::vector<float> d(logits.size());
  int correct = -1;
  logSoftmaxNllLoss(logits.data(), labels.data(), 3, 10, d.data(), &correct);
  CHECK(correct >= 0);
  for (size_t i = 0; i < logits.size(); ++i) {
    const float saved = logits[i];
    logits[i] = saved + 1e-3f;
    const double plus = logSoftmaxNllLoss(logits.data(), labels.data(), 3, 10, nullptr, nullptr);
    logits[i] = saved - 1e-3f;
    const double minus = logSoftmaxNllLoss(logits.data(), labels.data(), 3, 10, nullptr, nullptr);
    logits[i] = saved;
    CHECK(relError(d[i], (plus - minus) / 2e-3) < 2e-3);
  }
}

// The CNN's convolutions feed thousands of ReLU kinks that finite differences of the whole net
// cross; the CNN as a whole is checked against PyTorch's autograd in torch_reference_test.cc.
TEST_CASE("gradient check: the whole MLP, end to end through the loss",
          "[unit][mnist][gradcheck]") {
  auto created = Network::create("mlp");
  REQUIRE(created.isOk());
  Network& net = *created.value();
  CHECK(net.parameterCount() == 784u * 128 + 128 + 128 * 10 + 10);
  net.initialize(3);
  std::mt19937_64 rng(4);
  const int batch = 2;
  std::vector<float> x = randomVector(static_cast<size_t>(batch) * 784, rng);
  std::vector<uint8_t> labels = {7, 2};
  std::vector<uint64_t> keys = {5, 6};
  PassContext context{true, keys.data()};
  std::vector<float> dlogits(batch * 10);
  auto loss = [&](float* dl) {
    const float* logits = net.forward(x.data(), batch, context);
    return logSoftmaxNllLoss(logits, labels.data(), batch, 10, dl, nullptr);
  };
  net.zeroGradients();
  loss(dlogits.data());
  net.backward(dlogits.data(), batch);
  const std::vector<float> grads = net.gradients();
  // Coordinates in every parametrised layer, weights and biases.
  double worst = 0.0;
  int checked = 0;
  std::string log;
  for (size_t layer = 0; layer < net.layers().size(); ++layer) {
    const size_t count = net.layers()[layer]->parameterCount();
    if (count == 0) continue;
    for (size_t k = 0; k < 6; ++k) {
      const size_t i = net.parameterOffset(layer) + (k * 7907 + 3) % count;
      float& p = net.parameterData()[i];
      const float saved = p;
      p = saved + 2e-3f;
      const double plus = loss(nullptr);
      p = saved - 2e-3f;
      const double minus = loss(nullptr);
      p = saved;
      const double numeric = (plus - minus) / 4e-3;
      // Only where the function is smooth enough to compare (no ReLU kink crossed).
      if (std::abs(numeric) < 1e-4 && std::abs(grads[i]) < 1e-4) continue;
      log += "layer " + std::to_string(layer) + " [" + std::to_string(i) + "] analytic " +
             std::to_string(grads[i]) + " numeric " + std::to_string(numeric) + "\n";
      worst = std::max(worst, relError(grads[i], numeric));
      ++checked;
    }
  }
  INFO(log);
  CHECK(checked >= 8);
  CHECK(worst < 1e-2);
}

TEST_CASE("backward announces each layer's gradients, last layer first", "[unit][mnist][network]") {
  auto created = Network::create("cnn");
  REQUIRE(created.isOk());
  Network& net = *created.value();
  net.initialize(1);
  std::vector<float> x(784, 0.5f);
  std::vector<uint64_t> keys = {1};
  net.forward(x.data(), 1, {true, keys.data()});
  std::vector<float> d(10, 0.1f);
  std::vector<std::pair<size_t, size_t>> seen;
  net.backward(d.data(), 1, [&](size_t offset, size_t count) { seen.emplace_back(offset, count); });
  REQUIRE(seen.size() == 4);
  CHECK(seen[0].second == 1290u);                            // fc2
  CHECK(seen[1].second == 1179776u);                         // fc1
  CHECK(seen[2].second == 18496u);                           // conv2
  CHECK(seen[3] == std::make_pair<size_t, size_t>(0, 320));  // conv1
  CHECK(seen[0].first + seen[0].second == net.parameterCount());
  CHECK_FALSE(Network::create("resnet").isOk());
}
