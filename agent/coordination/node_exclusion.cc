#include "agent/coordination/node_exclusion.h"

#include <algorithm>
#include <map>
#include <sstream>

namespace cpprun::agent {

std::string encodeFailureRecord(const NodeFailureRecord& record) {
  return std::to_string(record.unix_ms) + "\t" + record.agent_id + "\t" + record.host + "\n";
}

std::vector<NodeFailureRecord> decodeFailureHistory(const std::string& history) {
  std::vector<NodeFailureRecord> records;
  std::istringstream in(history);
  std::string line;
  while (std::getline(in, line)) {
    const size_t a = line.find('\t');
    if (a == std::string::npos || a == 0) continue;
    const size_t b = line.find('\t', a + 1);
    if (b == std::string::npos || b == a + 1) continue;
    NodeFailureRecord r;
    try {
      size_t used = 0;
      r.unix_ms = std::stoll(line.substr(0, a), &used);
      if (used != a) continue;
    } catch (const std::exception&) {
      continue;
    }
    r.agent_id = line.substr(a + 1, b - a - 1);
    r.host = line.substr(b + 1);
    records.push_back(std::move(r));
  }
  return records;
}

int failuresWithin(const std::vector<NodeFailureRecord>& history, const std::string& agent_id,
                   std::chrono::seconds window, int64_t now_ms) {
  const int64_t since =
      now_ms - std::chrono::duration_cast<std::chrono::milliseconds>(window).count();
  int n = 0;
  for (const NodeFailureRecord& r : history) {
    if (r.agent_id == agent_id && r.unix_ms > since && r.unix_ms <= now_ms) ++n;
  }
  return n;
}

std::vector<NodeFailureRecord> trimFailureHistory(const std::vector<NodeFailureRecord>& history,
                                                  std::chrono::seconds window, int64_t now_ms,
                                                  int per_agent) {
  const int64_t since =
      now_ms - std::chrono::duration_cast<std::chrono::milliseconds>(window).count();
  std::map<std::string, int> kept_of;
  std::vector<NodeFailureRecord> kept;
  for (auto r = history.rbegin(); r != history.rend(); ++r) {
    if (r->unix_ms <= since) continue;
    int& n = kept_of[r->agent_id];
    if (n >= per_agent) continue;
    ++n;
    kept.push_back(*r);
  }
  std::reverse(kept.begin(), kept.end());
  return kept;
}

std::string encodeFailureHistory(const std::vector<NodeFailureRecord>& history) {
  std::string text;
  for (const NodeFailureRecord& r : history) text += encodeFailureRecord(r);
  return text;
}

std::string exclusionBlocked(const ExclusionPolicy& policy, const ExclusionInput& in) {
  if (policy.after <= 0 || in.culprit_rank < 0 || in.failures < policy.after) return "";
  if (!in.elastic) return "a static job (--nnodes N) cannot go on without it";
  if (!in.culprit_may_leave) {
    return "it serves the job's store (c10d backend): the others cannot go on without it";
  }
  if (in.survivors - 1 + in.waiting < in.min_nodes) {
    return std::to_string(in.survivors - 1) + " nodes would be left" +
           (in.waiting > 0 ? " with " + std::to_string(in.waiting) + " spare(s)" : "") +
           ", fewer than the minimum " + std::to_string(in.min_nodes);
  }
  return "";
}

bool shouldExclude(const ExclusionPolicy& policy, const ExclusionInput& in) {
  return policy.after > 0 && in.culprit_rank >= 0 && in.failures >= policy.after &&
         exclusionBlocked(policy, in).empty();
}

void applyExclusion(const Membership& membership, const ExclusionPolicy& policy,
                    const ExclusionInput& in, int restarts_before, JobDecision& decision) {
  if (!shouldExclude(policy, in)) return;
  const AgentInfo& agent = membership.agents.at(static_cast<size_t>(in.culprit_rank));
  ExcludedNode excluded;
  excluded.rank = in.culprit_rank;
  excluded.host = agent.host;
  excluded.agent_id = agent.id;
  excluded.reason = "its workers caused " + std::to_string(in.failures) + " failures within " +
                    std::to_string(policy.window.count()) + " s (--exclude-after " +
                    std::to_string(policy.after) + ", --exclude-window " +
                    std::to_string(policy.window.count()) + ")";
  const std::string last = decision.summary;
  decision.kind = JobDecision::Kind::kRestart;
  decision.membership_change = true;
  decision.restarts_used = restarts_before;
  decision.summary = "node " + std::to_string(in.culprit_rank) + " (" + agent.host +
                     ") is excluded from the job: " + excluded.reason +
                     (last.empty() ? "" : "; the last: " + last);
  decision.excluded = excluded;
}

}  // namespace cpprun::agent
