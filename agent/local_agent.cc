#include "agent/local_agent.h"

#include <signal.h>

#include <optional>

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
  if (options.host_store) {
    rendezvous::TcpStoreServerOptions so;
    so.host = options.store_host;
    so.port = static_cast<uint16_t>(options.store_port);
    auto created = rendezvous::TcpStoreServer::create(io, so);
    if (!created.isOk()) return created.status();
    store = std::move(created).value();
    store_host = store->host();
    store_port = store->port();
    CPPRUN_LOG(kDebug) << "store listening on " << store_host << ":" << store_port;
  }

  std::unique_ptr<NcclUniqueIdProvider> nccl;
  if (options.use_nccl) {
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
  auto prepare = [&](int restart_count) -> Result<AttemptSpec> {
    AttemptContext context;
    context.restart_count = restart_count;
    context.store_host = store_host;
    context.store_port = store_port;
    if (store) {
      size_t erased = store->eraseKeysExcept(kAgentKeyPrefix);
      if (erased > 0) {
        CPPRUN_LOG(kDebug) << "erased " << erased << " store keys of the previous attempt";
      }
    }
    if (nccl) {
      auto id = nccl->next();
      if (id.isOk()) {
        context.nccl_unique_id_hex = id.value();
        if (store) store->set(kNcclUniqueIdKey, id.value());
      } else {
        CPPRUN_LOG(kWarn) << "ncclGetUniqueId failed: " << id.status().message()
                          << "; CPPRUN_NCCL_UNIQUE_ID is not set for this attempt";
      }
    }
    return make_attempt(context);
  };

  Supervisor supervisor(io, *launcher, options.supervisor, prepare, [&](const JobOutcome& result) {
    outcome = result;
    io.stop();
  });
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
  if (store) store->stop();
  if (!outcome) return internalError("the agent's event loop ended before the job did");
  return *outcome;
}

}  // namespace cpprun::agent
