#include "tests/support/test_support.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "common/network_address.h"

extern char** environ;

namespace cpprun::testing {

namespace {

int remaining(std::chrono::steady_clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return left.count() <= 0 ? 0 : static_cast<int>(left.count());
}

}  // namespace

Bytes fromHex(const std::string& hex) {
  Bytes out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<uint8_t>(std::stoul(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

Bytes bytesOf(const std::string& text) { return Bytes(text.begin(), text.end()); }

rendezvous::wire::Request makeRequest(rendezvous::wire::QueryType type,
                                      std::vector<std::string> keys, std::vector<Bytes> values,
                                      int64_t integer, uint32_t u32) {
  rendezvous::wire::Request r;
  r.type = type;
  r.keys = std::move(keys);
  r.values = std::move(values);
  r.integer = integer;
  r.u32 = u32;
  return r;
}

std::string toHex(const Bytes& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (uint8_t b : bytes) {
    s += digits[b >> 4];
    s += digits[b & 15];
  }
  return s;
}

RawConnection::RawConnection(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) {
    throw std::runtime_error("cannot resolve " + host);
  }
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    fd_ = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd_ < 0) continue;
    if (::connect(fd_, ai->ai_addr, ai->ai_addrlen) == 0) break;
    ::close(fd_);
    fd_ = -1;
  }
  ::freeaddrinfo(res);
  if (fd_ < 0) {
    throw std::runtime_error("cannot connect to " + formatHostPort(host, port) + ": " +
                             std::strerror(errno));
  }
  int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

RawConnection::RawConnection(RawConnection&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }

RawConnection::~RawConnection() { close(); }

void RawConnection::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void RawConnection::shutdownWrite() { ::shutdown(fd_, SHUT_WR); }

void RawConnection::send(const Bytes& bytes) {
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw std::runtime_error(std::string("send: ") + std::strerror(errno));
    off += static_cast<size_t>(n);
  }
}

std::optional<Bytes> RawConnection::read(size_t n, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  Bytes out(n);
  size_t got = 0;
  while (got < n) {
    pollfd p{fd_, POLLIN, 0};
    int rc = ::poll(&p, 1, remaining(deadline));
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) return std::nullopt;
    ssize_t r = ::recv(fd_, out.data() + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return std::nullopt;
    got += static_cast<size_t>(r);
  }
  return out;
}

bool RawConnection::closedByPeer(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    pollfd p{fd_, POLLIN, 0};
    int rc = ::poll(&p, 1, remaining(deadline));
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) return false;
    uint8_t b;
    ssize_t r = ::recv(fd_, &b, 1, 0);
    if (r < 0 && errno == EINTR) continue;
    return r <= 0;  // 0 = EOF, <0 = reset; data means not closed
  }
}

bool RawConnection::silentFor(std::chrono::milliseconds quiet) {
  pollfd p{fd_, POLLIN, 0};
  int rc;
  do {
    rc = ::poll(&p, 1, static_cast<int>(quiet.count()));
  } while (rc < 0 && errno == EINTR);
  return rc == 0;
}

ChildProcess::ChildProcess(const std::vector<std::string>& argv,
                           const std::map<std::string, std::string>& env) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  std::map<std::string, std::string> merged;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv(*e);
    auto eq = kv.find('=');
    if (eq != std::string::npos) merged[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const auto& kv : env) merged[kv.first] = kv.second;
  std::vector<std::string> env_strings;
  for (const auto& kv : merged) env_strings.push_back(kv.first + "=" + kv.second);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = argv;
  std::vector<char*> argp;
  for (auto& s : args) argp.push_back(s.data());
  argp.push_back(nullptr);

  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    ::dup2(fds[1], STDOUT_FILENO);
    ::dup2(fds[1], STDERR_FILENO);
    ::execve(argp[0], argp.data(), envp.data());
    std::fprintf(stderr, "exec %s: %s\n", argp[0], std::strerror(errno));
    ::_exit(127);
  }
  ::close(fds[1]);
  out_fd_ = fds[0];
}

ChildProcess::~ChildProcess() {
  if (!status_ && pid_ > 0) {
    ::kill(pid_, SIGKILL);
    int st = 0;
    ::waitpid(pid_, &st, 0);
  }
  if (out_fd_ >= 0) ::close(out_fd_);
}

bool ChildProcess::readSome(std::chrono::milliseconds timeout) {
  if (eof_) return false;
  pollfd p{out_fd_, POLLIN, 0};
  int rc;
  do {
    rc = ::poll(&p, 1, static_cast<int>(timeout.count()));
  } while (rc < 0 && errno == EINTR);
  if (rc <= 0) return false;
  char buf[4096];
  ssize_t n = ::read(out_fd_, buf, sizeof(buf));
  if (n <= 0) {
    eof_ = true;
    return false;
  }
  output_.append(buf, static_cast<size_t>(n));
  return true;
}

std::optional<std::string> ChildProcess::waitForLine(const std::string& prefix,
                                                     std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    size_t nl;
    while ((nl = output_.find('\n', line_scan_)) != std::string::npos) {
      std::string line = output_.substr(line_scan_, nl - line_scan_);
      line_scan_ = nl + 1;
      if (line.rfind(prefix, 0) == 0) return line;
    }
    int left = remaining(deadline);
    if (left == 0 || eof_) return std::nullopt;
    readSome(std::chrono::milliseconds(left));
  }
}

bool ChildProcess::waitForText(const std::string& text, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (output_.find(text) == std::string::npos) {
    int left = remaining(deadline);
    if (left == 0 || eof_) return false;
    readSome(std::chrono::milliseconds(left));
  }
  return true;
}

std::optional<int> ChildProcess::wait(std::chrono::milliseconds timeout) {
  if (status_) return status_;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  // Drain output until EOF (the child closed its end, normally by exiting), then reap. A
  // child that exited while a descendant it left behind still holds the pipe is reaped
  // anyway: its buffered output is read and the wait ends, rather than at the deadline.
  while (!eof_ && remaining(deadline) > 0) {
    readSome(std::chrono::milliseconds(std::min(remaining(deadline), 100)));
    int st = 0;
    if (!eof_ && ::waitpid(pid_, &st, WNOHANG) == pid_) {
      status_ = st;
      readAvailable(std::chrono::milliseconds(20));
      return status_;
    }
  }
  while (true) {
    int st = 0;
    pid_t r = ::waitpid(pid_, &st, WNOHANG);
    if (r == pid_) {
      status_ = st;
      return status_;
    }
    if (remaining(deadline) == 0) return std::nullopt;
    // The output pipe closed but the process has not been reaped yet (or it handed the pipe
    // to nobody): poll the exit in short steps, still bounded by the deadline.
    ::usleep(1000);
  }
}

void ChildProcess::readAvailable(std::chrono::milliseconds quiet) {
  const auto deadline = std::chrono::steady_clock::now() + 10 * quiet;  // a chatty child too
  while (std::chrono::steady_clock::now() < deadline && readSome(quiet)) {
  }
}

void ChildProcess::signal(int signo) {
  if (!status_ && pid_ > 0) ::kill(pid_, signo);
}

int exitCodeOf(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return -1;
}

TempDir::TempDir() {
  std::string base = std::filesystem::temp_directory_path() / "cpprun-test-XXXXXX";
  std::vector<char> buf(base.begin(), base.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = buf.data();
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

int freeTcpPort() {
  int ephemeral_low = 32768;
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  range >> ephemeral_low;
  const int low = 10000;
  const int span = std::max(1000, ephemeral_low - low);
  static std::atomic<unsigned> calls{0};
  const int start =
      static_cast<int>((static_cast<unsigned>(::getpid()) * 7919u + calls.fetch_add(1) * 101u) %
                       static_cast<unsigned>(span));
  for (int i = 0; i < span; ++i) {
    const int port = low + (start + i) % span;
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
      throw std::runtime_error(std::string("freeTcpPort: socket: ") + std::strerror(errno));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    const bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    ::close(fd);
    if (free) return port;
  }
  throw std::runtime_error("freeTcpPort: no free TCP port in " + std::to_string(low) + ".." +
                           std::to_string(low + span - 1));
}

std::string sourcePath(const std::string& relative) {
  return std::string(CPPRUN_SOURCE_DIR) + "/" + relative;
}

std::string runDirectoryOf(const std::string& log_dir, const std::string& run_id) {
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(log_dir, ec)) {
    const std::string name = entry.path().filename().string();
    // "<run id>_" and mkdtemp's six characters.
    if (name.size() == run_id.size() + 7 && name.rfind(run_id + "_", 0) == 0 &&
        entry.is_directory(ec) && !entry.is_symlink(ec)) {
      found.push_back(entry.path().string());
    }
  }
  return found.size() == 1 ? found[0] : std::string();
}

}  // namespace cpprun::testing
