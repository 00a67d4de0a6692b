// NetworkAddress: host:port text in and out — IPv6 in brackets both ways, ports checked as
// numbers in range, every error naming the text; resolveTcp over literals.
#include "common/network_address.h"

#include <netinet/in.h>

#include <catch2/catch.hpp>
#include <string>

using namespace cpprun;

namespace {

NetworkAddress parsed(const std::string& text, const AddressSyntax& syntax = {}) {
  auto r = parseNetworkAddress(text, syntax);
  INFO(text << " -> " << r.status().toString());
  REQUIRE(r.isOk());
  return r.value();
}

std::string errorOf(const std::string& text, const AddressSyntax& syntax = {}) {
  auto r = parseNetworkAddress(text, syntax);
  INFO(text);
  REQUIRE_FALSE(r.isOk());
  CHECK(r.status().code() == StatusCode::kInvalidArgument);
  return r.status().message();
}

}  // namespace

TEST_CASE("host:port parses names, IPv4 and bracketed IPv6", "[unit]") {
  CHECK(parsed("node-7:29500") == NetworkAddress{"node-7", 29500});
  CHECK(parsed("10.0.0.1:0") == NetworkAddress{"10.0.0.1", 0});
  CHECK(parsed("[::1]:29500") == NetworkAddress{"::1", 29500});
  CHECK(parsed("[fe80::1%eth0]:65535") == NetworkAddress{"fe80::1%eth0", 65535});
  CHECK(parsed("h:00080").port == 80);
}

TEST_CASE("IPv6 hosts are formatted in brackets and round-trip", "[unit]") {
  CHECK(formatHostPort("::1", 29500) == "[::1]:29500");
  CHECK(formatHostPort("10.0.0.1", 29500) == "10.0.0.1:29500");
  CHECK(formatHostPort("node-7", 0) == "node-7:0");
  CHECK(bracketedHost("fe80::1") == "[fe80::1]");
  CHECK(bracketedHost("node-7") == "node-7");
  CHECK(NetworkAddress{"::", 80}.toString() == "[::]:80");
  for (const std::string text : {"[::1]:29500", "[2001:db8::7]:1", "127.0.0.1:65535", "n:9"}) {
    CHECK(parsed(text).toString() == text);
  }
  const NetworkAddress v6{"2001:db8::42", 443};
  CHECK(parsed(v6.toString()) == v6);
}

TEST_CASE("a port is digits in range, and every error names the text", "[unit]") {
  CHECK_THAT(errorOf("h:70000"),
             Catch::Contains("'h:70000'") && Catch::Contains("port 70000 is out of range 0-65535"));
  CHECK_THAT(errorOf("h:65536"), Catch::Contains("out of range"));
  CHECK_THAT(errorOf("h:99999999999999999999999"), Catch::Contains("out of range"));
  CHECK_THAT(errorOf("h:http"), Catch::Contains("port 'http' is not a number"));
  for (const char* text : {"h:-1", "h:+80", "h: 80", "h:80 ", "h:8o", "h:0x50"}) {
    CHECK_THAT(errorOf(text), Catch::Contains("is not a number"));
  }
  CHECK_THAT(errorOf("h:"), Catch::Contains("empty port"));
  CHECK_THAT(errorOf("[::1]:"), Catch::Contains("empty port"));
  AddressSyntax from_one;
  from_one.min_port = 1;
  CHECK_THAT(errorOf("h:0", from_one), Catch::Contains("out of range 1-65535"));
  CHECK(parsed("h:1", from_one).port == 1);
}

TEST_CASE("host:port refuses a missing host or port and unbracketed IPv6", "[unit]") {
  CHECK_THAT(errorOf(":5"), Catch::Contains("no host"));
  CHECK_THAT(errorOf(""), Catch::Contains("no host"));
  CHECK_THAT(errorOf("[]:5"), Catch::Contains("no host"));
  CHECK_THAT(errorOf("host"), Catch::Contains("'host': no port"));
  CHECK_THAT(errorOf("[::1]"), Catch::Contains("no port"));
  CHECK_THAT(errorOf("[::1"), Catch::Contains("'[' without ']'"));
  CHECK_THAT(errorOf("[::1]9"), Catch::Contains("expected ':PORT' after ']'"));
  CHECK_THAT(errorOf("::1:29500"), Catch::Contains("IPv6 addresses go in brackets"));
}

TEST_CASE("a default port makes the port optional, and a bare IPv6 host is one only where allowed",
          "[unit]") {
  AddressSyntax optional;
  optional.default_port = 7;
  CHECK(parsed("n1", optional) == NetworkAddress{"n1", 7});
  CHECK(parsed("n1:9", optional) == NetworkAddress{"n1", 9});
  CHECK(parsed("[fe80::1]", optional) == NetworkAddress{"fe80::1", 7});
  CHECK_THAT(errorOf("fe80::1", optional), Catch::Contains("brackets"));
  optional.bare_ipv6_host = true;
  CHECK(parsed("fe80::1", optional) == NetworkAddress{"fe80::1", 7});
  CHECK_THAT(errorOf("n1:", optional), Catch::Contains("empty port"));
}

TEST_CASE("an overlong or control-laden address is clipped in the error", "[unit]") {
  const std::string host(100000, 'h');
  const std::string message = errorOf(host + ":99999");
  CHECK(message.size() < 300);
  CHECK_THAT(message, Catch::Contains("(100006 bytes)"));
  CHECK_THAT(errorOf("h\n:x"), Catch::Contains("'h\\n:x'"));
  CHECK_THAT(errorOf("h:" + std::string(1000, '9')), Catch::Contains("out of range"));
}

TEST_CASE("parsePort alone", "[unit]") {
  CHECK(parsePort("0").value() == 0);
  CHECK(parsePort("65535").value() == 65535);
  CHECK_THAT(parsePort("65536").status().message(), Catch::Contains("out of range 0-65535"));
  CHECK_THAT(parsePort("0", 1).status().message(), Catch::Contains("out of range 1-65535"));
  CHECK_THAT(parsePort("").status().message(), Catch::Contains("empty port"));
  CHECK_THAT(parsePort("12a").status().message(), Catch::Contains("'12a' is not a number"));
}

TEST_CASE("resolveTcp gives literals and the null node back without a lookup", "[unit]") {
  auto v4 = resolveTcp("127.0.0.1", 29500);
  REQUIRE(v4.isOk());
  REQUIRE(v4.value().size() >= 1);
  CHECK(v4.value()[0].family == AF_INET);
  CHECK(numericHost(v4.value()[0]) == "127.0.0.1");
  CHECK(ntohs(reinterpret_cast<const sockaddr_in*>(v4.value()[0].sockaddrPtr())->sin_port) ==
        29500);
  auto v6 = resolveTcp("::1", 1, ResolveFor::kBind);
  REQUIRE(v6.isOk());
  CHECK(v6.value()[0].family == AF_INET6);
  CHECK(numericHost(v6.value()[0]) == "::1");
  // An empty host is getaddrinfo's null node: the loopback to connect to, any to bind.
  auto loopback = resolveTcp("", 5);
  REQUIRE(loopback.isOk());
  for (const ResolvedAddress& a : loopback.value()) {
    CHECK((numericHost(a) == "127.0.0.1" || numericHost(a) == "::1"));
  }
  auto any = resolveTcp("", 5, ResolveFor::kBind);
  REQUIRE(any.isOk());
  for (const ResolvedAddress& a : any.value()) {
    CHECK((numericHost(a) == "0.0.0.0" || numericHost(a) == "::"));
  }
}
