// Small process-wide settings that servers and benchmarks need.
// Thread safety: call from the main thread at start-up.
#pragma once

#include <cstdint>

namespace cpprun {

// Raises the soft open-file limit to the hard limit, so one process can hold thousands of
// connections. Returns the soft limit now in force.
uint64_t raiseOpenFileLimit();

}  // namespace cpprun
