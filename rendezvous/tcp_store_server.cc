#include "rendezvous/tcp_store_server.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <future>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/asio.h"
#include "common/logging.h"
#include "rendezvous/store_engine.h"
#include "rendezvous/tcp_listen.h"

namespace cpprun::rendezvous {

namespace asio = boost::asio;
using asio::ip::tcp;

class Connection;

// The loop's one read buffer, shared by every connection (see Connection::read()).
constexpr size_t kReadBufferBytes = 64 * 1024;

size_t largestSingleKeyRequest(const wire::Limits& limits) {
  return 1 + 3 * 8 + limits.max_key_bytes + 2 * limits.max_value_bytes;
}

const char* dropReasonName(DropReason reason) {
  switch (reason) {
    case DropReason::kBadFrame:
      return "bad frame";
    case DropReason::kRefused:
      return "refused request";
    case DropReason::kRequestBudget:
      return "request budget";
    case DropReason::kReplyBudget:
      return "reply budget";
  }
  return "unknown";
}

// Owns the acceptor, the connections and the engine. Shared with in-flight handlers, so it
// outlives the TcpStoreServer object until the loop has drained them.
class TcpStoreServer::Impl : public std::enable_shared_from_this<TcpStoreServer::Impl>,
                             public Outbox {
 public:
  Impl(asio::io_context& io, TcpStoreServerOptions options)
      : io_(io),
        options_(std::move(options)),
        acceptor_(io),
        retry_timer_(io),
        engine_(this),
        warnings_(std::make_shared<WarningLimiter>(io, "store", options_.drop_warnings_per_interval,
                                                   options_.drop_warning_interval)) {
    if (!options_.secret.empty()) engine_.requireAuthentication(options_.secret);
  }

  Status listen();
  void startAccepting();
  void stop();

  void send(ClientId client, const uint8_t* data, size_t size) override;
  bool roomFor(ClientId client, size_t size) override;
  void flush();
  // Closes a connection the server gives up on: counted, and logged within warnings_' budget.
  void closeConnection(ClientId id, DropReason reason, const std::string& why);
  void connectionFinished(ClientId id);

  asio::io_context& io_;
  TcpStoreServerOptions options_;
  tcp::acceptor acceptor_;
  asio::steady_timer retry_timer_;
  // The sockets that share acceptor_'s port (SO_REUSEPORT; see listen()), each with its timer.
  std::vector<std::unique_ptr<tcp::acceptor>> more_acceptors_;
  std::vector<std::unique_ptr<asio::steady_timer>> more_retry_timers_;
  StoreEngine engine_;
  // The budget of every connection warning (drops, refusals, failed accepts; tcp_listen.h).
  std::shared_ptr<WarningLimiter> warnings_;
  std::unordered_map<ClientId, std::shared_ptr<Connection>> connections_;
  std::vector<std::shared_ptr<Connection>> dirty_;
  std::vector<std::shared_ptr<Connection>> spare_dirty_;  // flush()'s other buffer
  ClientId next_id_ = 1;
  std::string bound_host_;
  uint16_t bound_port_ = 0;
  bool stopped_ = false;
  TcpStoreServerStats stats_;
  // Requests are decoded into this one object, whose buffers are reused.
  wire::Request request_;
  // Every connection reads into this buffer and decodes what it read before the next read.
  std::unique_ptr<uint8_t[]> read_buffer_{new uint8_t[kReadBufferBytes]};
};

// One client connection: reads, decodes, dispatches, and writes replies in order.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(std::shared_ptr<TcpStoreServer::Impl> server, ClientId id, tcp::socket socket)
      : server_(std::move(server)),
        id_(id),
        socket_(std::move(socket)),
        decoder_(server_->options_.limits, server_->options_.no_handshake_dialect) {
    boost::system::error_code ec;
    socket_.set_option(tcp::no_delay(true), ec);
    socket_.non_blocking(true, ec);  // for the direct writes in flush()
  }

  ClientId id() const { return id_; }
  // "127.0.0.1:41234". Asked for only when a line names the peer (a getpeername() per
  // accepted connection and a string per connection are not worth it otherwise).
  std::string peer() const {
    boost::system::error_code ec;
    auto endpoint = socket_.remote_endpoint(ec);
    return ec ? std::string("unknown peer") : describeEndpoint(endpoint);
  }

  void start() { read(); }

  // Queues bytes; written once the current batch of requests has been handled. Bytes past the
  // output budget are not queued: the connection is marked and closed by the next flush().
  void queue(const uint8_t* data, size_t size) {
    if (closed_ || !roomFor(size)) return;
    pending_.insert(pending_.end(), data, data + size);
    markDirty();
  }

  // Whether `size` more bytes of replies fit the output budget; marks the connection for
  // closing when they do not.
  bool roomFor(size_t size) {
    if (over_budget_) return false;
    size_t queued = pending_.size() + in_flight_.size();
    if (size <= server_->options_.max_pending_output_bytes &&
        queued <= server_->options_.max_pending_output_bytes - size) {
      return true;
    }
    over_budget_ = true;
    refused_reply_bytes_ = size;
    markDirty();
    return false;
  }

  bool overBudget() const { return over_budget_; }

  // Says why the output budget was exceeded. REQUIRES: overBudget().
  std::string overBudgetReason() const {
    return "a reply of " + std::to_string(refused_reply_bytes_) + " bytes with " +
           std::to_string(pending_.size() + in_flight_.size()) +
           " bytes of replies queued and unread would exceed the " +
           std::to_string(server_->options_.max_pending_output_bytes) +
           "-byte per-connection reply budget";
  }

  void flush() {
    dirty_ = false;
    if (closed_) return;
    // Checked before anything else: a client that sends but never reads keeps the write in
    // flight forever while its replies pile up.
    if (over_budget_) {
      server_->closeConnection(id_, DropReason::kReplyBudget, overBudgetReason());
      return;
    }
    if (pending_.empty() || writing_) return;
    // Usually the socket takes the whole reply at once: write it directly (one send, no
    // completion handler) and fall back to an asynchronous write only for what is left.
    boost::system::error_code write_ec;
    size_t written = socket_.write_some(asio::buffer(pending_), write_ec);
    if (write_ec && write_ec != asio::error::would_block && write_ec != asio::error::try_again) {
      server_->connectionFinished(id_);
      return;
    }
    server_->stats_.bytes_sent += written;
    if (written == pending_.size()) {
      clearKeepingLittle(&pending_);
      return;
    }
    pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(written));
    writing_ = true;
    in_flight_.swap(pending_);
    auto self = shared_from_this();
    asio::async_write(socket_, asio::buffer(in_flight_),
                      [self](const boost::system::error_code& ec, size_t n) {
                        self->writing_ = false;
                        clearKeepingLittle(&self->in_flight_);
                        if (self->closed_) return;
                        self->server_->stats_.bytes_sent += n;
                        if (ec) {
                          self->server_->connectionFinished(self->id_);
                          return;
                        }
                        self->flush();
                        if (self->peer_done_ && !self->writing_) {
                          self->server_->connectionFinished(self->id_);
                        }
                      });
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    boost::system::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
    wire::Bytes().swap(pending_);  // in_flight_ may still be in the kernel's hands until the
                                   // aborted write completes
  }

 private:
  void markDirty() {
    if (!dirty_) {
      dirty_ = true;
      server_->dirty_.push_back(shared_from_this());
    }
  }

  // Empties a reply buffer, freeing it if a large reply grew it: an idle connection that once
  // fetched an 8 MiB value holds no 8 MiB buffer.
  static void clearKeepingLittle(wire::Bytes* bytes) {
    if (bytes->capacity() > kReadBufferBytes) {
      wire::Bytes().swap(*bytes);
    } else {
      bytes->clear();
    }
  }

  // Says why the unfinished request is over the request budget.
  std::string requestBudgetReason() const {
    auto type = decoder_.partialType();
    return std::string("an unfinished ") + (type ? wire::queryTypeName(*type) : "request") +
           " has " + std::to_string(decoder_.bufferedBytes()) + " bytes buffered, over the " +
           std::to_string(server_->options_.max_request_bytes) +
           "-byte per-connection request budget";
  }

  // Reads into a small buffer of the connection's own (128 bytes: VALIDATE + PING, ADD, WAIT
  // and GET of the bootstrap fit; a SET of gloo's 170-byte address takes a second read); when
  // a read fills it, the rest is read into the loop's one shared buffer (Impl::read_buffer_).
  // So an idle client costs 128 bytes, not a 4 KiB buffer. The small buffer is what lets the
  // read stay an async_read_some: Asio cannot read many sockets into one shared buffer (reads
  // of several sockets complete before their handlers run), and an async_wait + recv() instead
  // re-arms with an epoll_ctl per request, more calls than async_read_some's speculative recv()
  // (which fails with EAGAIN only when the client has not sent its next request yet).
  void read() {
    auto self = shared_from_this();
    socket_.async_read_some(
        asio::buffer(inline_read_.data(), inline_read_.size()),
        [self](const boost::system::error_code& ec, size_t n) { self->onRead(ec, n); });
  }

  void onRead(const boost::system::error_code& ec, size_t n) {
    if (closed_) return;
    if (ec) return onReadError(ec);
    if (!consume(inline_read_.data(), n)) return;
    if (n == inline_read_.size() && !readShared()) return;
    server_->flush();
    read();
  }

  // Reads what else the socket holds into the shared buffer: a short read means it is drained
  // (the next bytes raise a new edge). At most kMaxReadsPerWake full reads, so one client
  // streaming megabytes cannot hold the loop. False when the connection ended.
  bool readShared() {
    for (int i = 0; i < kMaxReadsPerWake; ++i) {
      boost::system::error_code ec;
      size_t n =
          socket_.receive(asio::buffer(server_->read_buffer_.get(), kReadBufferBytes), 0, ec);
      if (ec == asio::error::would_block || ec == asio::error::try_again) return true;
      if (ec) {
        onReadError(ec);
        return false;
      }
      if (!consume(server_->read_buffer_.get(), n)) return false;
      if (n < kReadBufferBytes) return true;
    }
    return true;
  }

  void onReadError(const boost::system::error_code& ec) {
    server_->flush();
    if (closed_) return;
    if (ec == asio::error::eof && (writing_ || !pending_.empty())) {
      // The client finished sending but replies are still on their way: deliver them,
      // then close. Its pending waits can never be answered usefully, so forget them now.
      peer_done_ = true;
      server_->engine_.disconnect(id_);
      return;
    }
    server_->connectionFinished(id_);
  }

  // Decodes and handles every complete request in `data`; false when the connection was
  // closed (a bad frame, a refused request, a budget exceeded).
  bool consume(const uint8_t* data, size_t n) {
    server_->stats_.bytes_received += n;
    decoder_.feed(data, n);
    wire::Request& request = server_->request_;
    std::string error;
    while (true) {
      wire::ParseStatus status = decoder_.next(&request, &error);
      if (status == wire::ParseStatus::kNeedMore) break;
      if (status == wire::ParseStatus::kError) {
        return closeFor(DropReason::kBadFrame, error);
      }
      ++server_->stats_.requests;
      if (!server_->engine_.handle(id_, *decoder_.dialect(), request, &error)) {
        return closeFor(DropReason::kRefused,
                        std::string(wire::queryTypeName(request.type)) + ": " + error);
      }
      if (over_budget_) {  // stop answering a client whose replies are over budget
        return closeFor(DropReason::kReplyBudget, overBudgetReason());
      }
    }
    // What is left is one unfinished request: bounded, so that a request announcing a
    // terabyte is cut off at the budget rather than when memory runs out.
    if (decoder_.bufferedBytes() > server_->options_.max_request_bytes) {
      return closeFor(DropReason::kRequestBudget, requestBudgetReason());
    }
    return true;
  }

  bool closeFor(DropReason reason, const std::string& why) {
    server_->closeConnection(id_, reason, why);
    server_->flush();
    return false;
  }

  std::shared_ptr<TcpStoreServer::Impl> server_;
  ClientId id_;
  tcp::socket socket_;
  wire::RequestDecoder decoder_;
  wire::Bytes pending_;
  wire::Bytes in_flight_;
  bool writing_ = false;
  bool dirty_ = false;
  bool peer_done_ = false;    // the client half-closed; close once the replies are written
  bool over_budget_ = false;  // a reply did not fit the output budget; closed at flush()
  size_t refused_reply_bytes_ = 0;
  static constexpr int kMaxReadsPerWake = 4;
  std::array<uint8_t, 128> inline_read_;  // see read()
  bool closed_ = false;
};

Status TcpStoreServer::Impl::listen() {
  auto bound = rendezvous::listenTcp(acceptor_, options_.host, options_.port, "store");
  if (!bound.isOk()) return bound.status();
  bound_host_ = bound.value().host;
  bound_port_ = bound.value().port;
  int backlog = listenBacklog();
  size_t wanted = options_.listen_sockets > 0 ? std::min(options_.listen_sockets, kMaxListeners)
                                              : listenersFor(options_.expected_clients, backlog);
  if (wanted > 1) {
    std::string why_not;
    more_acceptors_ = addReusePortListeners(acceptor_, wanted - 1, &why_not);
    if (more_acceptors_.size() + 1 < wanted) {
      CPPRUN_LOG(kWarn) << "store: listening on " << more_acceptors_.size() + 1 << " of " << wanted
                        << " sockets on port " << bound_port_ << ": " << why_not;
    } else {
      CPPRUN_LOG(kDebug) << "store: " << wanted << " sockets listen on port " << bound_port_
                         << " (SO_REUSEPORT), each with an accept queue of " << backlog;
    }
    for (size_t i = 0; i < more_acceptors_.size(); ++i) {
      more_retry_timers_.push_back(std::make_unique<asio::steady_timer>(io_));
    }
  }
  size_t sockets = more_acceptors_.size() + 1;
  size_t queued = sockets * static_cast<size_t>(backlog);
  if (options_.expected_clients > queued) {
    CPPRUN_LOG(kWarn) << "store: " << options_.expected_clients
                      << " clients expected, but the accept queues hold " << queued << " ("
                      << sockets << " x net.core.somaxconn " << backlog
                      << "): clients connecting at once beyond that have "
                         "their SYNs dropped and retry after 1 s, 3 s, 7 s; raise it with "
                         "sysctl -w net.core.somaxconn="
                      << (options_.expected_clients + sockets - 1) / sockets;
  }
  return Status::ok();
}

void TcpStoreServer::Impl::startAccepting() {
  auto hooks = std::make_shared<AcceptHooks>();
  hooks->what = "store";
  hooks->max_connections = options_.max_connections;
  hooks->stopped = [this] { return stopped_; };
  hooks->open_connections = [this] { return connections_.size(); };
  hooks->accepted = [this](tcp::socket socket) {
    ++stats_.connections_accepted;
    ClientId id = next_id_++;
    auto conn = std::make_shared<Connection>(shared_from_this(), id, std::move(socket));
    connections_.emplace(id, conn);
    conn->start();
  };
  hooks->refused = [this] { ++stats_.connections_rejected; };
  hooks->warnings = warnings_;
  for (size_t i = 0; i < more_acceptors_.size(); ++i) {
    acceptConnections(shared_from_this(), *more_acceptors_[i], *more_retry_timers_[i], hooks);
  }
  acceptConnections(shared_from_this(), acceptor_, retry_timer_, std::move(hooks));
}

void TcpStoreServer::Impl::send(ClientId client, const uint8_t* data, size_t size) {
  auto it = connections_.find(client);
  if (it != connections_.end()) it->second->queue(data, size);
}

bool TcpStoreServer::Impl::roomFor(ClientId client, size_t size) {
  auto it = connections_.find(client);
  return it != connections_.end() && it->second->roomFor(size);
}

void TcpStoreServer::Impl::flush() {
  // flush() may close connections, which must not disturb this iteration. The two vectors
  // trade places so that neither is reallocated per batch.
  auto batch = std::move(dirty_);
  dirty_ = std::move(spare_dirty_);
  dirty_.clear();
  for (auto& c : batch) c->flush();
  batch.clear();
  spare_dirty_ = std::move(batch);
}

void TcpStoreServer::Impl::closeConnection(ClientId id, DropReason reason, const std::string& why) {
  auto it = connections_.find(id);
  if (it == connections_.end()) return;
  ++stats_.connections_dropped;
  ++stats_.dropped_by_reason[static_cast<size_t>(reason)];
  if (!warnings_->warn(shared_from_this(), dropReasonName(reason),
                       "closing connection from " + it->second->peer() + ": " + why)) {
    ++stats_.drop_warnings_suppressed;
  }
  connectionFinished(id);
}

void TcpStoreServer::Impl::connectionFinished(ClientId id) {
  auto it = connections_.find(id);
  if (it == connections_.end()) return;
  auto conn = it->second;
  connections_.erase(it);
  engine_.disconnect(id);
  conn->close();
}

void TcpStoreServer::Impl::stop() {
  if (stopped_) return;
  stopped_ = true;
  boost::system::error_code ec;
  acceptor_.close(ec);
  retry_timer_.cancel();
  for (auto& acceptor : more_acceptors_) acceptor->close(ec);
  for (auto& timer : more_retry_timers_) timer->cancel();
  auto conns = std::move(connections_);
  connections_.clear();
  for (auto& kv : conns) kv.second->close();
  dirty_.clear();
  warnings_->stop();
}

Result<std::unique_ptr<TcpStoreServer>> TcpStoreServer::create(asio::io_context& io,
                                                               TcpStoreServerOptions options) {
  if (options.max_request_bytes < largestSingleKeyRequest(options.limits)) {
    return invalidArgument(
        "store: the request budget of " + std::to_string(options.max_request_bytes) +
        " bytes is below the largest request the limits allow (" +
        std::to_string(largestSingleKeyRequest(options.limits)) + " bytes: a COMPARE_SET of a " +
        std::to_string(options.limits.max_key_bytes) + "-byte key and two " +
        std::to_string(options.limits.max_value_bytes) + "-byte values)");
  }
  auto impl = std::make_shared<Impl>(io, std::move(options));
  Status s = impl->listen();
  if (!s.isOk()) return s;
  impl->startAccepting();
  return std::unique_ptr<TcpStoreServer>(new TcpStoreServer(std::move(impl)));
}

TcpStoreServer::TcpStoreServer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
TcpStoreServer::~TcpStoreServer() { impl_->stop(); }
const std::string& TcpStoreServer::host() const { return impl_->bound_host_; }
uint16_t TcpStoreServer::port() const { return impl_->bound_port_; }
void TcpStoreServer::stop() { impl_->stop(); }

void TcpStoreServer::set(const std::string& key, const std::string& value) {
  impl_->engine_.localSet(key, wire::Bytes(value.begin(), value.end()));
  impl_->flush();
}

size_t TcpStoreServer::eraseKeysExcept(const std::string& keep_prefix) {
  return impl_->engine_.eraseKeysExcept(keep_prefix);
}

size_t TcpStoreServer::eraseKeysWithPrefix(const std::string& prefix) {
  return impl_->engine_.eraseKeysWithPrefix(prefix);
}

TcpStoreServerStats TcpStoreServer::stats() const {
  TcpStoreServerStats s = impl_->stats_;
  s.connections_open = impl_->connections_.size();
  s.keys = impl_->engine_.numKeys();
  s.pending_waits = impl_->engine_.pendingWaits();
  s.refused_unauthenticated = impl_->engine_.refusedUnauthenticated();
  s.listen_sockets = impl_->stopped_ ? 0 : 1 + impl_->more_acceptors_.size();
  return s;
}

struct BackgroundTcpStoreServer::State {
  asio::io_context io{1};
  std::unique_ptr<TcpStoreServer> server;
  std::thread thread;
};

Result<std::unique_ptr<BackgroundTcpStoreServer>> BackgroundTcpStoreServer::start(
    TcpStoreServerOptions options) {
  auto state = std::make_unique<State>();
  auto server = TcpStoreServer::create(state->io, std::move(options));
  if (!server.isOk()) return server.status();
  state->server = std::move(server).value();
  State* raw = state.get();
  state->thread = std::thread([raw] {
    auto guard = asio::make_work_guard(raw->io);
    raw->io.run();
  });
  return std::unique_ptr<BackgroundTcpStoreServer>(new BackgroundTcpStoreServer(std::move(state)));
}

BackgroundTcpStoreServer::BackgroundTcpStoreServer(std::unique_ptr<State> state)
    : state_(std::move(state)) {}

BackgroundTcpStoreServer::~BackgroundTcpStoreServer() {
  State* s = state_.get();
  asio::post(s->io, [s] {
    s->server->stop();
    s->io.stop();
  });
  s->thread.join();
  s->server.reset();
}

const std::string& BackgroundTcpStoreServer::host() const { return state_->server->host(); }
uint16_t BackgroundTcpStoreServer::port() const { return state_->server->port(); }

TcpStoreServerStats BackgroundTcpStoreServer::stats() const {
  std::promise<TcpStoreServerStats> done;
  auto result = done.get_future();
  State* s = state_.get();
  asio::post(s->io, [s, &done] { done.set_value(s->server->stats()); });
  return result.get();
}

}  // namespace cpprun::rendezvous
