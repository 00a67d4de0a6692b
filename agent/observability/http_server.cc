#include "agent/observability/http_server.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <exception>
#include <limits>
#include <optional>
#include <thread>
#include <unordered_set>
#include <utility>

// clang-format off
#include "common/asio.h"  // before Beast, which includes Asio
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
// clang-format on

#include "common/check.h"
#include "common/clip.h"
#include "common/logging.h"
#include "rendezvous/tcp_listen.h"

namespace cpprun::agent {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using asio::ip::tcp;

namespace {

constexpr const char* kTextPlain = "text/plain; charset=utf-8";

bool isHttpParseError(const boost::system::error_code& ec) {
  return ec.category() == http::make_error_code(http::error::bad_target).category();
}

}  // namespace

class HttpConnection;

// Owns the acceptor and the connections. Shared with in-flight handlers (each connection holds
// it), so it outlives the HttpServer object until the loop has drained them.
class HttpServer::Impl : public std::enable_shared_from_this<HttpServer::Impl> {
 public:
  Impl(asio::io_context& io, HttpServerOptions options, HttpHandler handler)
      : io_(io),
        options_(std::move(options)),
        handler_(std::move(handler)),
        acceptor_(io),
        retry_timer_(io) {}

  Status listen();
  void startAccepting();
  void stop();
  void connectionFinished(const std::shared_ptr<HttpConnection>& connection);

  asio::io_context& io_;
  // Refused connections and failed accepts, within a budget (tcp_listen.h).
  std::shared_ptr<rendezvous::WarningLimiter> warnings_ =
      std::make_shared<rendezvous::WarningLimiter>(io_, "http", rendezvous::kWarningsPerInterval,
                                                   rendezvous::kWarningInterval);
  HttpServerOptions options_;
  HttpHandler handler_;
  tcp::acceptor acceptor_;
  asio::steady_timer retry_timer_;
  std::unordered_set<std::shared_ptr<HttpConnection>> connections_;
  std::string bound_host_;
  uint16_t bound_port_ = 0;
  bool stopped_ = false;
  std::atomic<uint64_t> requests_served_{0};  // read from any thread (requestsServed())
};

// One client connection: reads a request, answers it, and either reads the next one
// (keep-alive) or shuts its side down and drains what the client still sends (so the kernel
// does not reset the connection under a response the client has not read yet), then closes.
class HttpConnection : public std::enable_shared_from_this<HttpConnection> {
 public:
  HttpConnection(std::shared_ptr<HttpServer::Impl> server, tcp::socket socket)
      : server_(std::move(server)), stream_(std::move(socket)) {
    boost::system::error_code ec;
    peer_ = rendezvous::describeEndpoint(stream_.socket().remote_endpoint(ec));
    if (ec) peer_ = "unknown peer";
    stream_.socket().set_option(tcp::no_delay(true), ec);
  }

  void start() { readRequest(); }

  // Cancels whatever is pending (its completion finds closed_ set) and closes the socket.
  void close() {
    if (closed_) return;
    closed_ = true;
    boost::system::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
  }

 private:
  const HttpServerOptions& options() const { return server_->options_; }

  void readRequest() {
    parser_.emplace();
    size_t limit = options().max_request_bytes;
    parser_->header_limit(static_cast<std::uint32_t>(
        std::min<size_t>(limit, std::numeric_limits<std::uint32_t>::max())));
    parser_->body_limit(limit);
    // One deadline for the whole request, header and body (it covers every operation started
    // until it is set again).
    stream_.expires_after(options().idle_timeout);
    auto self = shared_from_this();
    http::async_read_header(stream_, buffer_, *parser_,
                            [self](const boost::system::error_code& ec, size_t header_bytes) {
                              self->onHeader(ec, header_bytes);
                            });
  }

  void onHeader(const boost::system::error_code& ec, size_t header_bytes) {
    if (closed_) return;
    if (ec) {
      readFailed(ec);
      return;
    }
    if (parser_->is_done()) {
      answer();
      return;
    }
    // Header and body share max_request_bytes.
    size_t limit = options().max_request_bytes;
    size_t left = header_bytes < limit ? limit - header_bytes : 0;
    auto length = parser_->content_length();
    if (length && *length > left) {
      reject(http::status::payload_too_large,
             "request body of " + std::to_string(*length) + " bytes after a header of " +
                 std::to_string(header_bytes) + " is over the limit of " + std::to_string(limit));
      return;
    }
    parser_->body_limit(left);  // chunked bodies are checked as they arrive
    auto self = shared_from_this();
    http::async_read(stream_, buffer_, *parser_,
                     [self](const boost::system::error_code& read_ec, size_t) {
                       if (self->closed_) return;
                       if (read_ec) {
                         self->readFailed(read_ec);
                         return;
                       }
                       self->answer();
                     });
  }

  void readFailed(const boost::system::error_code& ec) {
    if (ec == http::error::end_of_stream || ec == asio::error::operation_aborted) {
      finish();  // the client closed between requests, or we are stopping
    } else if (ec == beast::error::timeout) {
      bool mid_request = parser_->got_some() || buffer_.size() > 0;
      if (mid_request) {
        CPPRUN_LOG(kWarn) << "http: closing connection from " << peer_ << ": no whole request in "
                          << options().idle_timeout.count() << " ms";
      }
      finish();
    } else if (ec == http::error::header_limit) {
      reject(http::status::request_header_fields_too_large,
             "request header over the limit of " + std::to_string(options().max_request_bytes) +
                 " bytes");
    } else if (ec == http::error::body_limit) {
      reject(http::status::payload_too_large,
             "request over the limit of " + std::to_string(options().max_request_bytes) + " bytes");
    } else if (ec == http::error::partial_message || !isHttpParseError(ec)) {
      finish();  // the client went away mid-request, or a socket error
    } else {
      reject(http::status::bad_request, "malformed request: " + ec.message());
    }
  }

  // A whole request is in parser_: answer it.
  void answer() {
    if (server_->stopped_) return;
    const auto& request = parser_->get();
    ++requests_on_connection_;
    bool keep_alive =
        request.keep_alive() && requests_on_connection_ < options().max_requests_per_connection;
    unsigned version = request.version();
    const bool post = request.method() == http::verb::post && options().post_handler;
    if (request.method() != http::verb::get && request.method() != http::verb::head && !post) {
      prepare(version, keep_alive, 405, kTextPlain,
              "method " +
                  std::string(request.method_string().data(), request.method_string().size()) +
                  " not allowed\n",
              false);
      response_.set(http::field::allow, options().post_handler ? "GET, HEAD, POST" : "GET, HEAD");
      write();
      return;
    }
    bool head = request.method() == http::verb::head;
    std::string target(request.target().data(), request.target().size());
    if (std::optional<HttpRefusal> refusal = refused(request, post)) {
      server_->warnings_->warn(server_, "refused request",
                               "refused " + std::to_string(refusal->status) + " to " + peer_ +
                                   " for " + clipValue(target) + ": " +
                                   refusal->body.substr(0, refusal->body.size() - 1));
      prepare(version, keep_alive, refusal->status, kTextPlain, std::move(refusal->body), head);
      if (refusal->bearer_challenge) response_.set(http::field::www_authenticate, "Bearer");
      write();
      return;
    }
    HttpResponse r;
    try {
      r = post ? options().post_handler(target) : server_->handler_(target);
    } catch (const std::exception& e) {
      CPPRUN_LOG(kError) << "http: handler for " << target << " threw: " << e.what();
      r = HttpResponse{500, kTextPlain, "internal error\n"};
    } catch (...) {
      CPPRUN_LOG(kError) << "http: handler for " << target << " threw a non-std exception";
      r = HttpResponse{500, kTextPlain, "internal error\n"};
    }
    if (closed_) return;  // the handler stopped the server
    server_->requests_served_.fetch_add(1, std::memory_order_relaxed);
    if (r.status < 200 || r.status > 599) {
      CPPRUN_LOG(kError) << "http: handler for " << target << " returned status " << r.status;
      r = HttpResponse{500, kTextPlain, "internal error\n"};
    }
    prepare(version, keep_alive, r.status, r.content_type, std::move(r.body), head);
    write();
  }

  // Why options().access refuses the request in parser_, or nullopt.
  std::optional<HttpRefusal> refused(const http::request<http::string_body>& request, bool post) {
    HttpRequestHead head;
    head.post = post;
    for (auto [it, end] = request.equal_range(http::field::host); it != end; ++it) {
      head.hosts.emplace_back(it->value().data(), it->value().size());
    }
    head.has_origin = request.find(http::field::origin) != request.end();
    if (auto it = request.find(http::field::authorization); it != request.end()) {
      head.authorization.emplace(it->value().data(), it->value().size());
    }
    return refuseRequest(options().access, head, options().host, server_->bound_host_);
  }

  // Answers with `status` and closes the connection; the request is not read further.
  void reject(http::status status, const std::string& why) {
    CPPRUN_LOG(kWarn) << "http: " << static_cast<unsigned>(status) << " to " << peer_ << ": "
                      << why;
    prepare(11, false, static_cast<int>(status), kTextPlain, why + "\n", false);
    write();
  }

  void prepare(unsigned version, bool keep_alive, int status, const std::string& content_type,
               std::string body, bool head) {
    response_ = {};
    response_.version(version);
    response_.result(static_cast<unsigned>(status));
    response_.set(http::field::server, "cpprun");
    response_.set(http::field::content_type, content_type);
    response_.keep_alive(keep_alive && !server_->stopped_);
    // HTTP forbids a body in these, and Content-Length in a 204.
    if (status == 204 || status == 304) return;
    response_.content_length(body.size());
    if (!head) response_.body() = std::move(body);
  }

  void write() {
    stream_.expires_after(options().idle_timeout);
    bool close_after = !response_.keep_alive();
    auto self = shared_from_this();
    http::async_write(stream_, response_,
                      [self, close_after](const boost::system::error_code& ec, size_t) {
                        if (self->closed_) return;
                        if (ec) {
                          self->finish();
                        } else if (close_after) {
                          self->drain();
                        } else {
                          self->readRequest();
                        }
                      });
  }

  // Shuts our side down (the client reads EOF after the response), then reads and drops what
  // the client still sends until it closes too or the deadline passes. Closing with unread
  // bytes would make the kernel send a reset, which can destroy the response in flight.
  void drain() {
    boost::system::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    if (ec) {
      finish();
      return;
    }
    buffer_.consume(buffer_.size());
    stream_.expires_after(options().idle_timeout);
    drainSome();
  }

  void drainSome() {
    auto self = shared_from_this();
    stream_.async_read_some(buffer_.prepare(4096),
                            [self](const boost::system::error_code& ec, size_t) {
                              if (self->closed_) return;
                              if (ec) {
                                self->finish();
                                return;
                              }
                              self->drainSome();  // nothing committed: the bytes are dropped
                            });
  }

  void finish() { server_->connectionFinished(shared_from_this()); }

  std::shared_ptr<HttpServer::Impl> server_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;  // one per request
  http::response<http::string_body> response_;
  std::string peer_;
  size_t requests_on_connection_ = 0;
  bool closed_ = false;
};

Status HttpServer::Impl::listen() {
  auto bound = rendezvous::listenTcp(acceptor_, options_.host, options_.port, "HTTP");
  if (!bound.isOk()) return bound.status();
  bound_host_ = bound.value().host;
  bound_port_ = bound.value().port;
  return Status::ok();
}

void HttpServer::Impl::startAccepting() {
  auto hooks = std::make_shared<rendezvous::AcceptHooks>();
  hooks->what = "http";
  hooks->max_connections = options_.max_connections;
  hooks->stopped = [this] { return stopped_; };
  hooks->open_connections = [this] { return connections_.size(); };
  hooks->warnings = warnings_;
  hooks->accepted = [this](tcp::socket socket) {
    auto connection = std::make_shared<HttpConnection>(shared_from_this(), std::move(socket));
    connections_.insert(connection);
    connection->start();
  };
  rendezvous::acceptConnections(shared_from_this(), acceptor_, retry_timer_, std::move(hooks));
}

void HttpServer::Impl::connectionFinished(const std::shared_ptr<HttpConnection>& connection) {
  connections_.erase(connection);
  connection->close();
}

void HttpServer::Impl::stop() {
  if (stopped_) return;
  stopped_ = true;
  boost::system::error_code ec;
  acceptor_.close(ec);
  retry_timer_.cancel();
  warnings_->stop();
  auto connections = std::move(connections_);
  connections_.clear();
  for (const auto& connection : connections) connection->close();
}

Result<std::unique_ptr<HttpServer>> HttpServer::create(asio::io_context& io,
                                                       HttpServerOptions options,
                                                       HttpHandler handler) {
  CPPRUN_CHECK(handler != nullptr);
  auto impl = std::make_shared<Impl>(io, std::move(options), std::move(handler));
  Status s = impl->listen();
  if (!s.isOk()) return s;
  impl->startAccepting();
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

HttpServer::HttpServer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpServer::~HttpServer() { impl_->stop(); }
uint16_t HttpServer::port() const { return impl_->bound_port_; }
const std::string& HttpServer::host() const { return impl_->bound_host_; }
void HttpServer::stop() { impl_->stop(); }
uint64_t HttpServer::requestsServed() const {
  return impl_->requests_served_.load(std::memory_order_relaxed);
}

// The io_context, the server on it and the thread that runs it. Declared in that order: the
// server is destroyed (stopped) before the io_context, the thread joined before either.
struct HttpServerThread::State {
  asio::io_context io{1};
  std::unique_ptr<HttpServer> server;
  std::thread thread;
  bool stopped = false;
};

Result<std::unique_ptr<HttpServerThread>> HttpServerThread::start(HttpServerOptions options,
                                                                  HttpHandler handler,
                                                                  int niceness) {
  auto state = std::make_unique<State>();
  auto server = HttpServer::create(state->io, std::move(options), std::move(handler));
  if (!server.isOk()) return server.status();
  state->server = std::move(server).value();
  // The pending accept keeps io.run() busy until stop() closes the acceptor.
  state->thread = std::thread([io = &state->io, niceness] {
    if (niceness > 0) {
      // Linux applies a thread id's nice value to that thread alone.
      const auto tid = static_cast<id_t>(::syscall(SYS_gettid));
      errno = 0;
      const int now = ::getpriority(PRIO_PROCESS, tid);
      if (errno != 0 || ::setpriority(PRIO_PROCESS, tid, std::min(19, now + niceness)) != 0) {
        CPPRUN_LOG(kWarn) << "http: cannot lower the HTTP thread's priority: "
                          << std::strerror(errno);
      }
    }
    io->run();
  });
  return std::unique_ptr<HttpServerThread>(new HttpServerThread(std::move(state)));
}

HttpServerThread::HttpServerThread(std::unique_ptr<State> state) : state_(std::move(state)) {}
HttpServerThread::~HttpServerThread() { stop(); }
uint16_t HttpServerThread::port() const { return state_->server->port(); }
const std::string& HttpServerThread::host() const { return state_->server->host(); }
uint64_t HttpServerThread::requestsServed() const { return state_->server->requestsServed(); }

void HttpServerThread::stop() {
  if (state_->stopped) return;
  state_->stopped = true;
  // The server stops on its own thread; then nothing is left pending and io.run() returns.
  asio::post(state_->io, [server = state_->server.get()] { server->stop(); });
  state_->thread.join();
}

}  // namespace cpprun::agent
