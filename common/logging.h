// Line-oriented logging to stderr: "cpprun-store 2026-11-22T10:00:00.123Z WARN message".
//
// Each call writes one whole line with a single write(2), so lines from several threads or
// processes sharing the stream never interleave mid-line. The level threshold comes from
// setLogLevel() or CPPRUN_LOG_LEVEL (debug|info|warn|error).
// Thread safety: every function may be called from any thread.
#pragma once

#include <functional>
#include <sstream>
#include <string>

namespace cpprun {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

void setLogLevel(LogLevel level);
// Name printed at the start of every line (the program, e.g. "cpprun-store").
void setLogProgramName(const std::string& name);
bool logEnabled(LogLevel level);
void logLine(LogLevel level, const std::string& message);
// Where whole log lines (newline included) go instead of a blocking write to stderr; null
// restores stderr. A process whose stderr may stall (the agent, whose console a paused reader
// can hold) hands its lines to a writer thread this way.
void setLogSink(std::function<void(std::string line)> sink);
// Writes `text` (whole lines, no header added) where log lines go: a report of several lines.
void logText(std::string text);

namespace detail {
class LogMessage {
 public:
  explicit LogMessage(LogLevel level) : level_(level) {}
  ~LogMessage() { logLine(level_, stream_.str()); }
  std::ostringstream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};
}  // namespace detail

}  // namespace cpprun

// CPPRUN_LOG(kWarn) << "closing connection from " << peer << ": " << why;
#define CPPRUN_LOG(level)                                 \
  if (!::cpprun::logEnabled(::cpprun::LogLevel::level)) { \
  } else                                                  \
    ::cpprun::detail::LogMessage(::cpprun::LogLevel::level).stream()
