// Which job keys the decider deletes when an attempt starts (stale_job_keys.h): the policy, and
// that its prefixes cover exactly the keys job_keys.h builds for that attempt or round.
#include "agent/coordination/stale_job_keys.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "agent/coordination/job_keys.h"

namespace {

using namespace cpprun::agent;
using Prefixes = std::vector<std::string>;

bool startsWith(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

}  // namespace

TEST_CASE("stale job keys: attempt n-2 and round r-2 go when attempt n of round r starts, once",
          "[unit]") {
  StaleJobKeys stale;
  CHECK(stale.started(0, -1).empty());
  CHECK(stale.started(1, -1).empty());  // attempt 0 stays: attempt 1's late readers
  CHECK(stale.started(2, -1) == Prefixes{"attempt/0/", "alive.snapshot/0/"});
  CHECK(stale.started(3, -1) == Prefixes{"attempt/1/", "alive.snapshot/1/"});
  CHECK(stale.started(3, -1).empty());  // an attempt started again (a new round) adds nothing
  // Elastic: rounds advance beside attempts (a failed round has no attempt).
  CHECK(stale.started(4, 1) == Prefixes{"attempt/2/", "alive.snapshot/2/"});
  CHECK(stale.started(5, 4) == Prefixes{"attempt/3/", "alive.snapshot/3/", "rdzv/round/0/",
                                        "rdzv/round/1/", "rdzv/round/2/"});
}

TEST_CASE("stale job keys: a decider that takes over late looks back a bounded number of attempts",
          "[unit]") {
  StaleJobKeys stale;
  const Prefixes got = stale.started(4000, 5000);
  CHECK(got.size() == 3 * kStaleLookBack);
  CHECK(got.front() == attemptKeysPrefix(3999 - kStaleLookBack));
  CHECK(got.back() == roundKeysPrefix(4998));
  CHECK(stale.started(4001, 5001) ==
        Prefixes{"attempt/3999/", "alive.snapshot/3999/", "rdzv/round/4999/"});
}

TEST_CASE("stale job keys: every key job_keys builds for an attempt or round lies under its prefix",
          "[unit]") {
  for (int n : {0, 1, 7, 12}) {
    const std::vector<std::string> keys = {
        attemptReadyKey(n, 3),   attemptGoKey(n),           attemptNcclIdsPrefix(n) + "5",
        attemptStopKey(n),       attemptStopAcksKey(n),     attemptReportKey(n, 12),
        attemptDecisionKey(n),   attemptDoneKey(n),         attemptAllDoneKey(n),
        attemptSparesDoneKey(n), attemptSparesAllDoneKey(n)};
    for (const auto& key : keys) {
      INFO(key);
      CHECK(startsWith(key, attemptKeysPrefix(n)));
      // Attempt 1's prefix is no prefix of attempt 12's keys, nor 12's of 1's.
      for (int other : {0, 1, 2, 7, 12, 120}) {
        if (other != n) CHECK_FALSE(startsWith(key, attemptKeysPrefix(other)));
      }
    }
    CHECK(startsWith(aliveSnapshotKey(kAliveKeyPrefix, n, "0123abcd"), aliveSnapshotPrefix(n)));
    CHECK_FALSE(
        startsWith(aliveSnapshotKey(kAliveKeyPrefix, n + 10, "ab"), aliveSnapshotPrefix(n)));
    for (const auto& key : {roundJoinedKey(n), roundAgentKey(n, 2), roundMembersKey(n),
                            roundAssignedKey(n, 11), roundClosedKey(n)}) {
      INFO(key);
      CHECK(startsWith(key, roundKeysPrefix(n)));
      CHECK_FALSE(startsWith(key, roundKeysPrefix(n + 10)));
    }
  }
  // What must stay is under none of them.
  for (const std::string& key : {std::string(kRoundCounterKey), std::string(kExclusionHistoryKey),
                                 heartbeatKey("a"), nodeKey(0), std::string(kStaticJoinedKey)}) {
    for (int n : {0, 1}) {
      CHECK_FALSE(startsWith(key, attemptKeysPrefix(n)));
      CHECK_FALSE(startsWith(key, roundKeysPrefix(n)));
    }
  }
}
