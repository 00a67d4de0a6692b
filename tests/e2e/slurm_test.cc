// cpprun under a real Slurm (slurmctld, two slurmd, munge; tests/slurm/slurm_cluster.sh): the
// example batch script runs one agent per node with srun, and the agents find their node rank,
// the node list, the job id and the GPUs in Slurm's variables, with no flags.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <map>
#include <string>
#include <vector>

#include "tests/support/cpprun_test_helpers.h"
#include "tests/support/test_support.h"
#include "tests/support/torch_peers.h"

using namespace cpprun::testing;

namespace {

// Runs COMMAND inside a throw-away Slurm cluster (slurm_cluster.sh) under `dir`, in a private
// PID namespace (every daemon ends with the harness, whatever happens to the test) and a private
// network namespace (clusters of tests running in parallel never collide on Slurm's ports).
ChildProcess inSlurmCluster(const std::string& dir, std::vector<std::string> command,
                            std::map<std::string, std::string> env = {}) {
  // Slurm and munge come from the set-up script: missing here is a failure, not a skip.
  for (const char* tool : {"/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged",
                           "/usr/bin/sbatch", "/usr/bin/unshare", "/usr/sbin/ip"}) {
    INFO(tool);
    REQUIRE(::access(tool, X_OK) == 0);
  }
  std::vector<std::string> argv = {"/usr/bin/unshare",
                                   "--mount",
                                   "--pid",
                                   "--net",
                                   "--fork",
                                   "--kill-child",
                                   "--mount-proc",
                                   sourcePath("tests/slurm/slurm_cluster.sh"),
                                   dir + "/cluster"};
  argv.insert(argv.end(), command.begin(), command.end());
  env["CPPRUN"] = CPPRUN_BINARY;
  return ChildProcess(argv, env);
}

}  // namespace

TEST_CASE("sbatch of the example script: one agent per node, ranks and GPUs from Slurm",
          "[integration][slurm]") {
  TempDir dir;
  const std::string d = dir.path();
  ChildProcess run = inSlurmCluster(
      d, {"sbatch", "--wait", "-o", d + "/slurm-%j.out", sourcePath("examples/slurm/cpprun.sbatch"),
          "--no-python", kWorker, "env-json", d + "/env-{rank}.json"});
  auto status = run.wait(180s);
  REQUIRE(status.has_value());
  INFO(run.output());
  CHECK(exitCodeOf(*status) == 0);

  for (int r = 0; r < 4; ++r) {
    Json e = readJson(d + "/env-" + std::to_string(r) + ".json");
    INFO("rank " << r << ": " << e.dump());
    const std::string job_id = e["SLURM_JOB_ID"];
    CHECK(e["RANK"] == std::to_string(r));
    CHECK(e["WORLD_SIZE"] == "4");
    CHECK(e["LOCAL_RANK"] == std::to_string(r % 2));
    CHECK(e["GROUP_RANK"] == std::to_string(r / 2));
    CHECK(e["GROUP_WORLD_SIZE"] == "2");
    CHECK(e["SLURMD_NODENAME"] == (r < 2 ? "n1" : "n2"));  // node rank = Slurm's node order
    CHECK(e["CUDA_VISIBLE_DEVICES"] == "0,1");             // --gres=gpu:2 per node
    CHECK(e["MASTER_ADDR"] == "n1");                       // the step's first host
    CHECK(e["MASTER_PORT"] == std::to_string(10000 + std::stoi(job_id) % 20000));
    CHECK(e["TORCHELASTIC_RUN_ID"] == job_id);
  }
}

namespace {

// Rank from SLURM_PROCID, world from SLURM_NTASKS, local rank computed, MASTER_ADDR from the
// node list: right only because cpprun rewrites each worker's Slurm task variables.
void slurmNativeScriptRuns(const TorchPeer& peer) {
  requireTorchPeer(peer);
  TempDir dir;
  const std::string d = dir.path();
  ChildProcess run = inSlurmCluster(
      d,
      {"sbatch", "--wait", "-o", d + "/slurm-%j.out", sourcePath("examples/slurm/cpprun.sbatch"),
       sourcePath("examples/python/slurm_native.py"), "--out", d + "/rank-{rank}.json"},
      {{"PYTHON_EXEC", peer.python}});
  auto status = run.wait(180s);
  REQUIRE(status.has_value());
  INFO(run.output());
  CHECK(exitCodeOf(*status) == 0);
  for (int r = 0; r < 4; ++r) {
    Json seen = readJson(d + "/rank-" + std::to_string(r) + ".json");
    INFO("rank " << r << ": " << seen.dump());
    CHECK(seen["rank"] == r);
    CHECK(seen["world_size"] == 4);
    CHECK(seen["local_rank"] == r % 2);
    CHECK(seen["node"] == (r < 2 ? "n1" : "n2"));
    CHECK(seen["master_addr"] == "n1");
    CHECK(seen["rank_sum"] == 0 + 1 + 2 + 3);  // the four ranks formed one group
  }
}

}  // namespace

TEST_CASE("a Slurm-native DDP script runs unchanged as cpprun's workers under sbatch",
          "[integration][slurm][torch]") {
  slurmNativeScriptRuns(torch113());
}

TEST_CASE("torch 2.x: a Slurm-native DDP script runs unchanged as cpprun's workers under sbatch",
          "[integration][slurm][torch][torch2]") {
  slurmNativeScriptRuns(torch2());
}

TEST_CASE("the pre-emption recipe: SIGUSR1 checkpoints, the job requeues and resumes to the end",
          "[integration][slurm][mnist]") {
  TempDir dir;
  const std::string d = dir.path();
  const std::string out = d + "/job.out";
  ChildProcess run = inSlurmCluster(
      d, {sourcePath("tests/slurm/preempt_and_requeue.sh"), out,
          sourcePath("examples/slurm/cpprun-preemptible.sbatch"), CPPRUN_MNIST_BINARY, "--epochs",
          "1", "--max-steps", "60", "--batch-size", "32", "--threads", "1", "--log-interval", "5",
          "--checkpoint-dir", d + "/ckpt"});
  auto status = run.wait(290s);
  REQUIRE(status.has_value());
  const std::string log = readFile(out);
  INFO(run.output() << "\n--- job output ---\n" << log);
  REQUIRE(exitCodeOf(*status) == 0);
  CHECK_THAT(run.output(), Catch::Contains("JobState=COMPLETED"));
  CHECK_THAT(run.output(), Catch::Contains("Restarts=1"));
  // First start: warned, every rank stopped after the same step, checkpoint, requeue.
  CHECK_THAT(log, Catch::Contains("cpprun-preemptible: job"));
  CHECK_THAT(log, Catch::Contains("start 1"));
  CHECK_THAT(log, Catch::Contains("received SIGUSR1; forwarding it to the workers"));
  CHECK_THAT(log, Catch::Contains("[default0]:Stop requested: checkpoint at epoch 1 batch"));
  for (int r = 0; r < 4; ++r) {
    CHECK_THAT(log, Catch::Contains("rank " + std::to_string(r) + ": stopped by SIGUSR1"));
  }
  CHECK_THAT(log, Catch::Contains("pre-empted (SIGUSR1); requeueing job"));
  // Second start: resumed mid-epoch (SLURM_RESTART_COUNT implies --resume) and finished.
  CHECK_THAT(log, Catch::Contains("start 2"));
  CHECK_THAT(log,
             Catch::Contains("[default0]:Resuming from " + d + "/ckpt/latest.ckpt: 0 epochs and"));
  REQUIRE(::access((d + "/ckpt/final.ckpt").c_str(), F_OK) == 0);
}
