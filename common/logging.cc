#include "common/logging.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <mutex>

namespace cpprun {
namespace {

LogLevel levelFromEnvironment() {
  const char* v = std::getenv("CPPRUN_LOG_LEVEL");
  if (v == nullptr) return LogLevel::kInfo;
  std::string s(v);
  if (s == "debug") return LogLevel::kDebug;
  if (s == "warn" || s == "warning") return LogLevel::kWarn;
  if (s == "error") return LogLevel::kError;
  return LogLevel::kInfo;
}

std::atomic<int> g_level{static_cast<int>(levelFromEnvironment())};
std::mutex g_name_mutex;
std::string g_program = "cpprun";
std::mutex g_sink_mutex;
std::shared_ptr<std::function<void(std::string)>> g_sink;  // guarded by g_sink_mutex

const char* levelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "DEBUG";
    case LogLevel::kInfo:
      return "INFO";
    case LogLevel::kWarn:
      return "WARN";
    case LogLevel::kError:
      return "ERROR";
  }
  return "?";
}

}  // namespace

void setLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }

void setLogProgramName(const std::string& name) {
  std::lock_guard<std::mutex> lock(g_name_mutex);
  g_program = name;
}

void setLogSink(std::function<void(std::string line)> sink) {
  std::lock_guard<std::mutex> lock(g_sink_mutex);
  g_sink = sink ? std::make_shared<std::function<void(std::string)>>(std::move(sink)) : nullptr;
}

bool logEnabled(LogLevel level) { return static_cast<int>(level) >= g_level.load(); }

void logLine(LogLevel level, const std::string& message) {
  using namespace std::chrono;
  auto now = system_clock::now();
  std::time_t secs = system_clock::to_time_t(now);
  auto millis = duration_cast<milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char stamp[64];
  std::snprintf(stamp, sizeof(stamp), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>(millis));
  std::string line;
  {
    std::lock_guard<std::mutex> lock(g_name_mutex);
    line = g_program;
  }
  line += ' ';
  line += stamp;
  line += ' ';
  line += levelName(level);
  line += ' ';
  line += message;
  line += '\n';
  logText(std::move(line));
}

void logText(std::string text) {
  std::shared_ptr<std::function<void(std::string)>> sink;
  {
    std::lock_guard<std::mutex> lock(g_sink_mutex);
    sink = g_sink;
  }
  if (sink) {
    (*sink)(std::move(text));
    return;
  }
  // One write per line: whole lines, never interleaved with other writers.
  const char* p = text.data();
  size_t left = text.size();
  while (left > 0) {
    ssize_t n = ::write(STDERR_FILENO, p, left);
    if (n <= 0) break;
    p += n;
    left -= static_cast<size_t>(n);
  }
}

}  // namespace cpprun
