// cpprun-mnist end to end, under the real cpprun: data parallelism that trains exactly like one
// process, a killed worker whose restart resumes from the checkpoint, the accuracy target, and
// clear errors for bad flags, data and checkpoints.
#include <signal.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/collective_record.h"
#include "examples/mnist/checkpoint.h"
#include "examples/mnist/gpu_engine.h"
#include "examples/mnist/network.h"
#include "tests/support/cpprun_test_helpers.h"
#include "tests/support/test_support.h"
#include "tests/support/training_results.h"

using namespace cpprun::mnist;
using cpprun::testing::ChildProcess;
using cpprun::testing::exitCodeOf;
using cpprun::testing::processesMentioning;
using cpprun::testing::relativeDistance;
using cpprun::testing::runDirectoryOf;
using cpprun::testing::runToEnd;
using cpprun::testing::TempDir;
using cpprun::testing::testRecords;
using namespace std::chrono_literals;

namespace {

const std::string kTrainer = CPPRUN_MNIST_BINARY;

std::vector<std::string> underCpprun(int nproc, std::vector<std::string> args,
                                     std::vector<std::string> cpprun_flags = {}) {
  std::vector<std::string> argv = {CPPRUN_BINARY, "--nproc-per-node=" + std::to_string(nproc)};
  argv.insert(argv.end(), cpprun_flags.begin(), cpprun_flags.end());
  argv.push_back(kTrainer);
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

// The worker process of `rank` among the live processes whose command line mentions `token`.
pid_t workerOfRank(const std::string& token, int rank) {
  for (pid_t pid : processesMentioning(token)) {
    std::ifstream exe_probe("/proc/" + std::to_string(pid) + "/cmdline");
    std::string cmdline((std::istreambuf_iterator<char>(exe_probe)),
                        std::istreambuf_iterator<char>());
    if (cmdline.rfind(kTrainer, 0) != 0) continue;  // cpprun itself mentions the token too
    std::ifstream environ("/proc/" + std::to_string(pid) + "/environ");
    std::string entry;
    while (std::getline(environ, entry, '\0')) {
      if (entry == "RANK=" + std::to_string(rank)) return pid;
    }
  }
  return -1;
}

}  // namespace

TEST_CASE("cpprun-mnist: world size 2 with batch b trains exactly like world size 1 with 2b",
          "[integration][mnist][trainer]") {
  TempDir one;
  TempDir two;
  const std::vector<std::string> common = {"--max-steps", "5", "--epochs",          "1",  "--quiet",
                                           "--threads",   "1", "--test-batch-size", "500"};
  std::vector<std::string> alone = {kTrainer, "--batch-size", "32", "--checkpoint-dir", one.path()};
  alone.insert(alone.end(), common.begin(), common.end());
  std::vector<std::string> pair = {"--batch-size", "16", "--checkpoint-dir", two.path()};
  pair.insert(pair.end(), common.begin(), common.end());
  std::string output;
  REQUIRE(runToEnd(alone, 120s, &output) == 0);
  INFO(output);
  REQUIRE(runToEnd(underCpprun(2, pair), 120s, &output) == 0);

  auto a = loadCheckpoint(one.path() + "/final.ckpt");
  auto b = loadCheckpoint(two.path() + "/final.ckpt");
  REQUIRE(a.isOk());
  REQUIRE(b.isOk());
  CHECK(a.value().world_size == 1);
  CHECK(b.value().world_size == 2);
  CHECK(a.value().optimizer_steps == 5);
  CHECK(b.value().optimizer_steps == 5);
  // The weights moved (the comparison is not between two initialisations) ...
  auto fresh = Network::create("cnn");
  REQUIRE(fresh.isOk());
  fresh.value()->initialize(1);
  CHECK(relativeDistance(a.value().parameters, fresh.value()->parameters()) > 1e-3);
  // ... and landed in the same place, up to the order of floating-point sums.
  CHECK(relativeDistance(b.value().parameters, a.value().parameters) < 1e-5);
  CHECK(relativeDistance(b.value().optimizer_buffers[0], a.value().optimizer_buffers[0]) < 1e-4);
}

TEST_CASE(
    "cpprun-mnist: its gloo collectives are numbered in the collective record cpprun reads "
    "at a hang",
    "[integration][mnist][trainer][stall]") {
  TempDir dir;
  std::string output;
  REQUIRE(runToEnd(underCpprun(2,
                               {"--max-steps", "3", "--epochs", "1", "--quiet", "--threads", "1",
                                "--test-batch-size", "500", "--checkpoint-dir", dir.path()},
                               {"--stall-timeout=60", "--log-dir=" + dir.path() + "/logs",
                                "--rdzv-id=rec"}),
                   120s, &output) == 0);
  INFO(output);
  // Both ranks ran the same collectives, the last returned ("after"), numbered alike.
  std::vector<cpprun::CollectiveRecord> records;
  for (int rank = 0; rank < 2; ++rank) {
    std::ifstream in(runDirectoryOf(dir.path() + "/logs", "rec") + "/attempt_0/" +
                     std::to_string(rank) + "/collective");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto record = cpprun::parseCollectiveRecord(text);
    REQUIRE(record.isOk());
    records.push_back(record.value());
  }
  CHECK_FALSE(records[0].inside);
  CHECK(records[0].group == "world");
  CHECK(records[0].seq > 3);  // the initial broadcast, 3 steps' gradients, the metrics
  CHECK(records[0].seq == records[1].seq);
  CHECK(records[0].op == records[1].op);
}

TEST_CASE("cpprun-mnist: a worker killed mid-epoch is restarted and resumes from the checkpoint",
          "[integration][mnist][trainer]") {
  TempDir interrupted;
  TempDir uninterrupted;
  const std::vector<std::string> common = {"--epochs",       "3",  "--threads",    "1",
                                           "--log-interval", "20", "--batch-size", "64"};
  auto args = [&](const TempDir& dir) {
    std::vector<std::string> a = {"--checkpoint-dir", dir.path(), "--metrics",
                                  dir.path() + "/metrics.jsonl"};
    a.insert(a.end(), common.begin(), common.end());
    return a;
  };

  ChildProcess run(underCpprun(2, args(interrupted), {"--max-restarts=1"}));
  // Epoch 1 is done and saved; epoch 2 is under way: its second progress line.
  REQUIRE(run.waitForLine("[default0]:Train Epoch: 2 [", 120s).has_value());
  REQUIRE(run.waitForLine("[default0]:Train Epoch: 2 [", 60s).has_value());
  const pid_t victim = workerOfRank(interrupted.path(), 1);
  REQUIRE(victim > 0);
  REQUIRE(::kill(victim, SIGKILL) == 0);
  auto status = run.wait(240s);
  REQUIRE(status.has_value());
  INFO(run.output());
  CHECK(exitCodeOf(*status) == 0);
  CHECK_THAT(run.output(), Catch::Contains("Resuming from " + interrupted.path() +
                                           "/latest.ckpt: 1 epochs and 0 batches done"));
  CHECK_THAT(run.output(), Catch::Contains("attempt 1"));
  // The resumed attempt trained epochs 2 and 3 only.
  CHECK(run.output().find("[default0]:Train Epoch: 1 [", run.output().find("Resuming")) ==
        std::string::npos);

  std::string output;
  REQUIRE(runToEnd(underCpprun(2, args(uninterrupted)), 240s, &output) == 0);
  const auto resumed = testRecords(interrupted.path() + "/metrics.jsonl");
  const auto straight = testRecords(uninterrupted.path() + "/metrics.jsonl");
  REQUIRE(straight.size() == 3);
  REQUIRE(resumed.size() >= 3);
  CHECK(resumed.back().at("epoch") == 3);
  const double a = resumed.back().at("accuracy").get<double>();
  const double b = straight.back().at("accuracy").get<double>();
  INFO("resumed " << a << "%, uninterrupted " << b << "%");
  CHECK(std::abs(a - b) <= 0.5);
}

TEST_CASE(
    "cpprun-mnist: SIGUSR1 (pre-emption) checkpoints mid-epoch and --resume continues exactly",
    "[integration][mnist][trainer]") {
  TempDir preempted;
  TempDir straight;
  const std::vector<std::string> common = {"--epochs",     "1",  "--max-steps",       "40",
                                           "--threads",    "1",  "--log-interval",    "10",
                                           "--batch-size", "64", "--test-batch-size", "1000"};
  auto args = [&](const TempDir& dir) {
    std::vector<std::string> a = {"--checkpoint-dir", dir.path()};
    a.insert(a.end(), common.begin(), common.end());
    return a;
  };
  const std::vector<std::string> forward_usr1 = {
      "--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"};

  ChildProcess run(underCpprun(2, args(preempted), forward_usr1));
  REQUIRE(run.waitForLine("[default0]:Train Epoch: 1 [", 120s).has_value());
  REQUIRE(run.waitForLine("[default0]:Train Epoch: 1 [", 60s).has_value());  // step 11 done
  run.signal(SIGUSR1);
  auto status = run.wait(120s);
  REQUIRE(status.has_value());
  INFO(run.output());
  CHECK(exitCodeOf(*status) == 128 + SIGUSR1);
  CHECK_THAT(run.output(), Catch::Contains("[default0]:Stop requested: checkpoint at epoch 1"));
  // Both ranks stopped after the same step and said so.
  CHECK_THAT(run.output(), Catch::Contains("rank 0: stopped by SIGUSR1 after step"));
  CHECK_THAT(run.output(), Catch::Contains("rank 1: stopped by SIGUSR1 after step"));
  auto saved = loadCheckpoint(preempted.path() + "/latest.ckpt");
  REQUIRE(saved.isOk());
  CHECK(saved.value().epochs_done == 0);
  CHECK(saved.value().batches_done == saved.value().optimizer_steps);
  CHECK(saved.value().optimizer_steps > 10);
  CHECK(saved.value().optimizer_steps < 40);
  CHECK(::access((preempted.path() + "/final.ckpt").c_str(), F_OK) != 0);

  std::vector<std::string> resume = args(preempted);
  resume.push_back("--resume");
  std::string output;
  REQUIRE(runToEnd(underCpprun(2, resume), 120s, &output) == 0);
  CHECK_THAT(output, Catch::Contains("0 epochs and " + std::to_string(saved.value().batches_done) +
                                     " batches done"));
  REQUIRE(runToEnd(underCpprun(2, args(straight)), 120s, &output) == 0);
  auto a = loadCheckpoint(preempted.path() + "/final.ckpt");
  auto b = loadCheckpoint(straight.path() + "/final.ckpt");
  REQUIRE(a.isOk());
  REQUIRE(b.isOk());
  CHECK(a.value().optimizer_steps == 40);
  CHECK(b.value().optimizer_steps == 40);
  // Same batches, same dropout masks, same optimizer state: the same weights.
  CHECK(relativeDistance(a.value().parameters, b.value().parameters) < 1e-6);
}

TEST_CASE("cpprun-mnist: at least 97% on the shipped digits within 5 epochs at world size 2",
          "[integration][mnist][trainer][accuracy]") {
  TempDir dir;
  const std::string metrics = dir.path() + "/metrics.jsonl";
  // Per-rank batch 32: the global batch of 64 that PyTorch's example trains with.
  std::string output;
  REQUIRE(runToEnd(underCpprun(
                       2, {"--epochs", "5", "--batch-size", "32", "--quiet", "--metrics", metrics}),
                   400s, &output) == 0);
  const auto records = testRecords(metrics);
  REQUIRE(records.size() == 5);
  double best = 0.0;
  for (const auto& r : records) {
    best = std::max(best, r.at("accuracy").get<double>());
    CHECK(r.at("world_size") == 2);
  }
  INFO(metrics);
  CHECK(best >= 97.0);
}

TEST_CASE("cpprun-mnist: bad flags, data and checkpoints are clear errors",
          "[integration][mnist][trainer]") {
  TempDir dir;
  std::string output;
  CHECK(runToEnd({kTrainer, "--batch-size", "0"}, 30s, &output) == 2);
  CHECK_THAT(output, Catch::Contains("--batch-size"));
  CHECK(runToEnd({kTrainer, "--model", "resnet"}, 30s, &output) == 2);
  CHECK_THAT(output, Catch::Contains("--model") && Catch::Contains("resnet"));
  CHECK(runToEnd({kTrainer, "--frobnicate"}, 30s, &output) == 2);
  CHECK_THAT(output, Catch::Contains("--frobnicate"));
  CHECK(runToEnd({kTrainer, "--data", dir.path()}, 30s, &output) == 1);
  CHECK_THAT(output, Catch::Contains(dir.path()) && Catch::Contains("train-images"));

  std::ofstream(dir.path() + "/latest.ckpt") << "CPRNCKPT garbage";
  CHECK(
      runToEnd({kTrainer, "--checkpoint-dir", dir.path(), "--resume", "--model", "mlp", "--quiet"},
               60s, &output) == 1);
  CHECK_THAT(output, Catch::Contains(dir.path() + "/latest.ckpt") && Catch::Contains("corrupt"));
  CHECK(runToEnd({kTrainer, "--help"}, 30s, &output) == 0);
  CHECK_THAT(output, Catch::Contains("--checkpoint-dir"));
}

TEST_CASE("cpprun-mnist --device cuda: built where CUDA and NCCL are, and clear without a GPU",
          "[integration][mnist][trainer][gpu]") {
  // CI installs nvcc and NCCL, so there the GPU engine must be in the binary; on a host without
  // a GPU (CI's) it must say so rather than fall back or crash.
  CHECK(cpprun::mnist::gpuEngineBuilt() == (CPPRUN_MNIST_EXPECT_GPU_ENGINE != 0));
  std::string output;
  const int code =
      runToEnd({kTrainer, "--device", "cuda", "--epochs", "1", "--quiet"}, 120s, &output);
  if (CPPRUN_MNIST_EXPECT_GPU_ENGINE == 0) {
    CHECK(code == 1);
    CHECK_THAT(output, Catch::Contains("built without CUDA"));
  } else if (code != 0) {
    CHECK(code == 1);
    CHECK_THAT(output, Catch::Contains("--device cuda: no usable GPU"));
  }
  CHECK(runToEnd({kTrainer, "--bf16", "--device", "cpu"}, 30s, &output) == 2);
  CHECK_THAT(output, Catch::Contains("--bf16 needs the GPU engine, not --device cpu"));
  CHECK(runToEnd({kTrainer, "--device", "tpu"}, 30s, &output) == 2);
  CHECK_THAT(output, Catch::Contains("--device: expected auto, cpu or cuda, got 'tpu'"));
}

TEST_CASE("cpprun-mnist --device auto (the default) trains on the CPU where no GPU is visible",
          "[integration][mnist][trainer][gpu]") {
  // This machine (and CI's) has no GPU: auto must pick the CPU engine, say why in one line, and
  // train; --bf16, which needs the GPU engine, fails naming what auto chose.
  std::string output;
  REQUIRE(runToEnd({kTrainer, "--model", "mlp", "--epochs", "1", "--max-steps", "5"}, 120s,
                   &output) == 0);
  const std::string why = cpprun::mnist::gpuEngineBuilt()
                              ? "--device auto: CPU (this build has the GPU engine, but no GPU "
                                "is visible)"
                              : "--device auto: CPU (this build has no GPU engine)";
  CHECK_THAT(output, Catch::Contains(why));
  CHECK_THAT(output, Catch::Contains("cpprun-mnist: compute: CPU"));
  CHECK(runToEnd({kTrainer, "--bf16", "--model", "mlp", "--max-steps", "1", "--quiet"}, 60s,
                 &output) == 1);
  CHECK_THAT(output, Catch::Contains("--bf16 needs the GPU engine (--device auto chose cpu)"));
}
