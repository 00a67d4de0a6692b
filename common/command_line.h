// OptionCursor: walks a command line of GNU-style long options for cpprun's programs.
//
// Accepts "--name=value" and "--name value", and spells names with '-' whether the user typed
// '-' or '_' (torchrun accepts both). Errors are values: value() says which option lacks one.
// parseUnsigned() turns text into a bounded number with a message naming the flag.
// Thread safety: an OptionCursor belongs to one thread; the functions are reentrant.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace cpprun {

class OptionCursor {
 public:
  explicit OptionCursor(std::vector<std::string> args) : args_(std::move(args)) {}
  OptionCursor(int argc, char** argv)
      : OptionCursor(std::vector<std::string>(argv + 1, argv + argc)) {}

  // Moves to the next argument; false when none is left.
  bool next();
  // True when the current argument starts with "--".
  bool isOption() const { return is_option_; }
  // The option's normalised name ("--max-restarts"), or a positional argument as given.
  const std::string& name() const { return name_; }
  // True for "--name=value".
  bool hasInlineValue() const { return has_inline_value_; }
  // The option's value: the text after '=', else the next argument (consumed).
  Result<std::string> value();

 private:
  std::vector<std::string> args_;
  size_t next_index_ = 0;
  bool is_option_ = false;
  bool has_inline_value_ = false;
  std::string name_;
  std::string inline_value_;
};

// Parses a decimal number in [0, max]; the error names `flag` and the text.
Result<uint64_t> parseUnsigned(const std::string& flag, const std::string& text, uint64_t max);
// The same in [min, max]: below `min`, "<flag> is at least <min>, not <text>".
Result<uint64_t> parseUnsigned(const std::string& flag, const std::string& text, uint64_t min,
                               uint64_t max);

}  // namespace cpprun
