#include "agent/console/worker_terminal.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace cpprun::agent {

Result<WorkerPty> openWorkerPty(const std::optional<winsize>& size) {
  const int master = ::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (master < 0) return unavailable(std::string("posix_openpt: ") + std::strerror(errno));
  auto fail = [master](const char* step) {
    const int err = errno;
    ::close(master);
    return unavailable(std::string(step) + ": " + std::strerror(err));
  };
  if (::grantpt(master) != 0) return fail("grantpt");
  if (::unlockpt(master) != 0) return fail("unlockpt");
  char name[128];
  if (::ptsname_r(master, name, sizeof name) != 0) return fail("ptsname_r");
  const int slave = ::open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (slave < 0) return fail("open pty slave");
  termios modes{};
  if (::tcgetattr(slave, &modes) == 0) {
    modes.c_oflag &= ~static_cast<tcflag_t>(ONLCR);
    ::tcsetattr(slave, TCSANOW, &modes);
  }
  if (size) ::ioctl(master, TIOCSWINSZ, &*size);
  const int flags = ::fcntl(master, F_GETFL);
  if (flags >= 0) ::fcntl(master, F_SETFL, flags | O_NONBLOCK);
  return WorkerPty{master, slave};
}

std::optional<winsize> consoleWindowSize() {
  for (int fd : {STDOUT_FILENO, STDERR_FILENO, STDIN_FILENO}) {
    winsize size{};
    if (::isatty(fd) && ::ioctl(fd, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) return size;
  }
  return std::nullopt;
}

bool inForegroundOf(int fd) {
  if (!::isatty(fd)) return false;
  const pid_t foreground = ::tcgetpgrp(fd);
  return foreground > 0 && foreground == ::getpgrp();
}

void setWindowSize(int master_fd, const winsize& size) {
  if (master_fd >= 0) ::ioctl(master_fd, TIOCSWINSZ, &size);
}

termios forwardingModes(termios modes) {
  // No echo, no line editing, no extended input processing (^V passes through); signals kept.
  modes.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO | ECHOE | ECHOK | ECHONL | IEXTEN);
  modes.c_lflag |= ISIG;
  modes.c_cc[VMIN] = 1;
  modes.c_cc[VTIME] = 0;
  return modes;
}

namespace {

// tcsetattr with SIGTTOU blocked: cpprun is the foreground job when this is called (checked just
// before), and must not be stopped if that changed in between; the change then fails instead.
bool setModes(int fd, const termios& modes) {
  sigset_t ttou;
  sigset_t saved;
  sigemptyset(&ttou);
  sigaddset(&ttou, SIGTTOU);
  ::pthread_sigmask(SIG_BLOCK, &ttou, &saved);
  int rc;
  while ((rc = ::tcsetattr(fd, TCSADRAIN, &modes)) != 0 && errno == EINTR) {
  }
  ::pthread_sigmask(SIG_SETMASK, &saved, nullptr);
  return rc == 0;
}

}  // namespace

std::optional<termios> terminalModesOf(int fd) {
  termios modes{};
  if (!::isatty(fd) || ::tcgetattr(fd, &modes) != 0) return std::nullopt;
  return modes;
}

void restoreTerminalModes(int fd, const termios& modes) {
  auto now = terminalModesOf(fd);
  if (!now || !inForegroundOf(fd)) return;
  if (now->c_iflag == modes.c_iflag && now->c_oflag == modes.c_oflag &&
      now->c_cflag == modes.c_cflag && now->c_lflag == modes.c_lflag &&
      std::memcmp(now->c_cc, modes.c_cc, sizeof modes.c_cc) == 0) {
    return;
  }
  setModes(fd, modes);
}

bool TerminalModes::enterForwarding(int fd) {
  if (fd_ >= 0) return true;
  if (!inForegroundOf(fd)) return false;
  termios found{};
  if (::tcgetattr(fd, &found) != 0) return false;
  if (!setModes(fd, forwardingModes(found))) return false;
  saved_ = found;
  fd_ = fd;
  return true;
}

void TerminalModes::restore() {
  if (fd_ < 0) return;
  if (inForegroundOf(fd_)) setModes(fd_, saved_);
  fd_ = -1;
}

}  // namespace cpprun::agent
