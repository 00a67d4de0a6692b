#include "agent/supervision/failure_report.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <sstream>
#include <utility>

#include "common/check.h"
#include "common/clip.h"

namespace cpprun::agent {
namespace {

constexpr size_t kMaxRuleWidth = 60;  // torchrun's cap on the '=' and '-' rules
constexpr const char* kNotAvailable = "<N/A>";
constexpr const char* kContinuationIndent = "    ";

std::string systemError(int err) { return std::strerror(err); }

// An epoch-seconds timestamp as torch writes it: an integer, or a decimal string ("1700000000").
std::optional<int64_t> parseTimestamp(const nlohmann::json& value) {
  int64_t seconds = 0;
  if (value.is_number_integer()) {
    seconds = value.get<int64_t>();
  } else if (value.is_number_float()) {
    seconds = static_cast<int64_t>(value.get<double>());
  } else if (value.is_string()) {
    const std::string& text = value.get_ref<const std::string&>();
    if (text.empty()) return std::nullopt;
    errno = 0;
    char* end = nullptr;
    long long parsed = std::strtoll(text.c_str(), &end, 10);
    if (errno != 0 || end != text.c_str() + text.size()) return std::nullopt;
    seconds = parsed;
  } else {
    return std::nullopt;
  }
  if (seconds <= 0) return std::nullopt;
  return seconds;
}

bool isBlank(const std::string& text) {
  return std::all_of(text.begin(), text.end(),
                     [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; });
}

// Strips trailing newlines and blanks (a Python traceback ends in "\n").
std::string trimRight(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ' ||
                           text.back() == '\t')) {
    text.pop_back();
  }
  return text;
}

std::vector<std::string> splitLines(const std::string& text) {
  std::vector<std::string> lines;
  std::string::size_type start = 0;
  while (true) {
    auto nl = text.find('\n', start);
    if (nl == std::string::npos) {
      lines.push_back(text.substr(start));
      return lines;
    }
    lines.push_back(text.substr(start, nl - start));
    start = nl + 1;
  }
}

// Display width in code points (UTF-8 continuation bytes do not count).
size_t displayWidth(const std::string& line) {
  return static_cast<size_t>(std::count_if(line.begin(), line.end(), [](char c) {
    return (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  }));
}

std::string formatLocalTime(std::chrono::system_clock::time_point time) {
  time_t seconds = std::chrono::system_clock::to_time_t(time);
  struct tm local {};
  if (::localtime_r(&seconds, &local) == nullptr) return kNotAvailable;
  char buf[64];
  size_t n = std::strftime(buf, sizeof(buf), "%Y-%m-%d_%H:%M:%S", &local);
  return std::string(buf, n);
}

int64_t epochSeconds(std::chrono::system_clock::time_point time) {
  return std::chrono::duration_cast<std::chrono::seconds>(time.time_since_epoch()).count();
}

// torchrun says only "To enable traceback see: <url>"; name the decorator as well.
constexpr const char* kNoErrorFileHint =
    " and no error file (for the Python traceback here, decorate main with "
    "@torch.distributed.elastic.multiprocessing.errors.record; see "
    "https://pytorch.org/docs/stable/elastic/errors.html)";

// Room for clipQuotedLine's "… (N bytes clipped)" after a head of kReportLineBytes: a line
// that long was clipped already (a WorkerOutput tail line) and is quoted as it is.
constexpr size_t kClipMarkerRoom = 48;

std::string quoted(const std::string& line) {
  if (line.size() <= kReportLineBytes + kClipMarkerRoom) return line;
  return clipQuotedLine(line, kReportLineBytes, line.size());
}

// The lines of `lines` from `first` on that fit in `budget` bytes as the report prints them
// (indented), newest kept, each quoted; a run left out is one line saying how many it had.
std::vector<std::string> newestWithin(const std::vector<std::string>& lines, size_t first,
                                      size_t budget, const char* what) {
  const size_t around = std::strlen(kContinuationIndent) + 1;  // the indent and the '\n'
  std::vector<std::string> kept;
  size_t used = 0;
  size_t i = lines.size();
  while (i > first) {
    std::string line = quoted(lines[i - 1]);
    if (used + line.size() + around > budget && !kept.empty()) break;
    used += line.size() + around;
    kept.push_back(std::move(line));
    --i;
  }
  if (i > first) {
    kept.push_back("\xE2\x80\xA6 (" + std::to_string(i - first) + " " + what + " left out)");
  }
  std::reverse(kept.begin(), kept.end());
  return kept;
}

// One "[idx]:" entry as lines, without a trailing newline.
std::vector<std::string> formatEntry(size_t idx, const std::string& host, const WorkerFailure& f) {
  std::vector<std::string> lines;
  lines.push_back("[" + std::to_string(idx) + "]:");
  lines.push_back("  time      : " + formatLocalTime(f.time));
  lines.push_back("  host      : " + (f.host.empty() ? host : f.host));
  lines.push_back("  rank      : " + std::to_string(f.rank) +
                  " (local_rank: " + std::to_string(f.local_rank) + ")");
  std::string exitcode =
      "  exitcode  : " + std::to_string(torchExitCode(f)) + " (pid: " + std::to_string(f.pid) + ")";
  if (f.unreaped) {
    exitcode = "  exitcode  : <not reaped> (pid: " + std::to_string(f.pid) + ") state " +
               (f.state == 0 ? std::string("?") : std::string(1, f.state)) + ", wchan " +
               (f.wchan.empty() ? std::string("-") : f.wchan) + ", still alive after SIGKILL";
  }
  if (f.signal > 0) exitcode += " " + signalName(f.signal);
  if (f.waiting) {
    exitcode += " (waiting: stopped by cpprun while it waited for the culprit)";
  } else if (f.teardown) {
    exitcode += " (stopped by cpprun during teardown)";
  }
  if (f.collateral) exitcode += " (collateral: failed after the root cause had stopped the job)";
  lines.push_back(std::move(exitcode));
  lines.push_back("  error_file: " +
                  (f.error_file.empty() ? std::string(kNotAvailable) : f.error_file));
  std::string shown = trimRight(f.traceback.empty() ? f.message : f.traceback);
  if (shown.empty()) shown = kNotAvailable;
  // The first line says why; the exception is at the end: both stay, the middle may go.
  const std::vector<std::string> shown_lines = splitLines(shown);
  const std::string reason = quoted(shown_lines.front());
  lines.push_back("  traceback : " + reason);
  const size_t room = kReportTracebackBytes - std::min(kReportTracebackBytes, reason.size() + 1);
  for (const std::string& line : newestWithin(shown_lines, 1, room, "lines")) {
    lines.push_back(kContinuationIndent + line);
  }
  if (!f.stderr_tail.empty()) {
    size_t n = f.stderr_tail.size();
    lines.push_back("  stderr (last " + std::to_string(n) + (n == 1 ? " line):" : " lines):"));
    for (const std::string& line :
         newestWithin(f.stderr_tail, 0, kReportTailBytes, "earlier lines")) {
      lines.push_back(kContinuationIndent + line);
    }
  }
  return lines;
}

Status writeAll(int fd, const std::string& data) {
  size_t written = 0;
  while (written < data.size()) {
    ssize_t n = ::write(fd, data.data() + written, data.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      return internalError(systemError(errno));
    }
    written += static_cast<size_t>(n);
  }
  return Status::ok();
}

}  // namespace

Result<ErrorFileContents> parseErrorFile(const std::string& path, const std::string& text) {
  ErrorFileContents contents;
  try {
    contents.raw = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    return invalidArgument("error file " + path + " is not valid JSON: " + e.what());
  }
  const nlohmann::json& doc = contents.raw;
  const std::string kShapes =
      R"( (expected {"message": {"message": "...", "extraInfo": {...}}} or )"
      R"({"message": "...", "timestamp": N}))";
  if (!doc.is_object()) {
    return invalidArgument("error file " + path + " is not a JSON object" + kShapes);
  }
  auto message = doc.find("message");
  if (message == doc.end()) {
    return invalidArgument("error file " + path + " has no \"message\"" + kShapes);
  }
  if (message->is_string()) {
    contents.message = message->get<std::string>();
    if (auto ts = doc.find("timestamp"); ts != doc.end()) {
      contents.timestamp_s = parseTimestamp(*ts);
    }
    return contents;
  }
  if (!message->is_object()) {
    return invalidArgument("error file " + path +
                           ": \"message\" is neither a string nor an object" + kShapes);
  }
  auto inner = message->find("message");
  if (inner == message->end() || !inner->is_string()) {
    return invalidArgument("error file " + path + ": \"message\" has no string \"message\"" +
                           kShapes);
  }
  contents.message = inner->get<std::string>();
  auto extra = message->find("extraInfo");
  if (extra != message->end() && extra->is_object()) {
    auto callstack = extra->find("py_callstack");
    if (callstack != extra->end() && callstack->is_string()) {
      contents.traceback = callstack->get<std::string>();
    }
    if (auto ts = extra->find("timestamp"); ts != extra->end()) {
      contents.timestamp_s = parseTimestamp(*ts);
    }
  }
  return contents;
}

Result<std::optional<ErrorFileContents>> readErrorFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::optional<ErrorFileContents>();
    return invalidArgument("cannot open error file " + path + ": " + systemError(errno));
  }
  std::string text;
  char buf[64 * 1024];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return invalidArgument("cannot read error file " + path + ": " + systemError(err));
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > kMaxErrorFileBytes) {
      ::close(fd);
      return invalidArgument("error file " + path + " is larger than " +
                             std::to_string(kMaxErrorFileBytes) + " bytes");
    }
  }
  ::close(fd);
  if (isBlank(text)) return std::optional<ErrorFileContents>();
  auto parsed = parseErrorFile(path, text);
  if (!parsed.isOk()) return parsed.status();
  return std::optional<ErrorFileContents>(std::move(parsed).value());
}

std::string signalName(int signo) {
  static const std::pair<int, const char*> kSignals[] = {
      {SIGHUP, "SIGHUP"},       {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"},
      {SIGILL, "SIGILL"},       {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"},
      {SIGBUS, "SIGBUS"},       {SIGFPE, "SIGFPE"},   {SIGKILL, "SIGKILL"},
      {SIGUSR1, "SIGUSR1"},     {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
      {SIGPIPE, "SIGPIPE"},     {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"},
#ifdef SIGSTKFLT
      {SIGSTKFLT, "SIGSTKFLT"},
#endif
      {SIGCHLD, "SIGCHLD"},     {SIGCONT, "SIGCONT"}, {SIGSTOP, "SIGSTOP"},
      {SIGTSTP, "SIGTSTP"},     {SIGTTIN, "SIGTTIN"}, {SIGTTOU, "SIGTTOU"},
      {SIGURG, "SIGURG"},       {SIGXCPU, "SIGXCPU"}, {SIGXFSZ, "SIGXFSZ"},
      {SIGVTALRM, "SIGVTALRM"}, {SIGPROF, "SIGPROF"}, {SIGWINCH, "SIGWINCH"},
      {SIGIO, "SIGIO"},
#ifdef SIGPWR
      {SIGPWR, "SIGPWR"},
#endif
      {SIGSYS, "SIGSYS"},
  };
  for (const auto& [number, name] : kSignals) {
    if (number == signo) return name;
  }
#if defined(SIGRTMIN) && defined(SIGRTMAX)
  if (signo >= SIGRTMIN && signo <= SIGRTMAX) {
    if (signo == SIGRTMIN) return "SIGRTMIN";
    if (signo == SIGRTMAX) return "SIGRTMAX";
    return "SIGRTMIN+" + std::to_string(signo - SIGRTMIN);
  }
#endif
  return "SIG" + std::to_string(signo);
}

std::string signalText(int signo, int pid) {
  return "Signal " + std::to_string(signo) + " (" + signalName(signo) + ") received by PID " +
         std::to_string(pid);
}

int torchExitCode(const WorkerFailure& failure) {
  return failure.signal > 0 ? -failure.signal : failure.exit_code;
}

WorkerFailure describeFailure(int local_rank, int rank, int pid, int wait_status,
                              std::chrono::system_clock::time_point observed,
                              const std::string& error_file_path,
                              std::vector<std::string> stderr_tail, bool teardown) {
  WorkerFailure f;
  f.local_rank = local_rank;
  f.rank = rank;
  f.pid = pid;
  f.time = observed;
  f.stderr_tail = std::move(stderr_tail);
  f.teardown = teardown;
  std::string status_text;  // how it ended, in words
  std::string hint;         // what to do about a missing error file
  if (WIFSIGNALED(wait_status)) {
    f.signal = WTERMSIG(wait_status);
    status_text = signalText(f.signal, pid);
  } else if (WIFEXITED(wait_status)) {
    f.exit_code = WEXITSTATUS(wait_status);
    status_text = "exit code " + std::to_string(f.exit_code);
    hint = kNoErrorFileHint;
  } else {
    // waitpid without WUNTRACED/WCONTINUED reports only exits and signals; say so if not.
    f.exit_code = -1;
    std::ostringstream os;
    os << "unrecognised wait status 0x" << std::hex << wait_status;
    status_text = os.str();
  }

  if (!error_file_path.empty()) {
    auto read = readErrorFile(error_file_path);
    if (!read.isOk()) {
      f.error_file = error_file_path;
      f.message = status_text + "; " + read.status().message();
    } else if (read.value().has_value()) {
      ErrorFileContents& contents = *read.value();
      f.error_file = error_file_path;
      f.message = std::move(contents.message);
      f.traceback = std::move(contents.traceback);
      if (contents.timestamp_s) {
        f.time = std::chrono::system_clock::time_point(std::chrono::seconds(*contents.timestamp_s));
      }
      f.error_document = std::move(contents.raw);
    }
  }
  if (f.message.empty()) f.message = status_text + hint;
  return f;
}

size_t rootCauseIndex(const std::vector<WorkerFailure>& failures) {
  CPPRUN_CHECK(!failures.empty());
  auto secondary = [](const WorkerFailure& f) { return f.teardown || f.collateral || f.waiting; };
  bool any_primary = std::any_of(failures.begin(), failures.end(),
                                 [&](const WorkerFailure& f) { return !secondary(f); });
  std::optional<size_t> best;
  for (size_t i = 0; i < failures.size(); ++i) {
    const WorkerFailure& f = failures[i];
    if (any_primary && secondary(f)) continue;
    if (!best || f.time < failures[*best].time ||
        (f.time == failures[*best].time && f.rank < failures[*best].rank)) {
      best = i;
    }
  }
  return *best;
}

std::string formatFailureReport(const std::string& entrypoint, const std::string& host,
                                const std::vector<WorkerFailure>& failures) {
  const std::string title = entrypoint + " FAILED";
  size_t width = displayWidth(title);

  // Entries are numbered in rank order, as torchrun numbers its rank-keyed failures.
  std::vector<size_t> order(failures.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return failures[a].rank < failures[b].rank; });

  std::optional<size_t> root;
  if (!failures.empty()) root = rootCauseIndex(failures);
  std::vector<std::string> root_lines;
  std::vector<std::string> other_lines;
  for (size_t idx = 0; idx < order.size(); ++idx) {
    std::vector<std::string> entry = formatEntry(idx, host, failures[order[idx]]);
    for (const std::string& line : entry) width = std::max(width, displayWidth(line));
    std::vector<std::string>& dest = (order[idx] == root) ? root_lines : other_lines;
    dest.insert(dest.end(), entry.begin(), entry.end());
  }
  if (other_lines.empty()) other_lines.push_back("  <NO_OTHER_FAILURES>");
  if (root_lines.empty()) root_lines.push_back("  <NO_FAILURES_RECORDED>");
  width = std::min(width, kMaxRuleWidth);

  const std::string border(width, '=');
  const std::string section(width, '-');
  std::string out;
  auto add = [&out](const std::string& line) {
    out += line;
    out += '\n';
  };
  add(border);
  add(title);
  add(section);
  add("Failures:");
  for (const std::string& line : other_lines) add(line);
  add(section);
  add("Root Cause (first observed failure):");
  for (const std::string& line : root_lines) add(line);
  add(border);
  return out;
}

nlohmann::json rootCauseDocument(const WorkerFailure& root) {
  nlohmann::json doc;
  const nlohmann::json& worker_doc = root.error_document;
  if (worker_doc.is_object() && worker_doc.contains("message") &&
      worker_doc["message"].is_object()) {
    doc = worker_doc;
  } else {
    // torch's @record skips its errorCode override for the flat shape; cpprun writes the nested
    // shape instead, so readers always find message.errorCode.
    nlohmann::json extra = {{"timestamp", std::to_string(epochSeconds(root.time))}};
    if (!root.traceback.empty()) extra["py_callstack"] = root.traceback;
    doc = {{"message", {{"message", root.message}, {"extraInfo", std::move(extra)}}}};
  }
  doc["message"]["errorCode"] = torchExitCode(root);
  return doc;
}

Status writeRootCauseFile(const std::string& path, const WorkerFailure& root) {
  const std::string text =
      rootCauseDocument(root).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::string tmp = path + ".XXXXXX";
  int fd = ::mkstemp(tmp.data());
  if (fd < 0) {
    return internalError("cannot write error file " + path + ": cannot create a temporary file " +
                         "beside it: " + systemError(errno));
  }
  auto fail = [&](const std::string& what, int err) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return internalError("cannot write error file " + path + ": " + what + ": " + systemError(err));
  };
  // mkstemp makes the file 0600; an error file is read by schedulers and wrapper scripts.
  if (::fchmod(fd, 0644) != 0) return fail("chmod " + tmp, errno);
  if (Status s = writeAll(fd, text); !s.isOk()) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return internalError("cannot write error file " + path + ": write " + tmp + ": " + s.message());
  }
  if (::fsync(fd) != 0) return fail("fsync " + tmp, errno);
  if (::close(fd) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return internalError("cannot write error file " + path + ": close " + tmp + ": " +
                         systemError(err));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return internalError("cannot write error file " + path + ": rename: " + systemError(err));
  }
  return Status::ok();
}

}  // namespace cpprun::agent
