// NumaBinding: `--numa-binding={node,socket,exclusive,core-complex}` — which CPUs and which
// memory node each worker gets, from its GPU's place in the node's topology
// (launcher/node_topology.h). planNumaBinding() is a pure function of the topology, the
// worker→GPU assignment and the mode; prepareNumaBinding() gathers those for this node; the
// supervisor applies the result in the child before exec (agent::ProcessSpec cpus,
// memory_policy, memory_nodes).
//
// torchrun's meaning (torch 2.15, torch/numa/binding.py; torch/distributed/run.py adds
// --numa-binding with these four choices, default off, and no PET_ fallback):
//   - The device of a worker is the one whose index equals its local rank
//     (SubprocessHandler passes local_rank_id as device_index), an index into the devices the
//     agent's CUDA sees. _get_numa_node_index_for_device_index reads the device's PCI address
//     from the driver and then /sys/bus/pci/devices/<addr>/numa_node; -1 counts as node 0.
//   - Every CPU set is first cut to the agent's own affinity
//     (_get_allowed_logical_cpu_indices_for_numa_node: node cpulist ∩ sched_getaffinity(0)).
//   - node (_node_get_logical_cpus_to_bind_to): every allowed CPU of the device's NUMA node.
//   - socket (_socket_get_logical_cpus_to_bind_to): the package of the lowest allowed CPU of
//     that node, then every allowed CPU of every NUMA node whose lowest allowed CPU is on that
//     package (_get_numa_node_indices_for_socket_index).
//   - exclusive (_exclusive_get_logical_cpus_to_bind_to): the devices on the same NUMA node,
//     sorted by index, split the node's allowed physical cores (grouped by the lowest CPU of
//     thread_siblings_list, in that order) evenly; the first (cores % devices) devices get one
//     more core; each device gets every allowed thread of its cores. Fewer cores than devices
//     is an error.
//   - core-complex (_core_complex_get_logical_cpus_to_bind_to): the node's allowed CPUs grouped
//     by their highest-level data/unified cache (the lowest CPU of its shared_cpu_list), groups
//     ordered by size (largest first) then by that lowest CPU; the device with relative index i
//     on the node gets group i % groups — so devices share a complex only when there are more
//     devices than complexes.
//   - Only CPU affinity: torch wraps the command in `numactl --physcpubind=<cpus>`
//     (_assemble_numactl_command_args) and sets no memory policy.
//   - When it cannot bind (no accelerator, numactl missing, an empty CPU set, a failed lookup)
//     _handle_exception logs and re-raises: the worker does not start. Only
//     NumaOptions.should_fall_back_if_binding_fails (not reachable from torchrun's command
//     line) starts it unbound.
//
// cpprun's differences, on purpose:
//   - Memory: each bound worker also gets MPOL_PREFERRED on its GPU's NUMA node (set_mempolicy
//     in the child), which is what the kernel's local allocation gives a worker whose CPUs are
//     on that node anyway, and keeps it for memory first touched by threads on other CPUs
//     (socket mode). Preferred, not bind: a full node falls back instead of OOM-killing.
//   - Not strict by default: a worker that cannot be bound (no topology, no GPU for its local
//     rank, a GPU the topology does not show) starts unbound after one warning naming the
//     ranks and why; --strict-numa-binding makes that a failure to start (exit 3), as torchrun
//     behaves.
//   - PET_NUMA_BINDING is read when --numa-binding is absent (torchrun 2.15 does not read it).
//   - socket mode skips NUMA nodes without allowed CPUs (memory-only nodes, where torch's
//     min() of an empty set raises).
//   - No numactl: the binding is applied in the child with sched_setaffinity.
//
// Thread safety: pure functions on values; prepareNumaBinding() reads process-wide state (the
// driver, hwloc, the agent's affinity): call it from one thread.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "agent/processes/process_launcher.h"
#include "common/status.h"
#include "launcher/launch_config.h"
#include "launcher/launch_plan.h"
#include "launcher/node_resources.h"
#include "launcher/node_topology.h"
#include "launcher/preflight.h"

namespace cpprun::launcher {

enum class NumaBindingMode { kNode, kSocket, kExclusive, kCoreComplex };

// "node", "socket", "exclusive", "core-complex"; nullopt for anything else.
std::optional<NumaBindingMode> parseNumaBindingMode(const std::string& text);
const char* numaBindingModeName(NumaBindingMode mode);
// "node, socket, exclusive, core-complex" (for error messages and --help).
const char* numaBindingModeChoices();

struct WorkerBinding {
  int local_rank = 0;
  int device_index = -1;   // torch's device index (the worker's local rank)
  std::string gpu_bus_id;  // "0000:1b:00.0"; empty when unknown
  int numa_node = -1;      // the GPU's NUMA node
  std::vector<int> cpus;   // sorted OS numbers; empty when not bound
  agent::ProcessSpec::MemoryPolicy memory_policy = agent::ProcessSpec::MemoryPolicy::kInherit;
  std::vector<int> memory_nodes;
  std::optional<TopologyNic> nic;  // the NIC nearest the GPU
  std::string nic_relation;        // "same PCIe switch", ...
  std::string error;               // why this worker cannot be bound; empty when bound

  bool bound() const { return error.empty(); }
};

struct NumaBindingPlan {
  NumaBindingMode mode = NumaBindingMode::kNode;
  std::string topology_source;         // NodeTopology::source
  std::string gpu_source;              // where the GPUs' bus ids came from
  std::vector<WorkerBinding> workers;  // by local rank

  // One line for the log when some worker is not bound: the ranks and why; empty when all are.
  std::string unboundSummary() const;
};

// The plan for `nproc` workers. `device_bus_ids[i]` is the PCI bus id of device index i (empty
// when unknown); worker i uses device `worker_devices[i]` (its local rank when the vector is
// shorter). `allowed_cpus`: the agent's affinity; empty: every CPU of the topology.
NumaBindingPlan planNumaBinding(const NodeTopology& topology, NumaBindingMode mode, int nproc,
                                const std::vector<std::string>& device_bus_ids,
                                const std::vector<int>& worker_devices = {},
                                const std::vector<int>& allowed_cpus = {});

// The devices' bus ids as torch's device indices see them, and which device each worker uses:
// from the CUDA driver (`driver`, ordinals; a Slurm GPU list without CUDA_VISIBLE_DEVICES
// names ordinals) when it reports bus ids, else from the topology's NVIDIA GPUs in bus order
// (CUDA_VISIBLE_DEVICES entries, when numbers, pick among them). `source` says which.
struct GpuLocality {
  std::vector<std::string> device_bus_ids;
  std::vector<int> worker_devices;
  std::string source;
};
GpuLocality gpuLocality(const NodeResources& node, int nproc, const NodeTopology& topology,
                        const Result<CudaDriverInfo>& driver);

// Whether this process may apply `w` (sched_setaffinity, set_mempolicy), tried in a throwaway
// thread: empty when it may, else the call, the CPUs or nodes and errno's text.
std::string probeWorkerBinding(const WorkerBinding& w);

// For this node: loads the topology (hwloc; HWLOC_XMLFILE in `env` names an XML file instead),
// asks the driver, cuts to the agent's affinity (this machine only) and plans; on this machine
// a worker whose binding the kernel refuses (probeWorkerBinding) is not bound. An error only
// when there is no topology at all.
Result<NumaBindingPlan> prepareNumaBinding(NumaBindingMode mode, const NodeResources& node,
                                           int nproc,
                                           const std::map<std::string, std::string>& env);

// Copies each worker's CPUs and memory policy into its spec (none for a worker that cannot be
// bound), with a one-line description (WorkerSpec::binding: "node: GPU 0 (…), NUMA node 0:
// CPUs …" or "node: not bound: why") for the dry run, /status and the event log.
void applyNumaBinding(const NumaBindingPlan& binding, LaunchPlan& plan);

// --check's findings: each worker's GPU, NUMA node and nearest NIC, and with --numa-binding
// (`requested`) its CPUs and memory policy — a worker that cannot be bound is a warning, or a
// failure under --strict-numa-binding. `plan` is an error when there is no topology.
std::vector<CheckFinding> numaBindingFindings(const Result<NumaBindingPlan>& plan, bool requested,
                                              bool strict);

// "GPU 0000:1b:00.0, NUMA node 0: CPUs 0-55,112-167, memory preferred on node 0; nearest NIC
// mlx5_0 (ibp24s0, same PCIe switch)" or "not bound: why".
std::string describeWorkerBinding(const WorkerBinding& w);

}  // namespace cpprun::launcher
