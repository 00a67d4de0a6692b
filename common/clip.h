// clipValue: a flag's or an environment variable's value as an error message may echo it. A
// value can be anything the user's shell or scheduler exported (a 128 KiB variable, a line
// feed, a terminal escape); the message must stay one readable line that still shows what the
// value was. Every message that echoes user input goes through this one function.
// clipQuotedLine: a line a worker wrote, as a failure report quotes it (bounded, not escaped).
// Thread safety: a pure function.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace cpprun {

// How many bytes of a value a message shows before it cuts.
inline constexpr size_t kClipKeep = 64;

// How many of `value`'s first `keep` bytes to show without splitting a UTF-8 character: a cut
// before a continuation byte moves back to the start of its character (at most 3 bytes; further
// back the text is not UTF-8 anyway). value.size() when it is no longer than `keep`.
inline size_t utf8Prefix(std::string_view value, size_t keep) {
  if (value.size() <= keep) return value.size();
  const auto continuation = [&](size_t i) {
    return (static_cast<unsigned char>(value[i]) & 0xC0) == 0x80;  // 10xxxxxx
  };
  size_t back = keep;
  while (back > 0 && keep - back < 3 && continuation(back)) --back;
  return continuation(back) ? keep : back;
}

// `value` with control bytes escaped (\n, \t, \r, \xNN) and, when longer than `keep` bytes,
// cut after its first `keep` bytes (backing off to a UTF-8 character boundary) with
// "… (N bytes)" appended, N being the whole value's length. Short printable values come back
// unchanged.
inline std::string clipValue(std::string_view value, size_t keep = kClipKeep) {
  const size_t shown = utf8Prefix(value, keep);
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(shown + 24);
  for (size_t i = 0; i < shown; ++i) {
    const unsigned char c = static_cast<unsigned char>(value[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7f) {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 0x0f];
    } else {
      out += static_cast<char>(c);
    }
  }
  if (shown < value.size()) {
    out += "\xE2\x80\xA6 (" + std::to_string(value.size()) + " bytes)";
  }
  return out;
}

// A line a program wrote, quoted as written (no escaping: a failure report shows a worker's own
// text): its first `keep` bytes (utf8Prefix) and "… (N bytes clipped)", N counting the rest of a
// line `line_bytes` long in all (at least line.size(): the caller may hold only the line's head).
// The line unchanged when nothing is clipped.
inline std::string clipQuotedLine(std::string_view line, size_t keep, uint64_t line_bytes) {
  if (line_bytes < line.size()) line_bytes = line.size();
  const size_t shown = utf8Prefix(line, keep);
  if (shown == line_bytes) return std::string(line);
  return std::string(line.substr(0, shown)) + "\xE2\x80\xA6 (" +
         std::to_string(line_bytes - shown) + " bytes clipped)";
}

}  // namespace cpprun
