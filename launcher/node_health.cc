#include "launcher/node_health.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "common/environment.h"
#include "launcher/cuda_driver.h"
#include "launcher/preflight.h"

namespace cpprun::launcher {

std::vector<std::string> checkNodeNetwork(const std::vector<NetworkInterface>& interfaces,
                                          const std::map<std::string, std::string>& env,
                                          bool uses_gpus) {
  std::vector<std::string> problems;
  const std::string nccl_ifname = envOr(env, "NCCL_SOCKET_IFNAME");
  if (uses_gpus || !nccl_ifname.empty()) {
    auto nccl = ncclSocketInterface(interfaces, env);
    if (!nccl) {
      problems.push_back("no interface NCCL would use is up (" +
                         (nccl_ifname.empty() ? std::string("NCCL's default order")
                                              : "NCCL_SOCKET_IFNAME=" + nccl_ifname) +
                         ")");
    } else if (nccl_ifname.empty() && nccl->name.rfind("ib", 0) != 0) {
      // NCCL prefers ib*; with every ib* interface down it quietly falls back to a slower one.
      for (const NetworkInterface& i : interfaces) {
        if (i.name.rfind("ib", 0) == 0) {
          problems.push_back("interface " + i.name + " is down: NCCL would fall back to " +
                             nccl->name);
          break;
        }
      }
    }
  }
  std::istringstream names(envOr(env, "GLOO_SOCKET_IFNAME"));
  std::string name;
  while (std::getline(names, name, ',')) {
    if (name.empty()) continue;
    bool found = false;
    bool up = false;
    for (const NetworkInterface& i : interfaces) {
      if (i.name != name) continue;
      found = true;
      up = up || i.up;
    }
    if (!found) {
      problems.push_back("GLOO_SOCKET_IFNAME names " + name + ", which this node does not have");
    } else if (!up) {
      problems.push_back("GLOO_SOCKET_IFNAME names " + name + ", which is down");
    }
  }
  return problems;
}

std::string checkWritableDirectory(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return "directory " + dir + " cannot be made: " + ec.message();
  std::string path = dir + "/.cpprun-health-XXXXXX";
  const int fd = ::mkstemp(path.data());
  if (fd < 0) return "directory " + dir + " is not writable: " + std::strerror(errno);
  const bool wrote = ::write(fd, "x", 1) == 1;
  const int err = errno;
  ::close(fd);
  ::unlink(path.c_str());
  if (!wrote) return "directory " + dir + " does not take a write: " + std::strerror(err);
  return "";
}

agent::BuiltinHealthCheck makeBuiltinHealthCheck(const LaunchConfig& config,
                                                 const NodeResources& node,
                                                 const std::map<std::string, std::string>& env) {
  std::vector<std::string> dirs;
  if (!config.log_dir.empty()) dirs.push_back(config.log_dir);
  for (const std::string& d : config.health_check_dirs) dirs.push_back(d);
  const size_t gpus = node.gpus.size();
  // No driver installed at all (kNotFound: a CPU job in a container without it, GPUs counted
  // from the scheduler's variables) is how the node was when the job started, not a node gone
  // bad: `--check` reports it. A driver that is installed but fails, or sees fewer GPUs than the
  // job uses, fails the node.
  return [dirs, gpus, env] {
    std::vector<std::string> problems;
    if (gpus > 0) {
      const Result<CudaDriverInfo> driver = queryCudaDriver();
      const bool absent = !driver.isOk() && driver.status().code() == StatusCode::kNotFound;
      if (absent) {
        // nothing to check: see above
      } else if (!driver.isOk()) {
        problems.push_back("the CUDA driver is not usable: " + driver.status().message());
      } else if (driver.value().devices.size() < gpus) {
        problems.push_back("the CUDA driver sees " + std::to_string(driver.value().devices.size()) +
                           " GPU(s), the job uses " + std::to_string(gpus));
      }
    }
    for (std::string& p : checkNodeNetwork(networkInterfaces(), env, gpus > 0)) {
      problems.push_back(std::move(p));
    }
    for (const std::string& dir : dirs) {
      if (std::string p = checkWritableDirectory(dir); !p.empty()) problems.push_back(p);
    }
    return problems;
  };
}

}  // namespace cpprun::launcher
