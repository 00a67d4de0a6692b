// makeAgentOptions: what cpprun asks of its agent, built from the command line, the resolved
// rendezvous and the node, without starting anything.
#include "launcher/agent_options.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <string>

namespace {

using namespace cpprun::launcher;
using std::chrono::milliseconds;

AgentOptionsInputs inputsFor(LaunchConfig config, std::vector<std::string> gpus = {}) {
  AgentOptionsInputs in;
  auto rdzv = resolveRendezvous(config);
  REQUIRE(rdzv.isOk());
  in.rdzv = rdzv.value();
  in.config = std::move(config);
  in.node.hostname = "n1";
  in.node.gpus = std::move(gpus);
  in.nproc = 2;
  in.agent_id = "n1-42-0000abcd";
  // Which names are this machine's is the caller's to know; here only "n1" and loopback.
  in.is_local_host = [](const std::string& host) {
    return host == "n1" || host == "127.0.0.1" || host == "localhost";
  };
  return in;
}

LaunchConfig nodes(int n, int rank, const std::string& backend = "static") {
  LaunchConfig c;
  c.min_nodes = c.max_nodes = n;
  c.node_rank = rank;
  c.rdzv_backend = backend;
  c.master_addr = "10.0.0.1";
  c.rdzv_id = "job7";
  return c;
}

}  // namespace

TEST_CASE("agent options: one node serves its store and supervises with the flags' bounds",
          "[unit]") {
  LaunchConfig c;
  c.rdzv_id = "job7";
  c.max_restarts = 3;
  c.shutdown_timeout = 2.5;
  c.signals_to_handle = {15, 10};
  c.event_log = "/tmp/events.jsonl";
  c.metrics_host = "0.0.0.0";
  c.metrics_port = 9400;
  c.metrics_token = "0123456789abcdef0123456789abcdef";
  c.role = "trainer";
  AgentOptionsInputs in = inputsFor(c, {"0", "1"});
  in.env = {{"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "[${rank}]"}};
  const auto o = makeAgentOptions(in);
  CHECK(o.host_store);
  CHECK_FALSE(o.host_store_if_free);
  CHECK_FALSE(o.multi_node.has_value());
  CHECK(o.store_host == in.rdzv.store.host);
  CHECK(o.store_port == in.rdzv.store.port);
  CHECK(o.store_bind_host.empty());
  CHECK(o.store_no_handshake_dialect == cpprun::rendezvous::wire::Dialect::kLegacy);
  CHECK(o.use_nccl);  // the workers see GPUs
  CHECK(o.host_name == "n1");
  CHECK(o.run_id == "job7");
  CHECK(o.event_log_path == "/tmp/events.jsonl");
  CHECK(o.metrics_host == "0.0.0.0");
  CHECK(o.metrics_port == 9400);
  CHECK(o.metrics_token == "0123456789abcdef0123456789abcdef");
  CHECK(o.signals_to_handle == std::vector<int>{15, 10});
  CHECK(o.supervisor.max_restarts == 3);
  CHECK(o.supervisor.shutdown_timeout == milliseconds(2500));
  CHECK(o.supervisor.stall.timeout == milliseconds(0));
  CHECK(o.supervisor.output.role_name == "trainer");
  CHECK(o.supervisor.output.prefix_template == "[${rank}]");  // from the environment
  c.log_line_prefix_template = "<${local_rank}>";             // the flag wins
  CHECK(makeAgentOptions(inputsFor(c)).supervisor.output.prefix_template == "<${local_rank}>");
  CHECK_FALSE(makeAgentOptions(inputsFor(c)).use_nccl);  // no GPU: no NCCL
}

TEST_CASE("agent options: --stall-timeout with the gdb found and --local-addr as the name",
          "[unit]") {
  LaunchConfig c;
  c.stall_timeout = 1.5;
  c.local_addr = "10.9.9.9";
  AgentOptionsInputs in = inputsFor(c);
  in.gdb_path = "/usr/bin/gdb";
  const auto o = makeAgentOptions(in);
  CHECK(o.supervisor.stall.timeout == milliseconds(1500));
  CHECK(o.supervisor.stall.gdb_path == "/usr/bin/gdb");
  CHECK(o.host_name == "10.9.9.9");
}

TEST_CASE("agent options: --worker-hosts-store leaves the store to rank 0 on the picked port",
          "[unit]") {
  LaunchConfig c;
  c.worker_hosts_store = true;
  AgentOptionsInputs in = inputsFor(c);
  in.worker_store_port = 31337;
  auto o = makeAgentOptions(in);
  CHECK_FALSE(o.host_store);
  CHECK(o.store_port == 31337);
  // A port given on the command line is kept.
  c.master_port = 4242;
  c.master_port_given = true;
  in = inputsFor(c);
  in.worker_store_port = 31337;
  o = makeAgentOptions(in);
  CHECK(o.store_port == 4242);
}

TEST_CASE("agent options: static nodes meet at node 0's store with the rendezvous bounds",
          "[unit]") {
  LaunchConfig c = nodes(3, 1);
  c.max_restarts = 2;
  AgentOptionsInputs in = inputsFor(c);
  in.scheduler_rank = 5;
  in.expected_hosts = {"a", "b", "c"};
  auto o = makeAgentOptions(in);
  CHECK_FALSE(o.host_store);  // node 1: a client of node 0's
  REQUIRE(o.multi_node.has_value());
  const auto& co = *o.multi_node;
  CHECK(co.group_rank == 1);
  CHECK(co.group_world_size == 3);
  CHECK_FALSE(co.elastic);
  CHECK_FALSE(co.host_per_round);
  CHECK(co.self.host == "n1");
  CHECK(co.self.nproc == 2);
  CHECK(co.self.id == "n1-42-0000abcd");
  CHECK(co.self.scheduler_rank == 5);
  CHECK(co.expected_hosts == std::vector<std::string>{"a", "b", "c"});
  CHECK(co.join_timeout == in.rdzv.join_timeout);
  CHECK(co.keep_alive_interval == in.rdzv.keep_alive_interval);
  CHECK(co.final_linger == in.rdzv.close_timeout);
  CHECK(o.store_host == "10.0.0.1");
  CHECK(o.store_bind_host == in.rdzv.bind_host);
  // Node 0 serves it.
  CHECK(makeAgentOptions(inputsFor(nodes(3, 0))).host_store);
}

TEST_CASE("agent options: elastic nodes host the store when the endpoint is this machine",
          "[unit]") {
  LaunchConfig c = nodes(2, 0, "c10d");
  c.min_nodes = 1;
  c.rdzv_endpoint = "n1:29400";
  auto o = makeAgentOptions(inputsFor(c));
  REQUIRE(o.multi_node.has_value());
  CHECK(o.multi_node->elastic);
  CHECK(o.multi_node->min_nodes == 1);
  CHECK(o.multi_node->max_nodes == 2);
  CHECK_FALSE(o.host_store);
  CHECK(o.host_store_if_free);  // "n1" is this machine
  c.rdzv_endpoint = "elsewhere:29400";
  o = makeAgentOptions(inputsFor(c));
  CHECK_FALSE(o.host_store);
  CHECK_FALSE(o.host_store_if_free);
  c.rdzv_conf["is_host"] = "true";
  o = makeAgentOptions(inputsFor(c));
  CHECK(o.host_store);
  CHECK_FALSE(o.host_store_if_free);
}

TEST_CASE("agent options: etcd makes every agent serve a store on a free port", "[unit]") {
  LaunchConfig c = nodes(2, 0, "etcd");
  c.rdzv_endpoint = "127.0.0.1:2379";
  auto o = makeAgentOptions(inputsFor(c));
  REQUIRE(o.multi_node.has_value());
  CHECK(o.multi_node->host_per_round);
  CHECK(static_cast<bool>(o.multi_node->store.connect));
  CHECK(o.host_store);
  CHECK_FALSE(o.host_store_if_free);
  CHECK(o.store_port == 0);
  CHECK(o.store_host == "127.0.0.1");  // etcd only on this machine
  CHECK(o.store_bind_host == "0.0.0.0");
  c.rdzv_endpoint = "etcd.example:2379";
  o = makeAgentOptions(inputsFor(c));
  CHECK(o.store_host == "n1");  // reachable by this host's name
  c.local_addr = "fd00::7";
  o = makeAgentOptions(inputsFor(c));
  CHECK(o.store_host == "fd00::7");
  CHECK(o.store_bind_host == "::");
}

TEST_CASE("output options: raw output, an empty template, worker ptys on terminals only",
          "[unit]") {
  LaunchConfig config;
  CHECK(outputOptions(config, {}).prefix_template == "[${role_name}${rank}]:");
  CHECK(outputOptions(config, {{"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", ""}})
            .prefix_template.empty());
  LaunchConfig empty_flag = config;
  empty_flag.given.insert("--log-line-prefix-template");  // --log-line-prefix-template=
  CHECK(outputOptions(empty_flag, {{"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "x"}})
            .prefix_template.empty());
  LaunchConfig raw = config;
  raw.raw_output = true;
  CHECK(outputOptions(raw, {}).prefix_template.empty());

  auto piped = outputOptions(config, {}, false, false);
  CHECK_FALSE(piped.stdout_pty);
  CHECK_FALSE(piped.console_stdout_terminal);
  auto terminal = outputOptions(config, {}, true, false);
  CHECK(terminal.stdout_pty);
  CHECK(terminal.console_stdout_terminal);
  CHECK_FALSE(terminal.stderr_pty);
  LaunchConfig off = config;
  off.worker_tty = false;
  auto no_tty = outputOptions(off, {}, true, true);
  CHECK_FALSE(no_tty.stdout_pty);
  CHECK_FALSE(no_tty.stderr_pty);
  CHECK(no_tty.console_stderr_terminal);  // open lines on the terminal all the same
}
