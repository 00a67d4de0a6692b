// Worker output: where each line a worker writes goes, and the reader that takes it there.
//
// Every worker's stdout and stderr are pipes read by the agent's event loop. A line reaches
// the console whole — one write per batch of complete lines, each line prefixed (default
// "[default3]:" as torchrun's tee prints, with the global rank) — so lines of different
// workers never interleave mid-line. With -r/--redirects a stream goes only to its log file;
// with -t/--tee to both; --local-ranks-filter keeps other ranks off the console (files keep
// everything). Files receive the bytes exactly as written, unprefixed. The last lines of
// stderr are kept for the failure report. A line longer than max_line_bytes is cut into
// pieces so one runaway line cannot grow the agent without bound.
//
// Thread safety: a WorkerOutput lives on the agent's loop thread; LineSplitter and
// planWorkerOutput are plain values/pure functions.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace boost::asio {
class io_context;
}

namespace cpprun::agent {

// Splits a byte stream into lines (without their '\n').
class LineSplitter {
 public:
  explicit LineSplitter(size_t max_line_bytes = 64 * 1024) : max_line_bytes_(max_line_bytes) {}
  // Calls on_line for every line completed by `data`.
  void feed(std::string_view data, const std::function<void(std::string_view)>& on_line);
  // At end of stream: the unterminated rest, if any, as a last line.
  void finish(const std::function<void(std::string_view)>& on_line);

 private:
  size_t max_line_bytes_;
  std::string partial_;
};

// The console/file policy, as the command line gave it.
struct OutputOptions {
  // ${role_name}, ${rank}, ${local_rank} and ${hostname} (this node's short host name, as
  // torchrun 2.15) are substituted. --log-line-prefix-template or
  // TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE overrides it (the launcher reads them).
  std::string prefix_template = "[${role_name}${rank}]:";
  std::string role_name = "default";
  // Per local rank: 0 none, 1 stdout, 2 stderr, 3 both. `*_default` covers unlisted ranks.
  int redirects_default = 0;
  std::map<int, int> redirects_by_rank;
  int tee_default = 0;
  std::map<int, int> tee_by_rank;
  std::vector<int> local_ranks_filter;  // empty: every rank reaches the console
  size_t stderr_tail_lines = 20;
  int console_stdout_fd = 1;
  int console_stderr_fd = 2;
};

// Where one stream of one worker goes.
struct StreamRoute {
  bool to_console = true;
  int console_fd = 1;
  std::string prefix;
  std::string file;  // empty: no file
};

struct WorkerOutputPlan {
  StreamRoute out;
  StreamRoute err;
  bool needs_files() const { return !out.file.empty() || !err.file.empty(); }
};

// `rank_dir` is <attempt dir>/<local_rank>; empty when there is no log directory, in which
// case redirected streams have nowhere to go and the caller must have created one.
WorkerOutputPlan planWorkerOutput(const OutputOptions& options, int local_rank, int rank,
                                  const std::string& rank_dir);

// True when some local rank's stream goes to a file (a log directory is needed).
bool anyRedirect(const OutputOptions& options);

// Reads one pipe until EOF and routes what it reads. Construct, then start().
class WorkerOutput {
 public:
  // Takes ownership of `read_fd`. Opens the route's file (create/truncate) now.
  static Result<std::unique_ptr<WorkerOutput>> create(boost::asio::io_context& io, int read_fd,
                                                      StreamRoute route, size_t tail_lines,
                                                      std::function<void()> on_eof);
  ~WorkerOutput();
  WorkerOutput(const WorkerOutput&) = delete;
  WorkerOutput& operator=(const WorkerOutput&) = delete;

  void start();
  // Stops reading (at the drain bound): what is buffered is flushed, the rest is dropped.
  void close();
  bool atEof() const;
  // The last lines read, oldest first.
  std::vector<std::string> tail() const;
  uint64_t bytesRead() const;

  struct Impl;

 private:
  explicit WorkerOutput(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace cpprun::agent
