// Small process-wide settings that servers and benchmarks need.
// Thread safety: call from the main thread at start-up.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace cpprun {

// Raises the soft open-file limit to the hard limit, so one process can hold thousands of
// connections. Returns the soft limit now in force.
uint64_t raiseOpenFileLimit();

// A TCP port on 127.0.0.1 that nothing listens on right now, or -1 when none can be found.
// Racy by nature (someone may take it before the caller binds it): for tests, benchmarks and
// --worker-hosts-store, which hands the port to a worker that binds it.
int pickFreeTcpPort();

}  // namespace cpprun

namespace cpprun {

// What `program` runs as: itself when it holds a '/' and is executable, else the first
// executable file of that name in the directories of `path` (a PATH value; empty:
// /usr/local/bin:/usr/bin:/bin). "" when there is none.
std::string findExecutable(const std::string& program, const std::string& path);

// The whole content of the file at `path`. An error (kNotFound when it does not exist, else
// kUnavailable) names the path, the call and errno: "open /x: No such file or directory".
Result<std::string> readFile(const std::string& path);

// Writes `text` to `path` whole: into `path`.tmp, renamed over `path`, so a process that opens
// it meanwhile reads the old content or the new, never part of one. Unchanged content is left
// as it is (the file keeps its modification time). An error names the path and the call.
Status writeFileWhole(const std::string& path, const std::string& text);

}  // namespace cpprun
