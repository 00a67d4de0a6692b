#include "agent/processes/child_reaper.h"

#include <sys/prctl.h>
#include <sys/wait.h>

#include <cerrno>

#include "common/asio.h"

namespace cpprun::agent {

namespace asio = boost::asio;

struct ChildReaper::Impl : std::enable_shared_from_this<ChildReaper::Impl> {
  Impl(asio::io_context& io, OnExit cb) : signals(io, SIGCHLD), on_exit(std::move(cb)) {}

  void arm() {
    signals.async_wait([weak = weak_from_this()](const boost::system::error_code& ec, int) {
      auto self = weak.lock();
      if (!self || ec || self->stopped) return;
      self->reap();
      self->arm();
    });
  }

  void reap() {
    for (;;) {
      int status = 0;
      pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid > 0) {
        if (on_exit) on_exit(pid, status);
        continue;
      }
      if (pid < 0 && errno == EINTR) continue;
      return;  // 0: children left but none exited; ECHILD: no children
    }
  }

  asio::signal_set signals;
  OnExit on_exit;
  bool stopped = false;
};

ChildReaper::ChildReaper(asio::io_context& io, OnExit on_exit)
    : impl_(std::make_shared<Impl>(io, std::move(on_exit))) {
  impl_->arm();
}

ChildReaper::~ChildReaper() { stop(); }

void ChildReaper::reapNow() { impl_->reap(); }

void ChildReaper::stop() {
  if (impl_->stopped) return;
  impl_->stopped = true;
  boost::system::error_code ignored;
  impl_->signals.cancel(ignored);
}

bool becomeChildSubreaper() { return ::prctl(PR_SET_CHILD_SUBREAPER, 1) == 0; }

}  // namespace cpprun::agent
