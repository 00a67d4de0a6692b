// JobCoordinator: what makes one job out of the agents of several nodes. The store host (the
// agent of node 0, which serves the store) and every other agent meet in the store:
//
//   join        every agent publishes its host and worker count; all wait for all (join_timeout)
//   attempt n   every agent says it is ready; the host clears the workers' keys, makes the NCCL
//               id and says "go" with it; every agent starts its workers
//   failure     the first agent whose workers fail (or that gets a signal) claims the attempt's
//               stop key (compare-and-set: the store decides who was first); every agent's
//               watcher wakes and tears its workers down
//   end of n    every agent reports how its workers ended; the host decides for the whole job —
//               restart (one restart budget for the job), succeeded, failed (the root cause is
//               the stop key's owner's first failure; the rest are listed as collateral) or
//               stopped by a signal — and every agent acts on that one decision
//   liveness    (liveness.h) by default every agent bumps a heartbeat key each keep-alive
//               interval and the host declares an agent lost after keep_alive_max_attempt
//               silent intervals (not counting the host's own delays); a backend may bring its
//               own (etcd: leases and a watch of their expiry, on every agent). A lost member
//               stops the attempt; an agent whose store requests go unanswered for the same
//               bound stops its workers and ends with exit code 4
//
// With host_per_round (the etcd backend) no agent is special: "the host" above is the current
// round's node 0, the agent in the round's slot min_nodes closes it (any other in its place if
// it is lost), every agent watches every member's liveness, the lowest-ranked live member
// decides when node 0 is lost, and node 0 lost before its go sends every member to the next
// round (StoreCoordinatorOptions).
//
// Elastic jobs also have hot spares (agents beyond max_nodes wait in the next round while the job
// runs, and replace lost or departed nodes: rendezvous_rounds.h) and a graceful leave of one
// agent (requestLeave: a stop claim with cause "leave"; the others re-form without it, no restart
// budget used).
//
// Keys live under "cpprun/<run id>/" (the workers' clean-up spares them; the decider deletes an
// attempt's two attempts later, stale_job_keys.h); agent/coordination/job_keys.h lists
// them. The store operations per agent per attempt are a constant number (join: 3, attempt: 2,
// report: 3), whatever the number of agents.
//
// Thread safety: the methods are called from the agent's loop thread; callbacks are posted to
// that loop. The implementation does its blocking store calls on threads of its own.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agent/observability/event_log.h"
#include "agent/supervision/failure_report.h"
#include "agent/supervision/stall_verdict.h"
#include "common/clock.h"
#include "common/status.h"

namespace boost::asio {
class io_context;
}
namespace cpprun::rendezvous {
class Store;
}

namespace cpprun::agent {

class MemberLiveness;    // liveness.h
struct LivenessOptions;  // liveness.h

struct AgentInfo {
  std::string host;
  int nproc = 0;
  std::string id;           // unique per agent process (host, pid, random)
  int scheduler_rank = -1;  // the scheduler's rank for this agent (SLURM_PROCID, ...), -1: none
  // "host:port" of the workers' store this agent serves, when every agent serves one (the etcd
  // backend: the round's node 0's becomes MASTER_ADDR:MASTER_PORT); empty otherwise.
  std::string store_endpoint = {};
};

// The outcome of a rendezvous round: fixed for the whole job with the static rendezvous, new
// for every attempt with the elastic one.
struct Membership {
  int group_rank = 0;
  int group_world_size = 1;
  int base_rank = 0;   // global rank of this agent's local rank 0
  int world_size = 0;  // workers in the whole job
  // By group rank. Empty when this agent learnt the round from its own assignment only (elastic:
  // rdzv/round/<r>/assigned/<slot>, job_keys.h); the coordinator reads the round's members
  // document (`round`) when it needs them (it decides, or, on etcd, it watches the members).
  std::vector<AgentInfo> agents;
  int round = -1;  // elastic: the round of this membership; -1: static
  // Node 0's AgentInfo::store_endpoint (the etcd backend's workers' store), or empty.
  std::string node0_store_endpoint = {};
  // membersDigest(agents) (job_keys.h), also when `agents` is empty; empty: not computed.
  std::string members_digest = {};
};

struct AttemptStart {
  int attempt = 0;  // the job's attempt number (an agent joining late starts at a later one)
  Membership membership;
  std::string nccl_unique_id_hex;  // the host's, the same on every node; empty without NCCL
  // Above nccl_ranks_per_id ranks: the comma-joined ids for ncclCommInitRankScalable, each made
  // by the node of its ranks (nccl_id_groups.h), the same list on every node; else empty.
  std::string nccl_unique_ids_hex = {};
};

// How this agent's workers ended in one attempt.
struct AttemptReport {
  enum class Kind { kSucceeded, kFailed, kStopped, kSignalled, kStartFailed };
  Kind kind = Kind::kSucceeded;
  int signal = 0;     // kSignalled
  std::string error;  // kStartFailed
  std::vector<WorkerFailure> failures;
  // A stall (this node's or a peer's) stopped the attempt: every rank's state when it did
  // (stall_verdict.h), for the decider's verdict. Empty otherwise.
  std::vector<RankState> rank_states;
};

// An elastic agent that waited to join (a spare) finds the job over: the join's Status's
// message starts with this (code kAlreadyExists); the agent exits 0, it was not needed.
inline constexpr const char* kJobOverBeforeJoin = "the job ended before this node could join it";
// A spare asked to leave (drain) while it waited: the join's Status's message starts with this
// (code kAlreadyExists); the agent exits 0, it left.
inline constexpr const char* kLeftWhileSpare = "this node left the job while it waited as a spare";
// A node the decider excluded from the job (node_exclusion.h): it leaves, the others re-form.
struct ExcludedNode {
  int rank = -1;  // its group rank in the attempt
  std::string host;
  std::string agent_id;
  std::string reason;  // "its workers caused 3 failures within 3600 s (...)"
};

// The host's decision for the whole job after an attempt.
struct JobDecision {
  enum class Kind { kRestart, kSucceeded, kFailed, kStopped };
  Kind kind = Kind::kSucceeded;
  int signal = 0;  // kStopped: the signal an agent received (also set on a kFailed a start
                   // failure decided: restart_policy.h ranks that above the signal)
  std::vector<WorkerFailure> failures;  // kFailed: every node's, with host; root cause first
  std::string summary;                  // one line: who failed first, or why the job stopped
  int restarts_used = 0;  // of the job's budget (a re-formed group after a membership change
                          // is a new attempt but does not use the budget)
  bool membership_change = false;  // kRestart because agents were lost or are waiting to join
  // kRestart: the node that leaves the job because its workers kept failing; nullopt: none.
  std::optional<ExcludedNode> excluded;
};

// What the rendezvous has done, for /status and /metrics.
struct RendezvousProgress {
  int round = -1;  // the last round begun (static: 0, the one join)
  int rounds_completed = 0;
  double last_duration_s = 0;  // of the last completed round, from this agent's join
  int nodes = 0;               // in the last completed round
  int world_size = 0;
  std::string waiting_for;  // what the agent waits for now, "" when it does not
};

class JobCoordinator {
 public:
  using StartDone = std::function<void(Result<AttemptStart>)>;
  using DecisionDone = std::function<void(Result<JobDecision>)>;
  // Another agent claimed the attempt's stop (or an agent was lost): tear the workers down.
  // `signal` is the signal that agent received and forwarded (its workers get it; so should
  // these: a scheduler's SIGUSR1 means "checkpoint", not "die"), 0 for a failure or a loss.
  // `stall`: that agent's ranks stalled (announceStall): take a snapshot of every rank before
  // the teardown, for the job's verdict on who caused the hang.
  using PeerStop =
      std::function<void(int restart_count, const std::string& reason, int signal, bool stall)>;
  // The store cannot be reached any more (this agent is cut off from the job).
  using Lost = std::function<void(const Status&)>;
  // Host only, run on the loop before every attempt: clear the workers' keys and make the
  // attempt's NCCL id (empty without NCCL).
  using HostPrepare = std::function<std::string(int restart_count)>;

  virtual ~JobCoordinator() = default;
  virtual void beginAttempt(int restart_count, StartDone done) = 0;
  // This agent's workers failed (signal 0) or it received `signal`: claim the attempt's stop.
  virtual void announceStop(int restart_count, const std::string& reason, int signal) = 0;
  // This agent's ranks stalled: claim the attempt's stop as a stall (the others snapshot their
  // ranks before they tear down, stall_verdict.h).
  virtual void announceStall(int restart_count, const std::string& reason) {
    announceStop(restart_count, reason, 0);
  }
  virtual void endAttempt(int restart_count, const AttemptReport& report, DecisionDone done) = 0;
  // This agent asks to leave the job during attempt `restart_count` (drain: SIGPWR or POST
  // /leave). `done` (on the loop) gets OK once the attempt's stop is claimed for the leave
  // (every other node tears down and the group re-forms without this one, no restart budget
  // used), or kInvalidArgument / kAlreadyExists naming why the leave is refused: the job is not
  // elastic, this agent serves the job's store (c10d), the others would be fewer than min_nodes
  // even with the spares waiting, or the attempt is not running or already stopping.
  // A spare (waitingAsSpare()) is accepted at once: it gives up its place in the next round
  // within one keep-alive interval.
  using LeaveDone = std::function<void(Status)>;
  virtual void requestLeave(int restart_count, const std::string& reason, LeaveDone done) {
    (void)restart_count;
    (void)reason;
    done(Status(StatusCode::kInvalidArgument, "this job cannot lose a node"));
  }
  // Any thread.
  virtual RendezvousProgress progress() const = 0;
  // Whether this agent waits as a hot spare now (rendezvous_rounds.h). Any thread.
  virtual bool waitingAsSpare() const { return false; }
  // --warm-restart: the modules this node's warm process holds, for the job's hot spares
  // (warm_start_launcher.h); written to kWarmImportsKey on the control thread. Best effort.
  virtual void shareWarmImports(const std::string& record) { (void)record; }
};

// The coordination seam: where the coordinator gets its connections to the job's store. The job
// protocol speaks only rendezvous::Store operations, so any backend serves: cpprun's TCP store
// (tcpStoreConnector), etcd, or one process's MemoryStore in tests.
struct StoreConnector {
  // Opens a new, independent connection (the coordinator holds two: one for its requests, one
  // for its watcher). Throws rendezvous::StoreTimeout when none can be had within
  // `connect_timeout`, rendezvous::StoreError for any other failure. Every request on the
  // connection must answer within `request_timeout` (waits: their own timeout) or throw
  // StoreTimeout; a connection that breaks throws StoreError. Called from the coordinator's
  // threads, one call at a time.
  std::function<std::unique_ptr<rendezvous::Store>(std::chrono::milliseconds connect_timeout,
                                                   std::chrono::milliseconds request_timeout)>
      connect;
  // The store in messages: "the job's store at 10.0.0.1:29500 (served by the store host's
  // agent)" ("lost <where>: ...").
  std::string where;
  // Who must be up before connecting succeeds: "the store host (node 0) at 10.0.0.1:29500"
  // ("waiting for <server> to accept connections").
  std::string server;
  // The backend's own way of telling live agents from lost ones (etcd: leases and watches);
  // empty: heartbeat counters in the store (HeartbeatLiveness). Called once per agent, from
  // the coordinator's control thread after its first connection; throws as connect() does.
  std::function<std::unique_ptr<MemberLiveness>(const LivenessOptions& options)> liveness;
};

// cpprun's TCP store at host:port; `server_name` names the agent that serves it ("the store
// host (node 0)"). Retries connecting every few milliseconds: agents usually start within
// moments of each other.
// `secret`: the job's secret, proven on every connection (rendezvous/store_auth.h); empty: none.
StoreConnector tcpStoreConnector(const std::string& host, int port, const std::string& server_name,
                                 const std::string& secret = "");

struct StoreCoordinatorOptions {
  // Where the job's store is. Empty `store.connect`: cpprun's TCP store at store_host:store_port
  // (the host agent connects to its own store).
  StoreConnector store;
  std::string store_host;
  int store_port = 0;
  bool is_host = false;  // this agent decides for the job (today: the one that serves the store)
  // --rdzv-id: the job's keys live in its namespace, "cpprun/<run_id>/" (job_keys.h), and an
  // agent refuses a store served by another run id's agent (kServedRunIdKey). Empty: "none".
  std::string run_id;
  // The job's secret (rendezvous/store_auth.h): the TCP store's clients prove it; an agent without
  // one refuses a store that requires it, naming it. Unused with etcd (etcd's own TLS and RBAC).
  std::string secret;
  // The etcd backend: no agent is special. The agent in slot min_nodes closes a round, any
  // other in its place when its members do not come (the first compareSet of the members wins),
  // the decider of an attempt is its round's node 0 (is_host is ignored), every agent watches
  // every member's liveness, and when node 0 is lost the lowest-ranked live member decides in
  // its place (the first compareSet of the decision wins). Elastic only.
  bool host_per_round = false;
  // Static: this agent's fixed rank and the fixed number of agents.
  int group_rank = 0;
  int group_world_size = 1;
  // Elastic (--rdzv-backend c10d): rounds of min_nodes..max_nodes agents, ranks by the
  // scheduler's rank where known, else by the previous round's rank, else by join order; a
  // round closes at max_nodes, or last_call_timeout after min_nodes have joined.
  bool elastic = false;
  int min_nodes = 1;
  int max_nodes = 1;
  std::chrono::milliseconds last_call_timeout{std::chrono::seconds(30)};
  int max_restarts = 0;
  // Exclusion (node_exclusion.h): an elastic job's node whose workers caused exclude_after
  // failures within exclude_window leaves it. exclude_after 0: never.
  int exclude_after = 3;
  std::chrono::seconds exclude_window{std::chrono::hours(1)};
  AgentInfo self;
  std::chrono::milliseconds join_timeout{std::chrono::seconds(600)};
  std::chrono::milliseconds keep_alive_interval{std::chrono::seconds(5)};
  int keep_alive_max_attempt = 3;
  // How long the host keeps serving after the final decision for the others to read it.
  std::chrono::milliseconds final_linger{std::chrono::seconds(10)};
  // The scheduler's names of the nodes by rank (Slurm's step node list), for "waiting for"
  // notices; empty: nodes are named by rank.
  std::vector<std::string> expected_hosts;
  EventLog* event_log = nullptr;  // may be null; must outlive the coordinator
  // NCCL bootstrap at scale (nccl_id_groups.h): above nccl_ranks_per_id ranks (0: never) every
  // node makes the ids of its ranks with make_nccl_id (filled in by the agent; called on the
  // coordinator's thread) and all read all of them through the store, within join_timeout.
  int nccl_ranks_per_id = 0;
  std::function<Result<std::string>()> make_nccl_id;
  // The c10d store host: removes every key under a prefix (namespaced) from the store it serves
  // (TcpStoreServer::eraseKeysWithPrefix; the TCPStore protocol has no prefix delete), called on
  // the loop. Empty: the decider deletes through its connection (Store::deletePrefix: etcd).
  // Past attempts' keys go this way (stale_job_keys.h).
  std::function<size_t(const std::string& prefix)> erase_prefix;
  // --warm-restart: while this agent waits as a hot spare, the coordinator watches the job's
  // module record (kWarmImportsKey, shareWarmImports) and hands it, unread, to this (on the
  // loop) once it is there. Empty: not watched.
  std::function<void(const std::string& record)> on_warm_imports;
  // Where the coordinator and its liveness measure waits, silences and bounds (tests: a
  // ManualClock). Not null; must outlive the coordinator.
  const MonotonicClock* clock = &realClock();
};

// REQUIRES: `io` outlives the coordinator, and runs while any request is pending.
// `host_prepare` is required when group_rank == 0.
std::unique_ptr<JobCoordinator> makeStoreCoordinator(boost::asio::io_context& io,
                                                     StoreCoordinatorOptions options,
                                                     JobCoordinator::HostPrepare host_prepare,
                                                     JobCoordinator::PeerStop on_peer_stop,
                                                     JobCoordinator::Lost on_lost);

}  // namespace cpprun::agent
