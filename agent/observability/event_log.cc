#include "agent/observability/event_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>

#include "common/logging.h"

namespace cpprun::agent {

namespace {

std::string isoTime(int64_t epoch_us) {
  const std::time_t secs = static_cast<std::time_t>(epoch_us / 1000000);
  std::tm tm{};
  ::gmtime_r(&secs, &tm);
  char buf[48];
  const size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  std::snprintf(buf + n, sizeof buf - n, ".%06lldZ", static_cast<long long>(epoch_us % 1000000));
  return buf;
}

}  // namespace

Result<std::unique_ptr<EventLog>> EventLog::open(const std::string& path, std::string host,
                                                 bool console) {
  int fd = -1;
  if (!path.empty()) {
    fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
      return invalidArgument("--event-log: cannot open " + path + ": " + std::strerror(errno));
    }
  }
  return std::unique_ptr<EventLog>(new EventLog(fd, path, std::move(host), console));
}

EventLog::EventLog(int fd, std::string path, std::string host, bool console)
    : fd_(fd),
      console_(console),
      path_(std::move(path)),
      host_(std::move(host)),
      pid_(static_cast<int>(::getpid())) {}

EventLog::~EventLog() {
  if (fd_ >= 0) ::close(fd_);
}

void EventLog::emit(const std::string& event, const nlohmann::json& fields) {
  const int64_t now_us = std::chrono::duration_cast<std::chrono::microseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
  nlohmann::json line = {{"time", isoTime(now_us)},
                         {"time_us", now_us},
                         {"host", host_},
                         {"agent_pid", pid_},
                         {"event", event}};
  if (fields.is_object()) {
    for (auto it = fields.begin(); it != fields.end(); ++it) line[it.key()] = it.value();
  }
  // Replace, not throw: a worker's output or error text may hold bytes that are not UTF-8.
  std::string text = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  text += '\n';
  if (console_ && logEnabled(LogLevel::kInfo)) logText(text);
  if (fd_ < 0) return;
  const ssize_t n = ::write(fd_, text.data(), text.size());
  if (n != static_cast<ssize_t>(text.size())) {
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true)) {
      CPPRUN_LOG(kWarn) << "--event-log " << path_ << ": write failed ("
                        << (n < 0 ? std::strerror(errno) : "short write")
                        << "); later events may be missing";
    }
  }
}

}  // namespace cpprun::agent
