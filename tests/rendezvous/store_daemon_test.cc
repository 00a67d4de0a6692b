// The cpprun-store daemon as users run it: flags, the printed address, clean shutdown.
#include <signal.h>

#include <catch2/catch.hpp>

#include "rendezvous/tcp_store_client.h"
#include "tests/support/test_support.h"

namespace {

using namespace cpprun::rendezvous;
using namespace cpprun::testing;

uint16_t portFromLine(const std::string& line) {
  return static_cast<uint16_t>(std::stoi(line.substr(line.rfind(':') + 1)));
}

}  // namespace

TEST_CASE("cpprun-store prints its address and serves and exits 0 on SIGTERM and SIGINT",
          "[integration]") {
  for (int signo : {SIGTERM, SIGINT}) {
    ChildProcess daemon({CPPRUN_STORE_BINARY, "--host", "127.0.0.1", "--port", "0"});
    auto line = daemon.waitForLine("cpprun-store listening on ", 10s);
    REQUIRE(line.has_value());
    CHECK_THAT(*line, Catch::StartsWith("cpprun-store listening on 127.0.0.1:"));
    TcpStoreClientOptions o;
    o.port = portFromLine(*line);
    o.timeout = 5s;
    TcpStoreClient client(o);
    client.set("/k", std::string("v"));
    CHECK(toString(client.get("/k")) == "v");
    daemon.signal(signo);
    auto status = daemon.wait(10s);
    REQUIRE(status.has_value());
    CHECK(exitCodeOf(*status) == 0);
    CHECK_THAT(daemon.output(), Catch::Contains("shutting down"));
    CHECK_THROWS_AS(client.numKeys(), StoreError);  // the server closed our connection
  }
}

TEST_CASE("cpprun-store rejects bad flags with exit 2 naming the flag", "[integration]") {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--bogus"}, "unknown option '--bogus'"},
      {{"--port", "70000"}, "--port"},
      {{"--port", "abc"}, "invalid value 'abc' for --port"},
      {{"--port"}, "--port needs a value"},
      {{"--log-level=loud"}, "--log-level"},
      {{"--legacy-numbering", "2.0"}, "invalid value '2.0' for --legacy-numbering"},
      {{"stray"}, "unexpected argument 'stray'"},
  };
  for (const auto& [args, message] : cases) {
    std::vector<std::string> argv = {CPPRUN_STORE_BINARY};
    argv.insert(argv.end(), args.begin(), args.end());
    ChildProcess p(argv);
    auto status = p.wait(10s);
    REQUIRE(status.has_value());
    CHECK(exitCodeOf(*status) == 2);
    CHECK_THAT(p.output(), Catch::Contains(message));
  }
}

TEST_CASE("cpprun-store --legacy-numbering=2.1 reads a client without handshake as torch 2.1",
          "[integration]") {
  for (std::string numbering : {"1.13", "2.1"}) {
    INFO(numbering);
    ChildProcess daemon({CPPRUN_STORE_BINARY, "--port", "0", "--legacy-numbering", numbering});
    auto line = daemon.waitForLine("cpprun-store listening on ", 10s);
    REQUIRE(line.has_value());
    RawConnection c("127.0.0.1", portFromLine(*line));
    // Type 7 as a connection's first request: torch 2.1's DELETE_KEY (an i64 reply, 0 erased),
    // or, read as 1.13, WATCH_KEY (one byte, 03 KEY_CALLBACK_REGISTERED).
    c.sendHex("0705000000000000002f6b657931");
    if (numbering == "2.1") {
      auto reply = c.read(8, 5s);
      REQUIRE(reply.has_value());
      CHECK(toHex(*reply) == "0000000000000000");
    } else {
      auto reply = c.read(1, 5s);
      REQUIRE(reply.has_value());
      CHECK(toHex(*reply) == "03");
    }
    // A torch >= 2.2 client is served either way.
    RawConnection v2("127.0.0.1", portFromLine(*line));
    v2.sendHex("00cef7853c0d92100000");
    auto echo = v2.read(4, 5s);
    REQUIRE(echo.has_value());
    CHECK(toHex(*echo) == "92100000");
    daemon.signal(SIGTERM);
    auto status = daemon.wait(10s);
    REQUIRE(status.has_value());
    CHECK(exitCodeOf(*status) == 0);
  }
}

TEST_CASE("cpprun-store reports a port in use and exits 1", "[integration]") {
  ChildProcess first({CPPRUN_STORE_BINARY, "--port", "0"});
  auto line = first.waitForLine("cpprun-store listening on ", 10s);
  REQUIRE(line.has_value());
  std::string port = std::to_string(portFromLine(*line));
  ChildProcess second({CPPRUN_STORE_BINARY, "--port", port});
  auto status = second.wait(10s);
  REQUIRE(status.has_value());
  CHECK(exitCodeOf(*status) == 1);
  CHECK_THAT(second.output(), Catch::Contains("127.0.0.1:" + port));
  CHECK_THAT(second.output(), Catch::Contains("in use"));
}

TEST_CASE("cpprun-store --help and --version", "[integration]") {
  ChildProcess help({CPPRUN_STORE_BINARY, "--help"});
  REQUIRE(help.wait(10s).has_value());
  CHECK_THAT(help.output(), Catch::Contains("--max-connections"));
  ChildProcess version({CPPRUN_STORE_BINARY, "--version"});
  REQUIRE(version.wait(10s).has_value());
  CHECK_THAT(version.output(), Catch::StartsWith("cpprun-store "));
}
