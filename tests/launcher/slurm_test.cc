// cpprun under a real Slurm (slurmctld, two slurmd, munge; tests/slurm/slurm_cluster.sh): the
// example batch script runs one agent per node with srun, and the agents find their node rank,
// the node list, the job id and the GPUs in Slurm's variables, with no flags.
#include <unistd.h>

#include <catch2/catch.hpp>

#include "tests/launcher/cpprun_test_helpers.h"
#include "tests/support/test_support.h"

using namespace cpprun::testing;

TEST_CASE("sbatch of the example script: one agent per node, ranks and GPUs from Slurm",
          "[integration][slurm]") {
  // Slurm and munge come from the set-up script: missing here is a failure, not a skip.
  for (const char* tool : {"/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged",
                           "/usr/bin/sbatch", "/usr/bin/unshare"}) {
    INFO(tool);
    REQUIRE(::access(tool, X_OK) == 0);
  }
  TempDir dir;
  const std::string d = dir.path();
  // A private PID namespace: every daemon ends with the harness, whatever happens to the test.
  ChildProcess run(
      {"/usr/bin/unshare", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc",
       sourcePath("tests/slurm/slurm_cluster.sh"), d + "/cluster", "sbatch", "--wait", "-o",
       d + "/slurm-%j.out", sourcePath("examples/slurm/cpprun.sbatch"), "--no-python", kWorker,
       "env-json", d + "/env-{rank}.json"},
      {{"CPPRUN", CPPRUN_BINARY}});
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
