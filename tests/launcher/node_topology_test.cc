// NodeTopology through the real hwloc: the XML topologies of GPU nodes under
// tests/launcher/data/topologies/ (see the README there) and this machine.
#include "launcher/node_topology.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <set>
#include <string>

#include "launcher/hwloc_library.h"

namespace {

using namespace cpprun::launcher;
using cpprun::Status;
using cpprun::StatusCode;

const std::string kTopologies = CPPRUN_TOPOLOGY_DIR;

NodeTopology load(const std::string& name) {
  auto t = loadNodeTopology(kTopologies + "/" + name);
  INFO(name);
  REQUIRE(t.isOk());
  return t.value();
}

const TopologyCpu& cpu(const NodeTopology& t, int os_index) {
  auto it = std::find_if(t.cpus.begin(), t.cpus.end(),
                         [&](const TopologyCpu& c) { return c.os_index == os_index; });
  REQUIRE(it != t.cpus.end());
  return *it;
}

std::string nicOf(const NodeTopology& t, const std::string& bus_id) {
  const TopologyPciDevice* d = t.findPci(bus_id);
  REQUIRE(d != nullptr);
  REQUIRE(d->nearest_nic >= 0);
  const TopologyNic& nic = t.nics[static_cast<size_t>(d->nearest_nic)];
  return (nic.hca.empty() ? nic.netdev : nic.hca) + " " + d->nic_relation;
}

TEST_CASE("PCI bus ids in the driver's and sysfs' spellings normalise to one", "[unit]") {
  CHECK(normalizePciBusId("00000000:1B:00.0") == "0000:1b:00.0");
  CHECK(normalizePciBusId("0000:1b:00.0") == "0000:1b:00.0");
  CHECK(normalizePciBusId("1B:00.0") == "0000:1b:00.0");
  CHECK(normalizePciBusId("0001:c3:1f.7") == "0001:c3:1f.7");
  CHECK(normalizePciBusId("GPU-1b") == "");
  CHECK(normalizePciBusId("0000:1b:00.8") == "");
  CHECK(normalizePciBusId("0000:1b:00.0x") == "");
}

TEST_CASE("the DGX H100-like topology: 2 packages with 224 PUs and 8 GPUs and a NIC per GPU pair",
          "[unit]") {
  NodeTopology t = load("dgx-h100-like-2s-8gpu.xml");
  CHECK_FALSE(t.this_machine);
  CHECK(t.source.find("dgx-h100-like-2s-8gpu.xml") != std::string::npos);
  CHECK(t.cpus.size() == 224);
  CHECK(t.numa_nodes == std::vector<int>{0, 1});
  // Linux numbers the second threads after every core: core 3 of package 1 is PU 59 and 171.
  CHECK(cpu(t, 171).core == 59);
  CHECK(cpu(t, 171).package == 1);
  CHECK(cpu(t, 171).numa_node == 1);
  CHECK(cpu(t, 171).cache_group == 56);  // one L3 per package
  CHECK(t.nvidiaGpuBusIds() ==
        std::vector<std::string>{"0000:1b:00.0", "0000:43:00.0", "0000:52:00.0", "0000:61:00.0",
                                 "0000:9d:00.0", "0000:c3:00.0", "0000:d1:00.0", "0000:df:00.0"});
  CHECK(t.findPci("00000000:9D:00.0")->numa_nodes == std::vector<int>{1});
  CHECK(t.nics.size() == 4);
  CHECK(t.nics[0].hca == "mlx5_0");
  CHECK(t.nics[0].netdev == "ibp24s0");
  // Both GPUs of a switch are nearest its NIC; the GPU beside it on one port is 2 hops away.
  CHECK(nicOf(t, "0000:1b:00.0") == "mlx5_0 same PCIe switch");
  CHECK(t.findPci("0000:1b:00.0")->nic_hops == 2);
  CHECK(nicOf(t, "0000:43:00.0") == "mlx5_0 same PCIe switch");
  CHECK(t.findPci("0000:43:00.0")->nic_hops == 4);
  CHECK(nicOf(t, "0000:61:00.0") == "mlx5_1 same PCIe switch");
  CHECK(nicOf(t, "0000:c3:00.0") == "mlx5_2 same PCIe switch");
  CHECK(nicOf(t, "0000:df:00.0") == "mlx5_3 same PCIe switch");
}

TEST_CASE("the single-socket 4-GPU topology: one NUMA node and one NIC on another root port",
          "[unit]") {
  NodeTopology t = load("xeon-1s-4gpu.xml");
  CHECK(t.cpus.size() == 64);
  CHECK(t.numa_nodes == std::vector<int>{0});
  CHECK(cpu(t, 40).core == 8);
  CHECK(t.nvidiaGpuBusIds() ==
        std::vector<std::string>{"0000:17:00.0", "0000:31:00.0", "0000:b1:00.0", "0000:ca:00.0"});
  REQUIRE(t.nics.size() == 1);
  CHECK(t.nics[0].hca.empty());
  CHECK(t.nics[0].netdev == "ens2f0np0");
  CHECK(nicOf(t, "0000:31:00.0") == "ens2f0np0 same PCIe switch");
  CHECK(nicOf(t, "0000:17:00.0") == "ens2f0np0 same NUMA node");
}

TEST_CASE("the DGX A100-like topology: NPS4 gives 8 NUMA nodes of 4 core complexes", "[unit]") {
  NodeTopology t = load("dgx-a100-like-2s-epyc-nps4.xml");
  CHECK(t.cpus.size() == 256);
  CHECK(t.numa_nodes == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7});
  std::set<int> complexes;
  for (const TopologyCpu& c : t.cpus) complexes.insert(c.cache_group);
  CHECK(complexes.size() == 32);
  CHECK(cpu(t, 181).cache_group == 52);  // core 53's second thread: the CCX of cores 52-55
  CHECK(cpu(t, 181).numa_node == 3);
  CHECK(cpu(t, 181).package == 0);
  CHECK(t.findPci("0000:07:00.0")->numa_nodes == std::vector<int>{3});
  CHECK(t.findPci("0000:47:00.0")->numa_nodes == std::vector<int>{1});
  CHECK(t.findPci("0000:87:00.0")->numa_nodes == std::vector<int>{7});
  CHECK(t.findPci("0000:b7:00.0")->numa_nodes == std::vector<int>{5});
  CHECK(nicOf(t, "0000:07:00.0") == "mlx5_0 same PCIe switch");
  CHECK(nicOf(t, "0000:0f:00.0") == "mlx5_1 same PCIe switch");
  CHECK(nicOf(t, "0000:bd:00.0") == "mlx5_9 same PCIe switch");
}

TEST_CASE("this machine's topology loads with every CPU the agent may use", "[unit]") {
  auto t = loadNodeTopology();
  REQUIRE(t.isOk());
  CHECK(t.value().this_machine);
  CHECK(t.value().source.find("this machine (libhwloc.so.15, hwloc API 2.") == 0);
  CHECK_FALSE(t.value().cpus.empty());
  CHECK_FALSE(t.value().numa_nodes.empty());
}

TEST_CASE("a topology file that is missing or not hwloc XML is an error naming it", "[unit]") {
  auto missing = loadNodeTopology(kTopologies + "/no-such-node.xml");
  REQUIRE_FALSE(missing.isOk());
  CHECK(missing.status().message().find("no-such-node.xml") != std::string::npos);
  auto not_xml = loadNodeTopology(kTopologies + "/make_topologies.py");
  REQUIRE_FALSE(not_xml.isOk());
  CHECK(not_xml.status().message().find("make_topologies.py") != std::string::npos);
}

}  // namespace

// hwloc is loaded, not linked (launcher/hwloc_library.h): a node without it gets one error that
// names the library, dlopen's reason and the packages that provide it; the loaded one is 2.x.
TEST_CASE("an hwloc library that does not load is kNotFound naming it and the packages") {
  const Status s = loadHwlocLibraryFrom("libhwloc-not-installed.so.15");
  REQUIRE(s.code() == StatusCode::kNotFound);
  CHECK(s.message().find("libhwloc-not-installed.so.15 does not load (") != std::string::npos);
  CHECK(s.message().find("libhwloc15") != std::string::npos);
  CHECK(s.message().find("hwloc-libs") != std::string::npos);
  CHECK(s.message().find("or run without --numa-binding") != std::string::npos);
}

TEST_CASE("a library without hwloc's functions is kNotFound naming the first one it lacks") {
  const Status s = loadHwlocLibraryFrom("libz.so.1");
  REQUIRE(s.code() == StatusCode::kNotFound);
  CHECK(s.message().find("libz.so.1 lacks hwloc_get_api_version") != std::string::npos);
}

TEST_CASE("the system's hwloc loads, is 2.x, and a failed load before it changes nothing") {
  REQUIRE_FALSE(loadHwlocLibraryFrom("libhwloc-not-installed.so.15").isOk());
  REQUIRE(loadHwlocLibrary().isOk());
  CHECK(loadedHwlocApiVersion().rfind("2.", 0) == 0);
  CHECK(loadNodeTopology("").isOk());
}
