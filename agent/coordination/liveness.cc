#include "agent/coordination/liveness.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "agent/coordination/job_keys.h"
#include "rendezvous/store.h"

namespace cpprun::agent {

std::chrono::milliseconds keepAliveBound(std::chrono::milliseconds interval, int max_attempt) {
  return interval * max_attempt;
}

void beat(rendezvous::Store& store, const std::string& agent_id) {
  store.add(heartbeatKey(agent_id), 1);
}

std::string formatSeconds(std::chrono::steady_clock::duration d) {
  char buf[32];
  std::snprintf(
      buf, sizeof buf, "%.1f s",
      static_cast<double>(std::chrono::duration_cast<std::chrono::milliseconds>(d).count()) /
          1000.0);
  return buf;
}

std::vector<int> otherMembers(const Membership& m) {
  std::vector<int> ranks;
  for (int r = 0; r < m.group_world_size; ++r) {
    if (r != m.group_rank) ranks.push_back(r);
  }
  return ranks;
}

std::map<int, int64_t> readHeartbeats(rendezvous::Store& store, const Membership& m,
                                      const std::vector<int>& ranks) {
  std::map<int, int64_t> beats;
  if (ranks.empty()) return beats;
  std::vector<std::string> keys;
  for (int r : ranks) keys.push_back(heartbeatKey(m.agents[static_cast<size_t>(r)].id));
  // A GET waits for its key: a member that never beat (one that died at once, or a record a
  // stranger wrote into the round) would make the read time out, and the watcher count the
  // store lost. One CHECK of all says whether each must be checked on its own; a member with no
  // heartbeat yet reads as 0 and is silent from now on.
  std::vector<int> present;
  if (store.check(keys)) {
    present = ranks;
  } else {
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (store.check({keys[i]})) {
        present.push_back(ranks[i]);
      } else {
        beats[ranks[i]] = 0;
      }
    }
    keys.clear();
    for (int r : present) keys.push_back(heartbeatKey(m.agents[static_cast<size_t>(r)].id));
  }
  if (keys.empty()) return beats;
  const auto values = store.multiGet(keys);
  for (size_t i = 0; i < present.size(); ++i) {
    beats[present[i]] = std::atoll(rendezvous::toString(values[i]).c_str());
  }
  return beats;
}

std::vector<HeartbeatWatch::Silent> HeartbeatWatch::check(rendezvous::Store& store,
                                                          const Membership& m, const Clock& clock) {
  const std::map<int, int64_t> read = readHeartbeats(store, m, otherMembers(m));
  if (read.empty()) return {};
  const std::vector<std::pair<int, int64_t>> beats(read.begin(), read.end());
  return observe(m, beats, clock.now());
}

std::vector<HeartbeatWatch::Silent> HeartbeatWatch::observe(
    const Membership& m, const std::vector<std::pair<int, int64_t>>& beats, Clock::time_point now) {
  if (last_check_ != Clock::time_point{}) {
    const auto delay = now - last_check_ - interval_;
    if (delay > interval_) {
      for (auto& entry : seen_) entry.second.second = std::min(now, entry.second.second + delay);
    }
  }
  last_check_ = now;
  std::vector<Silent> silent;
  for (const auto& [r, beat] : beats) {
    const AgentInfo& info = m.agents[static_cast<size_t>(r)];
    auto it = seen_.find(info.id);
    if (it == seen_.end() || it->second.first != beat) {
      seen_[info.id] = {beat, now};
      continue;
    }
    if (now - it->second.second < bound_) continue;
    silent.push_back({r, "the agent of node " + std::to_string(r) + " (" + info.host +
                             ") stopped responding: no heartbeat for " +
                             formatSeconds(now - it->second.second)});
  }
  return silent;
}

HeartbeatLiveness::HeartbeatLiveness(const LivenessOptions& options)
    : options_(options), watch_(options.interval, options.bound) {}

bool HeartbeatLiveness::renew(rendezvous::Store& store) {
  beat(store, options_.self.id);
  return true;
}

void HeartbeatLiveness::watch(int attempt, const Membership& m) {
  MutexLock lock(mu_);
  attempt_ = attempt;
  watched_ = m;
}

std::vector<LostMember> HeartbeatLiveness::poll(rendezvous::Store& store) {
  Membership m;
  int attempt;
  {
    MutexLock lock(mu_);
    if (!watched_) return {};
    m = *watched_;
    attempt = attempt_;
  }
  if (attempt != polled_attempt_) {  // a new attempt (elastic: maybe new members): afresh
    watch_ = HeartbeatWatch(options_.interval, options_.bound);
    polled_attempt_ = attempt;
  }
  return watch_.check(store, m, *options_.clock);
}

}  // namespace cpprun::agent
