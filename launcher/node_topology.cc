#include "launcher/node_topology.h"

#include <dlfcn.h>
#include <hwloc.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>

#include "launcher/hwloc_library.h"

namespace cpprun::launcher {
namespace {

struct TopologyDeleter {
  void operator()(hwloc_topology_t t) const { hwloc_topology_destroy(t); }
};
using TopologyPtr = std::unique_ptr<hwloc_topology, TopologyDeleter>;

std::string busIdOf(hwloc_obj_t pci) {
  char text[32];
  std::snprintf(text, sizeof text, "%04x:%02x:%02x.%01x", pci->attr->pcidev.domain,
                pci->attr->pcidev.bus, pci->attr->pcidev.dev, pci->attr->pcidev.func);
  return text;
}

hwloc_obj_t ancestorOfType(hwloc_obj_t obj, hwloc_obj_type_t type) {
  for (hwloc_obj_t o = obj->parent; o != nullptr; o = o->parent) {
    if (o->type == type) return o;
  }
  return nullptr;
}

std::vector<int> nodesOf(hwloc_const_nodeset_t set) {
  std::vector<int> nodes;
  if (set == nullptr) return nodes;
  for (int i = hwloc_bitmap_first(set); i >= 0; i = hwloc_bitmap_next(set, i)) nodes.push_back(i);
  return nodes;
}

// The kernel's numa_node of a PCI device (what torch reads), -1 when it names none.
int sysfsNumaNode(const std::string& bus_id) {
  std::ifstream in("/sys/bus/pci/devices/" + bus_id + "/numa_node");
  int node = -1;
  if (!(in >> node)) return -1;
  return node;
}

// Hops from `a` and from `b` up to their closest common ancestor, and that ancestor.
std::pair<int, hwloc_obj_t> hopsBetween(hwloc_obj_t a, hwloc_obj_t b) {
  std::vector<hwloc_obj_t> chain;
  for (hwloc_obj_t o = a; o != nullptr; o = o->parent) chain.push_back(o);
  int up_b = 0;
  for (hwloc_obj_t o = b; o != nullptr; o = o->parent, ++up_b) {
    auto it = std::find(chain.begin(), chain.end(), o);
    if (it != chain.end()) return {static_cast<int>(it - chain.begin()) + up_b, o};
  }
  return {1 << 20, nullptr};
}

std::string relationOf(hwloc_obj_t common) {
  if (common == nullptr) return "unrelated";
  if (common->type == HWLOC_OBJ_PCI_DEVICE) return "same PCI device";
  if (common->type == HWLOC_OBJ_BRIDGE) {
    return common->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_HOST ? "same host bridge"
                                                                       : "same PCIe switch";
  }
  if (hwloc_bitmap_weight(common->nodeset) == 1) return "same NUMA node";
  if (common->type == HWLOC_OBJ_PACKAGE || ancestorOfType(common, HWLOC_OBJ_PACKAGE) != nullptr) {
    return "same package";
  }
  return "across packages";
}

}  // namespace

std::string normalizePciBusId(const std::string& bus_id) {
  // [domain:]bus:device.function in hex, the function one digit 0-7.
  if (bus_id.size() < 3 || bus_id[bus_id.size() - 2] != '.' ||
      bus_id.find_first_not_of("0123456789abcdefABCDEF:.") != std::string::npos) {
    return "";
  }
  unsigned domain = 0, bus = 0, dev = 0, func = 0;
  char tail = 0;
  std::string text = bus_id;
  // "1b:00.0" has no domain.
  if (std::count(text.begin(), text.end(), ':') == 1) text = "0:" + text;
  if (std::sscanf(text.c_str(), "%x:%x:%x.%x%c", &domain, &bus, &dev, &func, &tail) != 4 ||
      domain > 0xffff || bus > 0xff || dev > 0x1f || func > 7) {
    return "";
  }
  char out[32];
  std::snprintf(out, sizeof out, "%04x:%02x:%02x.%01x", domain, bus, dev, func);
  return out;
}

const TopologyPciDevice* NodeTopology::findPci(const std::string& bus_id) const {
  const std::string want = normalizePciBusId(bus_id);
  if (want.empty()) return nullptr;
  for (const auto& d : pci) {
    if (d.bus_id == want) return &d;
  }
  return nullptr;
}

std::vector<std::string> NodeTopology::nvidiaGpuBusIds() const {
  std::vector<std::string> ids;
  for (const auto& d : pci) {
    if (d.vendor_id == 0x10de && (d.class_id >> 8) == 0x03) ids.push_back(d.bus_id);
  }
  return ids;
}

// hwloc's PCI plugin (hwloc_pci.so) brings libpciaccess in for each load and unloads both when
// the load ends, orphaning libpciaccess's process-wide state (about 1 KB per load: a real leak,
// which ASan's leak check reports from an unloaded module). Kept resident, that state stays
// reachable and is reused. No libpciaccess (hwloc without its PCI plugin) is no error.
void keepPciAccessResident() {
  static const bool kept = [] {
    return ::dlopen("libpciaccess.so.0", RTLD_LAZY | RTLD_GLOBAL | RTLD_NODELETE) != nullptr;
  }();
  (void)kept;
}

namespace {

// hwloc's topology of this machine, or of `xml_path` when given, loaded with the parts the
// plan reads.
Result<TopologyPtr> loadHwloc(const std::string& xml_path) {
  if (xml_path.empty() && std::getenv("HWLOC_XMLFILE") == nullptr) keepPciAccessResident();
  hwloc_topology_t raw = nullptr;
  if (hwloc_topology_init(&raw) != 0) {
    return internalError(std::string("hwloc_topology_init: ") + std::strerror(errno));
  }
  TopologyPtr topo(raw);
  hwloc_topology_set_io_types_filter(raw, HWLOC_TYPE_FILTER_KEEP_ALL);
  // What the plan reads comes from Linux's sysfs and the PCI tree. Left out: CPUID (x86: slow
  // in a VM, where every cpuid traps; it halved the load here, 19 -> 10 ms), and the plugins
  // that would start GPU runtimes in the agent (cuda, nvml, rsmi, levelzero, opencl) or talk
  // to an X server (gl). A component that is not installed is no error.
  for (const char* name : {"x86", "cuda", "nvml", "rsmi", "levelzero", "opencl", "gl"}) {
    hwloc_topology_set_components(raw, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, name);
  }
  if (!xml_path.empty() && hwloc_topology_set_xml(raw, xml_path.c_str()) != 0) {
    return Status(StatusCode::kNotFound, "cannot read the hwloc topology XML file " + xml_path +
                                             ": " + std::strerror(errno));
  }
  if (hwloc_topology_load(raw) != 0) {
    const std::string what =
        xml_path.empty() ? "this machine's topology" : "the hwloc topology XML file " + xml_path;
    return invalidArgument("hwloc cannot load " + what + ": " + std::strerror(errno));
  }
  return topo;
}

// Where the topology came from, for --check.
std::string sourceOf(const std::string& xml_path, bool this_machine) {
  if (!xml_path.empty()) return "XML file " + xml_path;
  if (this_machine) {
    return std::string("this machine (") + kHwlocLibrary + ", hwloc API " +
           loadedHwlocApiVersion() + ")";
  }
  const char* env = std::getenv("HWLOC_XMLFILE");
  return std::string("XML file ") + (env != nullptr ? env : "(HWLOC_XMLFILE)");
}

// The NUMA nodes into `out`; their hwloc objects, in hwloc's order.
std::vector<hwloc_obj_t> readNumaNodes(hwloc_topology_t raw, NodeTopology& out) {
  std::vector<hwloc_obj_t> numa_objs;
  for (hwloc_obj_t n = hwloc_get_next_obj_by_type(raw, HWLOC_OBJ_NUMANODE, nullptr); n != nullptr;
       n = hwloc_get_next_obj_by_type(raw, HWLOC_OBJ_NUMANODE, n)) {
    numa_objs.push_back(n);
    out.numa_nodes.push_back(static_cast<int>(n->os_index));
  }
  std::sort(out.numa_nodes.begin(), out.numa_nodes.end());
  return numa_objs;
}

// One PU: its core, highest-level data cache group, package and NUMA node.
TopologyCpu cpuOf(hwloc_obj_t pu, const std::vector<hwloc_obj_t>& numa_objs) {
  TopologyCpu cpu;
  cpu.os_index = static_cast<int>(pu->os_index);
  hwloc_obj_t core = ancestorOfType(pu, HWLOC_OBJ_CORE);
  cpu.core = core != nullptr ? hwloc_bitmap_first(core->complete_cpuset) : cpu.os_index;
  hwloc_obj_t cache = nullptr;
  for (hwloc_obj_t o = pu->parent; o != nullptr; o = o->parent) {
    if (!hwloc_obj_type_is_dcache(o->type) || o->attr->cache.type == HWLOC_OBJ_CACHE_INSTRUCTION) {
      continue;
    }
    if (cache == nullptr || o->attr->cache.depth > cache->attr->cache.depth) cache = o;
  }
  if (cache != nullptr) cpu.cache_group = hwloc_bitmap_first(cache->complete_cpuset);
  if (hwloc_obj_t pkg = ancestorOfType(pu, HWLOC_OBJ_PACKAGE); pkg != nullptr) {
    cpu.package = static_cast<int>(pkg->os_index);
  }
  for (hwloc_obj_t n : numa_objs) {
    if (hwloc_bitmap_isset(n->cpuset, pu->os_index)) {
      cpu.numa_node = static_cast<int>(n->os_index);
      break;
    }
  }
  return cpu;
}

// NICs: PCI devices with an OpenFabrics or network OS device, by bus id, into `out`; their
// hwloc PCI objects in the same order.
std::vector<hwloc_obj_t> readNics(hwloc_topology_t raw, NodeTopology& out) {
  std::map<std::string, std::pair<TopologyNic, hwloc_obj_t>> nics;
  for (hwloc_obj_t os = hwloc_get_next_osdev(raw, nullptr); os != nullptr;
       os = hwloc_get_next_osdev(raw, os)) {
    const auto kind = os->attr->osdev.type;
    if (kind != HWLOC_OBJ_OSDEV_OPENFABRICS && kind != HWLOC_OBJ_OSDEV_NETWORK) continue;
    if (os->parent == nullptr || os->parent->type != HWLOC_OBJ_PCI_DEVICE) continue;
    const std::string bus = busIdOf(os->parent);
    auto& [nic, obj] = nics[bus];
    nic.pci_bus_id = bus;
    obj = os->parent;
    std::string& name = kind == HWLOC_OBJ_OSDEV_OPENFABRICS ? nic.hca : nic.netdev;
    if (name.empty() && os->name != nullptr) name = os->name;
  }
  std::vector<hwloc_obj_t> nic_objs;
  for (auto& [bus, entry] : nics) {
    out.nics.push_back(entry.first);
    nic_objs.push_back(entry.second);
  }
  return nic_objs;
}

// One PCI device: its NUMA node(s) and nearest NIC.
TopologyPciDevice pciDeviceOf(hwloc_topology_t raw, hwloc_obj_t p, bool this_machine,
                              const std::vector<hwloc_obj_t>& nic_objs) {
  TopologyPciDevice d;
  d.bus_id = busIdOf(p);
  d.vendor_id = p->attr->pcidev.vendor_id;
  d.class_id = p->attr->pcidev.class_id;
  const int sysfs_node = this_machine ? sysfsNumaNode(d.bus_id) : -1;
  if (sysfs_node >= 0) {
    d.numa_nodes = {sysfs_node};
  } else if (hwloc_obj_t local = hwloc_get_non_io_ancestor_obj(raw, p); local != nullptr) {
    d.numa_nodes = nodesOf(local->nodeset);
  }
  int best_hops = 0;
  for (size_t i = 0; i < nic_objs.size(); ++i) {  // by bus id: the lower wins a tie
    auto [hops, common] = hopsBetween(p, nic_objs[i]);
    if (d.nearest_nic < 0 || hops < best_hops) {
      d.nearest_nic = static_cast<int>(i);
      best_hops = hops;
      d.nic_hops = hops;
      d.nic_relation = relationOf(common);
    }
  }
  return d;
}

}  // namespace

Result<NodeTopology> loadNodeTopology(const std::string& xml_path) {
  if (Status hwloc = loadHwlocLibrary(); !hwloc.isOk()) return hwloc;
  auto loaded = loadHwloc(xml_path);
  if (!loaded.isOk()) return loaded.status();
  hwloc_topology_t raw = loaded.value().get();

  NodeTopology out;
  out.this_machine = hwloc_topology_is_thissystem(raw) != 0;
  out.source = sourceOf(xml_path, out.this_machine);

  const std::vector<hwloc_obj_t> numa_objs = readNumaNodes(raw, out);
  for (hwloc_obj_t pu = hwloc_get_next_obj_by_type(raw, HWLOC_OBJ_PU, nullptr); pu != nullptr;
       pu = hwloc_get_next_obj_by_type(raw, HWLOC_OBJ_PU, pu)) {
    out.cpus.push_back(cpuOf(pu, numa_objs));
  }
  std::sort(out.cpus.begin(), out.cpus.end(),
            [](const TopologyCpu& a, const TopologyCpu& b) { return a.os_index < b.os_index; });

  const std::vector<hwloc_obj_t> nic_objs = readNics(raw, out);
  for (hwloc_obj_t p = hwloc_get_next_pcidev(raw, nullptr); p != nullptr;
       p = hwloc_get_next_pcidev(raw, p)) {
    out.pci.push_back(pciDeviceOf(raw, p, out.this_machine, nic_objs));
  }
  std::sort(
      out.pci.begin(), out.pci.end(),
      [](const TopologyPciDevice& a, const TopologyPciDevice& b) { return a.bus_id < b.bus_id; });
  return out;
}

}  // namespace cpprun::launcher
