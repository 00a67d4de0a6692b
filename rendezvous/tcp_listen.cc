#include "rendezvous/tcp_listen.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "common/logging.h"
#include "common/network_address.h"

namespace cpprun::rendezvous {

namespace asio = boost::asio;
using asio::ip::tcp;

std::string describeEndpoint(const tcp::endpoint& endpoint) {
  return formatHostPort(endpoint.address().to_string(), endpoint.port());
}

Result<BoundAddress> listenTcp(tcp::acceptor& acceptor, const std::string& host, uint16_t port,
                               const std::string& what) {
  boost::system::error_code ec;
  const std::string where = formatHostPort(host, port);
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
  // The kernel caps the backlog at net.core.somaxconn; asking for that (rather than glibc's
  // SOMAXCONN, 4096) uses a raised limit too.
  acceptor.listen(listenBacklog(), ec);
  if (ec == asio::error::address_in_use) {  // SO_REUSEADDR: a racing bind fails only here
    return Status(StatusCode::kAlreadyExists,
                  "listen on " + describeEndpoint(endpoint) + ": " + ec.message());
  }
  if (ec) return unavailable("listen on " + describeEndpoint(endpoint) + ": " + ec.message());
  auto local = acceptor.local_endpoint(ec);
  if (ec) return unavailable("local address of " + where + ": " + ec.message());
  return BoundAddress{local.address().to_string(), local.port()};
}

size_t listenersFor(size_t expected_clients, int backlog) {
  size_t queue = backlog > 0 ? static_cast<size_t>(backlog) : 1;
  if (expected_clients <= queue) return 1;
  return std::min(kMaxListeners, (2 * expected_clients + queue - 1) / queue);
}

namespace {

bool setReusePort(int fd, bool on, std::string* why_not) {
  int value = on ? 1 : 0;
  if (::setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &value, sizeof(value)) == 0) return true;
  *why_not = std::string("setsockopt(SO_REUSEPORT): ") + std::strerror(errno);
  return false;
}

}  // namespace

std::vector<std::unique_ptr<tcp::acceptor>> addReusePortListeners(tcp::acceptor& first,
                                                                  size_t count,
                                                                  std::string* why_not) {
  std::vector<std::unique_ptr<tcp::acceptor>> more;
  if (count == 0) return more;
  boost::system::error_code ec;
  tcp::endpoint local = first.local_endpoint(ec);
  if (ec) {
    *why_not = "local address: " + ec.message();
    return more;
  }
  if (!setReusePort(first.native_handle(), true, why_not)) return more;
  bool dual_stack = false;
  if (local.address().is_v6()) {
    asio::ip::v6_only v6_only;
    first.get_option(v6_only, ec);
    dual_stack = !ec && !v6_only.value();
  }
  int backlog = listenBacklog();
  for (size_t i = 0; i < count; ++i) {
    auto acceptor = std::make_unique<tcp::acceptor>(first.get_executor());
    acceptor->open(local.protocol(), ec);
    if (ec) {
      *why_not = "socket: " + ec.message();
      break;
    }
    acceptor->set_option(tcp::acceptor::reuse_address(true), ec);
    if (dual_stack) acceptor->set_option(asio::ip::v6_only(false), ec);
    if (!setReusePort(acceptor->native_handle(), true, why_not)) break;
    acceptor->bind(local, ec);
    if (ec) {
      *why_not = "bind " + describeEndpoint(local) + " with SO_REUSEPORT: " + ec.message();
      break;
    }
    acceptor->listen(backlog, ec);
    if (ec) {
      *why_not = "listen on " + describeEndpoint(local) + " with SO_REUSEPORT: " + ec.message();
      break;
    }
    more.push_back(std::move(acceptor));
  }
  if (more.empty()) {
    std::string ignored;
    setReusePort(first.native_handle(), false, &ignored);  // back to holding the port alone
  }
  return more;
}

WarningLimiter::WarningLimiter(asio::io_context& io, std::string what, size_t per_interval,
                               std::chrono::milliseconds interval)
    : timer_(io), what_(std::move(what)), per_interval_(per_interval), interval_(interval) {}

bool WarningLimiter::warn(const std::shared_ptr<void>& owner, const std::string& category,
                          const std::string& line) {
  if (!open_) {
    open_ = true;
    opened_ = std::chrono::steady_clock::now();
    timer_.expires_after(interval_);
    timer_.async_wait([this, owner](const boost::system::error_code& ec) {
      if (!ec) endInterval();
    });
  }
  if (logged_ < per_interval_) {
    ++logged_;
    std::string notice;
    if (logged_ == per_interval_) {
      char seconds[32];
      std::snprintf(seconds, sizeof(seconds), "%g", interval_.count() / 1000.0);
      notice = " (the warning limit of " + std::to_string(per_interval_) + " per " + seconds +
               " s is reached; further drops are summarised)";
    }
    CPPRUN_LOG(kWarn) << what_ << ": " << line << notice;
    return true;
  }
  auto it = std::find_if(suppressed_.begin(), suppressed_.end(),
                         [&](const auto& entry) { return entry.first == category; });
  if (it == suppressed_.end()) {
    suppressed_.emplace_back(category, 1);
  } else {
    ++it->second;
  }
  return false;
}

void WarningLimiter::stop() {
  timer_.cancel();
  if (open_) endInterval();
}

void WarningLimiter::endInterval() {
  uint64_t total = 0;
  for (const auto& entry : suppressed_) total += entry.second;
  if (total > 0) {
    std::chrono::duration<double> took = std::chrono::steady_clock::now() - opened_;
    char seconds[32];
    std::snprintf(seconds, sizeof(seconds), "%.1f", took.count());
    std::string line = what_ + ": " + std::to_string(total) +
                       " more connections dropped in the last " + seconds + " s:";
    const char* separator = " ";
    for (const auto& [category, count] : suppressed_) {
      line += separator + std::to_string(count) + " " + category;
      separator = ", ";
    }
    CPPRUN_LOG(kWarn) << line;
  }
  open_ = false;
  logged_ = 0;
  suppressed_.clear();
}

namespace {

// One accepted socket: handed to the server, or closed at once when over the connection cap.
void admit(const std::shared_ptr<void>& owner, const AcceptHooks& hooks, tcp::socket socket) {
  if (hooks.open_connections() >= hooks.max_connections) {
    boost::system::error_code ignored;
    hooks.warnings->warn(owner, "over the connection cap",
                         "refusing connection from " +
                             describeEndpoint(socket.remote_endpoint(ignored)) + ": " +
                             std::to_string(hooks.max_connections) + " connections already open");
    socket.close(ignored);
    if (hooks.refused) hooks.refused();
  } else {
    hooks.accepted(std::move(socket));
  }
}

// Empties the accept queue with non-blocking accepts, up to kAcceptsPerWake, before the loop
// serves anything else: under a connect burst the kernel's queue (net.core.somaxconn entries)
// then has room for the next SYNs sooner, and fewer clients fall back on SYN retries (1 s,
// 3 s, 7 s). Returns false when an accept failed (the caller's async_accept reports it).
void drainAcceptQueue(const std::shared_ptr<void>& owner, tcp::acceptor& acceptor,
                      const AcceptHooks& hooks) {
  constexpr int kAcceptsPerWake = 4096;
  for (int i = 0; i < kAcceptsPerWake && !hooks.stopped(); ++i) {
    boost::system::error_code ec;
    tcp::socket socket = acceptor.accept(ec);
    if (ec) return;  // would_block: drained; anything else: the next async_accept sees it
    admit(owner, hooks, std::move(socket));
  }
}

}  // namespace

int listenBacklog() {
  int somaxconn = 0;
  if (std::FILE* f = std::fopen("/proc/sys/net/core/somaxconn", "r")) {
    if (std::fscanf(f, "%d", &somaxconn) != 1) somaxconn = 0;
    std::fclose(f);
  }
  return somaxconn > 0 ? somaxconn : asio::socket_base::max_listen_connections;
}

void acceptConnections(std::shared_ptr<void> owner, tcp::acceptor& acceptor,
                       asio::steady_timer& retry_timer, std::shared_ptr<const AcceptHooks> hooks) {
  if (hooks->stopped()) return;
  boost::system::error_code ignored;
  acceptor.non_blocking(true, ignored);  // for drainAcceptQueue's accepts
  acceptor.async_accept([owner, &acceptor, &retry_timer, hooks](const boost::system::error_code& ec,
                                                                tcp::socket socket) {
    if (hooks->stopped()) return;
    if (ec) {
      if (ec == asio::error::operation_aborted) return;
      hooks->warnings->warn(owner, "failed accepts",
                            "accept failed: " + ec.message() + "; retrying in 50 ms");
      retry_timer.expires_after(std::chrono::milliseconds(50));
      retry_timer.async_wait(
          [owner, &acceptor, &retry_timer, hooks](const boost::system::error_code& tec) {
            if (!tec) acceptConnections(owner, acceptor, retry_timer, hooks);
          });
      return;
    }
    admit(owner, *hooks, std::move(socket));
    drainAcceptQueue(owner, acceptor, *hooks);
    acceptConnections(owner, acceptor, retry_timer, hooks);
  });
}
}  // namespace cpprun::rendezvous
