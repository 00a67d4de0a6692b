#include "launcher/numa_binding.h"

#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <set>
#include <thread>

#include "common/cpu_list.h"

namespace cpprun::launcher {
namespace {

using MemoryPolicy = agent::ProcessSpec::MemoryPolicy;

struct Mode {
  const char* name;
  NumaBindingMode mode;
};
constexpr Mode kModes[] = {{"node", NumaBindingMode::kNode},
                           {"socket", NumaBindingMode::kSocket},
                           {"exclusive", NumaBindingMode::kExclusive},
                           {"core-complex", NumaBindingMode::kCoreComplex}};

// What the plan needs of the topology, cut to the allowed CPUs.
class Layout {
 public:
  Layout(const NodeTopology& topology, const std::vector<int>& allowed) : topology_(topology) {
    const std::set<int> allow(allowed.begin(), allowed.end());
    for (const TopologyCpu& cpu : topology.cpus) {
      if (allow.empty() || allow.count(cpu.os_index) != 0) cpus_.push_back(&cpu);
    }
  }

  // torch's _get_numa_node_index_for_device_index: the device's node, -1 counted as 0.
  Result<int> nodeOfDevice(const std::vector<std::string>& bus_ids, int device) const {
    if (device < 0 || static_cast<size_t>(device) >= bus_ids.size()) {
      return invalidArgument("no GPU with device index " + std::to_string(device) + " (" +
                             std::to_string(bus_ids.size()) + " known)");
    }
    if (bus_ids[device].empty()) {
      return invalidArgument("the PCI bus id of GPU " + std::to_string(device) + " is unknown");
    }
    const TopologyPciDevice* pci = topology_.findPci(bus_ids[device]);
    if (pci == nullptr) {
      return invalidArgument("GPU " + std::to_string(device) + " (" + bus_ids[device] +
                             ") is not in the topology (" + topology_.source + ")");
    }
    return pci->numa_nodes.empty() ? 0 : std::max(pci->numa_nodes.front(), 0);
  }

  std::vector<const TopologyCpu*> cpusOfNode(int node) const {
    std::vector<const TopologyCpu*> out;
    for (const TopologyCpu* c : cpus_) {
      if (c->numa_node == node || (node == 0 && c->numa_node < 0)) out.push_back(c);
    }
    return out;
  }

 private:
  const NodeTopology& topology_;
  std::vector<const TopologyCpu*> cpus_;  // allowed, by OS number
};

std::vector<int> osIndexes(const std::vector<const TopologyCpu*>& cpus) {
  std::vector<int> out;
  for (const TopologyCpu* c : cpus) out.push_back(c->os_index);
  std::sort(out.begin(), out.end());
  return out;
}

// Groups CPUs by a key, groups in key order.
template <typename Key>
std::map<int, std::vector<int>> groupBy(const std::vector<const TopologyCpu*>& cpus, Key key) {
  std::map<int, std::vector<int>> groups;
  for (const TopologyCpu* c : cpus) groups[key(*c)].push_back(c->os_index);
  return groups;
}

Result<std::vector<int>> cpusFor(const Layout& layout, const NodeTopology& topology,
                                 NumaBindingMode mode, const std::vector<std::string>& bus_ids,
                                 int device, int node) {
  const std::vector<const TopologyCpu*> node_cpus = layout.cpusOfNode(node);
  switch (mode) {
    case NumaBindingMode::kNode:
      return osIndexes(node_cpus);
    case NumaBindingMode::kSocket: {
      if (node_cpus.empty()) break;
      const int package = node_cpus.front()->package;  // of the lowest allowed CPU
      std::vector<const TopologyCpu*> socket;
      for (int n : topology.numa_nodes) {
        const auto cpus = layout.cpusOfNode(n);
        if (!cpus.empty() && cpus.front()->package == package) {
          socket.insert(socket.end(), cpus.begin(), cpus.end());
        }
      }
      return osIndexes(socket);
    }
    case NumaBindingMode::kExclusive:
    case NumaBindingMode::kCoreComplex: {
      std::vector<int> devices_on_node;  // sorted by index
      for (int d = 0; d < static_cast<int>(bus_ids.size()); ++d) {
        auto n = layout.nodeOfDevice(bus_ids, d);
        if (n.isOk() && n.value() == node) devices_on_node.push_back(d);
      }
      const int relative =
          static_cast<int>(std::find(devices_on_node.begin(), devices_on_node.end(), device) -
                           devices_on_node.begin());
      const int devices = static_cast<int>(devices_on_node.size());
      if (mode == NumaBindingMode::kExclusive) {
        const auto cores = groupBy(node_cpus, [](const TopologyCpu& c) { return c.core; });
        const int ncores = static_cast<int>(cores.size());
        const int per_device = ncores / devices;
        const int extra = ncores % devices;
        if (per_device < 1) {
          return invalidArgument("NUMA node " + std::to_string(node) + " has " +
                                 std::to_string(ncores) + " allowed physical cores for " +
                                 std::to_string(devices) + " GPUs");
        }
        const int start = relative * per_device + std::min(relative, extra);
        const int end = start + per_device + (relative < extra ? 1 : 0);
        std::vector<int> out;
        int i = 0;
        for (const auto& [core, threads] : cores) {
          if (i >= start && i < end) out.insert(out.end(), threads.begin(), threads.end());
          ++i;
        }
        std::sort(out.begin(), out.end());
        return out;
      }
      for (const TopologyCpu* c : node_cpus) {
        if (c->cache_group < 0) {
          return invalidArgument("the topology has no cache information for CPU " +
                                 std::to_string(c->os_index));
        }
      }
      auto by_cache = groupBy(node_cpus, [](const TopologyCpu& c) { return c.cache_group; });
      std::vector<std::pair<int, std::vector<int>>> complexes(by_cache.begin(), by_cache.end());
      std::stable_sort(complexes.begin(), complexes.end(), [](const auto& a, const auto& b) {
        return a.second.size() > b.second.size();  // largest first; then the lower CPU (map order)
      });
      if (complexes.empty()) break;
      std::vector<int> out = complexes[static_cast<size_t>(relative) % complexes.size()].second;
      std::sort(out.begin(), out.end());
      return out;
    }
  }
  return std::vector<int>{};
}

}  // namespace

std::optional<NumaBindingMode> parseNumaBindingMode(const std::string& text) {
  for (const Mode& m : kModes) {
    if (text == m.name) return m.mode;
  }
  return std::nullopt;
}

const char* numaBindingModeName(NumaBindingMode mode) {
  for (const Mode& m : kModes) {
    if (m.mode == mode) return m.name;
  }
  return "?";
}

const char* numaBindingModeChoices() { return "node, socket, exclusive, core-complex"; }

NumaBindingPlan planNumaBinding(const NodeTopology& topology, NumaBindingMode mode, int nproc,
                                const std::vector<std::string>& device_bus_ids,
                                const std::vector<int>& worker_devices,
                                const std::vector<int>& allowed_cpus) {
  NumaBindingPlan plan;
  plan.mode = mode;
  plan.topology_source = topology.source;
  const Layout layout(topology, allowed_cpus);
  for (int rank = 0; rank < nproc; ++rank) {
    WorkerBinding w;
    w.local_rank = rank;
    w.device_index =
        static_cast<size_t>(rank) < worker_devices.size() ? worker_devices[rank] : rank;
    auto node = layout.nodeOfDevice(device_bus_ids, w.device_index);
    if (!node.isOk()) {
      w.error = node.status().message();
      plan.workers.push_back(std::move(w));
      continue;
    }
    w.gpu_bus_id = device_bus_ids[w.device_index];
    if (const TopologyPciDevice* pci = topology.findPci(w.gpu_bus_id); pci != nullptr) {
      w.gpu_bus_id = pci->bus_id;
      if (pci->nearest_nic >= 0) {
        w.nic = topology.nics[pci->nearest_nic];
        w.nic_relation = pci->nic_relation;
      }
    }
    w.numa_node = node.value();
    auto cpus = cpusFor(layout, topology, mode, device_bus_ids, w.device_index, w.numa_node);
    if (!cpus.isOk()) {
      w.error = cpus.status().message();
    } else if (cpus.value().empty()) {
      w.error = "NUMA node " + std::to_string(w.numa_node) + " has no CPU the agent may use";
    } else {
      w.cpus = std::move(cpus).value();
      w.memory_policy = MemoryPolicy::kPreferred;
      w.memory_nodes = {w.numa_node};
    }
    plan.workers.push_back(std::move(w));
  }
  return plan;
}

std::string NumaBindingPlan::unboundSummary() const {
  std::vector<const WorkerBinding*> unbound;
  for (const auto& w : workers) {
    if (!w.bound()) unbound.push_back(&w);
  }
  if (unbound.empty()) return "";
  std::string ranks;
  for (const auto* w : unbound) ranks += (ranks.empty() ? "" : ",") + std::to_string(w->local_rank);
  std::string why = unbound.front()->error;
  for (const auto* w : unbound) {
    if (w->error != why) {
      why += "; local rank " + std::to_string(w->local_rank) + ": " + w->error;
      break;  // the first two reasons are enough for one line
    }
  }
  return std::string("--numa-binding=") + numaBindingModeName(mode) + ": local rank" +
         (unbound.size() > 1 ? "s " : " ") + ranks + " cannot be bound (" + why + ")";
}

std::string describeWorkerBinding(const WorkerBinding& w) {
  if (!w.bound()) return "not bound: " + w.error;
  std::string out = "GPU " + std::to_string(w.device_index) + " (" + w.gpu_bus_id +
                    "), NUMA node " + std::to_string(w.numa_node) + ": CPUs " +
                    formatIndexList(w.cpus);
  if (w.memory_policy != MemoryPolicy::kInherit) {
    std::string nodes;
    for (int n : w.memory_nodes) nodes += (nodes.empty() ? "" : ",") + std::to_string(n);
    out += std::string(", memory ") +
           (w.memory_policy == MemoryPolicy::kPreferred ? "preferred on" : "bound to") + " node " +
           nodes;
  }
  if (w.nic) {
    std::string name = !w.nic->hca.empty() ? w.nic->hca : w.nic->netdev;
    std::string also = !w.nic->hca.empty() && !w.nic->netdev.empty() ? w.nic->netdev + ", " : "";
    out += "; nearest NIC " + name + " (" + also + w.nic_relation + ")";
  }
  return out;
}

GpuLocality gpuLocality(const NodeResources& node, int nproc, const NodeTopology& topology,
                        const Result<CudaDriverInfo>& driver) {
  GpuLocality out;
  auto asNumber = [](const std::string& s, int& n) {
    if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos) return false;
    n = std::atoi(s.c_str());
    return true;
  };
  bool driver_ids = false;
  if (driver.isOk()) {
    for (const auto& d : driver.value().devices) driver_ids = driver_ids || !d.pci_bus_id.empty();
  }
  const bool slurm_list = node.gpu_source.rfind("SLURM_", 0) == 0;
  if (driver_ids) {
    out.source = "the CUDA driver's PCI bus ids";
    for (const auto& d : driver.value().devices) out.device_bus_ids.push_back(d.pci_bus_id);
    // The driver numbers what it sees: under CUDA_VISIBLE_DEVICES that list, in its order
    // (local rank = ordinal); a Slurm list without it names the driver's ordinals.
    for (int i = 0; i < nproc; ++i) {
      int ordinal = i;
      if (slurm_list && static_cast<size_t>(i) < node.gpus.size() &&
          !asNumber(node.gpus[i], ordinal)) {
        ordinal = -1;
      }
      out.worker_devices.push_back(ordinal);
    }
    return out;
  }
  // No driver: the topology's NVIDIA GPUs in bus order are the physical ordinals; a list of
  // numbers (CUDA_VISIBLE_DEVICES, Slurm) picks the visible ones, in its order.
  const std::vector<std::string> physical = topology.nvidiaGpuBusIds();
  out.source = "the topology's NVIDIA GPUs in PCI bus order (no CUDA driver answered)";
  if (node.gpu_source == "driver" || node.gpus.empty()) {
    out.device_bus_ids = physical;
  } else {
    for (const std::string& entry : node.gpus) {
      int n = -1;
      out.device_bus_ids.push_back(asNumber(entry, n) && static_cast<size_t>(n) < physical.size()
                                       ? physical[n]
                                       : std::string());
    }
  }
  for (int i = 0; i < nproc; ++i) out.worker_devices.push_back(i);
  return out;
}

std::string probeWorkerBinding(const WorkerBinding& w) {
  std::string error;
  // A throwaway thread: affinity and memory policy are per thread and die with it.
  std::thread probe([&] {
    if (!w.cpus.empty()) {
      cpu_set_t set;
      CPU_ZERO(&set);
      for (int c : w.cpus) {
        if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
      }
      if (sched_setaffinity(0, sizeof set, &set) != 0) {
        error = "the kernel refuses sched_setaffinity(CPUs " + formatIndexList(w.cpus) +
                "): " + std::strerror(errno);
        return;
      }
    }
    if (w.memory_policy != MemoryPolicy::kInherit && !w.memory_nodes.empty()) {
      unsigned long mask[16] = {};  // 1024 nodes
      std::string nodes;
      for (int n : w.memory_nodes) {
        if (n >= 0 && n < 1024) mask[n / 64] |= 1UL << (n % 64);
        nodes += (nodes.empty() ? "" : ",") + std::to_string(n);
      }
      const int mode = w.memory_policy == MemoryPolicy::kPreferred ? 1 : 2;  // MPOL_PREFERRED, BIND
      if (::syscall(SYS_set_mempolicy, mode, mask, sizeof mask * 8) != 0) {
        error = "the kernel refuses set_mempolicy(" +
                std::string(mode == 1 ? "MPOL_PREFERRED" : "MPOL_BIND") + ", nodes " + nodes +
                "): " + std::strerror(errno);
      }
    }
  });
  probe.join();
  return error;
}

Result<NumaBindingPlan> prepareNumaBinding(NumaBindingMode mode, const NodeResources& node,
                                           int nproc,
                                           const std::map<std::string, std::string>& env) {
  auto xml = env.find("HWLOC_XMLFILE");
  auto topology = loadNodeTopology(xml != env.end() ? xml->second : "");
  if (!topology.isOk()) return topology.status();
  const Result<CudaDriverInfo> driver = queryCudaDriver();
  GpuLocality gpus = gpuLocality(node, nproc, topology.value(), driver);
  std::vector<int> allowed;
  if (topology.value().this_machine) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
      for (int c = 0; c < CPU_SETSIZE; ++c) {
        if (CPU_ISSET(c, &set)) allowed.push_back(c);
      }
    }
  }
  NumaBindingPlan plan = planNumaBinding(topology.value(), mode, nproc, gpus.device_bus_ids,
                                         gpus.worker_devices, allowed);
  plan.gpu_source = gpus.source;
  // A container may forbid what the plan needs: found here, it is one warning (or, strict, a
  // refusal to start) instead of every worker's spawn failing.
  if (topology.value().this_machine) {
    for (WorkerBinding& w : plan.workers) {
      if (!w.bound()) continue;
      std::string refused = probeWorkerBinding(w);
      if (refused.empty()) continue;
      w.error = std::move(refused);
      w.cpus.clear();
      w.memory_policy = MemoryPolicy::kInherit;
      w.memory_nodes.clear();
    }
  }
  return plan;
}

void applyNumaBinding(const NumaBindingPlan& binding, LaunchPlan& plan) {
  for (agent::WorkerSpec& w : plan.workers) {
    for (const WorkerBinding& b : binding.workers) {
      if (b.local_rank != w.local_rank) continue;  // an unbound worker: empty cpus, kInherit
      w.cpus = b.cpus;
      w.memory_policy = b.memory_policy;
      w.memory_nodes = b.memory_nodes;
      w.binding = std::string(numaBindingModeName(binding.mode)) + ": " + describeWorkerBinding(b);
    }
  }
}

std::vector<CheckFinding> numaBindingFindings(const Result<NumaBindingPlan>& plan, bool requested,
                                              bool strict) {
  const std::string topic = requested ? "NUMA binding" : "GPU locality";
  const CheckLevel not_bound = !requested ? CheckLevel::kOk
                               : strict   ? CheckLevel::kFail
                                          : CheckLevel::kWarn;
  if (!plan.isOk()) {
    return {{not_bound, topic,
             "no topology: " + plan.status().message() +
                 (requested
                      ? (strict ? "; the job would not start" : "; the workers would start unbound")
                      : "")}};
  }
  const NumaBindingPlan& p = plan.value();
  std::vector<CheckFinding> out;
  const std::string from = "topology from " + p.topology_source + ", GPUs from " + p.gpu_source;
  if (requested) {
    out.push_back(
        {CheckLevel::kOk, topic,
         std::string("--numa-binding=") + numaBindingModeName(p.mode) + " (" + from + ")"});
  }
  bool any_gpu = false;
  for (const WorkerBinding& w : p.workers) {
    any_gpu = any_gpu || !w.gpu_bus_id.empty();
    if (!requested && w.gpu_bus_id.empty()) continue;
    std::string text = "local rank " + std::to_string(w.local_rank) + ": ";
    if (requested) {
      text += describeWorkerBinding(w);
      if (!w.bound()) {
        text += strict ? " (the job would not start)" : " (it would start unbound)";
      }
    } else {
      text += "GPU " + std::to_string(w.device_index) + " (" + w.gpu_bus_id + ") on NUMA node " +
              std::to_string(w.numa_node);
      if (w.nic) {
        text += ", nearest NIC " + (w.nic->hca.empty() ? w.nic->netdev : w.nic->hca) + " (" +
                (w.nic->hca.empty() || w.nic->netdev.empty() ? "" : w.nic->netdev + ", ") +
                w.nic_relation + ")";
      }
    }
    out.push_back({w.bound() ? CheckLevel::kOk : not_bound, topic, text});
  }
  if (!requested && !any_gpu) {
    out.push_back({CheckLevel::kOk, topic,
                   (p.workers.empty() ? std::string("no workers") : p.workers.front().error) +
                       " (" + from + ")"});
  }
  return out;
}

}  // namespace cpprun::launcher
