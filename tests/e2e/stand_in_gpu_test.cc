// GPU discovery and the NCCL paths end to end, on a machine without a GPU: the real cpprun
// binary, its real dlopen, and the stand-in libcuda.so.1 and libnccl.so.2 the tests build
// (tests/support/stand_in_cuda.cc, stand_in_nccl.cc) first in LD_LIBRARY_PATH. Every value
// asserted — device names, PCI bus ids, versions, the text inside the NCCL id — is one only the
// stand-ins report, so none of these tests passes with the real libraries or with none.
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "tests/support/cpprun_test_helpers.h"
#include "tests/support/test_support.h"

namespace {

using namespace cpprun::testing;

const std::string kStandIns = CPPRUN_STAND_IN_DIR;

// The environment of a cpprun on a node whose driver is the stand-in with `devices` devices,
// and whose libnccl.so.2 is the one in stand-ins/<nccl_dir> (the stand-in NCCL, "not-nccl" or
// "not-elf-nccl").
std::map<std::string, std::string> standIns(int devices, const std::string& nccl_dir = "nccl") {
  std::string path = kStandIns + "/driver:" + kStandIns + "/" + nccl_dir;
  const char* inherited = ::getenv("LD_LIBRARY_PATH");
  if (inherited != nullptr && *inherited != '\0') path += std::string(":") + inherited;
  return {{"LD_LIBRARY_PATH", path},
          {"CPPRUN_STAND_IN_CUDA_DEVICES", std::to_string(devices)},
          {"NCCL_SOCKET_IFNAME", "lo"}};
}

std::map<std::string, std::string> with(std::map<std::string, std::string> env,
                                        const std::map<std::string, std::string>& more) {
  for (const auto& [name, value] : more) env[name] = value;
  return env;
}

struct Finished {
  int code = -1;
  std::string output;
};

// cpprun with `args` and `env`, without any GPU list or NCCL choice inherited from the test's
// own environment (the driver decides; `env` may set them again), to its end within 60 s.
Finished runCpprun(const std::vector<std::string>& args,
                   const std::map<std::string, std::string>& env) {
  std::vector<std::string> argv = {"/usr/bin/env"};
  for (const char* name :
       {"CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "CPPRUN_NCCL_LIBRARY"}) {
    if (env.count(name) == 0) {
      argv.push_back("-u");
      argv.push_back(name);
    }
  }
  argv.push_back(CPPRUN_BINARY);
  argv.insert(argv.end(), args.begin(), args.end());
  ChildProcess run(argv, env);
  auto status = run.wait(60s);
  REQUIRE(status.has_value());
  return {exitCodeOf(*status), run.output()};
}

// Runs a job whose workers write their environment, and returns it by rank; REQUIREs that the
// job succeeds with exactly `workers` workers.
std::vector<Json> workerEnvironments(std::vector<std::string> options, size_t workers,
                                     const std::map<std::string, std::string>& env) {
  TempDir dir;
  for (const std::string& a : {std::string("--no-python"), kWorker, std::string("env-json"),
                               dir.path() + "/env-{rank}.json"}) {
    options.push_back(a);
  }
  Finished run = runCpprun(options, env);
  INFO(run.output);
  REQUIRE(run.code == 0);
  std::vector<Json> out;
  for (size_t rank = 0; rank < workers; ++rank) {
    const std::string file = dir.path() + "/env-" + std::to_string(rank) + ".json";
    REQUIRE(std::filesystem::exists(file));
    out.push_back(readJson(file));
  }
  CHECK_FALSE(std::filesystem::exists(dir.path() + "/env-" + std::to_string(workers) + ".json"));
  return out;
}

std::string textOfHex(const std::string& hex) {
  const Bytes bytes = fromHex(hex);
  return std::string(bytes.begin(), bytes.end());
}

const std::string kAllEight = "0,1,2,3,4,5,6,7";

}  // namespace

TEST_CASE(
    "cpprun --nproc-per-node gpu starts a worker per stand-in device, each seeing the node's list",
    "[integration][gpu-stand-in]") {
  std::vector<Json> envs = workerEnvironments({"--nproc-per-node=gpu"}, 8, standIns(8));
  for (size_t rank = 0; rank < envs.size(); ++rank) {
    const Json& e = envs[rank];
    CHECK(e["RANK"] == std::to_string(rank));
    CHECK(e["LOCAL_RANK"] == std::to_string(rank));  // indexes the list below
    CHECK(e["LOCAL_WORLD_SIZE"] == "8");
    CHECK(e["WORLD_SIZE"] == "8");
    CHECK(e["CUDA_VISIBLE_DEVICES"] == kAllEight);
  }
  // auto picks the GPUs too when there are any.
  envs = workerEnvironments({"--nproc-per-node=auto"}, 8, standIns(8));
  CHECK(envs[7]["CUDA_VISIBLE_DEVICES"] == kAllEight);
  // Fewer workers than devices: each still sees all of them, in order.
  envs = workerEnvironments({"--nproc-per-node=3"}, 3, standIns(8));
  CHECK(envs[2]["LOCAL_RANK"] == "2");
  CHECK(envs[2]["CUDA_VISIBLE_DEVICES"] == kAllEight);
}

TEST_CASE("cpprun --virtual-local-rank gives each of 8 workers only its own stand-in device",
          "[integration][gpu-stand-in]") {
  std::vector<Json> envs =
      workerEnvironments({"--nproc-per-node=gpu", "--virtual-local-rank"}, 8, standIns(8));
  for (size_t rank = 0; rank < envs.size(); ++rank) {
    CHECK(envs[rank]["RANK"] == std::to_string(rank));
    CHECK(envs[rank]["LOCAL_RANK"] == "0");
    CHECK(envs[rank]["CUDA_VISIBLE_DEVICES"] == std::to_string(rank));
    CHECK(envs[rank]["LOCAL_WORLD_SIZE"] == "8");
  }
  // More workers than devices cannot each have one: a usage error before anything starts.
  Finished run = runCpprun(
      {"--nproc-per-node=9", "--virtual-local-rank", "--no-python", "/bin/true"}, standIns(8));
  INFO(run.output);
  CHECK(run.code == 2);
  CHECK_THAT(run.output, Catch::Contains("--virtual-local-rank gives each worker one GPU, but 9 "
                                         "workers were asked for") &&
                             Catch::Contains("has 8 GPUs (0,1,2,3,4,5,6,7)"));
}

TEST_CASE("an inherited CUDA_VISIBLE_DEVICES outranks the driver's 8 devices",
          "[integration][gpu-stand-in]") {
  {  // The same node without the list: the driver's 8 devices.
    Finished run =
        runCpprun({"--dry-run", "--nproc-per-node=gpu", "--no-python", "/bin/true"}, standIns(8));
    INFO(run.output);
    REQUIRE(run.code == 0);
    REQUIRE_THAT(run.output, Catch::Contains("  GPUs        0,1,2,3,4,5,6,7 (from driver)\n"));
  }
  // Not through runCpprun() here: this test's point is the inherited list.
  const auto env = with(standIns(8), {{"CUDA_VISIBLE_DEVICES", "6,2,7"}});
  TempDir dir;
  for (bool virtual_local_rank : {false, true}) {
    std::vector<std::string> argv = {
        CPPRUN_BINARY, "--nproc-per-node=gpu", "--no-python", kWorker, "env-json", ""};
    const std::string tag = virtual_local_rank ? "virtual" : "default";
    argv.back() = dir.path() + "/" + tag + "-{rank}.json";
    if (virtual_local_rank) argv.insert(argv.begin() + 1, "--virtual-local-rank");
    ChildProcess run(argv, env);
    auto status = run.wait(60s);
    REQUIRE(status.has_value());
    INFO(run.output());
    REQUIRE(exitCodeOf(*status) == 0);
    const std::vector<std::string> own = {"6", "2", "7"};
    for (int rank = 0; rank < 3; ++rank) {
      Json e = readJson(dir.path() + "/" + tag + "-" + std::to_string(rank) + ".json");
      CHECK(e["CUDA_VISIBLE_DEVICES"] == (virtual_local_rank ? own[rank] : "6,2,7"));
      CHECK(e["LOCAL_RANK"] == (virtual_local_rank ? "0" : std::to_string(rank)));
    }
    CHECK_FALSE(std::filesystem::exists(dir.path() + "/" + tag + "-3.json"));
  }
}

TEST_CASE("cpprun --check lists the stand-in driver's version, 8 names and PCI bus ids",
          "[integration][gpu-stand-in][check]") {
  Finished run = runCpprun({"--check", "--nproc-per-node=gpu"},
                           with(standIns(8), {{"CPPRUN_STAND_IN_CUDA_DRIVER_VERSION", "13020"}}));
  INFO(run.output);
  CHECK(run.code == 0);
  std::string devices;
  for (int i = 0; i < 8; ++i) {
    char bus[16];
    std::snprintf(bus, sizeof bus, "%02X", 0xA0 + i);
    devices += std::string(i ? "; " : "") + std::to_string(i) + ": Stand-in GPU " +
               std::to_string(i) + " (0000:" + bus + ":00.0)";
  }
  CHECK_THAT(run.output,
             Catch::Contains("[ ok ] CUDA driver  13.2, 8 device(s): " + devices + "\n"));
  CHECK_THAT(run.output,
             Catch::Contains("[ ok ] GPUs         8 visible to the workers (from driver) for 8 "
                             "worker(s)"));
  CHECK_THAT(run.output, Catch::Contains("[ ok ] NCCL         2.19.3 (libnccl.so.2)"));
  CHECK_THAT(run.output, Catch::Contains("result: ok"));
}

TEST_CASE("a driver whose cuInit fails: --check names the error, --nproc-per-node gpu refuses",
          "[integration][gpu-stand-in][check]") {
  const auto env = with(standIns(8), {{"CPPRUN_STAND_IN_CUDA_INIT_ERROR", "803"}});
  const std::string error =
      "cuInit failed with CUDA_ERROR_SYSTEM_DRIVER_MISMATCH (803: system has unsupported "
      "display driver / cuda driver combination)";
  {  // A job that asks for no GPU runs, and is told the driver is broken.
    Finished run = runCpprun({"--check", "--nproc-per-node=2"}, env);
    INFO(run.output);
    CHECK(run.code == 0);
    CHECK_THAT(run.output, Catch::Contains("[warn] CUDA driver  libcuda.so.1: " + error));
    CHECK_THAT(run.output, Catch::Contains("[ ok ] GPUs         none: the workers run on CPUs"));
  }
  {
    Finished run = runCpprun({"--check", "--nproc-per-node=gpu"}, env);
    INFO(run.output);
    CHECK(run.code == 1);
    CHECK_THAT(run.output, Catch::Contains("[FAIL] workers      --nproc-per-node gpu: the CUDA "
                                           "driver on ") &&
                               Catch::Contains("is installed but fails: libcuda.so.1: " + error));
  }
  {  // The run itself: a usage error naming the driver's error, and no worker started.
    TempDir dir;
    Finished run = runCpprun(
        {"--nproc-per-node=gpu", "--no-python", kWorker, "touch", dir.path() + "/started-{rank}"},
        env);
    INFO(run.output);
    CHECK(run.code == 2);
    CHECK_THAT(run.output, Catch::Contains("cpprun: error: --nproc-per-node gpu: the CUDA driver "
                                           "on ") &&
                               Catch::Contains(error + "; fix the driver, or use a number or cpu"));
    CHECK(std::filesystem::is_empty(dir.path()));
  }
}

TEST_CASE("a driver with no device: --check says 0 devices, --nproc-per-node gpu refuses",
          "[integration][gpu-stand-in][check]") {
  {
    Finished run = runCpprun({"--check"}, standIns(0));
    INFO(run.output);
    CHECK(run.code == 0);
    CHECK_THAT(run.output, Catch::Contains("[ ok ] CUDA driver  12.9, 0 device(s)\n"));
    CHECK_THAT(run.output, Catch::Contains("[ ok ] GPUs         none: the workers run on CPUs\n"));
  }
  {
    Finished run = runCpprun({"--check", "--nproc-per-node=gpu"}, standIns(0));
    INFO(run.output);
    CHECK(run.code == 1);
    CHECK_THAT(run.output, Catch::Contains("[FAIL] workers      --nproc-per-node gpu: no GPU is "
                                           "visible on ") &&
                               Catch::Contains("(GPU list from driver is empty)"));
  }
  {
    Finished run = runCpprun({"--nproc-per-node=gpu", "--no-python", "/bin/true"}, standIns(0));
    INFO(run.output);
    CHECK(run.code == 2);
    CHECK_THAT(run.output, Catch::Contains("cpprun: error: --nproc-per-node gpu: no GPU is "
                                           "visible on "));
  }
  {  // A job with a number of workers runs, on CPUs: no CUDA_VISIBLE_DEVICES.
    std::vector<Json> envs = workerEnvironments({"--nproc-per-node=1"}, 1, standIns(0));
    CHECK_FALSE(envs[0].contains("CUDA_VISIBLE_DEVICES"));
  }
}

TEST_CASE(
    "cpprun --check reports the stand-in NCCL's version, and a missing or broken libnccl.so.2",
    "[integration][gpu-stand-in][check][nccl]") {
  {
    Finished run =
        runCpprun({"--check"}, with(standIns(8), {{"CPPRUN_STAND_IN_NCCL_VERSION", "22105"}}));
    INFO(run.output);
    CHECK(run.code == 0);
    CHECK_THAT(run.output, Catch::Contains("[ ok ] NCCL         2.21.5 (libnccl.so.2): the agent "
                                           "hands the workers an NCCL unique id"));
  }
  {  // Not a shared object: found first, it fails to load, and the loader's reason is shown.
    Finished run = runCpprun({"--check"}, standIns(8, "not-elf-nccl"));
    INFO(run.output);
    CHECK(run.code == 0);
    CHECK_THAT(run.output,
               Catch::Contains("[warn] NCCL         cannot load libnccl.so.2: " + kStandIns +
                               "/not-elf-nccl/libnccl.so.2: invalid ELF header: no "
                               "CPPRUN_NCCL_UNIQUE_ID"));
  }
  {  // A shared object that is not NCCL.
    Finished run = runCpprun({"--check"}, standIns(8, "not-nccl"));
    INFO(run.output);
    CHECK_THAT(run.output,
               Catch::Contains("[warn] NCCL         libnccl.so.2 has no ncclGetUniqueId: no "
                               "CPPRUN_NCCL_UNIQUE_ID"));
  }
  {  // Missing: CPPRUN_NCCL_LIBRARY names a file that is not there (the real libnccl.so.2 the
     // machine may have cannot stand in the way of a path).
    const std::string missing = kStandIns + "/missing/libnccl.so.2";
    Finished run = runCpprun({"--check"}, with(standIns(0), {{"CPPRUN_NCCL_LIBRARY", missing}}));
    INFO(run.output);
    CHECK(run.code == 0);
    CHECK_THAT(run.output, Catch::Contains("[ ok ] NCCL         not loadable (cannot load " +
                                           missing + ": " + missing +
                                           ": cannot open shared object file: No such file or "
                                           "directory); not needed without GPUs"));
  }
}

TEST_CASE("CPPRUN_NCCL_UNIQUE_ID comes from the stand-in's ncclGetUniqueId, fresh per attempt",
          "[integration][gpu-stand-in][nccl]") {
  TempDir dir;
  const std::string d = dir.path();
  ChildProcess run({CPPRUN_BINARY, "--nproc-per-node=2", "--max-restarts=1", "--no-python", kWorker,
                    "store-get", "cpprun/nccl_unique_id", d + "/stored-{restart}-{rank}",
                    "env-json", d + "/env-{restart}-{rank}.json", "exit-if-restart", "0", "5"},
                   with(standIns(2), {{"CPPRUN_NCCL_LIBRARY", kStandIns + "/nccl/libnccl.so.2"}}));
  auto status = run.wait(60s);
  REQUIRE(status.has_value());
  INFO(run.output());
  REQUIRE(exitCodeOf(*status) == 0);
  for (int attempt = 0; attempt < 2; ++attempt) {
    const std::string a = std::to_string(attempt);
    // In attempt 0 every rank exits 5 once it wrote its files; the first to exit has written
    // them whole, the other may be stopped mid-write. Read a rank whose files are complete.
    std::string rank;
    for (const char* r : {"0", "1"}) {
      const std::string env_file = d + "/env-" + a + "-" + r + ".json";
      if (std::filesystem::exists(env_file) && Json::accept(readFile(env_file)) &&
          std::filesystem::exists(d + "/stored-" + a + "-" + r)) {
        rank = r;
        break;
      }
    }
    INFO("attempt " << a);
    REQUIRE_FALSE(rank.empty());
    const std::string id =
        readJson(d + "/env-" + a + "-" + rank + ".json")["CPPRUN_NCCL_UNIQUE_ID"];
    REQUIRE(id.size() == 256);
    // The agent's n-th call to the stand-in (from 0): one call per attempt, for every rank.
    CHECK_THAT(textOfHex(id), Catch::StartsWith("cpprun-stand-in-nccl-id " + a + " "));
    CHECK(readFile(d + "/stored-" + a + "-" + rank) == id);
  }
  // Rank 1 of the attempt that succeeded (in attempt 0 it may be stopped before it writes).
  const std::string id1 = readJson(d + "/env-1-0.json")["CPPRUN_NCCL_UNIQUE_ID"];
  CHECK(readJson(d + "/env-1-1.json")["CPPRUN_NCCL_UNIQUE_ID"] == id1);
  CHECK(readFile(d + "/stored-1-1") == id1);
}

TEST_CASE("without a usable NCCL the workers get no CPPRUN_NCCL_UNIQUE_ID and the log says why",
          "[integration][gpu-stand-in][nccl]") {
  {  // The library does not load.
    TempDir dir;
    ChildProcess run({CPPRUN_BINARY, "--nproc-per-node=1", "--no-python", kWorker, "env-json",
                      dir.path() + "/env.json"},
                     standIns(1, "not-elf-nccl"));
    auto status = run.wait(60s);
    REQUIRE(status.has_value());
    INFO(run.output());
    REQUIRE(exitCodeOf(*status) == 0);
    Json e = readJson(dir.path() + "/env.json");
    CHECK(e["CUDA_VISIBLE_DEVICES"] == "0");
    CHECK_FALSE(e.contains("CPPRUN_NCCL_UNIQUE_ID"));
    CHECK_THAT(run.output(), Catch::Contains("invalid ELF header") &&
                                 Catch::Contains("CPPRUN_NCCL_UNIQUE_ID is not set"));
  }
  {  // It loads, but ncclGetUniqueId fails: the attempt runs without the id.
    TempDir dir;
    ChildProcess run({CPPRUN_BINARY, "--nproc-per-node=1", "--no-python", kWorker, "env-json",
                      dir.path() + "/env.json"},
                     with(standIns(1), {{"CPPRUN_STAND_IN_NCCL_UNIQUE_ID_ERROR", "2"}}));
    auto status = run.wait(60s);
    REQUIRE(status.has_value());
    INFO(run.output());
    REQUIRE(exitCodeOf(*status) == 0);
    CHECK_FALSE(readJson(dir.path() + "/env.json").contains("CPPRUN_NCCL_UNIQUE_ID"));
    CHECK_THAT(run.output(), Catch::Contains("ncclGetUniqueId failed with 2 (unhandled system "
                                             "error"));
  }
}

TEST_CASE("cpprun --dry-run shows the stand-in driver's GPUs, whether NCCL loads, and why not",
          "[integration][gpu-stand-in][nccl]") {
  {
    Finished run =
        runCpprun({"--dry-run", "--nproc-per-node=gpu", "--no-python", "/bin/true"}, standIns(8));
    INFO(run.output);
    CHECK(run.code == 0);
    CHECK_THAT(run.output, Catch::Contains("  GPUs        0,1,2,3,4,5,6,7 (from driver)\n"));
    CHECK_THAT(run.output,
               Catch::Contains("CPPRUN_NCCL_UNIQUE_ID=<a fresh ncclUniqueId per attempt>\n"));
    CHECK_THAT(run.output, !Catch::Contains("no NCCL id"));
  }
  {
    Finished run =
        runCpprun({"--dry-run", "--nproc-per-node=2", "--no-python", "/bin/true"},
                  with(standIns(8, "not-elf-nccl"), {{"CPPRUN_STAND_IN_CUDA_INIT_ERROR", "999"}}));
    INFO(run.output);
    CHECK(run.code == 0);
    CHECK_THAT(run.output, !Catch::Contains("CPPRUN_NCCL_UNIQUE_ID="));
    CHECK_THAT(run.output, Catch::Contains("  note        cannot load libnccl.so.2: " + kStandIns +
                                           "/not-elf-nccl/libnccl.so.2: invalid ELF header\n"));
    CHECK_THAT(run.output,
               Catch::Contains("  note        the CUDA driver fails (libcuda.so.1: cuInit failed "
                               "with CUDA_ERROR_UNKNOWN (999: unknown error)): the workers get no "
                               "GPUs\n"));
    CHECK_THAT(run.output, !Catch::Contains("CUDA_VISIBLE_DEVICES="));
  }
}

TEST_CASE(
    "above CPPRUN_NCCL_RANKS_PER_ID the workers get CPPRUN_NCCL_UNIQUE_IDS: nId fresh stand-in "
    "ids, the same on every rank and in the store, and at or below it nothing changes",
    "[integration][gpu-stand-in][nccl]") {
  TempDir dir;
  const std::string d = dir.path();
  // 4 workers, 1 rank per id: nId 4.
  Finished run = runCpprun(
      {"--nproc-per-node=4", "--no-python", kWorker, "store-get", "cpprun/nccl_unique_ids",
       d + "/stored-{rank}", "env-json", d + "/env-{rank}.json"},
      with(standIns(4), {{"CPPRUN_NCCL_RANKS_PER_ID", "1"}}));
  INFO(run.output);
  REQUIRE(run.code == 0);
  const Json e0 = readJson(d + "/env-0.json");
  const std::string ids = e0["CPPRUN_NCCL_UNIQUE_IDS"];
  REQUIRE(ids.size() == 4 * 256 + 3);
  // The agent's calls 1 to 4 to the stand-in (call 0 made the single id, which stays).
  CHECK_THAT(textOfHex(e0["CPPRUN_NCCL_UNIQUE_ID"]),
             Catch::StartsWith("cpprun-stand-in-nccl-id 0 "));
  for (int i = 0; i < 4; ++i) {
    CHECK_THAT(textOfHex(ids.substr(static_cast<size_t>(i) * 257, 256)),
               Catch::StartsWith("cpprun-stand-in-nccl-id " + std::to_string(i + 1) + " "));
  }
  for (int rank = 0; rank < 4; ++rank) {
    const std::string r = std::to_string(rank);
    CHECK(readJson(d + "/env-" + r + ".json")["CPPRUN_NCCL_UNIQUE_IDS"] == ids);
    CHECK(readFile(d + "/stored-" + r) == ids);
  }
  // At the threshold (4 ranks, 4 per id): the single id only.
  std::vector<Json> at = workerEnvironments({"--nproc-per-node=4"}, 4,
                                            with(standIns(4), {{"CPPRUN_NCCL_RANKS_PER_ID", "4"}}));
  for (const Json& e : at) {
    CHECK(e.contains("CPPRUN_NCCL_UNIQUE_ID"));
    CHECK_FALSE(e.contains("CPPRUN_NCCL_UNIQUE_IDS"));
  }
}

TEST_CASE("a CPPRUN_NCCL_RANKS_PER_ID that is not a number of ranks exits 2 naming it",
          "[integration][gpu-stand-in][nccl]") {
  Finished run = runCpprun({"--nproc-per-node=1", "--no-python", kWorker, "exit", "0"},
                           with(standIns(1), {{"CPPRUN_NCCL_RANKS_PER_ID", "-3"}}));
  CHECK(run.code == 2);
  CHECK_THAT(run.output, Catch::Contains("CPPRUN_NCCL_RANKS_PER_ID=-3"));
}
