// The benchmarks' numeric flags: parseUnsigned (common/command_line.h) with the benchmark's own
// usage() on a bad value, so each benchmark exits 2 naming the flag and the text.
#pragma once

#include <cstdint>
#include <string>

#include "common/command_line.h"

namespace cpprun::bench {

// A numeric flag's value in [min, max], or usage(why) — which must not return — naming the flag
// and the text.
template <typename Usage>
int unsignedFlag(Usage&& usage, const std::string& flag, const std::string& text, uint64_t min,
                 uint64_t max) {
  Result<uint64_t> n = parseUnsigned(flag, text, min, max);
  if (!n.isOk()) usage(n.status().message());
  return static_cast<int>(n.value());
}

}  // namespace cpprun::bench
