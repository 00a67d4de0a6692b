// Failure report: turns how workers ended (wait status, the TORCHELASTIC_ERROR_FILE a worker
// wrote, the tail of its stderr) into torchrun's "<entrypoint> FAILED" summary and into the
// root-cause document cpprun copies into its own error file for nested launchers and schedulers
// (reference: torchrun.md §4.8, torch/distributed/elastic/multiprocessing/errors/__init__.py).
//
// Pure apart from reading a worker's error file and writing cpprun's own, both named by path: no
// processes, no clocks (the caller passes the time it observed a failure), no logging.
// Thread safety: free functions on values; safe to call from any thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace cpprun::agent {

// Error files larger than this are refused as corrupt (a traceback is a few KiB).
inline constexpr std::size_t kMaxErrorFileBytes = 8 * 1024 * 1024;

// The report is cpprun's own message and reaches the console past the budget workers' lines
// have (OutputSinks::writeReport), so what it quotes of the workers is bounded, whatever they
// wrote (a 1.1 MB stderr line once made the whole report vanish; docs/failure-report.md):
//   - every quoted line (stderr tail, traceback, message) shows its first kReportLineBytes and
//     then "… (N bytes clipped)" (common/clip.h, clipQuotedLine);
//   - a worker's stderr tail keeps its newest lines within kReportTailBytes;
//   - a traceback keeps its first line (the reason) and its newest lines within
//     kReportTracebackBytes (the exception is at the end).
// A dropped run of lines is one line: "… (N earlier lines left out)". An entry is therefore at
// most about kReportTailBytes + kReportTracebackBytes + 1 KiB.
inline constexpr std::size_t kReportLineBytes = 4 * 1024;
inline constexpr std::size_t kReportTailBytes = 16 * 1024;
inline constexpr std::size_t kReportTracebackBytes = 64 * 1024;

// What a worker's TORCHELASTIC_ERROR_FILE said. torch writes either
// {"message": {"message": "<Type>: <msg>", "extraInfo": {"py_callstack": "<tb>",
//  "timestamp": "<epoch s as string>"}}}
// or {"message": "<str>", "timestamp": <int>}. Timestamps are accepted as integers or decimal
// strings in both shapes; a missing, unparsable or non-positive one is left out.
struct ErrorFileContents {
  std::string message;
  std::string traceback;               // py_callstack when present
  std::optional<int64_t> timestamp_s;  // epoch seconds when present
  nlohmann::json raw;  // the whole document (for copying into the launcher's own error file)
};

// Parses an error file's text; `path` only names it in errors. kInvalidArgument naming the path
// and what is wrong when the text is not JSON or has neither shape.
Result<ErrorFileContents> parseErrorFile(const std::string& path, const std::string& text);

// nullopt when the file does not exist or is empty (whitespace only); kInvalidArgument naming the
// path and what is wrong when it cannot be read, is larger than kMaxErrorFileBytes, is not valid
// JSON or has neither shape.
Result<std::optional<ErrorFileContents>> readErrorFile(const std::string& path);

// "SIGKILL" for 9, "SIGRTMIN+2" for real-time signals, "SIG<n>" for anything else.
std::string signalName(int signo);
// torchrun's text for a worker killed by a signal: "Signal 9 (SIGKILL) received by PID 123".
std::string signalText(int signo, int pid);

struct WorkerFailure {
  int local_rank = 0;
  int rank = 0;
  int pid = 0;
  int exit_code = 0;  // when the worker exited (non-zero)
  int signal = 0;     // >0 when it was killed by a signal (then exit_code is ignored)
  std::chrono::system_clock::time_point time;  // when observed (or the error file's timestamp)
  std::string error_file;                      // path, empty when none was written
  std::string message;                   // from the error file, else the signal text, else a hint
  std::string traceback;                 // from the error file, may be empty
  std::vector<std::string> stderr_tail;  // last lines the worker wrote to stderr, oldest first
  bool teardown = false;  // killed/ended by the agent during teardown (collateral, never a root
                          // cause unless nothing else)
  nlohmann::json error_document;  // the error file's whole document; null when none was read
  // Multi-node jobs: the worker's host (empty: the report's host), and whether it failed on its
  // own after another node's failure had already stopped the attempt (an NCCL or gloo error
  // once a peer is gone): listed, never a root cause.
  std::string host;
  bool collateral = false;
  // A hang's victim (stall_verdict.h): it waited in the collective a culprit did not enter;
  // message says where. Listed, never a root cause unless nothing else.
  bool waiting = false;
  // Never reaped: still alive the teardown's reap bound after SIGKILL (exit_code and signal are
  // then 0). What /proc said of it at the bound: its state letter ('D': uninterruptible sleep)
  // and kernel wait channel; message names both, traceback holds its kernel stack when readable.
  bool unreaped = false;
  char state = 0;
  std::string wchan;
};

// What torchrun and @record call the exit code: -signal when killed by a signal, else exit_code.
int torchExitCode(const WorkerFailure& failure);

// Builds a WorkerFailure for a worker that ended with `wait_status` (as from waitpid): fills
// exit_code or signal and reads `error_file_path` (empty: none was set). A missing error file is
// fine; a corrupt one is reported inside `message`, never fatal. message = the error file's
// message, else signalText(), else a hint about the missing error file; time = the error file's
// timestamp when present, else `observed`.
WorkerFailure describeFailure(int local_rank, int rank, int pid, int wait_status,
                              std::chrono::system_clock::time_point observed,
                              const std::string& error_file_path,
                              std::vector<std::string> stderr_tail, bool teardown);

// Index of the root cause: the earliest non-teardown failure (ties: lowest rank, then lowest
// index); if all are teardown, the earliest of those.
// REQUIRES: !failures.empty().
size_t rootCauseIndex(const std::vector<WorkerFailure>& failures);

// The report in torchrun's shape (torchrun.md §4.8), ending in a newline:
//   =====...
//   <entrypoint> FAILED
//   -----...
//   Failures:
//   <the other failures, or "  <NO_OTHER_FAILURES>">
//   -----...
//   Root Cause (first observed failure):
//   <the root entry>
//   =====...
// Entries are numbered "[idx]:" in rank order and carry time (YYYY-MM-DD_HH:MM:SS, local time),
// host, rank, exitcode ("C (pid: P)", or "-N (pid: P) SIGNAME" for a signal, plus
// "(stopped by cpprun during teardown)" for teardown failures; "<not reaped> (pid: P) state S,
// wchan W, still alive after SIGKILL" for a process SIGKILL did not end), error_file ("<N/A>" when
// none), traceback (the traceback, else the message; continuation lines indented) and, unlike
// torchrun, "stderr (last N lines):" with the indented tail when there is one; both bounded as
// kReportLineBytes says. Rule width = the longest line, at most 60, like torchrun.
std::string formatFailureReport(const std::string& entrypoint, const std::string& host,
                                const std::vector<WorkerFailure>& failures);

// The JSON cpprun writes to its own TORCHELASTIC_ERROR_FILE: the root cause's error-file document
// when it was in torch's nested shape; otherwise {"message": {"message": ..., "extraInfo":
// {"py_callstack": <traceback, left out when empty>, "timestamp": "<epoch s>"}}}. Either way
// message.errorCode = torchExitCode(root), as torch's @record does.
nlohmann::json rootCauseDocument(const WorkerFailure& root);

// Writes rootCauseDocument(root) to `path` atomically (a temporary file beside it, then rename).
// kInternal naming the path and the system error when it cannot.
Status writeRootCauseFile(const std::string& path, const WorkerFailure& root);

}  // namespace cpprun::agent
