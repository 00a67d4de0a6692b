// cpprun_test_worker: the worker program integration tests launch under cpprun.
//
// Usage: cpprun_test_worker ACTION [ARGS...] [ACTION [ARGS...]]...
// Actions run in order (the whole command line is checked first). In PATH, TEXT, MSG, KEY and
// VALUE arguments, {rank}, {local_rank} and {restart} are replaced by the environment variables
// RANK, LOCAL_RANK and TORCHELASTIC_RESTART_COUNT (empty when unset).
//
//   env-json PATH            write the environment as one JSON object to PATH (PATH.tmp, rename)
//   print TEXT               TEXT + "\n" on stdout, flushed
//   eprint TEXT              TEXT + "\n" on stderr
//   flood N BYTES            N lines on stdout, each BYTES long with its "\n": "<rank>:<i>:xxx..",
//                            written in 64 KiB write(2) chunks that split lines
//   exit N                   exit with code N
//   exit-if-rank R N         exit with code N when RANK == R, else go on
//   exit-if-restart C N      exit with code N when TORCHELASTIC_RESTART_COUNT == C, else go on
//   kill-self SIG            restore SIG's default disposition, raise it (15, TERM or SIGTERM)
//   kill-self-if-rank R SIG  kill-self SIG when RANK == R, else go on
//   ignore SIG               set SIG to SIG_IGN (inherited by forked children)
//   on-signal SIG PATH       on SIG append "SIGNAME <pid>\n" to PATH, then _exit(128 + signo)
//   on-signal-continue SIG PATH  the same, but keep running
//   fork-grandchildren N PATH    fork N children that sleep forever in this process group;
//                            append each pid as a line to PATH (on-signal handlers reset in them)
//   fork-daemon PATH         fork a child that setsid()s (leaving the process group), points its
//                            stdio at /dev/null and pause()s forever; append its pid to PATH once
//                            setsid() is done
//   write-error-file KIND MSG     write torch's error file to $TORCHELASTIC_ERROR_FILE (creating
//                            parent directories); KIND nested: {"message": {"message": MSG,
//                            "extraInfo": {"py_callstack": ..., "timestamp": "<secs>"}}};
//                            KIND flat: {"message": MSG, "timestamp": <secs>}. Unset: warn, go on
//   store-set KEY VALUE      set KEY in the TCP store at $MASTER_ADDR:$MASTER_PORT
//   store-get KEY PATH       wait up to 30 s for KEY, write its value to PATH (atomically)
//   store-check KEY PATH     write "1" or "0" to PATH: whether KEY exists now
//   touch PATH               create PATH (or leave it as is)
//   list-fds PATH            write the open descriptors above 2 ("3 7", or nothing) to PATH
//   wait-file PATH SECONDS   wait until PATH exists (10 ms polls); exit 124 after SECONDS
//   sleep SECONDS            sleep (fractions allowed)
//   sleep-forever            sleep forever (pauseForever)
//   leave-group              move into the parent's (the agent's) process group, leaving the
//                            worker's own group empty
//   progress N               write N to $CPPRUN_PROGRESS_FILE (common/progress_file.h)
//   progress-every N SECONDS write 1..N to $CPPRUN_PROGRESS_FILE, SECONDS apart (a step each)
//   stall-if-restart C       sleep forever (a stalled rank) when TORCHELASTIC_RESTART_COUNT
//                            == C, else go on
//   stall-if-rank R          the same when RANK == R
//
// Exit codes: as the actions say; 2 for a bad command line; 124 when wait-file or store-get time
// out; 1 for other failures (I/O, store errors). Prints nothing unless an action asks for it.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

#include "common/progress_file.h"
#include "rendezvous/tcp_store_client.h"

extern char** environ;

namespace {

[[noreturn]] void fail(int code, const std::string& msg) {
  std::fflush(stdout);
  std::fprintf(stderr, "cpprun_test_worker: %s\n", msg.c_str());
  std::exit(code);
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

std::string subst(std::string s) {
  const std::pair<const char*, const char*> vars[] = {{"{rank}", "RANK"},
                                                      {"{local_rank}", "LOCAL_RANK"},
                                                      {"{restart}", "TORCHELASTIC_RESTART_COUNT"}};
  for (const auto& [pattern, name] : vars) {
    const std::string value = env(name);
    for (size_t pos = s.find(pattern); pos != std::string::npos;
         pos = s.find(pattern, pos + value.size())) {
      s.replace(pos, std::strlen(pattern), value);
    }
  }
  return s;
}

long parseInt(const std::string& s) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno != 0) fail(2, "not an integer: '" + s + "'");
  return v;
}

double parseSeconds(const std::string& s) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || !(v >= 0)) fail(2, "not a duration in seconds: '" + s + "'");
  return v;
}

struct SignalName {
  int signo;
  const char* name;
};
const SignalName kSignals[] = {
    {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},     {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
    {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"},   {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
    {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"},   {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
    {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"},   {SIGTERM, "SIGTERM"}, {SIGCHLD, "SIGCHLD"},
    {SIGCONT, "SIGCONT"}, {SIGSTOP, "SIGSTOP"},   {SIGTSTP, "SIGTSTP"}, {SIGTTIN, "SIGTTIN"},
    {SIGTTOU, "SIGTTOU"}, {SIGXCPU, "SIGXCPU"},   {SIGXFSZ, "SIGXFSZ"}, {SIGPROF, "SIGPROF"},
    {SIGSYS, "SIGSYS"},   {SIGWINCH, "SIGWINCH"}, {SIGURG, "SIGURG"},
};

const char* signalName(int signo) {
  for (const auto& s : kSignals) {
    if (s.signo == signo) return s.name;
  }
  return "SIG?";
}

int parseSignal(const std::string& arg) {
  if (!arg.empty() && arg[0] >= '0' && arg[0] <= '9') {
    const long v = parseInt(arg);
    if (v <= 0 || v >= NSIG) fail(2, "bad signal number: " + arg);
    return static_cast<int>(v);
  }
  const std::string name = arg.rfind("SIG", 0) == 0 ? arg : "SIG" + arg;
  for (const auto& s : kSignals) {
    if (name == s.name) return s.signo;
  }
  fail(2, "unknown signal: " + arg);
}

void writeAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(1, std::string("write: ") + std::strerror(errno));
    data += n;
    size -= static_cast<size_t>(n);
  }
}

void writeFileAtomic(const std::string& path, const std::string& content) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(1, "open " + tmp + ": " + std::strerror(errno));
  writeAll(fd, content.data(), content.size());
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    fail(1, "rename to " + path + ": " + std::strerror(errno));
}

void appendToFile(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) fail(1, "open " + path + ": " + std::strerror(errno));
  writeAll(fd, text.data(), text.size());
  ::close(fd);
}

void makeParentDirs(const std::string& path) {
  for (size_t pos = path.find('/', 1); pos != std::string::npos; pos = path.find('/', pos + 1)) {
    ::mkdir(path.substr(0, pos).c_str(), 0755);  // EEXIST is fine; open() reports the rest
  }
}

std::string jsonString(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {  // \n, \t etc. as \u000a, \u0009
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// on-signal state, read by the handler: a path per signal (leaked, never freed).
const char* volatile g_signal_path[NSIG] = {};
volatile sig_atomic_t g_signal_exits[NSIG] = {};

void onSignal(int signo) {
  const int saved_errno = errno;
  char line[64];
  size_t n = 0;
  for (const char* p = signalName(signo); *p != '\0' && n < 32; ++p) line[n++] = *p;
  line[n++] = ' ';
  char digits[16];
  size_t d = 0;
  for (long pid = ::getpid(); pid > 0 || d == 0; pid /= 10)
    digits[d++] = static_cast<char>('0' + pid % 10);
  while (d > 0) line[n++] = digits[--d];
  line[n++] = '\n';
  const int fd = ::open(g_signal_path[signo], O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd >= 0) {
    [[maybe_unused]] const ssize_t written = ::write(fd, line, n);
    ::close(fd);
  }
  if (g_signal_exits[signo] != 0) ::_exit(128 + signo);
  errno = saved_errno;
}

void setDisposition(int signo, void (*handler)(int)) {
  struct sigaction sa {};
  sa.sa_handler = handler;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  if (::sigaction(signo, &sa, nullptr) != 0) {
    fail(2, std::string("sigaction ") + signalName(signo) + ": " + std::strerror(errno));
  }
}

void killSelf(int signo) {
  std::fflush(stdout);
  std::fflush(stderr);
  if (signo != SIGKILL && signo != SIGSTOP) setDisposition(signo, SIG_DFL);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, signo);
  ::sigprocmask(SIG_UNBLOCK, &set, nullptr);
  ::raise(signo);  // returns for signals whose default is to ignore or stop
}

// Sleeps in 1 s steps rather than pause(): under ThreadSanitizer a signal's handler runs only
// when the thread next enters an intercepted call, and pause() is not one, so a handler
// (on-signal) could wait forever; sleep() is, and returns early on a signal in any build.
[[noreturn]] void pauseForever() {
  for (;;) ::sleep(1);
}

void flood(long lines, long bytes) {
  if (lines < 0 || bytes < 1) fail(2, "flood: need N >= 0 and BYTES >= 1");
  std::fflush(stdout);
  const std::string rank = env("RANK");
  std::string buf;
  constexpr size_t kChunk = 64 * 1024;
  for (long i = 0; i < lines; ++i) {
    std::string line = rank + ":" + std::to_string(i) + ":";
    line.resize(static_cast<size_t>(bytes - 1), 'x');
    buf += line + "\n";
    while (buf.size() >= kChunk) {
      writeAll(STDOUT_FILENO, buf.data(), kChunk);
      buf.erase(0, kChunk);
    }
  }
  writeAll(STDOUT_FILENO, buf.data(), buf.size());
}

void writeErrorFile(const std::string& kind, const std::string& msg) {
  if (kind != "nested" && kind != "flat") {
    fail(2, "write-error-file: KIND must be nested or flat, not '" + kind + "'");
  }
  const std::string path = env("TORCHELASTIC_ERROR_FILE");
  if (path.empty()) {
    std::fprintf(stderr, "cpprun_test_worker: TORCHELASTIC_ERROR_FILE is unset; no error file\n");
    return;
  }
  const std::string now = std::to_string(static_cast<long long>(std::time(nullptr)));
  std::string json;
  if (kind == "nested") {
    const std::string stack =
        "Traceback (most recent call last):\n  File \"train.py\", line 1, in <module>\n"
        "RuntimeError: " +
        msg;
    json = "{\"message\": {\"message\": " + jsonString(msg) +
           ", \"extraInfo\": {\"py_callstack\": " + jsonString(stack) + ", \"timestamp\": \"" +
           now + "\"}}}\n";
  } else {
    json = "{\"message\": " + jsonString(msg) + ", \"timestamp\": " + now + "}\n";
  }
  makeParentDirs(path);
  writeFileAtomic(path, json);
}

cpprun::rendezvous::TcpStoreClient connectStore() {
  const std::string addr = env("MASTER_ADDR");
  const long port = env("MASTER_PORT").empty() ? -1 : parseInt(env("MASTER_PORT"));
  if (addr.empty() || port <= 0 || port > 65535) fail(1, "MASTER_ADDR / MASTER_PORT not set");
  cpprun::rendezvous::TcpStoreClientOptions options;
  options.host = addr;
  options.port = static_cast<uint16_t>(port);
  options.connect_timeout = std::chrono::seconds(30);
  options.timeout = std::chrono::seconds(30);
  return cpprun::rendezvous::TcpStoreClient(options);
}

void storeAction(const std::string& action, const std::string& key, const std::string& arg) {
  try {
    auto store = connectStore();
    if (action == "store-set") {
      store.set(key, arg);
    } else if (action == "store-get") {
      writeFileAtomic(arg, cpprun::rendezvous::toString(store.get(key)));
    } else {
      writeFileAtomic(arg, store.check({key}) ? "1" : "0");
    }
  } catch (const cpprun::rendezvous::StoreTimeout& e) {
    fail(124, action + " " + key + ": " + e.what());
  } catch (const cpprun::rendezvous::StoreError& e) {
    fail(1, action + " " + key + ": " + e.what());
  }
}

void sleepFor(double seconds) {
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

// The actions, by how many arguments they take; -1: unknown.
int argCount(const std::string& action) {
  static const char* const kByCount[] = {
      " sleep-forever leave-group ",
      " env-json print eprint exit kill-self ignore fork-daemon touch sleep list-fds progress "
      "stall-if-restart stall-if-rank ",
      " flood progress-every exit-if-rank exit-if-restart kill-self-if-rank on-signal "
      "on-signal-continue "
      "fork-grandchildren write-error-file store-set store-get store-check wait-file "};
  for (int n = 0; n < 3 && action.find(' ') == std::string::npos; ++n) {
    if (std::strstr(kByCount[n], (" " + action + " ").c_str()) != nullptr) return n;
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> argvec(argv + 1, argv + argc);
  for (size_t i = 0; i < argvec.size();) {  // check the whole command line before acting
    const int n = argCount(argvec[i]);
    if (n < 0) fail(2, "unknown action '" + argvec[i] + "'");
    if (i + static_cast<size_t>(n) >= argvec.size()) {
      fail(2, "action '" + argvec[i] + "': missing argument");
    }
    i += 1 + static_cast<size_t>(n);
  }

  for (size_t i = 0; i < argvec.size();) {
    const std::string& a = argvec[i++];
    auto arg = [&]() { return subst(argvec[i++]); };
    if (a == "env-json") {
      const std::string path = arg();
      std::string json = "{";
      for (char** e = environ; *e != nullptr; ++e) {
        const std::string entry = *e;
        const size_t eq = entry.find('=');
        if (eq == std::string::npos) continue;
        if (json.size() > 1) json += ", ";
        json += jsonString(entry.substr(0, eq)) + ": " + jsonString(entry.substr(eq + 1));
      }
      writeFileAtomic(path, json + "}\n");
    } else if (a == "print" || a == "eprint") {
      std::FILE* f = a == "print" ? stdout : stderr;
      std::fprintf(f, "%s\n", arg().c_str());
      std::fflush(f);
    } else if (a == "flood") {
      const long n = parseInt(arg());
      flood(n, parseInt(arg()));
    } else if (a == "exit" || a == "exit-if-rank" || a == "exit-if-restart") {
      const std::string var = a == "exit-if-rank" ? "RANK" : "TORCHELASTIC_RESTART_COUNT";
      const bool match = a == "exit" || env(var.c_str()) == arg();
      const int code = static_cast<int>(parseInt(arg()));
      if (match) {
        std::fflush(stdout);
        std::exit(code);
      }
    } else if (a == "kill-self" || a == "kill-self-if-rank") {
      const bool match = a == "kill-self" || env("RANK") == arg();
      const int signo = parseSignal(arg());
      if (match) killSelf(signo);
    } else if (a == "ignore") {
      setDisposition(parseSignal(arg()), SIG_IGN);
    } else if (a == "on-signal" || a == "on-signal-continue") {
      const int signo = parseSignal(arg());
      g_signal_path[signo] = strdup(arg().c_str());
      g_signal_exits[signo] = a == "on-signal" ? 1 : 0;
      setDisposition(signo, onSignal);
    } else if (a == "fork-grandchildren" || a == "fork-daemon") {
      const long n = a == "fork-daemon" ? 1 : parseInt(arg());
      const std::string path = arg();
      std::fflush(stdout);
      std::fflush(stderr);
      for (long k = 0; k < n; ++k) {
        int ready[2];
        if (::pipe(ready) != 0) fail(1, std::string("pipe: ") + std::strerror(errno));
        const pid_t pid = ::fork();
        if (pid < 0) fail(1, std::string("fork: ") + std::strerror(errno));
        if (pid == 0) {
          for (int s = 1; s < NSIG; ++s) {
            if (g_signal_path[s] != nullptr) ::signal(s, SIG_DFL);
          }
          if (a == "fork-daemon") {
            ::setsid();
            const int devnull = ::open("/dev/null", O_RDWR);
            for (int fd = 0; fd <= 2; ++fd) ::dup2(devnull, fd);
          }
          ::close(ready[0]);
          ::close(ready[1]);  // tells the parent the child is set up
          pauseForever();
        }
        ::close(ready[1]);
        char byte;
        while (::read(ready[0], &byte, 1) < 0 && errno == EINTR) {
        }
        ::close(ready[0]);
        appendToFile(path, std::to_string(pid) + "\n");
      }
    } else if (a == "write-error-file") {
      const std::string kind = arg();
      writeErrorFile(kind, arg());
    } else if (a == "store-set" || a == "store-get" || a == "store-check") {
      const std::string key = arg();
      storeAction(a, key, arg());
    } else if (a == "list-fds") {
      // The descriptors above stdio this worker was given (none expected): "3 7\n" or "\n".
      std::string fds;
      if (DIR* dir = ::opendir("/proc/self/fd")) {
        const int own = ::dirfd(dir);
        while (dirent* e = ::readdir(dir)) {
          const int fd = std::atoi(e->d_name);
          if (e->d_name[0] == '.' || fd <= 2 || fd == own) continue;
          fds += (fds.empty() ? "" : " ") + std::to_string(fd);
        }
        ::closedir(dir);
      }
      writeFileAtomic(arg(), fds + "\n");
    } else if (a == "touch") {
      appendToFile(arg(), "");
    } else if (a == "wait-file") {
      const std::string path = arg();
      const auto deadline = std::chrono::steady_clock::now() +
                            std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                std::chrono::duration<double>(parseSeconds(arg())));
      while (::access(path.c_str(), F_OK) != 0) {
        if (std::chrono::steady_clock::now() >= deadline) fail(124, "wait-file timed out: " + path);
        sleepFor(0.01);
      }
    } else if (a == "sleep") {
      sleepFor(parseSeconds(arg()));
    } else if (a == "sleep-forever") {
      pauseForever();
    } else if (a == "leave-group") {
      // A group leader cannot setsid(); it can join its parent's group (the agent's), which
      // leaves its own group empty.
      if (::setpgid(0, ::getpgid(::getppid())) != 0)
        fail(1, std::string("setpgid: ") + std::strerror(errno));
    } else if (a == "progress") {
      cpprun::ProgressReporter::fromEnvironment().bump(static_cast<uint64_t>(parseInt(arg())));
    } else if (a == "progress-every") {
      const long n = parseInt(arg());
      const double seconds = parseSeconds(arg());
      auto reporter = cpprun::ProgressReporter::fromEnvironment();
      for (long step = 1; step <= n; ++step) {
        reporter.bump(static_cast<uint64_t>(step));
        if (step < n) sleepFor(seconds);
      }
    } else if (a == "stall-if-restart" || a == "stall-if-rank") {
      const char* var = a == "stall-if-rank" ? "RANK" : "TORCHELASTIC_RESTART_COUNT";
      if (env(var) == arg()) pauseForever();
    }
  }
  return 0;
}
