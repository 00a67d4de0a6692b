#include "agent/console/worker_output.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>

#include "common/asio.h"
#include "common/clip.h"
#include "common/logging.h"

namespace cpprun::agent {

namespace asio = boost::asio;

void LineSplitter::feed(std::string_view data,
                        const std::function<void(std::string_view)>& on_line) {
  feed(data, on_line, nullptr);
}

void LineSplitter::endLine(const std::function<void(std::string_view)>& on_line) {
  // "50%\r100%\r\n" and "abc\r\r\n": the last state the line showed.
  cut_ = false;
  if (partial_.empty() && saw_cr_) {
    on_line(last_update_);
  } else {
    on_line(partial_);
  }
  partial_.clear();
  last_update_.clear();
  saw_cr_ = false;
}

void LineSplitter::carriageReturn(const std::function<void(std::string_view)>& on_update) {
  if (!partial_.empty()) {
    if (on_update) on_update(partial_);
    last_update_.swap(partial_);
    partial_.clear();
  }
  saw_cr_ = true;
}

void LineSplitter::feed(std::string_view data, const std::function<void(std::string_view)>& on_line,
                        const std::function<void(std::string_view)>& on_update) {
  if (pending_cr_ && !data.empty()) {
    pending_cr_ = false;
    if (data.front() == '\n') {
      data.remove_prefix(1);
      endLine(on_line);
    } else {
      carriageReturn(on_update);
    }
  }
  while (!data.empty()) {
    const size_t end = data.find_first_of("\r\n");
    const size_t room = max_line_bytes_ - partial_.size();
    if (end == std::string_view::npos || end > room) {
      if (data.size() < room) {
        partial_.append(data);
        return;
      }
      // Over the line limit: emit a full-size piece and go on.
      partial_.append(data.substr(0, room));
      cut_ = true;
      on_line(partial_);
      partial_.clear();
      last_update_.clear();
      saw_cr_ = false;
      data.remove_prefix(room);
      continue;
    }
    partial_.append(data.substr(0, end));
    const char what = data[end];
    data.remove_prefix(end + 1);
    if (what == '\n') {
      endLine(on_line);
    } else if (data.empty()) {
      pending_cr_ = true;  // "\r\n" split across reads: decided by the next byte
    } else if (data.front() == '\n') {
      data.remove_prefix(1);
      endLine(on_line);
    } else {
      carriageReturn(on_update);
    }
  }
}

void LineSplitter::finish(const std::function<void(std::string_view)>& on_line) {
  if (pending_cr_) {
    pending_cr_ = false;
    carriageReturn(nullptr);
  }
  if (partial_.empty() && (!saw_cr_ || last_update_.empty())) {
    saw_cr_ = false;
    return;
  }
  endLine(on_line);
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

  auto route = [&](int bit, int console_fd, const char* file_name, bool terminal, bool pty) {
    StreamRoute r;
    r.console_fd = console_fd;
    r.prefix = prefix;
    bool redirected = (redirect & bit) != 0;
    bool teed = (tee & bit) != 0;
    r.to_console = shown && (teed || !redirected);
    r.filterable = shown && teed;
    if ((redirected || teed) && !rank_dir.empty()) r.file = rank_dir + "/" + file_name;
    r.terminal = terminal;
    // A stream that reaches no console (redirected only, filtered out) is a pipe, as a
    // redirected stream is a file under torchrun.
    r.pty = pty && r.to_console;
    return r;
  };
  WorkerOutputPlan plan;
  plan.out = route(1, options.console_stdout_fd, "stdout.log", options.console_stdout_terminal,
                   options.stdout_pty);
  plan.err = route(2, options.console_stderr_fd, "stderr.log", options.console_stderr_terminal,
                   options.stderr_pty);
  return plan;
}

bool anyRedirect(const OutputOptions& options) {
  if (options.redirects_default != 0 || options.tee_default != 0) return true;
  if (!options.duplicate_stdout_filters.empty() || !options.duplicate_stderr_filters.empty()) {
    return true;
  }
  for (const auto& kv : options.redirects_by_rank) {
    if (kv.second != 0) return true;
  }
  for (const auto& kv : options.tee_by_rank) {
    if (kv.second != 0) return true;
  }
  return false;
}

namespace {

bool sameFile(int a, int b) {
  if (a == b) return true;
  struct stat sa {};
  struct stat sb {};
  return ::fstat(a, &sa) == 0 && ::fstat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

}  // namespace

OutputSinks::OutputSinks(int console_stdout_fd, int console_stderr_fd)
    : stderr_fd_(console_stderr_fd), stdout_writer_(std::make_unique<OutputWriter>()) {
  if (!sameFile(console_stdout_fd, console_stderr_fd)) {
    stderr_writer_ = std::make_unique<OutputWriter>();
  }
  // Log files are not given up on at exit as the console is: they must lose nothing.
  files_.setExitFlushBound(kFileExitFlush);
}

OutputWriter& OutputSinks::console(int fd) {
  return fd == stderr_fd_ && stderr_writer_ ? *stderr_writer_ : *stdout_writer_;
}

void OutputSinks::writeLog(std::string line) {
  OutputWriter& w = console(stderr_fd_);
  if (log_queued_->load() + line.size() > kLogBytesWaiting ||
      w.queuedBytes() + line.size() > kConsoleBytesPerSink) {
    ++dropped_log_lines;
    return;
  }
  std::lock_guard<std::mutex> lock(console_mutex_);
  uint64_t& open = &w == stdout_writer_.get() ? stdout_open_ : stderr_open_;
  if (open != 0) line.insert(0, "\n");
  open = 0;
  w.write(stderr_fd_, std::move(line), log_queued_);
}

void OutputSinks::writeReport(std::string text) {
  OutputWriter& w = console(stderr_fd_);
  std::lock_guard<std::mutex> lock(console_mutex_);
  uint64_t& open = &w == stdout_writer_.get() ? stdout_open_ : stderr_open_;
  if (open != 0) text.insert(0, "\n");
  open = 0;
  w.write(stderr_fd_, std::move(text));
}

void OutputSinks::writeConsole(int fd, uint64_t stream, const Compose& compose,
                               std::shared_ptr<std::atomic<size_t>> queued,
                               OutputWriter::Done done) {
  OutputWriter& w = console(fd);
  std::lock_guard<std::mutex> lock(console_mutex_);
  uint64_t& open = &w == stdout_writer_.get() ? stdout_open_ : stderr_open_;
  bool leave_open = false;
  std::string bytes = compose(open, leave_open);
  if (open != 0 && open != stream) bytes.insert(0, "\n");
  open = leave_open ? stream : 0;
  if (bytes.empty()) return;
  w.write(fd, std::move(bytes), std::move(queued), std::move(done));
}

OutputSinks::~OutputSinks() {
  if (routed_log_) setLogSink(nullptr);
}

void OutputSinks::routeLogHere() {
  setLogSink([this](std::string line) { writeLog(std::move(line)); });
  routed_log_ = true;
}

bool OutputSinks::close(std::chrono::milliseconds console_bound,
                        std::chrono::milliseconds file_bound) {
  const uint64_t dropped = dropped_console_lines.load();
  const uint64_t dropped_log = dropped_log_lines.load();
  if (dropped > 0 || dropped_log > 0) {
    CPPRUN_LOG(kWarn) << dropped << " worker line(s) and " << dropped_log
                      << " agent line(s) were not shown because the console did not keep up"
                      << " (log files, with --log-dir and -r/-t, keep every worker line)";
  }
  setLogSink(nullptr);
  routed_log_ = false;
  return stop(console_bound, file_bound);
}

void OutputSinks::attachLoop(asio::io_context* loop) {
  std::lock_guard<std::mutex> lock(loop_mutex_);
  loop_ = loop;
}

void OutputSinks::postToLoop(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(loop_mutex_);
  if (loop_ != nullptr) asio::post(*loop_, std::move(fn));
}

bool OutputSinks::flush(std::chrono::milliseconds bound) {
  bool done = files_.flush(bound);
  done = stdout_writer_->flush(bound) && done;
  if (stderr_writer_) done = stderr_writer_->flush(bound) && done;
  return done;
}

bool OutputSinks::stop(std::chrono::milliseconds console_bound,
                       std::chrono::milliseconds file_bound) {
  bool done = files_.stop(file_bound);
  done = stdout_writer_->stop(console_bound) && done;
  if (stderr_writer_) done = stderr_writer_->stop(console_bound) && done;
  return done;
}

Result<std::shared_ptr<FilteredCopy>> FilteredCopy::create(const std::string& path,
                                                           std::vector<std::string> filters,
                                                           std::shared_ptr<OutputSinks> sinks) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return invalidArgument("cannot create log file " + path + ": " + std::strerror(errno));
  }
  return std::shared_ptr<FilteredCopy>(
      new FilteredCopy(fd, path, std::move(filters), std::move(sinks)));
}

FilteredCopy::FilteredCopy(int fd, std::string path, std::vector<std::string> filters,
                           std::shared_ptr<OutputSinks> sinks)
    : fd_(fd), path_(std::move(path)), filters_(std::move(filters)), sinks_(std::move(sinks)) {}

FilteredCopy::~FilteredCopy() { sinks_->files().closeAfterWrites(fd_); }

bool FilteredCopy::matches(std::string_view line) const {
  for (const std::string& filter : filters_) {
    if (line.find(filter) != std::string_view::npos) return true;
  }
  return false;
}

void FilteredCopy::write(std::string lines) {
  // The completion runs on the writer's thread: the warning is logged from the loop.
  std::weak_ptr<OutputSinks> weak_sinks = sinks_;
  sinks_->files().write(
      fd_, std::move(lines), nullptr, [failed = failed_, path = path_, weak_sinks](int error) {
        if (error == 0 || failed->exchange(true)) return;
        if (auto sinks = weak_sinks.lock()) {
          sinks->postToLoop([path, error] {
            CPPRUN_LOG(kWarn) << "cannot write " << path << ": " << std::strerror(error)
                              << "; lines after this one may be missing there";
          });
        }
      });
}

struct WorkerOutput::Impl : std::enable_shared_from_this<WorkerOutput::Impl> {
  Impl(asio::io_context& loop, int fd, StreamRoute r, size_t tail_lines, std::function<void()> cb,
       std::shared_ptr<OutputSinks> s)
      : pipe(loop, fd),
        stall_timer(loop),
        update_timer(loop),
        route(std::move(r)),
        tail_limit(tail_lines),
        on_eof(std::move(cb)),
        sinks(std::move(s)),
        id(sinks->newStreamId()) {}

  void read() {
    if (closed || reading) return;
    reading = true;
    pipe.async_read_some(asio::buffer(buffer, sizeof buffer),
                         [self = shared_from_this()](const boost::system::error_code& ec,
                                                     size_t n) { self->onRead(ec, n); });
  }

  void onRead(const boost::system::error_code& ec, size_t n) {
    reading = false;
    if (closed) return;
    if (n > 0) consume(std::string_view(buffer, n));
    if (ec) {
      finish();
      return;
    }
    if (!dropping && console_queued->load() > kConsoleBytesPerStream &&
        consoleWriter().stalledFor() >= kConsoleStall) {
      dropping = true;  // the console is stalled, not slow: the worker runs on
    }
    if (mustWait()) {
      paused = true;
      armStallCheck();
      return;
    }
    read();
  }

  OutputWriter& consoleWriter() { return sinks->console(route.console_fd); }
  // The log file lags: leave the rest in the pipe until the file writer catches up.
  bool fileLags() const { return file_fd >= 0 && file_queued->load() > kFileBytesPerStream; }
  // The console is slow (not stalled): its worker waits.
  bool consoleWaits() const { return !dropping && console_queued->load() > kConsoleBytesPerStream; }
  bool mustWait() const { return fileLags() || consoleWaits(); }

  void resumeIfCaughtUp() {
    if (!paused || closed) return;
    if (file_fd >= 0 && file_queued->load() > kFileBytesPerStream / 2) return;
    if (waitsOnConsole()) return;
    paused = false;
    stall_timer.cancel();
    read();
  }

  // While the stream waits with more than half its console budget queued (it resumes only
  // below half): if the console then takes nothing for kConsoleStall, it is stalled, and the
  // stream is read again in dropping mode. Without this check a stream paused between half and
  // all of its budget behind a stalled console would wait for ever.
  bool waitsOnConsole() const {
    return !dropping && console_queued->load() > kConsoleBytesPerStream / 2;
  }

  void armStallCheck() {
    if (!waitsOnConsole()) return;  // what it waits for is the file: its writes resume it
    const auto stalled = consoleWriter().stalledFor();
    stall_timer.expires_after(stalled >= kConsoleStall ? std::chrono::milliseconds(0)
                                                       : kConsoleStall - stalled);
    stall_timer.async_wait([weak = weak_from_this()](const boost::system::error_code& ec) {
      auto self = weak.lock();
      if (!self || ec || !self->paused || self->closed || !self->waitsOnConsole()) return;
      if (self->consoleWriter().stalledFor() < kConsoleStall) {
        self->armStallCheck();
        return;
      }
      self->dropping = true;
      self->resumeIfCaughtUp();
    });
  }

  void consume(std::string_view data) {
    bytes_read += data.size();
    if (file_fd >= 0) writeFile(data);
    splitter.feed(
        data, [this](std::string_view line) { addLine(line); }, nullptr);
    showUnfinishedLine();
    flushConsole();
    flushFiltered();
  }

  void flushFiltered() {
    if (filtered.empty()) return;
    route.filtered->write(std::move(filtered));
    filtered.clear();
  }

  // The unfinished line's state: the text after its last '\r', else its last update.
  std::string_view unfinishedText() const {
    return splitter.pending().empty() && splitter.pendingIsUpdate() ? splitter.lastUpdate()
                                                                    : splitter.pending();
  }

  // What the console shows of a line not ended yet (docs/supervision.md, "Console"): on a
  // terminal a prompt (no '\r' in it) at once, as an open line; a progress update ('\r') at most
  // once per kProgressUpdateInterval, as an open line on a terminal and as a line of its own
  // elsewhere (the latest state within the interval, by the update timer).
  void showUnfinishedLine() {
    if (!route.to_console || closed) return;
    const std::string_view text = unfinishedText();
    if (text.empty()) return;
    if (!splitter.pendingIsUpdate()) {
      if (route.terminal) open_text = std::string(text);
      return;
    }
    if (text == last_update_shown) return;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_update_time < kProgressUpdateInterval) {
      if (!update_timer_armed) {
        update_timer_armed = true;
        update_timer.expires_at(last_update_time + kProgressUpdateInterval);
        update_timer.async_wait([weak = weak_from_this()](const boost::system::error_code& ec) {
          auto self = weak.lock();
          if (!self) return;
          self->update_timer_armed = false;
          if (ec || self->closed) return;
          self->showUnfinishedLine();
          self->flushConsole();
        });
      }
      return;
    }
    last_update_time = now;
    last_update_shown = std::string(text);
    if (route.terminal) {
      open_text = last_update_shown;
    } else {
      appendConsoleLine(text);
    }
  }

  // A completion on a writer's thread, handed back to the loop.
  OutputWriter::Done backToLoop(void (Impl::*method)(int)) {
    return [weak = weak_from_this(), sinks = sinks, method](int error) {
      sinks->postToLoop([weak, method, error] {
        if (auto self = weak.lock()) ((*self).*method)(error);
      });
    };
  }

  void writeFile(std::string_view data) {
    sinks->files().write(file_fd, std::string(data), file_queued, backToLoop(&Impl::onFileWritten));
  }

  void onFileWritten(int error) {
    if (error != 0 && file_fd >= 0) {
      CPPRUN_LOG(kWarn) << "cannot write " << route.file << ": " << std::strerror(error)
                        << "; its output goes to the console only from now on";
      sinks->files().closeAfterWrites(file_fd);
      file_fd = -1;
      route.to_console = true;
    }
    resumeIfCaughtUp();
  }

  void onConsoleWritten(int) { resumeIfCaughtUp(); }

  void appendConsoleLine(std::string_view line) {
    if (console.empty()) first_text.assign(line);
    console.append(route.prefix);
    console.append(line);
    console.push_back('\n');
    ++console_lines;
  }

  void addLine(std::string_view line) {
    open_text.reset();  // the line it showed has ended
    // On a plain console the last update shown is a line of its own already: a line that ends
    // in that same state is not shown twice.
    const bool shown_as_update = !route.terminal && line == last_update_shown;
    last_update_shown.clear();
    if (route.to_console && !shown_as_update) appendConsoleLine(line);
    if (route.filtered && route.filtered->matches(line)) {
      filtered.append(route.prefix);
      filtered.append(line);
      filtered.push_back('\n');
    }
    if (tail_limit > 0) keepInTail(line);
  }

  // The pieces of a line cut at the splitter's bound are one line of the tail, of which only the
  // head is kept.
  void keepInTail(std::string_view line) {
    if (!tail_continues || tail.empty()) {
      if (tail.size() == tail_limit) tail.pop_front();
      tail.emplace_back();
    }
    // One byte past the bound: whether the cut splits a UTF-8 character shows (clipQuotedLine).
    TailLine& kept = tail.back();
    kept.bytes += line.size();
    if (kept.head.size() <= kTailLineBytes) {
      kept.head.append(line.substr(0, kTailLineBytes + 1 - kept.head.size()));
    }
    tail_continues = splitter.lastLineCut();
  }

  void flushConsole() {
    if (console.empty() && !open_text) return;
    OutputWriter& writer = consoleWriter();
    const bool stream_full = console_queued->load() + console.size() > kConsoleBytesPerStream;
    const bool sink_full = writer.queuedBytes() + console.size() > kConsoleBytesPerSink;
    if (dropping && !stream_full && writer.stalledFor() < kConsoleStall) dropping = false;
    if (sink_full || (dropping && stream_full)) {
      // The console is stalled: these lines are not shown (the tail and the files keep them).
      dropped_lines += console_lines;
      dropped_unreported += console_lines;
      sinks->dropped_console_lines += console_lines;
      console.clear();
      console_lines = 0;
      open_text.reset();
      return;
    }
    bool notice_first = false;
    if (dropped_unreported > 0) {
      std::string notice = route.prefix + "[cpprun: " + std::to_string(dropped_unreported) +
                           " line(s) not shown: the console did not keep up" +
                           (file_fd >= 0 ? "; " + route.file + " has every line" : "") + "]\n";
      console.insert(0, notice);
      dropped_unreported = 0;
      notice_first = true;
    }
    std::optional<std::string> open = std::move(open_text);
    open_text.reset();
    sinks->writeConsole(
        route.console_fd, id,
        [&](uint64_t open_stream, bool& leave_open) {
          const bool owned = open_stream == id && shown_open;
          // A notice goes first on a line of its own: the open line ends, to be shown again.
          if (owned && notice_first) return "\n" + compose(false, open, leave_open);
          return compose(owned, open, leave_open);
        },
        console_queued, backToLoop(&Impl::onConsoleWritten));
    shown_open = open.has_value();
    shown_text = open ? std::move(*open) : std::string();
    console.clear();
    console_lines = 0;
  }

  // The bytes for the console: the batch of whole lines, then the open line if any. When this
  // stream's open line is still the last thing on the console (`mine`), the batch's first line
  // (or the new open line) continues it: the new bytes only when it grew, else the whole line
  // again after '\r', with the old rest erased.
  std::string compose(bool mine, const std::optional<std::string>& open, bool& leave_open) {
    std::string out;
    std::string_view body = console;
    auto continueLine = [&](const std::string& text) {
      if (text.compare(0, shown_text.size(), shown_text) == 0) {
        out.append(text, shown_text.size(), std::string::npos);
      } else {
        out += "\r" + route.prefix + text + kEraseToEndOfLine;
      }
    };
    if (mine && !console.empty()) {
      continueLine(first_text);
      out.push_back('\n');
      body.remove_prefix(std::min(body.size(), route.prefix.size() + first_text.size() + 1));
      mine = false;
    }
    out.append(body);
    if (open) {
      if (mine) {
        continueLine(*open);
      } else {
        out += route.prefix + *open;
      }
      leave_open = true;
    }
    return out;
  }

  void finish() {
    if (closed) return;
    stall_timer.cancel();
    update_timer.cancel();
    open_text.reset();
    splitter.finish([this](std::string_view line) { addLine(line); });
    flushConsole();
    flushFiltered();
    route.filtered.reset();
    closed = true;
    boost::system::error_code ignored;
    pipe.close(ignored);
    if (file_fd >= 0) sinks->files().closeAfterWrites(file_fd);
    file_fd = -1;
    if (on_eof) {
      auto cb = std::move(on_eof);
      on_eof = nullptr;
      cb();
    }
  }

  asio::posix::stream_descriptor pipe;
  asio::steady_timer stall_timer;
  asio::steady_timer update_timer;
  StreamRoute route;
  size_t tail_limit;
  std::function<void()> on_eof;
  std::shared_ptr<OutputSinks> sinks;
  uint64_t id;  // this stream's, for OutputSinks::writeConsole
  int file_fd = -1;
  std::shared_ptr<std::atomic<size_t>> file_queued = std::make_shared<std::atomic<size_t>>(0);
  std::shared_ptr<std::atomic<size_t>> console_queued = std::make_shared<std::atomic<size_t>>(0);
  LineSplitter splitter;
  std::string console;     // whole lines, prefixed, for the next console write
  std::string first_text;  // the first of them, as read (unprefixed)
  size_t console_lines = 0;
  std::optional<std::string> open_text;  // the open line to show with the next write
  bool shown_open = false;               // this stream left an open line on the console,
  std::string shown_text;                // showing this (unprefixed)
  std::string last_update_shown;         // the progress state shown last
  std::chrono::steady_clock::time_point last_update_time;
  bool update_timer_armed = false;
  std::string filtered;  // matching lines for route.filtered, not yet queued
  uint64_t dropped_lines = 0;
  uint64_t dropped_unreported = 0;
  struct TailLine {
    std::string head;    // the first kTailLineBytes + 1 bytes
    uint64_t bytes = 0;  // the whole line's
  };
  std::deque<TailLine> tail;
  bool tail_continues = false;  // the next line continues tail.back() (it was cut)
  uint64_t bytes_read = 0;
  bool closed = false;
  bool reading = false;
  bool paused = false;    // not read: its log file lags, or the console is slow
  bool dropping = false;  // the console is stalled: new console lines are dropped
  char buffer[16 * 1024];
};

Result<std::unique_ptr<WorkerOutput>> WorkerOutput::create(asio::io_context& io, int read_fd,
                                                           StreamRoute route, size_t tail_lines,
                                                           std::function<void()> on_eof,
                                                           std::shared_ptr<OutputSinks> sinks) {
  int file_fd = -1;
  if (!route.file.empty()) {
    file_fd = ::open(route.file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (file_fd < 0) {
      int err = errno;
      ::close(read_fd);
      return invalidArgument("cannot create log file " + route.file + ": " + std::strerror(err));
    }
  }
  auto impl = std::make_shared<Impl>(io, read_fd, std::move(route), tail_lines, std::move(on_eof),
                                     std::move(sinks));
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
  std::vector<std::string> lines;
  lines.reserve(impl_->tail.size());
  for (const Impl::TailLine& t : impl_->tail) {
    lines.push_back(clipQuotedLine(t.head, kTailLineBytes, t.bytes));
  }
  return lines;
}
uint64_t WorkerOutput::bytesRead() const { return impl_->bytes_read; }
void WorkerOutput::resizeTerminal(const struct winsize& size) {
  if (!impl_->route.pty || impl_->closed) return;
  ::ioctl(impl_->pipe.native_handle(), TIOCSWINSZ, &size);
}
uint64_t WorkerOutput::droppedConsoleLines() const { return impl_->dropped_lines; }

}  // namespace cpprun::agent
