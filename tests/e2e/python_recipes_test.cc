// The PyTorch scripts in examples/python run unchanged under cpprun with Debian's torch 1.13 and
// with the pinned torch 2.x (gloo, CPU): the cluster-guide DDP MNIST trainer reaches its
// accuracy (under torch 1.13's own launcher too), and the "hello" script reports every rank.
// With torch 2.x, a rank that fails mid-training restarts the job (--max-restarts=1) and the
// new attempt goes on from the checkpoint of the last finished epoch.
#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/support/cpprun_test_helpers.h"
#include "tests/support/test_support.h"
#include "tests/support/torch_peers.h"
#include "tests/support/training_results.h"

using cpprun::testing::ChildProcess;
using cpprun::testing::cpprunCommand;
using cpprun::testing::exitCodeOf;
using cpprun::testing::freeTcpPort;
using cpprun::testing::sourcePath;
using cpprun::testing::TempDir;
using cpprun::testing::testRecords;
using cpprun::testing::TorchPeer;
using namespace std::chrono_literals;

namespace {

// mnist_ddp.py, 2 epochs on 2 workers under cpprun with `peer`'s interpreter, reaches the
// accuracy bound and leaves its checkpoint. PYTHONFAULTHANDLER: a torch 2.15 rank has died here
// by SIGABRT ("terminate called without an active exception", no Python frame) in 2 of 11
// runs inside the full suite and never in 43 runs of the job alone, loaded or not; when it happens
// again, the failure message holds every thread's Python stack at the abort.
void mnistTrainsUnderCpprun(const TorchPeer& peer) {
  cpprun::testing::requireTorchPeer(peer);
  TempDir dir;
  ChildProcess run(cpprunCommand({"--nproc-per-node=2", sourcePath("examples/python/mnist_ddp.py"),
                                  "--epochs", "2", "--quiet", "--checkpoint-dir", dir.path(),
                                  "--metrics", dir.path() + "/cpprun.jsonl"}),
                   {{"PYTHON_EXEC", peer.python}, {"PYTHONFAULTHANDLER", "1"}});
  auto status = run.wait(240s);
  REQUIRE(status.has_value());
  INFO(run.output());
  REQUIRE(exitCodeOf(*status) == 0);
  const auto records = testRecords(dir.path() + "/cpprun.jsonl");
  REQUIRE(records.size() == 2);
  CHECK(records.back().at("world_size") == 2);
  // PyTorch reaches 94.7% after 2 epochs on the shipped digits (docs/benchmarks.md; torch 1.13
  // and 2.15 alike).
  CHECK(records.back().at("accuracy").get<double>() >= 93.0);
  // Rank 0 saved the checkpoint, atomically (no temporary file left).
  CHECK(std::ifstream(dir.path() + "/mnist_ddp.pt").good());
  CHECK_FALSE(std::ifstream(dir.path() + "/mnist_ddp.pt.tmp").good());
}

// hello.py on 2 workers with `peer`'s interpreter: one line per rank, and the user's NCCL
// settings reach the workers next to the TORCH_NCCL_ASYNC_ERROR_HANDLING cpprun adds. Returns
// the output.
std::string helloPrintsEveryRank(const TorchPeer& peer) {
  cpprun::testing::requireTorchPeer(peer);
  ChildProcess run(
      cpprunCommand({"--nproc-per-node=2", sourcePath("examples/python/hello.py")}),
      {{"PYTHON_EXEC", peer.python}, {"NCCL_DEBUG", "INFO"}, {"NCCL_SOCKET_IFNAME", "lo"}});
  auto status = run.wait(120s);
  REQUIRE(status.has_value());
  INFO(run.output());
  REQUIRE(exitCodeOf(*status) == 0);
  for (const std::string rank : {"0", "1"}) {
    CHECK_THAT(run.output(), Catch::Contains("[default" + rank + "]:hello from rank " + rank +
                                             "/2 local_rank " + rank + "/2 node 0 host "));
  }
  CHECK_THAT(run.output(), Catch::Contains("device cpu (cpu) backend gloo all_reduce 2 NCCL: "));
  CHECK_THAT(run.output(), Catch::Contains("NCCL_DEBUG=INFO NCCL_SOCKET_IFNAME=lo "
                                           "TORCH_NCCL_ASYNC_ERROR_HANDLING=1"));
  return run.output();
}

}  // namespace

TEST_CASE("the cluster-guide DDP MNIST script trains under cpprun and under torch's launcher",
          "[integration][torch][recipes]") {
  mnistTrainsUnderCpprun(cpprun::testing::torch113());

  TempDir dir;
  const std::string script = sourcePath("examples/python/mnist_ddp.py");
  // The same file under torch 1.13's elastic launcher (what torchrun calls).
  ChildProcess torch({CPPRUN_PYTHON, sourcePath("tests/bench/torch_elastic_launch.py"), "--nproc",
                      "2", "--port", std::to_string(freeTcpPort()), "--monitor-interval", "0.1",
                      "--", CPPRUN_PYTHON, script, "--epochs", "1", "--quiet", "--metrics",
                      dir.path() + "/torch.jsonl"});
  auto torch_status = torch.wait(240s);
  REQUIRE(torch_status.has_value());
  INFO(torch.output());
  REQUIRE(exitCodeOf(*torch_status) == 0);
  const auto torch_records = testRecords(dir.path() + "/torch.jsonl");
  REQUIRE(torch_records.size() == 1);
  CHECK(torch_records.back().at("accuracy").get<double>() >= 90.0);
}

TEST_CASE("the hello script prints one line per rank with its device and NCCL variables",
          "[integration][torch][recipes]") {
  const std::string output = helloPrintsEveryRank(cpprun::testing::torch113());
  // torch 1.x reads the old spelling of TORCH_NCCL_ASYNC_ERROR_HANDLING, which cpprun sets too.
  CHECK_THAT(output, Catch::Contains("NCCL: NCCL_ASYNC_ERROR_HANDLING=1 NCCL_DEBUG=INFO "));
}

TEST_CASE("torch 2.x: the cluster-guide DDP MNIST script trains under cpprun",
          "[integration][torch][torch2][recipes]") {
  mnistTrainsUnderCpprun(cpprun::testing::torch2());
}

TEST_CASE("torch 2.x: the hello script prints one line per rank with its device and NCCL variables",
          "[integration][torch][torch2][recipes]") {
  helloPrintsEveryRank(cpprun::testing::torch2());
}

TEST_CASE("torch 2.x: a rank failing mid-epoch restarts the DDP job from its checkpoint",
          "[integration][torch][torch2][recipes]") {
  cpprun::testing::requireTorchPeer(cpprun::testing::torch2());
  TempDir dir;
  // Attempt 0: epoch 1 ends with a checkpoint, then rank 1 raises halfway through epoch 2.
  // Attempt 1 loads the checkpoint and trains epoch 2 only.
  // One restart more than the script needs: a torch 2.15 worker of attempt 1 has aborted twice
  // (once in CI, once in 4 local runs under load, then not in 20 more) with "terminate called
  // without an active exception" (SIGABRT, inside torch, no Python frame). Absorbing such a
  // crash is the launcher's job; what this test pins down is that every attempt after the
  // failure resumes from the checkpoint instead of starting over.
  ChildProcess run(
      cpprunCommand({"--nproc-per-node=2", "--max-restarts=2",
                     sourcePath("examples/python/mnist_ddp.py"), "--epochs", "2", "--quiet",
                     "--checkpoint-dir", dir.path(), "--resume", "--fail-once", "1:2", "--metrics",
                     dir.path() + "/m.jsonl"}),
      {{"PYTHON_EXEC", cpprun::testing::torch2().python}, {"PYTHONFAULTHANDLER", "1"}});
  auto status = run.wait(240s);
  REQUIRE(status.has_value());
  INFO(run.output());
  REQUIRE(exitCodeOf(*status) == 0);
  CHECK_THAT(run.output(), Catch::Contains("RuntimeError: --fail-once: rank 1 fails at epoch 2"));
  CHECK_THAT(run.output(), Catch::Contains("restart 1 of 2"));
  CHECK_THAT(run.output(), Catch::Contains("[default0]:Resuming from " + dir.path() +
                                           "/mnist_ddp.pt: epoch 1 done, continuing at epoch 2"));
  // One record per epoch: epoch 1 from attempt 0, epoch 2 from a later attempt. A restart from
  // scratch would have written epoch 1 again.
  const auto records = testRecords(dir.path() + "/m.jsonl");
  REQUIRE(records.size() == 2);
  CHECK(records[0].at("epoch") == 1);
  CHECK(records[0].at("restart") == 0);
  CHECK(records[1].at("epoch") == 2);
  CHECK(records[1].at("restart") >= 1);
  CHECK(records[1].at("accuracy").get<double>() >= 93.0);
}
