#include "agent/local_agent.h"

#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <future>
#include <memory>
#include <optional>
#include <set>
#include <thread>

#include "agent/coordination/job_keys.h"
#include "agent/coordination/single_node_rendezvous.h"
#include "agent/health/health_gate.h"
#include "agent/nccl/nccl_unique_id.h"
#include "agent/observability/agent_http_routes.h"
#include "agent/observability/agent_status.h"
#include "agent/observability/event_log.h"
#include "agent/observability/http_access.h"
#include "agent/observability/http_server.h"
#include "agent/processes/child_reaper.h"
#include "agent/processes/process_launcher.h"
#include "agent/processes/signal_policy.h"
#include "agent/supervision/failure_report.h"
#include "common/asio.h"
#include "common/logging.h"
#include "common/network_address.h"
#include "rendezvous/tcp_store_server.h"

namespace cpprun::agent {

namespace {

// Whether a TCP connection to host:port (0.0.0.0 / :: mean this machine) is accepted now.
bool somethingAccepts(const std::string& host, uint16_t port) {
  std::string target = host;
  if (target.empty() || target == "0.0.0.0") target = "127.0.0.1";
  if (target == "::") target = "::1";
  auto found = resolveTcp(target, port);
  if (!found.isOk()) return false;
  for (const ResolvedAddress& a : found.value()) {
    const int fd = ::socket(a.family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    const bool accepted = ::connect(fd, a.sockaddrPtr(), a.length) == 0;
    ::close(fd);
    if (accepted) return true;
  }
  return false;
}

// NCCL as the agent's first attempt finds it: the provider (or why there is none) and, when
// asked for, the first attempt's id (or NCCL's error).
struct NcclStart {
  std::unique_ptr<NcclUniqueIdProvider> provider;
  Status load_error;
  std::optional<Result<std::string>> first_id;
};

NcclStart startNccl(const std::string& library, bool make_first_id) {
  NcclStart start;
  auto provider = NcclUniqueIdProvider::create(library);
  if (!provider.isOk()) {
    start.load_error = provider.status();
    return start;
  }
  start.provider = std::move(provider).value();
  if (make_first_id) start.first_id = start.provider->next();
  return start;
}

// The attempts' NCCL unique ids, one per attempt for the whole job, made by the agent that makes
// them (one node: this one; multi-node: node 0, which sends them with each attempt's "go").
//
// Loading libnccl (a library of ~200 MB: ~1.5 ms here) and, on one node, its first
// ncclGetUniqueId (NCCL's set-up and its bootstrap root's thread: ~0.6 ms) run on a thread of
// their own from construction, beside the set-up of the store, the loop and the supervisor; the
// first attempt waits for them only when it builds the workers' environment. Multi-node: the
// nodes other than 0 get the ids with the attempt's "go" and need not load the library at all.
// Whether this is node 0 is known once the store is (or is not) served here, so a node that may
// host it (host_store_if_free) loads the library and drops it if it does not (setMakesIds).
//
// Thread safety: the loop thread only (the load's thread is its own).
class NcclIds {
 public:
  explicit NcclIds(const LocalAgentOptions& options) {
    if (options.use_nccl &&
        (!options.multi_node || options.host_store || options.host_store_if_free)) {
      loading_ = std::async(std::launch::async, startNccl, options.nccl_library,
                            !options.multi_node.has_value());
    }
  }

  // Whether this agent makes the job's ids (known once the store election is over).
  void setMakesIds(bool makes_ids) { makes_ids_ = makes_ids; }

  // The next attempt's id; empty without NCCL (said once) or when NCCL fails (said each time).
  std::string next() {
    finishLoad();
    if (!provider_) return "";
    Result<std::string> id = internalError("no id");
    if (first_id_) {
      id = std::move(*first_id_);
      first_id_.reset();
    } else {
      id = provider_->next();
    }
    if (!id.isOk()) {
      CPPRUN_LOG(kWarn) << "ncclGetUniqueId failed: " << id.status().message()
                        << "; CPPRUN_NCCL_UNIQUE_ID is not set for this attempt";
      return "";
    }
    return id.value();
  }

  // `count` fresh ids, comma-joined (ncclCommInitRankScalable's); empty when there is no NCCL
  // or one call fails (said, and the workers keep the single id).
  std::string nextIds(int count) {
    finishLoad();
    if (!provider_) return "";
    std::vector<std::string> ids;
    for (int i = 0; i < count; ++i) {
      Result<std::string> id = provider_->next();
      if (!id.isOk()) {
        CPPRUN_LOG(kWarn) << "ncclGetUniqueId failed for id " << i << " of " << count << ": "
                          << id.status().message() << "; CPPRUN_NCCL_UNIQUE_IDS is not set";
        return "";
      }
      ids.push_back(std::move(id).value());
    }
    return joinNcclIds(ids);
  }

 private:
  void finishLoad() {
    if (!loading_.valid()) return;
    NcclStart start = loading_.get();
    if (!makes_ids_) return;
    if (!start.provider) {
      CPPRUN_LOG(kInfo) << "NCCL not loadable (" << start.load_error.message()
                        << "); CPPRUN_NCCL_UNIQUE_ID is not set";
      return;
    }
    provider_ = std::move(start.provider);
    first_id_ = std::move(start.first_id);
  }

  std::future<NcclStart> loading_;
  bool makes_ids_ = false;
  std::unique_ptr<NcclUniqueIdProvider> provider_;
  std::optional<Result<std::string>> first_id_;
};

// The ids a node makes for the scalable init in a multi-node job (StoreCoordinatorOptions::
// make_nccl_id): NCCL loaded on the first call only, so a job at or below the threshold never
// loads it on the nodes other than 0.
// Thread safety: next() from any thread (the coordinator's).
class LazyNcclIds {
 public:
  explicit LazyNcclIds(std::string library) : library_(std::move(library)) {}
  Result<std::string> next() {
    std::call_once(loaded_, [this] {
      auto made = NcclUniqueIdProvider::create(library_);
      if (made.isOk()) {
        provider_ = std::move(made).value();
      } else {
        load_error_ = made.status();
      }
    });
    if (!provider_) return load_error_;
    return provider_->next();
  }

 private:
  std::string library_;
  std::once_flag loaded_;
  std::unique_ptr<NcclUniqueIdProvider> provider_;
  Status load_error_;
};

namespace asio = boost::asio;

// How long POST /leave waits for the loop's verdict before it answers 202 without one.
constexpr std::chrono::seconds kLeaveAnswerBound{10};
std::string formatLeaveBound() { return std::to_string(kLeaveAnswerBound.count()) + " s"; }

// The job's store as this agent sees it: the server when this agent serves it (null when it is
// a client of another's), and the address the workers reach it at.
struct StoreEndpoint {
  std::unique_ptr<rendezvous::TcpStoreServer> server;
  std::string host;
  int port = 0;
};

// Serves the store when this agent hosts it; with host_store_if_free, joins the one already
// served at the endpoint instead.
Result<StoreEndpoint> openStore(asio::io_context& io, const LocalAgentOptions& options) {
  StoreEndpoint endpoint{nullptr, options.store_host, options.store_port};
  if (!options.host_store && !options.host_store_if_free) return endpoint;
  rendezvous::TcpStoreServerOptions so;
  so.host = options.store_bind_host.empty() ? options.store_host : options.store_bind_host;
  so.port = static_cast<uint16_t>(options.store_port);
  so.no_handshake_dialect = options.store_no_handshake_dialect;
  so.secret = options.store_secret;
  // Every worker of the job connects (and every agent): with more than one accept queue holds,
  // the store listens on several sockets so a job's start is not left to SYN retries.
  size_t nodes = 1;
  if (options.multi_node) {
    nodes = static_cast<size_t>(std::max(1, options.multi_node->elastic
                                                ? options.multi_node->max_nodes
                                                : options.multi_node->group_world_size));
  }
  so.expected_clients = nodes * static_cast<size_t>(std::max(1, options.nproc)) + nodes;
  // Elastic agents all try to host the store on the endpoint; the first wins. Two binds with
  // SO_REUSEADDR at the same instant can both succeed and then both listens fail, leaving no
  // host at all (seen under ctest -j2). So "in use" counts only when something accepts there;
  // otherwise the election runs again after a random pause of a few milliseconds.
  auto created = rendezvous::TcpStoreServer::create(io, so);
  for (int attempt = 1; !created.isOk() && options.host_store_if_free &&
                        created.status().code() == StatusCode::kAlreadyExists && attempt <= 50 &&
                        !somethingAccepts(so.host, so.port);
       ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1 + (::getpid() + attempt * 7) % 13));
    created = rendezvous::TcpStoreServer::create(io, so);
  }
  if (created.isOk()) {
    endpoint.server = std::move(created).value();
    if (options.store_bind_host.empty()) endpoint.host = endpoint.server->host();
    endpoint.port = endpoint.server->port();
    if (options.host_store_if_free) {
      CPPRUN_LOG(kInfo) << "this agent serves the job's store on "
                        << formatHostPort(so.host, endpoint.port);
    }
  } else if (options.host_store_if_free && created.status().code() == StatusCode::kAlreadyExists) {
    CPPRUN_LOG(kInfo) << "another process holds " << formatHostPort(so.host, so.port)
                      << "; this agent joins the store there (" << created.status().message()
                      << ")";
  } else {
    return created.status();
  }
  return endpoint;
}

// The workers' store of an attempt when every agent serves one: the round's node 0's, as its
// join record gives it (formatHostPort). One that does not parse leaves the context's store.
void useRoundStore(const Membership& membership, AttemptContext& context) {
  const std::string& endpoint = membership.node0_store_endpoint;
  if (endpoint.empty()) return;
  auto address = parseNetworkAddress(endpoint);
  if (!address.isOk()) {
    CPPRUN_LOG(kWarn) << "the round's node 0 store endpoint " << address.status().message()
                      << "; the workers keep the store at "
                      << formatHostPort(context.store_host, context.store_port);
    return;
  }
  context.store_host = address.value().host;
  context.store_port = address.value().port;
}

// One node's agent: its parts, as members in the order they are made — each may use those above
// it, none those below it — and destroyed in reverse. open() makes the parts that can fail;
// run() drives the loop until the job ends and takes the parts down in order.
//
// The one dependency that points up: the coordinator's peer-stop and lost callbacks reach the
// supervisor made after it. They go through this object (onPeerStop, onCoordinatorLost), and
// they are posted to the loop, which runs only once every part exists.
//
// Thread safety: one thread, the caller's, which runs the loop.
class LocalAgent {
 public:
  LocalAgent(const LocalAgentOptions& options, MakeAttempt make_attempt)
      : options_(options), make_attempt_(std::move(make_attempt)), nccl_ids_(options_) {}
  ~LocalAgent() { stopOutput(); }
  LocalAgent(const LocalAgent&) = delete;
  LocalAgent& operator=(const LocalAgent&) = delete;

  // Opens the parts that can fail: the event log, the store, the HTTP server.
  Status open();
  // Runs the job to its end. REQUIRES: open() succeeded.
  Result<JobOutcome> run();

 private:
  void makeCoordinatorAndSupervisor();
  Status openMetrics();
  void armSignals();
  // The host's part of every attempt: a clean store and the attempt's NCCL id (empty: none).
  std::string prepareHostAttempt(int restart_count);
  // The supervisor's PrepareAttempt: the attempt's context, then the caller's workers.
  Result<AttemptSpec> prepareAttempt(int restart_count);
  AgentStatus statusNow() const;
  // Drain: asks the job to go on without this node (`source`: "SIGPWR", "POST /leave"); `done`
  // gets the verdict on the loop. Loop thread.
  void requestLeave(const std::string& source, std::function<void(const Status&)> done);
  // POST /leave, on the HTTP thread: hands the request to the loop, waits for its verdict.
  HttpResponse leaveOverHttp();
  // The loop is over: the console and log-file writers finish (bounded) and stop.
  void stopOutput();
  // On the loop: a snapshot for the HTTP thread, while the endpoint serves.
  void publishStatus();
  // The system launcher, behind the warm-start one with --warm-restart (its ready warm process's
  // modules are shared with the job's spares through the coordinator).
  std::unique_ptr<ProcessLauncher> makeLauncher() {
    auto system = makeSystemProcessLauncher(options_.containment);
    if (!options_.warm_start) return system;
    auto warm = std::make_unique<WarmStartLauncher>(
        io_, std::move(system), *options_.warm_start,
        [this](const std::vector<std::string>& modules) {
          if (coordinator_) coordinator_->shareWarmImports(warmImportsRecord(modules));
        });
    warm_ = warm.get();
    return warm;
  }

  const LocalAgentOptions options_;
  const MakeAttempt make_attempt_;
  asio::io_context io_{1};
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  NcclIds nccl_ids_;  // loading from construction
  // The console and log-file writers (threads of their own): first made, last stopped.
  // The caller's (which then stops them) or the agent's own.
  const bool own_sinks_ = options_.supervisor.sinks == nullptr;
  std::shared_ptr<OutputSinks> sinks_ =
      own_sinks_ ? std::make_shared<OutputSinks>(options_.supervisor.output.console_stdout_fd,
                                                 options_.supervisor.output.console_stderr_fd)
                 : options_.supervisor.sinks;
  std::unique_ptr<EventLog> event_log_;  // null without --event-log
  StoreEndpoint store_;                  // store_.server null when another agent serves it
  // --warm-restart: the warm-start launcher in front of the system one (warm_ points at it).
  WarmStartLauncher* warm_ = nullptr;
  std::unique_ptr<ProcessLauncher> launcher_ = makeLauncher();
  // --stdin: cpprun's stdin for the workers that read it; null with --stdin none.
  std::unique_ptr<StdinForwarder> stdin_ =
      options_.stdin_mode == StdinMode::kNone
          ? nullptr
          : std::make_unique<StdinForwarder>(io_, options_.stdin_mode, STDIN_FILENO);
  std::unique_ptr<SingleNodeRendezvous> single_node_;  // one node
  std::unique_ptr<JobCoordinator> coordinator_;        // multi-node
  // The health check before every join (multi-node) or attempt (one node) and the gate between
  // the supervisor and the coordinator (health_gate.h): whether this node takes part in the next
  // round; on one node the gate has no coordinator and is null when there is nothing to check.
  std::unique_ptr<HealthCheck> health_;
  std::unique_ptr<HealthGate> gate_;
  std::unique_ptr<Supervisor> supervisor_;
  // --metrics-port: the HTTP endpoint on a thread of its own, reading the snapshots this loop
  // publishes to status_board_ (agent_http_routes.h); both null without the option.
  std::unique_ptr<StatusBoard> status_board_;
  std::unique_ptr<HttpServerThread> metrics_;
  std::unique_ptr<ChildReaper> reaper_;
  asio::signal_set signals_{io_};
  std::set<int> ignored_signals_;  // caught, not handled, already logged once
  bool output_stopped_ = false;
  bool leave_requested_ = false;       // a leave was accepted; loop thread
  std::optional<JobOutcome> outcome_;  // set when the supervisor is done
};

Status LocalAgent::open() {
  // From here the agent's log lines queue behind the workers' on the console writer's thread.
  if (own_sinks_) sinks_->routeLogHere();
  if (!options_.event_log_path.empty() || options_.event_log_console) {
    auto opened =
        EventLog::open(options_.event_log_path, options_.host_name, options_.event_log_console);
    if (!opened.isOk()) return opened.status();
    event_log_ = std::move(opened).value();
  }
  auto store = openStore(io_, options_);
  if (!store.isOk()) return store.status();
  store_ = std::move(store).value();
  // The store's job: set before the loop answers anyone, so an agent of another run id that
  // reaches this store refuses to join it (job_keys.h, kServedRunIdKey).
  if (options_.multi_node && store_.server && !options_.multi_node->host_per_round) {
    store_.server->set(kServedRunIdKey, storedRunId(options_.multi_node->run_id));
  }
  nccl_ids_.setMakesIds(!options_.multi_node || store_.server != nullptr);
  makeCoordinatorAndSupervisor();
  if (Status s = openMetrics(); !s.isOk()) return s;
  reaper_ = std::make_unique<ChildReaper>(io_, [this](pid_t pid, int status) {
    if (health_ && health_->onChildExit(pid, status)) return;
    supervisor_->onChildExit(pid, status);
  });
  // Every signal that would end the agent by its default action is caught (signal_policy.h):
  // the handled ones stop the job in order, the rest are logged and ignored.
  std::vector<int> caught = signalsToTakeOver();
  for (int signo : options_.signals_to_handle) {
    if (std::find(caught.begin(), caught.end(), signo) == caught.end()) caught.push_back(signo);
  }
  for (int signo : caught) signals_.add(signo);
  // Console events, not stops: the terminal's size, and continuing (maybe in the foreground).
  signals_.add(SIGWINCH);
  signals_.add(SIGCONT);
  armSignals();
  // Under the guardian they arrive blocked (so none ended the agent before this point); from
  // here the loop catches them, and SIGCHLD reaches the reaper.
  caught.push_back(SIGCHLD);
  const sigset_t unblocked = signalSetOf(caught);
  ::pthread_sigmask(SIG_UNBLOCK, &unblocked, nullptr);
  return Status::ok();
}

void LocalAgent::makeCoordinatorAndSupervisor() {
  SupervisorOptions supervisor_options = options_.supervisor;
  supervisor_options.event_log = event_log_.get();
  supervisor_options.sinks = sinks_;
  supervisor_options.stdin_forwarder = stdin_.get();
  supervisor_options.track_progress =
      supervisor_options.track_progress || options_.metrics_port >= 0;
  if (options_.multi_node) {
    const bool is_store_host = store_.server != nullptr;
    StoreCoordinatorOptions co = *options_.multi_node;
    co.event_log = event_log_.get();
    co.is_host = is_store_host;
    co.store_host = is_store_host ? "127.0.0.1" : store_.host;
    if (is_store_host && isIpv6Literal(store_.host)) co.store_host = "::1";
    co.store_port = store_.port;
    // Every agent serves a store (the etcd backend): the others learn it from its join record
    // and the round's node 0's is the workers' store.
    if (co.host_per_round && store_.server) {
      co.self.store_endpoint = formatHostPort(store_.host, store_.port);
    }
    co.max_restarts = options_.supervisor.max_restarts;
    // c10d: the job's keys are in the store this agent serves; past attempts' go from it here.
    if (is_store_host && !co.host_per_round && store_.server) {
      co.erase_prefix = [this](const std::string& prefix) {
        return store_.server->eraseKeysWithPrefix(prefix);
      };
    }
    if (options_.use_nccl) {
      co.nccl_ranks_per_id = options_.nccl_ranks_per_id;
      auto ids = std::make_shared<LazyNcclIds>(options_.nccl_library);
      co.make_nccl_id = [ids] { return ids->next(); };
    }
    if (warm_ != nullptr) {
      // A hot spare pre-warms with what the job's workers import (warm_start_launcher.h).
      co.on_warm_imports = [this](const std::string& record) {
        auto modules = parseWarmImportsRecord(record);
        if (!modules.isOk()) {
          CPPRUN_LOG(kWarn) << "--warm-restart: no pre-warming: the job's store holds a bad "
                            << "module record (" << modules.status().message() << ")";
          return;
        }
        warm_->prewarm(modules.value());
      };
    }
    coordinator_ = makeStoreCoordinator(
        io_, co, [this](int restart_count) { return prepareHostAttempt(restart_count); },
        [this](int n, const std::string& reason, int signal, bool stall) {
          if (supervisor_) supervisor_->onPeerStop(n, reason, signal, stall);
        },
        [this](const Status& s) {
          if (supervisor_) supervisor_->onCoordinatorLost(s);
        });
    health_ = std::make_unique<HealthCheck>(io_, *launcher_, options_.health);
    HealthGateOptions go;
    go.agent_id = co.self.id;
    // A static job cannot go on without any of its nodes, and on the c10d backend the store
    // host's agent is the job's store: these join and fail the job rather than leave it.
    go.must_join = !co.elastic || (is_store_host && !co.host_per_round);
    go.event_log = event_log_.get();
    gate_ = std::make_unique<HealthGate>(*coordinator_, *health_, go);
    supervisor_options.coordinator = gate_.get();
    supervisor_options.amend_outcome = [this](JobOutcome& outcome) {
      outcome.departures = gate_->departures();
      if (gate_->left() == HealthGate::Left::kUnhealthy || !gate_->failure().isOk()) {
        outcome.kind = JobOutcome::Kind::kUnhealthy;
        outcome.error = gate_->failure().isOk()
                            ? Status(StatusCode::kUnavailable, gate_->leftReason())
                            : gate_->failure();
      } else if (gate_->left() == HealthGate::Left::kExcluded) {
        outcome.kind = JobOutcome::Kind::kExcluded;
        outcome.error = Status(StatusCode::kUnavailable, gate_->leftReason());
      }
    };
  } else {
    single_node_ = std::make_unique<SingleNodeRendezvous>(event_log_.get(), options_.host_name);
    // One node: the same check before every attempt, the first and each restart; a failure ends
    // the job (exit 5) before the attempt's workers start (health_gate.h).
    health_ = std::make_unique<HealthCheck>(io_, *launcher_, options_.health);
    if (health_->enabled()) {
      HealthGateOptions go;
      go.event_log = event_log_.get();
      gate_ = std::make_unique<HealthGate>(*health_, go);
      // The check's failure fails the attempt's preparation (prepareAttempt).
      supervisor_options.before_attempt = [this](int restart_count, std::function<void()> start) {
        gate_->checkBeforeAttempt(restart_count,
                                  [start = std::move(start)](const Status&) { start(); });
      };
      supervisor_options.amend_outcome = [this](JobOutcome& outcome) {
        if (gate_->failure().isOk()) return;
        outcome.kind = JobOutcome::Kind::kUnhealthy;
        outcome.error = gate_->failure();
      };
    }
  }
  supervisor_ = std::make_unique<Supervisor>(
      io_, *launcher_, supervisor_options,
      [this](int restart_count) { return prepareAttempt(restart_count); },
      [this](const JobOutcome& result) {
        outcome_ = result;
        io_.stop();
      });
}

Status LocalAgent::openMetrics() {
  if (options_.metrics_port < 0) return Status::ok();
  HttpServerOptions ho;
  ho.host = options_.metrics_host;
  ho.port = static_cast<uint16_t>(options_.metrics_port);
  // The HTTP thread only reads the board and posts to the loop: it never calls into the
  // loop's objects, and no request waits for the loop longer than the board's max_wait.
  status_board_ = std::make_unique<StatusBoard>(statusNow(), StatusBoard::Options{}, [this] {
    asio::post(io_, [this] { publishStatus(); });
  });
  ho.post_handler = agentActionRoutes([this] { return leaveOverHttp(); });
  // A web page in a browser on this node must not reach the routes (DNS rebinding, CSRF).
  ho.access.check_host = true;
  ho.access.host_names = nodeHostNames();
  ho.access.refuse_browser_posts = true;
  ho.access.post_token = options_.metrics_token;
  // Nice +10: under CPU contention HTTP gets about a tenth of what the loop gets.
  auto created = HttpServerThread::start(
      ho, agentStatusRoutes([board = status_board_.get()] { return board->read(); }),
      /*niceness=*/10);
  if (!created.isOk()) {
    return Status(created.status().code(), "--metrics-port: " + created.status().message());
  }
  metrics_ = std::move(created).value();
  CPPRUN_LOG(kInfo) << "metrics on http://" << formatHostPort(metrics_->host(), metrics_->port())
                    << "/metrics (also /healthz, /status; POST /leave drains this node"
                    << (options_.metrics_token.empty() ? "" : ", with the bearer token") << ")";
  emitEvent(event_log_.get(), "metrics_listening",
            {{"address", metrics_->host()}, {"port", metrics_->port()}});
  return Status::ok();
}

void LocalAgent::armSignals() {
  signals_.async_wait([this](const boost::system::error_code& ec, int signo) {
    if (ec) return;
    const auto& handled = options_.signals_to_handle;
    if (signo == SIGWINCH || signo == SIGCONT) {
      if (signo == SIGWINCH) supervisor_->onWindowChange();
      if (signo == SIGCONT && stdin_) stdin_->onContinue();
    } else if (std::find(handled.begin(), handled.end(), signo) != handled.end()) {
      supervisor_->onSignal(signo);
    } else if (signo == kLeaveSignal) {
      CPPRUN_LOG(kInfo) << "received " << signalName(signo) << ": leaving the job";
      requestLeave(signalName(signo), [](const Status&) {});
    } else if (ignored_signals_.insert(signo).second) {
      // Once per signal: a storm of them must not flood the console.
      CPPRUN_LOG(kWarn) << "received " << signalName(signo)
                        << ", which is not in --signals-to-handle: ignored (list it there to "
                           "forward it to the workers and stop the job)";
      emitEvent(event_log_.get(), "signal_ignored", {{"signal", signalName(signo)}});
    }
    armSignals();
  });
}

void LocalAgent::requestLeave(const std::string& source, std::function<void(const Status&)> done) {
  const int attempt = supervisor_->restartCount();
  auto verdict = [this, source, attempt, done = std::move(done)](const Status& s) {
    if (s.isOk()) {
      leave_requested_ = true;
      emitEvent(event_log_.get(), "leave_requested",
                {{"source", source}, {"attempt", attempt}, {"accepted", true}});
      supervisor_->onLeave("drained by " + source);
    } else {
      CPPRUN_LOG(kWarn) << "cannot leave the job (asked by " << source << "): " << s.message();
      emitEvent(
          event_log_.get(), "leave_requested",
          {{"source", source}, {"attempt", attempt}, {"accepted", false}, {"reason", s.message()}});
    }
    done(s);
  };
  if (leave_requested_) {
    verdict(Status(StatusCode::kAlreadyExists, "this node is already leaving the job"));
  } else if (!coordinator_) {
    verdict(Status(StatusCode::kInvalidArgument,
                   "a job of one node cannot go on without it; stop it instead (SIGTERM)"));
  } else if (supervisor_->snapshot().state != "running" && !coordinator_->waitingAsSpare()) {
    verdict(Status(StatusCode::kAlreadyExists,
                   "this node's workers are not running (between attempts, stopping, or waiting "
                   "as a spare); ask again once they run"));
  } else {
    coordinator_->requestLeave(attempt, source, std::move(verdict));
  }
}

HttpResponse LocalAgent::leaveOverHttp() {
  auto answer = std::make_shared<std::promise<Status>>();
  std::future<Status> verdict = answer->get_future();
  asio::post(io_, [this, answer] {
    requestLeave("POST /leave", [answer](const Status& s) { answer->set_value(s); });
  });
  HttpResponse r;
  // The verdict takes a store round trip on the coordinator's thread: bounded by the store's
  // request timeout, well under this.
  if (verdict.wait_for(kLeaveAnswerBound) != std::future_status::ready) {
    r.status = 202;
    r.body = "leave requested; no verdict within " + formatLeaveBound() +
             ": see the agent's log and event log\n";
    return r;
  }
  const Status s = verdict.get();
  if (s.isOk()) {
    r.status = 202;
    r.body = "leaving: this node's workers stop and the other nodes go on without it\n";
  } else {
    r.status = 409;
    r.body = "refused: " + s.message() + "\n";
  }
  return r;
}

std::string LocalAgent::prepareHostAttempt(int restart_count) {
  if (store_.server) {
    size_t erased = store_.server->eraseKeysExcept(kAgentKeyPrefix);
    if (erased > 0) {
      CPPRUN_LOG(kDebug) << "attempt " << restart_count << ": erased " << erased
                         << " store keys of the previous attempt";
    }
  }
  std::string id = nccl_ids_.next();
  if (!id.empty() && store_.server) store_.server->set(kNcclUniqueIdKey, id);
  return id;
}

Result<AttemptSpec> LocalAgent::prepareAttempt(int restart_count) {
  AttemptContext context;
  context.restart_count = restart_count;
  context.store_host = store_.host;
  context.store_port = store_.port;
  if (coordinator_) {
    const auto& start = supervisor_->attemptStart();
    if (!start) return internalError("attempt prepared before the nodes agreed on it");
    // A node that must join failed its health check: its workers do not start, and the job
    // fails naming it (health_gate.h).
    if (gate_ && !gate_->failure().isOk()) return gate_->failure();
    context.membership = start->membership;
    context.nccl_unique_id_hex = start->nccl_unique_id_hex;
    context.nccl_unique_ids_hex = start->nccl_unique_ids_hex;
    if (!context.nccl_unique_ids_hex.empty() && store_.server) {
      store_.server->set(kNcclUniqueIdsKey, context.nccl_unique_ids_hex);
    }
    // Only where every agent serves a store (etcd: the records come from etcd, under its
    // access control). The c10d backend's workers use the store the agents met in, whatever a
    // record in it says: one written by a stranger must not send the workers elsewhere.
    if (options_.multi_node->host_per_round) useRoundStore(start->membership, context);
    return make_attempt_(context);
  }
  // One node: this agent is the host, and its health check must have passed (health_gate.h).
  if (gate_ && !gate_->failure().isOk()) return gate_->failure();
  single_node_->begin();
  context.nccl_unique_id_hex = prepareHostAttempt(restart_count);
  const int nid = ncclIdCount(options_.nproc, options_.nccl_ranks_per_id);
  if (nid > 1 && !context.nccl_unique_id_hex.empty()) {
    context.nccl_unique_ids_hex = nccl_ids_.nextIds(nid);
    if (!context.nccl_unique_ids_hex.empty() && store_.server) {
      store_.server->set(kNcclUniqueIdsKey, context.nccl_unique_ids_hex);
    }
  }
  auto attempt = make_attempt_(context);
  if (attempt.isOk()) single_node_->complete(static_cast<int>(attempt.value().workers.size()));
  return attempt;
}

void LocalAgent::stopOutput() {
  if (output_stopped_ || !own_sinks_) return;
  output_stopped_ = true;
  // The console gets what is queued for a bounded time (a reader who never reads again must
  // not hold the agent forever); the log files get everything, within a minute.
  (void)sinks_->close(kConsoleExitFlush, kFileExitFlush);
}

void LocalAgent::publishStatus() {
  if (metrics_) status_board_->publish(statusNow());
}

AgentStatus LocalAgent::statusNow() const {
  AgentStatus s;
  s.host = options_.host_name;
  s.run_id = options_.run_id;
  s.agent_pid = static_cast<int>(::getpid());
  s.uptime_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  s.max_restarts = options_.supervisor.max_restarts;
  s.stall_timeout_s = std::chrono::duration<double>(options_.supervisor.stall.timeout).count();
  s.supervisor = supervisor_->snapshot();
  s.rendezvous = coordinator_ ? coordinator_->progress() : single_node_->progress();
  if (store_.server) s.store = store_.server->stats();
  s.store_endpoint = formatHostPort(store_.host, store_.port);
  return s;
}

Result<JobOutcome> LocalAgent::run() {
  supervisor_->start();
  if (!outcome_) io_.run();
  // The job is down. From here to the agent's exit no signal may end it before it reports: hold
  // them (the signal set's handlers go with this object).
  const sigset_t held = signalSetOf(terminatingSignals());
  ::pthread_sigmask(SIG_BLOCK, &held, nullptr);
  // The endpoint ends with the job; a refresh it asked for and the loop has not run yet finds
  // metrics_ null and does nothing (the coordinator may be going away below).
  metrics_.reset();
  reaper_->stop();
  // The terminal's modes are the user's again before the report is printed.
  if (stdin_) stdin_->stop();
  if (coordinator_) {
    // Its threads may be in the middle of a store request, and on node 0 that store is served
    // by this loop: keep the loop running until they have left.
    io_.restart();
    std::thread closer([this] {
      coordinator_.reset();
      io_.stop();
    });
    io_.run();
    closer.join();
  }
  if (store_.server) store_.server->stop();
  stopOutput();
  if (!outcome_) return internalError("the agent's event loop ended before the job did");
  return *outcome_;
}

}  // namespace

Result<JobOutcome> runLocalAgent(const LocalAgentOptions& options,
                                 const MakeAttempt& make_attempt) {
  // A worker's closed pipe must be an error code, not the agent's death.
  ::signal(SIGPIPE, SIG_IGN);
  if (!becomeChildSubreaper()) {
    CPPRUN_LOG(kWarn) << "cannot become a child subreaper; orphans of workers may escape";
  }
  LocalAgent agent(options, make_attempt);
  if (Status s = agent.open(); !s.isOk()) return s;
  return agent.run();
}

}  // namespace cpprun::agent
