#include "agent/supervision/file_timer_server.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "agent/processes/process_launcher.h"
#include "common/asio.h"
#include "common/clip.h"
#include "common/logging.h"

namespace cpprun::agent {

namespace asio = boost::asio;

namespace {

// The longest wait armed for an expiry: a wall-clock step (NTP) moves expirations, so the
// server looks again at least this often while timers are armed.
constexpr std::chrono::seconds kMaxExpiryWait{10};
// Generations of parents followed from a request's pid to a worker.
constexpr int kMaxGenerations = 64;

double systemNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string singleQuoted(std::string_view text) { return "'" + clipValue(text) + "'"; }

}  // namespace

Result<FileTimerRequest> parseFileTimerRequest(std::string_view line) {
  using Json = nlohmann::json;
  Json doc = Json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return invalidArgument("not JSON: " + singleQuoted(line));
  if (!doc.is_object()) return invalidArgument("not a JSON object: " + singleQuoted(line));
  FileTimerRequest r;
  if (auto v = doc.find("version"); v != doc.end()) {
    if (!v->is_number_integer()) return invalidArgument("\"version\" is not an integer");
    r.version = v->get<int64_t>();
  }
  auto pid = doc.find("pid");
  if (pid == doc.end() || !pid->is_number_integer()) {
    return invalidArgument("\"pid\" is missing or not an integer");
  }
  const int64_t pid_value = pid->get<int64_t>();
  if (pid_value <= 0 || pid_value > INT32_MAX) {
    return invalidArgument("\"pid\" " + std::to_string(pid_value) + " is not a process id");
  }
  r.pid = static_cast<pid_t>(pid_value);
  auto scope = doc.find("scope_id");
  if (scope == doc.end() || !scope->is_string()) {
    return invalidArgument("\"scope_id\" is missing or not a string");
  }
  r.scope_id = scope->get<std::string>();
  auto expiration = doc.find("expiration_time");
  if (expiration == doc.end() || !expiration->is_number() ||
      !std::isfinite(expiration->get<double>())) {
    return invalidArgument("\"expiration_time\" is missing or not a number");
  }
  r.expiration_time = expiration->get<double>();
  auto signo = doc.find("signal");
  if (signo == doc.end() || !signo->is_number_integer()) {
    return invalidArgument("\"signal\" is missing or not an integer");
  }
  const int64_t signal_value = signo->get<int64_t>();
  if (signal_value > 64 || signal_value < -64) {
    return invalidArgument("\"signal\" " + std::to_string(signal_value) + " is not a signal");
  }
  r.signal = static_cast<int>(signal_value);
  return r;
}

void FileTimerTable::apply(const FileTimerRequest& request, size_t worker, double now) {
  auto key = std::make_pair(request.pid, request.scope_id);
  if (request.release()) {
    timers_.erase(key);
    return;
  }
  timers_[key] = Timer{request, worker, now};
}

std::optional<double> FileTimerTable::earliest() const {
  std::optional<double> first;
  for (const auto& [key, timer] : timers_) {
    if (!first || timer.request.expiration_time < *first) first = timer.request.expiration_time;
  }
  return first;
}

std::vector<FileTimerTable::Expired> FileTimerTable::takeExpired(double now) {
  std::map<pid_t, Expired> by_pid;
  for (const auto& [key, timer] : timers_) {
    if (timer.request.expiration_time > now) continue;
    Expired& e = by_pid[key.first];
    e.pid = key.first;
    e.worker = timer.worker;
    e.timers.push_back(timer);
  }
  std::vector<Expired> expired;
  for (auto& [pid, e] : by_pid) {
    std::stable_sort(e.timers.begin(), e.timers.end(), [](const Timer& a, const Timer& b) {
      return a.request.expiration_time < b.request.expiration_time;
    });
    for (const Timer& t : e.timers) {
      if (t.request.signal > 0) {
        e.reap = t;
        break;
      }
    }
    dropPid(pid);
    expired.push_back(std::move(e));
  }
  return expired;
}

void FileTimerTable::dropWorker(size_t worker) {
  for (auto it = timers_.begin(); it != timers_.end();) {
    it = it->second.worker == worker ? timers_.erase(it) : std::next(it);
  }
}

void FileTimerTable::dropPid(pid_t pid) {
  for (auto it = timers_.begin(); it != timers_.end();) {
    it = it->first.first == pid ? timers_.erase(it) : std::next(it);
  }
}

std::optional<size_t> findOwner(pid_t pid, const std::vector<pid_t>& roots) {
  pid_t p = pid;
  for (int generation = 0; generation < kMaxGenerations && p > 1; ++generation) {
    for (size_t i = 0; i < roots.size(); ++i) {
      if (roots[i] > 0 && roots[i] == p) return i;
    }
    p = parentOf(p);
  }
  return std::nullopt;
}

class FileTimerServer::Impl : public std::enable_shared_from_this<FileTimerServer::Impl> {
 public:
  Impl(asio::io_context& io, std::string path, Callbacks callbacks)
      : io_(io), path_(std::move(path)), callbacks_(std::move(callbacks)), timer_(io) {}

  ~Impl() { close(); }

  double now() const { return callbacks_.now ? callbacks_.now() : systemNow(); }

  Status open() {
    if (reader_) return Status::ok();
    struct stat st {};
    if (::lstat(path_.c_str(), &st) == 0) {
      if (!S_ISFIFO(st.st_mode)) {
        return invalidArgument("TORCHELASTIC_TIMER_FILE " + path_ +
                               " exists and is not a named pipe; cpprun does not replace it");
      }
      ::unlink(path_.c_str());  // a FIFO left by an earlier run, as torch's server does
    }
    if (::mkfifo(path_.c_str(), 0600) != 0) {
      return invalidArgument("cannot create the FileTimer pipe " + path_ + ": " +
                             std::strerror(errno));
    }
    const int read_fd = ::open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (read_fd < 0) {
      const int err = errno;
      ::unlink(path_.c_str());
      return internalError("cannot open the FileTimer pipe " + path_ + ": " + std::strerror(err));
    }
    // With a write end of its own open, the read end never reports EOF when a client closes.
    write_fd_ = ::open(path_.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (write_fd_ < 0) {
      const int err = errno;
      ::close(read_fd);
      ::unlink(path_.c_str());
      return internalError("cannot open the FileTimer pipe " + path_ +
                           " for writing: " + std::strerror(err));
    }
    reader_ = std::make_unique<asio::posix::stream_descriptor>(io_, read_fd);
    created_ = true;
    CPPRUN_LOG(kInfo) << "FileTimer watchdog: serving torch's FileTimerClient on " << path_;
    readMore();
    return Status::ok();
  }

  void close() {
    timer_.cancel();
    table_.clear();
    accepting_ = false;
    if (reader_) {
      boost::system::error_code ignored;
      reader_->cancel(ignored);
      reader_->close(ignored);
      reader_.reset();
    }
    if (write_fd_ >= 0) {
      ::close(write_fd_);
      write_fd_ = -1;
    }
    if (created_) {
      ::unlink(path_.c_str());
      created_ = false;
    }
  }

  void beginAttempt() {
    table_.clear();
    timer_.cancel();
    accepting_ = true;
    logged_ = 0;
    unlogged_ = 0;
  }

  void endAttempt() {
    accepting_ = false;
    table_.clear();
    timer_.cancel();
    if (unlogged_ > 0) {
      CPPRUN_LOG(kWarn) << "FileTimer: " << unlogged_
                        << " more bad request(s) this attempt were dropped without a log line";
      unlogged_ = 0;
    }
  }

  void workerExited(size_t worker) {
    table_.dropWorker(worker);
    arm();
  }

  void readMore() {
    if (!reader_) return;
    reader_->async_read_some(
        asio::buffer(buffer_),
        [weak = weak_from_this()](const boost::system::error_code& ec, size_t n) {
          auto self = weak.lock();
          if (!self || !self->reader_) return;
          if (ec) {
            if (ec != asio::error::operation_aborted) {
              CPPRUN_LOG(kError) << "FileTimer: reading " << self->path_
                                 << " failed: " << ec.message() << "; the watchdog stops";
            }
            return;
          }
          self->consume(std::string_view(self->buffer_.data(), n));
          self->readMore();
        });
  }

  // Splits what arrived into lines; a line longer than the bound is dropped whole.
  void consume(std::string_view data) {
    while (!data.empty()) {
      const size_t newline = data.find('\n');
      const std::string_view piece = data.substr(0, newline);
      if (!oversized_) {
        if (line_.size() + piece.size() > kMaxFileTimerLineBytes) {
          oversized_ = true;
          line_.clear();
        } else {
          line_.append(piece);
        }
      }
      if (newline == std::string_view::npos) return;
      data.remove_prefix(newline + 1);
      if (oversized_) {
        refuse("a request longer than " + std::to_string(kMaxFileTimerLineBytes) +
               " bytes (torch's FileTimerClient writes at most PIPE_BUF)");
        oversized_ = false;
      } else if (!line_.empty()) {
        handleLine(line_);
      }
      line_.clear();
    }
  }

  void refuse(const std::string& why) {
    ++refused_;
    if (!accepting_) return;  // between attempts every request is ignored anyway
    if (logged_ < kMaxFileTimerLogs) {
      ++logged_;
      CPPRUN_LOG(kWarn) << "FileTimer: dropped " << why;
    } else {
      ++unlogged_;
    }
  }

  void handleLine(const std::string& line) {
    auto request = parseFileTimerRequest(line);
    if (!request.isOk()) {
      refuse("a malformed request from " + path_ + ": " + request.status().message());
      return;
    }
    ++requests_;
    if (!accepting_) return;
    const FileTimerRequest& r = request.value();
    std::optional<size_t> worker = callbacks_.owner ? callbacks_.owner(r.pid) : std::nullopt;
    if (!worker) {
      refuse("a request for pid " + std::to_string(r.pid) + " (scope " + singleQuoted(r.scope_id) +
             "): not a worker of this agent nor a descendant of one");
      return;
    }
    table_.apply(r, *worker, now());
    arm();
  }

  void arm() {
    auto earliest = table_.earliest();
    if (!earliest) {
      timer_.cancel();
      return;
    }
    const double wait_s = std::clamp(*earliest - now(), 0.0, double(kMaxExpiryWait.count()));
    timer_.expires_after(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(wait_s)));
    timer_.async_wait([weak = weak_from_this()](const boost::system::error_code& ec) {
      auto self = weak.lock();
      if (!self || ec) return;
      self->onTimer();
    });
  }

  void onTimer() {
    const double seen = now();
    for (FileTimerTable::Expired& e : table_.takeExpired(seen)) {
      std::string scopes;
      for (const auto& t : e.timers)
        scopes += (scopes.empty() ? "" : ", ") + singleQuoted(t.request.scope_id);
      if (!e.reap) {
        CPPRUN_LOG(kWarn) << "FileTimer: pid " << e.pid << ": scope(s) " << scopes
                          << " expired with no signal requested; not reaping it (as torch)";
        continue;
      }
      // The pid may have gone (and its number been reused) since the request: ask again.
      auto owner = callbacks_.owner ? callbacks_.owner(e.pid) : std::nullopt;
      if (!owner || *owner != e.worker) {
        CPPRUN_LOG(kInfo) << "FileTimer: pid " << e.pid << ": scope(s) " << scopes
                          << " expired, but the pid is no longer the worker's; skipped";
        continue;
      }
      Expiry expiry;
      expiry.worker = e.worker;
      expiry.pid = e.pid;
      expiry.scope_id = e.reap->request.scope_id;
      expiry.signal = e.reap->request.signal;
      expiry.armed_at = e.reap->armed_at;
      expiry.expiration_time = e.reap->request.expiration_time;
      expiry.seen_at = seen;
      for (const auto& t : e.timers) expiry.scopes.push_back(t.request.scope_id);
      const int rc =
          callbacks_.kill ? callbacks_.kill(e.pid, expiry.signal) : ::kill(e.pid, expiry.signal);
      if (rc != 0 && errno != ESRCH) expiry.kill_error = std::strerror(errno);
      CPPRUN_LOG(kWarn) << "FileTimer: pid " << e.pid << ": scope(s) " << scopes
                        << " expired; sent signal " << expiry.signal
                        << (expiry.kill_error.empty() ? ""
                                                      : " (failed: " + expiry.kill_error + ")");
      if (callbacks_.on_expired) callbacks_.on_expired(expiry);
    }
    arm();
  }

  asio::io_context& io_;
  std::string path_;
  Callbacks callbacks_;
  asio::steady_timer timer_;
  std::unique_ptr<asio::posix::stream_descriptor> reader_;
  int write_fd_ = -1;
  bool created_ = false;
  bool accepting_ = false;
  std::array<char, 8192> buffer_{};
  std::string line_;
  bool oversized_ = false;
  FileTimerTable table_;
  uint64_t requests_ = 0;
  uint64_t refused_ = 0;
  int logged_ = 0;
  uint64_t unlogged_ = 0;
};

FileTimerServer::FileTimerServer(asio::io_context& io, std::string path, Callbacks callbacks)
    : impl_(std::make_shared<Impl>(io, std::move(path), std::move(callbacks))) {}
FileTimerServer::~FileTimerServer() { impl_->close(); }
Status FileTimerServer::open() { return impl_->open(); }
void FileTimerServer::close() { impl_->close(); }
void FileTimerServer::beginAttempt() { impl_->beginAttempt(); }
void FileTimerServer::endAttempt() { impl_->endAttempt(); }
void FileTimerServer::workerExited(size_t worker) { impl_->workerExited(worker); }
const std::string& FileTimerServer::path() const { return impl_->path_; }
size_t FileTimerServer::armedTimers() const { return impl_->table_.size(); }
uint64_t FileTimerServer::requestsTotal() const { return impl_->requests_; }
uint64_t FileTimerServer::refusedTotal() const { return impl_->refused_; }

}  // namespace cpprun::agent
