// Hosts for multi-host tests on one machine (reference/platform.md §8): N network namespaces,
// each with eth0 = <subnet>.i/24, joined by a bridge in a switch namespace of their own. A test
// runs a program "on host i" inside namespace i, and can cut host i off the network for real
// and reconnect it.
//
// Safety: the constructor first adds `ip route add unreachable <subnet>.0/24` in the root
// namespace, so nothing in the root namespace can reach the test subnet (its default route
// leads off the machine); every process that talks to a host address must run inside a host.
// The destructor deletes the namespaces (their veths go with them) and then the route.
//
// Names and the subnet derive from the test process's pid, so concurrent test processes never
// share them; one process may hold one NetnsHosts at a time (a second one throws).
//
// The cut: cutOff(i) sets host i's veth on the bridge down, in the switch namespace. Packets to
// and from host i then vanish; its own eth0, address and routes stay as they were, so its
// programs see no error, only silence: an established TCP connection stalls (retransmits) and a
// new connect times out. Measured here: a byte sent on an established connection after the cut
// is never delivered (a 3 s read on the other end timed out). `tc qdisc ... netem loss 100%`
// would do the same but this kernel has no netem ("qdisc kind is unknown"). reconnect(i) sets
// the veth up again; the kernel's retransmissions then deliver what was queued.
//
// Errors: the constructor and cutOff/reconnect throw std::runtime_error naming the `ip` command
// and its output when one fails (the constructor removes what it had made first).
//
// Thread safety: none; one test thread owns it. The const accessors may be called from any
// thread.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace cpprun::testing {

class NetnsHosts {
 public:
  // REQUIRES: 1 <= count <= 200.
  explicit NetnsHosts(int count = 3);
  ~NetnsHosts();
  NetnsHosts(const NetnsHosts&) = delete;
  NetnsHosts& operator=(const NetnsHosts&) = delete;

  int count() const { return count_; }
  // Host i is 1-based (1..count()).
  std::string host(int i) const;                  // the namespace's name
  std::string address(int i) const;               // "<subnet>.i"
  std::string netnsPath(int i) const;             // "/run/netns/<name>", for setns(2)
  std::string subnet() const { return subnet_; }  // "10.X.Y" (the /24 without ".0")

  // argv prefixed with `ip netns exec <host(i)>`: for ChildProcess. `ip netns exec` execs argv
  // in place, so the child's pid is the program's.
  std::vector<std::string> onHost(int i, const std::vector<std::string>& argv) const;
  // Runs a short command on host i to its end (bounded: killed after `bound`); returns its exit
  // code (-1 if it had to be killed) and its output in *output if given.
  int runOnHost(int i, const std::vector<std::string>& argv, std::string* output = nullptr,
                std::chrono::milliseconds bound = std::chrono::milliseconds(30000)) const;

  void cutOff(int i);     // host i's link on the bridge down: silence, no error
  void reconnect(int i);  // and up again
  bool isCutOff(int i) const;

 private:
  void ip(std::vector<std::string> args) const;
  std::string sw() const { return prefix_ + "sw"; }
  std::string veth(int i) const { return prefix_ + "v" + std::to_string(i); }
  void check(int i) const;
  void removeAll();

  int count_ = 0;
  std::string prefix_;
  std::string subnet_;
  bool guarded_ = false;
  int made_ = 0;  // host namespaces created so far
  bool switch_made_ = false;
  std::vector<bool> cut_;
};

}  // namespace cpprun::testing
