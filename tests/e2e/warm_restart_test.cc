// --warm-restart (issue 38; agent/processes/warm_start_launcher.h) end to end, with the real
// cpprun, real torch (Debian's 1.13 and 2.x from the venv) and gloo. A warm-started worker must be
// what a cold one is: its environment, rank, binding, streams, descriptors, signal state and its
// failure report are compared, attempt 1 of a warm job against attempt 1 of a cold one; a gloo
// DDP job trains across a warm restart to an uninterrupted run's parameters; every fallback to a
// cold start is logged with its reason and the job still succeeds; a hot spare pre-warms from
// the job's store and replaces a lost node with workers forked warm. The worker is
// tests/torch/warm_restart_worker.py. Every wait is bounded (a process exit, a relayed line, or a
// bounded poll of the warm process's log); every process a test starts is gone when it ends.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/cpprun_test_helpers.h"
#include "tests/support/test_support.h"
#include "tests/support/torch_peers.h"

namespace {

using namespace cpprun::testing;
namespace fs = std::filesystem;

constexpr auto kJobBound = std::chrono::seconds(180);
const char* const kWarmPrefix = "--warm-restart: ";

struct Job {
  int exit_code = -1;
  std::string output;
  std::string out;      // the worker's OUT folder
  std::string log_dir;  // --log-dir
  std::string run_dir;  // <log dir>/<run id>_<random>
};

std::vector<std::string> jobArgs(const std::string& log_dir, int max_restarts) {
  return {"--nproc-per-node=2", "--max-restarts=" + std::to_string(max_restarts), "--warm-restart",
          "--log-dir=" + log_dir};
}

// The run id cpprun printed ("this run's logs and error files are in DIR").
std::string runDirOf(const std::string& output) {
  const std::string key = "this run's logs and error files are in ";
  const size_t at = output.find(key);
  if (at == std::string::npos) return "";
  const size_t end = output.find('\n', at);
  return output.substr(at + key.size(), end - at - key.size());
}

Job runJob(const std::string& python, const std::string& base, std::vector<std::string> args,
           const std::string& out) {
  Job job;
  job.out = out;
  job.log_dir = base + "/logs";
  ChildProcess run(cpprunCommand(std::move(args)), {{"PYTHON_EXEC", python}});
  auto status = run.wait(kJobBound);
  job.output = run.output();
  INFO(job.output);
  REQUIRE(status.has_value());
  job.exit_code = exitCodeOf(*status);
  job.run_dir = runDirOf(job.output);
  return job;
}

// Runs warm_restart_worker.py MODE in a job with --warm-restart, two workers.
Job runWorker(const std::string& python, const std::string& base, const std::string& mode,
              int max_restarts = 1, const std::string& worker = "") {
  const std::string out = base + "/out";
  fs::create_directories(out);
  std::vector<std::string> args = jobArgs(base + "/logs", max_restarts);
  args.insert(
      args.end(),
      {worker.empty() ? sourcePath("tests/torch/warm_restart_worker.py") : worker, mode, out});
  return runJob(python, base, args, out);
}

Json probe(const Job& job, int attempt, int rank) {
  const std::string path =
      job.out + "/probe_" + std::to_string(attempt) + "_" + std::to_string(rank) + ".json";
  INFO("missing " << path);
  REQUIRE(fs::exists(path));
  return readJson(path);
}

// The pids of the "warm process N waits for local rank 0's imports" lines, in order.
std::vector<pid_t> warmProcessesStarted(const std::string& output) {
  std::vector<pid_t> pids;
  static const std::regex started("--warm-restart: warm process ([0-9]+) waits for local rank 0");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), started);
       it != std::sregex_iterator(); ++it) {
    pids.push_back(static_cast<pid_t>(std::stol((*it)[1])));
  }
  return pids;
}

// The children of each of `parents` (from /proc: the test links no agent library).
std::vector<pid_t> childrenOf(const std::vector<pid_t>& parents) {
  std::vector<pid_t> children;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = readFile("/proc/" + name + "/stat");
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream fields(stat.substr(close + 1));
    std::string state;
    long ppid = 0;
    fields >> state >> ppid;
    if (std::count(parents.begin(), parents.end(), static_cast<pid_t>(ppid)) > 0) {
      children.push_back(static_cast<pid_t>(std::stol(name)));
    }
  }
  return children;
}

// `root` and every process under it.
std::vector<pid_t> processTree(pid_t root) {
  std::vector<pid_t> tree = {root};
  for (std::vector<pid_t> level = {root}; !level.empty();) {
    level = childrenOf(level);
    tree.insert(tree.end(), level.begin(), level.end());
  }
  return tree;
}

// Nothing a job started outlives it: no live process mentions the test's folder (the warm
// process's command line names its module there, a worker's its OUT folder).
void requireNothingLeft(const TempDir& dir) { CHECK(allGone(processesMentioning(dir.path()))); }

// --- Equality: attempt 1 of a warm job against attempt 1 of a cold one -------------------------

// A JSON value with every nested key flattened to "/a/b" -> value (arrays stay values).
void flatten(const Json& value, const std::string& at, std::map<std::string, Json>* into) {
  if (value.is_object()) {
    for (auto it = value.begin(); it != value.end(); ++it)
      flatten(it.value(), at + "/" + it.key(), into);
  } else {
    (*into)[at] = value;
  }
}

// What differs between the jobs only because they are two jobs, replaced by placeholders:
//   * the job's folder (log dir, OUT) -> <JOB>; the run folder's name (<run id>_<random>) ->
//     <RUN>; the run id (TORCHELASTIC_RUN_ID, in paths too) -> <RUN_ID>;
//   * MASTER_PORT -> <PORT> (each job's store port);
//   * the kernel's inode numbers of pipes and sockets in /proc/self/fd ("pipe:[N]");
//   * the job's cgroup, named by cpprun's pid ("cpprun-N");
//   * the worker's parent pid: replaced by whether it is attempt 0's parent (a cold start's,
//     in both jobs: the agent);
// and what differs between any two processes, checked apart (each rank's differs from the
// other's, as two fresh interpreters' do): random_bits, torch_initial_seed, hash_of_text (the
// warm workers share theirs: a documented difference, checked apart). Documented differences are
// not taken either: sys.flags.unbuffered (the warm process runs without -u; the worker's streams
// are made unbuffered after the fork), /proc/self/cmdline, the frozen heap (checked apart) and
// whether torch is imported at start (the probe checks it).
Json normalised(Json facts, const Job& job, const Json& attempt0) {
  const std::string run_id = facts["environ"].value("TORCHELASTIC_RUN_ID", std::string("?"));
  const std::string run_name = fs::path(job.run_dir).filename().string();
  const std::string job_dir = fs::path(job.log_dir).parent_path().string();
  const bool same_parent = facts["ppid"] == attempt0["ppid"];
  facts["ppid"] = same_parent ? "attempt 0's parent" : "another parent";
  for (const char* per_process : {"random_bits", "torch_initial_seed", "hash_of_text"}) {
    facts.erase(per_process);
  }
  // Documented differences, checked apart.
  for (const char* documented : {"cmdline", "gc_frozen"}) facts.erase(documented);
  // Descriptors: 0-2 by number; the others by what they are. Which number a socket the program
  // opens later gets depends on what was open for a moment when it was made (a cold worker's
  // imports open and close files; a warm one's ran before the fork).
  Json others = Json::array();
  for (auto it = facts["fds"].begin(); it != facts["fds"].end();) {
    if (it.key() == "0" || it.key() == "1" || it.key() == "2") {
      ++it;
      continue;
    }
    others.push_back(it.value());
    it = facts["fds"].erase(it);
  }
  std::sort(others.begin(), others.end());
  facts["fds"]["3 and up"] = others;
  facts["environ"]["MASTER_PORT"] = "<PORT>";
  std::string text = facts.dump();
  auto replaceAll = [&text](const std::string& from, const std::string& to) {
    for (size_t at = text.find(from); at != std::string::npos;
         at = text.find(from, at + to.size())) {
      text.replace(at, from.size(), to);
    }
  };
  replaceAll(run_name, "<RUN>");
  replaceAll(job_dir, "<JOB>");
  replaceAll(run_id, "<RUN_ID>");
  text = std::regex_replace(text, std::regex(R"((pipe|socket):\[[0-9]+\])"), "$1:[]");
  text = std::regex_replace(text, std::regex(R"(cpprun-[0-9]+)"), "cpprun-<PID>");
  return Json::parse(text);
}

std::string differences(const Json& cold, const Json& warm) {
  std::map<std::string, Json> c, w;
  flatten(cold, "", &c);
  flatten(warm, "", &w);
  std::string diff;
  for (const auto& [key, value] : c) {
    auto it = w.find(key);
    if (it == w.end()) {
      diff += key + "\n    cold: " + value.dump() + "\n    warm: (none)\n";
    } else if (it->second != value) {
      diff += key + "\n    cold: " + value.dump() + "\n    warm: " + it->second.dump() + "\n";
    }
  }
  for (const auto& [key, value] : w) {
    if (c.count(key) == 0) diff += key + "\n    cold: (none)\n    warm: " + value.dump() + "\n";
  }
  return diff;
}

Json facts(const Job& job, int attempt, int rank) {
  const std::string path =
      job.out + "/facts_" + std::to_string(attempt) + "_" + std::to_string(rank) + ".json";
  INFO(job.output << "\nmissing " << path);
  REQUIRE(fs::exists(path));
  return readJson(path);
}

// The lines of attempt 1 (from its start to cpprun's end), with what differs between two jobs
// replaced: the agent's timestamps and the report's "time" lines, pids, the job's folder and the
// run folder. Worker lines ("[default...") and cpprun's own lines apart: they come through
// different pipes, so only each kind's own order is fixed; the one stdout line of the failing
// worker apart from its stderr lines, for the same reason.
struct Attempt1 {
  std::vector<std::string> agent;       // cpprun's log lines and the failure report
  std::vector<std::string> worker_err;  // the workers' lines but the stdout one
  std::vector<std::string> worker_out;  // the failing worker's stdout line
};

Attempt1 attempt1Of(const Job& job) {
  Attempt1 lines;
  const size_t start = job.output.find("attempt 1: started");
  REQUIRE(start != std::string::npos);
  std::string text = job.output.substr(job.output.rfind('\n', start) + 1);
  const std::string job_dir = fs::path(job.log_dir).parent_path().string();
  for (size_t at = text.find(job.run_dir); at != std::string::npos; at = text.find(job.run_dir)) {
    text.replace(at, job.run_dir.size(), "<RUN>");
  }
  for (size_t at = text.find(job_dir); at != std::string::npos; at = text.find(job_dir)) {
    text.replace(at, job_dir.size(), "<JOB>");
  }
  text = std::regex_replace(text, std::regex(R"(^cpprun \S+ )", std::regex::multiline),
                            "cpprun <TIME> ");
  text = std::regex_replace(text, std::regex(R"(time      : .*)"), "time      : <TIME>");
  text = std::regex_replace(text, std::regex(R"(([pP][iI][dD]:? )[0-9]+)"), "$1<PID>");
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("[default", 0) != 0) {
      lines.agent.push_back(line);
    } else if (line.find("STDOUT-LINE") != std::string::npos) {
      lines.worker_out.push_back(line);
    } else {
      lines.worker_err.push_back(line);
    }
  }
  return lines;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string text;
  for (const std::string& line : lines) text += line + "\n";
  return text;
}

void warmEqualsCold(const TorchPeer& peer) {
  requireTorchPeer(peer);
  TempDir dir;
  // The cold job: also --warm-restart (the same flags, hence the same sitecustomize and
  // PYTHONPATH), but its rank 1 fails attempt 0 before any process group is up, so the warm
  // process never gets local rank 0's imports and attempt 1 starts cold.
  fs::create_directories(dir.path() + "/cold/out");
  { std::ofstream(dir.path() + "/cold/out/exit-before-init") << "\n"; }
  const Job cold = runWorker(peer.python, dir.path() + "/cold", "facts");
  const Job warm = runWorker(peer.python, dir.path() + "/warm", "facts");
  requireNothingLeft(dir);
  REQUIRE(!cold.run_dir.empty());
  REQUIRE(!warm.run_dir.empty());
  {
    INFO("--- cold job ---\n" << cold.output << "\n--- warm job ---\n" << warm.output);
    // Which started warm: the log, and torch already imported at the program's start.
    REQUIRE(warmProcessesStarted(warm.output).size() == 1);
    CHECK_THAT(warm.output, Catch::Contains(std::string(kWarmPrefix) +
                                            "workers start warm: forked by warm process " +
                                            std::to_string(warmProcessesStarted(warm.output)[0])));
    CHECK_THAT(cold.output, !Catch::Contains("workers start warm"));
    for (int rank = 0; rank < 2; ++rank) {
      CHECK(probe(warm, 1, rank)["torch_at_start"] == true);
      CHECK(probe(cold, 1, rank)["torch_at_start"] == false);
      CHECK(probe(warm, 0, rank)["torch_at_start"] == false);
    }
    CHECK(cold.exit_code == 1);
    CHECK(warm.exit_code == cold.exit_code);
  }

  // The process: everything the worker wrote about itself, normalised (see normalised()).
  for (int rank = 0; rank < 2; ++rank) {
    const Json c = normalised(facts(cold, 1, rank), cold, facts(cold, 0, rank));
    const Json w = normalised(facts(warm, 1, rank), warm, facts(warm, 0, rank));
    INFO("rank " << rank
                 << ": what differs between attempt 1 of the cold job and of the warm "
                    "job:\n"
                 << differences(c, w));
    CHECK(differences(c, w).empty());
    // A few of them outright, so a cold start that lost one cannot hide it.
    CHECK(w["environ"]["RANK"] == std::to_string(rank));
    CHECK(w["environ"]["LOCAL_RANK"] == std::to_string(rank));
    CHECK(w["environ"]["TORCHELASTIC_RESTART_COUNT"] == "1");
    CHECK(w["own_process_group"] == true);
    CHECK(w["ppid"] == "attempt 0's parent");
    CHECK(w["pdeathsig"] == SIGKILL);
    CHECK(w["fd0"] == "/dev/null");
    CHECK(w["main_name"] == "__main__");
    CHECK(w["main_file"] == sourcePath("tests/torch/warm_restart_worker.py"));
    CHECK(w["environ"].count("CPPRUN_WARM_RECORD") == 0);
  }
  // What docs/supervision.md lists as different, as it says: /proc/PID/cmdline is the warm
  // process's, the preloaded objects are frozen, and the workers of one warm process share its
  // string-hash secret (two cold interpreters draw one each).
  for (int rank = 0; rank < 2; ++rank) {
    const Json c = facts(cold, 1, rank);
    const Json w = facts(warm, 1, rank);
    INFO("rank " << rank << ": cold cmdline " << c["cmdline"].dump() << ", warm cmdline "
                 << w["cmdline"].dump());
    CHECK(c["cmdline"] == c["orig_argv"]);
    CHECK_THAT(w["cmdline"].dump(), Catch::Contains("cpprun_warm.py"));
    // orig_argv itself is compared (normalised) above.
    CHECK(c["gc_frozen"] == false);
    CHECK(w["gc_frozen"] == true);
  }
  CHECK(facts(warm, 1, 0)["hash_of_text"] == facts(warm, 1, 1)["hash_of_text"]);
  CHECK(facts(cold, 1, 0)["hash_of_text"] != facts(cold, 1, 1)["hash_of_text"]);
  // Fresh random state in each process, as in two fresh interpreters.
  for (const Job* job : {&cold, &warm}) {
    const std::string which = job == &cold ? "cold" : "warm";
    for (const char* per_process : {"random_bits", "torch_initial_seed"}) {
      INFO(which << " job, attempt 1: " << per_process << " of rank 0 and rank 1");
      CHECK(facts(*job, 1, 0)[per_process] != facts(*job, 1, 1)[per_process]);
    }
  }

  // Streams and exit reporting: the same lines, prefixed the same; the same report (the exit
  // code is checked above).
  const Attempt1 c = attempt1Of(cold);
  const Attempt1 w = attempt1Of(warm);
  CHECK(joined(w.worker_out) == joined(c.worker_out));
  CHECK(joined(w.worker_err) == joined(c.worker_err));
  CHECK(joined(w.agent) == joined(c.agent));
  REQUIRE(w.worker_out.size() == 1);
  CHECK_THAT(w.worker_out[0], Catch::StartsWith("[default1]:") &&
                                  Catch::EndsWith("STDOUT-LINE from rank 1, attempt 1"));
  const std::string report = warm.output.substr(warm.output.rfind("Root Cause"));
  CHECK_THAT(report, Catch::Contains("rank      : 1 (local_rank: 1)"));
  CHECK_THAT(report, Catch::Contains("exitcode  : 1 "));
  CHECK_THAT(report, Catch::Contains("warm_restart_worker.py\", line") &&
                         Catch::Contains("in fail_here") &&
                         Catch::Contains("ValueError: warm_restart_worker: rank 1 failed on "
                                         "purpose in attempt 1"));
  CHECK_THAT(report, Catch::Contains("STDERR-LINE from rank 1, attempt 1"));
  // No frame of the warm process's module or of runpy, in the report or anywhere in the output.
  CHECK_THAT(warm.output, !Catch::Contains("cpprun_warm.py") && !Catch::Contains("runpy"));
  // @record's error file: where a cold start's is, with the worker's traceback.
  const std::string error_file = warm.run_dir + "/attempt_1/1/error.json";
  CHECK_THAT(report, Catch::Contains("error_file: " + error_file));
  REQUIRE(fs::exists(error_file));
  const std::string error = readFile(error_file);
  CHECK_THAT(error, Catch::Contains("ValueError: warm_restart_worker: rank 1 failed on purpose") &&
                        Catch::Contains("in fail_here") && !Catch::Contains("cpprun_warm"));
}

// --- A venv of the worker's interpreter with one module installed ----------------------------

// A venv from /usr/bin/python3 (torch 1.13 through its system site-packages) in `dir`, with
// tests/torch/`module_source` installed in it as cpprun_test_site_module; its python.
std::string venvWith(const std::string& dir, const std::string& module_source) {
  std::string output;
  const std::string venv = dir + "/venv";
  REQUIRE(
      runToEnd({torch113().python, "-m", "venv", "--system-site-packages", "--without-pip", venv},
               60s, &output) == 0);
  const std::string python = venv + "/bin/python";
  REQUIRE(runToEnd({python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"}, 60s,
                   &output) == 0);
  const std::string site = output.substr(0, output.find('\n'));
  INFO("site-packages: " << site);
  REQUIRE(fs::is_directory(site));
  fs::copy_file(sourcePath("tests/torch/" + module_source), site + "/cpprun_test_site_module.py");
  return python;
}

}  // namespace

TEST_CASE(
    "warm restart: torch 1.13: a warm-started worker's environment, process, binding, streams "
    "and failure report equal a cold one's",
    "[integration][torch]") {
  warmEqualsCold(torch113());
}

TEST_CASE(
    "warm restart: torch 2.x: a warm-started worker's environment, process, binding, streams "
    "and failure report equal a cold one's",
    "[integration][torch][torch2]") {
  warmEqualsCold(torch2());
}

TEST_CASE(
    "warm restart: a gloo DDP job trains across a warm restart to an uninterrupted run's "
    "parameters, and an installed module reads no RANK in a warm worker, the program's own module "
    "its RANK",
    "[integration][torch]") {
  requireTorchPeer(torch113());
  TempDir dir;
  const std::string python = venvWith(dir.path(), "warm_restart_site_rank.py");
  const Job job = runWorker(python, dir.path(), "ddp");
  requireNothingLeft(dir);
  INFO(job.output);
  CHECK(job.exit_code == 0);
  CHECK_THAT(job.output, Catch::Contains("all 2 workers succeeded after 1 restart(s)"));
  CHECK_THAT(job.output, Catch::Contains(std::string(kWarmPrefix) + "workers start warm"));
  // Attempt 1 went on from attempt 0's checkpoint (step 3) to step 6; both ranks hold the same
  // parameters, those of the same six steps in one process without a restart.
  std::vector<Json> results;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string path = job.out + "/ddp_" + std::to_string(rank) + ".json";
    REQUIRE(fs::exists(path));
    results.push_back(readJson(path));
    INFO("rank " << rank << ": " << results.back().dump());
    CHECK(results.back()["start"] == 3);
    CHECK(results.back()["end"] == 6);
    CHECK(results.back()["checksum"].get<double>() ==
          Approx(results.back()["uninterrupted"].get<double>()).epsilon(1e-9));
  }
  CHECK(results[0]["checksum"] == results[1]["checksum"]);
  // The documented difference: an installed module imported by the warm process read RANK
  // there (none); the program's own module, imported in the worker, read the worker's.
  for (int rank = 0; rank < 2; ++rank) {
    const std::string r = std::to_string(rank);
    const Json cold = probe(job, 0, rank);
    const Json warm = probe(job, 1, rank);
    INFO("rank " << rank << ": attempt 0 " << cold.dump() << ", attempt 1 " << warm.dump());
    CHECK(cold["torch_at_start"] == false);
    CHECK(warm["torch_at_start"] == true);
    CHECK(cold["site_module_rank"] == r);
    CHECK(warm["site_module_rank"].is_null());
    CHECK(cold["local_module_rank"] == r);
    CHECK(warm["local_module_rank"] == r);
  }
}

TEST_CASE(
    "warm restart: a fault before the warm process is ready, the program changed on disk, the "
    "warm process killed: each is a logged cold start and the job succeeds",
    "[integration][torch]") {
  requireTorchPeer(torch113());
  TempDir dir;
  // A copy of the worker (it touches itself) beside a copy of its own module.
  const std::string program = dir.path() + "/program";
  fs::create_directories(program);
  for (const char* file : {"warm_restart_worker.py", "warm_restart_local.py"}) {
    fs::copy_file(sourcePath(std::string("tests/torch/") + file), program + "/" + file);
  }
  const std::string out = dir.path() + "/out";
  fs::create_directories(out);
  std::vector<std::string> args = jobArgs(dir.path() + "/logs", 3);
  args.insert(args.end(), {program + "/warm_restart_worker.py", "faults", out});
  ChildProcess run(cpprunCommand(args), {{"PYTHON_EXEC", torch113().python}});

  // Attempt 2 starts the job's second warm process (the first went with the changed program);
  // once it says ready, it is killed. Rank 1 of attempt 2 waits for that, then fails.
  auto deadline = std::chrono::steady_clock::now() + 120s;
  auto left = [&deadline] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                                 std::chrono::steady_clock::now());
  };
  std::optional<std::string> started;
  int seen = 0;
  while (seen < 2 && left().count() > 0) {
    started = run.waitForLine("cpprun ", left());
    if (!started) break;
    if (started->find("waits for local rank 0's imports") != std::string::npos) ++seen;
  }
  INFO(run.output());
  REQUIRE(seen == 2);
  const pid_t second = warmProcessesStarted(run.output()).at(1);
  const std::string log = started->substr(started->find("(its log: ") + 10,
                                          started->size() - started->find("(its log: ") - 11);
  const std::string ready = "cpprun warm process " + std::to_string(second) + ": ready";
  while (readFile(log).find(ready) == std::string::npos && left().count() > 0) {
    std::this_thread::sleep_for(20ms);  // a bounded poll of the warm process's log
  }
  REQUIRE_THAT(readFile(log), Catch::Contains(ready));
  // It is this job's (its command line names the test's folder) before it is killed.
  REQUIRE_THAT(readFile("/proc/" + std::to_string(second) + "/cmdline"),
               Catch::Contains(dir.path()));
  REQUIRE(::kill(second, SIGKILL) == 0);

  auto status = run.wait(kJobBound);
  REQUIRE(status.has_value());
  requireNothingLeft(dir);
  const std::string output = run.output();
  INFO(output);
  CHECK(exitCodeOf(*status) == 0);
  CHECK_THAT(output, Catch::Contains("all 2 workers succeeded after 3 restart(s)"));
  CHECK_THAT(output, !Catch::Contains("workers start warm"));
  // Attempt 1: the warm process never got local rank 0's imports (rank 1 failed attempt 0
  // before any process group was up).
  CHECK_THAT(output, Catch::Contains(std::string(kWarmPrefix) +
                                     "a cold start: the warm process has not imported the "
                                     "workers' packages yet"));
  // Attempt 2: the program changed on disk; the warm process goes, a new one is started.
  const std::string changed =
      std::string(kWarmPrefix) + "a cold start instead of a warm one: the program changed on disk";
  CHECK_THAT(output, Catch::Contains(changed));
  CHECK(output.find(changed) > output.find("restarting it (restart 2 of 3)"));
  CHECK(output.find(changed) < output.find("attempt 2: started"));
  // The killed warm process is found ended (when it dies, or at attempt 3's spawn at the
  // latest); attempt 3 starts a third one.
  const std::string ended =
      std::string(kWarmPrefix) + "the warm process " + std::to_string(second) + " ended";
  CHECK_THAT(output, Catch::Contains(ended));
  CHECK(output.find(ended) > output.find("attempt 2: started"));
  CHECK(output.find(ended) < output.find("attempt 3: started"));
  CHECK(warmProcessesStarted(output).size() == 3);
  // Every attempt's workers started cold: none had torch imported at its start.
  Job job;
  job.out = out;
  for (int attempt = 0; attempt < 4; ++attempt) {
    for (int rank = 0; rank < 2; ++rank) {
      INFO("attempt " << attempt << ", rank " << rank);
      CHECK(probe(job, attempt, rank)["torch_at_start"] == false);
    }
  }
}

TEST_CASE(
    "warm restart: an installed package that starts a thread at import makes the warm process "
    "unusable: no warm restarts for the job, which succeeds cold",
    "[integration][torch]") {
  requireTorchPeer(torch113());
  TempDir dir;
  const std::string python = venvWith(dir.path(), "warm_restart_site_thread.py");
  const Job job = runWorker(python, dir.path(), "threads");
  requireNothingLeft(dir);
  INFO(job.output);
  CHECK(job.exit_code == 0);
  CHECK_THAT(job.output, Catch::Contains("all 2 workers succeeded after 1 restart(s)"));
  REQUIRE(!job.run_dir.empty());
  const std::string log = readFile(job.run_dir + "/python/cpprun_warm.log");
  INFO("warm process log:\n" << log);
  CHECK_THAT(log, Catch::Contains(": unusable: it holds 2 threads after its imports"));
  CHECK_THAT(job.output,
             Catch::Contains(std::string(kWarmPrefix) +
                             "no warm restarts for this job: the warm process cannot fork workers "
                             "safely: it holds 2 threads"));
  CHECK_THAT(job.output, !Catch::Contains("workers start warm"));
  CHECK(warmProcessesStarted(job.output).size() == 1);  // none started again
  for (int rank = 0; rank < 2; ++rank) CHECK(probe(job, 1, rank)["torch_at_start"] == false);
}

TEST_CASE(
    "warm restart: workers that are not `python -u PROGRAM` (--no-python) start cold, with no "
    "warm process, saying why",
    "[integration]") {
  TempDir dir;
  const std::string out = dir.path() + "/out";
  fs::create_directories(out);
  std::vector<std::string> args = jobArgs(dir.path() + "/logs", 1);
  args.insert(args.end(), {"--no-python", torch113().python,
                           sourcePath("tests/torch/warm_restart_worker.py"), "plain", out});
  const Job job = runJob(torch113().python, dir.path(), args, out);
  requireNothingLeft(dir);
  INFO(job.output);
  CHECK(job.exit_code == 0);
  CHECK_THAT(job.output, Catch::Contains("all 2 workers succeeded after 1 restart(s)"));
  CHECK_THAT(job.output, Catch::Contains(std::string(kWarmPrefix) +
                                         "cold starts: the workers are not Python programs "
                                         "cpprun starts"));
  CHECK(warmProcessesStarted(job.output).empty());
  CHECK_THAT(job.output, !Catch::Contains("workers start warm"));
  for (int rank = 0; rank < 2; ++rank)
    CHECK(probe(job, 1, rank)["local_module_rank"] == std::to_string(rank));
}

// Hot spares (docs/supervision.md, "Pre-warmed hot spares"): three agents of a job of exactly 2
// nodes on loopback (c10d, the first serves the store). Once the active nodes' warm processes
// are ready they share their modules through the job's store and the spare pre-warms from them;
// then node 1's whole process tree is SIGKILLed and the spare takes its place, its workers
// forked by the warm process it pre-warmed.
TEST_CASE(
    "warm restart: a hot spare pre-warms from the job's store and its workers start warm when it "
    "replaces a lost node",
    "[integration][torch][multinode][elastic][spares]") {
  requireTorchPeer(torch113());
  TempDir dir;
  const std::string d = dir.path();
  const std::string out = d + "/out";
  fs::create_directories(out);
  const std::string endpoint = "127.0.0.1:" + std::to_string(freeTcpPort());
  const std::string id = "warm-spare-" + std::to_string(::getpid());
  auto agent = [&](const std::string& name) {
    return std::make_unique<ChildProcess>(
        cpprunCommand({"--nnodes=2:2", "--nproc-per-node=1", "--max-restarts=1",
                       "--rdzv-backend=c10d", "--rdzv-endpoint=" + endpoint, "--rdzv-id=" + id,
                       "--rdzv-conf=keep_alive_interval=0.3,last_call_timeout=1,join_timeout=60",
                       "--warm-restart", "--log-dir=" + d + "/" + name,
                       sourcePath("tests/torch/warm_restart_worker.py"), "spare", out}),
        std::map<std::string, std::string>{{"PYTHON_EXEC", torch113().python},
                                           {"GLOO_SOCKET_IFNAME", "lo"}});
  };
  // Join order is rank order: the store host is node 0, `node1` node 1; the spare comes once
  // the round is closed.
  auto host = agent("host");
  REQUIRE(host->waitForText("this agent serves the job's store", 30s));
  auto node1 = agent("node1");
  REQUIRE(node1->waitForText("started 1 workers", 60s));
  auto spare = agent("spare");
  auto outputs = [&] {
    for (ChildProcess* a : {host.get(), node1.get(), spare.get()}) a->readAvailable(20ms);
    return "--- host ---\n" + host->output() + "\n--- node 1 ---\n" + node1->output() +
           "\n--- spare ---\n" + spare->output();
  };

  // Before the loss: both active nodes share their modules; the spare pre-warms from them.
  const std::string share =
      std::string(kWarmPrefix) + "the job's hot spares can read the modules this node holds";
  const bool shared = host->waitForText(share, 60s) && node1->waitForText(share, 60s);
  const bool prewarmed = spare->waitForText(" is ready: ", 60s);
  INFO(outputs());
  REQUIRE(shared);
  REQUIRE(prewarmed);
  const std::string before_loss = spare->output();
  CHECK_THAT(before_loss, Catch::Contains("waits as a spare"));
  CHECK(before_loss.find("[default") == std::string::npos);
  std::smatch imports;
  REQUIRE(std::regex_search(
      before_loss, imports,
      std::regex("--warm-restart: warm process ([0-9]+) pre-imports the ([0-9]+) modules the "
                 "job's workers hold")));
  const std::string warm = imports[1];
  CHECK(std::stol(imports[2]) > 0);
  const std::string watching = std::string(kWarmPrefix) +
                               "a hot spare: pre-warms once the job's store holds the modules its "
                               "workers import";
  CHECK(before_loss.find(watching) != std::string::npos);
  CHECK(before_loss.find(watching) < before_loss.find(imports[0]));
  const std::string ready = std::string(kWarmPrefix) + "warm process " + warm + " is ready: ";
  CHECK(before_loss.find(ready) > before_loss.find(imports[0]));
  CHECK(before_loss.find(ready) != std::string::npos);
  // It is the spare's agent's child.
  const std::vector<pid_t> spare_agent = childrenOf({spare->pid()});
  REQUIRE(spare_agent.size() == 1);
  const std::vector<pid_t> spare_children = childrenOf(spare_agent);
  CHECK(std::count(spare_children.begin(), spare_children.end(), std::stol(warm)) == 1);

  // Node 1 (not the store host: its loss would be the store's) lost with its whole process tree:
  // cpprun, its agent, its worker and its warm process.
  const std::vector<pid_t> tree = processTree(node1->pid());
  REQUIRE(tree.size() >= 4);
  for (pid_t pid : tree) ::kill(pid, SIGKILL);
  {
    auto status = node1->wait(30s);
    REQUIRE(status.has_value());
    CHECK(exitCodeOf(*status) == 128 + SIGKILL);
  }
  CHECK(allGone(tree));

  for (ChildProcess* a : {host.get(), spare.get()}) {
    auto status = a->wait(kJobBound);
    INFO(outputs());
    REQUIRE(status.has_value());
    CHECK(exitCodeOf(*status) == 0);
    CHECK_THAT(a->output(), Catch::Contains("all 2 workers of 2 nodes succeeded"));
  }
  requireNothingLeft(dir);
  INFO(outputs());
  // The spare's workers of attempt 1 were forked by the warm process it pre-warmed, after the
  // loss, with torch imported at their start; it ran no worker of attempt 0.
  const std::string after_loss = spare->output().substr(before_loss.size());
  CHECK_THAT(after_loss, Catch::Contains("rendezvous complete: 2 nodes") &&
                             Catch::Contains(std::string(kWarmPrefix) +
                                             "workers start warm: forked by warm process " + warm));
  // One warm process on the spare, the pre-warmed one.
  CHECK(warmProcessesStarted(spare->output()) == std::vector<pid_t>{std::stoi(warm)});
  CHECK(std::regex_search(after_loss,
                          std::regex(R"(\[default([01])\]:spare mode: rank \1, attempt 1, torch )"
                                     R"(at start True, all_reduce 2)")));
  CHECK_THAT(spare->output(), !Catch::Contains("attempt 0, torch"));
  CHECK_THAT(host->output(), Catch::Contains("1 spare node(s) waiting") &&
                                 Catch::Contains("workers start warm") &&
                                 Catch::Contains("restarts used: 0 of 1"));
}
