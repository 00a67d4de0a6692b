#include "launcher/preflight.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <poll.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "agent/nccl/nccl_unique_id.h"
#include "common/clip.h"
#include "common/cpu_list.h"
#include "common/environment.h"
#include "common/network_address.h"
#include "common/system.h"
#include "launcher/cuda_driver.h"
#include "launcher/launch_plan.h"

namespace cpprun::launcher {

namespace {

bool startsWith(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

std::vector<std::string> splitComma(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

std::string describe(const NetworkInterface& i) { return i.name + " (" + i.address + ")"; }

std::string versionText(int code, int major_div, int minor_div) {
  // NCCL: 22809 -> 2.28.9 (>= 2.9: major*10000 + minor*100 + patch); CUDA: 12040 -> 12.4.
  if (minor_div == 0) return std::to_string(code);
  const int major = code / major_div;
  const int minor = (code % major_div) / minor_div;
  std::string out = std::to_string(major) + "." + std::to_string(minor);
  if (minor_div > 1) out += "." + std::to_string(code % minor_div);
  return out;
}

std::string readFirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// ---- probes -------------------------------------------------------------------------------

void probeCuda(SystemFacts& f) {
  const Result<CudaDriverInfo> driver = queryCudaDriver();
  if (!driver.isOk()) {
    f.cuda_error = driver.status().message();
    f.cuda_installed = driver.status().code() != StatusCode::kNotFound;
    return;
  }
  f.cuda_installed = true;
  f.cuda_driver_version = driver.value().version;
  for (const CudaDevice& d : driver.value().devices) {
    f.gpu_names.push_back(d.name);
    f.gpu_bus_ids.push_back(d.pci_bus_id);
    int numa = -1;
    if (!d.pci_bus_id.empty()) {
      std::string id = d.pci_bus_id;  // sysfs spells it in lower case
      std::transform(id.begin(), id.end(), id.begin(), ::tolower);
      const std::string value = readFirstLine("/sys/bus/pci/devices/" + id + "/numa_node");
      if (!value.empty()) numa = std::atoi(value.c_str());
    }
    f.gpu_numa_nodes.push_back(numa);
  }
}

// The agent's own loader, so --check reports what a run would get (and the library stays
// loaded, as the agent keeps it: see agent/nccl/nccl_unique_id.h).
void probeNccl(SystemFacts& f, const std::string& library) {
  auto provider = agent::NcclUniqueIdProvider::create(library);
  if (!provider.isOk()) {
    f.nccl_error = provider.status().message();
    return;
  }
  f.nccl_version = provider.value()->version();
}

void probeInterfaces(SystemFacts& f) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    const int family = i->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    char host[NI_MAXHOST] = {};
    const socklen_t len = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    if (::getnameinfo(i->ifa_addr, len, host, sizeof host, nullptr, 0, NI_NUMERICHOST) != 0) {
      continue;
    }
    NetworkInterface n;
    n.name = i->ifa_name;
    n.address = host;
    n.ipv6 = family == AF_INET6;
    n.up = (i->ifa_flags & IFF_UP) != 0;
    n.loopback = (i->ifa_flags & IFF_LOOPBACK) != 0;
    f.interfaces.push_back(n);
  }
  ::freeifaddrs(list);
}

std::string resolveFirst(const std::string& host, std::string* error) {
  // An empty host names nothing here (resolveTcp would take it for the loopback).
  if (host.empty()) {
    if (error) *error = ::gai_strerror(EAI_NONAME);
    return "";
  }
  auto resolved = resolveTcp(host, 0);
  if (!resolved.isOk()) {
    if (error) *error = resolved.status().message();
    return "";
  }
  return numericHost(resolved.value().front());
}

// Binds (or, with `connect_instead`, connects within 2 s to) host:port; nullopt on success.
std::optional<std::string> tryEndpoint(const std::string& host, int port, bool connect_instead) {
  auto resolved =
      resolveTcp(host, port, connect_instead ? ResolveFor::kConnect : ResolveFor::kBind);
  if (!resolved.isOk()) return resolved.status().message();
  std::optional<std::string> error = std::string("no address");
  for (auto a = resolved.value().begin(); a != resolved.value().end() && error; ++a) {
    const int fd = ::socket(a->family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
      error = std::strerror(errno);
      continue;
    }
    if (!connect_instead) {
      const int one = 1;
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (::bind(fd, a->sockaddrPtr(), a->length) == 0) {
        error.reset();
      } else {
        error = std::strerror(errno);
      }
    } else if (::connect(fd, a->sockaddrPtr(), a->length) == 0) {
      error.reset();
    } else if (errno != EINPROGRESS) {
      error = std::strerror(errno);
    } else {
      pollfd p = {fd, POLLOUT, 0};
      if (::poll(&p, 1, 2000) != 1) {
        error = "no answer within 2 s";
      } else {
        int so_error = 0;
        socklen_t len = sizeof so_error;
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len);
        if (so_error == 0) {
          error.reset();
        } else {
          error = std::strerror(so_error);
        }
      }
    }
    ::close(fd);
  }
  return error;
}

void probeNuma(SystemFacts& f) {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  const bool have_mask = ::sched_getaffinity(0, sizeof mask, &mask) == 0;
  DIR* dir = ::opendir("/sys/devices/system/node");
  if (dir != nullptr) {
    while (dirent* e = ::readdir(dir)) {
      const std::string name = e->d_name;
      if (!startsWith(name, "node") || name.size() == 4 ||
          name.find_first_not_of("0123456789", 4) != std::string::npos) {
        continue;
      }
      NumaNode node;
      node.id = std::atoi(name.c_str() + 4);
      // A cpulist the kernel wrote is well formed; one that is not counts as no CPUs.
      auto cpus = CpuList::parse(readFirstLine("/sys/devices/system/node/" + name + "/cpulist"));
      for (int cpu : cpus.isOk() ? cpus.value().cpus() : std::vector<int>()) {
        if (!have_mask || (cpu < CPU_SETSIZE && CPU_ISSET(cpu, &mask))) node.cpus.push_back(cpu);
      }
      f.numa.push_back(node);
    }
    ::closedir(dir);
  }
  std::sort(f.numa.begin(), f.numa.end(),
            [](const NumaNode& a, const NumaNode& b) { return a.id < b.id; });
  if (f.numa.empty() && have_mask) {  // no NUMA information: one node with the usable CPUs
    NumaNode node;
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (CPU_ISSET(cpu, &mask)) node.cpus.push_back(cpu);
    }
    f.numa.push_back(node);
  }
}

std::string findOnPath(const std::string& program, const std::map<std::string, std::string>& env) {
  return findExecutable(program, envOr(env, "PATH", ""));
}

void probeProgram(const LaunchConfig& config, const std::map<std::string, std::string>& env,
                  SystemFacts& f) {
  if (config.entrypoint.empty()) return;
  const std::vector<std::string> argv = workerCommand(config, env, 0);
  f.program_path = findOnPath(argv.front(), env);
  if (f.program_path.empty()) {
    f.program_error = argv.front() + " is not an executable file" +
                      (argv.front().find('/') == std::string::npos ? " on PATH" : "");
    return;
  }
  const bool python_script = argv.front() != config.entrypoint && !config.module;
  if (python_script && ::access(config.entrypoint.c_str(), R_OK) != 0) {
    f.program_error =
        "the script " + config.entrypoint + " cannot be read: " + std::strerror(errno);
  }
}

// ---- checks -------------------------------------------------------------------------------

struct Findings {
  PreflightReport report;
  void ok(const std::string& topic, const std::string& text) { add(CheckLevel::kOk, topic, text); }
  void warn(const std::string& topic, const std::string& text) {
    add(CheckLevel::kWarn, topic, text);
  }
  void fail(const std::string& topic, const std::string& text) {
    add(CheckLevel::kFail, topic, text);
  }
  void add(CheckLevel level, const std::string& topic, const std::string& text) {
    report.findings.push_back({level, topic, text});
  }
};

std::optional<NetworkInterface> findInterface(const std::vector<NetworkInterface>& ifaces,
                                              const std::string& name, bool ipv6) {
  for (const auto& i : ifaces) {
    if (i.name == name && i.ipv6 == ipv6) return i;
  }
  for (const auto& i : ifaces) {
    if (i.name == name) return i;
  }
  return std::nullopt;
}

void checkNetwork(const RendezvousSettings& rdzv, const std::map<std::string, std::string>& env,
                  const SystemFacts& f, Findings& out) {
  std::string list;
  for (const auto& i : f.interfaces) {
    if (!list.empty()) list += ", ";
    list += i.name + " " + i.address + (i.up ? "" : " (down)");
  }
  out.ok("interfaces", list.empty() ? "none" : list);
  const bool multi = rdzv.multi_node;

  // NCCL.
  const std::string nccl_ifname = envOr(env, "NCCL_SOCKET_IFNAME");
  auto nccl = ncclSocketInterface(f.interfaces, env);
  const std::string nccl_rule =
      nccl_ifname.empty() ? "NCCL_SOCKET_IFNAME unset: NCCL's default order (ib*, then any but "
                            "docker* and lo, then docker*, then lo)"
                          : "NCCL_SOCKET_IFNAME=" + clipValue(nccl_ifname);
  if (!nccl) {
    out.fail("NCCL socket", "no interface matches (" + nccl_rule + "); NCCL cannot bootstrap");
  } else if (multi && nccl->loopback) {
    out.fail("NCCL socket", "would use " + describe(*nccl) + " (" + nccl_rule +
                                "): other nodes cannot reach a loopback address; set "
                                "NCCL_SOCKET_IFNAME to the interface between the nodes");
  } else {
    out.ok("NCCL socket", "would use " + describe(*nccl) + " (" + nccl_rule + ")");
  }

  // gloo (torch's ProcessGroupGloo and cpprun-mnist's communicator when told).
  const std::string gloo_ifname = envOr(env, "GLOO_SOCKET_IFNAME");
  if (!gloo_ifname.empty()) {
    for (const std::string& name : splitComma(gloo_ifname)) {
      auto iface = findInterface(f.interfaces, name, false);
      if (!iface) {
        out.fail("gloo socket", "GLOO_SOCKET_IFNAME names " + clipValue(name) +
                                    ", which this node does not have; torch's gloo fails to "
                                    "create its device");
      } else if (!iface->up) {
        out.fail("gloo socket", "GLOO_SOCKET_IFNAME names " + clipValue(name) + ", which is down");
      } else if (multi && iface->loopback) {
        out.fail("gloo socket", "GLOO_SOCKET_IFNAME names " + describe(*iface) +
                                    ": loopback, other nodes cannot reach it");
      } else {
        out.ok("gloo socket", "would use " + describe(*iface) + " (GLOO_SOCKET_IFNAME)");
      }
    }
  } else if (f.hostname_address.empty()) {
    out.warn("gloo socket",
             "GLOO_SOCKET_IFNAME unset and the host name " + f.hostname +
                 " does not resolve: torch's gloo falls back to loopback" +
                 (multi ? ", which other nodes cannot reach; set GLOO_SOCKET_IFNAME" : ""));
  } else {
    const bool loopback = startsWith(f.hostname_address, "127.") || f.hostname_address == "::1";
    const std::string text =
        "GLOO_SOCKET_IFNAME unset: torch's gloo binds the address the host "
        "name " +
        f.hostname + " resolves to, " + f.hostname_address;
    if (multi && loopback) {
      out.fail("gloo socket", text +
                                  ", a loopback address other nodes cannot reach; set "
                                  "GLOO_SOCKET_IFNAME (or fix /etc/hosts)");
    } else {
      out.ok("gloo socket", text);
    }
  }
}

void checkRendezvous(const RendezvousSettings& rdzv, const SystemFacts& f, Findings& out) {
  const std::string where = formatHostPort(rdzv.store.host, rdzv.store.port);
  if (!f.endpoint_resolve_error.empty()) {
    out.fail("rendezvous", rdzv.store.host + " does not resolve (" + f.endpoint_resolve_error +
                               "): no node can reach the store");
    return;
  }
  const std::string resolved = f.endpoint_address.empty() || f.endpoint_address == rdzv.store.host
                                   ? ""
                                   : " (" + f.endpoint_address + ")";
  if (servesStore(rdzv)) {
    if (rdzv.store.port == 0) {
      out.ok("rendezvous", "this node serves the store on " + rdzv.store.host +
                               "; a free port is picked at start (MASTER_PORT)");
    } else if (f.endpoint_bind_error) {
      const std::string bind_where = formatHostPort(
          rdzv.bind_host.empty() ? rdzv.store.host : rdzv.bind_host, rdzv.store.port);
      out.fail("rendezvous", "this node serves the store, but " + bind_where +
                                 " cannot be bound: " + *f.endpoint_bind_error +
                                 " (another job on this port? pick another --master-port)");
    } else {
      out.ok("rendezvous", "this node serves the store on " + where + resolved + ": port free");
    }
  } else if (f.endpoint_connect_error) {
    out.warn("rendezvous", "the store at " + where + resolved +
                               " is not reachable now: " + *f.endpoint_connect_error +
                               " (fine before node 0 starts: the agents wait up to join_timeout "
                               "for it; otherwise a firewall or a wrong --master-addr)");
  } else {
    out.ok("rendezvous", "the store at " + where + resolved + " is reachable");
  }
}

}  // namespace

int PreflightReport::failures() const {
  return static_cast<int>(std::count_if(findings.begin(), findings.end(), [](const auto& f) {
    return f.level == CheckLevel::kFail;
  }));
}

int PreflightReport::warnings() const {
  return static_cast<int>(std::count_if(findings.begin(), findings.end(), [](const auto& f) {
    return f.level == CheckLevel::kWarn;
  }));
}

std::string PreflightReport::format(const std::string& title) const {
  std::ostringstream out;
  out << title << "\n";
  for (const auto& f : findings) {
    const char* tag = f.level == CheckLevel::kOk     ? "[ ok ]"
                      : f.level == CheckLevel::kWarn ? "[warn]"
                                                     : "[FAIL]";
    out << "  " << tag << " " << f.topic
        << std::string(f.topic.size() < 13 ? 13 - f.topic.size() : 1, ' ') << f.text << "\n";
  }
  if (failures() > 0) {
    out << "result: " << failures() << " problem(s) would break this job";
  } else {
    out << "result: ok";
  }
  if (warnings() > 0) out << " (" << warnings() << " warning(s))";
  out << "\n";
  return out.str();
}

std::optional<NetworkInterface> ncclSocketInterface(const std::vector<NetworkInterface>& ifaces,
                                                    const std::map<std::string, std::string>& env) {
  const bool want_ipv6 = envOr(env, "NCCL_SOCKET_FAMILY") == "AF_INET6";
  const bool ipv4_only = envOr(env, "NCCL_SOCKET_FAMILY") == "AF_INET";
  auto pick = [&](auto matches) -> std::optional<NetworkInterface> {
    // NCCL walks the interfaces in order, preferring the requested (or IPv4) family.
    for (int pass = 0; pass < 2; ++pass) {
      for (const auto& i : ifaces) {
        if (!i.up || !matches(i)) continue;
        if (ipv4_only && i.ipv6) continue;
        if ((pass == 0) == (i.ipv6 == want_ipv6)) return i;
      }
    }
    return std::nullopt;
  };
  const std::string spec = envOr(env, "NCCL_SOCKET_IFNAME");
  if (!spec.empty()) {
    std::string list = spec;
    const bool exclude = list[0] == '^';
    if (exclude) list.erase(0, 1);
    const bool exact = !list.empty() && list[0] == '=';
    if (exact) list.erase(0, 1);
    const std::vector<std::string> names = splitComma(list);
    return pick([&](const NetworkInterface& i) {
      bool hit = false;
      for (const auto& n : names) hit = hit || (exact ? i.name == n : startsWith(i.name, n));
      return exclude ? !hit : hit;
    });
  }
  if (auto ib = pick([](const NetworkInterface& i) { return startsWith(i.name, "ib"); })) return ib;
  if (auto any = pick([](const NetworkInterface& i) {
        return !startsWith(i.name, "docker") && !startsWith(i.name, "lo");
      })) {
    return any;
  }
  if (auto docker = pick([](const NetworkInterface& i) { return startsWith(i.name, "docker"); })) {
    return docker;
  }
  return pick([](const NetworkInterface& i) { return startsWith(i.name, "lo"); });
}

uint64_t workerOpenFilesNeeded(int world_size) {
  // gloo and NCCL open a socket per peer per communicator (two communicators: torch's default
  // group and one more), plus a reserve for libraries, data files and CUDA.
  return 2 * static_cast<uint64_t>(world_size) + 256;
}

uint64_t agentOpenFilesNeeded(int world_size, int nproc, bool serves_store) {
  // The store: every worker connects (torch opens up to two clients), and the agent keeps three
  // pipes and a pidfd-free process per worker, plus a reserve.
  return (serves_store ? 2 * static_cast<uint64_t>(world_size) : 0) +
         3 * static_cast<uint64_t>(nproc) + 64;
}

bool servesStore(const RendezvousSettings& rdzv) {
  if (!rdzv.multi_node) return true;
  if (!rdzv.elastic) return rdzv.node_rank == 0;
  switch (rdzv.store_hosting) {
    case RendezvousSettings::StoreHosting::kAlways:
      return true;
    case RendezvousSettings::StoreHosting::kNever:
      return false;
    case RendezvousSettings::StoreHosting::kAuto:
      return isLocalHost(rdzv.store.host);
  }
  return false;
}

std::vector<NetworkInterface> networkInterfaces() {
  SystemFacts f;
  probeInterfaces(f);
  return f.interfaces;
}

SystemFacts probeSystem(const LaunchConfig& config, const RendezvousSettings& rdzv,
                        const std::map<std::string, std::string>& env) {
  SystemFacts f;
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) == 0) f.hostname = host;
  probeCuda(f);
  f.nccl_library = agent::ncclLibrary(env);
  probeNccl(f, f.nccl_library);
  probeInterfaces(f);
  f.hostname_address = resolveFirst(f.hostname, nullptr);
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0) {
    f.open_file_soft_limit = limit.rlim_cur;
    f.open_file_hard_limit = limit.rlim_max;
  }
  probeNuma(f);
  f.endpoint_address = resolveFirst(rdzv.store.host, &f.endpoint_resolve_error);
  if (f.endpoint_resolve_error.empty()) {
    f.endpoint_is_local = isLocalHost(rdzv.store.host);
    if (servesStore(rdzv)) {
      if (rdzv.store.port != 0) {
        f.endpoint_bind_error = tryEndpoint(
            rdzv.bind_host.empty() ? rdzv.store.host : rdzv.bind_host, rdzv.store.port, false);
      }
    } else {
      f.endpoint_connect_error = tryEndpoint(rdzv.store.host, rdzv.store.port, true);
    }
  }
  probeProgram(config, env, f);
  f.gdb_path = findExecutable("gdb", envOr(env, "PATH", ""));
  if (config.metrics_port > 0) {
    const auto error = tryEndpoint(config.metrics_host, config.metrics_port, false);
    f.metrics_bind_error = error ? *error : std::string();
  }
  if (!config.event_log.empty()) {
    // Opened for appending, as the agent will, and left as it was (created only if missing,
    // then removed again when it was).
    const bool existed = ::access(config.event_log.c_str(), F_OK) == 0;
    const int fd =
        ::open(config.event_log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
      f.event_log_error = std::strerror(errno);
    } else {
      ::close(fd);
      if (!existed) ::unlink(config.event_log.c_str());
      f.event_log_error = std::string();
    }
  }
  return f;
}

namespace {

// The program the workers run, as they will run it.
void checkProgram(const LaunchConfig& config, const std::map<std::string, std::string>& env,
                  const SystemFacts& f, Findings& out) {
  if (config.entrypoint.empty()) {
    out.ok("program", "none given (only the node is checked)");
  } else if (!f.program_error.empty()) {
    out.fail("program", f.program_error);
  } else {
    std::string cmd;
    for (const auto& a : workerCommand(config, env, 0)) cmd += (cmd.empty() ? "" : " ") + a;
    out.ok("program", cmd + " (" + f.program_path + ")");
  }
}

// The CUDA driver and the GPUs the workers are given.
void checkGpus(const NodeResources& node, int nproc, const SystemFacts& f, Findings& out) {
  std::string gpus_text =
      std::to_string(node.gpus.size()) + " visible to the workers (from " + node.gpu_source + ")";
  if (f.cuda_error.empty()) {
    std::string names;
    for (size_t i = 0; i < f.gpu_names.size(); ++i) {
      names += (i ? "; " : "") + std::to_string(i) + ": " + f.gpu_names[i];
      std::string where;
      if (i < f.gpu_bus_ids.size() && !f.gpu_bus_ids[i].empty()) where = f.gpu_bus_ids[i];
      if (i < f.gpu_numa_nodes.size() && f.gpu_numa_nodes[i] >= 0) {
        where += (where.empty() ? "" : ", ") + std::string("NUMA ") +
                 std::to_string(f.gpu_numa_nodes[i]);
      }
      if (!where.empty()) names += " (" + where + ")";
    }
    out.ok("CUDA driver", cudaVersionText(f.cuda_driver_version) + ", " +
                              std::to_string(f.gpu_names.size()) + " device(s)" +
                              (names.empty() ? "" : ": " + names));
  } else if (f.cuda_installed) {
    // Installed but failing: worth saying even when the job asks for no GPU.
    out.warn("CUDA driver", f.cuda_error);
  }
  if (node.gpus.empty()) {
    out.ok("GPUs", "none: the workers run on CPUs" +
                       (f.cuda_error.empty() ? "" : std::string(" (") + f.cuda_error + ")"));
  } else if (!f.cuda_error.empty()) {
    out.fail("GPUs", gpus_text + ", but the CUDA driver is not usable: " + f.cuda_error);
  } else if (static_cast<int>(node.gpus.size()) > static_cast<int>(f.gpu_names.size())) {
    out.fail("GPUs", gpus_text + ", but the driver sees only " +
                         std::to_string(f.gpu_names.size()) + " device(s)");
  } else if (nproc > static_cast<int>(node.gpus.size())) {
    out.warn("GPUs", gpus_text + " for " + std::to_string(nproc) +
                         " workers: some workers share a GPU (LOCAL_RANK beyond the list)");
  } else {
    out.ok("GPUs", gpus_text + " for " + std::to_string(nproc) + " worker(s)");
  }
}

void checkNccl(const NodeResources& node, const SystemFacts& f, Findings& out) {
  if (f.nccl_error.empty()) {
    out.ok("NCCL", (f.nccl_version ? versionText(f.nccl_version, 10000, 100) : "version unknown") +
                       " (" + f.nccl_library + "): the agent hands the workers an NCCL unique id");
  } else if (!node.gpus.empty()) {
    out.warn("NCCL", f.nccl_error +
                         ": no CPPRUN_NCCL_UNIQUE_ID; torch's own NCCL (in its wheel) still works");
  } else {
    out.ok("NCCL", "not loadable (" + f.nccl_error + "); not needed without GPUs");
  }
}

// Open files: the limit the workers inherit (cpprun raises its soft limit to the hard one).
void checkOpenFiles(const RendezvousSettings& rdzv, int nodes, int nproc, const SystemFacts& f,
                    Findings& out) {
  const int world = nproc * nodes;
  const uint64_t worker_need = workerOpenFilesNeeded(world);
  const uint64_t agent_need = agentOpenFilesNeeded(world, nproc, servesStore(rdzv));
  const uint64_t need = std::max(worker_need, agent_need);
  const std::string limit_text = "limit " + std::to_string(f.open_file_soft_limit) + " (hard " +
                                 std::to_string(f.open_file_hard_limit) + ")";
  const std::string need_text = "about " + std::to_string(need) + " needed for world size " +
                                std::to_string(world) + " (" + std::to_string(nodes) +
                                " node(s) × " + std::to_string(nproc) + ")";
  if (f.open_file_soft_limit < need) {
    out.fail("open files", limit_text + " < " + need_text +
                               ": raise it (ulimit -n, or the scheduler's limits) before cpprun");
  } else {
    out.ok("open files", limit_text + " >= " + need_text);
  }
}

// Operations: stall stacks, the metrics endpoint, the event log.
void checkOperations(const LaunchConfig& config, const SystemFacts& f, Findings& out) {
  if (config.stall_timeout > 0) {
    if (f.gdb_path.empty()) {
      out.warn("stall stacks",
               "gdb is not on PATH: a stalled rank's report has only the Python stacks of ranks "
               "that use examples/python/cpprun_progress.py (install gdb for native stacks)");
    } else {
      out.ok("stall stacks", "gdb " + f.gdb_path +
                                 " for native stacks (it needs ptrace: the same user, or "
                                 "CAP_SYS_PTRACE in a container); Python stacks by faulthandler");
    }
  }
  if (f.metrics_bind_error) {
    const std::string where = formatHostPort(config.metrics_host, config.metrics_port);
    if (f.metrics_bind_error->empty()) {
      out.ok("metrics", where + " is free for --metrics-port");
    } else {
      out.fail("metrics", where + " cannot be bound: " + *f.metrics_bind_error);
    }
  }
  if (f.event_log_error) {
    if (f.event_log_error->empty()) {
      out.ok("event log", config.event_log + " can be appended to");
    } else {
      out.fail("event log", config.event_log + " cannot be opened: " + *f.event_log_error);
    }
  }
}

// CPUs and NUMA.
void checkCpus(const LaunchConfig& config, const NodeResources& node, int nproc,
               const std::map<std::string, std::string>& env, const SystemFacts& f, Findings& out) {
  std::string layout;
  for (const auto& n : f.numa) {
    layout += (layout.empty() ? "" : "; ") + std::string("NUMA ") + std::to_string(n.id) +
              ": CPUs " + (n.cpus.empty() ? "none" : CpuList(n.cpus).toString());
  }
  const std::string omp = envOr(env, "OMP_NUM_THREADS");
  const std::string threads =
      omp.empty() ? "OMP_NUM_THREADS=" +
                        std::to_string(std::max(1, node.usable_cpus / std::max(1, nproc))) +
                        " each (set by cpprun)"
                  : "OMP_NUM_THREADS=" + clipValue(omp) + " each (inherited)";
  const std::string cpu_text =
      std::to_string(node.usable_cpus) + " usable (" +
      (layout.empty() ? "no NUMA information" : layout) + "); " + std::to_string(nproc) +
      " worker(s), " + threads +
      (config.numa_binding.empty()
           ? "; cpprun does not bind workers to CPUs (--numa-binding)"
           : "; --numa-binding=" + config.numa_binding + " binds them (below)");
  if (nproc > node.usable_cpus) {
    out.warn("CPUs", cpu_text + ": more workers than CPUs, they will compete");
  } else {
    out.ok("CPUs", cpu_text);
  }
}

}  // namespace

PreflightReport runPreflight(const LaunchConfig& config, const RendezvousSettings& rdzv,
                             const NodeResources& node, int nproc,
                             const std::map<std::string, std::string>& env, const SystemFacts& f) {
  Findings out;
  const int nodes = rdzv.multi_node ? config.max_nodes : 1;
  checkProgram(config, env, f, out);
  checkGpus(node, nproc, f, out);
  checkNccl(node, f, out);
  checkNetwork(rdzv, env, f, out);
  checkRendezvous(rdzv, f, out);
  checkOpenFiles(rdzv, nodes, nproc, f, out);
  checkOperations(config, f, out);
  checkCpus(config, node, nproc, env, f, out);
  return out.report;
}

}  // namespace cpprun::launcher
