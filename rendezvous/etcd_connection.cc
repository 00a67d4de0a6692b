#include "rendezvous/etcd_connection.h"

// clang-format off
#include "common/asio.h"  // <utility> before Boost, see there
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
// clang-format on

namespace cpprun::rendezvous::etcd {

namespace net = boost::asio;
namespace ssl = boost::asio::ssl;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using boost::system::error_code;

namespace {

// Replies larger than this are refused (a value of etcd is at most 1.5 MiB by default; a
// prefix read of many keys may be bigger).
constexpr uint64_t kMaxReplyBytes = 256ull << 20;

bool isTlsError(const error_code& ec) {
  return ec.category() == net::error::get_ssl_category() ||
         ec.category() == net::ssl::error::get_stream_category();
}

std::string describe(const error_code& ec) {
  if (ec == beast::error::timeout) return "timed out";
  std::string m = ec.message();
  if (isTlsError(ec)) {
    // OpenSSL's reason ("certificate verify failed", "tlsv13 alert certificate required").
    unsigned long err = static_cast<unsigned long>(ec.value());
    const char* reason = ERR_reason_error_string(err);
    if (reason != nullptr && m.find(reason) == std::string::npos)
      m += std::string(" (") + reason + ")";
  }
  return m;
}

}  // namespace

// ---- TLS settings ----

struct TlsContext::Impl {
  ssl::context context{ssl::context::tls_client};
};

TlsContext::TlsContext(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TlsContext::~TlsContext() = default;

Result<std::unique_ptr<TlsContext>> TlsContext::load(const EtcdTls& files) {
  auto impl = std::make_unique<Impl>();
  ssl::context& ctx = impl->context;
  error_code ec;
  if (files.ca_file.empty()) {
    ctx.set_default_verify_paths(ec);
  } else {
    ctx.load_verify_file(files.ca_file, ec);
  }
  if (ec) {
    return invalidArgument("etcd TLS: cannot load CA file '" + files.ca_file +
                           "': " + describe(ec));
  }
  if (!files.cert_file.empty()) {
    ctx.use_certificate_chain_file(files.cert_file, ec);
    if (ec) {
      return invalidArgument("etcd TLS: cannot load client certificate '" + files.cert_file +
                             "': " + describe(ec));
    }
    ctx.use_private_key_file(files.key_file, ssl::context::pem, ec);
    if (ec) {
      return invalidArgument("etcd TLS: cannot load client key '" + files.key_file +
                             "': " + describe(ec));
    }
  }
  return std::unique_ptr<TlsContext>(new TlsContext(std::move(impl)));
}

// ---- one HTTP/1.1 connection, plain or TLS ----

class Connection::Impl {
 public:
  Impl(const Endpoint& ep, ssl::context* tls) : ep_(ep), tls_ctx_(tls) {}
  ~Impl() { close(); }

  const Endpoint& endpoint() const { return ep_; }
  // How many replies this connection has carried.
  int exchanges() const { return exchanges_; }

  std::optional<ConnError> open(Clock::time_point deadline) {
    error_code ec;
    net::ip::tcp::resolver resolver(ioc_);
    auto results = resolver.resolve(ep_.host, ep_.port, ec);
    if (ec)
      return ConnError{FailKind::kConnect, "cannot resolve " + ep_.host + ": " + ec.message()};
    if (tls_ctx_ == nullptr) {
      plain_.emplace(ioc_);
      plain_->expires_at(deadline);
      plain_->async_connect(results, [&](error_code e, const auto&) { ec = e; });
      run();
      if (ec) return connectError(ec);
      plain_->socket().set_option(net::ip::tcp::no_delay(true), ec);
      return std::nullopt;
    }
    tls_.emplace(ioc_, *tls_ctx_);
    error_code not_ip;
    net::ip::make_address(ep_.host, not_ip);
    if (not_ip) {  // SNI carries names only
      SSL_ctrl(tls_->native_handle(), SSL_CTRL_SET_TLSEXT_HOSTNAME, TLSEXT_NAMETYPE_host_name,
               const_cast<char*>(ep_.host.c_str()));
    }
    tls_->set_verify_mode(ssl::verify_peer);
    tls_->set_verify_callback(ssl::host_name_verification(ep_.host));
    beast::get_lowest_layer(*tls_).expires_at(deadline);
    beast::get_lowest_layer(*tls_).async_connect(results,
                                                 [&](error_code e, const auto&) { ec = e; });
    run();
    if (ec) return connectError(ec);
    beast::get_lowest_layer(*tls_).socket().set_option(net::ip::tcp::no_delay(true), ec);
    tls_->async_handshake(ssl::stream_base::client, [&](error_code e) { ec = e; });
    run();
    if (ec) {
      return ConnError{ec == beast::error::timeout ? FailKind::kTimeout : FailKind::kTls,
                       "TLS handshake failed: " + describe(ec)};
    }
    return std::nullopt;
  }

  // Sends one request and reads the whole reply.
  Result<HttpReply> exchange(http::verb verb, const std::string& target, const std::string& body,
                             Clock::time_point deadline, ConnError* error) {
    if (auto e = send(verb, target, body, deadline)) {
      *error = *e;
      return unavailable(e->message);
    }
    http::response_parser<http::string_body> parser;
    parser.body_limit(kMaxReplyBytes);
    error_code ec;
    withStream([&](auto& s) {
      beast::get_lowest_layer(s).expires_at(deadline);
      http::async_read(s, buffer_, parser, [&](error_code e, size_t) { ec = e; });
    });
    run();
    if (ec) {
      *error = readError(ec, "reading the reply");
      return unavailable(error->message);
    }
    ++exchanges_;
    auto reply = parser.release();
    if (!reply.keep_alive()) close();
    return HttpReply{reply.result_int(), std::move(reply.body())};
  }

  // Starts a streamed request (a watch): sends it and reads the reply's header.
  Result<unsigned> startStream(const std::string& target, const std::string& body,
                               Clock::time_point deadline, ConnError* error) {
    if (auto e = send(http::verb::post, target, body, deadline)) {
      *error = *e;
      return unavailable(e->message);
    }
    stream_parser_.emplace();
    stream_parser_->body_limit(boost::none);
    error_code ec;
    withStream([&](auto& s) {
      beast::get_lowest_layer(s).expires_at(deadline);
      http::async_read_header(s, buffer_, *stream_parser_, [&](error_code e, size_t) { ec = e; });
    });
    run();
    if (ec) {
      *error = readError(ec, "reading the reply");
      return unavailable(error->message);
    }
    ++exchanges_;
    return stream_parser_->get().result_int();
  }

  // The next newline-delimited message of a started stream; nullopt with error->kind set on
  // failure (kTimeout when the deadline passed), or when the stream ended (kIo).
  std::optional<std::string> readLine(Clock::time_point deadline, ConnError* error) {
    while (true) {
      std::string& body = stream_parser_->get().body();
      auto nl = body.find('\n');
      if (nl != std::string::npos) {
        std::string line = body.substr(0, nl);
        body.erase(0, nl + 1);
        return line;
      }
      if (stream_parser_->is_done()) {
        if (!body.empty()) {
          std::string line = std::move(body);
          body.clear();
          return line;
        }
        *error = ConnError{FailKind::kIo, "the stream ended", true};
        return std::nullopt;
      }
      error_code ec;
      withStream([&](auto& s) {
        beast::get_lowest_layer(s).expires_at(deadline);
        http::async_read_some(s, buffer_, *stream_parser_, [&](error_code e, size_t) { ec = e; });
      });
      run();
      if (ec) {
        *error = readError(ec, "reading the stream");
        return std::nullopt;
      }
    }
  }

  // The rest of a started stream (an error reply), bounded by the deadline.
  std::string readRest(Clock::time_point deadline) {
    error_code ec;
    withStream([&](auto& s) {
      beast::get_lowest_layer(s).expires_at(deadline);
      http::async_read(s, buffer_, *stream_parser_, [&](error_code e, size_t) { ec = e; });
    });
    run();
    return stream_parser_->get().body();
  }

  void close() {
    error_code ignored;
    if (plain_) plain_->socket().close(ignored);
    if (tls_) beast::get_lowest_layer(*tls_).socket().close(ignored);
    plain_.reset();
    tls_.reset();
  }

 private:
  template <typename F>
  void withStream(F&& f) {
    if (tls_) {
      f(*tls_);
    } else {
      f(*plain_);
    }
  }

  void run() {
    ioc_.restart();
    ioc_.run();
  }

  ConnError connectError(const error_code& ec) {
    return ConnError{ec == beast::error::timeout ? FailKind::kTimeout : FailKind::kConnect,
                     "connect: " + describe(ec)};
  }

  ConnError readError(const error_code& ec, const std::string& what) {
    ConnError e;
    e.request_written = true;
    if (ec == beast::error::timeout) {
      e.kind = FailKind::kTimeout;
      e.message = what + ": timed out";
    } else if (tls_ && exchanges_ == 0) {
      // TLS 1.3: the server checks the client certificate after the client's handshake ends,
      // so a refused certificate shows on the first exchange: as the server's alert, or, when
      // the request was still being written, as a reset connection.
      e.kind = FailKind::kTls;
      e.message = isTlsError(ec)
                      ? "TLS handshake failed (the server refused this client): " + describe(ec)
                      : "TLS handshake failed (the server dropped the connection "
                        "right after it; a refused client certificate?): " +
                            what + ": " + describe(ec);
    } else {
      e.kind = FailKind::kIo;
      e.message = what + ": " + describe(ec);
    }
    return e;
  }

  std::optional<ConnError> send(http::verb verb, const std::string& target, const std::string& body,
                                Clock::time_point deadline) {
    if (!plain_ && !tls_) return ConnError{FailKind::kIo, "not connected"};
    http::request<http::string_body> req{verb, target, 11};
    req.set(http::field::host, ep_.name);
    req.set(http::field::user_agent, "cpprun");
    if (verb == http::verb::post) req.set(http::field::content_type, "application/json");
    req.keep_alive(true);
    req.body() = body;
    req.prepare_payload();
    error_code ec;
    withStream([&](auto& s) {
      beast::get_lowest_layer(s).expires_at(deadline);
      http::async_write(s, req, [&](error_code e, size_t) { ec = e; });
    });
    run();
    if (ec) {
      ConnError e = readError(ec, "sending the request");
      e.request_written = false;  // not all of it: etcd cannot have acted on it
      return e;
    }
    return std::nullopt;
  }

  Endpoint ep_;
  ssl::context* tls_ctx_;
  net::io_context ioc_;
  std::optional<beast::tcp_stream> plain_;
  std::optional<beast::ssl_stream<beast::tcp_stream>> tls_;
  beast::flat_buffer buffer_;
  std::optional<http::response_parser<http::string_body>> stream_parser_;
  int exchanges_ = 0;
};

// ---- Connection: forwards to Impl ----

Connection::Connection(const Endpoint& ep, TlsContext* tls)
    : impl_(std::make_unique<Impl>(ep, tls == nullptr ? nullptr : &tls->impl().context)) {}
Connection::~Connection() = default;

const Endpoint& Connection::endpoint() const { return impl_->endpoint(); }
int Connection::exchanges() const { return impl_->exchanges(); }

std::optional<ConnError> Connection::open(Clock::time_point deadline) {
  return impl_->open(deadline);
}

Result<HttpReply> Connection::exchange(Verb verb, const std::string& target,
                                       const std::string& body, Clock::time_point deadline,
                                       ConnError* error) {
  return impl_->exchange(verb == Verb::kGet ? http::verb::get : http::verb::post, target, body,
                         deadline, error);
}

Result<unsigned> Connection::startStream(const std::string& target, const std::string& body,
                                         Clock::time_point deadline, ConnError* error) {
  return impl_->startStream(target, body, deadline, error);
}

std::optional<std::string> Connection::readLine(Clock::time_point deadline, ConnError* error) {
  return impl_->readLine(deadline, error);
}

std::string Connection::readRest(Clock::time_point deadline) { return impl_->readRest(deadline); }

void Connection::close() { impl_->close(); }

}  // namespace cpprun::rendezvous::etcd
