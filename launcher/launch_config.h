// LaunchConfig: what the user asked cpprun to do, as parsed from the command line and the
// PET_* environment (torchrun's flags; see docs/torchrun-compatibility.md). Plain data; the
// launch plan (launch_plan.h) turns it into workers.
// Thread safety: a value type.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

namespace cpprun::launcher {

// How many workers per node: a number, or resolved from the machine.
enum class NprocKind { kNumber, kGpu, kCpu, kAuto };

// --stall-first-timeout's default (at least --stall-timeout): ten minutes for imports, CUDA and
// NCCL set-up, the rendezvous of init_process_group and loading data, as a large job needs.
inline constexpr double kDefaultStallFirstTimeoutSeconds = 600;

struct LaunchConfig {
  // --nnodes N or MIN:MAX (0 < min <= max <= kMaxNodes, launch_limits.h).
  int min_nodes = 1;
  int max_nodes = 1;
  // --nproc-per-node: a number (nproc, at most kMaxWorkersPerNode), or gpu / cpu / auto.
  NprocKind nproc_kind = NprocKind::kNumber;
  int nproc = 1;

  std::string rdzv_backend = "static";           // --rdzv-backend: static | c10d
  std::string rdzv_endpoint;                     // --rdzv-endpoint host[:port], IPv6 as [addr]:port
  std::string rdzv_id = "none";                  // --rdzv-id
  std::map<std::string, std::string> rdzv_conf;  // --rdzv-conf k=v,k=v
  bool standalone = false;                       // --standalone

  int max_restarts = 0;           // --max-restarts (>= 0)
  double monitor_interval = 0.1;  // --monitor-interval, seconds (accepted; cpprun is event-driven)
  std::string start_method = "spawn";  // --start-method (accepted for compatibility)
  std::string role = "default";        // --role

  bool module = false;     // -m / --module: python -m ENTRYPOINT
  bool no_python = false;  // --no-python: exec ENTRYPOINT as given
  bool run_path = false;   // --run-path (accepted; runs like the default)

  std::string log_dir;  // --log-dir (empty: no per-rank log files)
  // -r/--redirects and -t/--tee: per local rank, 0 none, 1 stdout, 2 stderr, 3 both.
  // `redirects_default` applies to local ranks not listed in `redirects_by_rank`.
  int redirects_default = 0;
  std::map<int, int> redirects_by_rank;
  int tee_default = 0;
  std::map<int, int> tee_by_rank;
  std::vector<int> local_ranks_filter;  // --local-ranks-filter; empty = all
  // --log-line-prefix-template (torchrun 2.15); empty: TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE,
  // else cpprun's default prefix.
  std::string log_line_prefix_template;
  // Console (docs/supervision.md, "Console"): --worker-tty auto gives each worker a
  // pseudo-terminal for a stream when cpprun's is a terminal (off: pipes); --stdin: which workers
  // read cpprun's stdin, "none", "rank0" (global rank 0) or "all"; --raw-output: no line prefix.
  bool worker_tty = true;
  std::string stdin_mode = "rank0";
  bool raw_output = false;
  // --duplicate-stdout-filters / --duplicate-stderr-filters (torchrun 2.15): tee'd lines that
  // contain any of these go to filtered_std{out,err}.log too. Absent: empty (nothing copied); an
  // empty string in the list matches every line.
  std::vector<std::string> duplicate_stdout_filters;
  std::vector<std::string> duplicate_stderr_filters;

  int node_rank = 0;                      // --node-rank (static backend)
  std::string master_addr = "127.0.0.1";  // --master-addr
  int master_port = 29500;                // --master-port
  bool master_port_given = false;         // true when set by flag or PET_MASTER_PORT
  std::string local_addr;                 // --local-addr (empty: this host's name)

  std::vector<int> signals_to_handle;  // --signals-to-handle, signal numbers
  double shutdown_timeout = 30;        // --shutdown-timeout, seconds
  // --uninterruptible-state-timeout, else $TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT (read as
  // torch 2.15 reads it: unparsable or <= 0 is off), seconds; 0: off.
  double uninterruptible_state_timeout = 0;
  double reap_timeout = 5;          // --reap-timeout, seconds after SIGKILL
  bool virtual_local_rank = false;  // --virtual-local-rank
  // --numa-binding: node, socket, exclusive or core-complex (launcher/numa_binding.h); empty:
  // off. --strict-numa-binding: a worker that cannot be bound fails the start.
  std::string numa_binding;
  bool strict_numa_binding = false;
  bool worker_hosts_store = false;  // --worker-hosts-store: rank 0 hosts its own store
  bool dry_run = false;             // --dry-run
  bool check = false;               // --check: preflight report, no job (entry point optional)
  double stall_timeout = 0;         // --stall-timeout, seconds; 0: off
  double stall_first_timeout = 0;   // --stall-first-timeout, seconds; 0: the default below
  double stall_stacks_timeout = 1;  // --stall-stacks-timeout, seconds; 0: off
  bool python_progress = true;      // --python-progress on|off
  bool warm_restart = false;        // --warm-restart: later attempts' Python workers forked warm
  std::string metrics_host = "127.0.0.1";  // --metrics-port [HOST:]PORT
  int metrics_port = -1;                   // -1: off
  // --metrics-token-file FILE, and the token read from it as the command line is parsed (the
  // bearer token POST /leave must carry); both "" when not given.
  std::string metrics_token_file;
  std::string metrics_token;
  std::string event_log;  // --event-log FILE
  // --event-log-handler: "console" also writes every event to stderr; "null" and
  // "dynamic_rendezvous" (torch's null handlers): no console events.
  std::string event_log_handler = "null";
  // Health checks before every join of a multi-node job (launcher/node_health.h,
  // agent/health/health_check.h).
  std::string health_check;                    // --health-check CMD; empty: none
  double health_check_timeout = 60;            // --health-check-timeout, seconds (> 0)
  std::vector<std::string> health_check_dirs;  // --health-check-dirs DIR[,DIR...]
  bool builtin_health_checks = true;           // --builtin-health-checks on|off
  // Exclusion (agent/coordination/node_exclusion.h): elastic jobs only.
  int exclude_after = 3;         // --exclude-after K; 0: off
  double exclude_window = 3600;  // --exclude-window SECONDS

  // Canonical long names ("--node-rank") of the options set on the command line or by their
  // PET_ variable: scheduler discovery fills only the others.
  std::set<std::string> given;
  // Where an option's value came from, as errors name it (launch_limits.h's sourceOf):
  // "--nnodes", "PET_NNODES (--nnodes)", or the scheduler's variable ("SLURM_NTASKS=4").
  // Absent: the default.
  std::map<std::string, std::string> sources;

  std::string entrypoint;  // the script, module or program
  std::vector<std::string> entrypoint_args;
};

}  // namespace cpprun::launcher
