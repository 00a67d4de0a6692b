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
