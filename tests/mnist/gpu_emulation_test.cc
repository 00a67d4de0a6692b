// The GPU engine (examples/mnist/gpu_engine.cu, the same source nvcc compiles) run on the CPU
// through the CUDA host emulation (examples/mnist/cuda_host/), against the CPU engine:
// logits, loss, every gradient and several optimizer steps (fp32); bf16 within a bound derived
// below; world size 2 under the real cpprun equal to world size 1 with the doubled batch (NCCL's
// all-reduce emulated on gloo through the agent's store); accuracy; checkpoints across engines.
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "examples/mnist/checkpoint.h"
#include "examples/mnist/communicator.h"
#include "examples/mnist/engine.h"
#include "examples/mnist/gpu_engine.h"
#include "examples/mnist/idx_dataset.h"
#include "examples/mnist/network.h"
#include "tests/support/cpprun_test_helpers.h"
#include "tests/support/test_support.h"
#include "tests/support/training_results.h"

using namespace cpprun::mnist;
using cpprun::testing::ChildProcess;
using cpprun::testing::exitCodeOf;
using cpprun::testing::relativeDistance;
using cpprun::testing::runToEnd;
using cpprun::testing::TempDir;
using cpprun::testing::testRecords;
using namespace std::chrono_literals;

namespace {

const std::string kEmulatedTrainer = CPPRUN_MNIST_EMULATED_BINARY;
const std::string kCpuTrainer = CPPRUN_MNIST_BINARY;

// The shipped digits, cut to `train` training and `test` test samples.
struct Digits {
  IdxDataset train;
  IdxDataset test;
};

IdxDataset head(IdxDataset d, int count) {
  d.count = count;
  d.pixels.resize(static_cast<size_t>(count) * d.imageSize());
  d.labels.resize(static_cast<size_t>(count));
  return d;
}

const Digits& digits() {
  static const Digits d = [] {
    const std::string dir = std::string(CPPRUN_SOURCE_DIR) + "/examples/mnist/data";
    auto train = loadMnistSplit(dir, "train");
    auto test = loadMnistSplit(dir, "t10k");
    REQUIRE(train.isOk());
    REQUIRE(test.isOk());
    return Digits{head(train.value(), 512), head(test.value(), 256)};
  }();
  return d;
}

struct EnginePair {
  std::unique_ptr<Communicator> comm = makeSingleProcessCommunicator();
  std::unique_ptr<TrainingEngine> cpu;
  std::unique_ptr<TrainingEngine> gpu;
};

EnginePair makePair(const std::string& model, const std::string& optimizer, bool bf16 = false) {
  EngineOptions options;
  options.model = model;
  options.optimizer = optimizer;
  options.max_batch = 32;
  options.test_batch_size = 64;
  EnginePair p;
  auto cpu = makeCpuEngine(options, digits().train, digits().test, *p.comm);
  REQUIRE(cpu.isOk());
  options.bf16 = bf16;
  auto gpu = makeGpuEngine(options, digits().train, digits().test, *p.comm);
  INFO((gpu.isOk() ? std::string() : gpu.status().message()));
  REQUIRE(gpu.isOk());
  p.cpu = std::move(cpu.value());
  p.gpu = std::move(gpu.value());
  return p;
}

// The layer slices of the flat parameter buffer, for per-layer comparisons.
std::vector<std::pair<size_t, size_t>> parameterSlices(const std::string& model) {
  auto net = Network::create(model);
  REQUIRE(net.isOk());
  std::vector<std::pair<size_t, size_t>> slices;
  for (size_t i = 0; i < net.value()->layers().size(); ++i) {
    const size_t count = net.value()->layers()[i]->parameterCount();
    if (count > 0) slices.emplace_back(net.value()->parameterOffset(i), count);
  }
  return slices;
}

std::vector<float> slice(const std::vector<float>& v, std::pair<size_t, size_t> s) {
  return std::vector<float>(v.begin() + static_cast<std::ptrdiff_t>(s.first),
                            v.begin() + static_cast<std::ptrdiff_t>(s.first + s.second));
}

// Writes the first `count` samples of `d` as DIR/<split>-images-idx3-ubyte and -labels-idx1-ubyte.
void writeIdxSplit(const std::string& dir, const std::string& split, const IdxDataset& d,
                   int count) {
  auto big_endian = [](std::ofstream& out, uint32_t v) {
    const char bytes[4] = {static_cast<char>(v >> 24), static_cast<char>(v >> 16),
                           static_cast<char>(v >> 8), static_cast<char>(v)};
    out.write(bytes, 4);
  };
  std::ofstream images(dir + "/" + split + "-images-idx3-ubyte", std::ios::binary);
  big_endian(images, 0x803);
  big_endian(images, static_cast<uint32_t>(count));
  big_endian(images, static_cast<uint32_t>(d.rows));
  big_endian(images, static_cast<uint32_t>(d.cols));
  images.write(reinterpret_cast<const char*>(d.pixels.data()),
               static_cast<std::streamsize>(count) * d.imageSize());
  std::ofstream labels(dir + "/" + split + "-labels-idx1-ubyte", std::ios::binary);
  big_endian(labels, 0x801);
  big_endian(labels, static_cast<uint32_t>(count));
  labels.write(reinterpret_cast<const char*>(d.labels.data()), count);
  REQUIRE(images.good());
  REQUIRE(labels.good());
}

}  // namespace

TEST_CASE(
    "emulated GPU engine: logits, loss, every gradient and optimizer steps match the CPU "
    "engine in fp32",
    "[mnist][gpu-emulation]") {
  // Relative distances are norm-wise per tensor (|a - b| / |b|): element-wise relative error is
  // meaningless for gradients that cancel to nearly 0, and the two engines sum in different
  // orders (cuBLAS-shaped products on OpenBLAS against the CPU engine's own layout).
  constexpr double kTolerance = 1e-5;
  for (const std::string model : {"cnn", "mlp"}) {
    for (const std::string optimizer : {"adadelta", "sgd", "adamw"}) {
      INFO(model << " with " << optimizer);
      EnginePair p = makePair(model, optimizer);
      REQUIRE(p.gpu->describe().find("host emulation") != std::string::npos);
      REQUIRE(p.gpu->parameterCount() == p.cpu->parameterCount());
      CHECK(relativeDistance(p.gpu->parameters(), p.cpu->parameters()) == 0.0);
      CHECK(relativeDistance(p.gpu->testLogits(0, 64), p.cpu->testLogits(0, 64)) < kTolerance);

      const float lr = optimizer == "adadelta" ? 1.0f : optimizer == "sgd" ? 0.01f : 1e-3f;
      for (int step = 0; step < 4; ++step) {
        INFO("step " << step);
        std::vector<int> indices;
        std::vector<uint64_t> keys;
        for (int i = 0; i < 32; ++i) {
          indices.push_back((step * 97 + i * 13) % digits().train.count);
          keys.push_back(0x1234u + static_cast<uint64_t>(step * 32 + i));
        }
        p.cpu->trainStep(indices, keys, lr);
        p.gpu->trainStep(indices, keys, lr);
        CHECK(std::abs(p.gpu->lastLoss() - p.cpu->lastLoss()) <
              kTolerance * std::abs(p.cpu->lastLoss()));
        const std::vector<float> cpu_grads = p.cpu->gradients();
        const std::vector<float> gpu_grads = p.gpu->gradients();
        for (const auto& s : parameterSlices(model)) {
          INFO("parameters [" << s.first << ", " << s.first + s.second << ")");
          REQUIRE(relativeDistance(slice(cpu_grads, s), std::vector<float>(s.second, 0.0f)) > 0);
          CHECK(relativeDistance(slice(gpu_grads, s), slice(cpu_grads, s)) < kTolerance);
        }
        CHECK(relativeDistance(p.gpu->parameters(), p.cpu->parameters()) < kTolerance);
      }
      const OptimizerState cpu_state = p.cpu->optimizerState();
      const OptimizerState gpu_state = p.gpu->optimizerState();
      CHECK(gpu_state.steps == 4);
      REQUIRE(gpu_state.buffers.size() == cpu_state.buffers.size());
      for (size_t b = 0; b < cpu_state.buffers.size(); ++b) {
        CHECK(relativeDistance(gpu_state.buffers[b], cpu_state.buffers[b]) < 1e-4);
      }
      const auto [cpu_loss, cpu_correct] = p.cpu->evaluate(0, 256);
      const auto [gpu_loss, gpu_correct] = p.gpu->evaluate(0, 256);
      CHECK(std::abs(gpu_loss - cpu_loss) < kTolerance * cpu_loss);
      CHECK(std::abs(gpu_correct - cpu_correct) <= 1);
    }
  }
}

TEST_CASE("emulated GPU engine with --bf16: the MLP's logits lie within the derived bound of fp32",
          "[mnist][gpu-emulation]") {
  // The bound. bf16 keeps 8 significant bits, so rounding to nearest even has unit roundoff
  // u = 2^-8: each operand a becomes a(1 + d), |d| <= u, and a product of two rounded operands
  // is off by at most (2u + u^2)|a||b|. With float accumulation (error at most K * 2^-24 times
  // the sum of |terms| for K terms, which we add), one bf16 product gives, element-wise,
  //   |z' - z| <= e(W, x) := (2u + u^2 + K 2^-24 (1 + u)^2) (|W| |x|).
  // The MLP is z2 = W2 relu(W1 x + b1) + b2. ReLU is 1-Lipschitz, so with h = relu(z1),
  //   |h' - h| <= e1 = e(W1, x),
  //   |z2' - z2| <= e(W2, |h| + e1) + (1 + u)^2 |W2| e1,
  // which the test computes from the fp32 weights and images and checks every logit against.
  EnginePair p = makePair("mlp", "adadelta", /*bf16=*/true);
  REQUIRE(p.gpu->describe().find("bf16") != std::string::npos);
  const std::vector<float> w = p.cpu->parameters();
  const std::vector<float> fp32 = p.cpu->testLogits(0, 64);
  const std::vector<float> bf16 = p.gpu->testLogits(0, 64);
  const std::vector<float> images = normalizeImages(digits().test);
  const double u = std::ldexp(1.0, -8);
  auto e = [&](int k) { return 2 * u + u * u + k * std::ldexp(1.0, -24) * (1 + u) * (1 + u); };
  const int in = 784, hidden = 128, classes = 10;
  const float* w1 = w.data();
  const float* b1 = w1 + hidden * in;
  const float* w2 = b1 + hidden;
  double largest_error = 0.0;
  for (int b = 0; b < 64; ++b) {
    const float* x = images.data() + static_cast<size_t>(b) * in;
    std::vector<double> h(hidden), e1(hidden);
    for (int o = 0; o < hidden; ++o) {
      double z = b1[o], abs_sum = 0.0;
      for (int i = 0; i < in; ++i) {
        z += double(w1[o * in + i]) * x[i];
        abs_sum += std::abs(double(w1[o * in + i]) * x[i]);
      }
      h[o] = z > 0 ? z : 0;
      e1[o] = e(in) * abs_sum;
    }
    for (int c = 0; c < classes; ++c) {
      double bound = 0.0;
      for (int o = 0; o < hidden; ++o) {
        const double a = std::abs(double(w2[c * hidden + o]));
        bound += e(hidden) * a * (h[o] + e1[o]) + (1 + u) * (1 + u) * a * e1[o];
      }
      const double error = std::abs(double(bf16[b * classes + c]) - fp32[b * classes + c]);
      INFO("sample " << b << " class " << c);
      CHECK(error <= bound);
      largest_error = std::max(largest_error, error);
    }
  }
  // bf16 really was used: fp32 products would agree to ~1e-6.
  CHECK(largest_error > 1e-4);
}

TEST_CASE(
    "emulated GPU engine: world size 2 under cpprun trains exactly like world size 1 with "
    "the doubled batch",
    "[integration][mnist][gpu-emulation]") {
  // Two emulated ranks under the real cpprun: NCCL's id is the agent's CPPRUN_NCCL_UNIQUE_ID and
  // its all-reduce runs on gloo through the agent's store.
  TempDir one;
  TempDir two;
  const std::vector<std::string> common = {
      "--device",  "cuda", "--max-steps", "4",   "--epochs",          "1",  "--quiet",
      "--threads", "1",    "--model",     "cnn", "--test-batch-size", "500"};
  std::vector<std::string> alone = {kEmulatedTrainer, "--batch-size", "32", "--checkpoint-dir",
                                    one.path()};
  alone.insert(alone.end(), common.begin(), common.end());
  // --virtual-local-rank: every rank's LOCAL_RANK is 0, the emulation's one device.
  std::vector<std::string> pair = {CPPRUN_BINARY,          "--nproc-per-node=2",
                                   "--virtual-local-rank", kEmulatedTrainer,
                                   "--batch-size",         "16",
                                   "--checkpoint-dir",     two.path()};
  pair.insert(pair.end(), common.begin(), common.end());
  std::string alone_output;
  std::string pair_output;
  const int alone_code = runToEnd(alone, 300s, &alone_output);
  INFO(alone_output);
  REQUIRE(alone_code == 0);
  const int pair_code = runToEnd(pair, 300s, &pair_output);
  INFO(pair_output);
  REQUIRE(pair_code == 0);
  auto a = loadCheckpoint(one.path() + "/final.ckpt");
  auto b = loadCheckpoint(two.path() + "/final.ckpt");
  REQUIRE(a.isOk());
  REQUIRE(b.isOk());
  CHECK(a.value().world_size == 1);
  CHECK(b.value().world_size == 2);
  CHECK(b.value().optimizer_steps == 4);
  auto fresh = Network::create("cnn");
  REQUIRE(fresh.isOk());
  fresh.value()->initialize(1);
  CHECK(relativeDistance(a.value().parameters, fresh.value()->parameters()) > 1e-3);
  CHECK(relativeDistance(b.value().parameters, a.value().parameters) < 1e-5);
}

TEST_CASE("emulated GPU engine: an epoch reaches the CPU engine's accuracy",
          "[integration][mnist][gpu-emulation]") {
  // Whole runs are compared by accuracy, not weights: over an epoch, a ReLU whose input lies
  // within rounding of 0 can flip between engines that sum in different orders (seen at step
  // ~85 here: one hidden unit's row moved by 4e-4), and Adadelta carries the flip on.
  double accuracy[2] = {0.0, 0.0};
  for (int engine = 0; engine < 2; ++engine) {
    TempDir dir;
    std::vector<std::string> argv = {engine == 0 ? kEmulatedTrainer : kCpuTrainer,
                                     "--device",
                                     engine == 0 ? "cuda" : "cpu",
                                     "--model",
                                     "mlp",
                                     "--epochs",
                                     "1",
                                     "--quiet",
                                     "--threads",
                                     "1",
                                     "--metrics",
                                     dir.path() + "/m.jsonl"};
    std::string output;
    const int code = runToEnd(argv, 300s, &output);
    INFO(output);
    REQUIRE(code == 0);
    const auto records = testRecords(dir.path() + "/m.jsonl");
    REQUIRE(records.size() == 1);
    CHECK(records[0].at("device") == (engine == 0 ? "cuda" : "cpu"));
    accuracy[engine] = records[0].at("accuracy").get<double>();
  }
  CHECK(accuracy[1] > 85.0);
  CHECK(std::abs(accuracy[0] - accuracy[1]) <= 0.1);
}

TEST_CASE("emulated GPU engine: a checkpoint written by either engine resumes in the other",
          "[integration][mnist][gpu-emulation]") {
  // A 640-image training set: an epoch is 10 steps, short enough for weights to agree to 1e-5.
  TempDir data;
  writeIdxSplit(data.path(), "train", digits().train, 640);
  writeIdxSplit(data.path(), "t10k", digits().test, 256);
  auto run = [&](const std::string& device, const std::string& dir, const std::string& epochs,
                 bool resume) {
    std::vector<std::string> argv = {device == "cuda" ? kEmulatedTrainer : kCpuTrainer,
                                     "--device",
                                     device,
                                     "--data",
                                     data.path(),
                                     "--model",
                                     "cnn",
                                     "--epochs",
                                     epochs,
                                     "--quiet",
                                     "--threads",
                                     "1",
                                     "--checkpoint-dir",
                                     dir};
    if (resume) argv.push_back("--resume");
    std::string output;
    const int code = runToEnd(argv, 300s, &output);
    INFO(output);
    REQUIRE(code == 0);
    auto c = loadCheckpoint(dir + "/final.ckpt");
    REQUIRE(c.isOk());
    return c.value();
  };
  // Epoch 1 on one engine, epoch 2 on the other (or the same, as the reference).
  TempDir gpu_then_cpu, cpu_then_gpu, gpu_only;
  const Checkpoint gpu_epoch1 = run("cuda", gpu_then_cpu.path(), "1", false);
  const Checkpoint cpu_epoch1 = run("cpu", cpu_then_gpu.path(), "1", false);
  run("cuda", gpu_only.path(), "1", false);
  CHECK(gpu_epoch1.optimizer_steps == 10);
  CHECK(relativeDistance(gpu_epoch1.parameters, cpu_epoch1.parameters) < 1e-5);
  const Checkpoint cpu_epoch2 = run("cpu", gpu_then_cpu.path(), "2", true);
  const Checkpoint gpu_epoch2 = run("cuda", cpu_then_gpu.path(), "2", true);
  const Checkpoint reference = run("cuda", gpu_only.path(), "2", true);
  CHECK(cpu_epoch2.optimizer_steps == 20);
  CHECK(gpu_epoch2.optimizer_steps == 20);
  CHECK(relativeDistance(cpu_epoch2.parameters, gpu_epoch1.parameters) > 1e-3);  // it trained
  CHECK(relativeDistance(cpu_epoch2.parameters, reference.parameters) < 1e-5);
  CHECK(relativeDistance(gpu_epoch2.parameters, reference.parameters) < 1e-5);
  REQUIRE(cpu_epoch2.optimizer_buffers.size() == reference.optimizer_buffers.size());
  for (size_t b = 0; b < reference.optimizer_buffers.size(); ++b) {
    CHECK(relativeDistance(cpu_epoch2.optimizer_buffers[b], reference.optimizer_buffers[b]) < 1e-4);
  }
}

// ---- NCCL bootstrap at scale (issue 26): the agent's ids reach ncclCommInitRankScalable -------

namespace {

// What each rank's emulated NCCL init recorded (CPPRUN_EMULATED_NCCL_RECORD): "key value" lines.
std::map<std::string, std::string> initRecord(const std::string& dir, int rank) {
  std::map<std::string, std::string> fields;
  std::istringstream lines(
      cpprun::testing::readFile(dir + "/init-" + std::to_string(rank) + ".txt"));
  std::string line;
  while (std::getline(lines, line)) {
    const size_t space = line.find(' ');
    if (space != std::string::npos) fields[line.substr(0, space)] = line.substr(space + 1);
  }
  return fields;
}

std::string textOfHex(const std::string& hex) {
  const cpprun::testing::Bytes bytes = cpprun::testing::fromHex(hex);
  return std::string(bytes.begin(), bytes.end());
}

// Four emulated ranks under the real cpprun on a node whose driver is the stand-in (4 devices),
// whose agent loads the stand-in NCCL (its ids are recognisable text), `more` added to the
// environment; each rank records its NCCL init in `record`. REQUIREs the job succeeds.
void runFourRanks(const std::string& record, const std::map<std::string, std::string>& more) {
  TempDir checkpoints;
  const std::string stand_ins = CPPRUN_STAND_IN_DIR;
  std::map<std::string, std::string> env = {
      {"LD_LIBRARY_PATH", stand_ins + "/driver"},
      {"CPPRUN_STAND_IN_CUDA_DEVICES", "4"},
      {"CPPRUN_NCCL_LIBRARY", stand_ins + "/nccl/libnccl.so.2"},
      {"NCCL_SOCKET_IFNAME", "lo"},
      {"CPPRUN_EMULATED_NCCL_RECORD", record}};
  for (const auto& [name, value] : more) env[name] = value;
  ChildProcess run({"/usr/bin/env",
                    "-u",
                    "CUDA_VISIBLE_DEVICES",
                    CPPRUN_BINARY,
                    "--nproc-per-node=4",
                    "--virtual-local-rank",
                    kEmulatedTrainer,
                    "--device",
                    "cuda",
                    "--max-steps",
                    "1",
                    "--epochs",
                    "1",
                    "--quiet",
                    "--threads",
                    "1",
                    "--batch-size",
                    "8",
                    "--test-batch-size",
                    "500",
                    "--checkpoint-dir",
                    checkpoints.path()},
                   env);
  auto status = run.wait(300s);
  INFO(run.output());
  REQUIRE(status.has_value());
  REQUIRE(cpprun::testing::exitCodeOf(*status) == 0);
}

}  // namespace

TEST_CASE(
    "above CPPRUN_NCCL_RANKS_PER_ID the trainer calls ncclCommInitRankScalable with the agent's "
    "ids, the same on every rank",
    "[integration][mnist][gpu-emulation][nccl]") {
  TempDir record;
  // 4 ranks, 2 per id: nId 2.
  runFourRanks(record.path(), {{"CPPRUN_NCCL_RANKS_PER_ID", "2"}});
  const auto rank0 = initRecord(record.path(), 0);
  CHECK(rank0.at("call") == "ncclCommInitRankScalable");
  CHECK(rank0.at("nranks") == "4");
  CHECK(rank0.at("nid") == "2");
  const std::string ids = rank0.at("ids");
  REQUIRE(ids.size() == 2 * 256 + 1);
  // Made by the agent through the stand-in NCCL (its text), two fresh calls: not the same id.
  const std::string first = textOfHex(ids.substr(0, 256));
  const std::string second = textOfHex(ids.substr(257));
  // The agent's calls 1 and 2 to the stand-in: call 0 made the single id.
  CHECK_THAT(first, Catch::StartsWith("cpprun-stand-in-nccl-id 1 "));
  CHECK_THAT(second, Catch::StartsWith("cpprun-stand-in-nccl-id 2 "));
  for (int rank = 1; rank < 4; ++rank) {
    const auto r = initRecord(record.path(), rank);
    CHECK(r.at("call") == "ncclCommInitRankScalable");
    CHECK(r.at("rank") == std::to_string(rank));
    CHECK(r.at("ids") == ids);  // every rank agrees
  }
}

TEST_CASE(
    "at or below the threshold, or with an NCCL older than 2.23, the trainer keeps "
    "ncclCommInitRank and the single id",
    "[integration][mnist][gpu-emulation][nccl]") {
  SECTION("the default threshold (256 ranks per id): 4 ranks get the single id only") {
    TempDir record;
    runFourRanks(record.path(), {});
    for (int rank = 0; rank < 4; ++rank) {
      const auto r = initRecord(record.path(), rank);
      CHECK(r.at("call") == "ncclCommInitRank");
      CHECK(r.at("nid") == "1");
      CHECK_THAT(textOfHex(r.at("ids")), Catch::StartsWith("cpprun-stand-in-nccl-id 0 "));
    }
  }
  SECTION("NCCL 2.22 (no ncclCommInitRankScalable): the ids are there, the single id is used") {
    TempDir record;
    runFourRanks(record.path(),
                 {{"CPPRUN_NCCL_RANKS_PER_ID", "2"}, {"CPPRUN_EMULATED_NCCL_VERSION", "22203"}});
    for (int rank = 0; rank < 4; ++rank) {
      const auto r = initRecord(record.path(), rank);
      CHECK(r.at("call") == "ncclCommInitRank");
      CHECK_THAT(textOfHex(r.at("ids")), Catch::StartsWith("cpprun-stand-in-nccl-id 0 "));
    }
  }
}
