// cpprun-store: the TCP store as a standalone daemon, for users who want a store outside any job.
//
//   cpprun-store --host 127.0.0.1 --port 29500
//
// Prints "cpprun-store listening on HOST:PORT" on stdout once it accepts connections (port 0
// picks a free one), serves until SIGTERM or SIGINT, then closes every connection and exits 0.
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "common/asio.h"
#include "common/logging.h"
#include "rendezvous/tcp_store_server.h"

#ifndef CPPRUN_VERSION
#define CPPRUN_VERSION "0.0.0"
#endif

namespace {

using cpprun::rendezvous::TcpStoreServer;
using cpprun::rendezvous::TcpStoreServerOptions;

constexpr const char* kUsage = R"(Usage: cpprun-store [options]

Serves a key-value store that speaks PyTorch's TCPStore protocol (torch 1.13 to 2.x clients,
dialect chosen per connection) until SIGTERM or SIGINT.

Options:
  --host ADDR              address to bind (default 127.0.0.1); 0.0.0.0 or :: binds every
                           interface
  --port N                 port to bind (default 29500); 0 picks a free port
  --max-connections N      connections beyond N are refused with a warning (default 65536)
  --max-key-bytes N        longest key accepted (default 8192)
  --max-value-bytes N      largest value accepted (default 8388608)
  --max-keys-per-request N most keys in one CHECK/WAIT/MULTI_* request (default 131072)
  --log-level LEVEL        debug, info, warn or error (default info; env CPPRUN_LOG_LEVEL)
  --help                   show this help and exit
  --version                print the version and exit

On start it prints "cpprun-store listening on HOST:PORT" on stdout.
A request over a limit, an unknown query type or a malformed frame closes only that
connection, with one warning line on stderr.
)";

[[noreturn]] void usageError(const std::string& message) {
  std::cerr << "cpprun-store: " << message << "\n"
            << "Try 'cpprun-store --help' for more information.\n";
  std::exit(2);
}

uint64_t parseNumber(const std::string& flag, const std::string& value, uint64_t max) {
  if (value.empty() || value.find_first_not_of("0123456789") != std::string::npos) {
    usageError("invalid value '" + value + "' for " + flag + ": expected a non-negative integer");
  }
  errno = 0;
  unsigned long long v = std::strtoull(value.c_str(), nullptr, 10);
  if (errno == ERANGE || v > max) {
    usageError("value " + value + " for " + flag + " is out of range (at most " +
               std::to_string(max) + ")");
  }
  return v;
}

// Lets one process hold thousands of client connections.
void raiseOpenFileLimit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
}

}  // namespace

int main(int argc, char** argv) {
  cpprun::setLogProgramName("cpprun-store");
  TcpStoreServerOptions options;
  options.port = 29500;

  std::vector<std::string> args(argv + 1, argv + argc);
  for (size_t i = 0; i < args.size(); ++i) {
    std::string arg = args[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      return 0;
    }
    if (arg == "--version") {
      std::cout << "cpprun-store " << CPPRUN_VERSION << "\n";
      return 0;
    }
    if (arg.rfind("--", 0) != 0) usageError("unexpected argument '" + arg + "'");
    std::string name = arg;
    std::string value;
    bool has_value = false;
    auto eq = arg.find('=');
    if (eq != std::string::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      has_value = true;
    }
    for (auto& c : name) {
      if (c == '_') c = '-';
    }
    auto takeValue = [&]() {
      if (has_value) return value;
      if (i + 1 >= args.size()) usageError("option " + name + " needs a value");
      return args[++i];
    };
    if (name == "--host") {
      options.host = takeValue();
      if (options.host.empty()) usageError("--host must not be empty");
    } else if (name == "--port") {
      options.port = static_cast<uint16_t>(parseNumber(name, takeValue(), 65535));
    } else if (name == "--max-connections") {
      options.max_connections = parseNumber(name, takeValue(), 1u << 24);
    } else if (name == "--max-key-bytes") {
      options.limits.max_key_bytes = parseNumber(name, takeValue(), 1u << 30);
    } else if (name == "--max-value-bytes") {
      options.limits.max_value_bytes = parseNumber(name, takeValue(), 1ull << 32);
    } else if (name == "--max-keys-per-request") {
      options.limits.max_keys_per_request = parseNumber(name, takeValue(), 1u << 30);
    } else if (name == "--log-level") {
      std::string level = takeValue();
      if (level == "debug") {
        cpprun::setLogLevel(cpprun::LogLevel::kDebug);
      } else if (level == "info") {
        cpprun::setLogLevel(cpprun::LogLevel::kInfo);
      } else if (level == "warn") {
        cpprun::setLogLevel(cpprun::LogLevel::kWarn);
      } else if (level == "error") {
        cpprun::setLogLevel(cpprun::LogLevel::kError);
      } else {
        usageError("invalid value '" + level +
                   "' for --log-level: expected debug, info, warn "
                   "or error");
      }
    } else {
      usageError("unknown option '" + name + "'");
    }
  }

  raiseOpenFileLimit();
  boost::asio::io_context io(1);
  auto server = TcpStoreServer::create(io, options);
  if (!server.isOk()) {
    std::cerr << "cpprun-store: " << server.status().message() << "\n";
    return 1;
  }
  boost::asio::signal_set signals(io, SIGTERM, SIGINT);
  signals.async_wait([&](const boost::system::error_code& ec, int signo) {
    if (ec) return;
    auto stats = server.value()->stats();
    CPPRUN_LOG(kInfo) << "received " << (signo == SIGTERM ? "SIGTERM" : "SIGINT")
                      << ", shutting down (" << stats.connections_open << " connections open, "
                      << stats.requests << " requests served, " << stats.keys << " keys)";
    server.value()->stop();
    io.stop();
  });
  const std::string& host = server.value()->host();
  std::string shown = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  std::printf("cpprun-store listening on %s:%u\n", shown.c_str(),
              static_cast<unsigned>(server.value()->port()));
  std::fflush(stdout);
  io.run();
  return 0;
}
