// EventLog: the agent's --event-log FILE, one JSON object per line per event, for operators and
// tools that reconstruct what a job did (rendezvous rounds, worker starts and exits, restarts,
// signals, stalls, failures and the root cause). Every line carries:
//   {"time": "2026-11-22T10:00:00.123456Z", "time_us": <epoch µs>, "host": ..., "agent_pid": ...,
//    "event": "<name>", ...the event's own fields}
// Event names and fields are listed in docs/operations.md. The file is opened for appending
// (several agents of one host, or several runs, may share it) and each line is written with a
// single write(2), so lines never interleave.
//
// --event-log-handler console (torchrun's console handler: a logging.StreamHandler that prints
// each event as one JSON object per line on stderr) sends the same lines to stderr as well,
// through the agent's log output (common/logging.h logText), so they stay whole and in order
// with the agent's log lines and the workers' stderr; like torch's, they are INFO records
// (CPPRUN_LOG_LEVEL=warn hides them, as LOGLEVEL=WARNING does torch's). The events are
// cpprun's, not torchelastic's "torchelastic.worker.status.*" records.
//
// Thread safety: emit() may be called from any thread (the agent's loop and the coordinator's
// threads both emit).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"

namespace cpprun::agent {

class EventLog {
 public:
  // `path` empty: no file; `console`: every line to stderr too. kInvalidArgument naming the
  // path and the system error when it cannot be opened.
  static Result<std::unique_ptr<EventLog>> open(const std::string& path, std::string host,
                                                bool console = false);
  ~EventLog();
  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;

  // Appends one line: the common fields, then `fields` (an object; its keys win on clashes).
  void emit(const std::string& event, const nlohmann::json& fields = nlohmann::json::object());
  const std::string& path() const { return path_; }

 private:
  EventLog(int fd, std::string path, std::string host, bool console);
  int fd_;  // -1: no file
  bool console_;
  std::string path_;
  std::string host_;
  int pid_;
};

// Emits through `log` when it is not null: the agent's components hold an optional log.
inline void emitEvent(EventLog* log, const std::string& event,
                      const nlohmann::json& fields = nlohmann::json::object()) {
  if (log != nullptr) log->emit(event, fields);
}

}  // namespace cpprun::agent
