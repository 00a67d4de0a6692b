// clipValue: a flag's or an environment variable's value as an error message may echo it. A
// value can be anything the user's shell or scheduler exported (a 128 KiB variable, a line
// feed, a terminal escape); the message must stay one readable line that still shows what the
// value was. Every message that echoes user input goes through this one function.
// Thread safety: a pure function.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace cpprun {

// How many bytes of a value a message shows before it cuts.
inline constexpr size_t kClipKeep = 64;

// `value` with control bytes escaped (\n, \t, \r, \xNN) and, when longer than `keep` bytes,
// cut after its first `keep` bytes (backing off to a UTF-8 character boundary) with
// "… (N bytes)" appended, N being the whole value's length. Short printable values come back
// unchanged.
inline std::string clipValue(std::string_view value, size_t keep = kClipKeep) {
  const auto continuation = [&](size_t i) {
    return (static_cast<unsigned char>(value[i]) & 0xC0) == 0x80;  // 10xxxxxx
  };
  size_t shown = value.size();
  if (shown > keep) {
    // Do not split a UTF-8 character: a cut before a continuation byte moves back to the start
    // of its character (at most 3 bytes; further back the text is not UTF-8 anyway).
    shown = keep;
    size_t back = shown;
    while (back > 0 && shown - back < 3 && continuation(back)) --back;
    if (!continuation(back)) shown = back;
  }
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

}  // namespace cpprun
