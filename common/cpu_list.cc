#include "common/cpu_list.h"

#include <algorithm>

#include "common/clip.h"

namespace cpprun {

namespace {

std::string_view trimmed(std::string_view s) {
  const size_t first = s.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(" \t\r\n") - first + 1);
}

// One CPU number: digits only, at most kMaxCpuNumber; -1 when it is not one.
int cpuNumber(std::string_view text) {
  if (text.empty() || text.size() > 5 || text.find_first_not_of("0123456789") != text.npos) {
    return -1;
  }
  const int value = std::stoi(std::string(text));
  return value <= kMaxCpuNumber ? value : -1;
}

}  // namespace

CpuList::CpuList(std::vector<int> cpus) : cpus_(std::move(cpus)) {
  std::sort(cpus_.begin(), cpus_.end());
  cpus_.erase(std::unique(cpus_.begin(), cpus_.end()), cpus_.end());
  CPPRUN_CHECK(cpus_.empty() || cpus_.front() >= 0);
}

Result<CpuList> CpuList::parse(std::string_view text) {
  const std::string_view list = trimmed(text);
  std::vector<int> cpus;
  if (list.empty()) return CpuList();
  size_t begin = 0;
  while (true) {
    const size_t comma = list.find(',', begin);
    const std::string_view item =
        trimmed(list.substr(begin, comma == std::string_view::npos ? comma : comma - begin));
    const auto bad = [&](const std::string& why) -> Status {
      return invalidArgument("CPU list '" + clipValue(text) + "': " + why);
    };
    if (item.empty()) return bad("an empty item");
    const size_t dash = item.find('-');
    const int first = cpuNumber(item.substr(0, dash));
    const int last = dash == std::string_view::npos ? first : cpuNumber(item.substr(dash + 1));
    if (first < 0 || last < 0) {
      return bad("'" + clipValue(item) + "' is not a CPU number or range (0-" +
                 std::to_string(kMaxCpuNumber) + ")");
    }
    if (last < first) return bad("'" + clipValue(item) + "' is a reversed range");
    for (int cpu = first; cpu <= last; ++cpu) cpus.push_back(cpu);
    if (comma == std::string_view::npos) break;
    begin = comma + 1;
  }
  return CpuList(std::move(cpus));
}

bool CpuList::contains(int cpu) const {
  return std::binary_search(cpus_.begin(), cpus_.end(), cpu);
}

std::string CpuList::toString() const { return formatIndexList(cpus_); }

std::string formatIndexList(std::vector<int> values) {
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());
  std::string out;
  for (size_t i = 0; i < values.size();) {
    size_t j = i;
    while (j + 1 < values.size() && values[j + 1] == values[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(values[i]);
    if (j > i) out += "-" + std::to_string(values[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace cpprun
