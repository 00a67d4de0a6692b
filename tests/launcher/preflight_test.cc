// cpprun --check: the NCCL interface rule and the findings on given machines (unit), and the
// binary's report and exit status on this one, with real ports, limits and interfaces.
#include "launcher/preflight.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <map>
#include <string>
#include <vector>

#include "tests/support/cpprun_test_helpers.h"
#include "tests/support/test_support.h"

using namespace cpprun::launcher;
using namespace cpprun::testing;

namespace {

std::vector<NetworkInterface> machineInterfaces() {
  return {{"lo", "127.0.0.1", false, true, true},   {"docker0", "172.17.0.1", false, true, false},
          {"eth0", "10.0.0.5", false, true, false}, {"eth0", "fd00::5", true, true, false},
          {"ib0", "10.1.0.5", false, true, false},  {"eth1", "10.2.0.5", false, false, false}};
}

std::string ncclPick(std::map<std::string, std::string> env,
                     std::vector<NetworkInterface> ifaces = machineInterfaces()) {
  auto picked = ncclSocketInterface(ifaces, env);
  return picked ? picked->name + " " + picked->address : "none";
}

SystemFacts healthyFacts() {
  SystemFacts f;
  f.hostname = "n1";
  f.cuda_driver_version = 12040;
  f.gpu_names = {"NVIDIA H100", "NVIDIA H100"};
  f.gpu_numa_nodes = {0, 1};
  f.nccl_version = 22809;
  f.interfaces = machineInterfaces();
  f.hostname_address = "10.0.0.5";
  f.open_file_soft_limit = 65536;
  f.open_file_hard_limit = 65536;
  f.numa = {{0, {0, 1, 2, 3}}, {1, {4, 5, 6, 7}}};
  f.endpoint_address = "10.0.0.5";
  f.program_path = "/usr/bin/python3";
  return f;
}

RendezvousSettings twoNodes(int node_rank) {
  RendezvousSettings r;
  r.multi_node = true;
  r.nnodes = 2;
  r.node_rank = node_rank;
  r.store = {"n1", 29500};
  return r;
}

LaunchConfig twoNodeConfig() {
  LaunchConfig c;
  c.min_nodes = c.max_nodes = 2;
  c.entrypoint = "train.py";
  return c;
}

NodeResources twoGpus() {
  NodeResources n;
  n.hostname = "n1";
  n.gpus = {"0", "1"};
  n.gpu_source = "SLURM_STEP_GPUS";
  n.usable_cpus = 8;
  return n;
}

const CheckFinding* finding(const PreflightReport& r, const std::string& topic) {
  for (const auto& f : r.findings) {
    if (f.topic == topic) return &f;
  }
  return nullptr;
}

}  // namespace

TEST_CASE("NCCL's interface: ib first, then not docker or lo, NCCL_SOCKET_IFNAME rules", "[unit]") {
  CHECK(ncclPick({}) == "ib0 10.1.0.5");
  auto no_ib = machineInterfaces();
  no_ib.erase(no_ib.begin() + 4);
  CHECK(ncclPick({}, no_ib) == "eth0 10.0.0.5");  // IPv4 before IPv6
  CHECK(ncclPick({{"NCCL_SOCKET_FAMILY", "AF_INET6"}}, no_ib) == "eth0 fd00::5");
  CHECK(ncclPick({}, {machineInterfaces()[0], machineInterfaces()[1]}) == "docker0 172.17.0.1");
  CHECK(ncclPick({}, {machineInterfaces()[0]}) == "lo 127.0.0.1");
  CHECK(ncclPick({{"NCCL_SOCKET_IFNAME", "eth"}}) == "eth0 10.0.0.5");  // a prefix; eth1 is down
  CHECK(ncclPick({{"NCCL_SOCKET_IFNAME", "^ib,lo,docker"}}) == "eth0 10.0.0.5");
  CHECK(ncclPick({{"NCCL_SOCKET_IFNAME", "=eth"}}) == "none");  // exact: there is no "eth"
  CHECK(ncclPick({{"NCCL_SOCKET_IFNAME", "=ib0"}}) == "ib0 10.1.0.5");
  CHECK(ncclPick({{"NCCL_SOCKET_IFNAME", "enp"}}) == "none");
}

TEST_CASE("preflight: a healthy GPU node passes and names what it found", "[unit]") {
  auto report = runPreflight(twoNodeConfig(), twoNodes(1), twoGpus(), 2, {}, healthyFacts());
  INFO(report.format("test"));
  CHECK(report.failures() == 0);
  CHECK(report.warnings() == 0);
  CHECK_THAT(finding(report, "CUDA driver")->text,
             Catch::Contains("12.4") && Catch::Contains("0: NVIDIA H100 (NUMA 0)"));
  CHECK_THAT(finding(report, "NCCL")->text, Catch::StartsWith("2.28.9"));
  CHECK_THAT(finding(report, "NCCL socket")->text, Catch::Contains("ib0 (10.1.0.5)"));
  CHECK_THAT(finding(report, "rendezvous")->text, Catch::Contains("reachable"));
  CHECK_THAT(finding(report, "CPUs")->text, Catch::Contains("NUMA 0: CPUs 0-3; NUMA 1: CPUs 4-7") &&
                                                Catch::Contains("OMP_NUM_THREADS=4"));
  CHECK_THAT(report.format("t"), Catch::EndsWith("result: ok\n"));
  CHECK_THAT(finding(report, "CPUs")->text,
             Catch::EndsWith("cpprun does not bind workers to CPUs (--numa-binding)"));
  LaunchConfig bound = twoNodeConfig();
  bound.numa_binding = "socket";
  CHECK_THAT(
      finding(runPreflight(bound, twoNodes(1), twoGpus(), 2, {}, healthyFacts()), "CPUs")->text,
      Catch::EndsWith("--numa-binding=socket binds them (below)"));
}

TEST_CASE("preflight: each way a job would break is a failure that says why", "[unit]") {
  const auto config = twoNodeConfig();
  auto failed = [&](SystemFacts f, std::map<std::string, std::string> env = {},
                    RendezvousSettings r = twoNodes(1), NodeResources n = twoGpus(),
                    int nproc = 2) {
    auto report = runPreflight(config, r, n, nproc, env, f);
    std::string texts;
    for (const auto& x : report.findings) {
      if (x.level == CheckLevel::kFail) texts += x.topic + ": " + x.text + "\n";
    }
    CHECK(report.failures() >= 1);
    return texts;
  };
  SystemFacts f = healthyFacts();
  f.cuda_error = "libcuda.so.1 does not load";
  CHECK_THAT(failed(f), Catch::Contains("GPUs: 2 visible") && Catch::Contains("not usable"));
  f = healthyFacts();
  f.gpu_names.resize(1);
  CHECK_THAT(failed(f), Catch::Contains("the driver sees only 1"));
  CHECK_THAT(failed(healthyFacts(), {{"NCCL_SOCKET_IFNAME", "enp"}}),
             Catch::Contains("NCCL socket: no interface matches (NCCL_SOCKET_IFNAME=enp)"));
  CHECK_THAT(failed(healthyFacts(), {{"NCCL_SOCKET_IFNAME", "lo"}}),
             Catch::Contains("loopback address"));
  CHECK_THAT(failed(healthyFacts(), {{"GLOO_SOCKET_IFNAME", "enp1"}}),
             Catch::Contains("gloo socket: GLOO_SOCKET_IFNAME names enp1, which this node"));
  f = healthyFacts();
  f.hostname_address = "127.0.1.1";  // Debian's /etc/hosts default for the host name
  CHECK_THAT(failed(f), Catch::Contains("127.0.1.1, a loopback address"));
  f = healthyFacts();
  f.endpoint_resolve_error = "Name or service not known";
  CHECK_THAT(failed(f), Catch::Contains("rendezvous: n1 does not resolve"));
  f = healthyFacts();
  f.endpoint_bind_error = "Address already in use";
  CHECK_THAT(failed(f, {}, twoNodes(0)),
             Catch::Contains("n1:29500 cannot be bound: Address already in use"));
  f = healthyFacts();
  f.open_file_soft_limit = f.open_file_hard_limit = 256;
  CHECK_THAT(
      failed(f, {}, twoNodes(1), twoGpus(), 512),
      Catch::Contains("open files: limit 256 (hard 256) <") && Catch::Contains("world size 1024"));
  f = healthyFacts();
  f.program_error = "the script train.py cannot be read: No such file or directory";
  CHECK_THAT(failed(f), Catch::Contains("program: the script train.py"));
}

TEST_CASE("preflight: a store not up yet, more workers than GPUs or CPUs are warnings", "[unit]") {
  SystemFacts f = healthyFacts();
  f.endpoint_connect_error = "Connection refused";
  auto report = runPreflight(twoNodeConfig(), twoNodes(1), twoGpus(), 16, {}, f);
  INFO(report.format("test"));
  CHECK(report.failures() == 0);
  CHECK(finding(report, "rendezvous")->level == CheckLevel::kWarn);
  CHECK(finding(report, "GPUs")->level == CheckLevel::kWarn);
  CHECK(finding(report, "CPUs")->level == CheckLevel::kWarn);
}

TEST_CASE("preflight: the operations options are checked when given", "[unit]") {
  LaunchConfig config = twoNodeConfig();
  SystemFacts f = healthyFacts();
  auto report = runPreflight(config, twoNodes(1), twoGpus(), 2, {}, f);
  CHECK(finding(report, "stall stacks") == nullptr);  // not asked for
  CHECK(finding(report, "metrics") == nullptr);
  CHECK(finding(report, "event log") == nullptr);

  config.stall_timeout = 30;
  f.gdb_path = "/usr/bin/gdb";
  report = runPreflight(config, twoNodes(1), twoGpus(), 2, {}, f);
  REQUIRE(finding(report, "stall stacks") != nullptr);
  CHECK(finding(report, "stall stacks")->level == CheckLevel::kOk);
  CHECK_THAT(finding(report, "stall stacks")->text, Catch::Contains("/usr/bin/gdb"));
  f.gdb_path.clear();
  report = runPreflight(config, twoNodes(1), twoGpus(), 2, {}, f);
  CHECK(finding(report, "stall stacks")->level == CheckLevel::kWarn);
  CHECK(report.failures() == 0);

  config.metrics_port = 9400;
  config.event_log = "/var/log/cpprun/events.jsonl";
  f.metrics_bind_error = "Address already in use";
  f.event_log_error = "Permission denied";
  report = runPreflight(config, twoNodes(1), twoGpus(), 2, {}, f);
  INFO(report.format("test"));
  CHECK(report.failures() == 2);
  CHECK_THAT(finding(report, "metrics")->text,
             Catch::Contains("127.0.0.1:9400 cannot be bound: Address already in use"));
  CHECK_THAT(finding(report, "event log")->text,
             Catch::Contains("/var/log/cpprun/events.jsonl cannot be opened: Permission denied"));
  f.metrics_bind_error = "";
  f.event_log_error = "";
  report = runPreflight(config, twoNodes(1), twoGpus(), 2, {}, f);
  CHECK(report.failures() == 0);
  CHECK(finding(report, "metrics")->level == CheckLevel::kOk);
  CHECK(finding(report, "event log")->level == CheckLevel::kOk);
}

TEST_CASE("cpprun --check on this machine: report, exit 0, and exit 1 for real problems",
          "[integration][check]") {
  auto check = [](std::vector<std::string> args, std::map<std::string, std::string> env = {},
                  std::vector<std::string> prefix = {}) {
    std::vector<std::string> argv = prefix;
    argv.push_back(CPPRUN_BINARY);
    argv.push_back("--check");
    argv.insert(argv.end(), args.begin(), args.end());
    ChildProcess run(argv, env);
    auto status = run.wait(30s);
    REQUIRE(status.has_value());
    return std::make_pair(exitCodeOf(*status), run.output());
  };
  {
    auto [code, out] = check({"--nproc-per-node=2", "--no-python", kWorker});
    INFO(out);
    CHECK(code == 0);
    for (const char* topic : {"program", "GPUs", "NCCL", "interfaces", "NCCL socket", "gloo socket",
                              "rendezvous", "open files", "CPUs"}) {
      CHECK_THAT(out, Catch::Contains(std::string("] ") + topic + " "));
    }
    CHECK_THAT(out, Catch::Contains("result: ok"));
  }
  {  // No entry point: the node alone.
    auto [code, out] = check({});
    CHECK(code == 0);
    CHECK_THAT(out, Catch::Contains("none given"));
  }
  {  // One worker per GPU where there is none.
    auto [code, out] = check({"--nproc-per-node=gpu"}, {{"CUDA_VISIBLE_DEVICES", ""}});
    INFO(out);
    CHECK(code == 1);
    CHECK_THAT(out, Catch::Contains("[FAIL] workers") && Catch::Contains("no GPU is visible"));
  }
  {  // The store's port is taken on the node that serves it.
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd >= 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    REQUIRE(::listen(fd, 1) == 0);
    socklen_t len = sizeof addr;
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
    const std::string port = std::to_string(ntohs(addr.sin_port));
    auto [code, out] = check({"--master-addr=127.0.0.1", "--master-port=" + port});
    ::close(fd);
    INFO(out);
    CHECK(code == 1);
    CHECK_THAT(out, Catch::Contains("127.0.0.1:" + port + " cannot be bound"));
  }
  {
    auto [code, out] = check({}, {{"NCCL_SOCKET_IFNAME", "=no-such-if0"}});
    CHECK(code == 1);
    CHECK_THAT(out, Catch::Contains("[FAIL] NCCL socket"));
  }
  {
    auto [code, out] = check({}, {{"GLOO_SOCKET_IFNAME", "no-such-if0"}});
    CHECK(code == 1);
    CHECK_THAT(out, Catch::Contains("[FAIL] gloo socket"));
  }
  {  // The open-file limit cpprun cannot raise, against 300 workers.
    auto [code, out] =
        check({"--nproc-per-node=300"}, {}, {"/usr/bin/prlimit", "--nofile=128:128"});
    INFO(out);
    CHECK(code == 1);
    CHECK_THAT(out, Catch::Contains("[FAIL] open files   limit 128 (hard 128)") &&
                        Catch::Contains("needed for world size 300"));
    // The agent's own bound (launch_limits.h), which stops a run or a dry run with exit 2.
    CHECK_THAT(out, Catch::Contains("[FAIL] workers      --nproc-per-node: 300 workers need") &&
                        Catch::Contains("RLIMIT_NOFILE"));
  }
  {  // A store host that does not resolve, seen from node 1.
    auto [code, out] = check({"--nnodes=2", "--node-rank=1", "--master-addr=no-such-host.invalid",
                              "--master-port=29500"});
    INFO(out);
    CHECK(code == 1);
    CHECK_THAT(out, Catch::Contains("no-such-host.invalid does not resolve"));
  }
  {
    auto [code, out] = check({"--nproc-per-node=2", "/no/such/program"});
    CHECK(code == 1);
    CHECK_THAT(out, Catch::Contains("/no/such/program is not an executable file"));
  }
}
