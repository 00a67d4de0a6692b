#include "launcher/cli.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <set>

#include "common/clip.h"
#include "common/network_address.h"
#include "launcher/launch_limits.h"
#include "launcher/numa_binding.h"
#include "rendezvous/store_auth.h"

namespace cpprun::launcher {
namespace {

using Env = std::map<std::string, std::string>;

// How an option consumes arguments.
enum class Arity {
  kFlag,     // a boolean: present or not
  kValue,    // takes exactly one value
  kHelp,     // --help / -h: stop and show the usage
  kVersion,  // --version: stop and show the version
};

// Stores `value` into the config. `source` names where it came from ("--nproc-per-node" or
// "PET_NPROC_PER_NODE (--nproc-per-node)") so that errors can name it. For a flag, `value` is
// "1" when given on the command line, else the text of its PET_ variable.
using Applier = Status (*)(LaunchConfig& config, const std::string& value,
                           const std::string& source);

// The groups of `cpprun --help`, in the order it shows them.
enum class Section { kLaunch, kRendezvous, kRestarts, kOutput, kExtras, kOperations, kUnsupported };

const char* sectionTitle(Section section) {
  switch (section) {
    case Section::kLaunch:
      return "Launch";
    case Section::kRendezvous:
      return "Rendezvous";
    case Section::kRestarts:
      return "Restarts and signals";
    case Section::kOutput:
      return "Output (every worker line reaches the console whole, prefixed \"[<role><rank>]:\")";
    case Section::kExtras:
      return "cpprun extras";
    case Section::kOperations:
      return "Operations (docs/operations.md)";
    case Section::kUnsupported:
      return "Not supported (rejected with a message)";
  }
  return "";
}

// One option: how it parses and how --help shows it. Adding an option is adding a row.
struct OptionSpec {
  const char* name;  // canonical long spelling, "--nproc-per-node"
  char short_name;   // 'r' for -r, or 0
  Arity arity;
  bool env;  // falls back to PET_<NAME> (torchrun's E / B options)
  Applier apply;
  Section section;
  const char* metavar;       // the value in the help ("N|MIN:MAX"); nullptr for a flag
  const char* default_text;  // "1:1" shows as "Default 1:1."; nullptr: no default to show
  // One sentence or more, wrapped by the help. kUnsupported: what is still accepted ("other
  // than null"), or "".
  const char* help;
};

// Every message that echoes a value shows it through clipValue (a 128 KiB variable stays a line).
Status rejectValue(const std::string& value, const std::string& source, const std::string& why) {
  return invalidArgument("invalid value '" + clipValue(value) + "' for " + source + ": " + why);
}

Status badValue(const std::string& value, const std::string& source, const std::string& expected) {
  return rejectValue(value, source, "expected " + expected);
}

Status notSupported(const std::string& value, const std::string& source, const std::string& why) {
  return invalidArgument(source + " (value '" + clipValue(value) +
                         "') is not supported by cpprun: " + why);
}

// A decimal integer with an optional sign (Python's int() without '_' or surrounding blanks).
bool parseInteger(const std::string& text, long long& out) {
  size_t digits = text.size() > 0 && (text[0] == '+' || text[0] == '-') ? 1 : 0;
  if (text.size() == digits || text.find_first_not_of("0123456789", digits) != std::string::npos) {
    return false;
  }
  errno = 0;
  out = std::strtoll(text.c_str(), nullptr, 10);
  return errno != ERANGE;
}

// An integer in [lo, hi].
bool parseIntIn(const std::string& text, long long lo, long long hi, int& out) {
  long long v = 0;
  if (!parseInteger(text, v) || v < lo || v > hi) return false;
  out = static_cast<int>(v);
  return true;
}

// A finite number >= 0 (Python's float(): "1", "0.5", "2e1").
bool parseSeconds(const std::string& text, double& out) {
  if (text.empty() || text.find_first_of(" \t\n") != std::string::npos) return false;
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || errno == ERANGE || !std::isfinite(v) || v < 0) {
    return false;
  }
  out = v;
  return true;
}

std::vector<std::string> splitOn(const std::string& text, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t pos = text.find(sep, start);
    parts.push_back(text.substr(start, pos == std::string::npos ? std::string::npos : pos - start));
    if (pos == std::string::npos) return parts;
    start = pos + 1;
  }
}

std::string strip(const std::string& text) {
  size_t b = text.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  size_t e = text.find_last_not_of(" \t");
  return text.substr(b, e - b + 1);
}

// "1" -> true; Python's int(PET_X) != 0 (blanks around the number allowed, as int() does).
Status parseEnvBool(const std::string& value, const std::string& source, bool& out) {
  long long v = 0;
  if (!parseInteger(strip(value), v)) return badValue(value, source, "an integer (0 is off)");
  out = v != 0;
  return Status::ok();
}

// --- appliers, one per option -------------------------------------------------------------

// A boolean option: set when given, else from int(PET_<NAME>) != 0.
template <bool LaunchConfig::*kField>
Status applyFlag(LaunchConfig& c, const std::string& v, const std::string& source) {
  return parseEnvBool(v, source, c.*kField);
}

// A free-text option: stored as given.
template <std::string LaunchConfig::*kField>
Status applyString(LaunchConfig& c, const std::string& v, const std::string&) {
  c.*kField = v;
  return Status::ok();
}

Status applyNnodes(LaunchConfig& c, const std::string& v, const std::string& source) {
  const char* expected = "N or MIN:MAX with 0 < MIN <= MAX";
  auto colon = v.find(':');
  long long lo = 0;
  long long hi = 0;
  if (colon == std::string::npos) {
    if (!parseInteger(v, lo)) return badValue(v, source, expected);
    hi = lo;
  } else if (!parseInteger(v.substr(0, colon), lo) || !parseInteger(v.substr(colon + 1), hi)) {
    return badValue(v, source, expected);
  }
  if (lo < 1 || lo > hi) return badValue(v, source, expected);
  if (hi > kMaxNodes) {
    return rejectValue(v, source,
                       "more than cpprun's limit of " + formatCount(kMaxNodes) +
                           " nodes (Slurm's own limit on a job's hosts); give the number of "
                           "nodes (one agent each), not of workers");
  }
  c.min_nodes = static_cast<int>(lo);
  c.max_nodes = static_cast<int>(hi);
  return Status::ok();
}

Status applyNproc(LaunchConfig& c, const std::string& v, const std::string& source) {
  if (v == "gpu") {
    c.nproc_kind = NprocKind::kGpu;
  } else if (v == "cpu") {
    c.nproc_kind = NprocKind::kCpu;
  } else if (v == "auto") {
    c.nproc_kind = NprocKind::kAuto;
  } else if (long long n = 0; parseInteger(v, n) && n >= 1) {
    if (n > kMaxWorkersPerNode) {
      return rejectValue(v, source,
                         "more than cpprun's limit of " + formatCount(kMaxWorkersPerNode) +
                             " workers on one node; ask for fewer (one per GPU or per CPU is the "
                             "usual count)");
    }
    c.nproc_kind = NprocKind::kNumber;
    c.nproc = static_cast<int>(n);
  } else {
    return badValue(v, source, "a positive number, gpu, cpu or auto");
  }
  return Status::ok();
}

Status applyRdzvBackend(LaunchConfig& c, const std::string& v, const std::string& source) {
  // etcd and etcd-v2 (torchrun's names) are one backend in cpprun: etcd v3 through its own
  // client (docs/rendezvous.md).
  if (v != "static" && v != "c10d" && v != "etcd" && v != "etcd-v2") {
    return badValue(v, source, "static, c10d, etcd or etcd-v2");
  }
  c.rdzv_backend = v;
  return Status::ok();
}

// torchrun's _parse_rendezvous_config: blanks around keys and values are dropped, an empty
// key or value is an error, a later key wins.
Status applyRdzvConf(LaunchConfig& c, const std::string& v, const std::string& source) {
  std::map<std::string, std::string> conf;
  if (!strip(v).empty()) {
    for (const std::string& item : splitOn(strip(v), ',')) {
      auto eq = item.find('=');
      std::string key = strip(item.substr(0, eq));
      std::string value = eq == std::string::npos ? "" : strip(item.substr(eq + 1));
      if (key.empty()) {
        return badValue(v, source, "KEY=VALUE,KEY=VALUE (found an empty key)");
      }
      if (value.empty()) {
        return badValue(v, source,
                        "KEY=VALUE,KEY=VALUE (key '" + clipValue(key) + "' has no value)");
      }
      conf[key] = value;
    }
  }
  c.rdzv_conf = std::move(conf);
  return Status::ok();
}

Status applyMaxRestarts(LaunchConfig& c, const std::string& v, const std::string& source) {
  if (!parseIntIn(v, 0, INT_MAX, c.max_restarts)) {
    return badValue(v, source, "a non-negative integer");
  }
  return Status::ok();
}

Status applyMonitorInterval(LaunchConfig& c, const std::string& v, const std::string& source) {
  if (!parseSeconds(v, c.monitor_interval)) {
    return badValue(v, source, "a non-negative number of seconds");
  }
  return Status::ok();
}

Status applyStartMethod(LaunchConfig& c, const std::string& v, const std::string& source) {
  if (v != "spawn" && v != "fork" && v != "forkserver") {
    return badValue(v, source, "spawn, fork or forkserver");
  }
  c.start_method = v;
  return Status::ok();
}

// torch 2.15's registered handlers (elastic/events/handlers.py): console (a logging
// StreamHandler: stderr), null and dynamic_rendezvous (NullHandlers). torchrun takes any name and
// fails with a KeyError traceback (exit 1) at the first event; cpprun names the accepted ones.
Status applyEventLogHandler(LaunchConfig& c, const std::string& v, const std::string& source) {
  if (v != "null" && v != "console" && v != "dynamic_rendezvous") {
    return badValue(v, source,
                    "console, null or dynamic_rendezvous (torch 2.15's registered event handlers; "
                    "cpprun runs no Python plug-ins)");
  }
  c.event_log_handler = v;
  return Status::ok();
}

// torchrun's Std.from_str: "N" for every local rank, or "LOCAL_RANK:N,..." (unlisted ranks 0).
Status parseStd(const std::string& v, const std::string& source, int& default_out,
                std::map<int, int>& by_rank_out) {
  const char* expected =
      "0-3 (0 none, 1 stdout, 2 stderr, 3 both) or LOCAL_RANK:0-3 pairs like 0:1,1:2";
  int single = 0;
  if (v.find(':') == std::string::npos) {
    if (v.size() != 1 || !parseIntIn(v, 0, 3, single)) return badValue(v, source, expected);
    default_out = single;
    by_rank_out.clear();
    return Status::ok();
  }
  std::map<int, int> by_rank;
  for (const std::string& item : splitOn(v, ',')) {
    auto colon = item.find(':');
    int rank = 0;
    int mode = 0;
    if (colon == std::string::npos || colon == 0 || item.find_first_not_of("0123456789") != colon ||
        !parseIntIn(item.substr(0, colon), 0, INT_MAX, rank) || item.size() != colon + 2 ||
        !parseIntIn(item.substr(colon + 1), 0, 3, mode)) {
      return badValue(v, source, expected);
    }
    by_rank[rank] = mode;
  }
  default_out = 0;
  by_rank_out = std::move(by_rank);
  return Status::ok();
}

Status applyRedirects(LaunchConfig& c, const std::string& v, const std::string& source) {
  return parseStd(v, source, c.redirects_default, c.redirects_by_rank);
}

Status applyTee(LaunchConfig& c, const std::string& v, const std::string& source) {
  return parseStd(v, source, c.tee_default, c.tee_by_rank);
}

Status applyLocalRanksFilter(LaunchConfig& c, const std::string& v, const std::string& source) {
  std::set<int> ranks;
  if (!v.empty()) {
    for (const std::string& item : splitOn(v, ',')) {
      int rank = 0;
      if (!parseIntIn(strip(item), 0, INT_MAX, rank)) {
        return badValue(v, source, "a comma-separated list of local ranks (integers >= 0)");
      }
      ranks.insert(rank);
    }
  }
  c.local_ranks_filter.assign(ranks.begin(), ranks.end());
  return Status::ok();
}

// torchrun's comma_separated_list: split on ',', ",," is a literal comma. An empty item (the
// empty value, a trailing comma) is a filter too, and it matches every line, as in torchrun.
std::vector<std::string> splitFilters(const std::string& v) {
  std::vector<std::string> filters;
  std::string current;
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] != ',') {
      current.push_back(v[i]);
    } else if (i + 1 < v.size() && v[i + 1] == ',') {
      current.push_back(',');
      ++i;
    } else {
      filters.push_back(std::move(current));
      current.clear();
    }
  }
  filters.push_back(std::move(current));
  return filters;
}

template <std::vector<std::string> LaunchConfig::*kField>
Status applyDuplicateFilters(LaunchConfig& c, const std::string& v, const std::string&) {
  c.*kField = splitFilters(v);
  return Status::ok();
}

Status applyNodeRank(LaunchConfig& c, const std::string& v, const std::string& source) {
  if (!parseIntIn(v, 0, INT_MAX, c.node_rank)) {
    return badValue(v, source, "a non-negative integer");
  }
  return Status::ok();
}

Status applyMasterPort(LaunchConfig& c, const std::string& v, const std::string& source) {
  if (!parseIntIn(v, 0, 65535, c.master_port)) {
    return badValue(v, source, "a port number from 0 to 65535");
  }
  c.master_port_given = true;
  return Status::ok();
}

Status applyLogsSpecs(LaunchConfig&, const std::string& v, const std::string& source) {
  return notSupported(v, source,
                      "it names a Python entry point (torchrun.logs_specs) replacing the log "
                      "layout; cpprun has one built-in layout (--log-dir, -r, -t)");
}

Status applyPrintCompletion(LaunchConfig&, const std::string& v, const std::string& source) {
  return notSupported(v, source,
                      "cpprun's bash completion is installed with it "
                      "(share/bash-completion/completions/cpprun) and reads the options from "
                      "cpprun --help");
}

Status applyNumaBindingMode(LaunchConfig& c, const std::string& v, const std::string& source) {
  if (!parseNumaBindingMode(v)) {
    return badValue(v, source, std::string("one of ") + numaBindingModeChoices());
  }
  c.numa_binding = v;
  return Status::ok();
}

struct SignalName {
  const char* name;  // without "SIG"
  int number;
};

const SignalName kSignals[] = {
    {"HUP", SIGHUP},   {"INT", SIGINT},       {"QUIT", SIGQUIT}, {"ILL", SIGILL},
    {"TRAP", SIGTRAP}, {"ABRT", SIGABRT},     {"IOT", SIGABRT},  {"BUS", SIGBUS},
    {"FPE", SIGFPE},   {"KILL", SIGKILL},     {"USR1", SIGUSR1}, {"SEGV", SIGSEGV},
    {"USR2", SIGUSR2}, {"PIPE", SIGPIPE},     {"ALRM", SIGALRM}, {"TERM", SIGTERM},
    {"CHLD", SIGCHLD}, {"CONT", SIGCONT},     {"STOP", SIGSTOP}, {"TSTP", SIGTSTP},
    {"TTIN", SIGTTIN}, {"TTOU", SIGTTOU},     {"URG", SIGURG},   {"XCPU", SIGXCPU},
    {"XFSZ", SIGXFSZ}, {"VTALRM", SIGVTALRM}, {"PROF", SIGPROF}, {"WINCH", SIGWINCH},
    {"IO", SIGIO},     {"SYS", SIGSYS},
#ifdef SIGPWR
    {"PWR", SIGPWR},
#endif
};

Status applySignals(LaunchConfig& c, const std::string& v, const std::string& source) {
  const char* expected = "a comma-separated list of signal names like SIGTERM,SIGUSR1";
  std::vector<int> numbers;
  for (const std::string& item : splitOn(v, ',')) {
    std::string name = strip(item);
    for (char& ch : name) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    if (name.compare(0, 3, "SIG") == 0) name.erase(0, 3);
    auto it = std::find_if(std::begin(kSignals), std::end(kSignals),
                           [&](const SignalName& s) { return name == s.name; });
    if (name.empty() || it == std::end(kSignals)) {
      return badValue(v, source,
                      std::string(expected) + " ('" + clipValue(strip(item)) + "' is not one)");
    }
    if (it->number == SIGKILL || it->number == SIGSTOP) {
      return badValue(v, source, std::string(expected) + " (SIG" + it->name + " cannot be caught)");
    }
    if (std::find(numbers.begin(), numbers.end(), it->number) == numbers.end()) {
      numbers.push_back(it->number);
    }
  }
  c.signals_to_handle = std::move(numbers);
  return Status::ok();
}

Status applyShutdownTimeout(LaunchConfig& c, const std::string& v, const std::string& source) {
  if (!parseSeconds(v, c.shutdown_timeout)) {
    return badValue(v, source, "a non-negative number of seconds");
  }
  return Status::ok();
}

Status applyUninterruptibleStateTimeout(LaunchConfig& c, const std::string& v,
                                        const std::string& source) {
  if (!parseSeconds(v, c.uninterruptible_state_timeout)) {
    return badValue(v, source, "a non-negative number of seconds (0: off)");
  }
  return Status::ok();
}

Status applyReapTimeout(LaunchConfig& c, const std::string& v, const std::string& source) {
  if (!parseSeconds(v, c.reap_timeout) || c.reap_timeout <= 0) {
    return badValue(v, source, "a positive number of seconds");
  }
  return Status::ok();
}

Status applyStallTimeout(LaunchConfig& c, const std::string& v, const std::string& source) {
  if (!parseSeconds(v, c.stall_timeout) || c.stall_timeout <= 0) {
    return badValue(v, source, "a positive number of seconds");
  }
  return Status::ok();
}

Status applyStallFirstTimeout(LaunchConfig& c, const std::string& v, const std::string& source) {
  if (!parseSeconds(v, c.stall_first_timeout) || c.stall_first_timeout <= 0) {
    return badValue(v, source, "a positive number of seconds");
  }
  return Status::ok();
}

Status applyStallStacksTimeout(LaunchConfig& c, const std::string& v, const std::string& source) {
  if (v == "off") {
    c.stall_stacks_timeout = 0;
    return Status::ok();
  }
  if (!parseSeconds(v, c.stall_stacks_timeout) || c.stall_stacks_timeout <= 0) {
    return badValue(v, source, "a positive number of seconds, or off");
  }
  return Status::ok();
}

Status applyPythonProgress(LaunchConfig& c, const std::string& v, const std::string& source) {
  if (v != "on" && v != "off") return badValue(v, source, "on or off");
  c.python_progress = v == "on";
  return Status::ok();
}

Status applyWorkerTty(LaunchConfig& c, const std::string& v, const std::string& source) {
  if (v != "auto" && v != "off") return badValue(v, source, "auto or off");
  c.worker_tty = v == "auto";
  return Status::ok();
}

Status applyStdin(LaunchConfig& c, const std::string& v, const std::string& source) {
  if (v != "none" && v != "rank0" && v != "all") return badValue(v, source, "none, rank0 or all");
  c.stdin_mode = v;
  return Status::ok();
}

// [HOST:]PORT, IPv6 as [ADDR]:PORT.
Status applyMetricsPort(LaunchConfig& c, const std::string& v, const std::string& source) {
  const char* expected = "PORT or HOST:PORT (IPv6 as [ADDR]:PORT), port 0-65535";
  NetworkAddress address{"127.0.0.1", 0};
  if (v.find_first_of("[:") == std::string::npos) {
    auto port = parsePort(v);
    if (!port.isOk()) {
      return badValue(v, source, std::string(expected) + "; " + port.status().message());
    }
    address.port = port.value();
  } else {
    auto parsed = parseNetworkAddress(v);
    if (!parsed.isOk()) {
      return badValue(v, source, std::string(expected) + "; " + parsed.status().message());
    }
    address = parsed.value();
  }
  c.metrics_host = address.host;
  c.metrics_port = address.port;
  return Status::ok();
}

Status applyMetricsTokenFile(LaunchConfig& c, const std::string& v, const std::string& source) {
  if (v.empty()) return badValue(v, source, "a file path");
  c.metrics_token_file = v;
  return Status::ok();
}

Status applyEventLog(LaunchConfig& c, const std::string& v, const std::string& source) {
  if (v.empty()) return badValue(v, source, "a file path");
  c.event_log = v;
  return Status::ok();
}

// Health checks and exclusion (issue 23: launcher/node_health.h, agent/health/health_gate.h,
// agent/coordination/node_exclusion.h).
Status applyHealthCheck(LaunchConfig& c, const std::string& v, const std::string& source) {
  if (v.empty()) return badValue(v, source, "a shell command");
  c.health_check = v;
  return Status::ok();
}

Status applyHealthCheckTimeout(LaunchConfig& c, const std::string& v, const std::string& source) {
  if (!parseSeconds(v, c.health_check_timeout) || c.health_check_timeout <= 0) {
    return badValue(v, source, "a positive number of seconds");
  }
  return Status::ok();
}

Status applyHealthCheckDirs(LaunchConfig& c, const std::string& v, const std::string& source) {
  std::vector<std::string> dirs;
  size_t start = 0;
  while (start <= v.size()) {
    const size_t comma = v.find(',', start);
    const std::string dir =
        strip(v.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (dir.empty()) return badValue(v, source, "DIR[,DIR...] (found an empty directory)");
    dirs.push_back(dir);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  c.health_check_dirs = std::move(dirs);
  return Status::ok();
}

Status applyBuiltinHealthChecks(LaunchConfig& c, const std::string& v, const std::string& source) {
  if (v == "on") {
    c.builtin_health_checks = true;
  } else if (v == "off") {
    c.builtin_health_checks = false;
  } else {
    return badValue(v, source, "on or off");
  }
  return Status::ok();
}

Status applyExcludeAfter(LaunchConfig& c, const std::string& v, const std::string& source) {
  if (!parseIntIn(v, 0, INT_MAX, c.exclude_after)) {
    return badValue(v, source, "a non-negative integer (0: never exclude)");
  }
  return Status::ok();
}

Status applyExcludeWindow(LaunchConfig& c, const std::string& v, const std::string& source) {
  if (!parseSeconds(v, c.exclude_window) || c.exclude_window < 1) {
    return badValue(v, source, "a number of seconds, at least 1");
  }
  return Status::ok();
}

// Every option cpprun knows, in torchrun's order, then cpprun's own. The order is the order of
// "could match" in an ambiguous prefix's error; --help groups the rows by section, in this order.
const OptionSpec kOptions[] = {
    {"--nnodes", 0, Arity::kValue, true, applyNnodes, Section::kLaunch, "N|MIN:MAX", "1:1",
     "Number of nodes (agents), 0 < MIN <= MAX <= 65536: MIN to MAX for c10d (elastic); the "
     "static backend waits for MAX, as torchrun's. Under srun, mpirun and other launchers: from "
     "their environment."},
    {"--nproc-per-node", 0, Arity::kValue, true, applyNproc, Section::kLaunch, "N|gpu|cpu|auto",
     "1",
     "Workers on this node: a positive number, one per GPU, one per usable CPU, or GPUs if any "
     "else CPUs. At most 4096, and as many as the open-file and process limits allow "
     "(docs/operations.md, Size limits)."},
    {"--rdzv-backend", 0, Arity::kValue, true, applyRdzvBackend, Section::kRendezvous,
     "static|c10d|etcd|etcd-v2", "static",
     "static: fixed node ranks, node 0 serves the store; c10d: nodes join in rounds at "
     "--rdzv-endpoint, re-forming when a node is lost or joins; etcd, etcd-v2 (one backend): "
     "rounds in etcd v3 at --rdzv-endpoint, no node is special."},
    {"--rdzv-endpoint", 0, Arity::kValue, true, applyString<&LaunchConfig::rdzv_endpoint>,
     Section::kRendezvous, "HOST[:PORT]", "none",
     "Where the store is (IPv6 as [ADDR]:PORT; port default 29400 for c10d, else "
     "--master-port); etcd: HOST[:PORT][,HOST[:PORT]...], port default 2379."},
    {"--rdzv-id", 0, Arity::kValue, true, applyString<&LaunchConfig::rdzv_id>, Section::kRendezvous,
     "ID", "none; one node, static, no --master-port: a random UUID4, as torchrun 2.15 does",
     "Job id shared by every node (TORCHELASTIC_RUN_ID)."},
    {"--rdzv-conf", 0, Arity::kValue, true, applyRdzvConf, Section::kRendezvous, "K=V,K=V", "none",
     "Rendezvous settings, seconds: join_timeout (600), last_call_timeout (30), "
     "keep_alive_interval (5), keep_alive_max_attempt (3), close_timeout (10); is_host=BOOL; "
     "store_legacy_numbering=1.13|2.1 (how the store reads clients without the torch >= 2.2 "
     "handshake); etcd: protocol=http|https, cacert, cert, key (PEM files)."},
    {"--standalone", 0, Arity::kFlag, true, applyFlag<&LaunchConfig::standalone>,
     Section::kRendezvous, nullptr, nullptr,
     "Single node: c10d on localhost:0 with a random job id; overrides the options above."},
    {"--max-restarts", 0, Arity::kValue, true, applyMaxRestarts, Section::kRestarts, "N", "0",
     "Restarts of the worker group after a failure, >= 0; one budget for the whole job, across "
     "nodes."},
    {"--warm-restart", 0, Arity::kFlag, false, applyFlag<&LaunchConfig::warm_restart>,
     Section::kRestarts, nullptr, nullptr,
     "Python workers of attempt 1 and later are forked from a warm process that imported what "
     "attempt 0's workers imported (installed packages only), instead of importing it all again; "
     "a hot spare pre-warms the same way. Falls back to a cold start, saying why once "
     "(docs/supervision.md)."},
    {"--monitor-interval", 0, Arity::kValue, true, applyMonitorInterval, Section::kRestarts,
     "SECONDS", "0.1", "Accepted for compatibility; cpprun reacts to events at once."},
    {"--start-method", 0, Arity::kValue, true, applyStartMethod, Section::kLaunch,
     "spawn|fork|forkserver", "spawn",
     "Accepted for compatibility; workers are always new processes."},
    {"--event-log-handler", 0, Arity::kValue, true, applyEventLogHandler, Section::kOperations,
     "null|console", "null",
     "console: print the agent's events (those --event-log records, with or without it) on "
     "stderr, one JSON object per line, as torchrun's console handler prints its own; null (and "
     "dynamic_rendezvous): none."},
    {"--role", 0, Arity::kValue, true, applyString<&LaunchConfig::role>, Section::kLaunch, "NAME",
     "default", "Role of the workers (ROLE_NAME, log prefix)."},
    {"--module", 'm', Arity::kFlag, true, applyFlag<&LaunchConfig::module>, Section::kLaunch,
     nullptr, nullptr, "Run ENTRYPOINT as a Python module (python3 -u -m)."},
    {"--no-python", 0, Arity::kFlag, true, applyFlag<&LaunchConfig::no_python>, Section::kLaunch,
     nullptr, nullptr, "Execute ENTRYPOINT directly, without python3. Not with -m."},
    {"--run-path", 0, Arity::kFlag, true, applyFlag<&LaunchConfig::run_path>, Section::kLaunch,
     nullptr, nullptr, "Accepted for torchrun compatibility; runs like the default."},
    {"--log-dir", 0, Arity::kValue, true, applyString<&LaunchConfig::log_dir>, Section::kOutput,
     "DIR", "none (console only)",
     "Write <DIR>/<run id>/attempt_<n>/<local rank>/{stdout,stderr}.log."},
    {"--redirects", 'r', Arity::kValue, true, applyRedirects, Section::kOutput, "MODE", "0",
     "Send worker output to the log files instead of the console: 0 none, 1 stdout, 2 stderr, "
     "3 both, or per local rank 0:1,1:2."},
    {"--tee", 't', Arity::kValue, true, applyTee, Section::kOutput, "MODE", "0",
     "Like -r, but to the log files and the console."},
    {"--log-line-prefix-template", 0, Arity::kValue, true,
     applyString<&LaunchConfig::log_line_prefix_template>, Section::kOutput, "TEMPLATE",
     "$TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, else \"[${role_name}${rank}]:\"",
     "The console line prefix, with ${role_name}, ${rank}, ${local_rank} and ${hostname} "
     "substituted."},
    // cpprun's own console options (no PET_ fallback; docs/supervision.md, "Console").
    {"--worker-tty", 0, Arity::kValue, false, applyWorkerTty, Section::kOutput, "auto|off", "auto",
     "auto: when cpprun's stdout (stderr) is a terminal, each worker's is a terminal of its own "
     "(isatty() true: pdb, input(), colours, progress bars), read by cpprun and prefixed as "
     "usual; off: pipes."},
    {"--stdin", 0, Arity::kValue, false, applyStdin, Section::kOutput, "none|rank0|all", "rank0",
     "Which workers read cpprun's stdin: global rank 0 (its node's agent forwards it), every "
     "worker, or none; the others read /dev/null. A new attempt's worker reads it again."},
    {"--raw-output", 0, Arity::kFlag, false, applyFlag<&LaunchConfig::raw_output>, Section::kOutput,
     nullptr, nullptr,
     "Worker lines reach the console without a prefix (as an empty "
     "--log-line-prefix-template= does)."},
    {"--local-ranks-filter", 0, Arity::kValue, true, applyLocalRanksFilter, Section::kOutput,
     "LIST", "all",
     "Only these local ranks (e.g. 0,1) reach the console; log files keep everything."},
    {"--duplicate-stdout-filters", 0, Arity::kValue, true,
     applyDuplicateFilters<&LaunchConfig::duplicate_stdout_filters>, Section::kOutput, "LIST",
     "none",
     "Copy the tee'd (-t) stdout lines, prefixed, of every local rank that reaches the console "
     "and contain any of these strings (',,' is a comma; an empty one matches every line) into "
     "<log dir>/<run id>/attempt_<n>/filtered_stdout.log."},
    {"--duplicate-stderr-filters", 0, Arity::kValue, true,
     applyDuplicateFilters<&LaunchConfig::duplicate_stderr_filters>, Section::kOutput, "LIST",
     "none", "The same for stderr, into filtered_stderr.log."},
    {"--node-rank", 0, Arity::kValue, true, applyNodeRank, Section::kRendezvous, "N", "0",
     "This node's rank, static backend only."},
    {"--master-addr", 0, Arity::kValue, true, applyString<&LaunchConfig::master_addr>,
     Section::kRendezvous, "HOST", "127.0.0.1", "Address of node rank 0, static backend only."},
    {"--master-port", 0, Arity::kValue, true, applyMasterPort, Section::kRendezvous, "PORT",
     "on one node: a free port picked at start (two jobs on one host never collide); else 29500",
     "Port of the store on node rank 0, 0-65535, static backend only."},
    {"--local-addr", 0, Arity::kValue, true, applyString<&LaunchConfig::local_addr>,
     Section::kRendezvous, "HOST", "the host name", "This node's name in reports and logs."},
    // Rejected options do not read PET_*: an inherited variable must not break a launch.
    {"--logs-specs", 0, Arity::kValue, false, applyLogsSpecs, Section::kUnsupported, nullptr,
     nullptr, ""},
    {"--print-completion", 0, Arity::kValue, false, applyPrintCompletion, Section::kUnsupported,
     nullptr, nullptr, ""},
    // torchrun 2.15 reads no PET_NUMA_BINDING; cpprun does, as for its other options.
    {"--numa-binding", 0, Arity::kValue, true, applyNumaBindingMode, Section::kLaunch,
     "node|socket|exclusive|core-complex", "off",
     "Bind each worker's CPUs (and prefer its memory) near the GPU whose index is its local "
     "rank: that GPU's NUMA node, its socket, an exclusive share of the node's cores, or one "
     "core complex (L3). A worker that cannot be bound starts unbound after a warning (see "
     "--strict-numa-binding)."},
    {"--signals-to-handle", 0, Arity::kValue, true, applySignals, Section::kRestarts, "LIST",
     "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
     "Signals forwarded to the workers before teardown, e.g. SIGTERM,SIGUSR1 (SIG prefix "
     "optional)."},
    {"--shutdown-timeout", 0, Arity::kValue, true, applyShutdownTimeout, Section::kRestarts,
     "SECONDS", "$TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 30",
     "Grace between SIGTERM to the workers and SIGKILL, >= 0."},
    // torch 2.15 has no flag, only TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT (read as it does).
    {"--uninterruptible-state-timeout", 0, Arity::kValue, false, applyUninterruptibleStateTimeout,
     Section::kRestarts, "SECONDS", "$TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT, else off",
     "A worker in uninterruptible sleep (state D in /proc, e.g. wedged in a driver) this long "
     "fails the attempt without a restart, as torchrun marks the group UNHEALTHY. 0: off."},
    {"--reap-timeout", 0, Arity::kValue, false, applyReapTimeout, Section::kRestarts, "SECONDS",
     "5",
     "After SIGKILL, how long teardown waits for a worker (and what is left of its process "
     "group) to die. One still alive then (stuck in the kernel) is named with its state and "
     "wait channel in the report and the event log, and cpprun exits 7 instead of waiting "
     "forever. > 0."},
    {"--virtual-local-rank", 0, Arity::kFlag, true, applyFlag<&LaunchConfig::virtual_local_rank>,
     Section::kLaunch, nullptr, nullptr,
     "Each worker sees only its own GPU and gets LOCAL_RANK=0."},
    // cpprun's own.
    {"--dry-run", 0, Arity::kFlag, false, applyFlag<&LaunchConfig::dry_run>, Section::kExtras,
     nullptr, nullptr,
     "Print the resolved plan (nodes, ranks, devices, each worker's environment, store address) "
     "and exit 0 without running anything."},
    {"--check", 0, Arity::kFlag, false, applyFlag<&LaunchConfig::check>, Section::kExtras, nullptr,
     nullptr,
     "Preflight: check what would break this job on this node (the program, GPUs and driver, "
     "NCCL, the interfaces NCCL and gloo pick, the rendezvous endpoint, open files, CPUs and "
     "NUMA), print a report and exit 0, or 1 when something would fail. Takes the options of "
     "the run; the entry point is optional."},
    {"--worker-hosts-store", 0, Arity::kFlag, false, applyFlag<&LaunchConfig::worker_hosts_store>,
     Section::kExtras, nullptr, nullptr,
     "Worker rank 0 hosts its own store instead of the agent (for trainers that create their "
     "TCPStore themselves)."},
    {"--stall-timeout", 0, Arity::kValue, false, applyStallTimeout, Section::kOperations, "SECONDS",
     "off",
     "A rank whose progress file ($CPPRUN_PROGRESS_FILE: bumped by the trainer each step, or "
     "stamped for Python workers by --python-progress) has not changed for this long since its "
     "last report is stalled: its stacks (Python faulthandler, gdb; see "
     "--stall-stacks-timeout) go to its log directory and the report, then the attempt fails "
     "(restart or end)."},
    {"--stall-first-timeout", 0, Arity::kValue, false, applyStallFirstTimeout, Section::kOperations,
     "SECONDS", "600, at least --stall-timeout",
     "With --stall-timeout: the bound from a worker's start to its first progress report "
     "(imports, CUDA and NCCL set-up, the rendezvous, loading data), so a slow start is never "
     "taken for a stall."},
    {"--stall-stacks-timeout", 0, Arity::kValue, false, applyStallStacksTimeout,
     Section::kOperations, "SECONDS|off", "1",
     "With --stall-timeout: the bound on collecting a stalled rank's stacks (faulthandler, "
     "then gdb, killed at the bound) before the attempt fails; off skips them."},
    {"--python-progress", 0, Arity::kValue, false, applyPythonProgress, Section::kOperations,
     "on|off", "on",
     "With --stall-timeout: Python workers stamp progress by themselves, no trainer change "
     "needed (a sitecustomize first on PYTHONPATH; the main thread stamps while it runs Python "
     "once torch.distributed is initialised, so a rank blocked in a collective stops). "
     "docs/supervision.md says what it sees and what it cannot."},
    {"--metrics-port", 0, Arity::kValue, false, applyMetricsPort, Section::kOperations,
     "[HOST:]PORT", "off",
     "Serve /healthz, /metrics (Prometheus) and /status (JSON) over HTTP on HOST (default "
     "127.0.0.1; 0.0.0.0 for every interface), and POST /leave, which drains this node from "
     "an elastic job (as SIGPWR does; keep the endpoint on a trusted address). Port 0 picks a "
     "free one (logged). A request whose Host is not the endpoint's address or this node's name "
     "gets 403, as does a POST that carries an Origin header (a web browser's)."},
    {"--metrics-token-file", 0, Arity::kValue, false, applyMetricsTokenFile, Section::kOperations,
     "FILE", "none",
     "With --metrics-port: POST /leave must carry `Authorization: Bearer <token>`, the token "
     "being FILE's content (at least 16 bytes, surrounding whitespace trimmed; read once at "
     "start). FILE must be a regular file of this user's that group and others cannot read "
     "(chmod 600)."},
    {"--event-log", 0, Arity::kValue, false, applyEventLog, Section::kOperations, "FILE", "none",
     "Append one JSON line per event (rendezvous, worker start and exit, restart, signal, "
     "stall, failure, root cause)."},
    {"--strict-numa-binding", 0, Arity::kFlag, false, applyFlag<&LaunchConfig::strict_numa_binding>,
     Section::kExtras, nullptr, nullptr,
     "With --numa-binding: a worker that cannot be bound (no topology, no GPU for its local "
     "rank) stops the job from starting (exit 3), as torchrun does, instead of starting "
     "unbound."},
    {"--health-check", 0, Arity::kValue, false, applyHealthCheck, Section::kRestarts, "CMD", "none",
     "Run `/bin/sh -c CMD` before every attempt (multi-node: every join of a round, the first "
     "and each re-join); a non-zero exit, a death or --health-check-timeout fails the node. One "
     "node: the job ends (exit 5) before the attempt's workers start. Multi-node, it does not "
     "join: elastic, it leaves (exit 5) and the others go on; static, or the c10d store host, "
     "the job fails naming it. $CPPRUN_HEALTH_CHECK_ATTEMPT is the attempt."},
    {"--health-check-timeout", 0, Arity::kValue, false, applyHealthCheckTimeout, Section::kRestarts,
     "SECONDS", "60", "Bound on the health check (the command and the built-in checks together)."},
    {"--health-check-dirs", 0, Arity::kValue, false, applyHealthCheckDirs, Section::kRestarts,
     "DIR[,DIR...]", "none",
     "Directories the built-in check finds writable before every join (checkpoints, data), "
     "beside --log-dir."},
    {"--builtin-health-checks", 0, Arity::kValue, false, applyBuiltinHealthChecks,
     Section::kRestarts, "on|off", "on",
     "Multi-node: before every join check the GPUs and driver (when the job uses GPUs), that "
     "the interface NCCL/gloo would use is up, and that --log-dir and --health-check-dirs are "
     "writable."},
    {"--exclude-after", 0, Arity::kValue, false, applyExcludeAfter, Section::kRestarts, "K", "3",
     "Elastic: a node whose workers were the root cause of K failures within --exclude-window "
     "leaves the job (exit 6) and the others re-form without it while MIN are left; that "
     "failure does not use the restart budget. 0: never."},
    {"--exclude-window", 0, Arity::kValue, false, applyExcludeWindow, Section::kRestarts, "SECONDS",
     "3600", "The window of --exclude-after."},
    {"--help", 'h', Arity::kHelp, false, nullptr, Section::kOperations, nullptr, nullptr,
     "Show this text and exit."},
    {"--version", 0, Arity::kVersion, false, nullptr, Section::kOperations, nullptr, nullptr,
     "Show the version and exit."},
};

const OptionSpec* findLong(const std::string& name) {
  for (const OptionSpec& spec : kOptions) {
    if (name == spec.name) return &spec;
  }
  return nullptr;
}

const OptionSpec* findShort(char c) {
  for (const OptionSpec& spec : kOptions) {
    if (spec.short_name != 0 && spec.short_name == c) return &spec;
  }
  return nullptr;
}

const std::vector<std::string>& longNames() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const OptionSpec& spec : kOptions) v.emplace_back(spec.name);
    return v;
  }();
  return names;
}

// The long names of torchrun's options: the table's rows before cpprun's own (--dry-run on),
// plus --help and --version.
const std::vector<std::string>& torchrunLongNames() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const OptionSpec& spec : kOptions) {
      if (std::string(spec.name) == "--dry-run") break;
      v.emplace_back(spec.name);
    }
    v.emplace_back("--help");
    v.emplace_back("--version");
    return v;
  }();
  return names;
}

// PET_NPROC_PER_NODE for --nproc-per-node.
std::string envName(const OptionSpec& spec) {
  std::string name = "PET_";
  for (const char* p = spec.name + 2; *p != '\0'; ++p) {
    name += *p == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(*p)));
  }
  return name;
}

// argparse treats "-1" and "-.5" as values, not options, when no option looks like a number.
bool looksLikeNegativeNumber(const std::string& arg) {
  double ignored = 0;
  return arg.size() > 1 && arg[0] == '-' && parseSeconds(arg.substr(1), ignored);
}

bool looksLikeOption(const std::string& arg) {
  return arg.size() > 1 && arg[0] == '-' && !looksLikeNegativeNumber(arg);
}

std::string displayName(const OptionSpec& spec) {
  if (spec.short_name == 0) return spec.name;
  return std::string("-") + spec.short_name + "/" + spec.name;
}

}  // namespace

namespace internal {

Result<std::string> resolveLongOption(const std::string& typed,
                                      const std::vector<std::string>& names) {
  if (std::find(names.begin(), names.end(), typed) != names.end()) return typed;
  std::vector<std::string> candidates;
  if (typed.size() > 2) {
    for (const std::string& name : names) {
      if (name.compare(0, typed.size(), typed) == 0) candidates.push_back(name);
    }
  }
  if (candidates.empty()) {
    return invalidArgument("unrecognized option '" + clipValue(typed) + "' (see cpprun --help)");
  }
  if (candidates.size() > 1) {
    std::string list;
    for (const std::string& c : candidates) list += (list.empty() ? "" : ", ") + c;
    return invalidArgument("ambiguous option '" + clipValue(typed) + "' could match " + list);
  }
  return candidates.front();
}

std::string randomUuid4() {
  std::random_device rd;
  unsigned char bytes[16];
  for (size_t i = 0; i < sizeof bytes; i += 4) {
    uint32_t word = rd();
    for (size_t j = 0; j < 4; ++j) bytes[i + j] = static_cast<unsigned char>(word >> (8 * j));
  }
  bytes[6] = static_cast<unsigned char>((bytes[6] & 0x0f) | 0x40);  // version 4
  bytes[8] = static_cast<unsigned char>((bytes[8] & 0x3f) | 0x80);  // RFC 4122 variant
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < sizeof bytes; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    out += kHex[bytes[i] >> 4];
    out += kHex[bytes[i] & 0x0f];
  }
  return out;
}

}  // namespace internal

namespace {

// One option as typed: which one it is and the value written into it ("--x=v", "-r3").
struct TypedOption {
  const OptionSpec* spec = nullptr;
  bool has_inline = false;
  std::string inline_value;
};

// The option `arg` (which looksLikeOption) names: a long one by its full name or an unambiguous
// abbreviation, or a short one.
Result<TypedOption> identifyOption(const std::string& arg) {
  TypedOption typed;
  if (arg.compare(0, 2, "--") == 0) {
    auto eq = arg.find('=');
    std::string name = arg.substr(0, eq);
    std::replace(name.begin() + 2, name.end(), '_', '-');
    if (eq != std::string::npos) {
      typed.has_inline = true;
      typed.inline_value = arg.substr(eq + 1);
    }
    auto resolved = internal::resolveLongOption(name, longNames());
    if (!resolved.isOk()) {
      // cpprun's own options never make an abbreviation of one of torchrun's ambiguous: a
      // torchrun command line ("--he" for --help) means under cpprun what it means there.
      auto torchrun = internal::resolveLongOption(name, torchrunLongNames());
      if (!torchrun.isOk()) return resolved.status();
      resolved = std::move(torchrun);
    }
    typed.spec = findLong(resolved.value());
    return typed;
  }
  typed.spec = findShort(arg[1]);
  if (typed.spec == nullptr) {
    return invalidArgument("unrecognized option '" + clipValue(arg) + "' (see cpprun --help)");
  }
  if (arg.size() > 2) {  // "-r3" or "-r=3"
    typed.has_inline = true;
    typed.inline_value = arg.substr(arg[2] == '=' ? 3 : 2);
  }
  return typed;
}

// Applies the option `arg` typed; a value not written into it is args[i] (then consumed).
// True: --help or --version, which end the parse.
Result<bool> applyTypedOption(const TypedOption& typed, const std::string& arg,
                              const std::vector<std::string>& args, size_t& i, CliResult& result) {
  const OptionSpec& spec = *typed.spec;
  const std::string source = displayName(spec);
  if (spec.arity != Arity::kValue && typed.has_inline) {
    return invalidArgument("option " + source + " takes no value (got '" + clipValue(arg) + "')");
  }
  switch (spec.arity) {
    case Arity::kHelp:
    case Arity::kVersion:
      (spec.arity == Arity::kHelp ? result.show_help : result.show_version) = true;
      return true;
    case Arity::kFlag: {
      Status s = spec.apply(result.config, "1", source);
      if (!s.isOk()) return s;
      break;
    }
    case Arity::kValue: {
      std::string value = typed.inline_value;
      if (!typed.has_inline) {
        if (i >= args.size() || looksLikeOption(args[i])) {
          return invalidArgument("option " + source + " needs a value");
        }
        value = args[i++];
      }
      Status s = spec.apply(result.config, value, source);
      if (!s.isOk()) return s;
      result.config.sources[spec.name] = source;
      break;
    }
  }
  return false;
}

// What the command line says: its options (into `given`) up to the entry point, which it
// records with its arguments. True: --help or --version ended the parse.
Result<bool> applyCommandLine(const std::vector<std::string>& args, CliResult& result,
                              std::set<const OptionSpec*>& given, bool& have_entrypoint) {
  LaunchConfig& config = result.config;
  size_t i = 0;
  while (i < args.size()) {
    const std::string& arg = args[i++];
    if (arg == "--") {  // ends the options: the next argument is the entry point
      if (i < args.size()) {
        config.entrypoint = args[i++];
        have_entrypoint = true;
      }
      break;
    }
    if (!looksLikeOption(arg)) {
      config.entrypoint = arg;
      have_entrypoint = true;
      break;
    }
    auto typed = identifyOption(arg);
    if (!typed.isOk()) return typed.status();
    auto stop = applyTypedOption(typed.value(), arg, args, i, result);
    if (!stop.isOk() || stop.value()) return stop;
    given.insert(typed.value().spec);
  }
  // REMAINDER: everything after the entry point belongs to it.
  config.entrypoint_args.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  return false;
}

// PET_<NAME> for every E/B option the command line left out.
Status applyPetVariables(const Env& env, LaunchConfig& config, std::set<const OptionSpec*>& given) {
  for (const OptionSpec& spec : kOptions) {
    if (!spec.env || given.count(&spec) != 0) continue;
    std::string var = envName(spec);
    auto it = env.find(var);
    if (it == env.end()) continue;
    const std::string source = var + " (" + spec.name + ")";
    Status s = spec.apply(config, it->second, source);
    if (!s.isOk()) return s;
    config.sources[spec.name] = source;
    given.insert(&spec);
  }
  return Status::ok();
}

// The defaults torch's own variables set for options neither the command line nor PET_ gave.
Status applyTorchDefaults(const Env& env, const std::set<const OptionSpec*>& given,
                          LaunchConfig& config) {
  if (given.count(findLong("--shutdown-timeout")) == 0) {
    auto it = env.find("TORCH_ELASTIC_SHUTDOWN_TIMEOUT");
    if (it != env.end()) {
      Status s = applyShutdownTimeout(config, it->second,
                                      "TORCH_ELASTIC_SHUTDOWN_TIMEOUT (--shutdown-timeout)");
      if (!s.isOk()) return s;
    } else {
      config.shutdown_timeout = 30;
    }
  }
  if (given.count(findLong("--uninterruptible-state-timeout")) == 0) {
    // As torch 2.15 reads it (_resolve_uninterruptible_state_timeout): unset, unparsable or
    // non-positive is off.
    auto it = env.find("TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT");
    double seconds = 0;
    if (it != env.end() && parseSeconds(it->second, seconds)) {
      config.uninterruptible_state_timeout = seconds;
      config.sources["--uninterruptible-state-timeout"] =
          "TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT (--uninterruptible-state-timeout)";
    }
  }
  if (given.count(findLong("--signals-to-handle")) == 0) {
    config.signals_to_handle = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};
  }
  return Status::ok();
}

// Options that need or exclude one another, and the entry point.
Status checkCombinations(const LaunchConfig& config, bool have_entrypoint) {
  if (config.module && config.no_python) {
    return invalidArgument(
        "-m/--module and --no-python cannot be used together: -m runs the entry point as a "
        "Python module, --no-python executes it directly");
  }
  for (const char* flag :
       {"--stall-first-timeout", "--stall-stacks-timeout", "--python-progress"}) {
    if (config.given.count(flag) != 0 && config.stall_timeout <= 0) {
      return invalidArgument(std::string(flag) +
                             " needs --stall-timeout (stall detection is off without it)");
    }
  }
  if (!config.metrics_token_file.empty() && config.metrics_port < 0) {
    return invalidArgument(
        "--metrics-token-file needs --metrics-port: the token guards POST /leave on that "
        "endpoint");
  }
  if (config.strict_numa_binding && config.numa_binding.empty()) {
    return invalidArgument(
        "--strict-numa-binding needs --numa-binding (or PET_NUMA_BINDING): it makes a worker "
        "that cannot be bound fail to start");
  }
  if (!have_entrypoint && !config.check) {
    return invalidArgument("missing the training script (or program) to run (see cpprun --help)");
  }
  if (have_entrypoint && config.entrypoint.empty()) {
    return invalidArgument("the training script (or program) to run is an empty string");
  }
  return Status::ok();
}

}  // namespace

Result<CliResult> parseCommandLine(const std::vector<std::string>& args, const Env& env) {
  CliResult result;
  LaunchConfig& config = result.config;
  std::set<const OptionSpec*> given;
  bool have_entrypoint = false;
  auto stop = applyCommandLine(args, result, given, have_entrypoint);
  if (!stop.isOk()) return stop.status();
  if (stop.value()) return result;  // --help, --version

  Status s = applyPetVariables(env, config, given);
  if (!s.isOk()) return s;
  for (const OptionSpec* spec : given) config.given.insert(spec->name);
  s = applyTorchDefaults(env, given, config);
  if (!s.isOk()) return s;
  s = checkCombinations(config, have_entrypoint);
  if (!s.isOk()) return s;
  if (!config.metrics_token_file.empty()) {  // read once, here: a bad file is a bad flag
    auto token = rendezvous::readSecretFile(config.metrics_token_file, "--metrics-token-file");
    if (!token.isOk()) return token.status();
    config.metrics_token = std::move(token).value();
  }

  if (config.standalone) {  // torchrun: explicit rendezvous options are overridden
    config.rdzv_backend = "c10d";
    config.rdzv_endpoint = "localhost:0";
    config.rdzv_id = internal::randomUuid4();
  }
  return result;
}

void applyOneNodeRunId(LaunchConfig& config, bool run_id_discovered) {
  if (config.max_nodes == 1 && config.rdzv_backend == "static" && config.rdzv_endpoint.empty() &&
      !config.master_port_given && config.given.count("--rdzv-id") == 0 && !run_id_discovered) {
    config.rdzv_id = internal::randomUuid4();
  }
}

namespace {

constexpr size_t kHelpWidth = 96;   // the longest line of --help
constexpr size_t kHelpColumn = 30;  // where an option's description starts
constexpr const char* kHelpIndent = "  ";

// Appends `text` word by word: the first line goes after `first` (padded to `column`, or on a
// line of its own when `first` is longer), the following lines are indented by `column`.
void appendWrapped(std::string& out, const std::string& first, const std::string& text,
                   size_t column) {
  std::string line = first;
  if (!line.empty() && line.size() + 1 > column) {
    out += line + "\n";
    line.clear();
  }
  line.resize(column, ' ');
  bool has_words = false;
  for (const std::string& word : splitOn(text, ' ')) {
    if (word.empty()) continue;
    if (has_words && line.size() + 1 + word.size() > kHelpWidth) {
      out += line + "\n";
      line.assign(column, ' ');
      has_words = false;
    }
    if (has_words) line += ' ';
    line += word;
    has_words = true;
  }
  out += line + "\n";
}

// "  -r, --redirects MODE"
std::string helpSynopsis(const OptionSpec& spec) {
  std::string s = kHelpIndent;
  if (spec.short_name != 0) s += std::string("-") + spec.short_name + ", ";
  s += spec.name;
  if (spec.metavar != nullptr) s += std::string(" ") + spec.metavar;
  return s;
}

// The help sentence, its default and the environment variable it falls back to.
std::string helpDescription(const OptionSpec& spec) {
  std::string s = spec.help;
  if (spec.default_text != nullptr) s += std::string(" Default ") + spec.default_text + ".";
  if (spec.env) s += " [" + envName(spec) + "]";
  return s;
}

std::string makeUsageText() {
  std::string out = R"(usage: cpprun [options] ENTRYPOINT [ARGS...]

Runs one agent on this node: it joins the rendezvous with the other nodes' agents, starts the
workers, serves their key-value store and supervises them. A drop-in for torchrun.

Entry point
  ENTRYPOINT is the first argument that is not an option; every argument after it goes to the
  workers unchanged, even one that looks like a cpprun option (use -- before an entry point
  that starts with '-'). A script ending in .py runs as `python3 -u ENTRYPOINT ARGS...`
  ($PYTHON_EXEC overrides the interpreter; a cpprun installed in a venv or conda env uses
  that env's python); -m runs `python3 -u -m ENTRYPOINT ARGS...`;
  --no-python, and any program that is not a .py file, is executed as given. The text
  ${local_rank} in any argument becomes the worker's local rank.

Options take `--opt=VALUE` or `--opt VALUE`, '-' or '_' inside names (--nproc_per_node), and
any unambiguous prefix of a name (--nproc). An option followed by [PET_<NAME>] that is absent
from the command line is read from that environment variable (a flag is on when it holds a
non-zero integer). The command line wins over the environment.
)";
  const Section kSections[] = {Section::kLaunch, Section::kRendezvous, Section::kRestarts,
                               Section::kOutput, Section::kExtras,     Section::kOperations};
  for (Section section : kSections) {
    out += std::string("\n") + sectionTitle(section) + "\n";
    for (const OptionSpec& spec : kOptions) {
      if (spec.section == section) {
        appendWrapped(out, helpSynopsis(spec), helpDescription(spec), kHelpColumn);
      }
    }
  }
  std::string unsupported;
  for (const OptionSpec& spec : kOptions) {
    if (spec.section != Section::kUnsupported) continue;
    unsupported += (unsupported.empty() ? " " : ", ") + std::string(spec.name);
    if (*spec.help != '\0') unsupported += std::string(" ") + spec.help;
  }
  out += "\n";
  appendWrapped(out, "", std::string(sectionTitle(Section::kUnsupported)) + ":" + unsupported + ".",
                0);
  out += R"(
Exit codes: 0 every worker succeeded; 1 a worker failed and no restart was left (the report
names the root cause); 2 usage error; 3 the job could not start (a port in use, a program that
cannot run); 4 the agent lost the rest of a multi-node job (the store host, or the join
timed out); 7 a worker was still alive --reap-timeout after SIGKILL (stuck in the kernel;
named in the report); 128+N stopped by signal N (forwarded to the workers first).
)";
  return out;
}

}  // namespace

const char* usageText() {
  static const std::string text = makeUsageText();
  return text.c_str();
}

namespace internal {

std::vector<OptionRow> optionRows() {
  std::vector<OptionRow> rows;
  for (const OptionSpec& spec : kOptions) {
    OptionRow row;
    row.name = spec.name;
    row.short_name = spec.short_name;
    row.takes_value = spec.arity == Arity::kValue;
    row.env_var = spec.env ? envName(spec) : "";
    row.default_text = spec.default_text != nullptr ? spec.default_text : "";
    row.supported = spec.section != Section::kUnsupported;
    rows.push_back(row);
  }
  return rows;
}

}  // namespace internal

}  // namespace cpprun::launcher
