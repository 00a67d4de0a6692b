#include "agent/worker_output.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/asio.h"
#include "common/logging.h"

namespace cpprun::agent {

namespace asio = boost::asio;

void LineSplitter::feed(std::string_view data,
                        const std::function<void(std::string_view)>& on_line) {
  while (!data.empty()) {
    size_t newline = data.find('\n');
    size_t room = max_line_bytes_ - partial_.size();
    if (newline == std::string_view::npos || newline > room) {
      if (data.size() < room) {
        partial_.append(data);
        return;
      }
      // Over the line limit: emit a full-size piece and go on.
      partial_.append(data.substr(0, room));
      on_line(partial_);
      partial_.clear();
      data.remove_prefix(room);
      continue;
    }
    if (partial_.empty()) {
      on_line(data.substr(0, newline));
    } else {
      partial_.append(data.substr(0, newline));
      on_line(partial_);
      partial_.clear();
    }
    data.remove_prefix(newline + 1);
  }
}

void LineSplitter::finish(const std::function<void(std::string_view)>& on_line) {
  if (partial_.empty()) return;
  on_line(partial_);
  partial_.clear();
}

namespace {

int modeFor(const std::map<int, int>& by_rank, int fallback, int local_rank) {
  auto it = by_rank.find(local_rank);
  return it == by_rank.end() ? fallback : it->second;
}

std::string substitute(std::string text, const std::string& token, const std::string& value) {
  for (size_t pos = text.find(token); pos != std::string::npos;
       pos = text.find(token, pos + value.size())) {
    text.replace(pos, token.size(), value);
  }
  return text;
}

// Writes everything or gives up on a broken console (logged once by the caller's errno).
bool writeAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n > 0) {
      data += n;
      size -= static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 1000);
    } else {
      return false;
    }
  }
  return true;
}

}  // namespace

WorkerOutputPlan planWorkerOutput(const OutputOptions& options, int local_rank, int rank,
                                  const std::string& rank_dir) {
  int redirect = modeFor(options.redirects_by_rank, options.redirects_default, local_rank);
  int tee = modeFor(options.tee_by_rank, options.tee_default, local_rank);
  bool shown = options.local_ranks_filter.empty() ||
               std::find(options.local_ranks_filter.begin(), options.local_ranks_filter.end(),
                         local_rank) != options.local_ranks_filter.end();
  std::string prefix = options.prefix_template;
  prefix = substitute(prefix, "${role_name}", options.role_name);
  prefix = substitute(prefix, "${local_rank}", std::to_string(local_rank));
  prefix = substitute(prefix, "${rank}", std::to_string(rank));
  if (prefix.find("${hostname}") != std::string::npos) {
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    prefix = substitute(prefix, "${hostname}", host);
  }

  auto route = [&](int bit, int console_fd, const char* file_name) {
    StreamRoute r;
    r.console_fd = console_fd;
    r.prefix = prefix;
    bool redirected = (redirect & bit) != 0;
    bool teed = (tee & bit) != 0;
    r.to_console = shown && (teed || !redirected);
    if ((redirected || teed) && !rank_dir.empty()) r.file = rank_dir + "/" + file_name;
    return r;
  };
  WorkerOutputPlan plan;
  plan.out = route(1, options.console_stdout_fd, "stdout.log");
  plan.err = route(2, options.console_stderr_fd, "stderr.log");
  return plan;
}

bool anyRedirect(const OutputOptions& options) {
  if (options.redirects_default != 0 || options.tee_default != 0) return true;
  for (const auto& kv : options.redirects_by_rank) {
    if (kv.second != 0) return true;
  }
  for (const auto& kv : options.tee_by_rank) {
    if (kv.second != 0) return true;
  }
  return false;
}

struct WorkerOutput::Impl : std::enable_shared_from_this<WorkerOutput::Impl> {
  Impl(asio::io_context& io, int fd, StreamRoute r, size_t tail_lines, std::function<void()> cb)
      : pipe(io, fd), route(std::move(r)), tail_limit(tail_lines), on_eof(std::move(cb)) {}

  void read() {
    pipe.async_read_some(asio::buffer(buffer, sizeof buffer),
                         [self = shared_from_this()](const boost::system::error_code& ec,
                                                     size_t n) { self->onRead(ec, n); });
  }

  void onRead(const boost::system::error_code& ec, size_t n) {
    if (closed) return;
    if (n > 0) consume(std::string_view(buffer, n));
    if (ec) {
      finish();
      return;
    }
    read();
  }

  void consume(std::string_view data) {
    bytes_read += data.size();
    if (file_fd >= 0 && !writeAll(file_fd, data.data(), data.size())) {
      CPPRUN_LOG(kWarn) << "cannot write " << route.file << ": " << std::strerror(errno)
                        << "; its output goes to the console only from now on";
      ::close(file_fd);
      file_fd = -1;
      route.to_console = true;
    }
    splitter.feed(data, [this](std::string_view line) { addLine(line); });
    flushConsole();
  }

  void addLine(std::string_view line) {
    if (route.to_console) {
      console.append(route.prefix);
      console.append(line);
      console.push_back('\n');
    }
    if (tail_limit > 0) {
      if (tail.size() == tail_limit) tail.pop_front();
      tail.emplace_back(line);
    }
  }

  void flushConsole() {
    if (console.empty()) return;
    if (!writeAll(route.console_fd, console.data(), console.size()) && !console_broken) {
      console_broken = true;  // e.g. the terminal went away; files and tails keep working
    }
    console.clear();
  }

  void finish() {
    if (closed) return;
    splitter.finish([this](std::string_view line) { addLine(line); });
    flushConsole();
    closed = true;
    boost::system::error_code ignored;
    pipe.close(ignored);
    if (file_fd >= 0) ::close(file_fd);
    file_fd = -1;
    if (on_eof) {
      auto cb = std::move(on_eof);
      on_eof = nullptr;
      cb();
    }
  }

  asio::posix::stream_descriptor pipe;
  StreamRoute route;
  size_t tail_limit;
  std::function<void()> on_eof;
  int file_fd = -1;
  LineSplitter splitter;
  std::string console;
  std::deque<std::string> tail;
  uint64_t bytes_read = 0;
  bool closed = false;
  bool console_broken = false;
  char buffer[16 * 1024];
};

Result<std::unique_ptr<WorkerOutput>> WorkerOutput::create(asio::io_context& io, int read_fd,
                                                           StreamRoute route, size_t tail_lines,
                                                           std::function<void()> on_eof) {
  int file_fd = -1;
  if (!route.file.empty()) {
    file_fd = ::open(route.file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (file_fd < 0) {
      int err = errno;
      ::close(read_fd);
      return invalidArgument("cannot create log file " + route.file + ": " + std::strerror(err));
    }
  }
  auto impl = std::make_shared<Impl>(io, read_fd, std::move(route), tail_lines, std::move(on_eof));
  impl->file_fd = file_fd;
  return std::unique_ptr<WorkerOutput>(new WorkerOutput(std::move(impl)));
}

WorkerOutput::WorkerOutput(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
WorkerOutput::~WorkerOutput() {
  impl_->on_eof = nullptr;
  impl_->finish();
}
void WorkerOutput::start() { impl_->read(); }
void WorkerOutput::close() { impl_->finish(); }
bool WorkerOutput::atEof() const { return impl_->closed; }
std::vector<std::string> WorkerOutput::tail() const {
  return std::vector<std::string>(impl_->tail.begin(), impl_->tail.end());
}
uint64_t WorkerOutput::bytesRead() const { return impl_->bytes_read; }

}  // namespace cpprun::agent
