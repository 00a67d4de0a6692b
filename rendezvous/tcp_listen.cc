#include "rendezvous/tcp_listen.h"

#include <chrono>

#include "common/logging.h"

namespace cpprun::rendezvous {

namespace asio = boost::asio;
using asio::ip::tcp;

std::string describeEndpoint(const tcp::endpoint& endpoint) {
  auto addr = endpoint.address();
  std::string a = addr.is_v6() ? "[" + addr.to_string() + "]" : addr.to_string();
  return a + ":" + std::to_string(endpoint.port());
}

Result<BoundAddress> listenTcp(tcp::acceptor& acceptor, const std::string& host, uint16_t port,
                               const std::string& what) {
  boost::system::error_code ec;
  const std::string where = host + ":" + std::to_string(port);
  tcp::endpoint endpoint;
  auto addr = asio::ip::make_address(host, ec);
  if (!ec) {
    endpoint = tcp::endpoint(addr, port);
  } else {
    tcp::resolver resolver(acceptor.get_executor());
    auto results = resolver.resolve(host, std::to_string(port),
                                    tcp::resolver::passive | tcp::resolver::numeric_service, ec);
    if (ec || results.empty()) {
      return Status(StatusCode::kInvalidArgument,
                    "cannot resolve " + what + " host '" + host + "': " + ec.message());
    }
    endpoint = results.begin()->endpoint();
  }
  acceptor.open(endpoint.protocol(), ec);
  if (ec) return unavailable("socket for " + where + ": " + ec.message());
  acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (endpoint.address().is_v6() && endpoint.address().is_unspecified()) {
    acceptor.set_option(asio::ip::v6_only(false), ec);  // "::" serves IPv4 too
  }
  acceptor.bind(endpoint, ec);
  if (ec == asio::error::address_in_use) {
    return Status(StatusCode::kAlreadyExists,
                  "bind " + describeEndpoint(endpoint) + ": " + ec.message());
  }
  if (ec) return unavailable("bind " + describeEndpoint(endpoint) + ": " + ec.message());
  acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec == asio::error::address_in_use) {  // SO_REUSEADDR: a racing bind fails only here
    return Status(StatusCode::kAlreadyExists,
                  "listen on " + describeEndpoint(endpoint) + ": " + ec.message());
  }
  if (ec) return unavailable("listen on " + describeEndpoint(endpoint) + ": " + ec.message());
  auto local = acceptor.local_endpoint(ec);
  if (ec) return unavailable("local address of " + where + ": " + ec.message());
  return BoundAddress{local.address().to_string(), local.port()};
}

namespace {

// Whether a warning may be written now (AcceptWarnings' budget); at the first one after an
// interval with suppressed lines, the count of those is written first.
bool mayWarn(const AcceptHooks& hooks) {
  AcceptWarnings& w = hooks.warnings;
  const auto now = std::chrono::steady_clock::now();
  if (now - w.interval_start >= kAcceptWarningInterval) {
    if (w.suppressed > 0) {
      CPPRUN_LOG(kWarn)
          << hooks.what << ": " << w.suppressed << " more connection warning(s) in the last "
          << std::chrono::duration_cast<std::chrono::seconds>(now - w.interval_start).count()
          << " s not shown";
    }
    w = AcceptWarnings{now, 0, 0};
  }
  if (w.lines < kAcceptWarningsPerInterval) {
    ++w.lines;
    return true;
  }
  ++w.suppressed;
  return false;
}

}  // namespace

void acceptConnections(std::shared_ptr<void> owner, tcp::acceptor& acceptor,
                       asio::steady_timer& retry_timer, std::shared_ptr<const AcceptHooks> hooks) {
  if (hooks->stopped()) return;
  acceptor.async_accept([owner, &acceptor, &retry_timer, hooks](const boost::system::error_code& ec,
                                                                tcp::socket socket) {
    if (hooks->stopped()) return;
    if (ec) {
      if (ec == asio::error::operation_aborted) return;
      if (mayWarn(*hooks)) {
        CPPRUN_LOG(kWarn) << hooks->what << ": accept failed: " << ec.message()
                          << "; retrying in 50 ms";
      }
      retry_timer.expires_after(std::chrono::milliseconds(50));
      retry_timer.async_wait(
          [owner, &acceptor, &retry_timer, hooks](const boost::system::error_code& tec) {
            if (!tec) acceptConnections(owner, acceptor, retry_timer, hooks);
          });
      return;
    }
    if (hooks->open_connections() >= hooks->max_connections) {
      boost::system::error_code ignored;
      if (mayWarn(*hooks)) {
        CPPRUN_LOG(kWarn) << hooks->what << ": refusing connection from "
                          << describeEndpoint(socket.remote_endpoint(ignored)) << ": "
                          << hooks->max_connections << " connections already open"
                          << (hooks->warnings.lines == kAcceptWarningsPerInterval
                                  ? " (further connection warnings in the next 10 s are counted, "
                                    "not shown)"
                                  : "");
      }
      socket.close(ignored);
      if (hooks->refused) hooks->refused();
    } else {
      hooks->accepted(std::move(socket));
    }
    acceptConnections(owner, acceptor, retry_timer, hooks);
  });
}

}  // namespace cpprun::rendezvous
