#include "agent/coordination/stale_job_keys.h"

#include <algorithm>

#include "agent/coordination/job_keys.h"

namespace cpprun::agent {

std::string attemptKeysPrefix(int attempt) { return "attempt/" + std::to_string(attempt) + "/"; }
std::string roundKeysPrefix(int round) { return "rdzv/round/" + std::to_string(round) + "/"; }
std::string aliveSnapshotPrefix(int attempt) {
  return aliveSnapshotKey(kAliveKeyPrefix, attempt, "");
}

std::vector<std::string> StaleJobKeys::started(int attempt, int round) {
  std::vector<std::string> stale;
  // Attempts [from, attempt - 1) go: attempt - 1 stays for its late readers.
  const int last_attempt = attempt - 1;
  for (int k = std::max(attempts_forgotten_, last_attempt - kStaleLookBack); k < last_attempt;
       ++k) {
    stale.push_back(attemptKeysPrefix(k));
    stale.push_back(aliveSnapshotPrefix(k));
  }
  attempts_forgotten_ = std::max(attempts_forgotten_, last_attempt);
  if (round >= 0) {
    const int last_round = round - 1;
    for (int q = std::max(rounds_forgotten_, last_round - kStaleLookBack); q < last_round; ++q) {
      stale.push_back(roundKeysPrefix(q));
    }
    rounds_forgotten_ = std::max(rounds_forgotten_, last_round);
  }
  return stale;
}

}  // namespace cpprun::agent
