// OptionCursor and parseUnsigned: both option spellings, missing values, bounds.
#include "common/command_line.h"

#include <catch2/catch.hpp>

using cpprun::OptionCursor;
using cpprun::parseUnsigned;

TEST_CASE("options with inline and separate values and underscores", "[unit]") {
  OptionCursor c({"--port=29500", "--max_restarts", "3", "train.py", "--x"});
  REQUIRE(c.next());
  CHECK(c.isOption());
  CHECK(c.name() == "--port");
  CHECK(c.hasInlineValue());
  CHECK(c.value().value() == "29500");
  REQUIRE(c.next());
  CHECK(c.name() == "--max-restarts");
  CHECK_FALSE(c.hasInlineValue());
  CHECK(c.value().value() == "3");
  REQUIRE(c.next());
  CHECK_FALSE(c.isOption());
  CHECK(c.name() == "train.py");
  REQUIRE(c.next());
  auto missing = c.value();
  REQUIRE_FALSE(missing.isOk());
  CHECK(missing.status().message() == "option --x needs a value");
  CHECK_FALSE(c.next());
}

TEST_CASE("an empty inline value is a value", "[unit]") {
  OptionCursor c({"--host="});
  REQUIRE(c.next());
  CHECK(c.value().value().empty());
}

TEST_CASE("parseUnsigned names the flag and the bound", "[unit]") {
  CHECK(parseUnsigned("--port", "65535", 65535).value() == 65535);
  CHECK(parseUnsigned("--port", "0", 65535).value() == 0);
  auto big = parseUnsigned("--port", "65536", 65535);
  REQUIRE_FALSE(big.isOk());
  CHECK(big.status().message() == "value 65536 for --port is out of range (at most 65535)");
  for (const char* bad : {"", "-1", "1x", " 1", "0x10"}) {
    auto r = parseUnsigned("--port", bad, 65535);
    REQUIRE_FALSE(r.isOk());
    CHECK_THAT(r.status().message(), Catch::Contains("invalid value"));
  }
  CHECK_FALSE(parseUnsigned("--n", "99999999999999999999999", UINT64_MAX).isOk());
}

TEST_CASE("parseUnsigned with a lower bound names the flag, the bound and the text", "[unit]") {
  CHECK(parseUnsigned("--runs", "1", 1, 100).value() == 1);
  auto zero = parseUnsigned("--runs", "0", 1, 100);
  REQUIRE_FALSE(zero.isOk());
  CHECK(zero.status().message() == "--runs is at least 1, not 0");
  auto high = parseUnsigned("--runs", "101", 1, 100);
  REQUIRE_FALSE(high.isOk());
  CHECK(high.status().message() == "value 101 for --runs is out of range (at most 100)");
}
