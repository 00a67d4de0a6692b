// The cpprun command line: torchrun's flags, spellings, prefixes, PET_* fallback, validation
// messages and REMAINDER semantics.
#include "launcher/cli.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <csignal>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "tests/support/test_support.h"

using cpprun::launcher::CliResult;
using cpprun::launcher::LaunchConfig;
using cpprun::launcher::NprocKind;
using cpprun::launcher::parseCommandLine;
using cpprun::launcher::usageText;
using cpprun::launcher::internal::OptionRow;
using Args = std::vector<std::string>;
using Env = std::map<std::string, std::string>;

namespace {

LaunchConfig parseOk(const Args& args, const Env& env = {}) {
  auto r = parseCommandLine(args, env);
  INFO(r.status().message());
  REQUIRE(r.isOk());
  CHECK_FALSE(r.value().show_help);
  CHECK_FALSE(r.value().show_version);
  return r.value().config;
}

std::string parseError(const Args& args, const Env& env = {}) {
  auto r = parseCommandLine(args, env);
  REQUIRE_FALSE(r.isOk());
  CHECK(r.status().code() == cpprun::StatusCode::kInvalidArgument);
  return r.status().message();
}

}  // namespace

TEST_CASE("cli defaults match torchrun", "[unit]") {
  LaunchConfig c = parseOk({"train.py"});
  CHECK(c.entrypoint == "train.py");
  CHECK(c.entrypoint_args.empty());
  CHECK(c.min_nodes == 1);
  CHECK(c.max_nodes == 1);
  CHECK(c.nproc_kind == NprocKind::kNumber);
  CHECK(c.nproc == 1);
  CHECK(c.rdzv_backend == "static");
  CHECK(c.rdzv_endpoint.empty());
  CHECK(c.rdzv_id == "none");
  CHECK(c.rdzv_conf.empty());
  CHECK_FALSE(c.standalone);
  CHECK(c.max_restarts == 0);
  CHECK(c.monitor_interval == Approx(0.1));
  CHECK(c.start_method == "spawn");
  CHECK(c.role == "default");
  CHECK_FALSE(c.module);
  CHECK_FALSE(c.no_python);
  CHECK_FALSE(c.run_path);
  CHECK(c.log_dir.empty());
  CHECK(c.redirects_default == 0);
  CHECK(c.tee_default == 0);
  CHECK(c.local_ranks_filter.empty());
  CHECK(c.node_rank == 0);
  CHECK(c.master_addr == "127.0.0.1");
  CHECK(c.master_port == 29500);
  CHECK_FALSE(c.master_port_given);
  CHECK(c.local_addr.empty());
  CHECK(c.signals_to_handle == std::vector<int>{SIGTERM, SIGINT, SIGHUP, SIGQUIT});
  CHECK(c.shutdown_timeout == 30);
  CHECK_FALSE(c.virtual_local_rank);
  CHECK_FALSE(c.worker_hosts_store);
  CHECK_FALSE(c.dry_run);
}

TEST_CASE("cli accepts dashed and underscored spellings", "[unit]") {
  CHECK(parseOk({"--nproc-per-node", "4", "t.py"}).nproc == 4);
  CHECK(parseOk({"--nproc_per_node", "4", "t.py"}).nproc == 4);
  CHECK(parseOk({"--max_restarts=2", "t.py"}).max_restarts == 2);
  CHECK(parseOk({"--rdzv_backend", "c10d", "t.py"}).rdzv_backend == "c10d");
  CHECK(parseOk({"--master_addr", "10.0.0.1", "t.py"}).master_addr == "10.0.0.1");
  CHECK(parseOk({"--no_python", "prog"}).no_python);
  CHECK(parseOk({"--local_ranks_filter", "1", "t.py"}).local_ranks_filter == std::vector<int>{1});
}

TEST_CASE("cli accepts equals and space separated values", "[unit]") {
  CHECK(parseOk({"--nnodes=2", "t.py"}).max_nodes == 2);
  CHECK(parseOk({"--nnodes", "2", "t.py"}).max_nodes == 2);
  CHECK(parseOk({"--rdzv-id=", "t.py"}).rdzv_id.empty());
  CHECK(parseOk({"--rdzv-endpoint=host:1=2", "t.py"}).rdzv_endpoint == "host:1=2");
  CHECK(parseOk({"-r", "3", "t.py"}).redirects_default == 3);
  CHECK(parseOk({"-r3", "t.py"}).redirects_default == 3);
  CHECK(parseOk({"-r=3", "t.py"}).redirects_default == 3);
  CHECK(parseOk({"-t", "1", "t.py"}).tee_default == 1);
  CHECK(parseOk({"-t2", "t.py"}).tee_default == 2);
  CHECK(parseOk({"--tee=3", "t.py"}).tee_default == 3);
}

TEST_CASE("cli last occurrence of an option wins", "[unit]") {
  CHECK(parseOk({"--nproc-per-node", "2", "--nproc-per-node=3", "t.py"}).nproc == 3);
}

TEST_CASE("cli resolves unique prefixes of long options", "[unit]") {
  LaunchConfig c = parseOk({"--nproc", "2", "--max-r=4", "--stand", "--virt", "--nn", "1:3",
                            "--signals=USR1", "--shut", "5", "t.py"});
  CHECK(c.nproc == 2);
  CHECK(c.max_restarts == 4);
  CHECK(c.standalone);
  CHECK(c.virtual_local_rank);
  CHECK(c.min_nodes == 1);
  CHECK(c.max_nodes == 3);
  CHECK(c.signals_to_handle == std::vector<int>{SIGUSR1});
  CHECK(c.shutdown_timeout == 5);
  CHECK(parseOk({"--nproc_per", "5", "t.py"}).nproc == 5);
}

TEST_CASE("cli rejects an ambiguous prefix listing the candidates", "[unit]") {
  CHECK(parseError({"--rdzv", "x", "t.py"}) ==
        "ambiguous option '--rdzv' could match --rdzv-backend, --rdzv-endpoint, --rdzv-id, "
        "--rdzv-conf");
  CHECK(parseError({"--master=1", "t.py"}) ==
        "ambiguous option '--master' could match --master-addr, --master-port");
  CHECK(parseError({"--log", "d", "t.py"}) ==
        "ambiguous option '--log' could match --log-dir, --log-line-prefix-template, "
        "--logs-specs");
}

TEST_CASE("cli an exact option name wins over a longer one it prefixes", "[unit]") {
  using cpprun::launcher::internal::resolveLongOption;
  const std::vector<std::string> names = {"--foo-bar", "--foo", "--fox"};
  CHECK(resolveLongOption("--foo", names).value() == "--foo");
  CHECK(resolveLongOption("--foo-", names).value() == "--foo-bar");
  CHECK(resolveLongOption("--fo", names).status().message() ==
        "ambiguous option '--fo' could match --foo-bar, --foo, --fox");
  CHECK(resolveLongOption("--bar", names).status().message() ==
        "unrecognized option '--bar' (see cpprun --help)");
  // The real table: a full name is never treated as ambiguous.
  CHECK(parseOk({"--rdzv-id", "job", "t.py"}).rdzv_id == "job");
  CHECK(parseOk({"--log-dir", "d", "t.py"}).log_dir == "d");
}

TEST_CASE("cli rejects unknown options", "[unit]") {
  CHECK(parseError({"--bogus", "t.py"}) == "unrecognized option '--bogus' (see cpprun --help)");
  CHECK(parseError({"-x", "t.py"}) == "unrecognized option '-x' (see cpprun --help)");
  CHECK(parseError({"--=3", "t.py"}) == "unrecognized option '--' (see cpprun --help)");
}

TEST_CASE("cli option without its value is an error", "[unit]") {
  CHECK(parseError({"--nproc-per-node"}) == "option --nproc-per-node needs a value");
  CHECK(parseError({"--log-dir", "--nnodes", "2", "t.py"}) == "option --log-dir needs a value");
  CHECK(parseError({"-r"}) == "option -r/--redirects needs a value");
  // Like argparse: a following argument that looks like an option is not taken as the value.
  CHECK(parseError({"-r", "-1:1", "t.py"}) == "option -r/--redirects needs a value");
  // A negative number is a value (and then fails validation), as in argparse.
  CHECK(parseError({"--max-restarts", "-1", "t.py"}) ==
        "invalid value '-1' for --max-restarts: expected a non-negative integer");
}

TEST_CASE("cli flags take no value", "[unit]") {
  CHECK(parseError({"--standalone=1", "t.py"}) ==
        "option --standalone takes no value (got '--standalone=1')");
  CHECK(parseError({"-mx", "t.py"}) == "option -m/--module takes no value (got '-mx')");
}

TEST_CASE("cli keeps everything after the entry point for the script", "[unit]") {
  LaunchConfig c = parseOk({"--nproc-per-node", "2", "train.py", "--nproc-per-node", "5", "--lr",
                            "1", "-m", "--help", "--", "x"});
  CHECK(c.nproc == 2);
  CHECK(c.entrypoint == "train.py");
  CHECK(c.entrypoint_args == Args{"--nproc-per-node", "5", "--lr", "1", "-m", "--help", "--", "x"});
  CHECK_FALSE(c.module);
}

TEST_CASE("cli double dash ends the options", "[unit]") {
  LaunchConfig c = parseOk({"--no-python", "--", "-weird", "--nnodes", "3"});
  CHECK(c.entrypoint == "-weird");
  CHECK(c.entrypoint_args == Args{"--nnodes", "3"});
  CHECK(c.max_nodes == 1);
}

TEST_CASE("cli requires an entry point", "[unit]") {
  const std::string missing = "missing the training script (or program) to run (see cpprun --help)";
  CHECK(parseError({}) == missing);
  CHECK(parseError({"--nproc-per-node", "2"}) == missing);
  CHECK(parseError({"--"}) == missing);
  CHECK(parseError({""}) == "the training script (or program) to run is an empty string");
}

TEST_CASE("cli help and version stop parsing", "[unit]") {
  for (const Args& args : {Args{"--help"}, Args{"-h"}, Args{"--he"}, Args{"--nnodes", "2", "-h"},
                           Args{"--help", "--bogus"}}) {
    auto r = parseCommandLine(args, {});
    REQUIRE(r.isOk());
    CHECK(r.value().show_help);
    CHECK_FALSE(r.value().show_version);
  }
  auto v = parseCommandLine({"--version"}, {{"PET_NPROC_PER_NODE", "bad"}});
  REQUIRE(v.isOk());
  CHECK(v.value().show_version);
  CHECK_FALSE(v.value().show_help);
  CHECK(parseError({"--v"}) ==
        "ambiguous option '--v' could match --virtual-local-rank, --version");
}

TEST_CASE("cli nproc-per-node accepts numbers gpu cpu and auto", "[unit]") {
  CHECK(parseOk({"--nproc-per-node=gpu", "t.py"}).nproc_kind == NprocKind::kGpu);
  CHECK(parseOk({"--nproc-per-node=cpu", "t.py"}).nproc_kind == NprocKind::kCpu);
  CHECK(parseOk({"--nproc-per-node=auto", "t.py"}).nproc_kind == NprocKind::kAuto);
  LaunchConfig c = parseOk({"--nproc-per-node=8", "t.py"});
  CHECK(c.nproc_kind == NprocKind::kNumber);
  CHECK(c.nproc == 8);
  // (A number over the limit gets its own message: cli sizes over cpprun's limits.)
  for (const char* bad : {"x", "0", "-2", "", "2.5", "GPU", "xpu", "99999999999999999999"}) {
    CHECK(parseError({std::string("--nproc-per-node=") + bad, "t.py"}) ==
          "invalid value '" + std::string(bad) +
              "' for --nproc-per-node: expected a positive number, gpu, cpu or auto");
  }
}

TEST_CASE("cli nnodes takes N or MIN:MAX", "[unit]") {
  LaunchConfig one = parseOk({"--nnodes", "4", "t.py"});
  CHECK(one.min_nodes == 4);
  CHECK(one.max_nodes == 4);
  LaunchConfig range = parseOk({"--nnodes", "2:5", "t.py"});
  CHECK(range.min_nodes == 2);
  CHECK(range.max_nodes == 5);
  CHECK(parseOk({"--nnodes", "3:3", "t.py"}).min_nodes == 3);
  for (const char* bad : {"0", "0:2", "3:2", "a", "1:", ":2", "1:2:3", "-1"}) {
    CHECK(parseError({std::string("--nnodes=") + bad, "t.py"}) ==
          "invalid value '" + std::string(bad) +
              "' for --nnodes: expected N or MIN:MAX with 0 < MIN <= MAX");
  }
}

TEST_CASE("cli sizes over cpprun's limits name the flag or variable, the value and the bound",
          "[unit]") {
  // The bounds themselves are accepted.
  CHECK(parseOk({"--nnodes=65536", "t.py"}).max_nodes == 65536);
  CHECK(parseOk({"--nnodes=1:65536", "t.py"}).max_nodes == 65536);
  CHECK(parseOk({"--nproc-per-node=4096", "t.py"}).nproc == 4096);
  // One over, and the values the probe used (on 06341ed they ran out of memory or descriptors).
  for (const char* nnodes : {"65537", "2147483647", "1:100000", "99999999999999999999"}) {
    std::string message = parseError({std::string("--nnodes=") + nnodes, "t.py"});
    INFO(message);
    if (std::string(nnodes) == "99999999999999999999") {  // not even a 64-bit integer
      CHECK_THAT(message, Catch::Contains("expected N or MIN:MAX"));
      continue;
    }
    CHECK(message == "invalid value '" + std::string(nnodes) +
                         "' for --nnodes: more than cpprun's limit of 65,536 nodes (Slurm's own "
                         "limit on a job's hosts); give the number of nodes (one agent each), not "
                         "of workers");
  }
  CHECK_THAT(parseError({"t.py"}, {{"PET_NNODES", "2147483647"}}),
             Catch::StartsWith("invalid value '2147483647' for PET_NNODES (--nnodes): more than "
                               "cpprun's limit of 65,536 nodes"));
  CHECK(parseError({"--nproc-per-node", "100000", "t.py"}) ==
        "invalid value '100000' for --nproc-per-node: more than cpprun's limit of 4,096 workers "
        "on one node; ask for fewer (one per GPU or per CPU is the usual count)");
  CHECK_THAT(parseError({"--dry-run", "t.py"}, {{"PET_NPROC_PER_NODE", "1000000000"}}),
             Catch::StartsWith("invalid value '1000000000' for PET_NPROC_PER_NODE "
                               "(--nproc-per-node): more than cpprun's limit of 4,096 workers"));
  CHECK_THAT(parseError({"--nproc-per-node=4097", "t.py"}), Catch::Contains("4,096"));
}

TEST_CASE("cli errors show a long value cut, whole lines only", "[unit]") {
  const std::string huge(128 * 1024, '7');  // a 128 KiB environment value
  for (const std::string& message :
       {parseError({"t.py"}, {{"PET_NNODES", huge}}),
        parseError({"t.py"}, {{"PET_NPROC_PER_NODE", "x" + huge}}),
        parseError({"t.py"}, {{"PET_MASTER_PORT", huge}}),
        parseError({"t.py"}, {{"PET_SIGNALS_TO_HANDLE", "SIG" + huge}}),
        parseError({"--" + huge, "t.py"}), parseError({"--dry-run=" + huge, "t.py"})}) {
    INFO(message.substr(0, 300));
    CHECK(message.size() < 400);
    CHECK_THAT(message, Catch::Contains("\xE2\x80\xA6 (") && Catch::Contains(" bytes)"));
  }
  CHECK_THAT(parseError({"t.py"}, {{"PET_NNODES", huge}}),
             Catch::StartsWith("invalid value '" + huge.substr(0, 64) +
                               "\xE2\x80\xA6 (131072 bytes)' for PET_NNODES (--nnodes)"));
  // Control characters do not reach the terminal raw.
  CHECK(parseError({"--nnodes=1\n\x1b[2J", "t.py"}) ==
        "invalid value '1\\n\\x1b[2J' for --nnodes: expected N or MIN:MAX with 0 < MIN <= MAX");
}

TEST_CASE("cli max-restarts must be non-negative", "[unit]") {
  CHECK(parseOk({"--max-restarts", "0", "t.py"}).max_restarts == 0);
  CHECK(parseOk({"--max-restarts", "7", "t.py"}).max_restarts == 7);
  CHECK(parseError({"--max-restarts=x", "t.py"}) ==
        "invalid value 'x' for --max-restarts: expected a non-negative integer");
}

TEST_CASE("cli rdzv-conf parses key value pairs", "[unit]") {
  LaunchConfig c = parseOk({"--rdzv-conf", "join_timeout=600, is_host = 1,a=b=c", "t.py"});
  CHECK(c.rdzv_conf == std::map<std::string, std::string>{
                           {"join_timeout", "600"}, {"is_host", "1"}, {"a", "b=c"}});
  CHECK(parseOk({"--rdzv-conf=", "t.py"}).rdzv_conf.empty());
  CHECK(parseError({"--rdzv-conf", "a=1,=2", "t.py"}) ==
        "invalid value 'a=1,=2' for --rdzv-conf: expected KEY=VALUE,KEY=VALUE (found an empty "
        "key)");
  CHECK(parseError({"--rdzv-conf", "a=1,b=", "t.py"}) ==
        "invalid value 'a=1,b=' for --rdzv-conf: expected KEY=VALUE,KEY=VALUE (key 'b' has no "
        "value)");
  CHECK(parseError({"--rdzv-conf", "a", "t.py"}) ==
        "invalid value 'a' for --rdzv-conf: expected KEY=VALUE,KEY=VALUE (key 'a' has no value)");
  CHECK(parseError({"--rdzv-conf", "a=1,", "t.py"}) ==
        "invalid value 'a=1,' for --rdzv-conf: expected KEY=VALUE,KEY=VALUE (found an empty key)");
}

TEST_CASE("cli rdzv-backend accepts static c10d etcd and etcd-v2", "[unit]") {
  CHECK(parseOk({"--rdzv-backend", "static", "t.py"}).rdzv_backend == "static");
  CHECK(parseOk({"--rdzv-backend", "c10d", "t.py"}).rdzv_backend == "c10d");
  CHECK(parseOk({"--rdzv-backend", "etcd", "t.py"}).rdzv_backend == "etcd");
  CHECK(parseOk({"--rdzv-backend", "etcd-v2", "t.py"}).rdzv_backend == "etcd-v2");
  CHECK(parseError({"--rdzv-backend", "zookeeper", "t.py"}) ==
        "invalid value 'zookeeper' for --rdzv-backend: expected static, c10d, etcd or etcd-v2");
}

TEST_CASE("cli redirects and tee take a mode or per-rank modes", "[unit]") {
  LaunchConfig c = parseOk({"-r", "0:1,3:2", "--tee", "1:3", "t.py"});
  CHECK(c.redirects_default == 0);
  CHECK(c.redirects_by_rank == std::map<int, int>{{0, 1}, {3, 2}});
  CHECK(c.tee_default == 0);
  CHECK(c.tee_by_rank == std::map<int, int>{{1, 3}});
  CHECK(parseOk({"--redirects", "10:3", "t.py"}).redirects_by_rank == std::map<int, int>{{10, 3}});
  const std::string expected =
      ": expected 0-3 (0 none, 1 stdout, 2 stderr, 3 both) or LOCAL_RANK:0-3 pairs like 0:1,1:2";
  for (const char* bad : {"4", "x", "", "0:4", "0:1,", ":1", "a:1", "0:", "0:12", "-1:1", "03"}) {
    CHECK(parseError({std::string("-r=") + bad, "t.py"}) ==
          "invalid value '" + std::string(bad) + "' for -r/--redirects" + expected);
  }
  CHECK(parseError({"-t", "7", "t.py"}) == "invalid value '7' for -t/--tee" + expected);
}

TEST_CASE("cli local-ranks-filter is a list of local ranks", "[unit]") {
  CHECK(parseOk({"--local-ranks-filter", "3,0,3", "t.py"}).local_ranks_filter ==
        std::vector<int>{0, 3});
  CHECK(parseOk({"--local-ranks-filter=", "t.py"}).local_ranks_filter.empty());
  for (const char* bad : {"a", "0,,1", "-1", "1,"}) {
    CHECK(parseError({"--local-ranks-filter", bad, "t.py"}) ==
          "invalid value '" + std::string(bad) +
              "' for --local-ranks-filter: expected a comma-separated list of local ranks "
              "(integers >= 0)");
  }
}

TEST_CASE("cli signals-to-handle takes signal names", "[unit]") {
  CHECK(parseOk({"--signals-to-handle", "SIGTERM,SIGUSR1", "t.py"}).signals_to_handle ==
        std::vector<int>{SIGTERM, SIGUSR1});
  CHECK(parseOk({"--signals-to-handle", "usr2, sigint,TERM,SIGTERM", "t.py"}).signals_to_handle ==
        std::vector<int>{SIGUSR2, SIGINT, SIGTERM});
  CHECK(parseError({"--signals-to-handle", "SIGTERM,SIGFOO", "t.py"}) ==
        "invalid value 'SIGTERM,SIGFOO' for --signals-to-handle: expected a comma-separated list "
        "of signal names like SIGTERM,SIGUSR1 ('SIGFOO' is not one)");
  CHECK(parseError({"--signals-to-handle", "", "t.py"}) ==
        "invalid value '' for --signals-to-handle: expected a comma-separated list of signal "
        "names like SIGTERM,SIGUSR1 ('' is not one)");
  CHECK(parseError({"--signals-to-handle", "15", "t.py"}) ==
        "invalid value '15' for --signals-to-handle: expected a comma-separated list of signal "
        "names like SIGTERM,SIGUSR1 ('15' is not one)");
  CHECK(parseError({"--signals-to-handle", "SIGKILL", "t.py"}) ==
        "invalid value 'SIGKILL' for --signals-to-handle: expected a comma-separated list of "
        "signal names like SIGTERM,SIGUSR1 (SIGKILL cannot be caught)");
}

TEST_CASE("cli shutdown-timeout comes from flag then PET then TORCH_ELASTIC then 30", "[unit]") {
  const Env both = {{"PET_SHUTDOWN_TIMEOUT", "7"}, {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "9"}};
  CHECK(parseOk({"--shutdown-timeout", "2.5", "t.py"}, both).shutdown_timeout == 2.5);
  CHECK(parseOk({"t.py"}, both).shutdown_timeout == 7);
  CHECK(parseOk({"t.py"}, {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "9"}}).shutdown_timeout == 9);
  CHECK(parseOk({"t.py"}).shutdown_timeout == 30);
  CHECK(parseOk({"--shutdown-timeout=0", "t.py"}).shutdown_timeout == 0);
  CHECK(parseError({"--shutdown-timeout", "-1", "t.py"}) ==
        "invalid value '-1' for --shutdown-timeout: expected a non-negative number of seconds");
  CHECK(parseError({"--shutdown-timeout", "soon", "t.py"}) ==
        "invalid value 'soon' for --shutdown-timeout: expected a non-negative number of seconds");
  CHECK(parseError({"t.py"}, {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "x"}}) ==
        "invalid value 'x' for TORCH_ELASTIC_SHUTDOWN_TIMEOUT (--shutdown-timeout): expected a "
        "non-negative number of seconds");
}

TEST_CASE("cli master-port range and master_port_given", "[unit]") {
  LaunchConfig c = parseOk({"--master-port", "0", "t.py"});
  CHECK(c.master_port == 0);
  CHECK(c.master_port_given);
  CHECK(parseOk({"--master-port=65535", "t.py"}).master_port == 65535);
  LaunchConfig e = parseOk({"t.py"}, {{"PET_MASTER_PORT", "1234"}});
  CHECK(e.master_port == 1234);
  CHECK(e.master_port_given);
  for (const char* bad : {"65536", "-1", "http", ""}) {
    CHECK(parseError({"--master-port", bad, "t.py"}) ==
          "invalid value '" + std::string(bad) +
              "' for --master-port: expected a port number from 0 to 65535");
  }
}

TEST_CASE("cli node-rank monitor-interval and start-method are validated", "[unit]") {
  CHECK(parseOk({"--node-rank", "3", "t.py"}).node_rank == 3);
  CHECK(parseError({"--node-rank", "-1", "t.py"}) ==
        "invalid value '-1' for --node-rank: expected a non-negative integer");
  CHECK(parseOk({"--monitor-interval", "5", "t.py"}).monitor_interval == 5);
  CHECK(parseError({"--monitor-interval", "fast", "t.py"}) ==
        "invalid value 'fast' for --monitor-interval: expected a non-negative number of seconds");
  CHECK(parseOk({"--start-method", "fork", "t.py"}).start_method == "fork");
  CHECK(parseOk({"--start-method", "forkserver", "t.py"}).start_method == "forkserver");
  CHECK(parseError({"--start-method", "thread", "t.py"}) ==
        "invalid value 'thread' for --start-method: expected spawn, fork or forkserver");
}

TEST_CASE("cli string options are stored as given", "[unit]") {
  LaunchConfig c = parseOk({"--rdzv-endpoint", "[::1]:29400", "--rdzv-id", "job7", "--role",
                            "trainer", "--log-dir", "/tmp/logs", "--master-addr", "[::1]",
                            "--local-addr", "node3", "t.py"});
  CHECK(c.rdzv_endpoint == "[::1]:29400");
  CHECK(c.rdzv_id == "job7");
  CHECK(c.role == "trainer");
  CHECK(c.log_dir == "/tmp/logs");
  CHECK(c.master_addr == "[::1]");
  CHECK(c.local_addr == "node3");
}

TEST_CASE("cli boolean flags", "[unit]") {
  LaunchConfig c = parseOk({"-m", "--run-path", "--virtual-local-rank", "--dry-run",
                            "--worker-hosts-store", "pkg.train"});
  CHECK(c.module);
  CHECK(c.run_path);
  CHECK(c.virtual_local_rank);
  CHECK(c.dry_run);
  CHECK(c.worker_hosts_store);
  CHECK(c.entrypoint == "pkg.train");
  CHECK(parseOk({"--module", "pkg"}).module);
}

TEST_CASE("cli module and no-python together are an error", "[unit]") {
  const std::string msg =
      "-m/--module and --no-python cannot be used together: -m runs the entry point as a Python "
      "module, --no-python executes it directly";
  CHECK(parseError({"-m", "--no-python", "x"}) == msg);
  CHECK(parseError({"--no-python", "x"}, {{"PET_MODULE", "1"}}) == msg);
}

TEST_CASE("cli PET variables fill options missing from the command line", "[unit]") {
  const Env env = {{"PET_NPROC_PER_NODE", "gpu"},
                   {"PET_NNODES", "1:4"},
                   {"PET_RDZV_BACKEND", "c10d"},
                   {"PET_RDZV_ENDPOINT", "head:29400"},
                   {"PET_RDZV_ID", "42"},
                   {"PET_RDZV_CONF", "timeout=5"},
                   {"PET_MAX_RESTARTS", "3"},
                   {"PET_MONITOR_INTERVAL", "1"},
                   {"PET_START_METHOD", "fork"},
                   {"PET_ROLE", "r"},
                   {"PET_LOG_DIR", "/l"},
                   {"PET_REDIRECTS", "3"},
                   {"PET_TEE", "0:2"},
                   {"PET_LOCAL_RANKS_FILTER", "0"},
                   {"PET_NODE_RANK", "2"},
                   {"PET_MASTER_ADDR", "m"},
                   {"PET_LOCAL_ADDR", "me"},
                   {"PET_SIGNALS_TO_HANDLE", "SIGUSR1"}};
  LaunchConfig c = parseOk({"t.py"}, env);
  CHECK(c.nproc_kind == NprocKind::kGpu);
  CHECK(c.min_nodes == 1);
  CHECK(c.max_nodes == 4);
  CHECK(c.rdzv_backend == "c10d");
  CHECK(c.rdzv_endpoint == "head:29400");
  CHECK(c.rdzv_id == "42");
  CHECK(c.rdzv_conf.at("timeout") == "5");
  CHECK(c.max_restarts == 3);
  CHECK(c.monitor_interval == 1);
  CHECK(c.start_method == "fork");
  CHECK(c.role == "r");
  CHECK(c.log_dir == "/l");
  CHECK(c.redirects_default == 3);
  CHECK(c.tee_by_rank == std::map<int, int>{{0, 2}});
  CHECK(c.local_ranks_filter == std::vector<int>{0});
  CHECK(c.node_rank == 2);
  CHECK(c.master_addr == "m");
  CHECK(c.local_addr == "me");
  CHECK(c.signals_to_handle == std::vector<int>{SIGUSR1});
  CHECK_FALSE(c.master_port_given);
}

TEST_CASE("cli command line wins over PET variables", "[unit]") {
  const Env env = {{"PET_NPROC_PER_NODE", "gpu"}, {"PET_MASTER_PORT", "1"}, {"PET_NNODES", "x"}};
  LaunchConfig c =
      parseOk({"--nproc_per_node=3", "--master-port", "2", "--nnodes", "2", "t.py"}, env);
  CHECK(c.nproc_kind == NprocKind::kNumber);
  CHECK(c.nproc == 3);
  CHECK(c.master_port == 2);
  CHECK(c.max_nodes == 2);
  // A prefix on the command line counts as giving the option.
  CHECK(parseOk({"--nproc", "5", "t.py"}, {{"PET_NPROC_PER_NODE", "gpu"}}).nproc == 5);
}

TEST_CASE("cli a bad PET value names the variable and the flag", "[unit]") {
  CHECK(parseError({"t.py"}, {{"PET_NPROC_PER_NODE", "many"}}) ==
        "invalid value 'many' for PET_NPROC_PER_NODE (--nproc-per-node): expected a positive "
        "number, gpu, cpu or auto");
  CHECK(parseError({"t.py"}, {{"PET_MASTER_PORT", "99999"}}) ==
        "invalid value '99999' for PET_MASTER_PORT (--master-port): expected a port number from "
        "0 to 65535");
}

TEST_CASE("cli boolean PET variables are int not equal to zero", "[unit]") {
  CHECK(parseOk({"t.py"}, {{"PET_STANDALONE", "1"}}).standalone);
  CHECK(parseOk({"t.py"}, {{"PET_STANDALONE", "2"}}).standalone);
  CHECK_FALSE(parseOk({"t.py"}, {{"PET_STANDALONE", "0"}}).standalone);
  CHECK(parseOk({"t.py"}, {{"PET_MODULE", " 1 "}}).module);
  CHECK(parseOk({"x"}, {{"PET_NO_PYTHON", "1"}}).no_python);
  CHECK(parseOk({"t.py"}, {{"PET_RUN_PATH", "1"}}).run_path);
  CHECK(parseOk({"t.py"}, {{"PET_VIRTUAL_LOCAL_RANK", "1"}}).virtual_local_rank);
  CHECK_FALSE(parseOk({"t.py"}, {{"PET_VIRTUAL_LOCAL_RANK", "-0"}}).virtual_local_rank);
  // The flag on the command line turns it on whatever the variable says.
  CHECK(parseOk({"--virtual-local-rank", "t.py"}, {{"PET_VIRTUAL_LOCAL_RANK", "0"}})
            .virtual_local_rank);
  CHECK(parseError({"t.py"}, {{"PET_STANDALONE", "yes"}}) ==
        "invalid value 'yes' for PET_STANDALONE (--standalone): expected an integer (0 is off)");
  // cpprun's own flags have no PET_ fallback.
  CHECK_FALSE(parseOk({"t.py"}, {{"PET_DRY_RUN", "1"}}).dry_run);
}

TEST_CASE("cli standalone forces c10d on localhost with a random id", "[unit]") {
  LaunchConfig c = parseOk({"--standalone", "--rdzv-backend", "static", "--rdzv-endpoint", "h:1",
                            "--rdzv-id", "mine", "--nproc-per-node", "2", "t.py"});
  CHECK(c.standalone);
  CHECK(c.rdzv_backend == "c10d");
  CHECK(c.rdzv_endpoint == "localhost:0");
  CHECK(std::regex_match(
      c.rdzv_id,
      std::regex("[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")));
  CHECK(c.nproc == 2);
  LaunchConfig d = parseOk({"--standalone", "t.py"});
  CHECK(d.rdzv_id != c.rdzv_id);
}

TEST_CASE("cli unsupported torchrun options are rejected with a reason", "[unit]") {
  CHECK(parseError({"--logs-specs", "mine", "t.py"})
            .rfind("--logs-specs (value 'mine') is not supported by cpprun: ", 0) == 0);
  // An inherited PET_ value of a rejected option is ignored.
  parseOk({"t.py"}, {{"PET_LOGS_SPECS", "mine"}});
}

TEST_CASE("cli --event-log-handler takes torch 2.15's handler names, PET_ too", "[unit]") {
  CHECK(parseOk({"t.py"}).event_log_handler == "null");
  CHECK(parseOk({"--event-log-handler", "console", "t.py"}).event_log_handler == "console");
  CHECK(parseOk({"--event_log_handler=null", "t.py"}).event_log_handler == "null");
  CHECK(parseOk({"--event-log-handler=dynamic_rendezvous", "t.py"}).event_log_handler ==
        "dynamic_rendezvous");
  CHECK(parseOk({"t.py"}, {{"PET_EVENT_LOG_HANDLER", "console"}}).event_log_handler == "console");
  // torchrun takes any name and dies of a KeyError at its first event (exit 1); cpprun names
  // the handler and the accepted ones before anything starts.
  CHECK(parseError({"--event-log-handler", "file", "t.py"}) ==
        "invalid value 'file' for --event-log-handler: expected console, null or "
        "dynamic_rendezvous (torch 2.15's registered event handlers; cpprun runs no Python "
        "plug-ins)");
  CHECK_THAT(parseError({"t.py"}, {{"PET_EVENT_LOG_HANDLER", "Console"}}),
             Catch::StartsWith("invalid value 'Console' for PET_EVENT_LOG_HANDLER "
                               "(--event-log-handler): expected console, null or"));
}

TEST_CASE("cli --duplicate-*-filters split as torchrun's comma_separated_list", "[unit]") {
  using Filters = std::vector<std::string>;
  CHECK(parseOk({"t.py"}).duplicate_stdout_filters.empty());
  CHECK(parseOk({"t.py"}).duplicate_stderr_filters.empty());
  LaunchConfig c = parseOk(
      {"--duplicate-stdout-filters", "loss,acc", "--duplicate_stderr_filters", "Error", "t.py"});
  CHECK(c.duplicate_stdout_filters == Filters{"loss", "acc"});
  CHECK(c.duplicate_stderr_filters == Filters{"Error"});
  // ",," is a literal comma; an empty item (the empty value, a trailing comma) is a filter that
  // matches every line, as torchrun's ['']: its parser gives the same lists.
  CHECK(parseOk({"--duplicate-stdout-filters=a,,b,c,", "t.py"}).duplicate_stdout_filters ==
        Filters{"a,b", "c", ""});
  CHECK(parseOk({"--duplicate-stdout-filters=", "t.py"}).duplicate_stdout_filters == Filters{""});
  CHECK(parseOk({"--duplicate-stdout-filters=,,,,", "t.py"}).duplicate_stdout_filters ==
        Filters{",,"});
  CHECK(parseOk({"t.py"}, {{"PET_DUPLICATE_STDERR_FILTERS", "q,r"}}).duplicate_stderr_filters ==
        Filters{"q", "r"});
}

TEST_CASE("cli usage text covers every group and the exit codes", "[unit]") {
  const std::string text = usageText();
  for (const char* needle : {"usage: cpprun", "Entry point", "Launch", "Rendezvous", "Restarts",
                             "Output", "cpprun extras", "Operations", "Not supported", "PET_<NAME>",
                             "Exit codes: 0 every worker succeeded", "128+N stopped by signal N"}) {
    INFO(needle);
    CHECK(text.find(needle) != std::string::npos);
  }
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    INFO(text.substr(start, end - start));
    CHECK(end - start <= 100);
    start = end + 1;
  }
}

namespace {

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    out.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// The help lines of one option: its synopsis line ("  -r, --redirects MODE ..." or
// "  --nnodes N|MIN:MAX ...") and the indented lines after it, joined by spaces. Empty when the
// option has no synopsis line; `count` says how many it has.
std::string optionBlock(const std::vector<std::string>& help, const OptionRow& row, int& count) {
  std::string synopsis = "  ";
  if (row.short_name != 0) synopsis += std::string("-") + row.short_name + ", ";
  synopsis += row.name;
  std::string block;
  count = 0;
  for (size_t i = 0; i < help.size(); ++i) {
    const std::string& line = help[i];
    if (line.compare(0, synopsis.size(), synopsis) != 0 ||
        (line.size() > synopsis.size() && line[synopsis.size()] != ' ')) {
      continue;
    }
    ++count;
    block = line;
    for (size_t j = i + 1; j < help.size() && help[j].compare(0, 4, "    ") == 0; ++j) {
      block += " " + help[j].substr(help[j].find_first_not_of(' '));
    }
  }
  return block;
}

}  // namespace

TEST_CASE("cli usage text shows every option of the table with its env var and default", "[unit]") {
  const std::string text = usageText();
  const std::vector<std::string> help = lines(text);
  const std::vector<OptionRow> rows = cpprun::launcher::internal::optionRows();
  REQUIRE(rows.size() >= 40);
  const size_t unsupported_at = text.find("Not supported (rejected with a message):");
  REQUIRE(unsupported_at != std::string::npos);
  // The paragraph runs to the next blank line; joined, so that a wrapped name still matches.
  std::string unsupported =
      text.substr(unsupported_at, text.find("\n\n", unsupported_at) - unsupported_at);
  std::replace(unsupported.begin(), unsupported.end(), '\n', ' ');
  for (const OptionRow& row : rows) {
    INFO(row.name);
    int count = 0;
    const std::string block = optionBlock(help, row, count);
    if (!row.supported) {
      CHECK(count == 0);
      CHECK(std::regex_search(unsupported, std::regex(row.name + "([ ,.]|$)")));
      CHECK(row.env_var.empty());
      continue;
    }
    REQUIRE(count == 1);
    INFO(block);
    if (!row.env_var.empty()) {
      CHECK(row.env_var.rfind("PET_", 0) == 0);
      CHECK(block.find("[" + row.env_var + "]") != std::string::npos);
    } else {
      CHECK(block.find("[PET_") == std::string::npos);
    }
    if (!row.default_text.empty()) {
      CHECK(block.find("Default " + row.default_text + ".") != std::string::npos);
    }
  }
  // Spot checks of the generated names and defaults.
  int count = 0;
  auto find = [&](const std::string& name) {
    for (const OptionRow& row : rows) {
      if (row.name == name) return row;
    }
    FAIL("no row " << name);
    return OptionRow{};
  };
  CHECK(find("--nproc-per-node").env_var == "PET_NPROC_PER_NODE");
  CHECK(find("--nnodes").default_text == "1:1");
  CHECK(find("--dry-run").env_var.empty());
  CHECK(optionBlock(help, find("--redirects"), count).rfind("  -r, --redirects MODE", 0) == 0);
  CHECK(optionBlock(help, find("--module"), count).find("[PET_MODULE]") != std::string::npos);
}

// The completion tells a flag from an option that takes a value by a list of the flags: that
// list must be the table's, or the word after a forgotten flag is taken for its value.
TEST_CASE("cli bash completion knows every flag and short valued option of the table", "[unit]") {
  std::string here = __FILE__;
  const std::string path =
      here.substr(0, here.rfind("/tests/launcher/")) + "/packaging/completion/cpprun.bash";
  std::ifstream in(path);
  REQUIRE(in.is_open());
  std::stringstream all;
  all << in.rdbuf();
  const std::string script = all.str();
  const size_t begin = script.find("--*=* |");
  REQUIRE(begin != std::string::npos);
  const std::string flags_case = script.substr(begin, script.find(") ;;", begin) - begin);
  INFO(flags_case);
  std::set<std::string> listed;
  std::regex word("(-[-a-z]+)");
  for (auto it = std::sregex_iterator(flags_case.begin(), flags_case.end(), word);
       it != std::sregex_iterator(); ++it) {
    listed.insert(it->str());
  }
  listed.erase("--");  // of "--*=*"
  std::set<std::string> flags;
  for (const OptionRow& row : cpprun::launcher::internal::optionRows()) {
    if (row.takes_value || !row.supported) continue;
    if (row.name == "--help" || row.name == "--version") continue;  // nothing follows them
    flags.insert(row.name);
    if (row.short_name != 0) flags.insert(std::string("-") + row.short_name);
  }
  CHECK(listed == flags);

  // A short option with a value ("-r 3") makes the next word its value, not the entry point.
  const size_t short_at = script.find("\n      -r |");
  REQUIRE(short_at != std::string::npos);
  const std::string short_case =
      script.substr(short_at, script.find(") takes_value=1", short_at) - short_at);
  std::set<std::string> listed_short;
  for (auto it = std::sregex_iterator(short_case.begin(), short_case.end(), word);
       it != std::sregex_iterator(); ++it) {
    listed_short.insert(it->str());
  }
  std::set<std::string> short_with_value;
  for (const OptionRow& row : cpprun::launcher::internal::optionRows()) {
    if (row.takes_value && row.short_name != 0) {
      short_with_value.insert(std::string("-") + row.short_name);
    }
  }
  CHECK(listed_short == short_with_value);
}

TEST_CASE("cli operations options: --stall-timeout, --metrics-port, --event-log", "[unit]") {
  LaunchConfig off = parseOk({"t.py"});
  CHECK(off.stall_timeout == 0);
  CHECK(off.metrics_port == -1);
  CHECK(off.event_log.empty());
  LaunchConfig c = parseOk(
      {"--stall-timeout=2.5", "--metrics-port", "9400", "--event-log", "/tmp/e.jsonl", "t.py"});
  CHECK(c.stall_timeout == 2.5);
  CHECK(c.metrics_host == "127.0.0.1");
  CHECK(c.metrics_port == 9400);
  CHECK(c.event_log == "/tmp/e.jsonl");
  LaunchConfig any = parseOk({"--metrics-port=0.0.0.0:0", "t.py"});
  CHECK(any.metrics_host == "0.0.0.0");
  CHECK(any.metrics_port == 0);
  LaunchConfig v6 = parseOk({"--metrics-port=[::1]:9401", "t.py"});
  CHECK(v6.metrics_host == "::1");
  CHECK(v6.metrics_port == 9401);
  // --event-log is not an abbreviation of --event-log-handler.
  CHECK(parseOk({"--event-log-handler=null", "--event-log=x", "t.py"}).event_log == "x");
  for (const char* bad : {"0", "-1", "soon", ""}) {
    INFO(bad);
    CHECK_THAT(parseError({std::string("--stall-timeout=") + bad, "t.py"}),
               Catch::Contains("a positive number of seconds"));
  }
  for (const char* bad : {"70000", "host:", ":9400", "::1:9400", "[::1]9400", "x"}) {
    INFO(bad);
    CHECK_THAT(parseError({std::string("--metrics-port=") + bad, "t.py"}),
               Catch::Contains("PORT or HOST:PORT"));
  }
  // The error says what is wrong with the value, not only what is expected.
  CHECK_THAT(parseError({"--metrics-port=h:70000", "t.py"}),
             Catch::Contains("port 70000 is out of range 0-65535"));
  CHECK_THAT(parseError({"--metrics-port=::1:9400", "t.py"}),
             Catch::Contains("IPv6 addresses go in brackets"));
  CHECK_THAT(parseError({"--metrics-port=+9400", "t.py"}), Catch::Contains("is not a number"));
  CHECK_THAT(parseError({"--event-log=", "t.py"}), Catch::Contains("a file path"));
  // cpprun's own options have no PET_ fallback.
  CHECK(parseOk({"t.py"}, {{"PET_STALL_TIMEOUT", "3"}}).stall_timeout == 0);
}

TEST_CASE("cli --metrics-token-file reads the token once, from a file only this user can read",
          "[unit]") {
  cpprun::testing::TempDir dir;
  auto write = [&](const std::string& name, const std::string& content, mode_t mode) {
    const std::string path = dir.path() + "/" + name;
    std::ofstream(path) << content;
    REQUIRE(::chmod(path.c_str(), mode) == 0);
    return path;
  };
  const std::string token = "0123456789abcdef0123456789abcdef";
  const std::string good = write("token", "  " + token + "\n", 0600);
  LaunchConfig c = parseOk({"--metrics-port=0", "--metrics-token-file", good, "t.py"});
  CHECK(c.metrics_token_file == good);
  CHECK(c.metrics_token == token);  // surrounding whitespace trimmed
  CHECK(parseOk({"--metrics-port=0", "t.py"}).metrics_token.empty());
  CHECK(parseOk({"--metrics-port=0", "--metrics-token-file=" + write("ro", token, 0400), "t.py"})
            .metrics_token == token);
  // Group or others may read it: refused, naming the file and the fix.
  const std::string shared = write("shared", token, 0640);
  CHECK_THAT(parseError({"--metrics-port=0", "--metrics-token-file=" + shared, "t.py"}),
             Catch::Contains("--metrics-token-file " + shared + " has mode 0640") &&
                 Catch::Contains("chmod 600"));
  const std::string world = write("world", token, 0604);
  CHECK_THAT(parseError({"--metrics-port=0", "--metrics-token-file=" + world, "t.py"}),
             Catch::Contains(world) && Catch::Contains("mode 0604"));
  CHECK_THAT(
      parseError({"--metrics-port=0", "--metrics-token-file=" + dir.path() + "/none", "t.py"}),
      Catch::Contains(dir.path() + "/none") && Catch::Contains("No such file"));
  CHECK_THAT(parseError({"--metrics-port=0", "--metrics-token-file=" + dir.path(), "t.py"}),
             Catch::Contains("not a regular file"));
  const std::string link = dir.path() + "/link";
  REQUIRE(::symlink(good.c_str(), link.c_str()) == 0);
  CHECK_THAT(parseError({"--metrics-port=0", "--metrics-token-file=" + link, "t.py"}),
             Catch::Contains("is a symbolic link"));
  CHECK_THAT(parseError({"--metrics-port=0", "--metrics-token-file=" + write("short", "abc", 0600),
                         "t.py"}),
             Catch::Contains("holds 3 bytes") && Catch::Contains("at least 16"));
  // The token guards the endpoint: without one it means nothing.
  CHECK_THAT(parseError({"--metrics-token-file=" + good, "t.py"}),
             Catch::Contains("--metrics-token-file needs --metrics-port"));
  CHECK_THAT(parseError({"--metrics-port=0", "--metrics-token-file=", "t.py"}),
             Catch::Contains("a file path"));
}

TEST_CASE("cli stall options: the first timeout, the stack bound and the automatic Python stamps",
          "[unit]") {
  LaunchConfig defaults = parseOk({"--stall-timeout=5", "t.py"});
  CHECK(defaults.stall_first_timeout == 0);  // 0: the default, max(600 s, --stall-timeout)
  CHECK(defaults.stall_stacks_timeout == 1);
  CHECK(defaults.python_progress);
  LaunchConfig c = parseOk({"--stall-timeout=5", "--stall-first-timeout=120",
                            "--stall-stacks-timeout=off", "--python-progress=off", "t.py"});
  CHECK(c.stall_first_timeout == 120);
  CHECK(c.stall_stacks_timeout == 0);
  CHECK_FALSE(c.python_progress);
  CHECK(parseOk({"--stall-timeout=5", "--stall-stacks-timeout=2.5", "t.py"}).stall_stacks_timeout ==
        2.5);
  for (const char* bad : {"0", "-1", "off", "x"}) {
    INFO(bad);
    CHECK_THAT(
        parseError({"--stall-timeout=5", std::string("--stall-first-timeout=") + bad, "t.py"}),
        Catch::Contains("a positive number of seconds"));
  }
  CHECK_THAT(parseError({"--stall-timeout=5", "--stall-stacks-timeout=0", "t.py"}),
             Catch::Contains("a positive number of seconds, or off"));
  CHECK_THAT(parseError({"--stall-timeout=5", "--python-progress=auto", "t.py"}),
             Catch::Contains("on or off"));
  // Without stall detection they would do nothing: said, not ignored.
  for (const char* flag :
       {"--stall-first-timeout=60", "--stall-stacks-timeout=off", "--python-progress=off"}) {
    INFO(flag);
    CHECK_THAT(parseError({flag, "t.py"}), Catch::Contains("needs --stall-timeout"));
  }
}

TEST_CASE("one node without a run id or port gets a random run id, as under torchrun 2.15",
          "[unit]") {
  using cpprun::launcher::applyOneNodeRunId;
  const std::regex uuid4("[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}");
  LaunchConfig one = parseOk({"t.py"});
  applyOneNodeRunId(one, false);
  CHECK(std::regex_match(one.rdzv_id, uuid4));
  LaunchConfig other = parseOk({"t.py"});
  applyOneNodeRunId(other, false);
  CHECK(other.rdzv_id != one.rdzv_id);
  // Anything that names the job, the port or more nodes keeps torchrun's "none" (or the id).
  for (const Args& args : {Args{"--rdzv-id=job", "t.py"}, Args{"--master-port=29501", "t.py"},
                           Args{"--nnodes=2", "t.py"}, Args{"--rdzv-endpoint=h:1", "t.py"}}) {
    INFO(args[0]);
    LaunchConfig c = parseOk(args);
    const std::string before = c.rdzv_id;
    applyOneNodeRunId(c, false);
    CHECK(c.rdzv_id == before);
  }
  LaunchConfig pet = parseOk({"t.py"}, {{"PET_RDZV_ID", "petjob"}});
  applyOneNodeRunId(pet, false);
  CHECK(pet.rdzv_id == "petjob");
  LaunchConfig slurm = parseOk({"t.py"});
  slurm.rdzv_id = "12345";  // the scheduler's job id
  applyOneNodeRunId(slurm, true);
  CHECK(slurm.rdzv_id == "12345");
}

TEST_CASE("torchrun 2.15's --log-line-prefix-template works, with its PET_ fallback", "[unit]") {
  CHECK(parseOk({"t.py"}).log_line_prefix_template.empty());
  CHECK(parseOk({"--log-line-prefix-template=${hostname}:${rank}: ", "t.py"})
            .log_line_prefix_template == "${hostname}:${rank}: ");
  CHECK(parseOk({"--log_line_prefix_template", "[${rank}]", "t.py"}).log_line_prefix_template ==
        "[${rank}]");
  CHECK(parseOk({"t.py"}, {{"PET_LOG_LINE_PREFIX_TEMPLATE", "<${local_rank}>"}})
            .log_line_prefix_template == "<${local_rank}>");
}

TEST_CASE("torchrun 2.15's --print-completion is refused with the reason", "[unit]") {
  CHECK_THAT(parseError({"--print-completion", "bash", "t.py"}),
             Catch::StartsWith("--print-completion (value 'bash') is not supported by cpprun: ") &&
                 Catch::Contains("share/bash-completion/completions/cpprun"));
}

TEST_CASE("cli console options: --worker-tty, --stdin, --raw-output", "[unit]") {
  const LaunchConfig defaults = parseOk({"t.py"});
  CHECK(defaults.worker_tty);
  CHECK(defaults.stdin_mode == "rank0");
  CHECK_FALSE(defaults.raw_output);
  const LaunchConfig c = parseOk({"--worker-tty=off", "--stdin", "all", "--raw-output", "t.py"});
  CHECK_FALSE(c.worker_tty);
  CHECK(c.stdin_mode == "all");
  CHECK(c.raw_output);
  CHECK(parseOk({"--stdin=none", "t.py"}).stdin_mode == "none");
  CHECK_THAT(parseError({"--stdin=rank1", "t.py"}),
             Catch::Contains("'rank1'") && Catch::Contains("none, rank0 or all"));
  CHECK_THAT(parseError({"--worker-tty=on", "t.py"}), Catch::Contains("auto or off"));
  // cpprun's own: no PET_ fallback.
  CHECK(parseOk({"t.py"}, {{"PET_STDIN", "none"}}).stdin_mode == "rank0");
}

TEST_CASE(
    "cli uninterruptible-state-timeout, else TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT as "
    "torch reads it, and reap-timeout",
    "[unit]") {
  LaunchConfig c = parseOk({"train.py"});
  CHECK(c.uninterruptible_state_timeout == 0);  // off, as torch
  CHECK(c.reap_timeout == 5);
  c = parseOk({"--uninterruptible-state-timeout=2.5", "--reap-timeout", "0.5", "train.py"});
  CHECK(c.uninterruptible_state_timeout == 2.5);
  CHECK(c.reap_timeout == 0.5);
  c = parseOk({"train.py"}, {{"TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT", "3"}});
  CHECK(c.uninterruptible_state_timeout == 3);
  // The flag wins over the variable.
  c = parseOk({"--uninterruptible-state-timeout=0", "train.py"},
              {{"TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT", "3"}});
  CHECK(c.uninterruptible_state_timeout == 0);
  // torch: unparsable or non-positive disables the check (no error).
  for (const char* v : {"abc", "-1", "0", ""}) {
    c = parseOk({"train.py"}, {{"TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT", v}});
    CHECK(c.uninterruptible_state_timeout == 0);
  }
  // The flags themselves are checked like every other.
  CHECK(parseError({"--uninterruptible-state-timeout=-1", "train.py"})
            .find("--uninterruptible-state-timeout") != std::string::npos);
  CHECK(parseError({"--reap-timeout=0", "train.py"}).find("--reap-timeout") != std::string::npos);
  CHECK(std::string(usageText()).find("--reap-timeout") != std::string::npos);
}
