#include "tests/support/netns_hosts.h"

#include <unistd.h>

#include <atomic>
#include <stdexcept>

#include "tests/support/test_support.h"

namespace cpprun::testing {

namespace {

constexpr const char* kIp = "/usr/sbin/ip";

std::atomic<bool> g_live{false};  // one NetnsHosts per process: names derive from the pid

std::string joined(const std::vector<std::string>& parts) {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : " ") + p;
  return out;
}

int runBounded(const std::vector<std::string>& argv, std::string* output,
               std::chrono::milliseconds bound) {
  ChildProcess p(argv);
  auto status = p.wait(bound);
  if (output != nullptr) *output = p.output();
  return status ? exitCodeOf(*status) : -1;  // ~ChildProcess kills and reaps it if still running
}

}  // namespace

NetnsHosts::NetnsHosts(int count) : count_(count), cut_(static_cast<size_t>(count) + 1, false) {
  if (count < 1 || count > 200) {
    throw std::invalid_argument("NetnsHosts: count must be 1..200, got " + std::to_string(count));
  }
  if (::access(kIp, X_OK) != 0) {
    throw std::runtime_error(std::string("NetnsHosts: ") + kIp + " is missing (iproute2)");
  }
  if (g_live.exchange(true)) {
    throw std::logic_error(
        "NetnsHosts: this process already holds one (names derive from the pid)");
  }
  const int pid = static_cast<int>(::getpid());
  prefix_ = "cpt" + std::to_string(pid % 100000) + "h";
  subnet_ = "10." + std::to_string(200 + (pid >> 8) % 50) + "." + std::to_string(pid % 256);
  try {
    // The guard first: from here on, the root namespace cannot reach the test subnet.
    ip({"route", "add", "unreachable", subnet_ + ".0/24"});
    guarded_ = true;
    ip({"netns", "add", sw()});
    switch_made_ = true;
    ip({"-n", sw(), "link", "add", "br0", "type", "bridge"});
    ip({"-n", sw(), "link", "set", "br0", "up"});
    for (int i = 1; i <= count_; ++i) {
      const std::string h = host(i);
      ip({"netns", "add", h});
      made_ = i;
      ip({"link", "add", veth(i), "type", "veth", "peer", "name", "eth0", "netns", h});
      ip({"link", "set", veth(i), "netns", sw()});
      ip({"-n", sw(), "link", "set", veth(i), "master", "br0", "up"});
      ip({"-n", h, "addr", "add", address(i) + "/24", "dev", "eth0"});
      ip({"-n", h, "link", "set", "eth0", "up"});
      ip({"-n", h, "link", "set", "lo", "up"});
    }
  } catch (...) {
    removeAll();
    throw;
  }
}

NetnsHosts::~NetnsHosts() { removeAll(); }

void NetnsHosts::removeAll() {
  const auto bound = std::chrono::milliseconds(30000);
  for (int i = 1; i <= made_; ++i) runBounded({kIp, "netns", "del", host(i)}, nullptr, bound);
  made_ = 0;
  // The veths go with the switch namespace (or with their host's, whichever goes first).
  if (switch_made_) runBounded({kIp, "netns", "del", sw()}, nullptr, bound);
  switch_made_ = false;
  if (guarded_) {
    runBounded({kIp, "route", "del", "unreachable", subnet_ + ".0/24"}, nullptr, bound);
  }
  guarded_ = false;
  g_live = false;
}

void NetnsHosts::check(int i) const {
  if (i < 1 || i > count_) {
    throw std::out_of_range("NetnsHosts: no host " + std::to_string(i) + " (hosts are 1.." +
                            std::to_string(count_) + ")");
  }
}

std::string NetnsHosts::host(int i) const {
  check(i);
  return prefix_ + std::to_string(i);
}

std::string NetnsHosts::address(int i) const {
  check(i);
  return subnet_ + "." + std::to_string(i);
}

std::string NetnsHosts::netnsPath(int i) const { return "/run/netns/" + host(i); }

std::vector<std::string> NetnsHosts::onHost(int i, const std::vector<std::string>& argv) const {
  std::vector<std::string> out = {kIp, "netns", "exec", host(i)};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

int NetnsHosts::runOnHost(int i, const std::vector<std::string>& argv, std::string* output,
                          std::chrono::milliseconds bound) const {
  return runBounded(onHost(i, argv), output, bound);
}

void NetnsHosts::cutOff(int i) {
  check(i);
  ip({"-n", sw(), "link", "set", veth(i), "down"});
  cut_[static_cast<size_t>(i)] = true;
}

void NetnsHosts::reconnect(int i) {
  check(i);
  ip({"-n", sw(), "link", "set", veth(i), "up"});
  cut_[static_cast<size_t>(i)] = false;
}

bool NetnsHosts::isCutOff(int i) const {
  check(i);
  return cut_[static_cast<size_t>(i)];
}

void NetnsHosts::ip(std::vector<std::string> args) const {
  args.insert(args.begin(), kIp);
  std::string out;
  const int rc = runBounded(args, &out, std::chrono::milliseconds(30000));
  if (rc != 0) {
    throw std::runtime_error("NetnsHosts: `" + joined(args) + "` exited " + std::to_string(rc) +
                             ": " + out);
  }
}

}  // namespace cpprun::testing
