// The cpprun binary end to end: real agent, real workers (cpprun_test_worker and PyTorch),
// real signals. Every wait is bounded; synchronisation goes through the workers' output lines
// (which cpprun relays) and their exit, never through sleeps.
#include <dlfcn.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "agent/processes/process_launcher.h"
#include "rendezvous/tcp_store_server.h"
#include "tests/support/cpprun_test_helpers.h"
#include "tests/support/test_support.h"

namespace {

using namespace cpprun::testing;
using Json = nlohmann::json;
namespace fs = std::filesystem;

}  // namespace

TEST_CASE("workers get torchrun's environment and the agent's store", "[integration]") {
  TempDir dir;
  ChildProcess run(cpprunCommand({"--nproc-per-node=2", "--rdzv-id=envtest", "--max-restarts=1",
                                  kWorker, "env-json", dir.path() + "/env-{rank}.json"}));
  auto status = run.wait(60s);
  REQUIRE(status.has_value());
  INFO(run.output());
  REQUIRE(exitCodeOf(*status) == 0);
  Json e0 = readJson(dir.path() + "/env-0.json");
  Json e1 = readJson(dir.path() + "/env-1.json");
  CHECK(e0["RANK"] == "0");
  CHECK(e1["RANK"] == "1");
  CHECK(e1["LOCAL_RANK"] == "1");
  for (const Json& e : {e0, e1}) {
    CHECK(e["WORLD_SIZE"] == "2");
    CHECK(e["LOCAL_WORLD_SIZE"] == "2");
    CHECK(e["GROUP_RANK"] == "0");
    CHECK(e["GROUP_WORLD_SIZE"] == "1");
    CHECK(e["ROLE_NAME"] == "default");
    CHECK(e["ROLE_WORLD_SIZE"] == "2");
    CHECK(e["MASTER_ADDR"] == "127.0.0.1");
    CHECK(e["TORCHELASTIC_RESTART_COUNT"] == "0");
    CHECK(e["TORCHELASTIC_MAX_RESTARTS"] == "1");
    CHECK(e["TORCHELASTIC_RUN_ID"] == "envtest");
    CHECK(e["TORCHELASTIC_USE_AGENT_STORE"] == "True");
    CHECK(e["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1");
    CHECK(e["NCCL_ASYNC_ERROR_HANDLING"] == "1");
    CHECK(std::stoi(e["OMP_NUM_THREADS"].get<std::string>()) >= 1);
  }
  CHECK(e0["MASTER_PORT"] == e1["MASTER_PORT"]);
  CHECK(std::stoi(e0["MASTER_PORT"].get<std::string>()) > 0);
  CHECK_THAT(e1["TORCHELASTIC_ERROR_FILE"].get<std::string>(),
             Catch::EndsWith("/attempt_0/1/error.json"));
}

TEST_CASE("restarts count up and a later attempt sees none of the earlier keys", "[integration]") {
  TempDir dir;
  std::string d = dir.path();
  // Attempt 0 and 1 write a key without any prefix (as torch 2.x's workers do) and fail;
  // attempt 2 checks that the key is gone and succeeds. Every rank fails only once both ranks
  // have made their checks (each blocks on both "checked" keys), so no check is cut short.
  ChildProcess run(cpprunCommand({"--nproc-per-node=2",
                                  "--max-restarts=2",
                                  "--no-python",
                                  kWorker,
                                  "store-check",
                                  "stale-{rank}",
                                  d + "/check-{restart}-{rank}",
                                  "store-set",
                                  "stale-{rank}",
                                  "x",
                                  "store-set",
                                  "checked-{rank}",
                                  "x",
                                  "store-get",
                                  "checked-0",
                                  d + "/seen-{restart}-{rank}",
                                  "store-get",
                                  "checked-1",
                                  d + "/seen-{restart}-{rank}",
                                  "exit-if-restart",
                                  "0",
                                  "3",
                                  "exit-if-restart",
                                  "1",
                                  "4",
                                  "env-json",
                                  d + "/env-{rank}.json"}));
  auto status = run.wait(60s);
  REQUIRE(status.has_value());
  INFO(run.output());
  CHECK(exitCodeOf(*status) == 0);
  CHECK(readJson(d + "/env-0.json")["TORCHELASTIC_RESTART_COUNT"] == "2");
  CHECK(readFile(d + "/check-2-0") == "0");
  CHECK(readFile(d + "/check-2-1") == "0");
  CHECK(readFile(d + "/check-1-0") == "0");
  CHECK(readFile(d + "/check-1-1") == "0");
  CHECK(run.output().find("restart 2 of 2") != std::string::npos);
}

TEST_CASE("each attempt gets a fresh NCCL unique id, also in the store", "[integration][nccl]") {
  void* nccl = ::dlopen("libnccl.so.2", RTLD_LAZY | RTLD_LOCAL);
  if (nccl == nullptr) {
    // NCCL comes with the CUDA toolkit image, not from Debian.
    WARN("SKIPPED: libnccl.so.2 is not installed here");
    return;
  }
  ::dlclose(nccl);
  TempDir dir;
  std::string d = dir.path();
  ChildProcess run(cpprunCommand({"--nproc-per-node=1", "--max-restarts=1", kWorker, "store-get",
                                  "cpprun/nccl_unique_id", d + "/stored-{restart}", "env-json",
                                  d + "/env-{restart}.json", "exit-if-restart", "0", "5"}),
                   // The agent makes ids only for workers that see a GPU.
                   {{"NCCL_SOCKET_IFNAME", "lo"}, {"CUDA_VISIBLE_DEVICES", "0"}});
  auto status = run.wait(60s);
  REQUIRE(status.has_value());
  INFO(run.output());
  REQUIRE(exitCodeOf(*status) == 0);
  std::string id0 = readJson(d + "/env-0.json")["CPPRUN_NCCL_UNIQUE_ID"];
  std::string id1 = readJson(d + "/env-1.json")["CPPRUN_NCCL_UNIQUE_ID"];
  CHECK(id0.size() == 256);
  CHECK(id0 != id1);
  CHECK(readFile(d + "/stored-0") == id0);
  CHECK(readFile(d + "/stored-1") == id1);
}

TEST_CASE("workers that see no GPU get no NCCL id and the agent does not load NCCL",
          "[integration][nccl]") {
  // The stand-in NCCL always loads and makes ids; with CUDA_VISIBLE_DEVICES empty the workers
  // see no GPU, so NCCL (the real one is ~200 MB) stays off the path to the workers' start.
  TempDir dir;
  std::string d = dir.path();
  ChildProcess run(
      cpprunCommand({"--nproc-per-node=1", kWorker, "store-check", "cpprun/nccl_unique_id",
                     d + "/stored", "env-json", d + "/env.json"}),
      {{"CUDA_VISIBLE_DEVICES", ""},
       {"CPPRUN_NCCL_LIBRARY", std::string(CPPRUN_STAND_IN_DIR) + "/nccl/libnccl.so.2"}});
  auto status = run.wait(60s);
  REQUIRE(status.has_value());
  INFO(run.output());
  REQUIRE(exitCodeOf(*status) == 0);
  CHECK_FALSE(readJson(d + "/env.json").contains("CPPRUN_NCCL_UNIQUE_ID"));
  CHECK(readFile(d + "/stored") == "0");
  CHECK(run.output().find("NCCL") == std::string::npos);
}

TEST_CASE("a failure is reported with the root cause its error file and its stderr",
          "[integration]") {
  TempDir dir;
  std::string own_error_file = dir.path() + "/cpprun-error.json";
  ChildProcess run(
      cpprunCommand({"--nproc-per-node=3", "--shutdown-timeout=5", kWorker, "print", "up {rank}",
                     "exit-if-rank", "0", "0", "eprint", "loading shard 7", "eprint",
                     "about to fail", "write-error-file", "nested", "ValueError: bad shard",
                     "exit-if-rank", "1", "7", "sleep-forever"}),
      {{"TORCHELASTIC_ERROR_FILE", own_error_file}});
  auto status = run.wait(60s);
  REQUIRE(status.has_value());
  const std::string& out = run.output();
  INFO(out);
  CHECK(exitCodeOf(*status) == 1);
  CHECK(out.find("Root Cause (first observed failure):") != std::string::npos);
  CHECK(out.find("ValueError: bad shard") != std::string::npos);
  CHECK(out.find("about to fail") != std::string::npos);  // the stderr tail torchrun loses
  CHECK(out.find("[default1]:loading shard 7") != std::string::npos);
  Json doc = readJson(own_error_file);
  // Rank 1 is the only worker that fails on its own (rank 2 waits and is torn down), so it is the
  // root cause: cpprun's own error file carries rank 1's message in torchrun's shape.
  REQUIRE(doc.contains("message"));
  CHECK(doc["message"].contains("errorCode"));
  CHECK(doc.dump().find("ValueError: bad shard") != std::string::npos);
}

TEST_CASE("teardown is bounded: SIGTERM then SIGKILL after the shutdown timeout", "[integration]") {
  TempDir dir;
  std::string d = dir.path();
  auto started = std::chrono::steady_clock::now();
  // Rank 0 ignores SIGTERM; rank 1 fails only once rank 0 has done so.
  ChildProcess run(cpprunCommand({"--nproc-per-node=2", "--shutdown-timeout=1", kWorker, "ignore",
                                  "TERM", "touch", d + "/ready-{rank}", "wait-file", d + "/ready-0",
                                  "30", "exit-if-rank", "1", "9", "sleep-forever"}));
  auto status = run.wait(30s);
  REQUIRE(status.has_value());
  auto took = std::chrono::steady_clock::now() - started;
  INFO(run.output());
  CHECK(exitCodeOf(*status) == 1);
  CHECK(took >= 1s);
  CHECK(took < 10s);
  CHECK(run.output().find("sending SIGKILL") != std::string::npos);
}

TEST_CASE("handled signals are forwarded to the workers then the job ends 128+N", "[integration]") {
  TempDir dir;
  std::string d = dir.path();
  ChildProcess run(cpprunCommand({"--nproc-per-node=2", "--signals-to-handle=SIGTERM,SIGUSR1",
                                  kWorker, "on-signal", "USR1", d + "/sig-{rank}", "print",
                                  "ready {rank}", "sleep-forever"}));
  REQUIRE(relayed(run, "[default0]:ready 0"));
  REQUIRE(relayed(run, "[default1]:ready 1"));
  run.signal(SIGUSR1);
  auto status = run.wait(30s);
  INFO(run.output());
  REQUIRE(status.has_value());
  CHECK(exitCodeOf(*status) == 128 + SIGUSR1);
  CHECK_THAT(readFile(d + "/sig-0"), Catch::StartsWith("SIGUSR1 "));
  CHECK_THAT(readFile(d + "/sig-1"), Catch::StartsWith("SIGUSR1 "));
}

TEST_CASE("log dir layout redirects and tee follow torchrun", "[integration]") {
  TempDir dir;
  std::string logs = dir.path() + "/logs";
  ChildProcess run(
      cpprunCommand({"--nproc-per-node=2", "--log-dir", logs, "--rdzv-id", "job7", "-r", "1", "-t",
                     "0:2", kWorker, "print", "out of {rank}", "eprint", "err of {rank}"}));
  auto status = run.wait(60s);
  REQUIRE(status.has_value());
  const std::string& out = run.output();
  INFO(out);
  REQUIRE(exitCodeOf(*status) == 0);
  // torchrun's layout: <log dir>/<run id>_<random>/attempt_<n>/<local rank>/, the path logged.
  const std::string run_dir = runDirectoryOf(logs, "job7");
  REQUIRE(!run_dir.empty());
  CHECK_THAT(out, Catch::Contains("this run's logs and error files are in " + run_dir + "\n"));
  std::string attempt = run_dir + "/attempt_0";
  CHECK(readFile(attempt + "/0/stdout.log") == "out of 0\n");
  CHECK(readFile(attempt + "/1/stdout.log") == "out of 1\n");
  CHECK(readFile(attempt + "/0/stderr.log") == "err of 0\n");   // teed
  CHECK_FALSE(fs::exists(attempt + "/1/stderr.log"));           // neither redirected nor teed
  CHECK(out.find("out of") == std::string::npos);               // stdout redirected: files only
  CHECK(out.find("[default0]:err of 0") != std::string::npos);  // tee: console too
  CHECK(out.find("[default1]:err of 1") != std::string::npos);  // plain console
}

namespace {

// Everything under `dir`, not following links: "path/" for a directory, "path -> target" for a
// link, "path: content" for a file.
std::set<std::string> treeOf(const std::string& dir) {
  std::set<std::string> tree;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    const std::string rel = e.path().lexically_relative(dir).string();
    if (e.is_symlink()) {
      tree.insert(rel + " -> " + fs::read_symlink(e.path()).string());
    } else if (e.is_directory()) {
      tree.insert(rel + "/");
    } else {
      tree.insert(rel + ": " + readFile(e.path().string()));
    }
  }
  return tree;
}

// A directory another user chose: a canary file and an attempt_0/ with a file of its own.
std::string plantVictim(const std::string& path) {
  fs::create_directories(path + "/attempt_0");
  std::ofstream(path + "/canary") << "canary\n";
  std::ofstream(path + "/attempt_0/keep") << "keep\n";
  return path;
}

// Mode bits of `path` (not following a link).
unsigned modeOf(const std::string& path) {
  return static_cast<unsigned>(fs::symlink_status(path).permissions()) & 07777;
}

ChildProcess runWithLogDir(const std::string& logs, const std::string& id) {
  return ChildProcess(
      cpprunCommand({"--nproc-per-node=2", "--max-restarts=1", "--log-dir", logs, "--rdzv-id", id,
                     "-r", "3", kWorker, "print", "out of {rank}", "exit-if-restart", "0", "1"}));
}

}  // namespace

TEST_CASE(
    "log dir: the run's directory is new and 0700, so is every attempt's, the logs are in them",
    "[integration][security]") {
  TempDir dir;
  const std::string logs = dir.path() + "/logs";  // made by cpprun
  ChildProcess run = runWithLogDir(logs, "fresh");
  auto status = run.wait(60s);
  REQUIRE(status.has_value());
  INFO(run.output());
  REQUIRE(exitCodeOf(*status) == 0);  // attempt 0 failed, attempt 1 succeeded
  const std::string run_dir = runDirectoryOf(logs, "fresh");
  REQUIRE(!run_dir.empty());
  CHECK(modeOf(run_dir) == 0700);
  CHECK(modeOf(run_dir + "/attempt_0") == 0700);
  CHECK(modeOf(run_dir + "/attempt_1") == 0700);
  CHECK(readFile(run_dir + "/attempt_1/1/stdout.log") == "out of 1\n");
  CHECK(fs::exists(run_dir + "/attempt_0/0/stdout.log"));
  // A second run with the same id gets a directory of its own; the first one's stays as it was.
  const std::set<std::string> first = treeOf(run_dir);
  ChildProcess again = runWithLogDir(logs, "fresh");
  auto status2 = again.wait(60s);
  REQUIRE(status2.has_value());
  REQUIRE(exitCodeOf(*status2) == 0);
  CHECK(treeOf(run_dir) == first);
  CHECK(std::distance(fs::directory_iterator(logs), fs::directory_iterator()) == 2);
}

TEST_CASE(
    "log dir: a link planted at <log dir>/<run id> is not followed: its target keeps its files "
    "and gets none of the run's",
    "[integration][security]") {
  TempDir dir;
  const std::string victim = plantVictim(dir.path() + "/victim");
  const std::set<std::string> before = treeOf(victim);
  const std::string logs = dir.path() + "/logs";
  fs::create_directories(logs);
  fs::create_directory_symlink(victim, logs + "/job7");
  ChildProcess run = runWithLogDir(logs, "job7");
  auto status = run.wait(60s);
  REQUIRE(status.has_value());
  INFO(run.output());
  REQUIRE(exitCodeOf(*status) == 0);
  CHECK(treeOf(victim) == before);  // attempt_0/keep not deleted, no log written there
  CHECK(fs::read_symlink(logs + "/job7") == victim);
  const std::string run_dir = runDirectoryOf(logs, "job7");
  REQUIRE(!run_dir.empty());
  CHECK(readFile(run_dir + "/attempt_1/0/stdout.log") == "out of 0\n");
}

TEST_CASE(
    "log dir: a link planted as attempt_0 in an existing <log dir>/<run id> is neither "
    "followed nor removed",
    "[integration][security]") {
  TempDir dir;
  const std::string victim = plantVictim(dir.path() + "/victim");
  const std::set<std::string> before = treeOf(victim);
  const std::string logs = dir.path() + "/logs";
  fs::create_directories(logs + "/job8");
  fs::create_directory_symlink(victim, logs + "/job8/attempt_0");
  ChildProcess run = runWithLogDir(logs, "job8");
  auto status = run.wait(60s);
  REQUIRE(status.has_value());
  INFO(run.output());
  REQUIRE(exitCodeOf(*status) == 0);
  CHECK(treeOf(victim) == before);
  CHECK(fs::is_symlink(logs + "/job8/attempt_0"));
  CHECK(fs::read_symlink(logs + "/job8/attempt_0") == victim);
  CHECK(treeOf(logs + "/job8") == std::set<std::string>{"attempt_0 -> " + victim});
  CHECK(!runDirectoryOf(logs, "job8").empty());
}

TEST_CASE(
    "log dir: one where another user could replace the run's directory is refused with exit 2 "
    "before anything starts, and a sticky one (as /tmp) is taken",
    "[integration][security]") {
  TempDir dir;
  const std::string logs = dir.path() + "/open";
  fs::create_directories(logs);
  fs::permissions(logs, fs::perms::all);  // 0777, no sticky bit
  auto runOnce = [&](const std::string& id) {
    ChildProcess run(cpprunCommand({"--nproc-per-node=1", "--log-dir", logs, "--rdzv-id", id,
                                    kWorker, "touch", dir.path() + "/" + id + ".ran"}));
    auto status = run.wait(60s);
    REQUIRE(status.has_value());
    return std::make_pair(exitCodeOf(*status), run.output());
  };
  auto [code, out] = runOnce("open");
  INFO(out);
  CHECK(code == 2);
  CHECK_THAT(out, Catch::Contains("cpprun: error: --log-dir: anyone may write " + logs +
                                  " (mode 0777) and it has no sticky bit"));
  CHECK(fs::is_empty(logs));
  CHECK_FALSE(fs::exists(dir.path() + "/open.ran"));
  fs::permissions(logs, fs::perms::all | fs::perms::sticky_bit);  // 1777, as /tmp
  auto [sticky_code, sticky_out] = runOnce("sticky");
  INFO(sticky_out);
  CHECK(sticky_code == 0);
  CHECK(fs::exists(dir.path() + "/sticky.ran"));
  CHECK(!runDirectoryOf(logs, "sticky").empty());
  if (::geteuid() == 0) {  // a directory of another user: only root can make one here
    const std::string theirs = dir.path() + "/theirs";
    fs::create_directories(theirs);
    REQUIRE(::chown(theirs.c_str(), 54321, 54321) == 0);
    ChildProcess run(cpprunCommand({"--nproc-per-node=1", "--log-dir", theirs, "--rdzv-id", "t",
                                    kWorker, "touch", dir.path() + "/theirs.ran"}));
    auto status = run.wait(60s);
    REQUIRE(status.has_value());
    INFO(run.output());
    CHECK(exitCodeOf(*status) == 2);
    CHECK_THAT(run.output(),
               Catch::Contains("--log-dir: " + theirs + " belongs to another user (uid 54321)"));
    CHECK(fs::is_empty(theirs));
    CHECK_FALSE(fs::exists(dir.path() + "/theirs.ran"));
  }
}

TEST_CASE("flooded output reaches the console in whole prefixed lines", "[integration]") {
  TempDir dir;
  ChildProcess run(cpprunCommand({"--nproc-per-node=2", kWorker, "flood", "20000", "100"}));
  auto status = run.wait(120s);
  REQUIRE(status.has_value());
  REQUIRE(exitCodeOf(*status) == 0);
  std::istringstream lines(run.output());
  std::string line;
  size_t flood_lines = 0;
  size_t broken = 0;
  while (std::getline(lines, line)) {
    if (line.rfind("[default", 0) != 0) continue;
    ++flood_lines;
    // "[defaultR]:" + 99 characters ("R:i:xxx..."), nothing else on the line.
    std::string body = line.substr(line.find("]:") + 2);
    if (body.size() != 99 || body.find_first_of("[]") != std::string::npos) ++broken;
  }
  CHECK(flood_lines == 40000);
  CHECK(broken == 0);
}

// Two workers, each with two grandchildren in its group and one daemon that left it, all
// running once both workers said "ready". Returns every pid below cpprun (agent included).
static std::vector<pid_t> startProcessTree(ChildProcess& run, const std::string& d) {
  REQUIRE(relayed(run, "[default0]:ready"));
  REQUIRE(relayed(run, "[default1]:ready"));
  std::vector<pid_t> everything = cpprun::agent::descendantsOf(run.pid());
  std::vector<pid_t> expected;
  for (const char* f : {"/gc-0", "/gc-1", "/daemon-0", "/daemon-1"}) {
    for (pid_t p : pidsIn(d + f)) expected.push_back(p);
  }
  REQUIRE(expected.size() == 6);
  for (pid_t p : expected) {
    CHECK(std::find(everything.begin(), everything.end(), p) != everything.end());
  }
  CHECK(everything.size() == 9);  // agent, 2 workers, 4 grandchildren, 2 daemons
  return everything;
}

static std::vector<std::string> processTreeCommand(const std::string& d) {
  return cpprunCommand({"--nproc-per-node=2", kWorker, "fork-grandchildren", "2", d + "/gc-{rank}",
                        "fork-daemon", d + "/daemon-{rank}", "print", "ready {rank}",
                        "sleep-forever"});
}

// The entries of `dir` (the run's temporary directory goes under $TMPDIR).
static std::vector<std::string> entriesOf(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().string());
  return names;
}

TEST_CASE("no worker or grandchild survives kill -9 of the agent, nor its run directory",
          "[integration]") {
  TempDir dir;
  TempDir tmp;  // $TMPDIR of cpprun: where its temporary run directory goes
  ChildProcess run(processTreeCommand(dir.path()), {{"TMPDIR", tmp.path()}});
  std::vector<pid_t> everything = startProcessTree(run, dir.path());
  REQUIRE(entriesOf(tmp.path()).size() == 1);
  // cpprun's pid is the guardian; its one child is the agent.
  std::vector<pid_t> agent = cpprun::agent::childrenOf(run.pid());
  REQUIRE(agent.size() == 1);
  REQUIRE(::kill(agent[0], SIGKILL) == 0);
  auto status = run.wait(30s);
  REQUIRE(status.has_value());
  CHECK(exitCodeOf(*status) == 128 + SIGKILL);
  CHECK(allGone(everything));
  // The guardian removed it: the agent could not.
  CHECK(entriesOf(tmp.path()).empty());
}

TEST_CASE("no worker or grandchild survives kill -9 of cpprun itself, nor its run directory",
          "[integration]") {
  TempDir dir;
  TempDir tmp;
  ChildProcess run(processTreeCommand(dir.path()), {{"TMPDIR", tmp.path()}});
  std::vector<pid_t> everything = startProcessTree(run, dir.path());
  run.signal(SIGKILL);
  auto status = run.wait(30s);
  REQUIRE(status.has_value());
  CHECK(allGone(everything));
  // The agent removed it on its way out (the guardian could not); `everything` includes the
  // agent, so it is done.
  CHECK(entriesOf(tmp.path()).empty());
}

TEST_CASE("grandchildren of a failed worker are killed on teardown", "[integration]") {
  TempDir dir;
  std::string d = dir.path();
  ChildProcess run(
      cpprunCommand({"--nproc-per-node=1", kWorker, "fork-grandchildren", "2", d + "/gc-{rank}",
                     "fork-daemon", d + "/daemon-{rank}", "exit", "3"}));
  auto status = run.wait(30s);
  REQUIRE(status.has_value());
  INFO(run.output());
  CHECK(exitCodeOf(*status) == 1);
  std::vector<pid_t> left = pidsIn(d + "/gc-0");
  for (pid_t p : pidsIn(d + "/daemon-0")) left.push_back(p);
  REQUIRE(left.size() == 3);
  // cpprun has exited: they must be gone already, not eventually.
  for (pid_t p : left) CHECK_FALSE(alive(p));
}

TEST_CASE("dry run prints the plan and starts nothing", "[integration]") {
  TempDir dir;
  ChildProcess run(
      cpprunCommand({"--nproc-per-node=2", "--dry-run", kWorker, "touch", dir.path() + "/ran"}));
  auto status = run.wait(30s);
  REQUIRE(status.has_value());
  CHECK(exitCodeOf(*status) == 0);
  CHECK(run.output().find("worker local_rank 1 rank 1:") != std::string::npos);
  CHECK(run.output().find("WORLD_SIZE=2") != std::string::npos);
  CHECK_FALSE(fs::exists(dir.path() + "/ran"));
}

TEST_CASE("bad input exits 2 or 3 with the culprit named", "[integration]") {
  ChildProcess bad_flag(cpprunCommand({"--nproc-per-nod=2x", kWorker}));
  auto s1 = bad_flag.wait(30s);
  REQUIRE(s1.has_value());
  CHECK(exitCodeOf(*s1) == 2);
  CHECK(bad_flag.output().find("--nproc-per-node") != std::string::npos);

  ChildProcess missing(cpprunCommand({"--nproc-per-node=2", "/nonexistent/trainer"}));
  auto s2 = missing.wait(30s);
  REQUIRE(s2.has_value());
  CHECK(exitCodeOf(*s2) == 3);
  CHECK(missing.output().find("/nonexistent/trainer") != std::string::npos);

  // A port in use is named, not retried forever.
  ChildProcess first(
      cpprunCommand({"--nproc-per-node=1", "--master-port=0", kWorker, "print", "x"}));
  auto s3 = first.wait(30s);
  REQUIRE(s3.has_value());
}

namespace {

// The sanitizers reserve terabytes of address space for their shadow memory: an address-space
// limit would stop them, not the program.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

// `argv` under the shell's `ulimits` (e.g. "-n 256": 256 open files, soft and hard) and a 2 GiB
// address-space limit where the build allows one, so that a cpprun that sizes something by an
// absurd count fails fast instead of eating the machine's memory.
std::vector<std::string> withLimits(std::vector<std::string> argv, const std::string& ulimits) {
  std::string script = kSanitized ? "" : "ulimit -v 2097152 && ";
  if (!ulimits.empty()) script += "ulimit " + ulimits + " && ";
  argv.insert(argv.begin(), {"/bin/sh", "-c", script + "exec \"$0\" \"$@\""});
  return argv;
}

}  // namespace

TEST_CASE("sizes over cpprun's limits exit 2 at once naming the source, also with --dry-run",
          "[integration]") {
  // On 06341ed each of these ran out of memory (PET_NPROC_PER_NODE: ~1 GB/s to bad_alloc, deaf to
  // SIGTERM) or forked workers until descriptors ran out (--nproc-per-node 100000, not run here:
  // the bound it hits is the same as PET_NPROC_PER_NODE's).
  struct Case {
    std::vector<std::string> args;
    std::map<std::string, std::string> env;
    std::string named;
    std::string ulimits;
  };
  const Case cases[] = {
      {{"--dry-run", kWorker}, {{"PET_NPROC_PER_NODE", "1000000000"}}, "PET_NPROC_PER_NODE", ""},
      {{"--nnodes=2147483647", "--master-addr=127.0.0.1", "--dry-run", kWorker},
       {},
       "--nnodes",
       ""},
      {{"--dry-run", kWorker},
       {{"SLURM_JOB_ID", "7"},
        {"SLURM_STEP_ID", "0"},
        {"SLURM_PROCID", "0"},
        {"SLURM_NTASKS", "2147483647"},
        {"SLURM_STEP_NODELIST", "n1"}},
       "SLURM_NTASKS=2147483647",
       ""},
      {{"--nproc-per-node=gpu", "--dry-run", kWorker},
       {{"CUDA_VISIBLE_DEVICES", "-1"}},
       "CUDA_VISIBLE_DEVICES=-1",
       ""},
      // 100 workers need 464 descriptors in the agent.
      {{"--nproc-per-node=100", "--dry-run", kWorker}, {}, "RLIMIT_NOFILE", "-n 256"},
  };
  for (const Case& c : cases) {
    const auto start = std::chrono::steady_clock::now();
    ChildProcess run(withLimits(cpprunCommand(c.args), c.ulimits), c.env);
    auto status = run.wait(10s);
    const auto took = std::chrono::steady_clock::now() - start;
    INFO(run.output());
    REQUIRE(status.has_value());
    CHECK(exitCodeOf(*status) == 2);
    CHECK_THAT(run.output(), Catch::StartsWith("cpprun: error: ") && Catch::Contains(c.named));
    CHECK(run.output().find("worker local_rank") == std::string::npos);  // no plan printed
    CHECK(took < 2s);  // measured: a few ms; the bound leaves room for loaded sanitizer runs
  }
}

TEST_CASE("a PyTorch DDP script written for torchrun runs unchanged", "[integration][torch]") {
  TempDir dir;
  ChildProcess run(cpprunCommand({"--nproc-per-node=2", sourcePath("examples/python/ddp_train.py"),
                                  "--out", dir.path()}),
                   {{"PYTHON_EXEC", CPPRUN_PYTHON}});
  auto status = run.wait(170s);
  REQUIRE(status.has_value());
  INFO(run.output());
  REQUIRE(exitCodeOf(*status) == 0);
  Json r0 = readJson(dir.path() + "/result-0.json");
  Json r1 = readJson(dir.path() + "/result-1.json");
  CHECK(r0["all_reduce"] == 3.0);  // (rank+1) summed over 2 ranks
  CHECK(r0["world_size"] == 2);
  // DDP keeps the replicas identical: same parameters on both ranks after training.
  CHECK(r0["param_checksum"] == r1["param_checksum"]);
}

TEST_CASE("worker-hosts-store leaves the port to worker rank 0", "[integration]") {
  TempDir dir;
  std::string d = dir.path();
  ChildProcess run(cpprunCommand(
      {"--nproc-per-node=1", "--worker-hosts-store", kWorker, "env-json", d + "/env.json"}));
  auto status = run.wait(30s);
  REQUIRE(status.has_value());
  INFO(run.output());
  REQUIRE(exitCodeOf(*status) == 0);
  Json e = readJson(d + "/env.json");
  CHECK(e["TORCHELASTIC_USE_AGENT_STORE"] == "False");
  int port = std::stoi(e["MASTER_PORT"].get<std::string>());
  CHECK(port > 0);
  // The port is free for rank 0 to bind: the agent does not hold it.
  cpprun::rendezvous::TcpStoreServerOptions o;
  o.port = static_cast<uint16_t>(port);
  auto server = cpprun::rendezvous::BackgroundTcpStoreServer::start(o);
  CHECK(server.isOk());
}

TEST_CASE("the line prefix template from TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE is honoured",
          "[integration]") {
  ChildProcess run(
      cpprunCommand({"--nproc-per-node=2", "--role=trainer", kWorker, "print", "hello"}),
      {{"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "<${role_name}:${local_rank}> "}});
  auto status = run.wait(30s);
  REQUIRE(status.has_value());
  INFO(run.output());
  REQUIRE(exitCodeOf(*status) == 0);
  CHECK(run.output().find("<trainer:0> hello\n") != std::string::npos);
  CHECK(run.output().find("<trainer:1> hello\n") != std::string::npos);
}

TEST_CASE("an --rdzv-conf key cpprun does not use is named in a warning, also on one node",
          "[integration]") {
  ChildProcess run(
      cpprunCommand({"--nproc-per-node=1", "--rdzv-conf=read_timeout=60,join_timeout=9", kWorker,
                     "print", "hello"}));
  auto status = run.wait(30s);
  REQUIRE(status.has_value());
  INFO(run.output());
  REQUIRE(exitCodeOf(*status) == 0);
  CHECK(run.output().find("--rdzv-conf read_timeout: not a key cpprun uses; ignored") !=
        std::string::npos);
  CHECK(run.output().find("--rdzv-conf join_timeout") == std::string::npos);
}

TEST_CASE("workers get stdio only: no store socket or other agent descriptor leaks to them",
          "[integration]") {
  TempDir dir;
  const std::string d = dir.path();
  // Attempt 0's workers start after the store listens and serves clients; attempt 1's after
  // many more agent descriptors existed. Each rank fails attempt 0 only once both ranks have
  // listed their descriptors (so none is torn down before it did).
  ChildProcess run(
      cpprunCommand({"--nproc-per-node=2", "--max-restarts=1", "--no-python", kWorker, "list-fds",
                     d + "/fds-{restart}-{rank}", "store-set", "listed-{rank}", "1", "store-get",
                     "listed-0", d + "/seen-{rank}", "store-get", "listed-1", d + "/seen-{rank}",
                     "exit-if-restart", "0", "3"}));
  auto status = run.wait(60s);
  REQUIRE(status.has_value());
  INFO(run.output());
  CHECK(exitCodeOf(*status) == 0);
  for (const char* f : {"/fds-0-0", "/fds-0-1", "/fds-1-0", "/fds-1-1"}) {
    INFO(f);
    CHECK(readFile(d + f) == "\n");
  }
}

TEST_CASE("the agent's store reads torch 2.1 clients with rdzv-conf store_legacy_numbering=2.1",
          "[integration]") {
  // The worker sends type 7 as its connection's first request and prints the reply: torch 2.1's
  // DELETE_KEY gets an i64 (0 keys erased); read as 1.13 it is WATCH_KEY, answered 03.
  const std::string code =
      "import os, socket\n"
      "s = socket.create_connection((os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT'])),"
      " timeout=20)\n"
      "s.sendall(bytes.fromhex('0705000000000000002f6b657931'))\n"
      "buf = s.recv(1)\n"
      "while buf != b'\\x03' and 0 < len(buf) < 8:\n"
      "    buf += s.recv(8 - len(buf))\n"
      "print('REPLY', buf.hex(), flush=True)\n";
  for (std::string numbering : {"1.13", "2.1"}) {
    INFO(numbering);
    ChildProcess run(
        cpprunCommand({"--nproc-per-node=1", "--rdzv-conf", "store_legacy_numbering=" + numbering,
                       CPPRUN_PYTHON, "-c", code}));
    auto status = run.wait(60s);
    REQUIRE(status.has_value());
    INFO(run.output());
    REQUIRE(exitCodeOf(*status) == 0);
    CHECK_THAT(run.output(),
               Catch::Contains(numbering == "2.1" ? "REPLY 0000000000000000" : "REPLY 03"));
  }
}
