// cpprun-store: the TCP store as a standalone daemon, for users who want a store outside any job.
//
//   cpprun-store --host 127.0.0.1 --port 29500
//
// Prints "cpprun-store listening on HOST:PORT" on stdout once it accepts connections (port 0
// picks a free one), serves until SIGTERM or SIGINT, then closes every connection and exits 0.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "common/asio.h"
#include "common/command_line.h"
#include "common/logging.h"
#include "common/network_address.h"
#include "common/system.h"
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
  --expected-clients N     how many clients the job connects; more than one accept queue
                           (net.core.somaxconn) holds: listen on several sockets sharing the
                           port (SO_REUSEPORT), and warn if even they hold too few
  --max-key-bytes N        longest key accepted (default 8192)
  --max-value-bytes N      largest value accepted (default 8388608)
  --max-keys-per-request N most keys in one CHECK/WAIT/MULTI_* request (default 131072)
  --max-request-bytes N    most bytes one connection may have buffered of a request it has
                           not finished sending (default 67108864, and at least one COMPARE_SET
                           of the largest key and two of the largest values)
  --legacy-numbering V     how clients without the torch >= 2.2 handshake are read: 1.13
                           (default; a connection switches to 2.1 on requests only torch 2.1
                           sends) or 2.1 (every such client is torch 2.1)
  --log-level LEVEL        debug, info, warn or error (default info; env CPPRUN_LOG_LEVEL)
  --help                   show this help and exit
  --version                print the version and exit

On start it prints "cpprun-store listening on HOST:PORT" on stdout.
A request over a limit, an unknown query type or a malformed frame closes only that
connection, with one warning line on stderr (at most 5 such lines per 10 s; the drops beyond
are counted and reported in one summary line).
)";

[[noreturn]] void usageError(const std::string& message) {
  std::cerr << "cpprun-store: " << message << "\n"
            << "Try 'cpprun-store --help' for more information.\n";
  std::exit(2);
}

uint64_t number(const std::string& flag, cpprun::Result<std::string> text, uint64_t max) {
  if (!text.isOk()) usageError(text.status().message());
  auto n = cpprun::parseUnsigned(flag, text.value(), max);
  if (!n.isOk()) usageError(n.status().message());
  return n.value();
}

std::string text(cpprun::Result<std::string> value) {
  if (!value.isOk()) usageError(value.status().message());
  return std::move(value).value();
}

}  // namespace

int main(int argc, char** argv) {
  cpprun::setLogProgramName("cpprun-store");
  TcpStoreServerOptions options;
  options.port = 29500;
  bool request_budget_given = false;

  cpprun::OptionCursor args(argc, argv);
  while (args.next()) {
    const std::string& name = args.name();
    if (name == "--help" || name == "-h") {
      std::cout << kUsage;
      return 0;
    }
    if (name == "--version") {
      std::cout << "cpprun-store " << CPPRUN_VERSION << "\n";
      return 0;
    }
    if (!args.isOption()) usageError("unexpected argument '" + name + "'");
    if (name == "--host") {
      options.host = text(args.value());
      if (options.host.empty()) usageError("--host must not be empty");
    } else if (name == "--port") {
      options.port = static_cast<uint16_t>(number(name, args.value(), 65535));
    } else if (name == "--max-connections") {
      options.max_connections = number(name, args.value(), 1u << 24);
    } else if (name == "--expected-clients") {
      options.expected_clients = number(name, args.value(), 1u << 24);
    } else if (name == "--max-key-bytes") {
      options.limits.max_key_bytes = number(name, args.value(), 1u << 30);
    } else if (name == "--max-value-bytes") {
      options.limits.max_value_bytes = number(name, args.value(), 1ull << 32);
    } else if (name == "--max-keys-per-request") {
      options.limits.max_keys_per_request = number(name, args.value(), 1u << 30);
    } else if (name == "--max-request-bytes") {
      options.max_request_bytes = number(name, args.value(), 1ull << 40);
      request_budget_given = true;
    } else if (name == "--legacy-numbering") {
      std::string v = text(args.value());
      if (v == "1.13") {
        options.no_handshake_dialect = cpprun::rendezvous::wire::Dialect::kLegacy;
      } else if (v == "2.1") {
        options.no_handshake_dialect = cpprun::rendezvous::wire::Dialect::kV21;
      } else {
        usageError("invalid value '" + v + "' for --legacy-numbering: expected 1.13 or 2.1");
      }
    } else if (name == "--log-level") {
      std::string level = text(args.value());
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
                   "' for --log-level: expected debug, info, warn or error");
      }
    } else {
      usageError("unknown option '" + name + "'");
    }
  }

  size_t largest = cpprun::rendezvous::largestSingleKeyRequest(options.limits);
  if (!request_budget_given) {
    options.max_request_bytes = std::max(options.max_request_bytes, largest);
  } else if (options.max_request_bytes < largest) {
    usageError("--max-request-bytes " + std::to_string(options.max_request_bytes) +
               " is below the largest request --max-key-bytes and --max-value-bytes allow (" +
               std::to_string(largest) + " bytes: a COMPARE_SET of one key and two values)");
  }

  cpprun::raiseOpenFileLimit();
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
  const std::string shown = cpprun::formatHostPort(server.value()->host(), server.value()->port());
  std::printf("cpprun-store listening on %s\n", shown.c_str());
  std::fflush(stdout);
  io.run();
  return 0;
}
