// --numa-binding: the plan for each mode on the XML topologies of real GPU nodes, against what
// torch's own functions give for the same XML; GPU locality from the CUDA driver (the stand-in)
// or the topology; the command line; and the real cpprun applying a binding on this machine,
// read back inside the workers.
#include "launcher/numa_binding.h"

#include <sched.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "common/cpu_list.h"
#include "launcher/cli.h"
#include "tests/support/cpprun_test_helpers.h"
#include "tests/support/http_get.h"
#include "tests/support/test_support.h"

namespace {

using namespace cpprun::launcher;
using namespace cpprun::testing;
using cpprun::formatIndexList;
using MemoryPolicy = cpprun::agent::ProcessSpec::MemoryPolicy;

const std::string kTopologies = CPPRUN_TOPOLOGY_DIR;
const std::string kStandIns = CPPRUN_STAND_IN_DIR;

// What torch 2.15's torch/numa/binding.py answers for every mode and device of each topology:
// the output of tests/launcher/data/topologies/torch_binding_oracle.py, which runs torch's
// _get_logical_cpus_to_bind_to with its sysfs and CUDA readers fed from the XML.
const char* const kTorchAnswers =
    "== dgx-a100-like-2s-epyc-nps4.xml\n"
    "node 0 48-63,176-191\n"
    "node 1 48-63,176-191\n"
    "node 2 16-31,144-159\n"
    "node 3 16-31,144-159\n"
    "node 4 112-127,240-255\n"
    "node 5 112-127,240-255\n"
    "node 6 80-95,208-223\n"
    "node 7 80-95,208-223\n"
    "socket 0 0-63,128-191\n"
    "socket 1 0-63,128-191\n"
    "socket 2 0-63,128-191\n"
    "socket 3 0-63,128-191\n"
    "socket 4 64-127,192-255\n"
    "socket 5 64-127,192-255\n"
    "socket 6 64-127,192-255\n"
    "socket 7 64-127,192-255\n"
    "exclusive 0 48-55,176-183\n"
    "exclusive 1 56-63,184-191\n"
    "exclusive 2 16-23,144-151\n"
    "exclusive 3 24-31,152-159\n"
    "exclusive 4 112-119,240-247\n"
    "exclusive 5 120-127,248-255\n"
    "exclusive 6 80-87,208-215\n"
    "exclusive 7 88-95,216-223\n"
    "core-complex 0 48-51,176-179\n"
    "core-complex 1 52-55,180-183\n"
    "core-complex 2 16-19,144-147\n"
    "core-complex 3 20-23,148-151\n"
    "core-complex 4 112-115,240-243\n"
    "core-complex 5 116-119,244-247\n"
    "core-complex 6 80-83,208-211\n"
    "core-complex 7 84-87,212-215\n"
    "== dgx-h100-like-2s-8gpu.xml\n"
    "node 0 0-55,112-167\n"
    "node 1 0-55,112-167\n"
    "node 2 0-55,112-167\n"
    "node 3 0-55,112-167\n"
    "node 4 56-111,168-223\n"
    "node 5 56-111,168-223\n"
    "node 6 56-111,168-223\n"
    "node 7 56-111,168-223\n"
    "socket 0 0-55,112-167\n"
    "socket 1 0-55,112-167\n"
    "socket 2 0-55,112-167\n"
    "socket 3 0-55,112-167\n"
    "socket 4 56-111,168-223\n"
    "socket 5 56-111,168-223\n"
    "socket 6 56-111,168-223\n"
    "socket 7 56-111,168-223\n"
    "exclusive 0 0-13,112-125\n"
    "exclusive 1 14-27,126-139\n"
    "exclusive 2 28-41,140-153\n"
    "exclusive 3 42-55,154-167\n"
    "exclusive 4 56-69,168-181\n"
    "exclusive 5 70-83,182-195\n"
    "exclusive 6 84-97,196-209\n"
    "exclusive 7 98-111,210-223\n"
    "core-complex 0 0-55,112-167\n"
    "core-complex 1 0-55,112-167\n"
    "core-complex 2 0-55,112-167\n"
    "core-complex 3 0-55,112-167\n"
    "core-complex 4 56-111,168-223\n"
    "core-complex 5 56-111,168-223\n"
    "core-complex 6 56-111,168-223\n"
    "core-complex 7 56-111,168-223\n"
    "== xeon-1s-4gpu.xml\n"
    "node 0 0-63\n"
    "node 1 0-63\n"
    "node 2 0-63\n"
    "node 3 0-63\n"
    "socket 0 0-63\n"
    "socket 1 0-63\n"
    "socket 2 0-63\n"
    "socket 3 0-63\n"
    "exclusive 0 0-7,32-39\n"
    "exclusive 1 8-15,40-47\n"
    "exclusive 2 16-23,48-55\n"
    "exclusive 3 24-31,56-63\n"
    "core-complex 0 0-63\n"
    "core-complex 1 0-63\n"
    "core-complex 2 0-63\n"
    "core-complex 3 0-63\n";

struct Expected {
  std::string mode;
  int device;
  std::string cpus;
};

std::map<std::string, std::vector<Expected>> torchAnswers() {
  std::map<std::string, std::vector<Expected>> out;
  std::istringstream in(kTorchAnswers);
  std::string line, file;
  while (std::getline(in, line)) {
    if (line.rfind("== ", 0) == 0) {
      file = line.substr(3);
      continue;
    }
    std::istringstream fields(line);
    Expected e;
    fields >> e.mode >> e.device >> e.cpus;
    out[file].push_back(e);
  }
  return out;
}

NodeTopology load(const std::string& name) {
  auto t = loadNodeTopology(kTopologies + "/" + name);
  INFO(name);
  REQUIRE(t.isOk());
  return t.value();
}

NumaBindingMode mode(const std::string& name) {
  auto m = parseNumaBindingMode(name);
  REQUIRE(m.has_value());
  return *m;
}

TEST_CASE("every mode binds every GPU's worker to the CPUs torch's binding.py gives", "[unit]") {
  const auto answers = torchAnswers();
  REQUIRE(answers.size() == 3);
  for (const auto& [file, expected] : answers) {
    const NodeTopology t = load(file);
    const std::vector<std::string> gpus = t.nvidiaGpuBusIds();
    const int nproc = static_cast<int>(gpus.size());
    REQUIRE(expected.size() == 4 * gpus.size());
    for (const Expected& e : expected) {
      INFO(file << " --numa-binding=" << e.mode << " local rank " << e.device);
      const NumaBindingPlan plan = planNumaBinding(t, mode(e.mode), nproc, gpus);
      REQUIRE(plan.workers.size() == gpus.size());
      const WorkerBinding& w = plan.workers[static_cast<size_t>(e.device)];
      INFO(w.error);
      REQUIRE(w.bound());
      CHECK(formatIndexList(w.cpus) == e.cpus);
      CHECK(w.gpu_bus_id == gpus[static_cast<size_t>(e.device)]);
      CHECK(w.memory_policy == MemoryPolicy::kPreferred);
      CHECK(w.memory_nodes == std::vector<int>{w.numa_node});
    }
  }
}

TEST_CASE("torch's own binding.py still gives those answers for the three topologies", "[torch]") {
  std::string answers;
  for (const char* file :
       {"dgx-a100-like-2s-epyc-nps4.xml", "dgx-h100-like-2s-8gpu.xml", "xeon-1s-4gpu.xml"}) {
    std::string output;
    const int code = runToEnd(
        {CPPRUN_TORCH2_PYTHON, kTopologies + "/torch_binding_oracle.py", kTopologies + "/" + file},
        std::chrono::seconds(120), &output);
    INFO(output);
    REQUIRE(code == 0);
    answers += std::string("== ") + file + "\n" + output;
  }
  CHECK(answers == kTorchAnswers);
}

TEST_CASE("a worker's binding names its GPU and NUMA node and CPUs and memory and nearest NIC",
          "[unit]") {
  const NodeTopology t = load("dgx-h100-like-2s-8gpu.xml");
  const NumaBindingPlan plan =
      planNumaBinding(t, NumaBindingMode::kExclusive, 8, t.nvidiaGpuBusIds());
  CHECK(describeWorkerBinding(plan.workers[0]) ==
        "GPU 0 (0000:1b:00.0), NUMA node 0: CPUs 0-13,112-125, memory preferred on node 0; "
        "nearest NIC mlx5_0 (ibp24s0, same PCIe switch)");
  CHECK(describeWorkerBinding(plan.workers[7]) ==
        "GPU 7 (0000:df:00.0), NUMA node 1: CPUs 98-111,210-223, memory preferred on node 1; "
        "nearest NIC mlx5_3 (ibp206s0, same PCIe switch)");
  CHECK(plan.unboundSummary().empty());
  CHECK(plan.topology_source.find("dgx-h100-like-2s-8gpu.xml") != std::string::npos);
}

TEST_CASE("the binding is cut to the CPUs the agent may use as torch cuts to its affinity",
          "[unit]") {
  const NodeTopology t = load("xeon-1s-4gpu.xml");
  const auto gpus = t.nvidiaGpuBusIds();
  const std::vector<int> allowed = {0, 1, 2, 3, 4, 5, 6, 7, 32, 33, 34, 35, 36, 37, 38, 39};
  auto node = planNumaBinding(t, NumaBindingMode::kNode, 4, gpus, {}, allowed);
  CHECK(formatIndexList(node.workers[2].cpus) == "0-7,32-39");
  // Exclusive: the 8 allowed cores split 2 per GPU, with both threads of each core.
  auto exclusive = planNumaBinding(t, NumaBindingMode::kExclusive, 4, gpus, {}, allowed);
  CHECK(formatIndexList(exclusive.workers[0].cpus) == "0-1,32-33");
  CHECK(formatIndexList(exclusive.workers[3].cpus) == "6-7,38-39");
  // 10 cores for 4 GPUs: the first two get one more (torch's extra-core rule).
  auto uneven =
      planNumaBinding(t, NumaBindingMode::kExclusive, 4, gpus, {}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  CHECK(formatIndexList(uneven.workers[0].cpus) == "0-2");
  CHECK(formatIndexList(uneven.workers[1].cpus) == "3-5");
  CHECK(formatIndexList(uneven.workers[2].cpus) == "6-7");
  CHECK(formatIndexList(uneven.workers[3].cpus) == "8-9");
}

TEST_CASE("exclusive with fewer cores than GPUs on the node binds nobody there", "[unit]") {
  const NodeTopology t = load("xeon-1s-4gpu.xml");
  auto plan = planNumaBinding(t, NumaBindingMode::kExclusive, 4, t.nvidiaGpuBusIds(), {}, {0, 32});
  for (const WorkerBinding& w : plan.workers) {
    CHECK_FALSE(w.bound());
    CHECK(w.cpus.empty());
    CHECK(w.memory_policy == MemoryPolicy::kInherit);
  }
  CHECK(plan.unboundSummary() ==
        "--numa-binding=exclusive: local ranks 0,1,2,3 cannot be bound (NUMA node 0 has 1 "
        "allowed physical cores for 4 GPUs)");
}

TEST_CASE("core-complex wraps around when a node has more GPUs than complexes", "[unit]") {
  // Six devices on NUMA node 3 of the NPS4 node (4 complexes): torch's relative index % 4.
  const NodeTopology t = load("dgx-a100-like-2s-epyc-nps4.xml");
  const std::vector<std::string> six(6, "0000:07:00.0");
  auto plan = planNumaBinding(t, NumaBindingMode::kCoreComplex, 6, six);
  CHECK(formatIndexList(plan.workers[0].cpus) == "48-51,176-179");
  CHECK(formatIndexList(plan.workers[3].cpus) == "60-63,188-191");
  CHECK(formatIndexList(plan.workers[4].cpus) == "48-51,176-179");
  CHECK(formatIndexList(plan.workers[5].cpus) == "52-55,180-183");
}

TEST_CASE("a worker without a GPU or with a GPU the topology lacks is not bound and says why",
          "[unit]") {
  const NodeTopology t = load("xeon-1s-4gpu.xml");
  auto more = planNumaBinding(t, NumaBindingMode::kNode, 5, t.nvidiaGpuBusIds());
  CHECK(more.workers[3].bound());
  CHECK_FALSE(more.workers[4].bound());
  CHECK(more.unboundSummary() ==
        "--numa-binding=node: local rank 4 cannot be bound (no GPU with device index 4 (4 "
        "known))");
  auto stranger = planNumaBinding(t, NumaBindingMode::kSocket, 2, {"0000:17:00.0", "0000:A0:00.0"});
  CHECK(stranger.workers[0].bound());
  REQUIRE_FALSE(stranger.workers[1].bound());
  CHECK(stranger.workers[1].error.find("GPU 1 (0000:A0:00.0) is not in the topology (XML file ") ==
        0);
  CHECK(describeWorkerBinding(stranger.workers[1]).rfind("not bound: GPU 1", 0) == 0);
}

TEST_CASE("a binding the kernel refuses is found before any worker starts", "[unit]") {
  WorkerBinding ok;
  ok.cpus = {0};
  ok.memory_policy = MemoryPolicy::kPreferred;
  ok.memory_nodes = {0};
  CHECK(probeWorkerBinding(ok).empty());
  WorkerBinding offline = ok;
  offline.cpus = {1000};  // no such CPU online: EINVAL
  CHECK(probeWorkerBinding(offline) ==
        "the kernel refuses sched_setaffinity(CPUs 1000): Invalid argument");
  WorkerBinding no_node = ok;
  no_node.memory_nodes = {63};  // no such NUMA node: EINVAL
  CHECK(probeWorkerBinding(no_node) ==
        "the kernel refuses set_mempolicy(MPOL_PREFERRED, nodes 63): Invalid argument");
  // The probe ran in its own thread: this one's affinity is untouched.
  cpu_set_t mine;
  REQUIRE(sched_getaffinity(0, sizeof mine, &mine) == 0);
  CHECK(CPU_COUNT(&mine) >= 2);
}

TEST_CASE("GPU locality comes from the driver's bus ids or else from the topology's GPUs",
          "[unit]") {
  const NodeTopology t = load("dgx-h100-like-2s-8gpu.xml");
  CudaDriverInfo driver;
  driver.devices = {{"H100", "00000000:9D:00.0"}, {"H100", "00000000:C3:00.0"}};
  NodeResources node;
  node.gpus = {"4", "5"};
  node.gpu_source = "CUDA_VISIBLE_DEVICES";
  // Under CUDA_VISIBLE_DEVICES the driver numbers only what it sees: local rank = ordinal.
  GpuLocality visible = gpuLocality(node, 2, t, driver);
  CHECK(visible.source == "the CUDA driver's PCI bus ids");
  CHECK(visible.device_bus_ids == std::vector<std::string>{"00000000:9D:00.0", "00000000:C3:00.0"});
  CHECK(visible.worker_devices == std::vector<int>{0, 1});
  auto plan =
      planNumaBinding(t, NumaBindingMode::kNode, 2, visible.device_bus_ids, visible.worker_devices);
  CHECK(plan.workers[1].gpu_bus_id == "0000:c3:00.0");
  CHECK(formatIndexList(plan.workers[1].cpus) == "56-111,168-223");
  // A Slurm list without CUDA_VISIBLE_DEVICES names the driver's ordinals.
  node.gpu_source = "SLURM_STEP_GPUS";
  node.gpus = {"1", "0"};
  CHECK(gpuLocality(node, 2, t, driver).worker_devices == std::vector<int>{1, 0});
  // No driver: the topology's GPUs in bus order, picked by CUDA_VISIBLE_DEVICES numbers.
  const cpprun::Result<CudaDriverInfo> none(cpprun::Status(cpprun::StatusCode::kNotFound, "no"));
  node.gpu_source = "CUDA_VISIBLE_DEVICES";
  node.gpus = {"4", "5"};
  GpuLocality fallback = gpuLocality(node, 2, t, none);
  CHECK(fallback.source.find("the topology's NVIDIA GPUs in PCI bus order") == 0);
  CHECK(fallback.device_bus_ids == std::vector<std::string>{"0000:9d:00.0", "0000:c3:00.0"});
  node.gpus = {"GPU-8d1c"};
  CHECK(gpuLocality(node, 1, t, none).device_bus_ids == std::vector<std::string>{""});
  node.gpus.clear();
  node.gpu_source = "driver";
  CHECK(gpuLocality(node, 8, t, none).device_bus_ids == t.nvidiaGpuBusIds());
}

TEST_CASE("the plan is copied into each worker's spec with its description", "[unit]") {
  const NodeTopology t = load("xeon-1s-4gpu.xml");
  auto binding = planNumaBinding(t, NumaBindingMode::kExclusive, 5, t.nvidiaGpuBusIds());
  LaunchPlan plan;
  for (int i = 0; i < 5; ++i) {
    cpprun::agent::WorkerSpec w;
    w.local_rank = i;
    plan.workers.push_back(w);
  }
  applyNumaBinding(binding, plan);
  CHECK(formatIndexList(plan.workers[1].cpus) == "8-15,40-47");
  CHECK(plan.workers[1].memory_policy == MemoryPolicy::kPreferred);
  CHECK(plan.workers[1].memory_nodes == std::vector<int>{0});
  CHECK(plan.workers[1].binding.rfind("exclusive: GPU 1 (0000:31:00.0), NUMA node 0: CPUs", 0) ==
        0);
  CHECK(plan.workers[4].cpus.empty());
  CHECK(plan.workers[4].memory_policy == MemoryPolicy::kInherit);
  CHECK(plan.workers[4].binding.rfind("exclusive: not bound: no GPU with device index 4", 0) == 0);
}

TEST_CASE("check findings: ok when bound and a warning when not and a failure when strict",
          "[unit]") {
  const NodeTopology t = load("xeon-1s-4gpu.xml");
  const cpprun::Result<NumaBindingPlan> plan =
      planNumaBinding(t, NumaBindingMode::kNode, 5, t.nvidiaGpuBusIds());
  auto lenient = numaBindingFindings(plan, true, false);
  REQUIRE(lenient.size() == 6);
  CHECK(lenient[0].topic == "NUMA binding");
  CHECK(lenient[0].text.rfind("--numa-binding=node (topology from XML file ", 0) == 0);
  CHECK(lenient[1].level == CheckLevel::kOk);
  CHECK(lenient[1].text.rfind("local rank 0: GPU 0 (0000:17:00.0), NUMA node 0: CPUs 0-63", 0) ==
        0);
  CHECK(lenient[5].level == CheckLevel::kWarn);
  CHECK(lenient[5].text.find("(it would start unbound)") != std::string::npos);
  CHECK(numaBindingFindings(plan, true, true)[5].level == CheckLevel::kFail);
  // Without --numa-binding: where each GPU is and its nearest NIC, never a warning.
  auto locality = numaBindingFindings(plan, false, false);
  REQUIRE(locality.size() == 4);
  CHECK(locality[1].topic == "GPU locality");
  CHECK(locality[1].text ==
        "local rank 1: GPU 1 (0000:31:00.0) on NUMA node 0, nearest NIC ens2f0np0 (same PCIe "
        "switch)");
  const cpprun::Result<NumaBindingPlan> none(cpprun::Status(cpprun::StatusCode::kNotFound, "gone"));
  auto strict = numaBindingFindings(none, true, true);
  REQUIRE(strict.size() == 1);
  CHECK(strict[0].level == CheckLevel::kFail);
  CHECK(strict[0].text == "no topology: gone; the job would not start");
}

TEST_CASE("numa-binding and PET_NUMA_BINDING take the four modes and others exit 2 naming them",
          "[unit]") {
  auto parse = [](std::vector<std::string> args, std::map<std::string, std::string> env = {}) {
    return parseCommandLine(args, env);
  };
  for (const char* m : {"node", "socket", "exclusive", "core-complex"}) {
    auto r = parse({std::string("--numa-binding=") + m, "t.py"});
    REQUIRE(r.isOk());
    CHECK(r.value().config.numa_binding == m);
    CHECK(numaBindingModeName(mode(m)) == std::string(m));
  }
  CHECK(parse({"--numa_binding", "socket", "t.py"}).value().config.numa_binding == "socket");
  CHECK(parse({"t.py"}, {{"PET_NUMA_BINDING", "exclusive"}}).value().config.numa_binding ==
        "exclusive");
  CHECK(parse({"--numa-binding=node", "t.py"}, {{"PET_NUMA_BINDING", "exclusive"}})
            .value()
            .config.numa_binding == "node");
  CHECK(parse({"t.py"}).value().config.numa_binding.empty());
  auto bad = parse({"--numa-binding=numa", "t.py"});
  REQUIRE_FALSE(bad.isOk());
  CHECK(bad.status().message() ==
        "invalid value 'numa' for --numa-binding: expected one of node, socket, exclusive, "
        "core-complex");
  auto bad_env = parse({"t.py"}, {{"PET_NUMA_BINDING", "Node"}});
  REQUIRE_FALSE(bad_env.isOk());
  CHECK(bad_env.status().message() ==
        "invalid value 'Node' for PET_NUMA_BINDING (--numa-binding): expected one of node, "
        "socket, exclusive, core-complex");
  auto strict = parse({"--strict-numa-binding", "--numa-binding=node", "t.py"});
  REQUIRE(strict.isOk());
  CHECK(strict.value().config.strict_numa_binding);
  auto alone = parse({"--strict-numa-binding", "t.py"});
  REQUIRE_FALSE(alone.isOk());
  CHECK(alone.status().message().rfind("--strict-numa-binding needs --numa-binding", 0) == 0);
}

// --- The real cpprun ---------------------------------------------------------------------

struct Run {
  int code = -1;
  std::string output;
};

// cpprun with `args` under `env` (the stand-in driver with `devices` devices first in
// LD_LIBRARY_PATH, no inherited GPU list), to its end within 60 s.
Run runCpprun(const std::vector<std::string>& args, std::map<std::string, std::string> env,
              int devices) {
  std::string path = kStandIns + "/driver";
  const char* inherited = ::getenv("LD_LIBRARY_PATH");
  if (inherited != nullptr && *inherited != '\0') path += std::string(":") + inherited;
  env["LD_LIBRARY_PATH"] = path;
  env["CPPRUN_STAND_IN_CUDA_DEVICES"] = std::to_string(devices);
  std::vector<std::string> argv = {"/usr/bin/env",    "-u", "CUDA_VISIBLE_DEVICES", "-u",
                                   "SLURM_STEP_GPUS", "-u", "SLURM_JOB_GPUS"};
  for (const auto& [k, v] : env) argv.push_back(k + "=" + v);
  argv.push_back(CPPRUN_BINARY);
  argv.insert(argv.end(), args.begin(), args.end());
  Run run;
  run.code = runToEnd(argv, std::chrono::seconds(60), &run.output);
  return run;
}

// `cpprun --dry-run <flags> --nproc-per-node=8 --no-python /bin/true` on the DGX H100-like
// topology. The stand-in driver answers with no devices: the GPUs come from the topology's PCI
// tree.
Run dryRunOnDgxH100(std::vector<std::string> flags) {
  flags.insert(flags.begin(), "--dry-run");
  for (const char* rest : {"--nproc-per-node=8", "--no-python", "/bin/true"}) flags.push_back(rest);
  return runCpprun(flags, {{"HWLOC_XMLFILE", kTopologies + "/dgx-h100-like-2s-8gpu.xml"}}, 0);
}

TEST_CASE("cpprun --dry-run shows each worker's binding on a DGX H100-like topology",
          "[integration]") {
  Run run = dryRunOnDgxH100({"--numa-binding=exclusive"});
  INFO(run.output);
  CHECK(run.code == 0);
  CHECK(run.output.find("note        --numa-binding=exclusive: topology from XML file ") !=
        std::string::npos);
  CHECK(run.output.find("GPUs from the topology's NVIDIA GPUs in PCI bus order") !=
        std::string::npos);
  CHECK(run.output.find("      numa binding: exclusive: GPU 0 (0000:1b:00.0), NUMA node 0: CPUs "
                        "0-13,112-125, memory preferred on node 0; nearest NIC mlx5_0 (ibp24s0, "
                        "same PCIe switch)\n") != std::string::npos);
  CHECK(run.output.find("      numa binding: exclusive: GPU 5 (0000:c3:00.0), NUMA node 1: CPUs "
                        "70-83,182-195") != std::string::npos);
}

TEST_CASE("with --virtual-local-rank each worker is still bound near its own GPU",
          "[integration]") {
  // Every worker sees LOCAL_RANK=0 then, but its GPU is the one of its real local rank (torch's
  // SubprocessHandler passes the real local rank as the device index too).
  Run run = dryRunOnDgxH100({"--virtual-local-rank", "--numa-binding=node"});
  INFO(run.output);
  CHECK(run.code == 0);
  CHECK(run.output.find("numa binding: node: GPU 0 (0000:1b:00.0), NUMA node 0: ") !=
        std::string::npos);
  CHECK(run.output.find("numa binding: node: GPU 5 (0000:c3:00.0), NUMA node 1: ") !=
        std::string::npos);
  CHECK(run.output.find("numa binding: node: GPU 7 (") != std::string::npos);
}

TEST_CASE("cpprun with a bad --numa-binding exits 2 naming it", "[integration]") {
  Run run = runCpprun({"--numa-binding=ccx", "--no-python", "/bin/true"}, {}, 0);
  CHECK(run.code == 2);
  CHECK(run.output.find("invalid value 'ccx' for --numa-binding: expected one of node, socket, "
                        "exclusive, core-complex") != std::string::npos);
}

TEST_CASE(
    "a worker that cannot be bound starts unbound after one warning or with "
    "--strict-numa-binding the job does not start",
    "[integration]") {
  // This machine's topology, and a driver without devices: no GPU for either worker.
  Run lenient =
      runCpprun({"--numa-binding=node", "--nproc-per-node=2", "--no-python", "/bin/true"}, {}, 0);
  INFO(lenient.output);
  CHECK(lenient.code == 0);
  const std::string warning =
      "--numa-binding=node: local ranks 0,1 cannot be bound (no GPU with device index 0 (0 "
      "known); local rank 1: no GPU with device index 1 (0 known)); starting them unbound";
  REQUIRE(lenient.output.find(warning) != std::string::npos);
  CHECK(lenient.output.find(warning) == lenient.output.rfind(warning));  // once
  Run strict = runCpprun({"--numa-binding=node", "--strict-numa-binding", "--nproc-per-node=2",
                          "--no-python", "/bin/true"},
                         {}, 0);
  CHECK(strict.code == 3);
  CHECK(strict.output.find("--strict-numa-binding: not starting") != std::string::npos);
}

// An hwloc XML of this machine's CPUs 0 and 1 (one package, NUMA node 0, one L3) with the two
// stand-in GPUs (bus ids 0000:A0:00.0 and 0000:A1:00.0) on it; HWLOC_THISSYSTEM=1 makes hwloc
// take it as this machine, so the agent's affinity applies and the binding is real.
std::string writeTwoGpuMachine(const std::string& dir) {
  const std::string sets =
      R"(cpuset="0x00000003" complete_cpuset="0x00000003" nodeset="0x00000001" )"
      R"(complete_nodeset="0x00000001")";
  auto pu = [](int i) {
    const std::string m = i == 0 ? "0x00000001" : "0x00000002";
    const std::string s = "cpuset=\"" + m + "\" complete_cpuset=\"" + m +
                          "\" nodeset=\"0x00000001\" complete_nodeset=\"0x00000001\"";
    return "<object type=\"Core\" os_index=\"" + std::to_string(i) + "\" " + s +
           "><object type=\"PU\" os_index=\"" + std::to_string(i) + "\" " + s + "/></object>\n";
  };
  std::ofstream out(dir + "/two-gpu-machine.xml");
  out << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<!DOCTYPE topology SYSTEM "
         "\"hwloc2.dtd\">\n<topology version=\"2.0\">\n<object type=\"Machine\" os_index=\"0\" "
      << sets << " allowed_cpuset=\"0x00000003\" allowed_nodeset=\"0x00000001\">\n"
      << "<object type=\"Package\" os_index=\"0\" " << sets << ">\n"
      << "<object type=\"NUMANode\" os_index=\"0\" " << sets << " local_memory=\"1073741824\"/>\n"
      << "<object type=\"L3Cache\" " << sets
      << " cache_size=\"33554432\" depth=\"3\" cache_linesize=\"64\" "
         "cache_associativity=\"16\" cache_type=\"0\">\n"
      << pu(0) << pu(1) << "</object>\n"
      << "<object type=\"Bridge\" bridge_type=\"0-1\" depth=\"0\" bridge_pci=\"0000:[a0-a1]\">\n"
      << "<object type=\"PCIDev\" pci_busid=\"0000:a0:00.0\" pci_type=\"0302 [10de:2330] "
         "[10de:0000] 00\"/>\n"
      << "<object type=\"PCIDev\" pci_busid=\"0000:a1:00.0\" pci_type=\"0302 [10de:2330] "
         "[10de:0000] 00\"/>\n"
      << "</object>\n</object>\n</object>\n</topology>\n";
  return dir + "/two-gpu-machine.xml";
}

// A worker that prints its CPU affinity and memory policy as the kernel has them.
const char* const kReadBinding =
    "import ctypes\n"
    "cpus = [l.split()[1] for l in open('/proc/self/status') if "
    "l.startswith('Cpus_allowed_list')][0]\n"
    "mode, mask = ctypes.c_int(-1), ctypes.c_ulong(0)\n"
    "ctypes.CDLL(None).syscall(239, ctypes.byref(mode), ctypes.byref(mask), 64, 0, 0)\n"
    "print('binding cpus=%s policy=%d nodes=%#x' % (cpus, mode.value, mask.value))\n";

TEST_CASE(
    "cpprun applies the binding on this machine: each worker reads its CPUs and memory "
    "policy back",
    "[integration]") {
  cpu_set_t mine;
  REQUIRE(sched_getaffinity(0, sizeof mine, &mine) == 0);
  REQUIRE(CPU_ISSET(0, &mine));
  REQUIRE(CPU_ISSET(1, &mine));
  TempDir dir;
  const std::string xml = writeTwoGpuMachine(dir.path());
  const std::string events = dir.path() + "/events.jsonl";
  Run run = runCpprun({"--numa-binding=exclusive", "--nproc-per-node=2", "--event-log", events,
                       "--no-python", "/usr/bin/python3", "-c", kReadBinding},
                      {{"HWLOC_XMLFILE", xml}, {"HWLOC_THISSYSTEM", "1"}}, 2);
  INFO(run.output);
  REQUIRE(run.code == 0);
  CHECK(run.output.find("GPUs from the CUDA driver's PCI bus ids") != std::string::npos);
  // Exclusive: two GPUs on NUMA node 0 share its two cores, one each; MPOL_PREFERRED (1) on 0.
  CHECK(run.output.find("[default0]:binding cpus=0 policy=1 nodes=0x1") != std::string::npos);
  CHECK(run.output.find("[default1]:binding cpus=1 policy=1 nodes=0x1") != std::string::npos);
  // The event log has each worker's binding.
  std::ifstream in(events);
  std::string line;
  int started = 0;
  while (std::getline(in, line)) {
    auto e = Json::parse(line);
    if (e.value("event", "") != "worker_started") continue;
    ++started;
    const int local_rank = e.at("local_rank").get<int>();
    CHECK(e.at("numa_binding").get<std::string>() ==
          "exclusive: GPU " + std::to_string(local_rank) + " (0000:a" + std::to_string(local_rank) +
              ":00.0), NUMA node 0: CPUs " + std::to_string(local_rank) +
              ", memory preferred on node 0");
  }
  CHECK(started == 2);
}

TEST_CASE("/status shows each running worker's binding", "[integration][metrics]") {
  cpu_set_t mine;
  REQUIRE(sched_getaffinity(0, sizeof mine, &mine) == 0);
  REQUIRE(CPU_ISSET(0, &mine));
  REQUIRE(CPU_ISSET(1, &mine));
  TempDir dir;
  const std::string xml = writeTwoGpuMachine(dir.path());
  const std::string events = dir.path() + "/events.jsonl";
  std::string path = kStandIns + "/driver";
  const char* inherited = ::getenv("LD_LIBRARY_PATH");
  if (inherited != nullptr && *inherited != '\0') path += std::string(":") + inherited;
  // Each rank says ready, then waits for the go file while the test reads /status.
  ChildProcess run({"/usr/bin/env", "-u", "CUDA_VISIBLE_DEVICES", "-u", "SLURM_STEP_GPUS", "-u",
                    "SLURM_JOB_GPUS", CPPRUN_BINARY, "--numa-binding=node", "--nproc-per-node=2",
                    "--metrics-port=0", "--event-log=" + events, "--no-python", kWorker, "print",
                    "ready {rank}", "wait-file", dir.path() + "/go", "30"},
                   {{"LD_LIBRARY_PATH", path},
                    {"CPPRUN_STAND_IN_CUDA_DEVICES", "2"},
                    {"HWLOC_XMLFILE", xml},
                    {"HWLOC_THISSYSTEM", "1"}});
  REQUIRE(relayed(run, "[default0]:ready 0"));
  REQUIRE(relayed(run, "[default1]:ready 1"));
  int port = -1;
  std::ifstream in(events);
  std::string line;
  while (std::getline(in, line)) {
    auto e = Json::parse(line);
    if (e.value("event", "") == "metrics_listening") port = e.at("port").get<int>();
  }
  REQUIRE(port > 0);
  const auto raw = httpGetRaw(port, "/status", std::chrono::seconds(5));
  REQUIRE(raw.has_value());
  const size_t split = raw->find("\r\n\r\n");
  REQUIRE(split != std::string::npos);
  const Json status = Json::parse(raw->substr(split + 4));
  REQUIRE(status["workers"].size() == 2);
  for (int i = 0; i < 2; ++i) {
    CHECK(status["workers"][i]["numa_binding"] ==
          "node: GPU " + std::to_string(i) + " (0000:a" + std::to_string(i) +
              ":00.0), NUMA node 0: CPUs 0-1, memory preferred on node 0");
  }
  std::ofstream(dir.path() + "/go").put('\n');
  auto exited = run.wait(std::chrono::seconds(60));
  REQUIRE(exited.has_value());
  CHECK(exitCodeOf(*exited) == 0);
}

}  // namespace
