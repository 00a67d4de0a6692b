// prepareSpawn and spawnStepError without a child: the plan a spec gives (argv, envp, stdio,
// bindings in the kernel's layout, PATH lookup) and the syscall every child step's error names.
#include "agent/processes/spawn_plan.h"

#include <sched.h>
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <fstream>
#include <string>
#include <vector>

#include "tests/support/test_support.h"

namespace {

using namespace cpprun;
using namespace cpprun::agent;
using cpprun::testing::TempDir;

std::vector<std::string> strings(const std::vector<char*>& pointers) {
  std::vector<std::string> out;
  for (char* p : pointers) {
    if (p != nullptr) out.emplace_back(p);
  }
  return out;
}

// A null-terminated environment from `entries`.
struct FakeEnviron {
  explicit FakeEnviron(std::vector<std::string> entries) : entries_(std::move(entries)) {
    for (auto& e : entries_) pointers_.push_back(e.data());
    pointers_.push_back(nullptr);
  }
  char* const* get() const { return pointers_.data(); }

 private:
  std::vector<std::string> entries_;
  std::vector<char*> pointers_;
};

}  // namespace

TEST_CASE("prepareSpawn builds argv and envp as execve takes them", "[unit][launcher]") {
  FakeEnviron agent_env({"HOME=/home/a", "KEEP=1", "REPLACED=old", "NOEQUALS"});
  ProcessSpec spec;
  spec.argv = {"/bin/echo", "a b", ""};
  spec.env = {{"REPLACED", "new"}, {"ADDED", "x=y"}};
  auto plan = prepareSpawn(spec, agent_env.get(), 7);
  REQUIRE(plan.isOk());
  CHECK(plan.value().program == "/bin/echo");
  CHECK(plan.value().path == "/bin/echo");
  REQUIRE(plan.value().argv.size() == 4);
  CHECK(plan.value().argv.back() == nullptr);
  CHECK(strings(plan.value().argv) == std::vector<std::string>{"/bin/echo", "a b", ""});
  REQUIRE(plan.value().envp.back() == nullptr);
  CHECK(strings(plan.value().envp) ==
        std::vector<std::string>{"HOME=/home/a", "KEEP=1", "ADDED=x=y", "REPLACED=new"});
  // Moving the plan keeps argv and envp pointing at its strings.
  SpawnPlan moved = std::move(plan).value();
  CHECK(std::string(moved.argv[1]) == "a b");
  CHECK(moved.argv[0] == moved.args[0].data());
  CHECK(moved.envp[0] == moved.env[0].data());
}

TEST_CASE("prepareSpawn plans stdio, the terminal and inherits bindings by default",
          "[unit][launcher]") {
  FakeEnviron agent_env({});
  ProcessSpec spec;
  spec.argv = {"/bin/true"};
  auto plan = prepareSpawn(spec, agent_env.get(), 7);
  REQUIRE(plan.isOk());
  CHECK(plan.value().stdin_fd == 7);  // /dev/null
  CHECK(plan.value().stdout_fd == -1);
  CHECK(plan.value().stderr_fd == -1);
  CHECK(plan.value().controlling_tty_fd == -1);
  CHECK(plan.value().cpu_mask.empty());
  CHECK(plan.value().mempolicy_mode == -1);
  CHECK(plan.value().nodemask.empty());

  spec.stdin_fd = 3;
  spec.stdout_fd = 4;
  spec.stderr_fd = 5;
  spec.controlling_tty_fd = 6;
  spec.memory_nodes = {0};  // without a policy: inherit
  plan = prepareSpawn(spec, agent_env.get(), 7);
  REQUIRE(plan.isOk());
  CHECK(plan.value().stdin_fd == 3);
  CHECK(plan.value().stdout_fd == 4);
  CHECK(plan.value().stderr_fd == 5);
  CHECK(plan.value().controlling_tty_fd == 6);
  CHECK(plan.value().mempolicy_mode == -1);
}

TEST_CASE("prepareSpawn lays out the CPU mask and node mask as the kernel reads them",
          "[unit][launcher]") {
  FakeEnviron agent_env({});
  ProcessSpec spec;
  spec.argv = {"/bin/true"};
  spec.cpus = {0, 3, 64, 3};
  spec.memory_policy = ProcessSpec::MemoryPolicy::kBind;
  spec.memory_nodes = {1, 2};
  auto plan = prepareSpawn(spec, agent_env.get(), -1);
  REQUIRE(plan.isOk());
  REQUIRE(plan.value().cpu_mask.size() == 2);
  CHECK(plan.value().cpu_mask[0] == ((1UL << 0) | (1UL << 3)));
  CHECK(plan.value().cpu_mask[1] == 1UL);
  CHECK(plan.value().cpuMaskBytes() == CPU_ALLOC_SIZE(65));
  CHECK(plan.value().mempolicy_mode == kMpolBind);
  REQUIRE(plan.value().nodemask.size() == 1);
  CHECK(plan.value().nodemask[0] == 0b110UL);
  CHECK(plan.value().maxnode == 8 * sizeof(unsigned long) + 1);

  spec.memory_policy = ProcessSpec::MemoryPolicy::kPreferred;
  plan = prepareSpawn(spec, agent_env.get(), -1);
  REQUIRE(plan.isOk());
  CHECK(plan.value().mempolicy_mode == kMpolPreferred);
}

TEST_CASE("prepareSpawn refuses what no child could run, naming it", "[unit][launcher]") {
  FakeEnviron agent_env({"PATH=/nonexistent"});
  ProcessSpec spec;
  auto plan = prepareSpawn(spec, agent_env.get(), -1);
  REQUIRE_FALSE(plan.isOk());
  CHECK(plan.status().code() == StatusCode::kInvalidArgument);

  spec.argv = {"cpprun-no-such-program"};
  plan = prepareSpawn(spec, agent_env.get(), -1);
  REQUIRE_FALSE(plan.isOk());
  CHECK_THAT(plan.status().message(),
             Catch::Contains("'cpprun-no-such-program'") && Catch::Contains("not found in PATH"));

  spec.argv = {"/bin/true"};
  spec.cpus = {1, kMaxCpu + 1};
  plan = prepareSpawn(spec, agent_env.get(), -1);
  REQUIRE_FALSE(plan.isOk());
  CHECK_THAT(plan.status().message(), Catch::Contains("CPU " + std::to_string(kMaxCpu + 1)));

  spec.cpus = {};
  spec.memory_policy = ProcessSpec::MemoryPolicy::kBind;
  spec.memory_nodes = {-2};
  plan = prepareSpawn(spec, agent_env.get(), -1);
  REQUIRE_FALSE(plan.isOk());
  CHECK_THAT(plan.status().message(), Catch::Contains("NUMA node -2"));
}

TEST_CASE("prepareSpawn looks a bare name up in the PATH the child gets", "[unit][launcher]") {
  TempDir dir;
  const std::string program = dir.path() + "/tool";
  std::ofstream(program) << "#!/bin/sh\n";
  REQUIRE(::chmod(program.c_str(), 0755) == 0);
  FakeEnviron agent_env({"PATH=/nonexistent"});
  ProcessSpec spec;
  spec.argv = {"tool"};
  spec.env = {{"PATH", "/nonexistent::" + dir.path()}};
  auto plan = prepareSpawn(spec, agent_env.get(), -1);
  REQUIRE(plan.isOk());
  CHECK(plan.value().path == program);
  CHECK(std::string(plan.value().argv[0]) == "tool");
}

TEST_CASE("every child step's error names its syscall and errno", "[unit][launcher]") {
  FakeEnviron agent_env({});
  ProcessSpec spec;
  spec.argv = {"/opt/train"};
  spec.stdout_fd = 9;
  spec.stderr_fd = 2;
  spec.controlling_tty_fd = 5;
  spec.cpus = {2, 3};
  spec.memory_policy = ProcessSpec::MemoryPolicy::kBind;
  spec.memory_nodes = {1};
  auto plan = prepareSpawn(spec, agent_env.get(), 8);
  REQUIRE(plan.isOk());
  struct Case {
    SpawnStep step;
    std::string call;
    StatusCode code;
  };
  const std::vector<Case> cases = {
      {SpawnStep::kSignals, "rt_sigaction: ", StatusCode::kInternal},
      {SpawnStep::kSession, "setsid: ", StatusCode::kInternal},
      {SpawnStep::kControllingTerminal, "ioctl(5, TIOCSCTTY): ", StatusCode::kInternal},
      {SpawnStep::kProcessGroup, "setpgid: ", StatusCode::kInternal},
      {SpawnStep::kCgroupOpen, "openat(/cg/cgroup.procs): ", StatusCode::kInternal},
      {SpawnStep::kCgroupWrite, "write(/cg/cgroup.procs): ", StatusCode::kInternal},
      {SpawnStep::kParentDeathSignal, "prctl(PR_SET_PDEATHSIG): ", StatusCode::kInternal},
      {SpawnStep::kStdin, "dup3(8, 0): ", StatusCode::kInternal},
      {SpawnStep::kStdout, "dup3(9, 1): ", StatusCode::kInternal},
      {SpawnStep::kStderr, "fcntl(2, F_SETFD): ", StatusCode::kInternal},
      {SpawnStep::kCpuAffinity, "CPUs 2-3: sched_setaffinity: ", StatusCode::kUnavailable},
      {SpawnStep::kMemoryPolicy, "bind on NUMA nodes 1: set_mempolicy: ", StatusCode::kUnavailable},
      {SpawnStep::kExec, "execve(/opt/train): ", StatusCode::kInvalidArgument},
  };
  for (const Case& c : cases) {
    INFO("step " << static_cast<int>(c.step));
    const Status s = spawnStepError(plan.value(), spec, "/cg/cgroup.procs", c.step, EPERM);
    CHECK(s.code() == c.code);
    CHECK_THAT(s.message(), Catch::StartsWith("cannot run '/opt/train': ") &&
                                Catch::EndsWith(c.call + "Operation not permitted (EPERM)"));
  }
  CHECK_THAT(spawnStepError(plan.value(), spec, "", SpawnStep::kAgentGone, ESRCH).message(),
             Catch::Contains("agent was gone") && Catch::Contains("getppid"));
}
