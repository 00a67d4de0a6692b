// A real etcd cluster (Debian's etcd-server 3.4, /usr/bin/etcd) on loopback, for tests of the
// etcd rendezvous backend: N members started by the test process itself, each a child with its
// own data dir and log file under one temporary directory, optionally serving its clients over
// TLS with client-certificate authentication (the certificates are made by the fixture with the
// openssl CLI). The test can kill, restart, pause (SIGSTOP: alive but silent) and resume members
// and ask which one leads.
//
// On namespace hosts (options.hosts, tests/support/netns_hosts.h): member i runs inside host
// i + 1 and listens on that host's address only (client URL <address>:2379, peer URL
// <address>:2380), so the cluster spans the hosts and NetnsHosts::cutOff(i + 1) cuts member i
// off the others and from its clients for real. etcdctl then runs inside a host namespace too
// (the first host of the members asked that is not cut off), never in the root namespace,
// which the hosts' guard route keeps off the test subnet.
//
// Lifetime: the constructor returns only when every member answers `etcdctl endpoint health`
// (or throws std::runtime_error naming the member and quoting its log tail); the destructor
// SIGKILLs and reaps every member and removes the directory. Members carry PR_SET_PDEATHSIG =
// SIGKILL, so a test process that crashes leaves no etcd behind. (The death signal follows the
// thread that forked: create, kill and restart members from one long-lived thread, normally the
// test's own.)
//
// Ports: two per member (client, peer) from freeTcpPort(); if a member still finds its port
// taken (another test bound it between the probe and etcd's bind), the whole cluster is started
// again on fresh ports, up to three times.
//
// Every wait is bounded: the start by options.start_timeout, restart() likewise, each etcdctl
// run by its own timeout (dial 1 s, command 3 s, process 10 s).
//
// Thread safety: none; one test thread owns the cluster. The const methods that run etcdctl may
// be called from several threads at once.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace cpprun::testing {

class NetnsHosts;
class TempDir;

// PEM file paths. An empty cert/key means "no client certificate"; an empty ca means "do not
// name a CA" (etcdctl then trusts the system store only).
struct EtcdTlsFiles {
  std::string ca, cert, key;
};

struct EtcdClusterOptions {
  int members = 3;
  bool tls = false;  // https client URLs with --client-cert-auth (peers stay http)
  std::chrono::milliseconds start_timeout{30000};
  // Not owned; must outlive the cluster. nullptr: every member on loopback, ports from
  // freeTcpPort(). Else member i on host i + 1. REQUIRES: hosts->count() >= members.
  const NetnsHosts* hosts = nullptr;
};

// What an etcdctl run gave back: stdout and stderr apart (etcdctl writes its values to stdout
// and its errors and gRPC warnings to stderr).
struct EtcdctlResult {
  int exit_code = -1;  // 128 + signal if killed; -1 if it did not finish in time (then killed)
  bool timed_out = false;
  std::string out, err;
  bool ok() const { return exit_code == 0 && !timed_out; }
};

class EtcdCluster {
 public:
  // Starts all members concurrently and waits until every one is healthy; throws
  // std::runtime_error (with the failing member's log tail) if that does not happen within
  // options.start_timeout.
  explicit EtcdCluster(EtcdClusterOptions options = {});
  ~EtcdCluster();  // SIGKILL by pid, reap, remove its temp dir
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  int members() const;
  bool tls() const { return options_.tls; }
  // "127.0.0.1:PORT", or "<host address>:2379" on namespace hosts (client URL host:port).
  std::string endpoint(int member) const;
  std::string clientUrl(int member) const;  // "http://127.0.0.1:PORT" or "https://..."
  std::vector<std::string> endpoints() const;
  std::string endpointsFlag() const;  // comma-joined, for --rdzv-endpoint
  // The namespace host member runs on (1-based, NetnsHosts numbering); 0 on loopback.
  int hostOf(int member) const;
  // Index of the current leader, -1 if none: asks every running, unpaused member whose host is
  // not cut off (etcdctl endpoint status) and believes the answer with the highest raft term.
  // Bounded (~3 s).
  int leader() const;
  // Polls leader() until it is >= 0 and != `not_this` (-1: any), up to `timeout`; returns the
  // leader or -1.
  int waitForLeader(std::chrono::milliseconds timeout, int not_this = -1) const;
  // Makes `member` the leader (etcdctl move-leader, sent to the current leader) and waits until
  // leader() says so, up to `timeout`; false if that did not happen.
  bool moveLeader(int member, std::chrono::milliseconds timeout) const;
  // Whether `member` alone answers `etcdctl endpoint health` (bounded, ~3 s).
  bool healthy(int member) const;
  void kill(int member);     // SIGKILL, reaped. REQUIRES: running(member)
  void restart(int member);  // start a killed member again with its data dir; wait until healthy
  void pause(int member);    // SIGSTOP: alive but silent (a member cut off)
  void resume(int member);   // SIGCONT
  bool running(int member) const;  // started, not killed (a paused member is running)
  bool paused(int member) const;
  pid_t pid(int member) const;  // of the current (or last) process of that member
  std::string logTail(int member, size_t lines = 40) const;  // for failure messages
  std::string dataDir(int member) const;

  // TLS (options.tls): a CA, a server certificate (IP SAN 127.0.0.1, DNS localhost) shared by
  // the members, and client certificates, made by the fixture with the openssl CLI. Empty paths
  // when the cluster is plain.
  EtcdTlsFiles clientTls() const;           // signed by the cluster's CA
  EtcdTlsFiles untrustedClientTls() const;  // ca = the cluster's CA, cert signed by ANOTHER CA
  std::string caFile() const;

  // Runs etcdctl against every member's endpoint (with clientTls() when tls) and returns its
  // stdout; throws std::runtime_error with stderr if it fails or takes longer than 10 s.
  std::string etcdctl(const std::vector<std::string>& args) const;
  // The same, but returns the outcome instead of throwing, with the given client credentials
  // (used when tls; see EtcdTlsFiles for empty fields) and endpoints (empty: all members).
  EtcdctlResult runEtcdctl(const std::vector<std::string>& args) const;
  EtcdctlResult runEtcdctlAs(const EtcdTlsFiles& credentials, const std::vector<std::string>& args,
                             const std::vector<std::string>& endpoints = {}) const;

 private:
  struct Member;
  void makeCertificates();
  void startAll();
  void spawn(int member);
  void reapIfExited(int member) const;
  bool saidReady(int member) const;
  void waitHealthy(const std::vector<int>& which, std::chrono::steady_clock::time_point deadline);
  void stopAll();
  void loadMemberIds();
  int netnsFdFor(const std::vector<std::string>& urls) const;
  std::string bindHost(int member) const;
  const Member& at(int member) const;
  Member& at(int member);

  EtcdClusterOptions options_;
  std::unique_ptr<TempDir> dir_;
  std::string token_;
  mutable std::vector<Member> members_;
  EtcdTlsFiles server_, client_, untrusted_client_;
};

}  // namespace cpprun::testing
