#include "launcher/scheduler_env.h"

#include <catch2/catch.hpp>

using namespace cpprun::launcher;
using Env = std::map<std::string, std::string>;

namespace {

SchedulerEnvironment discover(const Env& env) {
  auto r = discoverScheduler(env);
  INFO(r.status().message());
  REQUIRE(r.isOk());
  return r.value();
}

}  // namespace

TEST_CASE("no scheduler: nothing is discovered and nothing changes", "[unit]") {
  SchedulerEnvironment s = discover({{"HOME", "/root"}});
  CHECK(s.scheduler.empty());
  LaunchConfig config;
  Provenance p;
  REQUIRE(applySchedulerEnvironment(s, config, p).isOk());
  CHECK(config.node_rank == 0);
  CHECK(config.max_nodes == 1);
  CHECK(p.empty());
}

TEST_CASE("Slurm srun step: rank, agents, hosts, job id and a port from it", "[unit]") {
  Env env = {{"SLURM_JOB_ID", "123457"},
             {"SLURM_STEP_ID", "0"},
             {"SLURM_PROCID", "2"},
             {"SLURM_NODEID", "2"},
             {"SLURM_NTASKS", "8"},
             {"SLURM_STEP_NUM_TASKS", "3"},
             {"SLURM_JOB_NODELIST", "gpu[01-09]"},
             {"SLURM_STEP_NODELIST", "gpu[07,011-012]"}};
  SchedulerEnvironment s = discover(env);
  CHECK(s.scheduler == "slurm");
  CHECK(s.agent_rank->value == 2);
  CHECK(s.agent_rank->source == "SLURM_PROCID=2");
  CHECK(s.agent_count->value == 3);  // the step's tasks, not the job's
  CHECK(s.hosts->value == std::vector<std::string>{"gpu07", "gpu011", "gpu012"});
  CHECK(s.endpoint_host->value == "gpu07");
  CHECK(s.endpoint_host->source == "first host of SLURM_STEP_NODELIST");
  CHECK(s.endpoint_port->value == 10000 + 123457 % 20000);
  CHECK(s.run_id->value == "123457");

  LaunchConfig config;
  Provenance p;
  REQUIRE(applySchedulerEnvironment(s, config, p).isOk());
  CHECK(config.node_rank == 2);
  CHECK(config.min_nodes == 3);
  CHECK(config.max_nodes == 3);
  CHECK(config.master_addr == "gpu07");
  CHECK(config.master_port == 13457);
  CHECK(config.rdzv_id == "123457");
  CHECK(p["--node-rank"] == "SLURM_PROCID=2");
  CHECK(p["--master-port"] == "10000 + SLURM_JOB_ID % 20000");
}

TEST_CASE("Slurm batch script without srun: one agent, and a note saying how to start more",
          "[unit]") {
  SchedulerEnvironment s = discover({{"SLURM_JOB_ID", "9"},
                                     {"SLURM_PROCID", "0"},
                                     {"SLURM_NNODES", "4"},
                                     {"SLURM_JOB_NODELIST", "n[1-4]"}});
  CHECK_FALSE(s.agent_count.has_value());
  CHECK_FALSE(s.agent_rank.has_value());
  REQUIRE(s.notes.size() == 1);
  CHECK_THAT(s.notes[0], Catch::Contains("srun"));
}

TEST_CASE("flags win over the scheduler's variables", "[unit]") {
  SchedulerEnvironment s = discover({{"SLURM_JOB_ID", "77"},
                                     {"SLURM_STEP_ID", "1"},
                                     {"SLURM_PROCID", "1"},
                                     {"SLURM_NTASKS", "2"},
                                     {"SLURM_STEP_NODELIST", "a,b"}});
  LaunchConfig config;
  config.given = {"--master-addr", "--master-port", "--rdzv-id"};
  config.master_addr = "10.0.0.5";
  config.master_port = 4000;
  config.rdzv_id = "mine";
  Provenance p;
  REQUIRE(applySchedulerEnvironment(s, config, p).isOk());
  CHECK(config.master_addr == "10.0.0.5");
  CHECK(config.master_port == 4000);
  CHECK(config.rdzv_id == "mine");
  CHECK(config.node_rank == 1);
  CHECK(p.count("--master-addr") == 0);
}

TEST_CASE("Open MPI, MVAPICH, PMI and PMIx ranks", "[unit]") {
  SchedulerEnvironment ompi = discover({{"OMPI_COMM_WORLD_RANK", "1"},
                                        {"OMPI_COMM_WORLD_SIZE", "2"},
                                        {"PMIX_RANK", "1"},
                                        {"PMIX_NAMESPACE", "prterun-h-1234@1"},
                                        {"MASTER_ADDR", "10.1.0.1"},
                                        {"MASTER_PORT", "29600"}});
  CHECK(ompi.scheduler == "openmpi");
  CHECK(ompi.agent_rank->value == 1);
  CHECK(ompi.agent_count->value == 2);
  CHECK(ompi.endpoint_host->value == "10.1.0.1");
  CHECK(ompi.endpoint_port->value == 29600);
  CHECK(ompi.run_id->value == "prterun-h-1234@1");

  CHECK(discover({{"MV2_COMM_WORLD_RANK", "3"}, {"MV2_COMM_WORLD_SIZE", "4"}}).scheduler ==
        "mvapich");
  SchedulerEnvironment pmi = discover({{"PMI_RANK", "0"}, {"PMI_SIZE", "5"}});
  CHECK(pmi.scheduler == "pmi");
  CHECK(pmi.agent_count->value == 5);
  SchedulerEnvironment pmix = discover({{"PMIX_RANK", "2"}});
  CHECK(pmix.scheduler == "pmix");
  CHECK_FALSE(pmix.agent_count.has_value());  // PMIx exports no size: --nnodes is needed
}

TEST_CASE("malformed scheduler variables are named", "[unit]") {
  auto bad_rank = discoverScheduler({{"OMPI_COMM_WORLD_RANK", "one"}});
  REQUIRE_FALSE(bad_rank.isOk());
  CHECK_THAT(bad_rank.status().message(), Catch::Contains("OMPI_COMM_WORLD_RANK='one'"));
  auto bad_list = discoverScheduler({{"SLURM_JOB_ID", "1"},
                                     {"SLURM_STEP_ID", "0"},
                                     {"SLURM_PROCID", "0"},
                                     {"SLURM_STEP_NODELIST", "n[1-"}});
  REQUIRE_FALSE(bad_list.isOk());
  CHECK_THAT(bad_list.status().message(), Catch::Contains("SLURM_STEP_NODELIST"));
  auto bad_port = discoverScheduler({{"PMI_RANK", "0"}, {"MASTER_PORT", "70000"}});
  REQUIRE_FALSE(bad_port.isOk());
  CHECK_THAT(bad_port.status().message(), Catch::Contains("MASTER_PORT=70000"));
}

TEST_CASE("a rank outside the agent count is an error naming both sources", "[unit]") {
  SchedulerEnvironment s = discover({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
  LaunchConfig config;
  Provenance p;
  cpprun::Status st = applySchedulerEnvironment(s, config, p);
  REQUIRE_FALSE(st.isOk());
  CHECK_THAT(st.message(), Catch::Contains("OMPI_COMM_WORLD_RANK=3") &&
                               Catch::Contains("OMPI_COMM_WORLD_SIZE=2"));
}

TEST_CASE("several MPI ranks without an endpoint are refused with the recipe", "[unit]") {
  SchedulerEnvironment s = discover({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
  LaunchConfig config;
  Provenance p;
  cpprun::Status st = applySchedulerEnvironment(s, config, p);
  REQUIRE_FALSE(st.isOk());
  CHECK_THAT(st.message(),
             Catch::Contains("no rendezvous endpoint") && Catch::Contains("-x MASTER_ADDR"));
  config.given.insert("--master-addr");
  CHECK(applySchedulerEnvironment(s, config, p).isOk());
}

TEST_CASE("a scheduler's task count over the node limit is refused naming the variable", "[unit]") {
  // On 06341ed SLURM_NTASKS=2147483647 ran into bad_alloc.
  const std::pair<Env, std::string> cases[] = {
      {{{"SLURM_JOB_ID", "1"},
        {"SLURM_STEP_ID", "0"},
        {"SLURM_PROCID", "0"},
        {"SLURM_NTASKS", "2147483647"}},
       "SLURM_NTASKS=2147483647"},
      {{{"SLURM_JOB_ID", "1"},
        {"SLURM_STEP_ID", "0"},
        {"SLURM_PROCID", "0"},
        {"SLURM_STEP_NUM_TASKS", "65537"}},
       "SLURM_STEP_NUM_TASKS=65537"},
      {{{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "100000"}},
       "OMPI_COMM_WORLD_SIZE=100000"},
      {{{"PMI_RANK", "0"}, {"PMI_SIZE", "2147483647"}}, "PMI_SIZE=2147483647"},
      {{{"FLUX_TASK_RANK", "0"}, {"FLUX_JOB_SIZE", "99999999999999999999"}},
       "FLUX_JOB_SIZE=99999999999999999999"},  // past any integer type
  };
  for (const auto& [env, named] : cases) {
    auto r = discoverScheduler(env);
    REQUIRE_FALSE(r.isOk());
    CHECK_THAT(r.status().message(),
               Catch::StartsWith("environment variable " + named) &&
                   Catch::Contains("more than cpprun's limit of 65,536 nodes") &&
                   Catch::Contains("one agent per node"));
  }
  // The bound itself is a job.
  CHECK(discover({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "65536"}})
            .agent_count->value == 65536);
}

TEST_CASE(
    "several nodes started by hand without an endpoint take torchrun's 127.0.0.1, under mpirun "
    "one single-spaced message names the variable",
    "[unit]") {
  LaunchConfig config;
  config.min_nodes = config.max_nodes = 2;
  config.given.insert("--nnodes");
  config.sources["--nnodes"] = "--nnodes";
  Provenance p;
  // torchrun 2.15: --master-addr defaults to 127.0.0.1, the port to 29500 (static).
  REQUIRE(applySchedulerEnvironment(discover({}), config, p).isOk());
  CHECK(config.master_addr == "127.0.0.1");
  LaunchConfig mpi;
  mpi.node_rank = 0;
  cpprun::Status st = applySchedulerEnvironment(
      discover({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}}), mpi, p);
  REQUIRE_FALSE(st.isOk());
  CHECK(st.message().find("  ") == std::string::npos);
  CHECK_THAT(st.message(),
             Catch::StartsWith("this openmpi job has 2 agents (OMPI_COMM_WORLD_SIZE=2) but no "
                               "rendezvous endpoint: give --rdzv-endpoint HOST:PORT or "
                               "--master-addr, or export MASTER_ADDR"));
}

TEST_CASE("scheduler values in errors and sources are cut when long", "[unit]") {
  const std::string huge(128 * 1024, '9');
  auto bad = discoverScheduler({{"OMPI_COMM_WORLD_RANK", "x" + huge}});
  REQUIRE_FALSE(bad.isOk());
  CHECK(bad.status().message().size() < 300);
  CHECK_THAT(bad.status().message(), Catch::Contains("(131073 bytes)"));
  auto hosts = discoverScheduler({{"SLURM_JOB_ID", "1"},
                                  {"SLURM_STEP_ID", "0"},
                                  {"SLURM_PROCID", "0"},
                                  {"SLURM_STEP_NODELIST", "n[" + huge}});
  REQUIRE_FALSE(hosts.isOk());
  CHECK(hosts.status().message().size() < 300);
  SchedulerEnvironment s = discover({{"PMI_RANK", "0"}, {"MASTER_ADDR", "h" + huge}});
  CHECK(s.endpoint_host->value.size() == huge.size() + 1);  // the value is kept whole
  CHECK(s.endpoint_host->source.size() < 100);              // its description is not
}
