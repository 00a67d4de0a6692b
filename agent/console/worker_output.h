// Worker output: where each line a worker writes goes, and the reader that takes it there.
//
// Every worker's stdout and stderr are read by the agent's event loop: pipes, or the masters of
// pseudo-terminals when cpprun's own stream is a terminal (worker_terminal.h; EIO from a master
// whose worker side is closed ends the stream like EOF). A line reaches the console whole — one
// write per batch of complete lines, each line prefixed (default "[default3]:" as torchrun's tee
// prints, with the global rank; none with --raw-output) — so lines of different workers never
// interleave mid-line. A line is what a terminal would show of it (LineSplitter: the text after
// its last '\r'); a progress update ('\r', no '\n' yet) reaches the console at most once per
// kProgressUpdateInterval per stream. On a terminal console a stream may leave one line open (a
// prompt, the echo of typed text, a progress update) and continue or rewrite it in place; any
// other writer to that console first ends it with '\n' (OutputSinks::writeConsole), so open
// lines never run into other lines either (docs/supervision.md, "Console"). With -r/--redirects a
// stream goes only to its log file; with -t/--tee to both; --local-ranks-filter keeps other ranks
// off the console (files keep everything). Files receive the bytes exactly as written, unprefixed.
// The last lines of stderr (final states, no '\r' updates) are kept for the failure report, each
// as its first kTailLineBytes and its length ("… (N bytes clipped)"). A line longer than
// max_line_bytes is cut into pieces so one runaway line cannot grow the agent without bound; the
// tail keeps such a line as one line.
//
// Nothing here blocks the agent's loop on a slow reader: the console and the log files are
// written by OutputWriter threads (OutputSinks). The policy when the console does not keep up:
// while it is slow but moving, a stream with kConsoleBytesPerStream waiting is not read, so its
// worker waits in write(2) as it would under torchrun, and no line is lost; once the console has
// taken nothing for kConsoleStall with bytes waiting (a paused reader, a terminal on hold), the
// stream is read again and the lines it reads meanwhile are dropped and counted, so the workers
// run on; when the console takes lines again, one line says how many were not shown. A console
// with kConsoleBytesPerSink waiting drops in any case. Log files never lose a line: a worker
// whose file lags by kFileBytesPerStream is not read until it caught up. The agent's own log
// lines go through the same stderr writer (in order with the workers').
//
// Thread safety: a WorkerOutput lives on the agent's loop thread; OutputSinks may be used from
// any thread; LineSplitter and planWorkerOutput are plain values/pure functions.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "agent/console/output_writer.h"
#include "common/status.h"

struct winsize;

namespace boost::asio {
class io_context;
}

namespace cpprun::agent {

// Splits a byte stream into lines (without their '\n'), the way a terminal would show them:
// '\r' (a progress bar's update, written without '\n') starts the line over, so a line is the
// text after its last '\r' ("\r\n" is a plain end of line); when nothing follows the last '\r'
// the line is the text before it ("50%\r100%\r\n" is "100%"). Each text a '\r' ends is an
// update (on_update), superseded by the next one and by the line's end.
class LineSplitter {
 public:
  explicit LineSplitter(size_t max_line_bytes = 64 * 1024) : max_line_bytes_(max_line_bytes) {}
  // Calls on_line for every line completed by `data` (updates are not reported).
  void feed(std::string_view data, const std::function<void(std::string_view)>& on_line);
  // Also calls on_update (may be empty) with the text each '\r' ends.
  void feed(std::string_view data, const std::function<void(std::string_view)>& on_line,
            const std::function<void(std::string_view)>& on_update);
  // The line on_line got last was cut at max_line_bytes: the next one continues it.
  bool lastLineCut() const { return cut_; }
  // At end of stream: the unterminated rest (or the last update), if any, as a last line.
  void finish(const std::function<void(std::string_view)>& on_line);
  // The unfinished line: the text after its last '\r' (empty when none came since), and the
  // text of its last update.
  std::string_view pending() const { return partial_; }
  std::string_view lastUpdate() const { return last_update_; }
  // The unfinished line has had a '\r': it is a progress update, not a prompt.
  bool pendingIsUpdate() const { return saw_cr_ || pending_cr_; }

 private:
  void endLine(const std::function<void(std::string_view)>& on_line);
  void carriageReturn(const std::function<void(std::string_view)>& on_update);

  size_t max_line_bytes_;
  std::string partial_;
  std::string last_update_;
  bool saw_cr_ = false;      // the unfinished line has had a '\r'
  bool pending_cr_ = false;  // the last byte read was '\r'
  bool cut_ = false;         // the last line given was cut at max_line_bytes_
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
  // --duplicate-stdout-filters / --duplicate-stderr-filters (torchrun 2.15): a tee'd line of a
  // rank that reaches the console and contains any of these strings is also copied, prefixed as
  // on the console, into <attempt dir>/filtered_stdout.log / filtered_stderr.log (one file for
  // every local rank, made even when nothing is tee'd). Empty: no file.
  std::vector<std::string> duplicate_stdout_filters;
  std::vector<std::string> duplicate_stderr_filters;
  size_t stderr_tail_lines = 20;
  int console_stdout_fd = 1;
  int console_stderr_fd = 2;
  // The console descriptors are terminals: unfinished lines (prompts, progress updates) are
  // shown as open lines, continued or rewritten in place (the launcher sets these).
  bool console_stdout_terminal = false;
  bool console_stderr_terminal = false;
  // Give each worker a pseudo-terminal for this stream when it reaches the console
  // (--worker-tty auto and the console is a terminal; agent/console/worker_terminal.h).
  bool stdout_pty = false;
  bool stderr_pty = false;
};

class FilteredCopy;

// Where one stream of one worker goes.
struct StreamRoute {
  bool to_console = true;
  int console_fd = 1;
  std::string prefix;
  std::string file;       // empty: no file
  bool terminal = false;  // the console is a terminal: open lines (see OutputSinks)
  bool pty = false;       // the worker's side is a pseudo-terminal (else a pipe)
  // Tee'd and shown on the console: its lines may be copied to the attempt's filtered file.
  bool filterable = false;
  std::shared_ptr<FilteredCopy> filtered;  // the caller sets it; null: no copy
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

// True when some local rank's stream goes to a file, or there are duplicate filters (a log
// directory is needed).
bool anyRedirect(const OutputOptions& options);

// Console bytes one worker stream may have waiting before it is not read (console slow) or its
// new lines are dropped (console stalled).
inline constexpr size_t kConsoleBytesPerStream = 256 * 1024;
// A console that has taken no byte for this long while bytes wait is stalled.
inline constexpr std::chrono::milliseconds kConsoleStall{1000};
// Console bytes all streams (and the agent's log) may have waiting on one console descriptor.
inline constexpr size_t kConsoleBytesPerSink = 16 * 1024 * 1024;
// Log-file bytes one worker stream may have waiting before its pipe is no longer read.
inline constexpr size_t kFileBytesPerStream = 1024 * 1024;
// A progress update ('\r' without '\n') of one stream reaches the console at most this often;
// the latest state shows within this time, and the line's final state always at its end.
inline constexpr std::chrono::milliseconds kProgressUpdateInterval{1000};
// Erases the rest of a terminal's line (after a '\r' rewrite of an open line).
inline constexpr const char* kEraseToEndOfLine = "\x1b[K";
// How long the console may take, at the agent's exit, to take the lines still queued for it (a
// reader who never reads again must not hold the agent for ever), the same after a signal ended
// the job, and how long the log files may take (they must lose nothing).
inline constexpr std::chrono::milliseconds kConsoleExitFlush{10000};
inline constexpr std::chrono::milliseconds kConsoleExitFlushAfterSignal{2000};
inline constexpr std::chrono::milliseconds kFileExitFlush{60000};
// The agent's own log lines waiting on the console before new ones are dropped.
inline constexpr size_t kLogBytesWaiting = 1024 * 1024;
// Of each stderr line kept for the failure report, its first bytes (the report quotes no more:
// failure_report.h, kReportLineBytes); the rest is counted.
inline constexpr size_t kTailLineBytes = 4 * 1024;

// The writers of the agent's console (its stdout and stderr: one writer when both are the same
// file, so their lines never interleave mid-line) and of the workers' log files.
class OutputSinks {
 public:
  OutputSinks(int console_stdout_fd, int console_stderr_fd);
  ~OutputSinks();
  OutputSinks(const OutputSinks&) = delete;
  OutputSinks& operator=(const OutputSinks&) = delete;

  // The writer for a console descriptor (the stdout or stderr given at construction).
  OutputWriter& console(int fd);
  OutputWriter& files() { return files_; }
  // An agent log line, dropped (and counted) when kLogBytesWaiting are waiting already.
  void writeLog(std::string line);
  // cpprun's own report of the job's end (the failure report: whole lines, bounded in size by
  // its maker, failure_report.h), queued on the stderr writer past every budget: no amount of
  // worker output or log lines waiting can drop it. Only a console that takes nothing until the
  // exit flush bound (kConsoleExitFlush) loses it, as it loses everything then.
  void writeReport(std::string text);
  // A worker stream's console bytes. On a terminal a stream may leave its last line open (a
  // prompt, a progress bar): `compose` runs under the console's lock with the id of the stream
  // whose line is open there (0: none), returns the bytes to queue and sets `leave_open` when
  // they end in an open line of its own. Whoever writes next to that console ends an open line
  // of another stream with '\n' first (writeLog does too), so lines never run into each other.
  using Compose = std::function<std::string(uint64_t open_stream, bool& leave_open)>;
  void writeConsole(int fd, uint64_t stream, const Compose& compose,
                    std::shared_ptr<std::atomic<size_t>> queued, OutputWriter::Done done);
  // A fresh id for writeConsole.
  uint64_t newStreamId() { return ++last_stream_id_; }
  // Makes this process's log lines (common/logging.h) go to writeLog.
  void routeLogHere();
  // The end of the agent's output: says (through the log) how many lines the console did not
  // show, routes log lines back to a plain stderr write, and stop()s. False when something was
  // given up.
  bool close(std::chrono::milliseconds console_bound, std::chrono::milliseconds file_bound);
  // Where the writers' completions go (the agent's loop), and the end of that (before the loop
  // is destroyed): afterwards completions are dropped.
  void attachLoop(boost::asio::io_context* loop);
  // Runs `fn` on the attached loop (posted), or drops it when none is attached. Any thread.
  void postToLoop(std::function<void()> fn);
  // Waits for every console and file write queued so far, at most `bound` each; false when one
  // was not done in time.
  bool flush(std::chrono::milliseconds bound);
  // Writes what is queued (each writer at most `console_bound` for the console, `file_bound`
  // for the files), then stops the writers: later output is dropped and no callback runs any
  // more. The agent calls it once its loop is over, before anything a callback posts to is gone.
  // False when something was given up.
  bool stop(std::chrono::milliseconds console_bound, std::chrono::milliseconds file_bound);

  // Counted by the worker streams when they drop lines, and here for the agent's log.
  std::atomic<uint64_t> dropped_console_lines{0};
  std::atomic<uint64_t> dropped_log_lines{0};

 private:
  int stderr_fd_;
  OutputWriter files_;
  std::unique_ptr<OutputWriter> stdout_writer_;
  std::unique_ptr<OutputWriter> stderr_writer_;  // null when it is stdout's
  std::shared_ptr<std::atomic<size_t>> log_queued_ = std::make_shared<std::atomic<size_t>>(0);
  bool routed_log_ = false;
  std::mutex console_mutex_;
  uint64_t stdout_open_ = 0;  // guarded by console_mutex_: whose line is open on the writer
  uint64_t stderr_open_ = 0;
  std::atomic<uint64_t> last_stream_id_{0};
  std::mutex loop_mutex_;
  boost::asio::io_context* loop_ = nullptr;  // guarded by loop_mutex_
};

// One attempt's filtered_stdout.log or filtered_stderr.log: the matching lines of every stream
// that shares it, written by the file writer in whole batches (lines never interleave). It
// needs no budget of its own: it shares the file writer's queue (first in, first out) with the
// per-rank log files of the same lines, whose budget pauses the workers.
// Thread safety: matches() any thread; write() from the agent's loop.
class FilteredCopy {
 public:
  // Creates (truncates) `path`; kInvalidArgument naming it when that fails.
  static Result<std::shared_ptr<FilteredCopy>> create(const std::string& path,
                                                      std::vector<std::string> filters,
                                                      std::shared_ptr<OutputSinks> sinks);
  // Closes the file once what was queued for it is written.
  ~FilteredCopy();
  FilteredCopy(const FilteredCopy&) = delete;
  FilteredCopy& operator=(const FilteredCopy&) = delete;

  // The line contains one of the filters (torchrun: `any(needle in line ...)`).
  bool matches(std::string_view line) const;
  // Queues whole lines ('\n'-terminated).
  void write(std::string lines);
  const std::string& path() const { return path_; }

 private:
  FilteredCopy(int fd, std::string path, std::vector<std::string> filters,
               std::shared_ptr<OutputSinks> sinks);
  int fd_;
  std::string path_;
  std::vector<std::string> filters_;
  std::shared_ptr<OutputSinks> sinks_;
  std::shared_ptr<std::atomic<bool>> failed_ = std::make_shared<std::atomic<bool>>(false);
};

// Reads one pipe until EOF and routes what it reads. Construct, then start().
class WorkerOutput {
 public:
  // Takes ownership of `read_fd`. Opens the route's file (create/truncate) now.
  static Result<std::unique_ptr<WorkerOutput>> create(boost::asio::io_context& io, int read_fd,
                                                      StreamRoute route, size_t tail_lines,
                                                      std::function<void()> on_eof,
                                                      std::shared_ptr<OutputSinks> sinks);
  ~WorkerOutput();
  WorkerOutput(const WorkerOutput&) = delete;
  WorkerOutput& operator=(const WorkerOutput&) = delete;

  void start();
  // Stops reading (at the drain bound): what is buffered is flushed, the rest is dropped.
  void close();
  bool atEof() const;
  // The last lines read, oldest first; a line longer than kTailLineBytes as its head and
  // "… (N bytes clipped)" (common/clip.h, clipQuotedLine).
  std::vector<std::string> tail() const;
  uint64_t bytesRead() const;
  // A pseudo-terminal stream: gives the worker's terminal this window size (SIGWINCH follows).
  void resizeTerminal(const struct winsize& size);
  // Lines read but not shown on the console because it did not keep up.
  uint64_t droppedConsoleLines() const;

  struct Impl;

 private:
  explicit WorkerOutput(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace cpprun::agent
