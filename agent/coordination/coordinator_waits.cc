#include "agent/coordination/coordinator_waits.h"

#include <algorithm>

#include "common/logging.h"
#include "rendezvous/store.h"

namespace cpprun::agent {

WaitAnnouncer::WaitAnnouncer(WaitContext& context, Clock::time_point deadline)
    : context_(context), clock_(context.clock()), notice_(clock_.now()), deadline_(deadline) {}

WaitAnnouncer::~WaitAnnouncer() { context_.setWaiting(""); }

void WaitAnnouncer::maybeAnnounce(const std::function<std::string()>& describe) {
  const auto now = clock_.now();
  if (!notice_.due(now)) return;
  const std::string text = describe();
  context_.setWaiting(text);
  std::string line = text + " for " + formatWait(notice_.elapsed(now));
  if (deadline_ != Clock::time_point::max()) {
    line += ", timeout in " +
            formatWait(std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - now));
  }
  CPPRUN_LOG(kInfo) << line;
}

Status waitForKeys(WaitContext& context, rendezvous::Store& store,
                   const std::vector<std::string>& keys, std::chrono::milliseconds total,
                   std::chrono::milliseconds slice, const std::string& what,
                   const std::function<SliceVerdict()>& on_slice,
                   const std::function<std::string()>& describe) {
  using Clock = WaitAnnouncer::Clock;
  const Clock& clock = context.clock();
  const auto deadline = clock.now() + total;
  WaitAnnouncer announcer(context, total < kNoDeadline ? deadline : Clock::time_point::max());
  while (true) {
    if (Status s = context.abandonment(); !s.isOk()) return s;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock.now());
    if (left.count() <= 0) {
      return timeoutError(what + ": not done after " + std::to_string(total.count() / 1000.0) +
                          " s");
    }
    try {
      store.wait(keys, std::min({left, slice, kNoticeSlice}));
      return Status::ok();
    } catch (const rendezvous::StoreTimeout&) {
      if (on_slice) {
        SliceVerdict verdict = on_slice();
        if (verdict.kind == SliceVerdict::Kind::kDone) return Status::ok();
        if (verdict.kind == SliceVerdict::Kind::kAbandon) return std::move(verdict.status);
      }
      if (describe) announcer.maybeAnnounce(describe);
    }
  }
}

std::string withThousands(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n);
  for (int at = static_cast<int>(digits.size()) - 3; at > 0; at -= 3) {
    digits.insert(static_cast<size_t>(at), ",");
  }
  return (n < 0 ? "-" : "") + digits;
}

namespace {

// The first kMaxListedNodes of `names`, then "and N more" for the rest of `total` ("" without
// names).
std::string cappedList(const std::vector<std::string>& names, size_t total) {
  total = std::max(total, names.size());
  std::string out;
  const size_t shown = std::min(names.size(), kMaxListedNodes);
  for (size_t i = 0; i < shown; ++i) out += (i == 0 ? "" : ", ") + names[i];
  if (shown > 0 && total > shown) {
    out += " and " + withThousands(static_cast<int64_t>(total - shown)) + " more";
  }
  return out;
}

}  // namespace

std::string nodeNames(const std::vector<std::string>& expected_hosts, const std::vector<int>& ranks,
                      size_t total) {
  std::vector<std::string> names;
  for (size_t i = 0; i < ranks.size() && i < kMaxListedNodes; ++i) {
    const int r = ranks[i];
    if (r >= 0 && r < static_cast<int>(expected_hosts.size())) {
      names.push_back(expected_hosts[static_cast<size_t>(r)]);
    } else {
      names.push_back("node " + std::to_string(r));
    }
  }
  return cappedList(names, std::max(total, ranks.size()));
}

std::string rankList(const std::vector<int>& ranks, size_t total) {
  std::vector<std::string> names;
  for (size_t i = 0; i < ranks.size() && i < kMaxListedNodes; ++i) {
    names.push_back(std::to_string(ranks[i]));
  }
  return cappedList(names, std::max(total, ranks.size()));
}

std::string describeMissing(rendezvous::Store& store, const std::vector<std::string>& keys,
                            const std::vector<std::string>& expected_hosts,
                            const std::string& what) {
  std::vector<int> missing;
  for (size_t r = 0; r < keys.size(); ++r) {
    if (!store.check({keys[r]})) missing.push_back(static_cast<int>(r));
  }
  return "waiting for " + std::to_string(missing.size()) + " of " + std::to_string(keys.size()) +
         " nodes (" + nodeNames(expected_hosts, missing) + ") " + what;
}

}  // namespace cpprun::agent
