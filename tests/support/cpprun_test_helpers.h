// Helpers for the tests that run the cpprun binary end to end: its command line, files the
// workers write, and bounded waits on processes and relayed output lines.
// Thread safety: none; each test uses them from its own thread.
#pragma once

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "agent/processes/process_launcher.h"
#include "common/system.h"
#include "tests/support/test_support.h"

namespace cpprun::testing {

using Json = nlohmann::json;

inline const std::string kWorker = CPPRUN_TEST_WORKER;

inline std::vector<std::string> cpprunCommand(std::vector<std::string> args) {
  args.insert(args.begin(), CPPRUN_BINARY);
  return args;
}

// The content of the file at `path` (cpprun::readFile), "" when it cannot be read.
inline std::string readFile(const std::string& path) {
  Result<std::string> text = cpprun::readFile(path);
  return text.isOk() ? std::move(text).value() : std::string();
}

inline Json readJson(const std::string& path) { return Json::parse(readFile(path)); }

inline std::vector<pid_t> pidsIn(const std::string& path) {
  std::vector<pid_t> pids;
  std::ifstream in(path);
  long pid;
  while (in >> pid) pids.push_back(static_cast<pid_t>(pid));
  return pids;
}

// A process that exists and is not a zombie.
inline bool alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(stat, text)) return false;
  size_t close = text.rfind(')');
  return close != std::string::npos && text.size() > close + 2 && text[close + 2] != 'Z';
}

// The events of an --event-log file, one JSON object per line; a line that is not JSON fails
// the test, naming it.
inline std::vector<Json> readEventLog(const std::string& path) {
  std::vector<Json> events;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    INFO(path << ": " << line);
    REQUIRE_NOTHROW(events.push_back(Json::parse(line)));
  }
  return events;
}

inline std::vector<Json> eventsNamed(const std::vector<Json>& events, const std::string& name) {
  std::vector<Json> found;
  for (const Json& e : events) {
    if (e.value("event", "") == name) found.push_back(e);
  }
  return found;
}

// Pids of the live processes whose environment holds `entry` ("NAME=value"): everything a
// launcher started with that environment, wherever it ended up in the process tree.
inline std::vector<pid_t> processesWithEnvironment(const std::string& entry) {
  std::vector<pid_t> found;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return found;
  while (const dirent* e = ::readdir(proc)) {
    const pid_t pid = static_cast<pid_t>(std::atol(e->d_name));
    if (pid <= 0 || pid == ::getpid()) continue;
    std::ifstream in("/proc/" + std::to_string(pid) + "/environ");
    std::string var;
    while (std::getline(in, var, '\0')) {
      if (var == entry) {
        if (alive(pid)) found.push_back(pid);
        break;
      }
    }
  }
  ::closedir(proc);
  return found;
}

// Processes that are not our children die asynchronously; wait (bounded) until none is alive.
inline bool allGone(const std::vector<pid_t>& pids, std::chrono::milliseconds bound = 10s) {
  auto deadline = std::chrono::steady_clock::now() + bound;
  for (;;) {
    bool any = false;
    for (pid_t p : pids) any = any || alive(p);
    if (!any) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(10ms);
  }
}

// The line has been relayed already, or arrives within the bound.
inline bool relayed(ChildProcess& run, const std::string& line_start) {
  if (run.output().find("\n" + line_start) != std::string::npos ||
      run.output().rfind(line_start, 0) == 0) {
    return true;
  }
  return run.waitForLine(line_start, 30s).has_value();
}

// Waits until every agent relayed a line of its workers (one starting with `prefix`), each
// within 30 s; otherwise fails showing every agent's output, since the stuck agent is often not
// the one waited on.
inline void requireEveryAgentRelays(std::vector<std::unique_ptr<ChildProcess>>& agents,
                                    const std::string& prefix = "[default") {
  for (size_t i = 0; i < agents.size(); ++i) {
    if (agents[i]->waitForLine(prefix, 30s).has_value()) continue;
    std::string outputs;
    for (size_t j = 0; j < agents.size(); ++j) {
      agents[j]->readAvailable(100ms);
      outputs += "--- agent " + std::to_string(j) + " ---\n" + agents[j]->output() + "\n";
    }
    FAIL("agent " << i << " relayed no line starting with '" << prefix << "' within 30 s\n"
                  << outputs);
  }
}

// Pids of the live processes whose command line has an argument containing `token` (a test's
// temporary directory, say): what a test started, wherever it ended up in the process tree.
inline std::vector<pid_t> processesMentioning(const std::string& token) {
  std::vector<pid_t> found;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return found;
  while (dirent* e = ::readdir(proc)) {
    const pid_t pid = static_cast<pid_t>(std::atol(e->d_name));
    if (pid <= 0 || pid == ::getpid()) continue;
    // readFile, not an istreambuf_iterator: a process that exits mid-read makes read() fail
    // with ESRCH, which libstdc++'s filebuf throws past the iterator (a TSan run failed so).
    const std::string cmdline = readFile(std::string("/proc/") + e->d_name + "/cmdline");
    if (cmdline.find(token) != std::string::npos && alive(pid)) found.push_back(pid);
  }
  ::closedir(proc);
  return found;
}

// SIGKILLs the agent under a cpprun process (the guardian's one child): the agent dies as in
// an OOM kill, without the orderly stop a signal to cpprun itself would start.
inline void killAgentOf(ChildProcess& launcher) {
  std::vector<pid_t> agent = cpprun::agent::childrenOf(launcher.pid());
  REQUIRE(agent.size() == 1);
  REQUIRE(::kill(agent[0], SIGKILL) == 0);
}

// Runs `argv` to its end (a test failure if it outlives `bound`), keeps what it printed in
// *output and returns its exit code (128 + signal when killed).
inline int runToEnd(const std::vector<std::string>& argv, std::chrono::seconds bound,
                    std::string* output) {
  ChildProcess run(argv);
  auto status = run.wait(bound);
  *output = run.output();
  REQUIRE(status.has_value());
  return exitCodeOf(*status);
}

}  // namespace cpprun::testing
