// LocalAgent: one node's agent — the event loop that serves the store, reaps children, catches
// the handled signals and drives the Supervisor through the attempts. Everything happens on one
// Asio io_context in the calling thread: a child's exit (SIGCHLD), a signal, store traffic,
// worker output and timers are all events.
//
// Per attempt, before its workers start: every store key outside "cpprun/" is erased (so no
// key of an earlier attempt is visible, whichever prefix the workers' torch uses), a fresh NCCL
// unique id is made when NCCL is loadable and stored as "cpprun/nccl_unique_id" (above
// nccl_ranks_per_id ranks also one id per that many ranks, "cpprun/nccl_unique_ids",
// nccl_id_groups.h), and the caller's MakeAttempt turns the context into workers.
//
// Observability: --event-log (event_log.h) records what happens, --metrics-port serves
// /healthz, /metrics and /status over HTTP on a thread of its own, from snapshots this loop
// publishes (agent_http_routes.h), so no HTTP traffic runs on the loop beside the store; and the
// supervisor's stall detection reads the workers' progress files.
//
// Inside, a LocalAgent (local_agent.cc) holds the parts as members in the order each needs the
// ones before it — NCCL ids, event log, store, process launcher, rendezvous (single-node) or
// coordinator (multi-node), supervisor, HTTP server, child reaper, signals — so they are made in
// that order and taken down in reverse. A new part is one member in its place and one line in
// LocalAgent::open() (plus its stop in run() when it must stop while the loop still runs).
//
// Drain (graceful leave of one node): kLeaveSignal (SIGPWR, signal_policy.h) to the agent, or
// POST /leave on its --metrics-port endpoint, asks an elastic job to go on without this node.
// The coordinator refuses what would break the job (job_coordinator.h, requestLeave), with the
// reason in the log, the `leave_requested` event and the HTTP answer (409); once accepted,
// the workers get SIGTERM, the others re-form without this node (no restart budget used) and
// this agent exits 0 saying it left (JobOutcome::kLeft).
//
// Console: SIGWINCH (cpprun's terminal resized) gives every worker pty the new size, SIGCONT
// (continued, maybe in the foreground now) lets the stdin forwarder read the terminal again.
//
// Thread safety: runLocalAgent() blocks the calling thread until the job ends; the agent must
// be that thread for the workers' parent-death signal to stay armed.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "agent/console/stdin_forwarder.h"
#include "agent/health/health_check.h"
#include "agent/nccl/nccl_id_groups.h"
#include "agent/processes/warm_start_launcher.h"
#include "agent/supervision/supervisor.h"
#include "common/status.h"
#include "rendezvous/wire.h"

namespace cpprun::agent {

// Store key prefix the agent keeps across attempts.
inline constexpr const char* kAgentKeyPrefix = "cpprun/";
inline constexpr const char* kNcclUniqueIdKey = "cpprun/nccl_unique_id";

struct LocalAgentOptions {
  bool host_store = true;
  // Elastic jobs: serve the store if the port is free here, else be a client of whichever
  // agent does (torchrun's c10d rule: the first agent at the endpoint hosts it).
  bool host_store_if_free = false;
  std::string store_host = "127.0.0.1";  // the workers' MASTER_ADDR, and where the store binds
  int store_port = 0;           // 0: the kernel picks (no collisions between jobs on one host)
  std::string store_bind_host;  // bind here instead of store_host when not empty ("::", all)
  // How the served store reads clients without the torch >= 2.2 handshake: torch 1.13
  // numbering with the switch to 2.1 (kLegacy), or torch 2.1 from the first byte (kV21).
  rendezvous::wire::Dialect store_no_handshake_dialect = rendezvous::wire::Dialect::kLegacy;
  // The job's secret (rendezvous/store_auth.h; docs/security.md): the store served here takes
  // writes of "cpprun/" keys only from connections that prove it, and this agent's clients
  // (multi_node->secret) prove it. Empty: an open store, as torch's.
  std::string store_secret;
  // Multi-node jobs (group_world_size > 1): the coordination with the other agents. The agent
  // of group rank 0 serves the store (host_store); the others connect to store_host:store_port.
  // store_host, store_port, max_restarts are filled in by the agent.
  std::optional<StoreCoordinatorOptions> multi_node;
  std::vector<int> signals_to_handle;
  bool use_nccl = true;
  std::string nccl_library = "libnccl.so.2";
  // NCCL bootstrap at scale (nccl_id_groups.h): above this many ranks in the job the workers get
  // CPPRUN_NCCL_UNIQUE_IDS too (0: never). One node: its `nproc` workers are the job.
  int nccl_ranks_per_id = kDefaultNcclRanksPerId;
  int nproc = 0;
  SupervisorOptions supervisor;
  std::string host_name;           // this node's name in events and /status
  std::string run_id;              // the job's id in /status
  std::string event_log_path;      // --event-log FILE; empty: none
  bool event_log_console = false;  // --event-log-handler console: events to stderr too
  // --metrics-port [HOST:]PORT: serve /healthz, /metrics and /status there (port 0: the kernel
  // picks one; the log and the event log say which). Off when metrics_port < 0.
  std::string metrics_host = "127.0.0.1";
  int metrics_port = -1;
  // --metrics-token-file: the token POST /leave must carry (`Authorization: Bearer <token>`);
  // empty: none. Every request's Host is checked and a POST with an Origin refused either way
  // (http_access.h).
  std::string metrics_token;
  // Multi-node: the node's health check before every join of a round (health_check.h,
  // health_gate.h); nothing to check (no command, no built-in checks): every join passes.
  HealthCheckOptions health;
  // The job's cgroup and sentinel, for the workers the agent starts (the guardian's).
  WorkerContainment containment;
  // Which workers read the agent's stdin (--stdin; stdin_forwarder.h). kNone: all read
  // /dev/null.
  StdinMode stdin_mode = StdinMode::kNone;
  // --warm-restart (warm_start_launcher.h): later attempts' Python workers forked from a warm
  // process; nullopt: every worker starts cold.
  std::optional<WarmStartOptions> warm_start;
};

struct AttemptContext {
  int restart_count = 0;
  std::optional<Membership> membership;  // multi-node: ranks and world size from the rendezvous
  std::string store_host;  // where the workers' store is (the agent's, when it serves one)
  int store_port = 0;
  std::string nccl_unique_id_hex;  // empty without NCCL
  // Comma-joined ids for ncclCommInitRankScalable: only above nccl_ranks_per_id ranks.
  std::string nccl_unique_ids_hex;
};

using MakeAttempt = std::function<Result<AttemptSpec>(const AttemptContext&)>;

// Runs the job to its end. An error when the agent cannot start (e.g. the store's port is in
// use); otherwise the job's outcome, whatever it was.
Result<JobOutcome> runLocalAgent(const LocalAgentOptions& options, const MakeAttempt& make_attempt);

}  // namespace cpprun::agent
