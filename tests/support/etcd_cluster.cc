#include "tests/support/etcd_cluster.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "common/network_address.h"
#include "tests/support/netns_hosts.h"
#include "tests/support/test_support.h"

namespace cpprun::testing {

namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kEtcd = "/usr/bin/etcd";
constexpr const char* kEtcdctl = "/usr/bin/etcdctl";
constexpr const char* kOpenssl = "/usr/bin/openssl";
constexpr std::chrono::milliseconds kEtcdctlProcessTimeout{10000};
constexpr std::chrono::milliseconds kHealthPoll{20};
constexpr int kStartAttempts = 3;
constexpr std::chrono::milliseconds kReadyGate{3000};
// On namespace hosts every member has a host (and so a port space) of its own.
constexpr int kNetnsClientPort = 2379;
constexpr int kNetnsPeerPort = 2380;

std::string joined(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : sep) + p;
  return out;
}

std::vector<char*> argvOf(std::vector<std::string>& args) {
  std::vector<char*> argp;
  for (auto& s : args) argp.push_back(s.data());
  argp.push_back(nullptr);
  return argp;
}

// In the child between fork and exec: only async-signal-safe calls. Dies with the parent
// (thread), enters the network namespace netns_fd names (unless -1), closes every inherited
// descriptor above stderr so that no pipe of another test's child stays open in an etcd.
[[noreturn]] void execChild(char* const* argp, int out_fd, int err_fd, pid_t parent, int netns_fd) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(126);
  if (netns_fd >= 0 && ::setns(netns_fd, CLONE_NEWNET) != 0) {
    const char msg[] = "setns (network namespace) failed\n";
    (void)!::write(err_fd, msg, sizeof msg - 1);
    ::_exit(125);
  }
  ::dup2(out_fd, STDOUT_FILENO);
  ::dup2(err_fd, STDERR_FILENO);
  const int devnull = ::open("/dev/null", O_RDONLY);
  if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
  ::close_range(3, ~0u, 0);
  ::execv(argp[0], argp);
  const char msg[] = "exec failed\n";
  (void)!::write(STDERR_FILENO, msg, sizeof msg - 1);
  ::_exit(127);
}

// Runs argv[0] (in the network namespace of netns_fd unless -1) with stdout and stderr captured
// apart; kills it at the deadline.
EtcdctlResult runCaptured(std::vector<std::string> args, std::chrono::milliseconds timeout,
                          int netns_fd = -1) {
  EtcdctlResult result;
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  if (::pipe2(err, O_CLOEXEC) != 0) {
    ::close(out[0]);
    ::close(out[1]);
    throw std::runtime_error("pipe failed");
  }
  auto argp = argvOf(args);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) execChild(argp.data(), out[1], err[1], parent, netns_fd);
  ::close(out[1]);
  ::close(err[1]);
  const auto deadline = Clock::now() + timeout;
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  std::string* sinks[2] = {&result.out, &result.err};
  int open_fds = 2;
  while (open_fds > 0) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      result.timed_out = true;
      break;
    }
    const int rc = ::poll(fds, 2, static_cast<int>(left));
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buf[4096];
      const ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
      if (n > 0) {
        sinks[i]->append(buf, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  for (auto& f : fds) {
    if (f.fd >= 0) ::close(f.fd);
  }
  if (result.timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!result.timed_out) result.exit_code = exitCodeOf(status);
  return result;
}

void writeFile(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
  if (!f) throw std::runtime_error("cannot write " + path);
}

void openssl(const std::vector<std::string>& args) {
  std::vector<std::string> argv{kOpenssl};
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = runCaptured(argv, std::chrono::milliseconds(20000));
  if (!r.ok()) {
    throw std::runtime_error("EtcdCluster: `openssl " + joined(args, " ") + "` failed (exit " +
                             std::to_string(r.exit_code) + "): " + r.err);
  }
}

// A P-256 key and a certificate for it signed by ca (self-signed when ca is empty).
EtcdTlsFiles makeCert(const std::string& dir, const std::string& name, const std::string& subject,
                      const EtcdTlsFiles& ca, const std::string& extensions, int serial) {
  EtcdTlsFiles f{ca.cert, dir + "/" + name + ".crt", dir + "/" + name + ".key"};
  const std::vector<std::string> key{
      "-newkey", "ec",    "-pkeyopt",      "ec_paramgen_curve:prime256v1", "-nodes", "-keyout",
      f.key,     "-subj", "/CN=" + subject};
  if (ca.cert.empty()) {
    std::vector<std::string> args{"req", "-x509", "-days", "2", "-out", f.cert};
    args.insert(args.end(), key.begin(), key.end());
    openssl(args);
    f.ca = f.cert;
    return f;
  }
  const std::string csr = dir + "/" + name + ".csr";
  const std::string ext = dir + "/" + name + ".ext";
  std::vector<std::string> req{"req", "-out", csr};
  req.insert(req.end(), key.begin(), key.end());
  openssl(req);
  writeFile(ext, extensions);
  openssl({"x509", "-req", "-in", csr, "-CA", ca.cert, "-CAkey", ca.key, "-set_serial",
           std::to_string(serial), "-days", "2", "-extfile", ext, "-out", f.cert});
  return f;
}

// The network namespace file of a host, opened for setns (close it after the fork).
int openNetns(const NetnsHosts& hosts, int host) {
  const std::string path = hosts.netnsPath(host);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw std::runtime_error("EtcdCluster: cannot open " + path + ": " + std::strerror(errno));
  }
  return fd;
}

// Closes a descriptor at the end of a scope (-1: nothing).
struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

// True if something accepts TCP connections on 127.0.0.1:port (a cheap check before etcdctl,
// whose every failed dial costs its whole dial timeout).
bool accepts(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

std::string tailOf(const std::string& path, size_t lines) {
  std::ifstream f(path);
  if (!f) return "(no log at " + path + ")";
  std::deque<std::string> last;
  std::string line;
  while (std::getline(f, line)) {
    last.push_back(line);
    if (last.size() > lines) last.pop_front();
  }
  std::string out;
  for (const auto& l : last) out += l + "\n";
  return out;
}

}  // namespace

struct EtcdCluster::Member {
  std::string name;
  int client_port = 0;
  int peer_port = 0;
  std::string data_dir, log_path;
  pid_t pid = -1;
  bool alive = false;            // started and not yet reaped
  bool stopped = false;          // SIGSTOPped
  uint64_t id = 0;               // etcd's member id, learnt after the start
  std::streamoff log_start = 0;  // where this process's part of the (appended) log begins
  Clock::time_point spawned;
};

EtcdCluster::EtcdCluster(EtcdClusterOptions options)
    : options_(options), dir_(std::make_unique<TempDir>()) {
  if (options_.members < 1) {
    throw std::invalid_argument("EtcdCluster: members must be >= 1, got " +
                                std::to_string(options_.members));
  }
  for (const char* tool : {kEtcd, kEtcdctl}) {
    if (::access(tool, X_OK) != 0) {
      throw std::runtime_error(std::string("EtcdCluster: ") + tool +
                               " is missing (packaging/setup.sh installs etcd-server and "
                               "etcd-client)");
    }
  }
  if (options_.hosts != nullptr && options_.hosts->count() < options_.members) {
    throw std::invalid_argument("EtcdCluster: " + std::to_string(options_.members) +
                                " members need as many namespace hosts, got " +
                                std::to_string(options_.hosts->count()));
  }
  static std::atomic<int> clusters{0};
  token_ = "cpprun-test-" + std::to_string(::getpid()) + "-" + std::to_string(clusters++);
  try {
    if (options_.tls) makeCertificates();
    startAll();
    loadMemberIds();
  } catch (...) {
    stopAll();
    throw;
  }
}

EtcdCluster::~EtcdCluster() { stopAll(); }

void EtcdCluster::makeCertificates() {
  if (::access(kOpenssl, X_OK) != 0) {
    throw std::runtime_error(std::string("EtcdCluster: ") + kOpenssl +
                             " is missing (packaging/setup.sh installs openssl)");
  }
  const std::string d = dir_->path();
  const EtcdTlsFiles ca = makeCert(d, "ca", "cpprun-test-ca", {}, "", 1);
  std::string san = "subjectAltName=IP:127.0.0.1,DNS:localhost";
  for (int i = 0; i < options_.members && options_.hosts != nullptr; ++i) {
    san += ",IP:" + bindHost(i);
  }
  server_ = makeCert(d, "server", "etcd", ca,
                     san +
                         "\n"
                         // The 3.4 gRPC gateway dials its own client URL with the server's
                         // certificate, so it must be good for client authentication too.
                         "extendedKeyUsage=serverAuth,clientAuth\n",
                     2);
  client_ = makeCert(d, "client", "cpprun-test-client", ca, "extendedKeyUsage=clientAuth\n", 3);
  const EtcdTlsFiles other_ca = makeCert(d, "other-ca", "cpprun-test-other-ca", {}, "", 1);
  untrusted_client_ = makeCert(d, "untrusted-client", "cpprun-test-client", other_ca,
                               "extendedKeyUsage=clientAuth\n", 4);
  untrusted_client_.ca = ca.cert;  // the server is trusted; only the client's cert is not
}

void EtcdCluster::startAll() {
  std::string last_error;
  for (int attempt = 1; attempt <= kStartAttempts; ++attempt) {
    stopAll();
    members_.assign(static_cast<size_t>(options_.members), Member{});
    const std::string suffix = attempt == 1 ? "" : "-try" + std::to_string(attempt);
    for (int i = 0; i < options_.members; ++i) {
      Member& m = members_[static_cast<size_t>(i)];
      m.name = "m" + std::to_string(i);
      m.client_port = options_.hosts != nullptr ? kNetnsClientPort : freeTcpPort();
      m.peer_port = options_.hosts != nullptr ? kNetnsPeerPort : freeTcpPort();
      m.data_dir = dir_->path() + "/" + m.name + suffix + ".etcd";
      m.log_path = dir_->path() + "/" + m.name + suffix + ".log";
    }
    for (int i = 0; i < options_.members; ++i) spawn(i);
    std::vector<int> all;
    for (int i = 0; i < options_.members; ++i) all.push_back(i);
    try {
      waitHealthy(all, Clock::now() + options_.start_timeout);
      return;
    } catch (const std::runtime_error& e) {
      last_error = e.what();
      bool port_taken = false;
      for (int i = 0; i < options_.members; ++i) {
        if (tailOf(at(i).log_path, 200).find("address already in use") != std::string::npos) {
          port_taken = true;
        }
      }
      if (!port_taken) throw;
    }
  }
  throw std::runtime_error("EtcdCluster: ports kept being taken in " +
                           std::to_string(kStartAttempts) + " attempts; last: " + last_error);
}

void EtcdCluster::spawn(int member) {
  Member& m = at(member);
  const std::string scheme = options_.tls ? "https" : "http";
  std::vector<std::string> peers;
  for (int i = 0; i < members(); ++i) {
    peers.push_back(at(i).name + "=http://" + formatHostPort(bindHost(i), at(i).peer_port));
  }
  const std::string client_url = scheme + "://" + formatHostPort(bindHost(member), m.client_port);
  const std::string peer_url = "http://" + formatHostPort(bindHost(member), m.peer_port);
  std::vector<std::string> args{kEtcd,
                                "--name=" + m.name,
                                "--data-dir=" + m.data_dir,
                                "--listen-client-urls=" + client_url,
                                "--advertise-client-urls=" + client_url,
                                "--listen-peer-urls=" + peer_url,
                                "--initial-advertise-peer-urls=" + peer_url,
                                "--initial-cluster=" + joined(peers, ","),
                                "--initial-cluster-state=new",
                                "--initial-cluster-token=" + token_,
                                "--heartbeat-interval=50",
                                "--election-timeout=500"};
  if (options_.tls) {
    args.insert(args.end(), {"--cert-file=" + server_.cert, "--key-file=" + server_.key,
                             "--trusted-ca-file=" + server_.ca, "--client-cert-auth"});
  }
  const int log = ::open(m.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log < 0) {
    throw std::runtime_error("EtcdCluster: cannot open " + m.log_path + ": " +
                             std::strerror(errno));
  }
  m.log_start = ::lseek(log, 0, SEEK_END);
  FdCloser netns{-1};
  if (options_.hosts != nullptr) {
    try {
      netns.fd = openNetns(*options_.hosts, hostOf(member));
    } catch (...) {
      ::close(log);
      throw;
    }
  }
  m.spawned = Clock::now();
  auto argp = argvOf(args);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(log);
    throw std::runtime_error("EtcdCluster: fork failed");
  }
  if (pid == 0) execChild(argp.data(), log, log, parent, netns.fd);
  ::close(log);
  m.pid = pid;
  m.alive = true;
  m.stopped = false;
}

void EtcdCluster::reapIfExited(int member) const {
  Member& m = members_.at(static_cast<size_t>(member));
  if (!m.alive) return;
  int status = 0;
  if (::waitpid(m.pid, &status, WNOHANG) == m.pid) m.alive = false;
}

bool EtcdCluster::saidReady(int member) const {
  std::ifstream f(at(member).log_path);
  f.seekg(at(member).log_start);
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return text.find("ready to serve client requests") != std::string::npos;
}

void EtcdCluster::waitHealthy(const std::vector<int>& which, Clock::time_point deadline) {
  std::vector<std::string> eps;
  for (int i : which) eps.push_back(clientUrl(i));
  EtcdctlResult last;
  last.err = "(not run: some client port never accepted a TCP connection)";
  while (true) {
    for (int i : which) {
      reapIfExited(i);
      if (!at(i).alive) {
        throw std::runtime_error("EtcdCluster: member " + std::to_string(i) + " (pid " +
                                 std::to_string(at(i).pid) + ") exited while starting; log " +
                                 at(i).log_path + ":\n" + logTail(i));
      }
    }
    // etcdctl is asked only once every member listens and has said it serves: a gRPC dial
    // made before that backs off for seconds (a 3-member start took 2.3 s instead of 0.5 s).
    // Should this etcd word its log differently, the gate opens 3 s after the spawn anyway.
    // (On namespace hosts the port cannot be probed from here: the log alone opens the gate.)
    bool listening = true;
    for (int i : which) {
      listening = listening && (options_.hosts != nullptr || accepts(at(i).client_port)) &&
                  (Clock::now() - at(i).spawned > kReadyGate || saidReady(i));
    }
    if (listening) {
      last = runEtcdctlAs(clientTls(), {"endpoint", "health"}, eps);
      if (last.ok()) return;
    }
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(kHealthPoll);  // the pace of a bounded poll, not a sync
  }
  std::string msg = "EtcdCluster: members {" + joined(eps, ",") +
                    "} not all healthy before the deadline; etcdctl said:\n" + last.out + last.err;
  for (int i : which) msg += "\n--- member " + std::to_string(i) + " log tail:\n" + logTail(i);
  throw std::runtime_error(msg);
}

void EtcdCluster::loadMemberIds() {
  const auto list = nlohmann::json::parse(etcdctl({"member", "list", "-w", "json"}));
  for (const auto& m : list.at("members")) {
    const std::string name = m.value("name", "");
    for (auto& mine : members_) {
      if (mine.name == name) mine.id = m.at("ID").get<uint64_t>();
    }
  }
  for (int i = 0; i < members(); ++i) {
    if (at(i).id == 0) {
      throw std::runtime_error("EtcdCluster: member " + at(i).name +
                               " missing from `etcdctl member list`");
    }
  }
}

void EtcdCluster::stopAll() {
  for (auto& m : members_) {
    if (!m.alive) continue;
    ::kill(m.pid, SIGKILL);
    int status = 0;
    while (::waitpid(m.pid, &status, 0) < 0 && errno == EINTR) {
    }
    m.alive = false;
    m.stopped = false;
  }
}

const EtcdCluster::Member& EtcdCluster::at(int member) const {
  if (member < 0 || member >= members()) {
    throw std::out_of_range("EtcdCluster: no member " + std::to_string(member) + " (have " +
                            std::to_string(members()) + ")");
  }
  return members_[static_cast<size_t>(member)];
}

EtcdCluster::Member& EtcdCluster::at(int member) {
  return const_cast<Member&>(static_cast<const EtcdCluster*>(this)->at(member));
}

int EtcdCluster::members() const { return static_cast<int>(members_.size()); }

std::string EtcdCluster::bindHost(int member) const {
  return options_.hosts != nullptr ? options_.hosts->address(hostOf(member)) : "127.0.0.1";
}

int EtcdCluster::hostOf(int member) const {
  at(member);  // range check
  return options_.hosts != nullptr ? member + 1 : 0;
}

std::string EtcdCluster::endpoint(int member) const {
  return formatHostPort(bindHost(member), at(member).client_port);
}

int EtcdCluster::netnsFdFor(const std::vector<std::string>& urls) const {
  if (options_.hosts == nullptr) return -1;
  int chosen = -1;
  for (const std::string& url : urls) {
    for (int i = 0; i < members(); ++i) {
      if (clientUrl(i) != url) continue;
      if (chosen < 0) chosen = i;  // all cut off: the first, whose etcdctl then fails
      if (!options_.hosts->isCutOff(hostOf(i))) return openNetns(*options_.hosts, hostOf(i));
    }
  }
  return openNetns(*options_.hosts, hostOf(chosen < 0 ? 0 : chosen));
}

std::string EtcdCluster::clientUrl(int member) const {
  return (options_.tls ? "https://" : "http://") + endpoint(member);
}

std::vector<std::string> EtcdCluster::endpoints() const {
  std::vector<std::string> out;
  for (int i = 0; i < members(); ++i) out.push_back(endpoint(i));
  return out;
}

std::string EtcdCluster::endpointsFlag() const { return joined(endpoints(), ","); }

int EtcdCluster::leader() const {
  std::vector<std::string> eps;
  for (int i = 0; i < members(); ++i) {
    const bool cut = options_.hosts != nullptr && options_.hosts->isCutOff(hostOf(i));
    if (running(i) && !paused(i) && !cut) eps.push_back(clientUrl(i));
  }
  if (eps.empty()) return -1;
  // A member that cannot reach the others may still believe in an old leader: the answer with
  // the highest raft term wins.
  const auto r = runEtcdctlAs(clientTls(), {"endpoint", "status", "-w", "json"}, eps);
  nlohmann::json statuses;
  try {
    statuses = nlohmann::json::parse(r.out);
  } catch (const nlohmann::json::exception&) {
    return -1;
  }
  uint64_t best_term = 0, leader_id = 0;
  for (const auto& s : statuses) {
    const auto& st = s.at("Status");
    const uint64_t term = st.value("raftTerm", uint64_t{0});
    const uint64_t lead = st.value("leader", uint64_t{0});
    if (lead != 0 && term >= best_term) {
      best_term = term;
      leader_id = lead;
    }
  }
  for (int i = 0; i < members(); ++i) {
    if (leader_id != 0 && at(i).id == leader_id) return i;
  }
  return -1;
}

int EtcdCluster::waitForLeader(std::chrono::milliseconds timeout, int not_this) const {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    const int l = leader();
    if (l >= 0 && l != not_this) return l;
    if (Clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(kHealthPoll);  // the pace of a bounded poll
  }
}

bool EtcdCluster::moveLeader(int member, std::chrono::milliseconds timeout) const {
  const auto deadline = Clock::now() + timeout;
  char id[17];
  std::snprintf(id, sizeof id, "%llx", static_cast<unsigned long long>(at(member).id));
  while (true) {
    const int current = leader();
    if (current == member) return true;
    if (current >= 0) {
      // Only the leader may hand over; an answer from a stale leader just means "try again".
      runEtcdctlAs(clientTls(), {"move-leader", id}, {clientUrl(current)});
    }
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(kHealthPoll);  // the pace of a bounded poll
  }
}

bool EtcdCluster::healthy(int member) const {
  return runEtcdctlAs(clientTls(), {"endpoint", "health"}, {clientUrl(member)}).ok();
}

void EtcdCluster::kill(int member) {
  Member& m = at(member);
  reapIfExited(member);
  if (!m.alive) throw std::logic_error("EtcdCluster::kill: member " + m.name + " is not running");
  ::kill(m.pid, SIGKILL);
  int status = 0;
  while (::waitpid(m.pid, &status, 0) < 0 && errno == EINTR) {
  }
  m.alive = false;
  m.stopped = false;
}

void EtcdCluster::restart(int member) {
  reapIfExited(member);
  if (at(member).alive) {
    throw std::logic_error("EtcdCluster::restart: member " + at(member).name +
                           " is still running (kill it first)");
  }
  spawn(member);
  waitHealthy({member}, Clock::now() + options_.start_timeout);
}

void EtcdCluster::pause(int member) {
  Member& m = at(member);
  if (!running(member)) {
    throw std::logic_error("EtcdCluster::pause: member " + m.name + " is not running");
  }
  ::kill(m.pid, SIGSTOP);
  m.stopped = true;
}

void EtcdCluster::resume(int member) {
  Member& m = at(member);
  if (!running(member)) {
    throw std::logic_error("EtcdCluster::resume: member " + m.name + " is not running");
  }
  ::kill(m.pid, SIGCONT);
  m.stopped = false;
}

bool EtcdCluster::running(int member) const {
  reapIfExited(member);
  return at(member).alive;
}

bool EtcdCluster::paused(int member) const { return running(member) && at(member).stopped; }

pid_t EtcdCluster::pid(int member) const { return at(member).pid; }

std::string EtcdCluster::logTail(int member, size_t lines) const {
  return tailOf(at(member).log_path, lines);
}

std::string EtcdCluster::dataDir(int member) const { return at(member).data_dir; }

EtcdTlsFiles EtcdCluster::clientTls() const { return client_; }

EtcdTlsFiles EtcdCluster::untrustedClientTls() const { return untrusted_client_; }

std::string EtcdCluster::caFile() const { return server_.ca; }

std::string EtcdCluster::etcdctl(const std::vector<std::string>& args) const {
  const auto r = runEtcdctl(args);
  if (!r.ok()) {
    throw std::runtime_error(
        "EtcdCluster: `etcdctl " + joined(args, " ") + "` " +
        (r.timed_out ? std::string("timed out") : "exited " + std::to_string(r.exit_code)) + ": " +
        r.err);
  }
  return r.out;
}

EtcdctlResult EtcdCluster::runEtcdctl(const std::vector<std::string>& args) const {
  return runEtcdctlAs(clientTls(), args);
}

EtcdctlResult EtcdCluster::runEtcdctlAs(const EtcdTlsFiles& credentials,
                                        const std::vector<std::string>& args,
                                        const std::vector<std::string>& endpoints) const {
  std::vector<std::string> eps = endpoints;
  if (eps.empty()) {
    for (int i = 0; i < members(); ++i) eps.push_back(clientUrl(i));
  }
  std::vector<std::string> argv{kEtcdctl, "--endpoints=" + joined(eps, ","), "--dial-timeout=1s",
                                "--command-timeout=3s"};
  if (options_.tls) {
    if (!credentials.ca.empty()) argv.push_back("--cacert=" + credentials.ca);
    if (!credentials.cert.empty()) argv.push_back("--cert=" + credentials.cert);
    if (!credentials.key.empty()) argv.push_back("--key=" + credentials.key);
  }
  argv.insert(argv.end(), args.begin(), args.end());
  FdCloser netns{netnsFdFor(eps)};
  return runCaptured(argv, kEtcdctlProcessTimeout, netns.fd);
}

}  // namespace cpprun::testing
