#include "agent/console/stdin_forwarder.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "agent/console/worker_terminal.h"
#include "common/asio.h"
#include "common/logging.h"

namespace cpprun::agent {

namespace asio = boost::asio;

namespace {

enum class SourceKind { kClosed, kTerminal, kStream, kSocket, kFile };

SourceKind classify(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return SourceKind::kClosed;
  if (::isatty(fd)) return SourceKind::kTerminal;
  if (S_ISFIFO(st.st_mode)) return SourceKind::kStream;
  if (S_ISSOCK(st.st_mode)) return SourceKind::kSocket;
  return SourceKind::kFile;  // a regular file, /dev/null, a device epoll cannot wait on
}

std::string procPath(int fd) { return "/proc/self/fd/" + std::to_string(fd); }

void setNonBlocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

}  // namespace

struct StdinForwarder::Impl : std::enable_shared_from_this<StdinForwarder::Impl> {
  struct Target {
    explicit Target(asio::io_context& io, int fd, bool is_pty) : sd(io, fd), pty(is_pty) {}
    asio::posix::stream_descriptor sd;  // owns our end: a pipe's write end or a master's dup
    bool pty;
    std::string pending;
    bool waiting = false;      // for the worker to take more
    bool close_after = false;  // a pipe at EOF: closed once pending is written
    bool dead = false;
  };

  Impl(asio::io_context& loop, StdinMode m, int fd)
      : io(loop), mode(m), source_fd(fd), kind(classify(fd)) {}

  bool live(const Target& t) const { return !t.dead; }
  bool anyLive() const {
    return std::any_of(targets.begin(), targets.end(), [&](const auto& t) { return live(*t); });
  }
  bool anyFull() const {
    return std::any_of(targets.begin(), targets.end(), [](const auto& t) {
      return !t->dead && t->pending.size() >= kStdinBufferBytes;
    });
  }

  // Our own descriptor of the source: a new open file (non-blocking without touching the
  // caller's), else a duplicate.
  bool openReader() {
    if (reader) return true;
    int fd = -1;
    if (kind != SourceKind::kSocket) {
      fd = ::open(procPath(source_fd).c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    }
    if (fd < 0) fd = ::fcntl(source_fd, F_DUPFD_CLOEXEC, 3);
    if (fd < 0) {
      CPPRUN_LOG(kWarn) << "cannot read cpprun's stdin: " << std::strerror(errno)
                        << "; the workers get /dev/null";
      kind = SourceKind::kClosed;
      return false;
    }
    reader = std::make_unique<asio::posix::stream_descriptor>(io, fd);
    return true;
  }

  void startReading() {
    if (stopped || eof || reading || !reader || !anyLive() || anyFull()) return;
    if (kind == SourceKind::kTerminal && !inForegroundOf(reader->native_handle())) return;
    reading = true;
    reader->async_wait(asio::posix::stream_descriptor::wait_read,
                       [weak = weak_from_this()](const boost::system::error_code& ec) {
                         auto self = weak.lock();
                         if (!self) return;
                         self->reading = false;
                         if (!ec) self->readOnce();
                       });
  }

  void readOnce() {
    if (stopped || eof || !anyLive()) return;  // nobody to give it to yet: leave it unread
    const int fd = reader->native_handle();
    const bool terminal = kind == SourceKind::kTerminal;
    if (terminal && !inForegroundOf(fd)) return;  // onContinue() starts again
    char buffer[4096];
    ssize_t n;
    if (kind == SourceKind::kSocket) {
      n = ::recv(fd, buffer, sizeof buffer, MSG_DONTWAIT);
    } else {
      // A terminal read from the background returns EIO with SIGTTIN blocked, instead of
      // stopping the agent (the foreground check above may race a job-control change).
      sigset_t ttin;
      sigset_t saved;
      sigemptyset(&ttin);
      sigaddset(&ttin, SIGTTIN);
      ::pthread_sigmask(SIG_BLOCK, &ttin, &saved);
      n = ::read(fd, buffer, sizeof buffer);
      const int err = errno;
      ::pthread_sigmask(SIG_SETMASK, &saved, nullptr);
      errno = err;
    }
    if (n > 0) {
      for (auto& t : targets) {
        if (t->dead) continue;
        t->pending.append(buffer, static_cast<size_t>(n));
        flush(t);
      }
    } else if (n == 0) {
      onEof();
      return;
    } else if (errno == EIO && terminal) {
      return;  // background after all: onContinue() starts again
    } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      CPPRUN_LOG(kWarn) << "cannot read cpprun's stdin: " << std::strerror(errno)
                        << "; the workers' stdin ends here";
      onEof();
      return;
    }
    startReading();
  }

  void onEof() {
    eof = true;
    for (auto& t : targets) endInput(t);
  }

  // EOF for one worker: a pipe is closed once its input is written; a pty gets VEOF.
  void endInput(const std::shared_ptr<Target>& t) {
    if (t->dead) return;
    if (t->pty) {
      termios pty_modes{};
      const bool known = ::tcgetattr(t->sd.native_handle(), &pty_modes) == 0;
      t->pending.push_back(
          known && pty_modes.c_cc[VEOF] != 0 ? static_cast<char>(pty_modes.c_cc[VEOF]) : '\x04');
    } else {
      t->close_after = true;
    }
    flush(t);
  }

  void flush(const std::shared_ptr<Target>& t) {
    while (!t->dead && !t->pending.empty()) {
      const ssize_t w = ::write(t->sd.native_handle(), t->pending.data(), t->pending.size());
      if (w > 0) {
        t->pending.erase(0, static_cast<size_t>(w));
        continue;
      }
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        waitWritable(t);
        return;
      }
      drop(t);  // EPIPE (it closed its stdin or exited), EIO (its pty is gone)
      return;
    }
    if (!t->dead && t->close_after) drop(t);
  }

  void waitWritable(const std::shared_ptr<Target>& t) {
    if (t->waiting) return;
    t->waiting = true;
    t->sd.async_wait(asio::posix::stream_descriptor::wait_write,
                     [weak = weak_from_this(), t](const boost::system::error_code& ec) {
                       t->waiting = false;
                       auto self = weak.lock();
                       if (!self || ec || t->dead) return;
                       self->flush(t);
                       self->startReading();  // it may have been full
                     });
  }

  void drop(const std::shared_ptr<Target>& t) {
    t->dead = true;
    t->pending.clear();
    boost::system::error_code ignored;
    t->sd.close(ignored);
  }

  void add(const std::shared_ptr<Target>& t) {
    targets.push_back(t);
    if (eof) {
      endInput(t);
      return;
    }
    startReading();
  }

  void clear() {
    for (auto& t : targets) drop(t);
    targets.clear();
  }

  asio::io_context& io;
  const StdinMode mode;
  const int source_fd;
  SourceKind kind;
  std::unique_ptr<asio::posix::stream_descriptor> reader;
  std::vector<std::shared_ptr<Target>> targets;
  TerminalModes modes;
  bool wants_modes = false;  // a worker reads keystrokes through its pty
  bool reading = false;
  bool eof = false;
  bool stopped = false;
};

StdinForwarder::StdinForwarder(asio::io_context& io, StdinMode mode, int source_fd)
    : impl_(std::make_shared<Impl>(io, mode, source_fd)) {}

StdinForwarder::~StdinForwarder() { stop(); }

bool StdinForwarder::wants(int rank) const {
  switch (impl_->mode) {
    case StdinMode::kNone:
      return false;
    case StdinMode::kRank0:
      return rank == 0 && impl_->kind != SourceKind::kClosed;
    case StdinMode::kAll:
      return impl_->kind != SourceKind::kClosed;
  }
  return false;
}

bool StdinForwarder::sourceIsTerminal() const { return impl_->kind == SourceKind::kTerminal; }

Result<int> StdinForwarder::descriptorForWorker() {
  Impl& d = *impl_;
  if (d.stopped || d.kind == SourceKind::kClosed) return unavailable("cpprun's stdin is closed");
  if (d.kind == SourceKind::kFile) {
    if (d.mode == StdinMode::kRank0) {
      const int fd = ::fcntl(d.source_fd, F_DUPFD_CLOEXEC, 3);
      if (fd < 0) return unavailable(std::string("dup of stdin: ") + std::strerror(errno));
      return fd;
    }
    // Every worker reads the whole rest of the file, from where cpprun's offset is.
    const int fd = ::open(procPath(d.source_fd).c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) return unavailable(std::string("reopen of stdin: ") + std::strerror(errno));
    const off_t at = ::lseek(d.source_fd, 0, SEEK_CUR);
    if (at > 0) ::lseek(fd, at, SEEK_SET);
    return fd;
  }
  if (!d.openReader()) return unavailable("cpprun's stdin cannot be read");
  int ends[2];
  if (::pipe2(ends, O_CLOEXEC) != 0)
    return unavailable(std::string("pipe: ") + std::strerror(errno));
  setNonBlocking(ends[1]);
  d.add(std::make_shared<Impl::Target>(d.io, ends[1], false));
  return ends[0];
}

void StdinForwarder::addTerminal(int master_fd, bool echo) {
  Impl& d = *impl_;
  if (d.stopped || !d.openReader()) return;
  const int fd = ::fcntl(master_fd, F_DUPFD_CLOEXEC, 3);
  if (fd < 0) return;
  if (!echo) {
    termios modes{};
    if (::tcgetattr(fd, &modes) == 0) {
      modes.c_lflag &= ~static_cast<tcflag_t>(ECHO);
      ::tcsetattr(fd, TCSANOW, &modes);
    }
  }
  d.wants_modes = true;
  d.modes.enterForwarding(d.reader->native_handle());
  d.add(std::make_shared<Impl::Target>(d.io, fd, true));
}

void StdinForwarder::clearWorkers() { impl_->clear(); }

void StdinForwarder::onContinue() {
  Impl& d = *impl_;
  if (d.stopped || !d.reader) return;
  if (d.wants_modes && !d.modes.active()) d.modes.enterForwarding(d.reader->native_handle());
  d.startReading();
}

void StdinForwarder::stop() {
  Impl& d = *impl_;
  if (d.stopped) return;
  d.stopped = true;
  d.modes.restore();
  d.clear();
  if (d.reader) {
    boost::system::error_code ignored;
    d.reader->close(ignored);
  }
}

}  // namespace cpprun::agent
