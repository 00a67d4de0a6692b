// The store's rules, written once (store_semantics.h), and the key map StoreEngine and
// MemoryStore share.
#include "rendezvous/store_semantics.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <limits>

#include "rendezvous/wire.h"

namespace {

using namespace cpprun::rendezvous;

Bytes b(const std::string& s) { return Bytes(s.begin(), s.end()); }

}  // namespace

TEST_CASE("ADD's rule: decimal text counters created at 0, wrapping like torch's", "[unit]") {
  CHECK(addToCounter(nullptr, 5) == 5);
  const Bytes seven = b("7");
  CHECK(addToCounter(&seven, -10) == -3);
  const Bytes blanks = b("  12abc");  // std::stoll: leading blanks, trailing text ignored
  CHECK(addToCounter(&blanks, 1) == 13);
  const Bytes text = b("abc");
  CHECK_FALSE(addToCounter(&text, 1));
  const Bytes empty;
  CHECK_FALSE(addToCounter(&empty, 1));
  const Bytes max = wire::formatCounter(std::numeric_limits<int64_t>::max());
  CHECK(addToCounter(&max, 1) == std::numeric_limits<int64_t>::min());
  CHECK(notACounterError("add", "/k") == "add on key '/k' whose value is not a decimal integer");
}

TEST_CASE("COMPARE_SET's rule, and what its answer tells a client", "[unit]") {
  const Bytes v = b("v");
  CHECK(compareSetAction(nullptr, {}) == CompareSetAction::kStore);
  CHECK(compareSetAction(nullptr, v) == CompareSetAction::kAnswerExpected);
  CHECK(compareSetAction(&v, v) == CompareSetAction::kStore);
  CHECK(compareSetAction(&v, b("w")) == CompareSetAction::kAnswerCurrent);
  const Bytes empty;
  CHECK(compareSetAction(&empty, {}) == CompareSetAction::kStore);  // "" matches ""
  CHECK(compareSetOutcome(b("new"), b("old"), b("new")) == CompareSetOutcome::kStored);
  CHECK(compareSetOutcome(b("old"), b("old"), b("new")) == CompareSetOutcome::kAbsent);
  CHECK(compareSetOutcome(b("other"), b("old"), b("new")) == CompareSetOutcome::kHolds);
}

TEST_CASE("KeyValueMap applies the rules", "[unit]") {
  KeyValueMap map;
  CHECK(map.add("/c", 2) == 2);
  CHECK(map.add("/c", 3) == 5);
  CHECK(*map.find("/c") == b("5"));
  map.set("/t", b("text"));
  CHECK_FALSE(map.add("/t", 1));
  CHECK(*map.find("/t") == b("text"));  // a failed ADD changes nothing
  // *answer points at `expected`, `desired` or the stored value: named, so it outlives the call.
  const Bytes x = b("x"), y = b("y"), z = b("z"), w = b("w"), none;
  const Bytes* answer = nullptr;
  CHECK_FALSE(map.compareSet("/k", x, y, &answer));
  CHECK(*answer == x);  // c10d's "lie"
  CHECK_FALSE(map.contains("/k"));
  CHECK(map.compareSet("/k", none, y, &answer));
  CHECK(*answer == y);
  CHECK_FALSE(map.compareSet("/k", z, w, &answer));
  CHECK(*answer == y);
  map.append("/a", b("ab"));
  map.append("/a", b("c"));
  CHECK(*map.find("/a") == b("abc"));
  CHECK(map.size() == 4);
  CHECK(map.erase("/a"));
  CHECK_FALSE(map.erase("/a"));
  map.set("keep/1", b("1"));
  CHECK(map.eraseExcept("keep/") == 3);
  CHECK(map.size() == 1);
}

TEST_CASE("appendInPlace grows geometrically: N one-byte appends move O(N) bytes", "[unit]") {
  constexpr size_t kAppends = 100000;
  Bytes value;
  const uint8_t byte = 'x';
  size_t reallocations = 0;
  size_t bytes_moved = 0;
  for (size_t i = 0; i < kAppends; ++i) {
    const size_t capacity = value.capacity();
    appendInPlace(&value, &byte, 1);
    if (value.capacity() != capacity) {
      ++reallocations;
      bytes_moved += i;
    }
  }
  CHECK(value.size() == kAppends);
  CHECK(bytes_moved <= 2 * kAppends);
  CHECK(reallocations <= 18);  // log2(100000) + 1 = 17.6
  // One large append takes exactly what it needs, not double.
  Bytes small = b("ab");
  small.shrink_to_fit();
  appendInPlace(&small, Bytes(1000, 'y'));
  CHECK(small.size() == 1002);
  CHECK(small.capacity() == 1002);
}
