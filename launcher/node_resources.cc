#include "launcher/node_resources.h"

#include <sched.h>
#include <unistd.h>

#include <cctype>
#include <climits>
#include <optional>
#include <set>

#include "common/clip.h"

namespace cpprun::launcher {

namespace {

std::string stripBlanks(const std::string& text) {
  size_t b = text.find_first_not_of(" \t\n\r\f\v");
  if (b == std::string::npos) return "";
  size_t e = text.find_last_not_of(" \t\n\r\f\v");
  return text.substr(b, e - b + 1);
}

// The integer an entry starts with, as strtoul reads it ("1gpu2" is 1, "+3" is 3, "-1" is -1);
// nullopt when it starts with none or one too large to be a device.
std::optional<long long> leadingOrdinal(const std::string& entry) {
  size_t i = 0;
  const bool negative = !entry.empty() && entry[0] == '-';
  if (!entry.empty() && (entry[0] == '-' || entry[0] == '+')) i = 1;
  const size_t first_digit = i;
  long long value = 0;
  for (; i < entry.size() && std::isdigit(static_cast<unsigned char>(entry[i])); ++i) {
    value = value * 10 + (entry[i] - '0');
    if (value > INT_MAX) return std::nullopt;
  }
  if (i == first_digit) return std::nullopt;
  return negative ? -value : value;
}

std::string joinDevices(const std::vector<std::string>& devices) {
  std::string out;
  for (const std::string& d : devices) out += (out.empty() ? "" : ",") + d;
  return out;
}

}  // namespace

VisibleDevices parseCudaVisibleDevices(const std::string& value) {
  VisibleDevices out;
  const std::vector<std::string> entries = [&] {
    std::vector<std::string> v;
    size_t start = 0;
    while (true) {
      const size_t comma = value.find(',', start);
      v.push_back(
          stripBlanks(value.substr(start, comma == std::string::npos ? comma : comma - start)));
      if (comma == std::string::npos) return v;
      start = comma + 1;
    }
  }();
  const std::string shown = "CUDA_VISIBLE_DEVICES=" + clipValue(value);
  std::string prefix;
  for (const char* p : {"GPU-", "MIG-"}) {
    if (entries.front().rfind(p, 0) == 0) prefix = p;
  }
  std::set<std::string> seen;
  size_t i = 0;
  for (; i < entries.size(); ++i) {
    std::string device;
    if (!prefix.empty()) {
      if (entries[i].rfind(prefix, 0) != 0) break;
      device = entries[i];
    } else {
      const std::optional<long long> ordinal = leadingOrdinal(entries[i]);
      if (!ordinal || *ordinal < 0) break;
      device = std::to_string(*ordinal);
    }
    if (!seen.insert(device).second) {
      out.devices.clear();
      out.note = shown + " names GPU " + clipValue(device) + " twice: CUDA then sees no GPU";
      return out;
    }
    out.devices.push_back(device);
  }
  const bool dropped = i < entries.size() && (i + 1 < entries.size() || !entries[i].empty());
  if (dropped && !value.empty()) {
    out.note =
        shown + ": CUDA reads no device from '" + clipValue(entries[i]) + "' on (" +
        (prefix.empty() ? "not a device ordinal >= 0" : "not a " + prefix + " UUID") +
        "), so it sees " +
        (out.devices.empty()       ? std::string("no GPU")
         : out.devices.size() == 1 ? "GPU " + clipValue(out.devices.front()) + " only"
                                   : "GPUs " + clipValue(joinDevices(out.devices)) + " only");
  }
  return out;
}

std::vector<std::string> splitDeviceList(const std::string& list) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    if (comma == std::string::npos) comma = list.size();
    std::string item = list.substr(start, comma - start);
    size_t b = item.find_first_not_of(" \t");
    size_t e = item.find_last_not_of(" \t");
    if (b != std::string::npos) out.push_back(item.substr(b, e - b + 1));
    start = comma + 1;
  }
  return out;
}

NodeResources discoverNodeResources(const std::map<std::string, std::string>& env,
                                    const std::optional<Result<CudaDriverInfo>>& driver) {
  NodeResources r;
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) == 0) r.hostname = host;

  auto lookup = [&](const char* name) -> const std::string* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : &it->second;
  };
  if (const std::string* cvd = lookup("CUDA_VISIBLE_DEVICES")) {
    // Set, even to an empty list: the user or the scheduler decided.
    VisibleDevices visible = parseCudaVisibleDevices(*cvd);
    r.gpus = std::move(visible.devices);
    r.gpu_note = std::move(visible.note);
    r.gpu_source = "CUDA_VISIBLE_DEVICES";
  } else if (const std::string* step = lookup("SLURM_STEP_GPUS")) {
    r.gpus = splitDeviceList(*step);
    r.gpu_source = "SLURM_STEP_GPUS";
  } else if (const std::string* job = lookup("SLURM_JOB_GPUS")) {
    r.gpus = splitDeviceList(*job);
    r.gpu_source = "SLURM_JOB_GPUS";
  } else {
    const Result<CudaDriverInfo> answer = driver ? *driver : queryCudaDriver();
    if (answer.isOk()) {
      for (size_t i = 0; i < answer.value().devices.size(); ++i) {
        r.gpus.push_back(std::to_string(i));
      }
    } else if (answer.status().code() != StatusCode::kNotFound) {
      r.gpu_error = answer.status().message();  // installed but failing: say so, not "0 GPUs"
    }
    r.gpu_source = "driver";
  }

  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) {
    r.usable_cpus = std::max(1, CPU_COUNT(&set));
  } else {
    r.usable_cpus = std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
  }
  r.limits = currentProcessLimits();
  return r;
}

}  // namespace cpprun::launcher
