// Coordinator waits: how the job coordinator's parts (store_job_coordinator.cc and its
// coordinator_*.cc, rendezvous_rounds.h) wait for keys in the store. A wait runs in
// keep-alive-sized slices, so a lost store, a lost agent or the end of the job is noticed within
// one interval, and it says what it waits for every few seconds (WaitNotice) in the log and in
// /status.
//
// A wait returns its outcome as a Status (waitForKeys): OK when what it waited for came, else
// the Status the coordinator's caller receives (the job is over, the store is lost, a member is
// lost, the wait timed out); the caller checks it and returns it on. Only the store's own
// exceptions (StoreError, StoreTimeout) are thrown, and the coordinator turns them into a value
// at its boundary (StoreCoordinator::guarded). No wait throws for control flow.
//
// Thread safety: a WaitContext is called from the thread that waits and must be safe from
// there; WaitAnnouncer belongs to one wait (one thread); the free functions touch only their
// arguments.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "common/wait_notice.h"

namespace cpprun::rendezvous {
class Store;
}

namespace cpprun::agent {

// Ten years: a wait that only liveness (the store connection, heartbeats) ends.
inline constexpr std::chrono::milliseconds kNoDeadline = std::chrono::hours(24 * 365 * 10);
// A wait wakes at least this often, so its notices keep their schedule.
inline constexpr std::chrono::milliseconds kNoticeSlice = std::chrono::seconds(5);

// What every wait of one coordinator shares.
class WaitContext {
 public:
  virtual ~WaitContext() = default;
  // Why waits must end now (the store is lost, the agent is shutting down); OK: they go on.
  virtual Status abandonment() = 0;
  // What the agent waits for now ("" when nothing), for /status.
  virtual void setWaiting(const std::string& what) = 0;
  // Hot spares (rendezvous_rounds.h): the agent waits as a spare now (true) or no longer, and
  // whether it was asked to leave meanwhile (drain: it then gives up its slot and ends).
  virtual void setWaitingAsSpare(bool spare) { (void)spare; }
  virtual bool leaveRequested() { return false; }
  // Where waits measure their bounds (StoreCoordinatorOptions::clock).
  virtual const MonotonicClock& clock() { return realClock(); }
};

// One wait's notices: when WaitNotice says one is due, logs what the wait is for, how long it
// has lasted and (with a deadline) how long it may still last, and shows it in /status until
// the wait ends.
class WaitAnnouncer {
 public:
  using Clock = MonotonicClock;
  explicit WaitAnnouncer(WaitContext& context,
                         Clock::time_point deadline = Clock::time_point::max());
  ~WaitAnnouncer();
  WaitAnnouncer(const WaitAnnouncer&) = delete;
  WaitAnnouncer& operator=(const WaitAnnouncer&) = delete;

  void maybeAnnounce(const std::function<std::string()>& describe);

 private:
  WaitContext& context_;
  const Clock& clock_;
  WaitNotice notice_;
  Clock::time_point deadline_;
};

// What a wait's on_slice says after a slice that did not bring the keys.
struct SliceVerdict {
  enum class Kind { kGoOn, kDone, kAbandon };
  Kind kind = Kind::kGoOn;
  Status status;  // kAbandon: what the wait returns

  static SliceVerdict goOn() { return {}; }
  // End the wait as if the keys had come.
  static SliceVerdict done() { return {Kind::kDone, Status::ok()}; }
  // REQUIRES: !why.isOk().
  static SliceVerdict abandon(Status why) { return {Kind::kAbandon, std::move(why)}; }
};

// Waits up to `total` (as the context's clock measures it) for `keys` in slices of at most
// `slice` (and kNoticeSlice). Returns OK when the keys came or `on_slice` said kDone; the
// context's abandonment() when waits must end; on_slice's status when it said kAbandon; a
// kTimeout naming `what` after `total`. `on_slice` (optional) runs after every slice;
// `describe` (optional) says what the wait is for (WaitAnnouncer). Throws what the store throws
// (StoreError; its StoreTimeout only ends a slice).
[[nodiscard]] Status waitForKeys(WaitContext& context, rendezvous::Store& store,
                                 const std::vector<std::string>& keys,
                                 std::chrono::milliseconds total, std::chrono::milliseconds slice,
                                 const std::string& what,
                                 const std::function<SliceVerdict()>& on_slice = {},
                                 const std::function<std::string()>& describe = {});

// A list of nodes in a log line names at most this many; the rest are counted ("and 99,990
// more"), so a line stays short whatever --nnodes is.
inline constexpr size_t kMaxListedNodes = 8;
// A wait's notice names missing nodes (one CHECK each) only up to this many nodes; above, it
// counts them from a ticket counter (one request).
inline constexpr int kMaxCheckedNodes = 64;

// "node 4, node 7" or, where the scheduler named the nodes (`expected_hosts`, by rank), "n4, n7";
// past kMaxListedNodes names, "… and N more". `total`: how many nodes the list stands for (at
// least ranks.size(); the rest are among the "more").
std::string nodeNames(const std::vector<std::string>& expected_hosts, const std::vector<int>& ranks,
                      size_t total = 0);

// "4, 7" or "3, 4, 5, 6, 7, 8, 9, 10 and 99,990 more": node numbers, as nodeNames caps them.
std::string rankList(const std::vector<int>& ranks, size_t total = 0);

// 99990 -> "99,990".
std::string withThousands(int64_t n);

// Which of `keys` (one per node rank) are missing: "waiting for 3 of 8 nodes (n4, n7, n8)
// <what>". One check per node: REQUIRES keys.size() <= kMaxCheckedNodes for a wait's notices.
// Throws what the store throws.
std::string describeMissing(rendezvous::Store& store, const std::vector<std::string>& keys,
                            const std::vector<std::string>& expected_hosts,
                            const std::string& what);

}  // namespace cpprun::agent
