#include "agent/local_agent.h"

#include <signal.h>

#include <optional>
#include <thread>

#include "agent/child_reaper.h"
#include "agent/nccl_unique_id.h"
#include "agent/process_launcher.h"
#include "common/asio.h"
#include "common/logging.h"
#include "rendezvous/tcp_store_server.h"

namespace cpprun::agent {

namespace asio = boost::asio;

Result<JobOutcome> runLocalAgent(const LocalAgentOptions& options,
                                 const MakeAttempt& make_attempt) {
  // A worker's closed pipe must be an error code, not the agent's death.
  ::signal(SIGPIPE, SIG_IGN);
  if (!becomeChildSubreaper()) {
    CPPRUN_LOG(kWarn) << "cannot become a child subreaper; orphans of workers may escape";
  }
  asio::io_context io{1};

  std::unique_ptr<rendezvous::TcpStoreServer> store;
  std::string store_host = options.store_host;
  int store_port = options.store_port;
  if (options.host_store || options.host_store_if_free) {
    rendezvous::TcpStoreServerOptions so;
    so.host = options.store_bind_host.empty() ? options.store_host : options.store_bind_host;
    so.port = static_cast<uint16_t>(options.store_port);
    auto created = rendezvous::TcpStoreServer::create(io, so);
    if (created.isOk()) {
      store = std::move(created).value();
      if (options.store_bind_host.empty()) store_host = store->host();
      store_port = store->port();
      if (options.host_store_if_free) {
        CPPRUN_LOG(kInfo) << "this agent serves the job's store on " << so.host << ":"
                          << store_port;
      }
    } else if (!(options.host_store_if_free &&
                 created.status().code() == StatusCode::kAlreadyExists)) {
      return created.status();
    }
  }
  const bool is_store_host = store != nullptr;

  std::unique_ptr<NcclUniqueIdProvider> nccl;
  // Multi-node: only node 0 makes the ids (one per attempt for the whole job); the others get
  // them with the attempt's "go" and need not load the library at all.
  const bool makes_nccl_ids = !options.multi_node || is_store_host;
  if (options.use_nccl && makes_nccl_ids) {
    auto provider = NcclUniqueIdProvider::create(options.nccl_library);
    if (provider.isOk()) {
      nccl = std::move(provider).value();
    } else {
      CPPRUN_LOG(kInfo) << "NCCL not loadable (" << provider.status().message()
                        << "); CPPRUN_NCCL_UNIQUE_ID is not set";
    }
  }

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
    if (!nccl) return "";
    auto id = nccl->next();
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
  if (options.multi_node) {
    StoreCoordinatorOptions co = *options.multi_node;
    co.is_host = is_store_host;
    co.store_host = is_store_host ? "127.0.0.1" : store_host;
    if (is_store_host && store_host.find(':') != std::string::npos) co.store_host = "::1";
    co.store_port = store_port;
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
      return make_attempt(context);
    }
    // One node: this agent is the host.
    context.nccl_unique_id_hex = host_prepare(restart_count);
    return make_attempt(context);
  };

  Supervisor supervisor(io, *launcher, supervisor_options, prepare, [&](const JobOutcome& result) {
    outcome = result;
    io.stop();
  });
  supervisor_ptr = &supervisor;
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
  if (store) store->stop();
  if (!outcome) return internalError("the agent's event loop ended before the job did");
  return *outcome;
}

}  // namespace cpprun::agent
