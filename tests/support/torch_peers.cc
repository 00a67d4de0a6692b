#include "tests/support/torch_peers.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <map>
#include <mutex>

#include "tests/support/test_support.h"

namespace cpprun::testing {

const TorchPeer& torch113() {
  static const TorchPeer peer{CPPRUN_PYTHON, "1.13",
                              "Debian's PyTorch 1.13: apt-get install python3-torch"};
  return peer;
}

const TorchPeer& torch2() {
  static const TorchPeer peer{
      CPPRUN_TORCH2_PYTHON, CPPRUN_TORCH2_VERSION,
      "torch " CPPRUN_TORCH2_VERSION
      " from PyPI in the venv packaging/setup.sh makes "
      "(CPPRUN_TORCH2_VENV, default /opt/cpprun/torch2): run packaging/setup.sh"};
  return peer;
}

std::string torchPeerProblem(const TorchPeer& peer) {
  static std::mutex mutex;
  static std::map<std::string, std::string> problems;
  std::lock_guard<std::mutex> lock(mutex);
  auto cached = problems.find(peer.python);
  if (cached != problems.end()) return cached->second;

  const std::string fix = std::string(" (these tests need ") + peer.how_to_install + ")";
  std::string problem;
  if (::access(peer.python, X_OK) != 0) {
    problem = std::string(peer.python) + " does not exist" + fix;
  } else {
    ChildProcess probe({peer.python, "-c",
                        "import torch, torch.distributed as d; "
                        "print('TORCH', torch.__version__, d.is_available(), "
                        "d.is_gloo_available())"},
                       {{"PYTHONUNBUFFERED", "1"}});
    auto line = probe.waitForLine("TORCH ", std::chrono::seconds(90));
    auto status = probe.wait(std::chrono::seconds(30));
    if (!line || !status || exitCodeOf(*status) != 0) {
      problem = std::string(peer.python) + " cannot import torch" + fix + "; it printed:\n" +
                probe.output();
    } else {
      // "TORCH <version> <distributed available> <gloo available>"
      const std::string version = line->substr(6, line->find(' ', 6) - 6);
      if (version.rfind(peer.version_prefix, 0) != 0) {
        problem = std::string(peer.python) + " has torch " + version + ", but these tests " +
                  "expect " + peer.version_prefix + fix;
      } else if (line->find(" True True") == std::string::npos) {
        problem = "torch " + version + " lacks torch.distributed or gloo: " + *line + fix;
      }
    }
  }
  problems[peer.python] = problem;
  return problem;
}

void requireTorchPeer(const TorchPeer& peer) {
  const std::string problem = torchPeerProblem(peer);
  INFO(problem);
  REQUIRE(problem.empty());
}

}  // namespace cpprun::testing
