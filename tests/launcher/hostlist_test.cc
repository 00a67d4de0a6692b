#include "launcher/hostlist.h"

#include <catch2/catch.hpp>

using cpprun::launcher::expandHostlist;
using cpprun::launcher::expandTaskCounts;
using Hosts = std::vector<std::string>;

namespace {

Hosts hosts(const std::string& list) {
  auto r = expandHostlist(list);
  INFO(list << ": " << r.status().message());
  REQUIRE(r.isOk());
  return r.value();
}

std::string errorOf(const std::string& list) {
  auto r = expandHostlist(list);
  REQUIRE_FALSE(r.isOk());
  return r.status().message();
}

}  // namespace

TEST_CASE("hostlist: plain names, separators and order", "[unit]") {
  CHECK(hosts("n1") == Hosts{"n1"});
  CHECK(hosts("b,a, c\td\ne") == Hosts{"b", "a", "c", "d", "e"});
  CHECK(hosts("x,x") == Hosts{"x", "x"});  // duplicates kept, nothing sorted
  CHECK(hosts(",,n1,,") == Hosts{"n1"});
}

TEST_CASE("hostlist: ranges keep the low bound's padding", "[unit]") {
  CHECK(hosts("n[09-11]") == Hosts{"n09", "n10", "n11"});
  CHECK(hosts("n[9-11]") == Hosts{"n9", "n10", "n11"});
  CHECK(hosts("n[001-3]") == Hosts{"n001", "n002", "n003"});
  CHECK(hosts("n[98-100]") == Hosts{"n98", "n99", "n100"});
  CHECK(hosts("nodes[006,011]") == Hosts{"nodes006", "nodes011"});
}

TEST_CASE("hostlist: Slurm's documented examples", "[unit]") {
  CHECK(hosts("node[01-04,07],gpu-[1-3]a") ==
        Hosts{"node01", "node02", "node03", "node04", "node07", "gpu-1a", "gpu-2a", "gpu-3a"});
  CHECK(hosts("r[1-2]n[1-2]") == Hosts{"r1n1", "r1n2", "r2n1", "r2n2"});
  CHECK(hosts("n[1-3]-ib") == Hosts{"n1-ib", "n2-ib", "n3-ib"});
  CHECK(hosts("a[1-3,7],b[02-05]") == Hosts{"a1", "a2", "a3", "a7", "b02", "b03", "b04", "b05"});
  CHECK(hosts("n[1-]") == Hosts{"n1"});
  CHECK(hosts("odd]name") == Hosts{"odd]name"});
}

TEST_CASE("hostlist: bad input names the token and the reason", "[unit]") {
  CHECK_THAT(errorOf("ok,n[1-3"), Catch::Contains("'n[1-3'") && Catch::Contains("without ']'"));
  CHECK_THAT(errorOf("n[]"), Catch::Contains("empty range"));
  CHECK_THAT(errorOf("n[1,,2]"), Catch::Contains("empty range"));
  CHECK_THAT(errorOf("n[a-b]"), Catch::Contains("not NUM or NUM-NUM"));
  CHECK_THAT(errorOf("n[-1]"), Catch::Contains("not NUM or NUM-NUM"));
  CHECK_THAT(errorOf("n[1--2]"), Catch::Contains("not NUM or NUM-NUM"));
  CHECK_THAT(errorOf("n[5-3]"), Catch::Contains("low bound above high bound"));
  CHECK_THAT(errorOf("n[1x2]"), Catch::Contains("multi-dimensional"));
  CHECK_THAT(errorOf("n[1-70000]"), Catch::Contains("more than 65536 hosts"));
  CHECK_THAT(errorOf("a[0-999]b[0-999]"), Catch::Contains("more than 65536 hosts"));
  CHECK_THAT(errorOf(""), Catch::Contains("names no host"));
}

TEST_CASE("task counts: N and N(xK) in node order", "[unit]") {
  CHECK(expandTaskCounts("2(x3),1").value() == std::vector<int>{2, 2, 2, 1});
  CHECK(expandTaskCounts("4").value() == std::vector<int>{4});
  CHECK(expandTaskCounts("1,2(x2)").value() == std::vector<int>{1, 2, 2});
  for (const char* bad : {"", "x", "2(3)", "2(x)", "2(x0)", "2(x3", "-1", "2,,1"}) {
    auto r = expandTaskCounts(bad);
    INFO(bad);
    CHECK_FALSE(r.isOk());
  }
  CHECK_THAT(expandTaskCounts("2(x3),z").status().message(), Catch::Contains("'z'"));
}
