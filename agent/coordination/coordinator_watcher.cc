#include "agent/coordination/coordinator_watcher.h"

#include <algorithm>

#include "agent/coordination/job_keys.h"
#include "agent/coordination/own_freeze.h"
#include "common/logging.h"
#include "rendezvous/store.h"

namespace cpprun::agent {

using nlohmann::json;
using rendezvous::Store;
using rendezvous::StoreError;
using rendezvous::StoreTimeout;
using rendezvous::toString;

void CoordinatorWatcher::run() {
  std::unique_ptr<Store> client;
  const auto bound = s_.keepAliveBound();
  try {
    // A reply may be late by up to the whole bound: one slow reply (the store host's agent
    // busy or descheduled for a moment) is not a lost store; keep_alive_max_attempt silent
    // intervals are.
    // Without the run id check a connection is never refused: a value or a throw.
    client = std::move(s_.connect(bound, bound).value());
  } catch (const StoreError& e) {
    s_.reportLost(unavailable("cannot reach " + s_.storeWhere() + ": " + e.what()));
    return;
  }
  int handled_stop = -1;
  const auto interval = s_.opts.keep_alive_interval;
  OwnFreeze freeze(interval, bound, bound + 2 * interval);
  // cpprun's TCP store served by another agent (etcd brings its own liveness).
  const bool serves_store = s_.acksStops() && s_.isHost() && !s_.opts.host_per_round;
  const bool silent_store_ends = s_.acksStops() && !serves_store;
  while (true) {
    int n;
    {
      MutexLock lock(s_.mu);
      if (s_.watch_attempt == -2 || s_.job_over) return;
      n = s_.watch_attempt;
      if (n == handled_stop) {
        s_.cv.waitFor(s_.mu, s_.opts.keep_alive_interval, [&] {
          s_.mu.assertHeld();
          const int watched = s_.watch_attempt;
          return watched != handled_stop || s_.shutting_down ||
                 std::any_of(s_.unclaimed_losses.begin(), s_.unclaimed_losses.end(),
                             [&](const auto& loss) { return loss.first == watched; });
        });
        if (s_.watch_attempt == -2 || s_.job_over) return;
        n = s_.watch_attempt;
      }
    }
    const auto turn_started = s_.clock().now();
    freeze.turn(turn_started);
    try {
      if (n != handled_stop && n >= 0) {
        try {
          client->wait({attemptStopKey(n)}, interval);
          const std::string stored = toString(client->get(attemptStopKey(n)));
          handled_stop = n;
          if (s_.acksStops()) acknowledgeStop(*client, n);
          handleStop(*client, n, stored);
        } catch (const rendezvous::StoreReplyTimeout&) {
          // The wait's end is a CANCEL_WAIT, sent after the interval: one unanswered for the
          // reply timeout (the bound) is the store host's silence, lost now. Before, the next
          // request's reconnect waited the bound again (a frozen store host ended the others
          // after 33 s, not 15). A cancel answered late, within the bound (the host stopped for
          // less, or this agent itself was stopped during its wait), is no loss. The host's
          // own store is silent only while the host itself is stopped.
          if (silent_store_ends) throw;
        } catch (const StoreTimeout&) {
        }
      }
      if (!s_.liveness->renew(*client) && n >= 0) {
        const std::string reason =
            "this node was silent for longer than its liveness bound and the others count it "
            "as lost";
        s_.post([this, n, reason] { s_.on_peer_stop(n, reason, 0, false); });
      }
      bool polls;
      {
        MutexLock lock(s_.mu);
        polls = n >= 0 && s_.liveness_attempt == n;
      }
      // host_per_round: every agent watches every member, so losing node 0 (the decider)
      // is noticed by the others and is just one lost node.
      if (polls && (s_.isHost() || s_.opts.host_per_round)) {
        const std::vector<LostMember> lost = s_.liveness->poll(*client);
        // c10d: the store host stopped past the bound lost the others, not they it.
        const auto stopped = freeze.recent(s_.clock().now());
        if (!lost.empty() && stopped && !s_.opts.host_per_round && s_.acksStops()) {
          s_.reportLost(unavailable(ownFreezeMessage(*stopped, bound)));
          return;
        }
        for (const LostMember& member : lost) s_.memberLost(n, member);
      }
      claimLosses(*client);
      if (polls && s_.opts.elastic && (s_.isHost() || s_.takesOverDecision()))
        checkJoiners(*client, n);
    } catch (const rendezvous::StoreReplyTimeout& e) {
      // The store host's own store is silent only while the host is stopped (it never reports
      // losing its own store).
      s_.reportLost(unavailable(serves_store
                                    ? ownFreezeMessage(s_.clock().now() - turn_started, bound)
                                    : "lost " + s_.storeWhere() + ": " + e.what()));
      return;
    } catch (const StoreError& e) {
      s_.reportLost(unavailable("lost " + s_.storeWhere() + ": " + e.what()));
      return;
    }
  }
}

void CoordinatorWatcher::handleStop(Store& client, int n, const std::string& stored) {
  const Result<StopClaim> claim = stopFromRecord(stored, attemptStopKey(n));
  const std::string tampered = stopTampering(client, n, stored, claim);
  if (!tampered.empty()) {
    // Someone outside the job wrote the stop key (or garbled it): whatever it says, the key is
    // taken and no real claim can be made for this attempt any more, so every node stops now.
    CPPRUN_LOG(kError) << "attempt " << n << ": " << tampered;
    s_.post([this, n, tampered] { s_.on_peer_stop(n, tampered, 0, false); });
    return;
  }
  const StopClaim& stop = claim.value();
  if (stop.by != s_.myRank() && stop.by != kByNobody) {
    s_.post([this, n, stop] {
      s_.on_peer_stop(n, stop.reason, stop.signal, stop.cause == StopCause::kStall);
    });
  } else if (stop.by == s_.myRank() && stop.cause == StopCause::kLost) {
    // The others lost this agent (it was stopped, starved or cut off for a while) and went on
    // without it: its workers must stop too, or they run on outside the job. It then reads the
    // decision like everyone else (elastic: it joins the next round).
    const std::string reason =
        std::string(s_.opts.host_per_round ? "the other nodes" : "the store host") +
        " declared this node lost (" + stop.reason + ")";
    s_.post([this, n, reason] { s_.on_peer_stop(n, reason, 0, false); });
  }
}

std::string CoordinatorWatcher::stopTampering(Store& client, int n, const std::string& stored,
                                              const Result<StopClaim>& claim) {
  const std::string what = "attempt " + std::to_string(n) + "'s stop claim ";
  const std::string stopping = "; stopping this node (docs/security.md)";
  if (!claim.isOk()) {
    return what + "cannot be decoded (" + claim.status().message() +
           "): it was not written by an agent of this job" + stopping;
  }
  const StopClaim& stop = claim.value();
  if (stop.by == s_.myRank() && stop.cause != StopCause::kLost && !s_.ownClaim(n, stored)) {
    return what + "names this node (" + std::to_string(stop.by) +
           "), which did not make it: it was forged" + stopping;
  }
  // The end of the job is claimed after its decision (DecisionExchange::finishJob); before it,
  // an "end" takes the key from the real claims.
  if ((stop.by == kByNobody || stop.cause == StopCause::kEnd) && !s_.ownClaim(n, stored) &&
      !client.check({attemptDecisionKey(n)})) {
    return what + "says the job ended, but attempt " + std::to_string(n) +
           " has no decision: it was forged" + stopping;
  }
  return "";
}

void CoordinatorWatcher::acknowledgeStop(Store& client, int n) {
  const auto seen_at = s_.clock().now();
  client.append(attemptStopAcksKey(n), rendezvous::toBytes(std::to_string(s_.myRank()) + "\n"));
  if (!s_.isHost()) return;
  // The control thread's decide() notes it too, and returns the same error from there.
  if (Result<StopSeen> seen = s_.noteStopSeen(client, n, seen_at); !seen.isOk()) {
    CPPRUN_LOG(kWarn) << "attempt " << n << ": " << seen.status().message();
  }
}

void CoordinatorWatcher::claimLosses(Store& client) {
  std::vector<std::pair<int, LostMember>> claims;
  {
    MutexLock lock(s_.mu);
    auto it = s_.unclaimed_losses.begin();
    while (it != s_.unclaimed_losses.end()) {
      if (it->first != s_.watch_attempt) {
        ++it;
        continue;
      }
      claims.push_back(*it);
      it = s_.unclaimed_losses.erase(it);
    }
  }
  for (const auto& [n, lost] : claims) {
    s_.claimStop(client, n, {lost.rank, lost.reason, StopCause::kLost, 0});
  }
}

void CoordinatorWatcher::checkJoiners(Store& client, int n) {
  if (s_.waiting_claimed || s_.worldSize() >= s_.opts.max_nodes) return;
  const int64_t waiting = client.tickets(roundJoinedKey(s_.rounds.nextRound()));
  if (waiting <= 0) return;
  s_.waiting_claimed = true;
  const std::string reason =
      std::to_string(waiting) + " node(s) waiting to join; re-forming the group";
  CPPRUN_LOG(kInfo) << reason;
  s_.claimStop(client, n, {s_.myRank(), reason, StopCause::kJoin, 0});
  s_.post([this, n, reason] { s_.on_peer_stop(n, reason, 0, false); });
}

}  // namespace cpprun::agent
