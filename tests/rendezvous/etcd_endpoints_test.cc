// The etcd endpoint parser (one entry) and the rotation that skips members gone silent.
#include "rendezvous/etcd_endpoints.h"

#include <catch2/catch.hpp>

namespace {

using namespace cpprun::rendezvous::etcd;
using namespace std::chrono_literals;

TEST_CASE("an etcd endpoint entry parses to host, port and its name", "[etcd][unit]") {
  auto plain = parseEtcdEndpoint(" http://node1:2379/ ");
  REQUIRE(plain.isOk());
  CHECK(plain.value().host == "node1");
  CHECK(plain.value().port == "2379");
  CHECK(plain.value().name == "node1:2379");
  auto v6 = parseEtcdEndpoint("[::1]:02379");
  REQUIRE(v6.isOk());
  CHECK(v6.value().host == "::1");
  CHECK(v6.value().port == "2379");
  CHECK(v6.value().name == "[::1]:02379");
  for (const char* bad : {"", "h", "h:0", "::1:2379", "[::1", "[::1]2379", "h:1/path", ":1"}) {
    INFO(bad);
    auto r = parseEtcdEndpoint(bad);
    REQUIRE_FALSE(r.isOk());
    CHECK(r.status().message().find(std::string("'") + bad + "'") != std::string::npos);
  }
}

TEST_CASE("the etcd endpoint rotation skips silent members for a while", "[etcd][unit]") {
  const auto t0 = EndpointRotation::Clock::time_point{} + 1h;
  EndpointRotation r(3, 10s);
  CHECK(r.answering(t0) == 3);
  CHECK(r.next(0, t0) == 1);
  CHECK(r.next(2, t0) == 0);
  r.markSilent(1, t0);
  CHECK(r.answering(t0) == 2);
  CHECK(r.next(0, t0) == 2);
  CHECK(r.next(0, t0 + 11s) == 1);  // silence is over
  r.markAnswered(1);
  CHECK(r.next(0, t0) == 1);
  for (size_t i = 0; i < 3; ++i) r.markSilent(i, t0);
  CHECK(r.answering(t0) == 1);  // at least one round of one try
  CHECK(r.next(2, t0) == 0);    // all silent: simply the next one
}

}  // namespace
