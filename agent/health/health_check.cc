#include "agent/health/health_check.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "agent/processes/process_launcher.h"
#include "agent/supervision/failure_report.h"
#include "common/asio.h"
#include "common/logging.h"

namespace cpprun::agent {

namespace asio = boost::asio;
using SteadyClock = std::chrono::steady_clock;

namespace {
// After the command exited, how long its pipe may stay open (a descendant that kept it) before
// the result is given without the rest of its output.
constexpr std::chrono::milliseconds kDrainBound{500};
constexpr size_t kMaxLine = 512;

std::string secondsText(std::chrono::milliseconds ms) {
  std::string s = std::to_string(ms.count() / 1000.0);
  while (s.size() > 1 && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}
}  // namespace

struct HealthCheck::Impl : std::enable_shared_from_this<HealthCheck::Impl> {
  // Where the built-in check's thread posts its answer; cleared when this object goes, so a
  // thread that outlives the agent posts nothing.
  struct Mailbox {
    std::mutex mu;
    asio::io_context* io;  // guarded by mu
  };

  Impl(asio::io_context& loop, ProcessLauncher& process_launcher, HealthCheckOptions options)
      : io(loop),
        launcher(process_launcher),
        opts(std::move(options)),
        timer(loop),
        drain_timer(loop),
        pipe(loop),
        mailbox(std::make_shared<Mailbox>()) {
    mailbox->io = &loop;
  }
  ~Impl() {
    std::lock_guard<std::mutex> lock(mailbox->mu);
    mailbox->io = nullptr;
  }

  void run(int attempt, Done cb) {
    ++generation;
    done = std::move(cb);
    result = HealthResult{};
    tail.clear();
    partial.clear();
    began = SteadyClock::now();
    builtin_pending = static_cast<bool>(opts.builtin);
    command_pending = !opts.command.empty();
    pipe_open = false;
    pid = -1;
    if (builtin_pending) startBuiltin();
    if (command_pending) startCommand(attempt);
    timer.expires_after(opts.timeout);
    timer.async_wait(
        [weak = weak_from_this(), g = generation](const boost::system::error_code& ec) {
          auto self = weak.lock();
          if (ec || !self || g != self->generation || !self->done) return;
          self->onTimeout();
        });
    maybeFinish();
  }

  void startBuiltin() {
    // A thread of its own, detached: a check stuck in the driver or on a hung mount must not
    // hold the agent. Its answer is posted to the loop and dropped when stale.
    std::weak_ptr<Impl> weak = weak_from_this();
    const int g = generation;
    BuiltinHealthCheck check = opts.builtin;
    std::shared_ptr<Mailbox> box = mailbox;
    std::thread([weak, g, check, box] {
      std::vector<std::string> problems = check();
      std::lock_guard<std::mutex> lock(box->mu);
      if (box->io == nullptr) return;  // the agent is gone
      asio::post(*box->io, [weak, g, problems = std::move(problems)] {
        auto self = weak.lock();
        if (!self || g != self->generation || !self->builtin_pending) return;
        self->builtin_pending = false;
        if (!problems.empty() && self->result.healthy) {
          std::string text;
          for (const std::string& p : problems) text += (text.empty() ? "" : "; ") + p;
          self->fail("built-in", "built-in check failed: " + text);
        }
        self->maybeFinish();
      });
    }).detach();
  }

  void startCommand(int attempt) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      command_pending = false;
      fail("command",
           std::string("cannot run the health check command: pipe: ") + std::strerror(errno));
      return;
    }
    ProcessSpec spec;
    spec.argv = {"/bin/sh", "-c", opts.command};
    spec.env = opts.env;
    spec.env["CPPRUN_HEALTH_CHECK_ATTEMPT"] = std::to_string(attempt);
    spec.stdout_fd = fds[1];
    spec.stderr_fd = fds[1];
    Result<pid_t> spawned = launcher.spawn(spec);
    ::close(fds[1]);
    if (!spawned.isOk()) {
      ::close(fds[0]);
      command_pending = false;
      fail("command", "cannot run the health check command: " + spawned.status().message());
      return;
    }
    pid = spawned.value();
    pipe.assign(fds[0]);
    pipe_open = true;
    read();
  }

  void read() {
    pipe.async_read_some(asio::buffer(buffer), [weak = weak_from_this(), g = generation](
                                                   const boost::system::error_code& ec, size_t n) {
      auto self = weak.lock();
      if (!self || g != self->generation) return;
      if (ec) {
        self->closePipe();
        self->maybeFinish();
        return;
      }
      self->consume(n);
      self->read();
    });
  }

  void consume(size_t n) {
    for (size_t i = 0; i < n; ++i) {
      const char c = buffer[i];
      if (c == '\n') {
        pushLine();
      } else if (partial.size() < kMaxLine) {
        partial += c;
      }
    }
  }

  void pushLine() {
    tail.push_back(std::move(partial));
    partial.clear();
    while (tail.size() > opts.tail_lines) tail.pop_front();
  }

  void closePipe() {
    if (!pipe_open) return;
    pipe_open = false;
    boost::system::error_code ignored;
    pipe.close(ignored);
    drain_timer.cancel();
    if (!partial.empty()) pushLine();
  }

  bool onChildExit(pid_t exited, int status) {
    if (pid <= 0 || exited != pid) return false;
    pid = -1;
    command_pending = false;
    if (result.check != "timeout") {
      if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
        fail("command", "health check command '" + opts.command + "' exited with code " +
                            std::to_string(WEXITSTATUS(status)));
      } else if (WIFSIGNALED(status)) {
        fail("command", "health check command '" + opts.command + "' was killed by " +
                            signalName(WTERMSIG(status)));
      }
    }
    if (pipe_open) {
      drain_timer.expires_after(kDrainBound);
      drain_timer.async_wait(
          [weak = weak_from_this(), g = generation](const boost::system::error_code& ec) {
            auto self = weak.lock();
            if (ec || !self || g != self->generation) return;
            self->closePipe();
            self->maybeFinish();
          });
    }
    maybeFinish();
    return true;
  }

  void onTimeout() {
    std::string what;
    if (command_pending) what = "the health check command '" + opts.command + "'";
    if (builtin_pending) what += (what.empty() ? "" : " and ") + std::string("the built-in checks");
    if (what.empty()) return;
    // The timeout is the root cause, whatever else failed since.
    result.healthy = true;
    fail("timeout", what + " did not finish within " + secondsText(opts.timeout) +
                        " s (--health-check-timeout)");
    builtin_pending = false;  // its late answer is dropped
    if (pid > 0) {
      (void)launcher.signalWorker(pid, true, SIGKILL);  // the exit comes through the reaper
    } else {
      closePipe();
    }
    maybeFinish();
  }

  void fail(const std::string& check, const std::string& reason) {
    if (!result.healthy) return;  // the first failure names it
    result.healthy = false;
    result.check = check;
    result.reason = reason;
  }

  void maybeFinish() {
    if (!done || builtin_pending || command_pending || pipe_open) return;
    timer.cancel();
    result.output_tail.assign(tail.begin(), tail.end());
    result.seconds = std::chrono::duration<double>(SteadyClock::now() - began).count();
    Done cb = std::move(done);
    done = nullptr;
    cb(result);
  }

  asio::io_context& io;
  ProcessLauncher& launcher;
  const HealthCheckOptions opts;
  asio::steady_timer timer;
  asio::steady_timer drain_timer;
  asio::posix::stream_descriptor pipe;
  int generation = 0;
  Done done;
  HealthResult result;
  SteadyClock::time_point began{};
  bool builtin_pending = false;
  bool command_pending = false;
  bool pipe_open = false;
  pid_t pid = -1;
  std::deque<std::string> tail;
  std::string partial;
  std::shared_ptr<Mailbox> mailbox;
  char buffer[4096];
};

HealthCheck::HealthCheck(asio::io_context& io, ProcessLauncher& launcher,
                         HealthCheckOptions options)
    : impl_(std::make_shared<Impl>(io, launcher, std::move(options))) {}

HealthCheck::~HealthCheck() {
  if (impl_->pid > 0) (void)impl_->launcher.signalWorker(impl_->pid, true, SIGKILL);
}

bool HealthCheck::enabled() const {
  return !impl_->opts.command.empty() || static_cast<bool>(impl_->opts.builtin);
}

void HealthCheck::run(int attempt, Done done) { impl_->run(attempt, std::move(done)); }

bool HealthCheck::onChildExit(pid_t pid, int wait_status) {
  return impl_->onChildExit(pid, wait_status);
}

}  // namespace cpprun::agent
