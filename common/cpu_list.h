// CpuList: a set of CPU numbers in the kernel's list format, "0-3,8,10-11".
//
// The one reader and writer of that text: /sys/devices/system/node/node*/cpulist, the CPUs a
// worker is bound to in --check, in logs and in spawn errors. The same syntax names NUMA nodes
// (formatIndexList() for those). Parsing is strict: numbers are decimal digits, a range's first
// number is not above its last, and nothing past kMaxCpuNumber is accepted, so a damaged file
// is an error naming its text, not a guess.
// Thread safety: a value type and pure functions.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace cpprun {

// The highest CPU number a list may name (the kernel's NR_CPUS is at most 8192 today).
inline constexpr int kMaxCpuNumber = (1 << 16) - 1;

class CpuList {
 public:
  CpuList() = default;
  // The set of `cpus`, in any order, duplicates dropped. REQUIRES: none negative.
  explicit CpuList(std::vector<int> cpus);

  // "0-3,8,10-11", also with spaces around items and a trailing line feed (as sysfs writes
  // it); "" and "\n" are the empty list. The error (kInvalidArgument) names the text and the
  // item: "CPU list '0-3,x': 'x' is not a CPU number", "... '5-2' is a reversed range".
  static Result<CpuList> parse(std::string_view text);

  // Ascending, no duplicates.
  const std::vector<int>& cpus() const { return cpus_; }
  bool empty() const { return cpus_.empty(); }
  size_t size() const { return cpus_.size(); }
  bool contains(int cpu) const;

  // "0-3,8,10-11"; "" when empty (callers that show it to people say "none" themselves).
  std::string toString() const;

  bool operator==(const CpuList& o) const { return cpus_ == o.cpus_; }

 private:
  std::vector<int> cpus_;
};

// `values` (CPUs, NUMA nodes) in the kernel's list format, sorted and without duplicates:
// {3,0,1,2,8} -> "0-3,8"; {} -> "". Any ints (an error may show a negative one).
std::string formatIndexList(std::vector<int> values);

}  // namespace cpprun
