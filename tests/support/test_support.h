// Helpers for cpprun's tests: raw TCP connections that send exact bytes, child processes with
// captured output and a bounded wait, temporary directories, hex.
//
// Everything here is bounded in time: every read and wait takes a timeout, so a broken server
// fails a test instead of hanging it.
// Thread safety: each object belongs to one thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "rendezvous/wire.h"

namespace cpprun::testing {

using Bytes = rendezvous::wire::Bytes;
using namespace std::chrono_literals;

Bytes fromHex(const std::string& hex);
// Bytes of a text.
Bytes bytesOf(const std::string& text);
// A request built field by field (see wire::Request for which fields each type uses).
rendezvous::wire::Request makeRequest(rendezvous::wire::QueryType type,
                                      std::vector<std::string> keys = {},
                                      std::vector<Bytes> values = {}, int64_t integer = 0,
                                      uint32_t u32 = 0);
std::string toHex(const Bytes& bytes);

// A plain blocking TCP connection for sending hand-made bytes.
class RawConnection {
 public:
  RawConnection(const std::string& host, uint16_t port);
  ~RawConnection();
  RawConnection(RawConnection&& other) noexcept;
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

  bool isOpen() const { return fd_ >= 0; }
  void send(const Bytes& bytes);
  void sendHex(const std::string& hex) { send(fromHex(hex)); }
  // Exactly n bytes, or nullopt if they did not all arrive within the timeout or the peer
  // closed first.
  std::optional<Bytes> read(size_t n, std::chrono::milliseconds timeout = 5s);
  // True if the server closed the connection (EOF or reset) within the timeout with no data.
  bool closedByPeer(std::chrono::milliseconds timeout = 5s);
  // True if nothing arrives within `quiet` (and the connection stays open).
  bool silentFor(std::chrono::milliseconds quiet);
  void shutdownWrite();
  void close();
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
};

// A child process with stdout and stderr captured into one pipe. The destructor SIGKILLs it and
// reaps it if it is still running.
class ChildProcess {
 public:
  // argv[0] is the program path. `env` entries are added to (or replace) the inherited ones.
  ChildProcess(const std::vector<std::string>& argv,
               const std::map<std::string, std::string>& env = {});
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  // Reads output until a line starting with `prefix` appears; returns that line (without the
  // newline) or nullopt on timeout / EOF.
  std::optional<std::string> waitForLine(const std::string& prefix,
                                         std::chrono::milliseconds timeout);
  // Reads output until it contains `text` anywhere (not only at a line start); returns whether
  // it did within the timeout.
  bool waitForText(const std::string& text, std::chrono::milliseconds timeout);
  // Waits for exit, reading the rest of the output. Returns the wait status, or nullopt if it
  // did not exit within the timeout.
  std::optional<int> wait(std::chrono::milliseconds timeout);
  // Reads what the child has written, until nothing more arrives for `quiet` (or EOF; at most
  // 10 x quiet): for showing a running child's output so far.
  void readAvailable(std::chrono::milliseconds quiet);
  void signal(int signo);
  // Everything read from the child so far.
  const std::string& output() const { return output_; }

 private:
  bool readSome(std::chrono::milliseconds timeout);

  pid_t pid_ = -1;
  int out_fd_ = -1;
  bool eof_ = false;
  std::optional<int> status_;
  std::string output_;
  size_t line_scan_ = 0;
};

// Exit code of a wait status, or 128 + signal.
int exitCodeOf(int wait_status);

// A fresh directory under $TMPDIR, removed with its contents by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A TCP port nobody listens on right now (multi-node jobs must know the store port in advance).
// Taken below the kernel's ephemeral range, from an offset that differs per test process: a
// port from bind(0) is free again the moment it is closed, and ctest -j2 once handed the same
// one to two concurrent tests (the second store host exited 3, "port in use"); below the
// ephemeral range no outgoing connection or gloo listener of another test can take it either.
// Safe to call from several threads. Throws std::runtime_error if the whole range is taken.
int freeTcpPort();

// Path of a file in the source tree, e.g. sourcePath("tests/torch/store_client.py").
std::string sourcePath(const std::string& relative);

// The run directory cpprun made under `log_dir` for `run_id`: the one real directory named
// `<run id>_<random>` there (docs/supervision.md#output), or "" when there is none or more than
// one (a link of that form is not one: cpprun never makes links).
std::string runDirectoryOf(const std::string& log_dir, const std::string& run_id);

}  // namespace cpprun::testing
