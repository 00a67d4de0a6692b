// HeartbeatWatch (liveness.h) on synthetic time: who counts as lost, and when the host's own
// delay is not held against the others.
#include "agent/coordination/liveness.h"

#include <catch2/catch.hpp>

#include "agent/coordination/job_keys.h"
#include "common/clock.h"
#include "rendezvous/memory_store.h"

namespace {

using namespace cpprun::agent;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

Membership hostOfThree() {
  return membershipOf({{"h0", 1, "a0", -1}, {"h1", 1, "a1", -1}, {"h2", 1, "a2", -1}}, 0);
}

}  // namespace

TEST_CASE("heartbeats: a member whose counter stops moving is lost after the bound", "[unit]") {
  HeartbeatWatch watch(1s, 3s);
  const Membership m = hostOfThree();
  const Clock::time_point t0 = Clock::now();
  int64_t beat1 = 1;
  for (int i = 0; i <= 2; ++i) {
    // Node 1 beats every second; node 2 stays at 7.
    const auto silent = watch.observe(m, {{1, beat1++}, {2, 7}}, t0 + std::chrono::seconds(i));
    CHECK(silent.empty());  // node 2's counter has been still for less than 3 s
  }
  const auto silent = watch.observe(m, {{1, beat1++}, {2, 7}}, t0 + 3s + 10ms);
  REQUIRE(silent.size() == 1);
  CHECK(silent[0].rank == 2);
  CHECK(silent[0].reason == "the agent of node 2 (h2) stopped responding: no heartbeat for 3.0 s");
  // Still silent: named again at the next check (the coordinator counts it lost once).
  CHECK(watch.observe(m, {{1, beat1++}, {2, 7}}, t0 + 4s).size() == 1);
  // A beat brings it back.
  CHECK(watch.observe(m, {{1, beat1++}, {2, 8}}, t0 + 5s).empty());
}

TEST_CASE("heartbeats: a late check does not count the host's own delay against the others",
          "[unit]") {
  HeartbeatWatch watch(1s, 3s);
  const Membership m = hostOfThree();
  const Clock::time_point t0 = Clock::now();
  CHECK(watch.observe(m, {{1, 1}, {2, 1}}, t0).empty());
  // The host was stopped for 10 s: its next check finds the same counters (their beats queue
  // behind it). Only the interval's worth counts.
  CHECK(watch.observe(m, {{1, 1}, {2, 1}}, t0 + 10s).empty());
  CHECK(watch.observe(m, {{1, 2}, {2, 1}}, t0 + 11s).empty());
  // Node 2's silence counts from one interval before the late check (t0 + 9 s): 3 s at t0 + 12 s.
  CHECK(watch.observe(m, {{1, 3}, {2, 1}}, t0 + 12s).size() == 1);
}

TEST_CASE("heartbeats: the bound is interval times attempts", "[unit]") {
  CHECK(keepAliveBound(std::chrono::milliseconds(5000), 3) == std::chrono::milliseconds(15000));
}

// HeartbeatLiveness on the clock of its options (the coordinator's StoreCoordinatorOptions::clock):
// the host's polls measure a member's silence on virtual time, so the keep-alive bound passes
// without waiting for it, and never before the clock says so.
TEST_CASE("heartbeat liveness: a silent member is lost when the bound has passed on its clock",
          "[unit]") {
  cpprun::rendezvous::MemoryStore store;
  cpprun::ManualClock clock;
  LivenessOptions options;
  options.self = AgentInfo{"h0", 1, "a0", -1};
  options.interval = 5s;
  options.bound = 15s;
  options.clock = &clock;
  HeartbeatLiveness host(options);
  host.watch(0, hostOfThree());
  // Node 1 beats every interval; node 2 beats once and falls silent.
  beat(store, "a2");
  for (int i = 0; i < 3; ++i) {
    beat(store, "a1");
    CHECK(host.poll(store).empty());  // node 2 silent for 0, 5, 10 s of the clock
    clock.advance(i < 2 ? 5s : 5s - 1ms);
  }
  beat(store, "a1");
  CHECK(host.poll(store).empty());  // 14.999 s: not yet
  clock.advance(1ms);
  beat(store, "a1");
  const std::vector<LostMember> lost = host.poll(store);
  REQUIRE(lost.size() == 1);
  CHECK(lost[0].rank == 2);
  CHECK(lost[0].reason == "the agent of node 2 (h2) stopped responding: no heartbeat for 15.0 s");
}
