// CpuList: the kernel's "0-3,8,10-11" read strictly and written one way.
#include "common/cpu_list.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

using namespace cpprun;

namespace {

std::vector<int> cpusOf(const std::string& text) {
  auto r = CpuList::parse(text);
  INFO(text << " -> " << r.status().toString());
  REQUIRE(r.isOk());
  return r.value().cpus();
}

std::string errorOf(const std::string& text) {
  auto r = CpuList::parse(text);
  INFO(text);
  REQUIRE_FALSE(r.isOk());
  CHECK(r.status().code() == StatusCode::kInvalidArgument);
  return r.status().message();
}

}  // namespace

TEST_CASE("CPU lists: single CPUs, ranges, sysfs's line feed, the empty list", "[unit]") {
  CHECK(cpusOf("0-3,8,10-11") == std::vector<int>{0, 1, 2, 3, 8, 10, 11});
  CHECK(cpusOf("5") == std::vector<int>{5});
  CHECK(cpusOf("7-7") == std::vector<int>{7});
  CHECK(cpusOf("0-1,112-113\n") == std::vector<int>{0, 1, 112, 113});
  CHECK(cpusOf(" 2 , 0 ") == std::vector<int>{0, 2});
  CHECK(cpusOf("3,1-2,2") == std::vector<int>{1, 2, 3});  // sorted, duplicates once
  CHECK(cpusOf("").empty());
  CHECK(cpusOf("\n").empty());
  CHECK(cpusOf("65535") == std::vector<int>{kMaxCpuNumber});
}

TEST_CASE("CPU lists: reversed ranges and garbage are errors naming the item", "[unit]") {
  CHECK_THAT(errorOf("0-3,5-2"), Catch::Contains("'0-3,5-2'") && Catch::Contains("'5-2'") &&
                                     Catch::Contains("reversed range"));
  for (const char* text : {"x", "0-3,x", "1-", "-1", "1--2", "0x3", "1.5", "+1", "1-2-3", "a-b"}) {
    CHECK_THAT(errorOf(text), Catch::Contains("is not a CPU number"));
  }
  CHECK_THAT(errorOf("0,,2"), Catch::Contains("empty item"));
  CHECK_THAT(errorOf("0,"), Catch::Contains("empty item"));
  CHECK_THAT(errorOf("65536"), Catch::Contains("is not a CPU number"));
  CHECK_THAT(errorOf("0-99999999999"), Catch::Contains("is not a CPU number"));
  const std::string overlong(100000, '1');
  CHECK_THAT(errorOf(overlong), Catch::Contains("(100000 bytes)"));
  CHECK(errorOf(overlong).size() < 400);
}

TEST_CASE("CPU lists: formatted one way, and round-trip", "[unit]") {
  CHECK(CpuList({11, 0, 2, 1, 3, 8, 10, 3}).toString() == "0-3,8,10-11");
  CHECK(CpuList().toString().empty());
  CHECK(CpuList({4}).toString() == "4");
  CHECK(CpuList({4, 5}).toString() == "4-5");
  CHECK(formatIndexList({32, 33, 0, 1}) == "0-1,32-33");
  for (const std::string text : {"0-55,112-167", "0", "1,3,5", "0-65535"}) {
    CHECK(CpuList::parse(text).value().toString() == text);
  }
  CHECK(CpuList::parse("0-3").value().contains(2));
  CHECK_FALSE(CpuList::parse("0-3").value().contains(4));
  CHECK(CpuList::parse("1,0").value() == CpuList({0, 1}));
}
