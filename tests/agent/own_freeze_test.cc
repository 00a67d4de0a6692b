// OwnFreeze (own_freeze.h): a gap between the watcher's turns longer than the bound is this
// agent's own stop, remembered for a while after waking; ordinary turns are not.
#include "agent/coordination/own_freeze.h"

#include <catch2/catch.hpp>

namespace {

using namespace cpprun;
using namespace cpprun::agent;
using namespace std::chrono_literals;

}  // namespace

TEST_CASE("own freeze: a gap over the bound is a stop, remembered for `recent` after waking",
          "[unit]") {
  ManualClock clock;
  OwnFreeze freeze(300ms, 900ms, 1500ms);
  // Turns an interval apart (and a little late) are no stop.
  for (int i = 0; i < 5; ++i) {
    freeze.turn(clock.now());
    clock.advance(i == 2 ? 800ms : 310ms);
  }
  freeze.turn(clock.now());
  CHECK_FALSE(freeze.recent(clock.now()).has_value());
  // Stopped for 5 s between two turns.
  clock.advance(5s);
  freeze.turn(clock.now());
  clock.advance(300ms);
  freeze.turn(clock.now());
  REQUIRE(freeze.recent(clock.now()).has_value());
  CHECK(*freeze.recent(clock.now()) == 5s);
  clock.advance(1201ms);  // 1.501 s after waking
  CHECK_FALSE(freeze.recent(clock.now()).has_value());
  CHECK_THAT(ownFreezeMessage(5s, 900ms),
             Catch::StartsWith("this agent was stopped for 5.0 s, longer than the keep-alive "
                               "bound (0.9 s)") &&
                 Catch::EndsWith("the job ended without this node"));
}

TEST_CASE("own freeze: with a bound of one interval, a turn of one interval and a bit is no stop",
          "[unit]") {
  ManualClock clock;
  OwnFreeze freeze(1s, 1s, 3s);
  freeze.turn(clock.now());
  clock.advance(1400ms);
  freeze.turn(clock.now());
  CHECK_FALSE(freeze.recent(clock.now()).has_value());
  clock.advance(1600ms);
  freeze.turn(clock.now());
  CHECK(freeze.recent(clock.now()).has_value());
}
