// The worker variables whose values torchrun 2.15 and cpprun may give differently, by name: one
// list that the differential test (torchrun_diff_test.cc, which says how each may differ) and the
// documentation check (torchrun_claims_test.cc, which holds docs/torchrun-compatibility.md's
// environment table to it) share, so the table and the test cannot drift apart.
// Thread safety: constants.
#pragma once

#include <set>
#include <string>

namespace cpprun::testing {

// Variables allowedBecause() lets differ after normalising (each with its reason there).
inline const std::set<std::string>& envDifferencesAllowed() {
  static const std::set<std::string> names = {
      "NCCL_ASYNC_ERROR_HANDLING", "CPPRUN_PROGRESS_FILE",    "CPPRUN_STACK_FILE",
      "CPPRUN_NCCL_UNIQUE_ID",     "CPPRUN_NCCL_UNIQUE_IDS",  "OMP_NUM_THREADS",
      "CUDA_VISIBLE_DEVICES",      "TORCHELASTIC_TIMER_FILE", "CPPRUN_COLLECTIVE_FILE"};
  return names;
}

// Variables whose values differ on purpose but name the same thing, so the test normalises them
// before comparing (normalise() there).
inline const std::set<std::string>& envDifferencesNormalised() {
  static const std::set<std::string> names = {"MASTER_ADDR"};
  return names;
}

}  // namespace cpprun::testing
