// The drop-in contract, executable: the same workers under torch 2.x's own `torchrun` (from the
// pinned venv, CPPRUN_TORCH2_PYTHON) and under cpprun, with the same flags, side by side.
//
//   * Environment: every worker runs tests/torch/dump_env.py, which writes its whole
//     environment. After normalising what belongs to one run only (ports, the launchers' run
//     directories, random run ids, this host's name), the two launchers' environments must
//     differ exactly as allowedBecause() below says, each difference with its reason; any other
//     difference fails with a table of them. docs/torchrun-compatibility.md ("Environment:
//     torchrun 2.15 vs cpprun") is the same table.
//   * Error files: a worker decorated with torch's @record raises; its message and traceback
//     must reach the root-cause report of both launchers.
//   * Exit codes: a worker exiting 3, one killed by a signal, success, and the launcher itself
//     stopped by SIGTERM.
//   * --log-line-prefix-template (new in torchrun 2.15) with ${hostname}: the same line prefix.
//   * --event-log-handler, --duplicate-std{out,err}-filters, a static --nnodes MIN:MAX and
//     --nnodes=2 without an address: torchrun_flags_diff_test.cc, with their deliberate
//     differences and why.
//
// Both launchers run with the same added environment: PYTHON_EXEC is the torch 2.x interpreter
// (torchrun honours it too) and TMPDIR a directory of the test, so torchrun's torchelastic_*
// directories and cpprun's run directories are removed with it. Every wait is bounded; the
// workers' files and the launchers' exits are the only synchronisation.
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/cpprun_test_helpers.h"
#include "tests/support/test_support.h"
#include "tests/support/torch_peers.h"
#include "tests/support/torchrun_env_differences.h"

namespace {

using namespace cpprun::testing;
using Json = nlohmann::json;
namespace fs = std::filesystem;

enum class Launcher { kTorchrun, kCpprun };

const char* nameOf(Launcher l) { return l == Launcher::kTorchrun ? "torchrun 2.x" : "cpprun"; }

std::vector<std::string> launcherCommand(Launcher l, std::vector<std::string> args) {
  const std::string torchrun = (fs::path(CPPRUN_TORCH2_PYTHON).parent_path() / "torchrun").string();
  args.insert(args.begin(), l == Launcher::kTorchrun ? torchrun : std::string(CPPRUN_BINARY));
  return args;
}

// "pid state ppid cmdline" for each process still alive: what a failed no-orphans check shows.
std::string describeProcesses(const std::vector<pid_t>& pids) {
  std::ostringstream out;
  for (pid_t pid : pids) {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string text;
    std::getline(stat, text);
    const size_t close = text.rfind(')');
    std::ifstream cmdline_file("/proc/" + std::to_string(pid) + "/cmdline");
    std::string cmdline((std::istreambuf_iterator<char>(cmdline_file)), {});
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    out << pid << " [" << (close == std::string::npos ? "gone" : text.substr(close + 2, 8)) << "] "
        << cmdline << "\n";
  }
  return out.str();
}

// One test's directories: TMPDIR for both launchers, and where each launcher's workers write.
// The destructor SIGKILLs whatever still runs with that TMPDIR: torchrun's workers live in
// their own sessions and outlive a torchrun that a failed assertion left to be SIGKILLed.
struct Sandbox {
  TempDir dir;
  std::string tmp = dir.path() + "/tmp";
  Sandbox() {
    fs::create_directories(tmp);
    fs::create_directories(out(Launcher::kTorchrun));
    fs::create_directories(out(Launcher::kCpprun));
  }
  ~Sandbox() {
    for (pid_t pid : processesWithEnvironment("TMPDIR=" + tmp)) ::kill(pid, SIGKILL);
  }
  Sandbox(const Sandbox&) = delete;
  Sandbox& operator=(const Sandbox&) = delete;
  std::string out(Launcher l) const {
    return dir.path() + (l == Launcher::kTorchrun ? "/torchrun" : "/cpprun");
  }
  std::map<std::string, std::string> env() const {
    return {{"PYTHON_EXEC", CPPRUN_TORCH2_PYTHON}, {"TMPDIR", tmp}};
  }
};

int exitCode(ChildProcess& run, Launcher l, std::chrono::milliseconds bound = 80s) {
  auto status = run.wait(bound);
  INFO(nameOf(l) << " output:\n" << run.output());
  REQUIRE(status.has_value());
  return exitCodeOf(*status);
}

// Runs `agents` copies of one launcher with `args` (all at once: a multi-node job on loopback)
// and requires each to exit 0.
void runJob(Launcher l, const Sandbox& box, int agents, const std::vector<std::string>& args) {
  std::vector<std::unique_ptr<ChildProcess>> runs;
  for (int i = 0; i < agents; ++i) {
    runs.push_back(std::make_unique<ChildProcess>(launcherCommand(l, args), box.env()));
  }
  for (auto& run : runs) REQUIRE(exitCode(*run, l) == 0);
}

// Every dump a launcher's workers wrote: "rank<R>_attempt<N>" -> environment.
std::map<std::string, Json> readDumps(const std::string& dir) {
  std::map<std::string, Json> dumps;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() == ".json") {
      dumps[entry.path().stem().string()] = readJson(entry.path().string());
    }
  }
  return dumps;
}

bool isThisHost(const std::string& addr) {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  const std::string host = name;
  return addr == "localhost" || addr == "127.0.0.1" || addr == "::1" || addr == host ||
         addr.rfind(host + ".", 0) == 0;
}

// A value with what is specific to one run replaced by a placeholder; other values unchanged.
std::string normalise(const std::string& key, const std::string& value, const Json& env,
                      const std::string& tmp) {
  if (key == "MASTER_PORT") {
    static const std::regex port("[1-9][0-9]{0,4}");
    return std::regex_match(value, port) && std::stoi(value) < 65536 ? "<port>" : value;
  }
  // torchrun 2.15 publishes its host's FQDN ("localhost" on a machine without a domain),
  // cpprun the store's address as given (127.0.0.1): both name this host.
  if (key == "MASTER_ADDR") return isThisHost(value) ? "<this host>" : value;
  if (key == "TORCHELASTIC_RUN_ID") {
    static const std::regex uuid4(
        "[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}");
    return std::regex_match(value, uuid4) ? "<random uuid4>" : value;
  }
  if (key == "TORCHELASTIC_ERROR_FILE") {
    // <TMPDIR>/<the launcher's run directory>/attempt_<restart count>/<local rank>/error.json
    // (the real local rank, also where --virtual-local-rank makes LOCAL_RANK 0).
    const std::regex tail("/attempt_" + env.value("TORCHELASTIC_RESTART_COUNT", "?") +
                          "/[0-9]+/error\\.json$");
    std::smatch m;
    if (value.rfind(tmp + "/", 0) == 0 && std::regex_search(value, m, tail) &&
        static_cast<size_t>(m.position(0)) > tmp.size()) {
      return "$TMPDIR/<run dir>" + m.str(0);
    }
  }
  return value;
}

// What the environments of one case are compared under.
struct Facts {
  int nproc = 2;
  std::string tmp;
};

int usableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
}

bool inherited(const char* name) { return std::getenv(name) != nullptr; }

using Value = std::optional<std::string>;

// The differences torchrun 2.15 and cpprun may show, and why (docs/torchrun-compatibility.md,
// "Environment: torchrun 2.15 vs cpprun"). Returns the reason when `key` may differ this way,
// nothing when it may not.
std::optional<std::string> allowedBecause(const std::string& key, const Value& torchrun,
                                          const Value& cpprun, const Facts& f) {
  if (key == "NCCL_ASYNC_ERROR_HANDLING" && !torchrun && cpprun == "1") {
    return "torch 1.x's spelling of TORCH_NCCL_ASYNC_ERROR_HANDLING: cpprun sets both, so torch "
           "1.13's NCCL process group gets async error handling too";
  }
  if ((key == "CPPRUN_PROGRESS_FILE" || key == "CPPRUN_STACK_FILE" ||
       key == "CPPRUN_COLLECTIVE_FILE") &&
      !torchrun && cpprun && cpprun->rfind(f.tmp + "/", 0) == 0) {
    return "cpprun only: where a worker reports progress / Python stacks / the collective it "
           "waits in for --stall-timeout";
  }
  if (key == "TORCHELASTIC_TIMER_FILE" && torchrun && cpprun) {
    // torchrun: $TMPDIR/watchdog_timer_<uuid4>; cpprun: $TMPDIR/<run dir>/watchdog_timer.
    const std::string torchrun_prefix = f.tmp + "/watchdog_timer_";
    const std::string cpprun_suffix = "/watchdog_timer";
    if (torchrun->rfind(torchrun_prefix, 0) == 0 &&
        std::regex_match(torchrun->substr(torchrun_prefix.size()),
                         std::regex("[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-"
                                    "[0-9a-f]{12}")) &&
        cpprun->rfind(f.tmp + "/", 0) == 0 && cpprun->size() > cpprun_suffix.size() &&
        cpprun->compare(cpprun->size() - cpprun_suffix.size(), cpprun_suffix.size(),
                        cpprun_suffix) == 0) {
      return "TORCHELASTIC_ENABLE_FILE_TIMER=1 without TORCHELASTIC_TIMER_FILE: the watchdog's "
             "pipe is torchrun's $TMPDIR/watchdog_timer_<uuid4>, cpprun's <run dir>/watchdog_timer";
    }
  }
  if (key == "CPPRUN_NCCL_UNIQUE_ID" && !torchrun && cpprun &&
      std::regex_match(*cpprun, std::regex("[0-9a-f]{256}"))) {
    return "cpprun only, when libnccl.so.2 loads on the agent: the attempt's ncclUniqueId";
  }
  if (key == "CPPRUN_NCCL_UNIQUE_IDS" && !torchrun && cpprun &&
      std::regex_match(*cpprun, std::regex("[0-9a-f]{256}(,[0-9a-f]{256})+"))) {
    return "cpprun only, above CPPRUN_NCCL_RANKS_PER_ID ranks: the ids for "
           "ncclCommInitRankScalable";
  }
  if (key == "OMP_NUM_THREADS" && !inherited("OMP_NUM_THREADS") &&
      torchrun == (f.nproc > 1 ? Value("1") : Value()) &&
      cpprun == std::to_string(std::max(1, usableCpus() / f.nproc))) {
    return "unset OMP_NUM_THREADS: cpprun gives usable CPUs / workers, torchrun 1";
  }
  if (key == "CUDA_VISIBLE_DEVICES" && !inherited("CUDA_VISIBLE_DEVICES") && !torchrun && cpprun) {
    return "the node has GPUs: cpprun gives every worker the node's list, torchrun passes on "
           "only an inherited value";
  }
  return std::nullopt;
}

// The differences that must show in every worker (the allow-list is not stale).
std::set<std::string> requiredDifferences(const Facts& f) {
  std::set<std::string> keys = {"CPPRUN_PROGRESS_FILE", "CPPRUN_STACK_FILE",
                                "CPPRUN_COLLECTIVE_FILE"};
  if (!inherited("NCCL_ASYNC_ERROR_HANDLING")) keys.insert("NCCL_ASYNC_ERROR_HANDLING");
  if (!inherited("OMP_NUM_THREADS") && std::max(1, usableCpus() / f.nproc) != 1) {
    keys.insert("OMP_NUM_THREADS");
  }
  return keys;
}

// A value for the difference table: quoted, long ones cut short.
std::string show(const Value& v) {
  if (!v) return "(unset)";
  if (v->size() > 70) {
    return "'" + v->substr(0, 30) + "..." + v->substr(v->size() - 30) + "' (" +
           std::to_string(v->size()) + " chars)";
  }
  return "'" + *v + "'";
}

// Compares the named workers' dumps of both launchers; fails with a table of every difference
// that is not allowed, and of every required one that is missing.
void requireSameEnvironments(const Sandbox& box, const std::vector<std::string>& workers,
                             const Facts& f) {
  const auto torchrun = readDumps(box.out(Launcher::kTorchrun));
  const auto cpprun = readDumps(box.out(Launcher::kCpprun));
  std::ostringstream unexpected, allowed;
  int unexpected_count = 0;
  for (const std::string& w : workers) {
    INFO("worker " << w);
    REQUIRE(torchrun.count(w) == 1);
    REQUIRE(cpprun.count(w) == 1);
    const Json& t = torchrun.at(w);
    const Json& c = cpprun.at(w);
    std::set<std::string> keys;
    for (auto it = t.begin(); it != t.end(); ++it) keys.insert(it.key());
    for (auto it = c.begin(); it != c.end(); ++it) keys.insert(it.key());
    std::set<std::string> differing;
    for (const std::string& key : keys) {
      Value tv, cv;
      if (t.contains(key)) tv = normalise(key, t.at(key).get<std::string>(), t, f.tmp);
      if (c.contains(key)) cv = normalise(key, c.at(key).get<std::string>(), c, f.tmp);
      if (tv == cv) continue;
      differing.insert(key);
      auto reason = allowedBecause(key, tv, cv, f);
      std::ostringstream row;
      row << "  " << w << " | " << key << " | " << show(tv) << " | " << show(cv);
      if (reason) {
        INFO(key << " may differ but is not in torchrun_env_differences.h (nor in the docs)");
        CHECK(envDifferencesAllowed().count(key) == 1);
        allowed << row.str() << " | " << *reason << "\n";
      } else {
        unexpected << row.str() << "\n";
        ++unexpected_count;
      }
    }
    for (const std::string& key : requiredDifferences(f)) {
      if (differing.count(key) == 0) {
        unexpected << "  " << w << " | " << key << " | the allow-list expects a difference here,"
                   << " there is none: update the allow-list and the docs\n";
        ++unexpected_count;
      }
    }
  }
  INFO("allowed differences (worker | variable | torchrun | cpprun | why):\n" << allowed.str());
  INFO("differences NOT on the allow-list (worker | variable | torchrun 2.x | cpprun):\n"
       << unexpected.str());
  CHECK(unexpected_count == 0);
}

// The failure report's root-cause section of a launcher's output (it must have one).
std::string rootCauseSection(const std::string& out) {
  const size_t root = out.find("Root Cause (first observed failure):");
  REQUIRE(root != std::string::npos);
  return out.substr(root, out.find("=====", root) - root);
}

// The root cause's exit code as the report prints it ("exitcode  : -9 (pid: 123)").
std::string rootCauseExitCode(const std::string& out) {
  std::smatch m;
  const std::string section = rootCauseSection(out);
  REQUIRE(std::regex_search(section, m, std::regex(R"(exitcode\s*:\s*(-?[0-9]+))")));
  return m[1];
}

const std::string kDumpEnv = sourcePath("tests/torch/dump_env.py");

}  // namespace

TEST_CASE("torchrun 2.x vs cpprun: one node, --nproc-per-node=2, same environment",
          "[integration][torch][torch2]") {
  requireTorchPeer(torch2());
  Sandbox box;
  for (Launcher l : {Launcher::kTorchrun, Launcher::kCpprun}) {
    runJob(l, box, 1, {"--nproc-per-node=2", kDumpEnv, box.out(l)});
  }
  requireSameEnvironments(box, {"rank0_attempt0", "rank1_attempt0"}, {2, box.tmp});
}

TEST_CASE("torchrun 2.x vs cpprun: --standalone, same environment",
          "[integration][torch][torch2]") {
  requireTorchPeer(torch2());
  Sandbox box;
  for (Launcher l : {Launcher::kTorchrun, Launcher::kCpprun}) {
    runJob(l, box, 1, {"--standalone", "--nproc-per-node=2", kDumpEnv, box.out(l)});
  }
  requireSameEnvironments(box, {"rank0_attempt0", "rank1_attempt0"}, {2, box.tmp});
}

TEST_CASE("torchrun 2.x vs cpprun: --nnodes=2 on loopback (c10d), same environment per rank",
          "[integration][torch][torch2]") {
  requireTorchPeer(torch2());
  Sandbox box;
  // Which agent gets group rank 0 is up to the rendezvous; ranks are contiguous per node, so
  // comparing rank by rank compares the same GROUP_RANK and LOCAL_RANK whichever it was.
  for (Launcher l : {Launcher::kTorchrun, Launcher::kCpprun}) {
    runJob(l, box, 2,
           {"--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d",
            "--rdzv-endpoint=127.0.0.1:" + std::to_string(freeTcpPort()), "--rdzv-id=diff2",
            kDumpEnv, box.out(l)});
  }
  requireSameEnvironments(
      box, {"rank0_attempt0", "rank1_attempt0", "rank2_attempt0", "rank3_attempt0"}, {2, box.tmp});
}

TEST_CASE(
    "torchrun 2.x vs cpprun: --nnodes=2 on loopback (static: --node-rank and --master-port) "
    "same environment per rank",
    "[integration][torch][torch2]") {
  requireTorchPeer(torch2());
  Sandbox box;
  for (Launcher l : {Launcher::kTorchrun, Launcher::kCpprun}) {
    const std::string port = "--master-port=" + std::to_string(freeTcpPort());
    std::vector<std::unique_ptr<ChildProcess>> nodes;
    for (const char* node_rank : {"--node-rank=1", "--node-rank=0"}) {
      nodes.push_back(std::make_unique<ChildProcess>(
          launcherCommand(l, {"--nnodes=2", node_rank, "--nproc-per-node=2",
                              "--master-addr=127.0.0.1", port, kDumpEnv, box.out(l)}),
          box.env()));
    }
    for (auto& node : nodes) REQUIRE(exitCode(*node, l) == 0);
  }
  requireSameEnvironments(
      box, {"rank0_attempt0", "rank1_attempt0", "rank2_attempt0", "rank3_attempt0"}, {2, box.tmp});
}

TEST_CASE(
    "torchrun 2.x vs cpprun: --virtual-local-rank with inherited CUDA_VISIBLE_DEVICES gives each "
    "worker LOCAL_RANK 0 and its own device alike",
    "[integration][torch][torch2]") {
  requireTorchPeer(torch2());
  Sandbox box;
  // No GPU is touched: the workers only read the variables.
  auto env = box.env();
  env["CUDA_VISIBLE_DEVICES"] = "3,5";
  for (Launcher l : {Launcher::kTorchrun, Launcher::kCpprun}) {
    ChildProcess run(
        launcherCommand(l, {"--virtual-local-rank", "--nproc-per-node=2", kDumpEnv, box.out(l)}),
        env);
    REQUIRE(exitCode(run, l) == 0);
    const Json rank1 = readJson(box.out(l) + "/rank1_attempt0.json");
    CHECK(rank1.at("LOCAL_RANK") == "0");
    CHECK(rank1.at("CUDA_VISIBLE_DEVICES") == "5");
  }
  requireSameEnvironments(box, {"rank0_attempt0", "rank1_attempt0"}, {2, box.tmp});
}

TEST_CASE(
    "torchrun 2.x vs cpprun: TORCHELASTIC_ENABLE_FILE_TIMER=1 gives every worker the watchdog's "
    "pipe in TORCHELASTIC_TIMER_FILE alike",
    "[integration][torch][torch2]") {
  requireTorchPeer(torch2());
  Sandbox box;
  auto env = box.env();
  env["TORCHELASTIC_ENABLE_FILE_TIMER"] = "1";
  for (Launcher l : {Launcher::kTorchrun, Launcher::kCpprun}) {
    ChildProcess run(launcherCommand(l, {"--nproc-per-node=2", kDumpEnv, box.out(l)}), env);
    REQUIRE(exitCode(run, l) == 0);
    const Json rank0 = readJson(box.out(l) + "/rank0_attempt0.json");
    const Json rank1 = readJson(box.out(l) + "/rank1_attempt0.json");
    REQUIRE(rank0.contains("TORCHELASTIC_TIMER_FILE"));
    CHECK(rank0.at("TORCHELASTIC_TIMER_FILE") == rank1.at("TORCHELASTIC_TIMER_FILE"));
  }
  requireSameEnvironments(box, {"rank0_attempt0", "rank1_attempt0"}, {2, box.tmp});
}

TEST_CASE("torchrun 2.x vs cpprun: --max-restarts=1 with one failure, same attempt-1 environment",
          "[integration][torch][torch2]") {
  requireTorchPeer(torch2());
  Sandbox box;
  for (Launcher l : {Launcher::kTorchrun, Launcher::kCpprun}) {
    runJob(l, box, 1,
           {"--max-restarts=1", "--nproc-per-node=2", kDumpEnv, box.out(l), "--fail-rank", "1"});
    // The failing worker ran (rank 0 of attempt 0 may be stopped before it writes).
    CHECK(fs::exists(box.out(l) + "/rank1_attempt0.json"));
  }
  requireSameEnvironments(box, {"rank0_attempt1", "rank1_attempt1"}, {2, box.tmp});
}

TEST_CASE(
    "torchrun 2.x vs cpprun: a worker's @record error file reaches the root cause with its "
    "message and traceback, and the launcher's own error file",
    "[integration][torch][torch2]") {
  requireTorchPeer(torch2());
  Sandbox box;
  std::map<Launcher, Json> parent_files;
  for (Launcher l : {Launcher::kTorchrun, Launcher::kCpprun}) {
    // TORCHELASTIC_ERROR_FILE in the launcher's own environment (a nested launcher's, or a
    // scheduler's): both copy the root cause there, with the worker's exit code added.
    auto env = box.env();
    const std::string parent_file = box.dir.path() + "/" + nameOf(l) + "-error.json";
    env["TORCHELASTIC_ERROR_FILE"] = parent_file;
    ChildProcess run(
        launcherCommand(l, {"--nproc-per-node=2", sourcePath("tests/torch/record_worker.py"), "1"}),
        env);
    CHECK(exitCode(run, l) == 1);
    INFO(nameOf(l) << " output:\n" << run.output());
    const std::string root = rootCauseSection(run.output());
    INFO(nameOf(l) << " root cause:\n" << root);
    CHECK_THAT(root, Catch::Contains("rank      : 1 (local_rank: 1)"));
    CHECK_THAT(root, Catch::Contains("exitcode  : 1 (pid: "));
    // The error file @record wrote under TORCHELASTIC_ERROR_FILE, read back by the launcher.
    const size_t file = root.find("error_file: ");
    REQUIRE(file != std::string::npos);
    const std::string path = root.substr(file + 12, root.find('\n', file) - file - 12);
    CHECK(path.rfind(box.tmp + "/", 0) == 0);
    CHECK_THAT(path, Catch::EndsWith("/attempt_0/1/error.json"));
    CHECK_THAT(root, Catch::Contains("ValueError: record_worker: rank 1 failed on purpose"));
    CHECK(std::regex_search(root, std::regex(R"(record_worker\.py", line [0-9]+, in fail_here)")));
    REQUIRE(fs::exists(parent_file));
    parent_files[l] = readJson(parent_file);
  }
  // The same file but for the time it was written: message, traceback and errorCode.
  for (auto& [l, json] : parent_files) {
    INFO(nameOf(l) << ": " << json.dump(2));
    REQUIRE(json.at("message").at("extraInfo").contains("timestamp"));
    json["message"]["extraInfo"].erase("timestamp");
    CHECK(json["message"]["errorCode"] == 1);
  }
  INFO("torchrun 2.x: " << parent_files[Launcher::kTorchrun].dump(2));
  INFO("cpprun: " << parent_files[Launcher::kCpprun].dump(2));
  CHECK(parent_files[Launcher::kTorchrun] == parent_files[Launcher::kCpprun]);
}

TEST_CASE("torchrun 2.x vs cpprun: exit codes of a failing, a killed and a successful worker",
          "[integration][torch][torch2]") {
  requireTorchPeer(torch2());
  Sandbox box;
  struct Case {
    const char* what;
    std::vector<std::string> worker_args;
    int exit_code;                // both launchers
    const char* root_cause_code;  // the report's exitcode field; nullptr: no report
  };
  const std::vector<Case> cases = {
      {"rank 1 exits 3", {"exit-if-rank", "1", "3", "exit", "0"}, 1, "3"},
      {"rank 1 is killed by SIGKILL", {"kill-self-if-rank", "1", "SIGKILL", "exit", "0"}, 1, "-9"},
      {"every worker exits 0", {"exit", "0"}, 0, nullptr},
  };
  for (const Case& c : cases) {
    for (Launcher l : {Launcher::kTorchrun, Launcher::kCpprun}) {
      INFO(c.what << " under " << nameOf(l));
      std::vector<std::string> args = {"--nproc-per-node=2", "--no-python", kWorker};
      args.insert(args.end(), c.worker_args.begin(), c.worker_args.end());
      ChildProcess run(launcherCommand(l, args), box.env());
      CHECK(exitCode(run, l) == c.exit_code);
      if (c.root_cause_code != nullptr) {
        INFO(run.output());
        CHECK(rootCauseExitCode(run.output()) == c.root_cause_code);
      }
    }
  }
}

TEST_CASE(
    "torchrun 2.x vs cpprun: the launcher stopped by SIGTERM exits 1 (torchrun) and 143 "
    "(cpprun), cpprun's worker is always stopped",
    "[integration][torch][torch2]") {
  requireTorchPeer(torch2());
  Sandbox box;
  for (Launcher l : {Launcher::kTorchrun, Launcher::kCpprun}) {
    ChildProcess run(launcherCommand(l, {"--nproc-per-node=1", "--no-python", kWorker, "print",
                                         "ready-{rank}", "sleep-forever"}),
                     box.env());
    // torchrun passes the worker's output through as it is; cpprun prefixes it.
    const std::string ready = l == Launcher::kTorchrun ? "ready-0" : "[default0]:ready-0";
    INFO(nameOf(l));
    REQUIRE(run.waitForLine(ready, 60s).has_value());
    // The signal lands as soon as the worker has spoken: the launcher may still be inside
    // its own start-up code.
    run.signal(SIGTERM);
    CHECK(exitCode(run, l) == (l == Launcher::kTorchrun ? 1 : 128 + SIGTERM));
    INFO(nameOf(l) << " output:\n" << run.output());
    const bool gone = allGone(processesWithEnvironment("TMPDIR=" + box.tmp));
    const std::vector<pid_t> left = processesWithEnvironment("TMPDIR=" + box.tmp);
    INFO("still running:\n" << describeProcesses(left));
    if (l == Launcher::kTorchrun && !gone) {
      // torchrun 2.15 orphans its worker when SIGTERM arrives inside start_processes(),
      // before it has stored the process context its shutdown path closes (about one run
      // in three under ctest -j2). That is torchrun's race, not a contract: record it, end
      // the orphan, and go on to the launcher this test is about.
      WARN("torchrun 2.x left its worker running (SIGTERM during start_processes)");
      for (pid_t pid : left) ::kill(pid, SIGKILL);
      REQUIRE(allGone(left));
      continue;
    }
    CHECK(gone);
  }
}

TEST_CASE(
    "torchrun 2.x vs cpprun: --log-line-prefix-template with ${hostname} prefixes a tee'd line "
    "alike",
    "[integration][torch][torch2]") {
  requireTorchPeer(torch2());
  Sandbox box;
  char host[256] = {};
  REQUIRE(::gethostname(host, sizeof(host) - 1) == 0);
  for (Launcher l : {Launcher::kTorchrun, Launcher::kCpprun}) {
    // torchrun prefixes only tee'd streams; cpprun every console line.
    ChildProcess run(
        launcherCommand(l, {"--nproc-per-node=1", "--tee=3",
                            "--log-line-prefix-template=${hostname}:${rank}:${role_name}: ",
                            "--no-python", kWorker, "print", "hello"}),
        box.env());
    CHECK(exitCode(run, l) == 0);
    INFO(nameOf(l) << " output:\n" << run.output());
    CHECK_THAT(run.output(), Catch::Contains("\n" + std::string(host) + ":0:default: hello\n") ||
                                 Catch::StartsWith(std::string(host) + ":0:default: hello\n"));
  }
}
