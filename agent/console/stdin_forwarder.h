// StdinForwarder: cpprun's stdin, given to the workers that should read it (--stdin): global
// rank 0 (the default, as mpirun does), every worker, or none; every other worker's stdin is
// /dev/null. Multi-node: the node holding global rank 0 forwards, the others give /dev/null.
//
// What a worker's stdin is, by what cpprun's stdin is:
//   a terminal, the worker's stdout a pty   the worker's stdout pty (isatty(stdin) true); cpprun
//                                           forwards keystrokes to its master, with its own
//                                           terminal in TerminalModes (no echo, no line editing,
//                                           ISIG kept) while it is the foreground job
//   a terminal, no worker pty               a pipe; cpprun's terminal edits and echoes lines
//   a pipe, FIFO, socket                    a pipe cpprun copies into
//   a regular file, /dev/null, other        the descriptor itself (rank 0; with `all` each
//                                           worker opens it anew at cpprun's offset)
//   closed                                  /dev/null
// cpprun's stdin is read only by this object, on the agent's loop, through a descriptor of its
// own (non-blocking, so the caller's open file is left as it was), and a terminal only while
// cpprun is its foreground job: a background cpprun never reads it nor changes its modes, and
// starts doing so when it is continued in the foreground (onContinue, SIGCONT). Writes to the
// workers are non-blocking; each worker has at most kStdinBufferBytes waiting, and cpprun's stdin
// is not read while one is full, so a worker that never reads blocks nothing but its input.
// EOF on cpprun's stdin closes a pipe, and sends the terminal's end-of-file character (VEOF) to a
// pty. A worker's input that was read but not yet written when its attempt ended is dropped; the
// next attempt's worker gets what cpprun reads from then on (or EOF at once after EOF).
//
// Thread safety: the agent's loop thread only.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <memory>

#include "common/status.h"

namespace boost::asio {
class io_context;
}

namespace cpprun::agent {

enum class StdinMode { kNone, kRank0, kAll };

// Per worker: input read from cpprun's stdin and not yet taken by the worker.
inline constexpr size_t kStdinBufferBytes = 64 * 1024;

class StdinForwarder {
 public:
  // `source_fd` (cpprun's stdin, 0) is not taken: the forwarder reads a descriptor of its own.
  StdinForwarder(boost::asio::io_context& io, StdinMode mode, int source_fd = 0);
  ~StdinForwarder();
  StdinForwarder(const StdinForwarder&) = delete;
  StdinForwarder& operator=(const StdinForwarder&) = delete;

  // True when the worker of global rank `rank` gets cpprun's stdin.
  bool wants(int rank) const;
  // True when cpprun's stdin is a terminal: a worker with a stdout pty then reads that pty.
  bool sourceIsTerminal() const;
  // For a worker that gets stdin through a descriptor (no pty): the descriptor to give it (the
  // caller closes it after spawning), or an error (the caller gives /dev/null and says why).
  Result<int> descriptorForWorker();
  // For a worker whose stdin is its stdout pty: forward to this master (duplicated here).
  // `echo` false: the pty does not echo (every worker but rank 0 with --stdin all, so typed
  // text shows once).
  void addTerminal(int master_fd, bool echo);
  // The attempt's workers are gone: their input is dropped, their descriptors closed.
  void clearWorkers();
  // SIGCONT: cpprun may be the foreground job again.
  void onContinue();
  // Restores the terminal's modes and stops reading (the job's end).
  void stop();

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace cpprun::agent
