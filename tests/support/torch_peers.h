// The real PyTorch installations the tests run against, and a check that each is there.
//
//   * torch 1.13: Debian's python3-torch, run as /usr/bin/python3 (CPPRUN_PYTHON);
//   * torch 2.x: the venv packaging/setup.sh makes from PyPI (CPPRUN_TORCH2_PYTHON), at exactly
//     the version packaging/torch2-requirements.txt pins (CPPRUN_TORCH2_VERSION).
//
// A test that needs a peer calls requireTorchPeer() first: when the interpreter is missing,
// cannot import torch with torch.distributed and gloo, or holds another version, the test FAILS
// (it does not skip) and says how to install the peer. The set-up script installs both, so CI
// always has them.
// Thread safety: torchPeerProblem() caches its probe in a function-local static per peer; call it
// from the test's thread.
#pragma once

#include <string>

namespace cpprun::testing {

struct TorchPeer {
  const char* python;          // interpreter that imports this torch
  const char* version_prefix;  // torch.__version__ must start with this
  const char* how_to_install;  // told to the user when the peer is missing
};

const TorchPeer& torch113();
const TorchPeer& torch2();

// Empty when `peer` is usable; otherwise what is wrong. Probed once per peer and test binary.
std::string torchPeerProblem(const TorchPeer& peer);

// REQUIREs that `peer` is usable, with the problem as the failure message.
void requireTorchPeer(const TorchPeer& peer);

}  // namespace cpprun::testing
