// The console as a person expects it (docs/supervision.md, "Console"), end to end: cpprun run on
// a pseudo-terminal the test owns (as a shell would run it: the session's foreground job, or a
// background one), or with pipes as in CI. The workers are small Python scripts; where torch
// 2.15's torchrun is installed, the same script runs under it in the same shape for comparison.
//
// Every read is a poll with a deadline; nothing sleeps to synchronise.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tests/support/test_support.h"

namespace cpprun::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

const std::string kPython = CPPRUN_PYTHON;

std::string torchrunPath() {
  const std::string python = CPPRUN_TORCH2_PYTHON;
  if (python.empty()) return "";
  const std::string path = python.substr(0, python.rfind('/') + 1) + "torchrun";
  return ::access(path.c_str(), X_OK) == 0 ? path : "";
}

std::vector<char*> cStrings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// The environment every run gets: a plain terminal type (no escape sequences from readline),
// the test's Python for cpprun's workers.
std::vector<std::string> runEnvironment(const std::map<std::string, std::string>& extra) {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry = *e;
    const size_t eq = entry.find('=');
    if (eq != std::string::npos) env[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  env["TERM"] = "dumb";
  env["PYTHON_EXEC"] = kPython;
  env.erase("PYTHONBREAKPOINT");
  for (const auto& [k, v] : extra) env[k] = v;
  std::vector<std::string> out;
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

// A program run on a pseudo-terminal this test owns: the program's stdin, stdout, stderr and
// controlling terminal are its slave. In the foreground shape the program leads the session and
// its group is the terminal's foreground group; in the background shape a small session leader
// (this process, forked) keeps the foreground and the program runs in a group of its own, as
// `prog &` in a shell.
class PtyRun {
 public:
  PtyRun(std::vector<std::string> argv, bool background = false,
         const std::map<std::string, std::string>& env = {}, winsize size = {24, 80, 0, 0}) {
    master_ = ::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
    REQUIRE(master_ >= 0);
    REQUIRE(::grantpt(master_) == 0);
    REQUIRE(::unlockpt(master_) == 0);
    char name[128];
    REQUIRE(::ptsname_r(master_, name, sizeof name) == 0);
    slave_name_ = name;
    ::ioctl(master_, TIOCSWINSZ, &size);
    std::vector<std::string> envs = runEnvironment(env);
    auto c_argv = cStrings(argv);
    auto c_env = cStrings(envs);
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::setsid();
      const int slave = ::open(name, O_RDWR);  // the session's controlling terminal
      if (slave < 0 || ::ioctl(slave, TIOCSCTTY, 0) != 0) ::_exit(120);
      ::dup2(slave, 0);
      ::dup2(slave, 1);
      ::dup2(slave, 2);
      if (slave > 2) ::close(slave);
      if (background) {
        const pid_t job = ::fork();
        if (job == 0) {
          ::setpgid(0, 0);  // not the terminal's foreground group
          ::execve(c_argv[0], c_argv.data(), c_env.data());
          ::_exit(127);
        }
        int status = 0;
        while (::waitpid(job, &status, 0) < 0) {
        }
        ::_exit(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
      }
      ::execve(c_argv[0], c_argv.data(), c_env.data());
      ::_exit(127);
    }
    // The test's own descriptor of the slave: the terminal's modes, read and set from here.
    slave_ = ::open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
  }
  ~PtyRun() {
    if (!status_ && pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::kill(-pid_, SIGKILL);
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
    if (slave_ >= 0) ::close(slave_);
    if (master_ >= 0) ::close(master_);
  }
  PtyRun(const PtyRun&) = delete;
  PtyRun& operator=(const PtyRun&) = delete;

  bool waitForText(const std::string& text, std::chrono::milliseconds bound) {
    const auto deadline = Clock::now() + bound;
    while (output_.find(text, scan_from_) == std::string::npos) {
      if (Clock::now() >= deadline || !readSome(deadline)) return false;
    }
    scan_from_ = output_.find(text, scan_from_) + text.size();
    return true;
  }
  void type(const std::string& text) {
    REQUIRE(::write(master_, text.data(), text.size()) == static_cast<ssize_t>(text.size()));
  }
  // The exit status (WEXITSTATUS of the session leader), reading output meanwhile.
  std::optional<int> wait(std::chrono::milliseconds bound) {
    const auto deadline = Clock::now() + bound;
    while (!status_) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        break;
      }
      if (Clock::now() >= deadline) return std::nullopt;
      // Output, or 50 ms: a child's exit gives no readable event on the master here.
      readSome(std::min(deadline, Clock::now() + 50ms));
    }
    readSome(Clock::now() + 200ms);  // what is left
    return status_;
  }
  termios modes() const {
    termios t{};
    ::tcgetattr(slave_, &t);
    return t;
  }
  void resize(unsigned short rows, unsigned short cols) {
    winsize size{rows, cols, 0, 0};
    // The kernel sends SIGWINCH to the terminal's foreground group.
    REQUIRE(::ioctl(master_, TIOCSWINSZ, &size) == 0);
  }
  const std::string& output() const { return output_; }
  pid_t pid() const { return pid_; }

 private:
  // Reads what is there, waiting at most until `deadline`; false at its end (EIO: every slave
  // descriptor but the test's own is closed and nothing is left) or when nothing came.
  bool readSome(Clock::time_point deadline) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    pollfd p{master_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(std::max<long>(0, left.count()))) <= 0) return false;
    char buffer[4096];
    const ssize_t n = ::read(master_, buffer, sizeof buffer);
    if (n <= 0) return false;
    output_.append(buffer, static_cast<size_t>(n));
    return true;
  }

  int master_ = -1;
  int slave_ = -1;
  std::string slave_name_;
  pid_t pid_ = -1;
  std::optional<int> status_;
  std::string output_;
  size_t scan_from_ = 0;
};

// A program run with pipes: `input` on its stdin (then EOF), stdout and stderr captured.
struct PipeResult {
  int code = -1;
  std::string output;
};
// A program started with a pipe as its stdin (`in`: the write end) and one for its stdout and
// stderr (`out`: the read end).
struct PipedChild {
  pid_t pid = -1;
  int in = -1;
  int out = -1;
};
// With `stdin_file`, the program's stdin is that file (opened read-only) and `in` is -1.
PipedChild startWithPipes(std::vector<std::string> argv,
                          const std::map<std::string, std::string>& env = {},
                          const std::string& stdin_file = "") {
  int in[2];
  int out[2];
  if (stdin_file.empty()) {
    REQUIRE(::pipe2(in, O_CLOEXEC) == 0);
  } else {
    in[0] = ::open(stdin_file.c_str(), O_RDONLY | O_CLOEXEC);
    REQUIRE(in[0] >= 0);
    in[1] = -1;
  }
  REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
  std::vector<std::string> envs = runEnvironment(env);
  auto c_argv = cStrings(argv);
  auto c_env = cStrings(envs);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(in[0], 0);
    ::dup2(out[1], 1);
    ::dup2(out[1], 2);
    ::execve(c_argv[0], c_argv.data(), c_env.data());
    ::_exit(127);
  }
  ::close(in[0]);
  ::close(out[1]);
  return {pid, in[1], out[0]};
}

// With `stdin_file`, the program reads that file instead and `input` is not used.
PipeResult runWithPipes(std::vector<std::string> argv, const std::string& input,
                        std::chrono::milliseconds bound,
                        const std::map<std::string, std::string>& env = {},
                        const std::string& stdin_file = "") {
  const PipedChild child = startWithPipes(argv, env, stdin_file);
  const pid_t pid = child.pid;
  if (child.in >= 0) {
    REQUIRE(::write(child.in, input.data(), input.size()) == static_cast<ssize_t>(input.size()));
    ::close(child.in);
  }
  PipeResult result;
  const auto deadline = Clock::now() + bound;
  char buffer[4096];
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    pollfd p{child.out, POLLIN, 0};
    if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) <= 0) break;
    const ssize_t n = ::read(child.out, buffer, sizeof buffer);
    if (n <= 0) break;
    result.output.append(buffer, static_cast<size_t>(n));
  }
  ::close(child.out);
  int status = 0;
  if (Clock::now() >= deadline) ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  result.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

std::string writeScript(const TempDir& dir, const std::string& name, const std::string& text) {
  const std::string path = dir.path() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

const char* kTtyScript = R"(import os, sys
print("TTY", sys.stdin.isatty(), sys.stdout.isatty(), sys.stderr.isatty(), flush=True)
answer = 6
breakpoint()
print("AFTER", answer, flush=True)
)";

// `line` is a whole line of `output` (at its start or after a '\n').
bool hasLine(const std::string& output, const std::string& line) {
  return output.rfind(line + "\n", 0) == 0 || output.find("\n" + line + "\n") != std::string::npos;
}

std::vector<std::string> cpprun(std::vector<std::string> args) {
  args.insert(args.begin(), CPPRUN_BINARY);
  return args;
}

bool sameModes(const termios& a, const termios& b) {
  return a.c_iflag == b.c_iflag && a.c_oflag == b.c_oflag && a.c_lflag == b.c_lflag &&
         std::memcmp(a.c_cc, b.c_cc, sizeof a.c_cc) == 0;
}

// Drives pdb through the terminal: the prompt shows, `p 6*7` prints 42, `c` continues.
void drivePdb(PtyRun& run) {
  INFO(run.output());
  REQUIRE(run.waitForText("TTY True True True", 60s));
  REQUIRE(run.waitForText("(Pdb)", 30s));
  run.type("p 6*7\n");
  REQUIRE(run.waitForText("42", 30s));
  REQUIRE(run.waitForText("(Pdb)", 30s));
  run.type("c\n");
  REQUIRE(run.waitForText("AFTER 6", 30s));
}

TEST_CASE("in a terminal a worker has one too and a pdb session works through cpprun",
          "[integration]") {
  TempDir dir;
  const std::string script = writeScript(dir, "ttycheck.py", kTtyScript);
  PtyRun run(cpprun({"--nproc-per-node=1", script}));
  const termios before = run.modes();
  drivePdb(run);
  const auto code = run.wait(60s);
  INFO(run.output());
  REQUIRE(code);
  CHECK(*code == 0);
  CHECK(run.output().find("[default0]:TTY True True True") != std::string::npos);
  CHECK(run.output().find("[default0]:AFTER 6") != std::string::npos);
  CHECK(sameModes(before, run.modes()));  // (g) the terminal's modes are the user's again
}

TEST_CASE("torchrun 2.15 on the same terminal: its worker inherits the terminal",
          "[integration][torch]") {
  const std::string torchrun = torchrunPath();
  if (torchrun.empty()) {
    WARN("SKIPPED: torch 2.15's torchrun is not installed (CPPRUN_TORCH2_PYTHON)");
    return;
  }
  TempDir dir;
  const std::string script = writeScript(dir, "ttycheck.py", kTtyScript);
  PtyRun run(
      {torchrun, "--nproc-per-node=1", "--master-port=" + std::to_string(freeTcpPort()), script});
  drivePdb(run);
  const auto code = run.wait(60s);
  INFO(run.output());
  REQUIRE(code);
  CHECK(*code == 0);
}

TEST_CASE(
    "keystrokes reach the worker with the terminal in no-echo mode, ISIG kept, and the "
    "modes come back",
    "[integration]") {
  TempDir dir;
  const std::string script = writeScript(dir, "read.py", R"(import sys
print("READY", flush=True)
line = sys.stdin.readline()
print("GOT", repr(line), flush=True)
)");
  PtyRun run(cpprun({"--nproc-per-node=1", script}));
  const termios before = run.modes();
  INFO(run.output());
  REQUIRE(run.waitForText("READY", 60s));
  const termios during = run.modes();
  CHECK((during.c_lflag & ECHO) == 0);
  CHECK((during.c_lflag & ICANON) == 0);
  CHECK((during.c_lflag & ISIG) != 0);
  run.type("hello\n");
  REQUIRE(run.waitForText("GOT 'hello\\n'", 30s));
  const auto code = run.wait(60s);
  REQUIRE(code);
  CHECK(*code == 0);
  CHECK(sameModes(before, run.modes()));
}

TEST_CASE("with --stdin all in a terminal every rank reads the keystrokes, rank 0 echoes them",
          "[integration]") {
  TempDir dir;
  // One write per line: print() with several arguments writes them one by one under -u, and
  // a "READY" waited for before its " 0\n" followed let the echo land inside that line.
  const std::string script = writeScript(dir, "all.py", R"(import os, sys
sys.stdout.write("READY %s\n" % os.environ["RANK"])
sys.stdout.flush()
line = sys.stdin.readline()
sys.stdout.write("GOT %s %r\n" % (os.environ["RANK"], line))
sys.stdout.flush()
)");
  PtyRun run(cpprun({"--nproc-per-node=2", "--stdin=all", script}));
  REQUIRE(run.waitForText("READY", 60s));  // each call finds the next one: both ranks are there
  REQUIRE(run.waitForText("READY", 60s));
  run.type("xyz\n");
  const auto code = run.wait(60s);
  INFO(run.output());  // taken now: INFO copies the text when it runs
  REQUIRE(code);
  CHECK(*code == 0);
  CHECK(run.output().find("[default0]:GOT 0 'xyz\\n'") != std::string::npos);
  CHECK(run.output().find("[default1]:GOT 1 'xyz\\n'") != std::string::npos);
  CHECK(run.output().find("[default0]:xyz") != std::string::npos);  // the echo, once
  CHECK(run.output().find("[default1]:xyz") == std::string::npos);
}

TEST_CASE("Ctrl-C on the terminal stops the job and the modes come back", "[integration]") {
  TempDir dir;
  const std::string script = writeScript(dir, "wait.py", R"(import sys, time
print("READY", flush=True)
sys.stdin.readline()
)");
  PtyRun run(cpprun({"--nproc-per-node=1", script}));
  const termios before = run.modes();
  INFO(run.output());
  REQUIRE(run.waitForText("READY", 60s));
  run.type("\x03");  // the terminal sends SIGINT to cpprun's group
  const auto code = run.wait(60s);
  REQUIRE(code);
  CHECK(*code == 128 + SIGINT);
  CHECK(sameModes(before, run.modes()));
}

TEST_CASE("the guardian restores the terminal's modes when the agent is killed", "[integration]") {
  TempDir dir;
  const std::string script = writeScript(dir, "wait.py", R"(import sys
print("READY", flush=True)
sys.stdin.readline()
)");
  PtyRun run(cpprun({"--nproc-per-node=1", script}));
  const termios before = run.modes();
  INFO(run.output());
  REQUIRE(run.waitForText("READY", 60s));
  REQUIRE_FALSE(sameModes(before, run.modes()));  // forwarding: no echo, no line editing
  // cpprun is the guardian; its one child is the agent.
  std::ifstream children("/proc/" + std::to_string(run.pid()) + "/task/" +
                         std::to_string(run.pid()) + "/children");
  pid_t agent = 0;
  REQUIRE(children >> agent);
  REQUIRE(::kill(agent, SIGKILL) == 0);
  const auto code = run.wait(60s);
  REQUIRE(code);
  CHECK(*code == 128 + SIGKILL);
  CHECK(sameModes(before, run.modes()));
}

TEST_CASE("a resized terminal resizes the workers' terminals", "[integration]") {
  TempDir dir;
  // The worker takes SIGWINCH with sigtimedwait, blocked from before READY, so none is lost.
  // (It once set a threading.Event from a Python signal handler: the handler runs on the main
  // thread between bytecodes, and when that was inside Event.wait, which holds the event's
  // non-reentrant lock, set() waited for that lock forever. Both resizes then looked lost: the
  // flake two ASan runs under load showed.)
  const std::string script = writeScript(dir, "winch.py", R"(import os, signal
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGWINCH})
size = os.get_terminal_size()
print("SIZE", size.columns, size.lines, flush=True)
print("READY", flush=True)
while True:
    if signal.sigtimedwait({signal.SIGWINCH}, 30) is None:
        print("NO SIGWINCH IN 30 S", flush=True)
        break
    size = os.get_terminal_size()
    print("NEWSIZE", size.columns, size.lines, flush=True)
    if size.columns >= 101:
        break
)");
  PtyRun run(cpprun({"--nproc-per-node=1", "--stdin=none", script}), false, {},
             winsize{24, 80, 0, 0});
  INFO(run.output());
  REQUIRE(run.waitForText("SIZE 80 24", 60s));
  REQUIRE(run.waitForText("READY", 30s));
  run.resize(33, 101);
  const bool resized = run.waitForText("NEWSIZE 101 33", 30s);
  INFO("cpprun's terminal showed:\n" << run.output());
  REQUIRE(resized);
  const auto code = run.wait(60s);
  REQUIRE(code);
  CHECK(*code == 0);
}

TEST_CASE("a background cpprun does not stop and leaves the terminal alone", "[integration]") {
  TempDir dir;
  const std::string script = writeScript(dir, "bg.py", R"(import sys
print("TTY", sys.stdin.isatty(), sys.stdout.isatty(), flush=True)
)");
  PtyRun run(cpprun({"--nproc-per-node=1", script}), /*background=*/true);
  const termios before = run.modes();
  const auto code = run.wait(60s);
  INFO(run.output());
  REQUIRE(code);  // stopped by SIGTTIN or SIGTTOU, it would never exit
  CHECK(*code == 0);
  CHECK(run.output().find("[default0]:TTY True True") != std::string::npos);
  CHECK(sameModes(before, run.modes()));
}

const char* kStdinScript = R"(import os, sys
data = sys.stdin.read()
print(f"RANK{os.environ['RANK']} stdin={data!r} tty={sys.stdin.isatty()},{sys.stdout.isatty()},{sys.stderr.isatty()}", flush=True)
)";

TEST_CASE("piped stdin goes to rank 0 only, to every rank, or to none", "[integration]") {
  TempDir dir;
  const std::string script = writeScript(dir, "stdin.py", kStdinScript);
  SECTION("rank0 (the default)") {
    auto r = runWithPipes(cpprun({"--nproc-per-node=2", script}), "hello\n", 60s);
    INFO(r.output);
    CHECK(r.code == 0);
    CHECK(r.output.find("RANK0 stdin='hello\\n' tty=False,False,False") != std::string::npos);
    CHECK(r.output.find("RANK1 stdin='' tty=False,False,False") != std::string::npos);
  }
  SECTION("all") {
    auto r = runWithPipes(cpprun({"--nproc-per-node=2", "--stdin=all", script}), "hello\n", 60s);
    INFO(r.output);
    CHECK(r.code == 0);
    CHECK(r.output.find("RANK0 stdin='hello\\n'") != std::string::npos);
    CHECK(r.output.find("RANK1 stdin='hello\\n'") != std::string::npos);
  }
  SECTION("none") {
    auto r = runWithPipes(cpprun({"--nproc-per-node=2", "--stdin=none", script}), "hello\n", 60s);
    INFO(r.output);
    CHECK(r.code == 0);
    CHECK(r.output.find("RANK0 stdin=''") != std::string::npos);
    CHECK(r.output.find("RANK1 stdin=''") != std::string::npos);
  }
  SECTION("a regular file: rank 0 reads it, and with --stdin=all every rank reads all of it") {
    const std::string input = dir.path() + "/input.txt";
    std::ofstream(input) << "from a file\n";
    auto r = runWithPipes(cpprun({"--nproc-per-node=2", script}), "", 60s, {}, input);
    INFO(r.output);
    CHECK(r.code == 0);
    CHECK(r.output.find("RANK0 stdin='from a file\\n'") != std::string::npos);
    CHECK(r.output.find("RANK1 stdin=''") != std::string::npos);
    r = runWithPipes(cpprun({"--nproc-per-node=2", "--stdin=all", script}), "", 60s, {}, input);
    INFO(r.output);
    CHECK(r.code == 0);
    CHECK(r.output.find("RANK0 stdin='from a file\\n'") != std::string::npos);
    CHECK(r.output.find("RANK1 stdin='from a file\\n'") != std::string::npos);
  }
  SECTION("a restarted rank 0 reads stdin again") {
    const std::string flaky = writeScript(dir, "flaky.py", R"(import os, sys
data = sys.stdin.read()
print(f"ATTEMPT{os.environ['TORCHELASTIC_RESTART_COUNT']} RANK{os.environ['RANK']} stdin={data!r}", flush=True)
sys.exit(1 if os.environ['TORCHELASTIC_RESTART_COUNT'] == '0' else 0)
)");
    auto r =
        runWithPipes(cpprun({"--nproc-per-node=1", "--max-restarts=1", flaky}), "hello\n", 60s);
    INFO(r.output);
    CHECK(r.code == 0);
    CHECK(r.output.find("ATTEMPT0 RANK0 stdin='hello\\n'") != std::string::npos);
    CHECK(r.output.find("ATTEMPT1 RANK0 stdin=''") != std::string::npos);  // EOF already
  }
}

TEST_CASE("a worker that never reads its stdin blocks neither cpprun nor the others",
          "[integration]") {
  TempDir dir;
  // Rank 0 is busy (it never reads what cpprun forwards); rank 1 writes on meanwhile.
  const std::string script = writeScript(dir, "busy.py", R"(import os, sys, time
if os.environ["RANK"] == "0":
    time.sleep(1)
else:
    for i in range(100):
        print("line", i, flush=True)
print("DONE", os.environ["RANK"], flush=True)
)");
  // A write after cpprun exited is EPIPE here, not this test's death.
  struct IgnorePipe {
    IgnorePipe() { previous = ::signal(SIGPIPE, SIG_IGN); }
    ~IgnorePipe() { ::signal(SIGPIPE, previous); }
    sighandler_t previous;
  } ignore_pipe;
  const PipedChild child = startWithPipes(cpprun({"--nproc-per-node=2", script}));
  const pid_t pid = child.pid;
  int stdin_fd = child.in;
  // 4 MiB of input, far more than cpprun buffers: cpprun stops reading, the pipe fills, and
  // this writer waits (non-blocking, so the test can read cpprun's output meanwhile).
  const int flags = ::fcntl(stdin_fd, F_GETFL);
  ::fcntl(stdin_fd, F_SETFL, flags | O_NONBLOCK);
  const std::string chunk(64 * 1024, 'x');
  size_t written = 0;
  std::string output;
  const auto deadline = Clock::now() + 60s;
  bool eof = false;
  while (!eof && Clock::now() < deadline) {
    if (stdin_fd >= 0 && written < 4 * 1024 * 1024) {
      const ssize_t n = ::write(stdin_fd, chunk.data(), chunk.size());
      if (n > 0) written += static_cast<size_t>(n);
      if (n < 0 && errno == EPIPE) {
        ::close(stdin_fd);
        stdin_fd = -1;
      }
    }
    pollfd p{child.out, POLLIN, 0};
    if (::poll(&p, 1, 20) > 0) {
      char buffer[4096];
      const ssize_t n = ::read(child.out, buffer, sizeof buffer);
      if (n <= 0) eof = true;
      if (n > 0) output.append(buffer, static_cast<size_t>(n));
    }
  }
  if (stdin_fd >= 0) ::close(stdin_fd);
  ::close(child.out);
  if (!eof) ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  INFO(output);
  REQUIRE(eof);  // cpprun ended (its output closed) within the bound
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(output.find("[default1]:DONE 1") != std::string::npos);
  CHECK(output.find("[default0]:DONE 0") != std::string::npos);
  CHECK(written < 4 * 1024 * 1024);  // cpprun did not swallow it all
}

TEST_CASE("torchrun 2.15 with piped stdin: every rank inherits the pipe", "[integration][torch]") {
  const std::string torchrun = torchrunPath();
  if (torchrun.empty()) {
    WARN("SKIPPED: torch 2.15's torchrun is not installed (CPPRUN_TORCH2_PYTHON)");
    return;
  }
  TempDir dir;
  const std::string script = writeScript(dir, "stdin.py", kStdinScript);
  auto r = runWithPipes(
      {torchrun, "--nproc-per-node=2", "--master-port=" + std::to_string(freeTcpPort()), script},
      "hello\n", 120s);
  INFO(r.output);
  CHECK(r.code == 0);
  // Whichever rank reads first gets the bytes; the other reads ''.
  const bool rank0_got = r.output.find("RANK0 stdin='hello\\n'") != std::string::npos;
  const bool rank1_got = r.output.find("RANK1 stdin='hello\\n'") != std::string::npos;
  CHECK(rank0_got != rank1_got);
}

TEST_CASE("raw output and an empty prefix template print worker lines as written",
          "[integration]") {
  TempDir dir;
  const std::string script = writeScript(dir, "hello.py", "print('hello world', flush=True)\n");
  SECTION("--raw-output") {
    auto r = runWithPipes(cpprun({"--nproc-per-node=1", "--raw-output", script}), "", 60s);
    INFO(r.output);
    CHECK(r.code == 0);
    CHECK(hasLine(r.output, "hello world"));
    CHECK(r.output.find("[default0]:") == std::string::npos);
  }
  SECTION("--log-line-prefix-template=") {
    auto r = runWithPipes(cpprun({"--nproc-per-node=1", "--log-line-prefix-template=", script}), "",
                          60s);
    INFO(r.output);
    CHECK(r.code == 0);
    CHECK(hasLine(r.output, "hello world"));
    CHECK(r.output.find("[default0]:") == std::string::npos);
  }
  SECTION("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE empty") {
    auto r = runWithPipes(cpprun({"--nproc-per-node=1", script}), "", 60s,
                          {{"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", ""}});
    INFO(r.output);
    CHECK(r.code == 0);
    CHECK(hasLine(r.output, "hello world"));
    CHECK(r.output.find("[default0]:") == std::string::npos);
  }
  SECTION("the default prefix otherwise") {
    auto r = runWithPipes(cpprun({"--nproc-per-node=1", script}), "", 60s);
    CHECK(r.output.find("[default0]:hello world\n") != std::string::npos);
  }
}

const char* kProgressScript = R"(import sys
for i in range(2000):
    sys.stdout.write(f"\rstep {i}")
    sys.stdout.flush()
sys.stdout.write("\rstep done\n")
sys.stdout.flush()
)";

TEST_CASE("a progress bar's carriage returns do not flood the console or the log file",
          "[integration]") {
  TempDir dir;
  const std::string script = writeScript(dir, "progress.py", kProgressScript);
  auto r = runWithPipes(cpprun({"--nproc-per-node=1", "--log-dir=" + dir.path() + "/logs",
                                "--tee=1", "--rdzv-id=progress", script}),
                        "", 60s);
  INFO(r.output);
  CHECK(r.code == 0);
  size_t lines = 0;
  for (size_t at = r.output.find("[default0]:step"); at != std::string::npos;
       at = r.output.find("[default0]:step", at + 1)) {
    ++lines;
  }
  CHECK(lines >= 1);
  CHECK(lines <= 5);  // 2000 updates in well under 4 s: at most one line a second, then the end
  CHECK(r.output.find("[default0]:step done\n") != std::string::npos);
  CHECK(r.output.find('\r') == std::string::npos);
  // The log file has the bytes as written.
  std::ifstream log(cpprun::testing::runDirectoryOf(dir.path() + "/logs", "progress") +
                    "/attempt_0/0/stdout.log");
  std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  CHECK(text.find("\rstep 1999\rstep done\n") != std::string::npos);
}

TEST_CASE("on a terminal a progress bar updates one open line in place", "[integration]") {
  TempDir dir;
  const std::string script = writeScript(dir, "progress.py", kProgressScript);
  PtyRun run(cpprun({"--nproc-per-node=1", "--stdin=none", script}));
  const auto code = run.wait(60s);
  INFO(run.output());
  REQUIRE(code);
  CHECK(*code == 0);
  // The final state ends the line; the terminal turned cpprun's '\n' into "\r\n".
  CHECK(run.output().find("step done") != std::string::npos);
  size_t shown = 0;
  for (size_t at = run.output().find("[default0]:step"); at != std::string::npos;
       at = run.output().find("[default0]:step", at + 1)) {
    ++shown;
  }
  CHECK(shown <= 6);
}

// A worker's runaway stderr line cannot hide its failure (issue 36): the failure report is
// cpprun's own message, bounded in size (each quoted line clipped to kReportLineBytes), and
// reaches cpprun's stderr past the console's budget, which a 1.1 MB line once exceeded so the
// whole report was dropped ("the console did not keep up"). The worker's line itself is not
// lost: the console has every byte of it, cut into kMaxLineBytes pieces.
TEST_CASE("a 1.1 MB stderr line is shown whole and quoted clipped in a report that always comes",
          "[integration]") {
  TempDir dir;
  constexpr size_t kLineBytes = 1100 * 1000;
  const std::string script =
      writeScript(dir, "long_line.py",
                  "import sys\nsys.stderr.write('x' * " + std::to_string(kLineBytes) +
                      " + '\\n')\nsys.stderr.flush()\nsys.exit(1)\n");
  const std::string err_file = dir.path() + "/cpprun-stderr.txt";
  std::vector<std::string> argv = {"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>\"$STDERR_FILE\""};
  for (std::string& a : cpprun({"--nproc-per-node=1", script})) argv.push_back(std::move(a));
  auto r = runWithPipes(argv, "", 60s, {{"STDERR_FILE", err_file}});
  CHECK(r.code == 1);
  const std::string err = [&] {
    std::ifstream in(err_file, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }();
  const size_t root = err.find("Root Cause (first observed failure):");
  INFO(err.substr(err.size() > 6000 ? err.size() - 6000 : 0));
  REQUIRE(root != std::string::npos);
  CHECK(err.find("did not keep up") == std::string::npos);
  const std::string report = err.substr(err.rfind("\n=", root) + 1);
  CHECK(report.find("bytes clipped)") != std::string::npos);
  CHECK(report.size() < 16 * 1024);
  // Every byte of the worker's line is on the console, in prefixed pieces.
  size_t shown = 0;
  size_t pos = 0;
  while ((pos = err.find("[default0]:", pos)) != std::string::npos) {
    pos += std::strlen("[default0]:");
    const size_t end = err.find('\n', pos);
    REQUIRE(end != std::string::npos);
    if (err.compare(pos, 1, "x") == 0) shown += end - pos;
    pos = end;
  }
  CHECK(shown == kLineBytes);
}

}  // namespace
}  // namespace cpprun::testing
