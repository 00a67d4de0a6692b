// The `cpprun` command line: torchrun's flags (reference/torchrun.md §1) parsed into a
// LaunchConfig.
//
// Follows Python argparse as torchrun configures it: `--opt=v` and `--opt v`, '-' or '_' in long
// names, any unambiguous prefix of a long option (an exact name wins over a longer one it
// prefixes), `-r3` / `-r=3` for the short options that take a value, and REMAINDER semantics: the
// first positional argument is the entry point and every argument after it goes to the entry
// point verbatim, even those that look like cpprun's flags. An option marked E in torchrun falls
// back to the environment variable PET_<NAME> when absent from the command line (booleans: true
// when int(PET_<NAME>) != 0); the command line wins.
//
// Errors are values: every message names the flag (or the PET_ variable) and the bad value, and
// the caller prints it and exits 2.
// Thread safety: the functions are reentrant; parseCommandLine reads only its arguments (and
// std::random_device for --standalone's run id).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "launcher/launch_config.h"

namespace cpprun::launcher {

struct CliResult {
  LaunchConfig config;
  // --help / -h or --version came before the entry point. Parsing stopped there: `config` holds
  // whatever was parsed up to that point and no PET_ fallback or validation was applied.
  bool show_help = false;
  bool show_version = false;
};

// Parses cpprun's command line. `args` is argv without argv[0]; `env` is the process
// environment (read for PET_*, TORCH_ELASTIC_SHUTDOWN_TIMEOUT and
// TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT only).
Result<CliResult> parseCommandLine(const std::vector<std::string>& args,
                                   const std::map<std::string, std::string>& env);

// torchrun 2.15's one-node default: a job of one node on the static backend with no
// --rdzv-endpoint and no --master-port runs as --standalone does, under a random UUID4 run id.
// cpprun keeps its static store (a free port) and takes only the run id, and only when nothing
// gave one (--rdzv-id, PET_RDZV_ID, the scheduler's job id). Call after scheduler discovery,
// which can change the node count, the port and the run id.
void applyOneNodeRunId(LaunchConfig& config, bool run_id_discovered);

// The --help text, generated from the option table (ends with a newline).
const char* usageText();

namespace internal {

// Resolves a typed long option ("--nproc", with '_' already turned into '-') against `names`:
// an exact match, else the only name it prefixes. Errors name the option: unrecognized, or
// ambiguous with the candidates listed. Exposed for tests.
Result<std::string> resolveLongOption(const std::string& typed,
                                      const std::vector<std::string>& names);

// One row of the option table, as `cpprun --help` shows it. Exposed so that tests check the
// help (and the bash completion) against the table instead of a hand-kept list.
struct OptionRow {
  std::string name;  // "--nproc-per-node"
  char short_name = 0;
  bool takes_value = false;
  std::string env_var;       // "PET_NPROC_PER_NODE"; empty: no environment fallback
  std::string default_text;  // shown as "Default <text>."; empty: none shown
  bool supported = true;     // false: rejected with a reason, listed under "Not supported"
};
std::vector<OptionRow> optionRows();

// A random RFC 4122 version-4 UUID in its 36-character text form (lower-case hex).
std::string randomUuid4();

}  // namespace internal

}  // namespace cpprun::launcher
