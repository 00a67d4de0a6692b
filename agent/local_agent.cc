#include "agent/local_agent.h"

#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <future>
#include <optional>
#include <thread>

#include "agent/agent_status.h"
#include "agent/child_reaper.h"
#include "agent/event_log.h"
#include "agent/http_server.h"
#include "agent/nccl_unique_id.h"
#include "agent/process_launcher.h"
#include "common/asio.h"
#include "common/logging.h"
#include "rendezvous/tcp_store_server.h"

namespace cpprun::agent {

namespace {

// Whether a TCP connection to host:port (0.0.0.0 / :: mean this machine) is accepted now.
bool somethingAccepts(const std::string& host, uint16_t port) {
  std::string target = host;
  if (target.empty() || target == "0.0.0.0") target = "127.0.0.1";
  if (target == "::") target = "::1";
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (::getaddrinfo(target.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) {
    return false;
  }
  bool accepted = false;
  for (addrinfo* a = found; a != nullptr && !accepted; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    accepted = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0;
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return accepted;
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

}  // namespace

namespace asio = boost::asio;

Result<JobOutcome> runLocalAgent(const LocalAgentOptions& options,
                                 const MakeAttempt& make_attempt) {
  // A worker's closed pipe must be an error code, not the agent's death.
  ::signal(SIGPIPE, SIG_IGN);
  if (!becomeChildSubreaper()) {
    CPPRUN_LOG(kWarn) << "cannot become a child subreaper; orphans of workers may escape";
  }
  asio::io_context io{1};
  const auto agent_started = std::chrono::steady_clock::now();

  // Loading libnccl (a library of ~200 MB: ~1.5 ms here) and, on one node, its first
  // ncclGetUniqueId (NCCL's set-up and its bootstrap root's thread: ~0.6 ms) run on a thread of
  // their own from here, beside the set-up of the store, the loop and the supervisor; the first
  // attempt waits for them only when it builds the workers' environment. Multi-node: only node 0
  // makes the ids (one per attempt for the whole job, when the attempt starts); the others get
  // them with the attempt's "go" and need not load the library at all. Whether this is node 0
  // is known once the store is (or is not) served here, so a node that may host it
  // (host_store_if_free) loads the library and drops it if it does not.
  std::future<NcclStart> nccl_loading;
  if (options.use_nccl &&
      (!options.multi_node || options.host_store || options.host_store_if_free)) {
    nccl_loading = std::async(std::launch::async, startNccl, options.nccl_library,
                              !options.multi_node.has_value());
  }

  std::unique_ptr<EventLog> event_log;
  if (!options.event_log_path.empty()) {
    auto opened = EventLog::open(options.event_log_path, options.host_name);
    if (!opened.isOk()) return opened.status();
    event_log = std::move(opened).value();
  }
  std::unique_ptr<rendezvous::TcpStoreServer> store;
  std::string store_host = options.store_host;
  int store_port = options.store_port;
  if (options.host_store || options.host_store_if_free) {
    rendezvous::TcpStoreServerOptions so;
    so.host = options.store_bind_host.empty() ? options.store_host : options.store_bind_host;
    so.port = static_cast<uint16_t>(options.store_port);
    so.no_handshake_dialect = options.store_no_handshake_dialect;
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
      store = std::move(created).value();
      if (options.store_bind_host.empty()) store_host = store->host();
      store_port = store->port();
      if (options.host_store_if_free) {
        CPPRUN_LOG(kInfo) << "this agent serves the job's store on " << so.host << ":"
                          << store_port;
      }
    } else if (options.host_store_if_free &&
               created.status().code() == StatusCode::kAlreadyExists) {
      CPPRUN_LOG(kInfo) << "another process holds " << so.host << ":" << so.port
                        << "; this agent joins the store there (" << created.status().message()
                        << ")";
    } else {
      return created.status();
    }
  }
  const bool is_store_host = store != nullptr;

  std::unique_ptr<NcclUniqueIdProvider> nccl;
  std::optional<Result<std::string>> first_nccl_id;
  const bool makes_nccl_ids = !options.multi_node || is_store_host;
  // Called on the loop before the first attempt's workers are made (the load runs meanwhile).
  auto finish_nccl_load = [&] {
    if (!nccl_loading.valid()) return;
    NcclStart start = nccl_loading.get();
    if (!makes_nccl_ids) return;
    if (!start.provider) {
      CPPRUN_LOG(kInfo) << "NCCL not loadable (" << start.load_error.message()
                        << "); CPPRUN_NCCL_UNIQUE_ID is not set";
      return;
    }
    nccl = std::move(start.provider);
    first_nccl_id = std::move(start.first_id);
  };

  auto launcher = makeSystemProcessLauncher();
  std::optional<JobOutcome> outcome;

  // The host's part of every attempt: a clean store and one NCCL id for the whole job.
  auto host_prepare = [&](int restart_count) -> std::string {
    if (store) {
      size_t erased = store->eraseKeysExcept(kAgentKeyPrefix);
      if (erased > 0) {
        CPPRUN_LOG(kDebug) << "attempt " << restart_count << ": erased " << erased
                           << " store keys of the previous attempt";
      }
    }
    finish_nccl_load();
    if (!nccl) return "";
    Result<std::string> id = internalError("no id");
    if (first_nccl_id) {
      id = std::move(*first_nccl_id);
      first_nccl_id.reset();
    } else {
      id = nccl->next();
    }
    if (!id.isOk()) {
      CPPRUN_LOG(kWarn) << "ncclGetUniqueId failed: " << id.status().message()
                        << "; CPPRUN_NCCL_UNIQUE_ID is not set for this attempt";
      return "";
    }
    if (store) store->set(kNcclUniqueIdKey, id.value());
    return id.value();
  };

  Supervisor* supervisor_ptr = nullptr;
  std::unique_ptr<JobCoordinator> coordinator;
  SupervisorOptions supervisor_options = options.supervisor;
  supervisor_options.event_log = event_log.get();
  supervisor_options.track_progress =
      supervisor_options.track_progress || options.metrics_port >= 0;
  RendezvousProgress single_node_rendezvous;  // one node: the trivial rendezvous
  if (options.multi_node) {
    StoreCoordinatorOptions co = *options.multi_node;
    co.event_log = event_log.get();
    co.is_host = is_store_host;
    co.store_host = is_store_host ? "127.0.0.1" : store_host;
    if (is_store_host && store_host.find(':') != std::string::npos) co.store_host = "::1";
    co.store_port = store_port;
    // Every agent serves a store (the etcd backend): the others learn it from its join record
    // and the round's node 0's is the workers' store.
    if (co.host_per_round && store) {
      co.self.store_endpoint =
          (store_host.find(':') != std::string::npos ? "[" + store_host + "]" : store_host) + ":" +
          std::to_string(store_port);
    }
    co.max_restarts = options.supervisor.max_restarts;
    coordinator = makeStoreCoordinator(
        io, co, host_prepare,
        [&](int n, const std::string& reason, int signal) {
          if (supervisor_ptr) supervisor_ptr->onPeerStop(n, reason, signal);
        },
        [&](const Status& s) {
          if (supervisor_ptr) supervisor_ptr->onCoordinatorLost(s);
        });
    supervisor_options.coordinator = coordinator.get();
  }

  auto prepare = [&](int restart_count) -> Result<AttemptSpec> {
    AttemptContext context;
    context.restart_count = restart_count;
    context.store_host = store_host;
    context.store_port = store_port;
    if (coordinator) {
      const auto& start = supervisor_ptr->attemptStart();
      if (!start) return internalError("attempt prepared before the nodes agreed on it");
      context.membership = start->membership;
      context.nccl_unique_id_hex = start->nccl_unique_id_hex;
      // The round's node 0 serves this attempt's workers' store when every agent serves one.
      const std::string& endpoint = start->membership.agents.empty()
                                        ? std::string()
                                        : start->membership.agents.front().store_endpoint;
      if (const size_t colon = endpoint.rfind(':'); colon != std::string::npos) {
        context.store_host = endpoint.substr(0, colon);
        if (context.store_host.size() > 1 && context.store_host.front() == '[') {
          context.store_host = context.store_host.substr(1, context.store_host.size() - 2);
        }
        context.store_port = std::atoi(endpoint.c_str() + colon + 1);
      }
      return make_attempt(context);
    }
    // One node: this agent is the host.
    if (single_node_rendezvous.rounds_completed == 0) {
      emitEvent(event_log.get(), "rendezvous_started",
                {{"round", 0}, {"backend", "single-node"}, {"min_nodes", 1}, {"max_nodes", 1}});
    }
    context.nccl_unique_id_hex = host_prepare(restart_count);
    auto attempt = make_attempt(context);
    if (attempt.isOk() && single_node_rendezvous.rounds_completed == 0) {
      single_node_rendezvous = {0, 1, 0.0, 1, static_cast<int>(attempt.value().workers.size()), ""};
      emitEvent(event_log.get(), "rendezvous_completed",
                {{"round", 0},
                 {"nodes", 1},
                 {"world_size", single_node_rendezvous.world_size},
                 {"group_rank", 0},
                 {"base_rank", 0},
                 {"hosts", {options.host_name}},
                 {"duration_s", 0.0}});
    }
    return attempt;
  };

  Supervisor supervisor(io, *launcher, supervisor_options, prepare, [&](const JobOutcome& result) {
    outcome = result;
    io.stop();
  });
  supervisor_ptr = &supervisor;

  // /healthz, /metrics, /status: answered on this loop from snapshots.
  auto status_now = [&]() {
    AgentStatus s;
    s.host = options.host_name;
    s.run_id = options.run_id;
    s.agent_pid = static_cast<int>(::getpid());
    s.uptime_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - agent_started).count();
    s.max_restarts = options.supervisor.max_restarts;
    s.stall_timeout_s = std::chrono::duration<double>(options.supervisor.stall.timeout).count();
    s.supervisor = supervisor.snapshot();
    s.rendezvous = coordinator ? coordinator->progress() : single_node_rendezvous;
    if (store) s.store = store->stats();
    s.store_endpoint = store_host + ":" + std::to_string(store_port);
    return s;
  };
  std::unique_ptr<HttpServer> metrics;
  if (options.metrics_port >= 0) {
    HttpServerOptions ho;
    ho.host = options.metrics_host;
    ho.port = static_cast<uint16_t>(options.metrics_port);
    auto created = HttpServer::create(io, ho, [&](const std::string& target) {
      const std::string path = target.substr(0, target.find('?'));
      HttpResponse r;
      if (path == "/healthz") {
        r.body = "ok\n";
      } else if (path == "/metrics") {
        r.content_type = "text/plain; version=0.0.4; charset=utf-8";
        r.body = prometheusText(status_now());
      } else if (path == "/status") {
        r.content_type = "application/json";
        r.body = statusJson(status_now()).dump(2) + "\n";
      } else {
        r.status = 404;
        r.body = "not found; cpprun serves /healthz, /metrics and /status\n";
      }
      return r;
    });
    if (!created.isOk()) {
      return Status(created.status().code(), "--metrics-port: " + created.status().message());
    }
    metrics = std::move(created).value();
    CPPRUN_LOG(kInfo) << "metrics on http://"
                      << (metrics->host().find(':') != std::string::npos
                              ? "[" + metrics->host() + "]"
                              : metrics->host())
                      << ":" << metrics->port() << "/metrics (also /healthz, /status)";
    emitEvent(event_log.get(), "metrics_listening",
              {{"address", metrics->host()}, {"port", metrics->port()}});
  }
  ChildReaper reaper(io, [&](pid_t pid, int status) { supervisor.onChildExit(pid, status); });

  asio::signal_set handled(io);
  for (int signo : options.signals_to_handle) handled.add(signo);
  std::function<void()> arm_signals = [&] {
    handled.async_wait([&](const boost::system::error_code& ec, int signo) {
      if (ec) return;
      supervisor.onSignal(signo);
      arm_signals();
    });
  };
  if (!options.signals_to_handle.empty()) arm_signals();

  supervisor.start();
  if (!outcome) io.run();
  reaper.stop();
  if (coordinator) {
    // Its threads may be in the middle of a store request, and on node 0 that store is served
    // by this loop: keep the loop running until they have left.
    io.restart();
    std::thread closer([&] {
      coordinator.reset();
      io.stop();
    });
    io.run();
    closer.join();
  }
  if (metrics) metrics->stop();
  if (store) store->stop();
  if (!outcome) return internalError("the agent's event loop ended before the job did");
  return *outcome;
}

}  // namespace cpprun::agent
