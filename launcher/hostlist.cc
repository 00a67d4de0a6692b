#include "launcher/hostlist.h"

#include <cctype>
#include <limits>

#include "common/clip.h"

namespace cpprun::launcher {

namespace {

bool isSeparator(char c) { return c == ',' || c == ' ' || c == '\t' || c == '\n'; }

bool allDigits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// A decimal without sign that fits comfortably in an unsigned long long.
bool parseNumber(const std::string& s, unsigned long long* out) {
  if (!allDigits(s) || s.size() > 18) return false;
  *out = std::stoull(s);
  return true;
}

std::string padded(unsigned long long n, size_t width) {
  std::string digits = std::to_string(n);
  if (digits.size() < width) digits.insert(0, width - digits.size(), '0');
  return digits;
}

Status tokenError(const std::string& token, const std::string& why) {
  return invalidArgument("hostlist token '" + clipValue(token) + "': " + why);
}

// The values of "1-3,07,9-10" (inside one pair of brackets), appended to `out` as strings.
Status expandRanges(const std::string& token, const std::string& ranges,
                    std::vector<std::string>* out) {
  size_t start = 0;
  while (true) {
    const size_t comma = ranges.find(',', start);
    const std::string range =
        ranges.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (range.empty()) return tokenError(token, "empty range");
    if (range.find_first_of("xX") != std::string::npos) {
      return tokenError(token,
                        "'" + clipValue(range) + "': multi-dimensional ranges are not supported");
    }
    const size_t dash = range.find('-');
    const std::string lo_text = range.substr(0, dash);
    std::string hi_text = dash == std::string::npos ? lo_text : range.substr(dash + 1);
    if (hi_text.empty()) hi_text = lo_text;  // "n[1-]" is tolerated as n1, as Slurm does
    unsigned long long lo = 0;
    unsigned long long hi = 0;
    if (!parseNumber(lo_text, &lo) || !parseNumber(hi_text, &hi)) {
      return tokenError(token, "'" + clipValue(range) + "' is not NUM or NUM-NUM");
    }
    if (lo > hi) return tokenError(token, "'" + clipValue(range) + "': low bound above high bound");
    if (hi - lo >= kMaxHostlistHosts || out->size() + (hi - lo) >= kMaxHostlistHosts) {
      return tokenError(token, "more than " + std::to_string(kMaxHostlistHosts) + " hosts");
    }
    for (unsigned long long n = lo; n <= hi; ++n) out->push_back(padded(n, lo_text.size()));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return Status::ok();
}

// One token, bracket groups anywhere in it; the last group varies fastest.
Status expandToken(const std::string& whole, const std::string& token,
                   std::vector<std::string>* out) {
  const size_t open = token.rfind('[');
  if (open == std::string::npos) {
    out->push_back(token);  // plain, or only a literal ']'
    return Status::ok();
  }
  const size_t close = token.find(']', open);
  if (close == std::string::npos) return tokenError(whole, "'[' without ']'");
  const std::string suffix = token.substr(close + 1);
  std::vector<std::string> values;
  if (Status s = expandRanges(whole, token.substr(open + 1, close - open - 1), &values);
      !s.isOk()) {
    return s;
  }
  std::vector<std::string> prefixes;
  if (Status s = expandToken(whole, token.substr(0, open), &prefixes); !s.isOk()) return s;
  if (prefixes.size() * values.size() + out->size() > kMaxHostlistHosts) {
    return tokenError(whole, "more than " + std::to_string(kMaxHostlistHosts) + " hosts");
  }
  for (const std::string& prefix : prefixes) {
    for (const std::string& value : values) out->push_back(prefix + value + suffix);
  }
  return Status::ok();
}

}  // namespace

Result<std::vector<std::string>> expandHostlist(const std::string& hostlist) {
  std::vector<std::string> hosts;
  std::string token;
  int depth = 0;
  auto flush = [&]() -> Status {
    if (token.empty()) return Status::ok();
    if (depth > 0) return tokenError(token, "'[' without ']'");
    Status s = expandToken(token, token, &hosts);
    token.clear();
    return s;
  };
  for (char c : hostlist) {
    if (depth == 0 && isSeparator(c)) {
      if (Status s = flush(); !s.isOk()) return s;
      continue;
    }
    if (c == '[') {
      if (depth > 0) return tokenError(token + c, "nested '['");
      ++depth;
    } else if (c == ']' && depth > 0) {
      --depth;
    }
    token += c;
  }
  if (Status s = flush(); !s.isOk()) return s;
  if (hosts.empty()) return invalidArgument("hostlist '" + hostlist + "' names no host");
  return hosts;
}

Result<std::vector<int>> expandTaskCounts(const std::string& counts) {
  std::vector<int> out;
  size_t start = 0;
  while (start <= counts.size()) {
    const size_t comma = counts.find(',', start);
    const std::string item =
        counts.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    auto bad = [&](const std::string& why) {
      return invalidArgument("count list '" + clipValue(counts) + "': '" + clipValue(item) + "' " +
                             why);
    };
    const size_t paren = item.find('(');
    const std::string count_text = item.substr(0, paren);
    unsigned long long count = 0;
    unsigned long long repeat = 1;
    if (!parseNumber(count_text, &count) || count > std::numeric_limits<int>::max()) {
      return bad("is not N or N(xK)");
    }
    if (paren != std::string::npos) {
      if (item.size() < paren + 4 || item[paren + 1] != 'x' || item.back() != ')' ||
          !parseNumber(item.substr(paren + 2, item.size() - paren - 3), &repeat) || repeat == 0) {
        return bad("is not N or N(xK)");
      }
    }
    if (repeat > kMaxHostlistHosts || out.size() + repeat > kMaxHostlistHosts) {
      return bad("repeats for more than " + std::to_string(kMaxHostlistHosts) + " nodes");
    }
    out.insert(out.end(), repeat, static_cast<int>(count));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace cpprun::launcher
