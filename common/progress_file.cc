#include "common/progress_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace cpprun {

ProgressReporter ProgressReporter::fromEnvironment() {
  const char* path = std::getenv(kProgressFileVariable);
  return ProgressReporter(path == nullptr ? std::string() : std::string(path));
}

ProgressReporter::ProgressReporter(const std::string& path) {
  if (!path.empty()) fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
}

ProgressReporter::~ProgressReporter() {
  if (fd_ >= 0) ::close(fd_);
}

ProgressReporter::ProgressReporter(ProgressReporter&& other) noexcept : fd_(other.fd_) {
  other.fd_ = -1;
}

ProgressReporter& ProgressReporter::operator=(ProgressReporter&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

void ProgressReporter::bump(uint64_t counter) {
  if (fd_ < 0) return;
  char text[32];
  const int n =
      std::snprintf(text, sizeof text, "%020llu\n", static_cast<unsigned long long>(counter));
  // A failed write only loses a progress mark; the agent's stall bound covers it.
  (void)!::pwrite(fd_, text, static_cast<size_t>(n), 0);
}

std::optional<ProgressSample> readProgress(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  ProgressSample sample;
  struct stat st {};
  if (::fstat(fd, &st) == 0) {
    sample.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  }
  char text[32];
  const ssize_t n = ::pread(fd, text, sizeof text - 1, 0);
  ::close(fd);
  if (n > 0) {
    text[n] = '\0';
    char* end = nullptr;
    const unsigned long long value = std::strtoull(text, &end, 10);
    if (end != text) sample.counter = value;
  }
  return sample;
}

}  // namespace cpprun
