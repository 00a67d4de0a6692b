#include "agent/supervision/stall_verdict.h"

#include <algorithm>
#include <map>
#include <sstream>
#include <tuple>
#include <unordered_map>

#include "agent/supervision/record_reader.h"

namespace cpprun::agent {

using nlohmann::json;

namespace {

// Printable ASCII only, cut at `max` bytes: what a peer sent goes into logs and reports.
std::string clean(const std::string& text, size_t max) {
  std::string out;
  for (char c : text) {
    if (out.size() >= max) break;
    out.push_back(c >= 0x20 && c < 0x7f ? c : '?');
  }
  return out;
}

std::string describeCollective(const CollectiveRecord& c) {
  std::string text = c.op + " #" + std::to_string(c.seq);
  if (c.group != "world" && c.group != "ddp") text += " of group " + c.group;
  return text;
}

std::string rankName(const RankState& s) {
  std::string text = "rank " + std::to_string(s.rank);
  if (s.node >= 0) {
    text += " (node " + std::to_string(s.node) + (s.host.empty() ? "" : ", " + s.host) + ")";
  }
  return text;
}

// Why `s` is a culprit, given the collective `waited` the others are in.
std::string culpritReason(const RankState& s, const CollectiveRecord& waited) {
  const std::string waited_text = describeCollective(waited);
  std::string where;
  if (!s.frame.empty()) where = "it is in " + s.frame;
  if (s.exited) {
    std::string text = s.exit_code < 0 ? "was killed by signal " + std::to_string(-s.exit_code)
                                       : "exited with code " + std::to_string(s.exit_code);
    if (s.collective) {
      text += (s.collective->inside ? " inside " : " after ") + describeCollective(*s.collective);
    }
    return text + " and never entered " + waited_text;
  }
  const CollectiveRecord& c = *s.collective;
  const bool same_point = c.group == waited.group && c.seq == waited.seq;
  if (c.inside && same_point) {
    return "waits in " + describeCollective(c) + ", not " + waited.op + " (a desync)";
  }
  if (c.inside && c.group == waited.group && c.seq < waited.seq) {
    return "is behind: at " + describeCollective(c) + ", not #" + std::to_string(waited.seq) +
           (where.empty() ? "" : " (" + where + ")");
  }
  if (c.inside) {
    return "waits in another collective, " + describeCollective(c) +
           (where.empty() ? "" : " (" + where + ")");
  }
  std::string text = "did not enter " + waited_text;
  if (!where.empty()) text += ": " + where;
  text += (where.empty() ? ": " : ", ") + std::string("after ") + describeCollective(c);
  return text;
}

}  // namespace

std::vector<std::string> mainThreadStack(const std::string& text) {
  // faulthandler lists threads newest first, each "Thread 0x... (most recent call first):" (or
  // "Current thread ...", the one the signal ran on) and its "  File ..." lines; the main thread
  // is the oldest, the last block. A dump appended to the file twice: the last one counts.
  std::istringstream in(text);
  std::string line;
  std::vector<std::string> block;
  while (std::getline(in, line)) {
    const size_t start = line.find_first_not_of(' ');
    if (start == std::string::npos) continue;
    const std::string body = line.substr(start);
    if (body.rfind("Thread ", 0) == 0 || body.rfind("Current thread", 0) == 0) {
      block.clear();
      block.push_back(clean(line, kMaxStackLineBytes));
    } else if (!block.empty() && body.rfind("File \"", 0) == 0 && block.size() < kMaxStackLines) {
      block.push_back(clean(line, kMaxStackLineBytes));
    }
  }
  return block;
}

std::string innermostPythonFrame(const std::string& text) {
  return innermostFrameOf(mainThreadStack(text));
}

std::string innermostFrameOf(const std::vector<std::string>& stack) {
  if (stack.size() < 2) return "";
  // "  File "path", line N in name" → "path:N in name"
  const std::string& frame = stack[1];
  const size_t open = frame.find('"');
  const size_t close = open == std::string::npos ? open : frame.find('"', open + 1);
  if (close == std::string::npos) return "";
  std::string text_out = frame.substr(open + 1, close - open - 1);
  const std::string rest = frame.substr(close + 1);
  const size_t l = rest.find("line ");
  if (l != std::string::npos) {
    size_t e = l + 5;
    while (e < rest.size() && rest[e] >= '0' && rest[e] <= '9') ++e;
    text_out += ":" + rest.substr(l + 5, e - l - 5);
    const size_t in_at = rest.find(" in ", e);
    if (in_at != std::string::npos) text_out += " in " + rest.substr(in_at + 4);
  }
  return clean(text_out, kMaxFrameBytes);
}

json rankStateToJson(const RankState& s) {
  json doc = {{"r", s.rank}, {"l", s.local_rank}, {"p", s.pid}};
  if (s.stalled) doc["s"] = true;
  if (s.exited) {
    doc["x"] = true;
    doc["c"] = s.exit_code;
  }
  if (s.collective) {
    doc["in"] = s.collective->inside;
    doc["op"] = s.collective->op;
    doc["g"] = s.collective->group;
    doc["q"] = s.collective->seq;
  }
  if (!s.frame.empty()) doc["f"] = s.frame;
  if (!s.stack.empty()) doc["k"] = s.stack;
  return doc;
}

Result<RankState> rankStateFromJson(const json& doc, const std::string& where) {
  // A present field must have the right type and range; an absent one keeps its default.
  RecordReader in(doc, where + ": a rank's state");
  RankState s;
  s.rank = in.intIn("r", -1, 0, 1 << 24, /*required=*/true);
  s.local_rank = in.intIn("l", -1, -1, 1 << 16);
  s.pid = in.intIn("p", 0, 0, 1 << 30);
  s.exit_code = in.intIn("c", 0, -128, 255);
  s.stalled = in.boolean("s", false);
  s.exited = in.boolean("x", false);
  if (in.ok() && in.has("op")) {
    CollectiveRecord c;
    c.op = in.text("op", "", kMaxCollectiveNameBytes, true);
    c.group = in.text("g", "", kMaxCollectiveNameBytes, true);
    c.seq = static_cast<uint64_t>(in.integer("q", 0, 0, INT64_MAX, true));
    c.inside = in.boolean("in", false);
    if (in.ok() && (!validCollectiveName(c.op) || !validCollectiveName(c.group))) {
      in.fail("collective op or group malformed");
    }
    s.collective = c;
  }
  s.frame = clean(in.text("f", "", kMaxFrameBytes), kMaxFrameBytes);
  for (const std::string& line : in.texts("k", kMaxStackLines, kMaxStackLineBytes)) {
    s.stack.push_back(clean(line, kMaxStackLineBytes));
  }
  if (!in.ok()) return in.status();
  return s;
}

void trimWaitingStacks(std::vector<RankState>& local) {
  // Ranks in the same collective as another rank of this node are victims wherever the culprit
  // is (unless every rank of the job is there: then nobody is a culprit and no stack is read).
  std::map<std::tuple<std::string, uint64_t, std::string>, int> in_collective;
  for (const RankState& s : local) {
    if (s.collective && s.collective->inside && !s.exited) {
      ++in_collective[{s.collective->group, s.collective->seq, s.collective->op}];
    }
  }
  for (RankState& s : local) {
    if (s.collective && s.collective->inside && !s.exited &&
        in_collective[{s.collective->group, s.collective->seq, s.collective->op}] > 1) {
      s.stack.clear();
    }
  }
}

std::optional<StallVerdict> decideStall(const std::vector<RankState>& states) {
  // The collective the job waits in: the most ranks; ties: the later sequence number.
  std::map<std::tuple<std::string, uint64_t, std::string>, int> count;
  for (const RankState& s : states) {
    if (s.collective && s.collective->inside) {
      ++count[{s.collective->group, s.collective->seq, s.collective->op}];
    }
  }
  if (count.empty()) return std::nullopt;
  auto best = count.begin();
  for (auto it = count.begin(); it != count.end(); ++it) {
    if (it->second > best->second ||
        (it->second == best->second && std::get<1>(it->first) > std::get<1>(best->first))) {
      best = it;
    }
  }
  CollectiveRecord waited;
  waited.inside = true;
  std::tie(waited.group, waited.seq, waited.op) = best->first;

  std::vector<size_t> order(states.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return states[a].rank < states[b].rank; });

  StallVerdict v;
  v.waited_in = describeCollective(waited);
  for (size_t i : order) {
    const RankState& s = states[i];
    // A rank that exited inside the collective the others wait in was torn down there (a
    // worker that crashed would have failed the attempt before any stall): it waited too.
    const bool waits = s.collective && s.collective->inside &&
                       s.collective->group == waited.group && s.collective->seq == waited.seq &&
                       s.collective->op == waited.op;
    if (waits) {
      v.waiting.push_back(i);
    } else if (!s.collective && !s.exited) {
      v.unknown.push_back(i);
    } else {
      v.culprits.push_back(i);
      v.culprit_reasons.push_back(culpritReason(s, waited));
    }
  }
  const std::string waiting_text = std::to_string(v.waiting.size()) +
                                   (v.waiting.size() == 1 ? " rank waits in " : " ranks wait in ") +
                                   v.waited_in;
  if (v.culprits.empty()) {
    v.summary = (v.unknown.empty() ? "all " : "") + waiting_text + "; no rank is behind";
    if (!v.unknown.empty()) {
      v.summary += " of those that said (" + std::to_string(v.unknown.size()) +
                   " gave no state, e.g. " + rankName(states[v.unknown.front()]) + ")";
    }
    v.summary += ": suspect the network or a device";
    return v;
  }
  v.summary = rankName(states[v.culprits.front()]) + " " + v.culprit_reasons.front();
  if (v.culprits.size() > 1) {
    v.summary += " (and " + std::to_string(v.culprits.size() - 1) + " more culprit rank" +
                 (v.culprits.size() == 2 ? "" : "s") + ")";
  }
  v.summary += "; " + waiting_text;
  return v;
}

json stallVerdictEvent(int attempt, const StallVerdict& v, const std::vector<RankState>& states) {
  json culprits = json::array();
  for (size_t k = 0; k < v.culprits.size(); ++k) {
    const RankState& s = states[v.culprits[k]];
    json c = {{"rank", s.rank}, {"local_rank", s.local_rank}, {"why", v.culprit_reasons[k]}};
    if (s.node >= 0) c["node"] = s.node;
    if (!s.host.empty()) c["host"] = s.host;
    if (!s.frame.empty()) c["frame"] = s.frame;
    culprits.push_back(std::move(c));
  }
  auto ranks = [&](const std::vector<size_t>& indices) {
    json out = json::array();
    for (size_t i : indices) out.push_back(states[i].rank);
    return out;
  };
  return {{"attempt", attempt},          {"summary", v.summary},
          {"waited_in", v.waited_in},    {"culprits", std::move(culprits)},
          {"waiting", ranks(v.waiting)}, {"unknown", ranks(v.unknown)}};
}

void applyStallVerdict(const StallVerdict& v, const std::vector<RankState>& states,
                       std::vector<WorkerFailure>& failures) {
  auto earliest = std::chrono::system_clock::time_point::max();
  for (const WorkerFailure& f : failures) earliest = std::min(earliest, f.time);
  if (failures.empty()) earliest = std::chrono::system_clock::now();
  // By rank, built once: the decider applies a verdict of 8,192 ranks to as many failures.
  std::unordered_map<int, size_t> failure_of;
  for (size_t i = 0; i < failures.size(); ++i) failure_of.emplace(failures[i].rank, i);
  auto find = [&](const RankState& s) -> WorkerFailure* {
    const auto it = failure_of.find(s.rank);
    return it == failure_of.end() ? nullptr : &failures[it->second];
  };
  const std::string others = std::to_string(v.waiting.size()) +
                             (v.waiting.size() == 1 ? " rank waits in " : " ranks wait in ") +
                             v.waited_in;
  for (size_t k = 0; k < v.culprits.size(); ++k) {
    const RankState& s = states[v.culprits[k]];
    WorkerFailure* f = find(s);
    if (f == nullptr) {
      WorkerFailure made;
      made.rank = s.rank;
      made.local_rank = s.local_rank;
      made.pid = s.pid;
      made.host = s.host;
      made.exit_code = s.exit_code > 0 ? s.exit_code : 0;
      made.signal = s.exit_code < 0 ? -s.exit_code : 0;
      failure_of.emplace(made.rank, failures.size());
      failures.push_back(std::move(made));
      f = &failures.back();
    }
    const std::string why =
        std::string(kHangCulpritPrefix) + rankName(s) + " " + v.culprit_reasons[k] + "; " + others;
    const std::string stall_line = f->message;  // the stall's own line, when it was stalled
    f->teardown = false;
    f->collateral = false;
    f->waiting = false;
    f->message = why;
    std::string traceback = why + "\n";
    if (!stall_line.empty() && stall_line != why && s.stalled) traceback += stall_line + "\n";
    if (!s.stack.empty()) {
      for (const std::string& line : s.stack) traceback += line + "\n";
    } else if (!f->traceback.empty() && s.stalled) {
      // The node's own stall text already carries the stacks after its first line.
      const size_t nl = f->traceback.find('\n');
      if (nl != std::string::npos) traceback += f->traceback.substr(nl + 1);
    }
    f->traceback = traceback;
    // The first culprit in rank order is the root cause.
    f->time = earliest - std::chrono::microseconds(v.culprits.size() - k);
  }
  if (v.culprits.empty()) {
    // Nobody to blame: the stalled ranks stay the failures, with the verdict as their first line.
    for (WorkerFailure& f : failures) {
      if (f.teardown) continue;
      f.message = v.summary;
      f.traceback = v.summary + "\n" + f.traceback;
    }
    return;
  }
  for (size_t i : v.waiting) {
    WorkerFailure* f = find(states[i]);
    if (f == nullptr) continue;
    f->waiting = true;
    f->collateral = false;
    f->message = "waiting in " + v.waited_in + " for the culprit";
    f->traceback = f->message + "\n";
  }
}

}  // namespace cpprun::agent
