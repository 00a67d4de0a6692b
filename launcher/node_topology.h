// NodeTopology: this node's CPUs, caches, NUMA nodes, packages and PCI devices (GPUs, NICs) as
// plain values, read through hwloc (Debian's libhwloc-dev) from this machine or from an hwloc
// XML file. The NUMA binding plan (launcher/numa_binding.h) is a pure function of it, so tests
// load the XML topologies of real GPU nodes under tests/launcher/data/topologies/ on any
// machine.
//
// What is kept is what torch/numa/binding.py reads from sysfs, in hwloc's terms: every allowed
// PU's OS number with its core (the lowest OS number among the core's PUs, torch's
// min(thread_siblings_list)), its highest-level data or unified cache (the lowest OS number
// sharing it, torch's min(shared_cpu_list) of the max-level cache), its package
// (physical_package_id) and its NUMA node; every PCI device's bus id, class, and the NUMA nodes
// of its non-I/O ancestor (its locality; on this machine the kernel's numa_node file when it
// names one, as torch reads); and every NIC (a PCI device with an OpenFabrics or network OS
// device) with the one nearest each PCI device (fewest hops through the PCI tree; the lower bus
// id on a tie).
//
// Errors are values: a topology hwloc cannot load (a bad or missing XML file) is kNotFound or
// kInvalidArgument naming the file and hwloc's errno text.
// Thread safety: loadNodeTopology() may be called from any thread (each call owns its hwloc
// topology); NodeTopology is a value type.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace cpprun::launcher {

struct TopologyCpu {
  int os_index = 0;      // the PU's OS number (what sched_setaffinity takes)
  int core = 0;          // lowest OS number among the PUs of its core
  int cache_group = -1;  // lowest OS number sharing its highest-level data/unified cache; -1: none
  int package = -1;      // its package's OS number; -1 unknown
  int numa_node = -1;    // its NUMA node's OS number; -1 unknown
};

struct TopologyNic {
  std::string pci_bus_id;  // "0000:18:00.0"
  std::string hca;         // OpenFabrics device (NCCL_IB_HCA), e.g. "mlx5_0"; empty: none
  std::string netdev;      // network interface (NCCL_SOCKET_IFNAME), e.g. "ibp24s0"; empty: none
};

struct TopologyPciDevice {
  std::string bus_id;  // normalised: "0000:1b:00.0" (lower case, 4-digit domain)
  uint16_t vendor_id = 0;
  uint16_t class_id = 0;        // e.g. 0x0302 3D controller
  std::vector<int> numa_nodes;  // its locality; empty when hwloc does not know
  int nearest_nic = -1;         // index into NodeTopology::nics; -1 when there is none
  int nic_hops = 0;             // PCI tree hops to it (2: both under one switch port)
  std::string nic_relation;     // "same PCIe switch", "same host bridge", "same NUMA node", ...
};

struct NodeTopology {
  std::string source;                  // "this machine (hwloc 2.9.0)" or "XML file PATH"
  bool this_machine = false;           // false for an XML file (its CPUs are not this machine's)
  std::vector<TopologyCpu> cpus;       // the allowed PUs, by OS number
  std::vector<int> numa_nodes;         // every NUMA node's OS number, sorted
  std::vector<TopologyPciDevice> pci;  // by bus id
  std::vector<TopologyNic> nics;       // by bus id

  // The device at `bus_id` in any spelling the CUDA driver or sysfs uses ("00000000:1B:00.0",
  // "0000:1b:00.0"), or null.
  const TopologyPciDevice* findPci(const std::string& bus_id) const;
  // NVIDIA display and 3D controllers (vendor 0x10de, class 0x03xx) in bus order: CUDA's device
  // order under CUDA_DEVICE_ORDER=PCI_BUS_ID.
  std::vector<std::string> nvidiaGpuBusIds() const;
};

// Loads the topology from `xml_path`, or from this machine when it is empty (hwloc itself then
// honours HWLOC_XMLFILE, and the result says it is not this machine).
Result<NodeTopology> loadNodeTopology(const std::string& xml_path = "");

// "0000:1b:00.0" for "00000000:1B:00.0" or "1b:00.0"; empty when `bus_id` is not a PCI address.
std::string normalizePciBusId(const std::string& bus_id);

}  // namespace cpprun::launcher
