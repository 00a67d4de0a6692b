#include "common/command_line.h"

#include <cerrno>
#include <cstdlib>

namespace cpprun {

bool OptionCursor::next() {
  if (next_index_ >= args_.size()) return false;
  const std::string& arg = args_[next_index_++];
  is_option_ = arg.size() > 2 && arg.compare(0, 2, "--") == 0;
  has_inline_value_ = false;
  inline_value_.clear();
  name_ = arg;
  if (!is_option_) return true;
  auto eq = arg.find('=');
  if (eq != std::string::npos) {
    name_ = arg.substr(0, eq);
    inline_value_ = arg.substr(eq + 1);
    has_inline_value_ = true;
  }
  for (size_t i = 2; i < name_.size(); ++i) {
    if (name_[i] == '_') name_[i] = '-';
  }
  return true;
}

Result<std::string> OptionCursor::value() {
  if (has_inline_value_) return inline_value_;
  if (next_index_ >= args_.size()) return invalidArgument("option " + name_ + " needs a value");
  return args_[next_index_++];
}

Result<uint64_t> parseUnsigned(const std::string& flag, const std::string& text, uint64_t max) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos) {
    return invalidArgument("invalid value '" + text + "' for " + flag +
                           ": expected a non-negative integer");
  }
  errno = 0;
  unsigned long long v = std::strtoull(text.c_str(), nullptr, 10);
  if (errno == ERANGE || v > max) {
    return invalidArgument("value " + text + " for " + flag + " is out of range (at most " +
                           std::to_string(max) + ")");
  }
  return static_cast<uint64_t>(v);
}

Result<uint64_t> parseUnsigned(const std::string& flag, const std::string& text, uint64_t min,
                               uint64_t max) {
  Result<uint64_t> n = parseUnsigned(flag, text, max);
  if (n.isOk() && n.value() < min) {
    return invalidArgument(flag + " is at least " + std::to_string(min) + ", not " + text);
  }
  return n;
}

}  // namespace cpprun
