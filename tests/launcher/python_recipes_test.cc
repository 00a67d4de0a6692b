// The PyTorch scripts in examples/python run unchanged under cpprun with Debian's torch 1.13
// (gloo, CPU): the cluster-guide DDP MNIST trainer reaches its accuracy, under cpprun and under
// torch's own launcher, and the "hello" script reports every rank.
#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/launcher/cpprun_test_helpers.h"
#include "tests/support/test_support.h"
#include "tests/support/training_results.h"

using cpprun::testing::ChildProcess;
using cpprun::testing::cpprunCommand;
using cpprun::testing::exitCodeOf;
using cpprun::testing::freeTcpPort;
using cpprun::testing::sourcePath;
using cpprun::testing::TempDir;
using cpprun::testing::testRecords;
using namespace std::chrono_literals;

TEST_CASE("the cluster-guide DDP MNIST script trains under cpprun and under torch's launcher",
          "[integration][torch][recipes]") {
  TempDir dir;
  const std::string script = sourcePath("examples/python/mnist_ddp.py");
  ChildProcess run(
      cpprunCommand({"--nproc-per-node=2", script, "--epochs", "2", "--quiet", "--checkpoint-dir",
                     dir.path(), "--metrics", dir.path() + "/cpprun.jsonl"}),
      {{"PYTHON_EXEC", CPPRUN_PYTHON}});
  auto status = run.wait(240s);
  REQUIRE(status.has_value());
  INFO(run.output());
  REQUIRE(exitCodeOf(*status) == 0);
  const auto records = testRecords(dir.path() + "/cpprun.jsonl");
  REQUIRE(records.size() == 2);
  CHECK(records.back().at("world_size") == 2);
  // PyTorch reaches 94.7% after 2 epochs on the shipped digits (docs/benchmarks.md).
  CHECK(records.back().at("accuracy").get<double>() >= 93.0);
  // Rank 0 saved the checkpoint, atomically (no temporary file left).
  CHECK(std::ifstream(dir.path() + "/mnist_ddp.pt").good());
  CHECK_FALSE(std::ifstream(dir.path() + "/mnist_ddp.pt.tmp").good());

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
  ChildProcess run(
      cpprunCommand({"--nproc-per-node=2", sourcePath("examples/python/hello.py")}),
      {{"PYTHON_EXEC", CPPRUN_PYTHON}, {"NCCL_DEBUG", "INFO"}, {"NCCL_SOCKET_IFNAME", "lo"}});
  auto status = run.wait(120s);
  REQUIRE(status.has_value());
  INFO(run.output());
  REQUIRE(exitCodeOf(*status) == 0);
  for (const std::string rank : {"0", "1"}) {
    CHECK_THAT(run.output(), Catch::Contains("[default" + rank + "]:hello from rank " + rank +
                                             "/2 local_rank " + rank + "/2 node 0 host "));
  }
  CHECK_THAT(run.output(), Catch::Contains("device cpu (cpu) backend gloo all_reduce 2 NCCL: "));
  // The user's NCCL settings reach the workers, next to the one cpprun adds (torch 1.x's
  // spelling of TORCH_NCCL_ASYNC_ERROR_HANDLING).
  CHECK_THAT(run.output(), Catch::Contains("NCCL_ASYNC_ERROR_HANDLING=1 NCCL_DEBUG=INFO "
                                           "NCCL_SOCKET_IFNAME=lo"));
}
