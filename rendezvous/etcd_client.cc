#include "rendezvous/etcd_client.h"

// clang-format off
#include "common/asio.h"  // <utility> before Boost, see there
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
// clang-format on

#include <algorithm>
#include <atomic>
#include <charconv>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "common/network_address.h"

namespace cpprun::rendezvous {

namespace net = boost::asio;
namespace ssl = boost::asio::ssl;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using boost::system::error_code;

namespace {

// Replies larger than this are refused (a value of etcd is at most 1.5 MiB by default; a
// prefix read of many keys may be bigger).
constexpr uint64_t kMaxReplyBytes = 256ull << 20;

// ---- base64 (the gateway's encoding of bytes fields) ----

constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string base64Encode(const std::string& in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    out += kB64[(v >> 18) & 63];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
    out += kB64[v & 63];
  }
  if (i + 1 == in.size()) {
    uint32_t v = uint8_t(in[i]) << 16;
    out += kB64[(v >> 18) & 63];
    out += kB64[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == in.size()) {
    uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8);
    out += kB64[(v >> 18) & 63];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

// Accepts the standard and the URL-safe alphabet, with or without padding.
std::optional<std::string> base64Decode(const std::string& in) {
  std::string out;
  out.reserve(in.size() / 4 * 3);
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    int v;
    if (c >= 'A' && c <= 'Z') {
      v = c - 'A';
    } else if (c >= 'a' && c <= 'z') {
      v = c - 'a' + 26;
    } else if (c >= '0' && c <= '9') {
      v = c - '0' + 52;
    } else if (c == '+' || c == '-') {
      v = 62;
    } else if (c == '/' || c == '_') {
      v = 63;
    } else if (c == '=') {
      break;
    } else {
      return std::nullopt;
    }
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xff);
    }
  }
  return out;
}

// The range end that selects every key starting with `prefix` (etcd's "prefix + 1").
std::string prefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    auto last = static_cast<uint8_t>(end.back());
    if (last < 0xff) {
      end.back() = static_cast<char>(last + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

// ---- JSON fields of the gateway (int64 as strings, bytes as base64, defaults omitted) ----

int64_t int64Field(const json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return 0;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_string()) {
    const std::string& s = it->get_ref<const std::string&>();
    int64_t v = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec == std::errc() && p == s.data() + s.size()) return v;
  }
  return 0;
}

bool boolField(const json& j, const char* name) {
  auto it = j.find(name);
  return it != j.end() && it->is_boolean() && it->get<bool>();
}

std::string bytesField(const json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end() || !it->is_string()) return {};
  return base64Decode(it->get<std::string>()).value_or(std::string());
}

EtcdKeyValue keyValueFrom(const json& j) {
  EtcdKeyValue kv;
  kv.key = bytesField(j, "key");
  kv.value = bytesField(j, "value");
  kv.create_revision = int64Field(j, "create_revision");
  kv.mod_revision = int64Field(j, "mod_revision");
  kv.version = int64Field(j, "version");
  kv.lease = int64Field(j, "lease");
  return kv;
}

std::vector<EtcdKeyValue> kvsFrom(const json& j) {
  std::vector<EtcdKeyValue> out;
  auto it = j.find("kvs");
  if (it != j.end() && it->is_array()) {
    for (const auto& kv : *it) out.push_back(keyValueFrom(kv));
  }
  return out;
}

int64_t headerRevision(const json& j) {
  auto it = j.find("header");
  return it == j.end() ? 0 : int64Field(*it, "revision");
}

json rangeRequest(const std::string& key, bool prefix, bool count_only = false,
                  bool keys_only = false) {
  json r = {{"key", base64Encode(key)}};
  if (prefix) r["range_end"] = base64Encode(prefixEnd(key));
  if (count_only) r["count_only"] = true;
  if (keys_only) r["keys_only"] = true;
  return r;
}

json putRequest(const std::string& key, const std::string& value, int64_t lease) {
  json r = {{"key", base64Encode(key)}, {"value", base64Encode(value)}};
  if (lease != 0) r["lease"] = std::to_string(lease);
  return r;
}

json deleteRequest(const std::string& key, bool prefix) { return rangeRequest(key, prefix); }

json opRequest(const EtcdOp& op) {
  switch (op.kind) {
    case EtcdOp::Kind::kPut:
      return {{"request_put", putRequest(op.key, op.value, op.lease)}};
    case EtcdOp::Kind::kDelete:
      return {{"request_delete_range", deleteRequest(op.key, op.prefix)}};
    case EtcdOp::Kind::kRange:
      return {{"request_range", rangeRequest(op.key, op.prefix)}};
  }
  return {};
}

json compareRequest(const EtcdCompare& c) {
  static const char* kResult[] = {"EQUAL", "GREATER", "LESS", "NOT_EQUAL"};
  json r = {{"key", base64Encode(c.key)}, {"result", kResult[static_cast<int>(c.op)]}};
  switch (c.target) {
    case EtcdCompare::Target::kVersion:
      r["target"] = "VERSION";
      r["version"] = std::to_string(c.number);
      break;
    case EtcdCompare::Target::kCreateRevision:
      r["target"] = "CREATE";
      r["create_revision"] = std::to_string(c.number);
      break;
    case EtcdCompare::Target::kModRevision:
      r["target"] = "MOD";
      r["mod_revision"] = std::to_string(c.number);
      break;
    case EtcdCompare::Target::kValue:
      r["target"] = "VALUE";
      r["value"] = base64Encode(c.value);
      break;
    case EtcdCompare::Target::kLease:
      r["target"] = "LEASE";
      r["lease"] = std::to_string(c.number);
      break;
  }
  return r;
}

// ---- endpoints ----

struct Endpoint {
  std::string host;  // without brackets
  std::string port;
  std::string name;  // "host:port" as given (brackets kept)
};

Result<Endpoint> parseOneEndpoint(const std::string& entry) {
  std::string e = entry;
  auto trim = [](std::string& s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.erase(s.begin());
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.pop_back();
  };
  trim(e);
  auto bad = [&entry](const std::string& why) -> Status {
    return invalidArgument("bad etcd endpoint '" + entry + "': " + why +
                           " (expected host:port, e.g. 127.0.0.1:2379)");
  };
  if (e.empty()) return bad("empty entry");
  for (const char* scheme : {"http://", "https://"}) {
    if (e.rfind(scheme, 0) == 0) e.erase(0, std::char_traits<char>::length(scheme));
  }
  while (!e.empty() && e.back() == '/') e.pop_back();
  if (e.empty()) return bad("no host");
  if (e.find('/') != std::string::npos) return bad("a path is not allowed");
  AddressSyntax syntax;
  syntax.min_port = 1;
  auto address = parseNetworkAddress(e, syntax);
  if (!address.isOk()) {
    return invalidArgument("bad etcd endpoint " + address.status().message() +
                           " (expected host:port, e.g. 127.0.0.1:2379)");
  }
  Endpoint out;
  out.host = address.value().host;
  out.port = std::to_string(address.value().port);
  out.name = e;
  return out;
}

// ---- one HTTP/1.1 connection, plain or TLS ----

struct HttpReply {
  unsigned status = 0;
  std::string body;
};

enum class FailKind { kNone, kConnect, kTls, kIo, kTimeout };

// A failed exchange: what failed and whether the request bytes had been written.
struct ConnError {
  FailKind kind = FailKind::kNone;
  std::string message;
  bool request_written = false;
};

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

class Connection {
 public:
  Connection(const Endpoint& ep, ssl::context* tls) : ep_(ep), tls_ctx_(tls) {}
  ~Connection() { close(); }

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

// etcd's gRPC codes that mean "try another member": the member has no leader, lost it, is
// stopping, or timed out waiting for raft.
bool retriableEtcdError(unsigned http_status, int grpc_code, const std::string& message) {
  if (grpc_code == 14 /*UNAVAILABLE*/ || grpc_code == 4 /*DEADLINE_EXCEEDED*/) return true;
  if (http_status == 503 || http_status == 502 || http_status == 504) return true;
  for (const char* m : {"leader changed", "no leader", "unavailable", "server stopped",
                        "request timed out", "not capable"}) {
    if (message.find(m) != std::string::npos) return true;
  }
  return false;
}

StatusCode codeOfGrpc(int grpc_code) {
  switch (grpc_code) {
    case 3:   // INVALID_ARGUMENT
    case 11:  // OUT_OF_RANGE
      return StatusCode::kInvalidArgument;
    case 5:  // NOT_FOUND
      return StatusCode::kNotFound;
    case 6:  // ALREADY_EXISTS
      return StatusCode::kAlreadyExists;
    case 8:  // RESOURCE_EXHAUSTED
      return StatusCode::kResourceExhausted;
    case 4:  // DEADLINE_EXCEEDED
      return StatusCode::kTimeout;
    case 14:  // UNAVAILABLE
      return StatusCode::kUnavailable;
    default:
      return StatusCode::kInternal;
  }
}

// The gateway's error body: {"error": "...", "message": "...", "code": N}.
void parseErrorBody(const std::string& body, int* code, std::string* message) {
  json j = json::parse(body, nullptr, false);
  *code = 2;  // UNKNOWN
  *message = body.substr(0, 300);
  if (j.is_discarded() || !j.is_object()) return;
  const json& e = j.contains("error") && j["error"].is_object() ? j["error"] : j;
  if (e.contains("code") && e["code"].is_number_integer()) *code = e["code"].get<int>();
  if (e.contains("message") && e["message"].is_string()) {
    *message = e["message"].get<std::string>();
  } else if (e.contains("error") && e["error"].is_string()) {
    *message = e["error"].get<std::string>();
  }
}

// Each name once, in first-seen order.
std::string joinNames(const std::vector<std::string>& names) {
  std::vector<std::string> seen;
  std::string out;
  for (const auto& n : names) {
    if (std::find(seen.begin(), seen.end(), n) != seen.end()) continue;
    seen.push_back(n);
    if (!out.empty()) out += ", ";
    out += n;
  }
  return out;
}

}  // namespace

Result<std::vector<std::string>> parseEtcdEndpoints(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t comma = text.find(',', start);
    std::string entry =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    auto ep = parseOneEndpoint(entry);
    if (!ep.isOk()) {
      if (entry.empty() && !text.empty()) {
        return invalidArgument("bad etcd endpoint list '" + text + "': empty entry " +
                               std::to_string(out.size() + 1) +
                               " (expected host:port[,host:port...])");
      }
      return ep.status();
    }
    out.push_back(ep.value().name);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

EtcdCompare EtcdCompare::versionIs(std::string key, int64_t version) {
  EtcdCompare c;
  c.key = std::move(key);
  c.target = Target::kVersion;
  c.number = version;
  return c;
}

EtcdCompare EtcdCompare::modRevisionIs(std::string key, int64_t revision) {
  EtcdCompare c;
  c.key = std::move(key);
  c.target = Target::kModRevision;
  c.number = revision;
  return c;
}

EtcdCompare EtcdCompare::valueIs(std::string key, std::string value) {
  EtcdCompare c;
  c.key = std::move(key);
  c.target = Target::kValue;
  c.value = std::move(value);
  return c;
}

EtcdOp EtcdOp::put(std::string key, std::string value, int64_t lease) {
  EtcdOp op;
  op.kind = Kind::kPut;
  op.key = std::move(key);
  op.value = std::move(value);
  op.lease = lease;
  return op;
}

EtcdOp EtcdOp::remove(std::string key, bool prefix) {
  EtcdOp op;
  op.kind = Kind::kDelete;
  op.key = std::move(key);
  op.prefix = prefix;
  return op;
}

EtcdOp EtcdOp::range(std::string key, bool prefix) {
  EtcdOp op;
  op.kind = Kind::kRange;
  op.key = std::move(key);
  op.prefix = prefix;
  return op;
}

class EtcdClient::Impl {
 public:
  explicit Impl(EtcdClientOptions options) : options_(std::move(options)) {}

  Status init() {
    if (options_.endpoints.empty()) return invalidArgument("no etcd endpoints given");
    for (const auto& e : options_.endpoints) {
      auto ep = parseOneEndpoint(e);
      if (!ep.isOk()) return ep.status();
      endpoints_.push_back(ep.value());
    }
    if (options_.connect_timeout.count() <= 0 || options_.request_timeout.count() <= 0) {
      return invalidArgument("etcd connect_timeout and request_timeout must be positive");
    }
    if (options_.tls) {
      ssl_.emplace(ssl::context::tls_client);
      error_code ec;
      if (options_.tls_files.ca_file.empty()) {
        ssl_->set_default_verify_paths(ec);
      } else {
        ssl_->load_verify_file(options_.tls_files.ca_file, ec);
      }
      if (ec) {
        return invalidArgument("etcd TLS: cannot load CA file '" + options_.tls_files.ca_file +
                               "': " + describe(ec));
      }
      if (!options_.tls_files.cert_file.empty()) {
        ssl_->use_certificate_chain_file(options_.tls_files.cert_file, ec);
        if (ec) {
          return invalidArgument("etcd TLS: cannot load client certificate '" +
                                 options_.tls_files.cert_file + "': " + describe(ec));
        }
        ssl_->use_private_key_file(options_.tls_files.key_file, ssl::context::pem, ec);
        if (ec) {
          return invalidArgument("etcd TLS: cannot load client key '" +
                                 options_.tls_files.key_file + "': " + describe(ec));
        }
      }
    }
    // One round over the endpoints: the first that answers GET /version is used.
    std::lock_guard<std::mutex> lock(mutex_);
    std::string errors;
    bool all_tls = true;  // every endpoint refused the handshake: waiting will not mend that
    for (size_t i = 0; i < endpoints_.size(); ++i) {
      current_ = i;
      ConnError error;
      auto reply =
          attempt(http::verb::get, "/version", "", Clock::now() + options_.request_timeout, &error);
      if (reply.isOk() && reply.value().status == 200 &&
          reply.value().body.find("etcdserver") != std::string::npos) {
        return Status::ok();
      }
      if (reply.isOk() || error.kind != FailKind::kTls) all_tls = false;
      conn_.reset();
      std::string why = reply.isOk() ? "HTTP " + std::to_string(reply.value().status) +
                                           " from GET /version (not etcd?)"
                                     : error.message;
      if (!errors.empty()) errors += "; ";
      errors += endpoints_[i].name + ": " + why;
    }
    current_ = 0;
    const std::string message = "cannot connect to etcd (" + tlsNote() + "): " + errors;
    if (options_.tls && all_tls) return invalidArgument(message);
    return unavailable(message);
  }

  // One request with failover. `idempotent`: may be sent again after its reply was lost.
  Result<json> call(const std::string& target, const json& body, bool idempotent) {
    requests_.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(mutex_);
    const std::string payload = body.dump();
    const auto start = Clock::now();
    const auto give_up = start + options_.request_timeout * static_cast<int>(endpoints_.size());
    std::vector<std::string> tried;
    std::string last_error = "no attempt";
    int attempts = 0;
    int round_failures = 0;
    bool round_all_tls = true;
    auto backoff = std::chrono::milliseconds(20);
    while (true) {
      auto now = Clock::now();
      if (now >= give_up) break;
      const Endpoint& ep = endpoints_[current_];
      ++attempts;
      tried.push_back(ep.name);
      ConnError error;
      auto reply = attempt(http::verb::post, target, payload,
                           std::min(give_up, now + options_.request_timeout), &error);
      if (reply.isOk()) {
        markAnswered(current_);
        const HttpReply& r = reply.value();
        if (r.status == 200) {
          json j = json::parse(r.body, nullptr, false);
          if (j.is_discarded() || !j.is_object()) {
            return Status(StatusCode::kProtocolError,
                          "etcd " + ep.name + " " + target +
                              ": reply is not a JSON object: " + r.body.substr(0, 200));
          }
          return j;
        }
        int code = 0;
        std::string message;
        parseErrorBody(r.body, &code, &message);
        if (!retriableEtcdError(r.status, code, message)) {
          return Status(codeOfGrpc(code), "etcd " + ep.name + " " + target + ": " + message);
        }
        last_error = ep.name + ": " + message;
        round_all_tls = false;
        conn_.reset();  // a member without a leader: ask another one
      } else {
        conn_.reset();
        if (!idempotent && error.request_written && error.kind == FailKind::kTimeout) {
          return unavailable("etcd " + ep.name + " " + target + ": " + error.message +
                             " after the request was sent; its outcome is unknown, so it was "
                             "not sent again");
        }
        last_error = ep.name + ": " + error.message;
        if (error.kind != FailKind::kTls) round_all_tls = false;
        if (wentSilent(error.kind)) markSilent(current_);
      }
      current_ = nextEndpoint(current_);
      if (++round_failures >= static_cast<int>(answeringEndpoints())) {
        // Every member failed once. A refused certificate will not get better; anything else
        // (an election, a restarting member) may, so pause a little and go round again.
        if (round_all_tls) break;
        round_failures = 0;
        round_all_tls = true;
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(give_up - Clock::now());
        if (left.count() <= 0) break;
        std::this_thread::sleep_for(std::min(backoff, left));
        backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
      }
    }
    auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
    return unavailable("etcd " + target + " failed on " + joinNames(tried) + " (" +
                       std::to_string(attempts) + " attempts in " + std::to_string(took) + " ms, " +
                       tlsNote() + "); last error: " + last_error);
  }

  Result<std::vector<EtcdEvent>> watch(const std::string& key, bool prefix, int64_t from_revision,
                                       std::chrono::milliseconds timeout,
                                       const std::function<void()>& on_created, bool deletes_only) {
    requests_.fetch_add(1, std::memory_order_relaxed);
    bool created_reported = false;
    const auto start = Clock::now();
    const auto deadline = start + timeout;
    json create = rangeRequest(key, prefix);
    if (from_revision > 0) create["start_revision"] = std::to_string(from_revision);
    if (deletes_only) create["filters"] = json::array({"NOPUT"});
    const std::string payload = json{{"create_request", create}}.dump();
    size_t index;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      index = current_;
    }
    std::vector<std::string> tried;
    std::string last_error = "no attempt";
    auto backoff = std::chrono::milliseconds(20);
    size_t failures = 0;
    while (Clock::now() < deadline) {
      const Endpoint& ep = endpoints_[index];
      tried.push_back(ep.name);
      Connection conn(ep, ssl_ ? &*ssl_ : nullptr);
      ConnError error;
      auto fail = [&](const std::string& message, FailKind kind = FailKind::kIo) {
        last_error = ep.name + ": " + message;
        if (wentSilent(kind)) markSilent(index);
        index = nextEndpoint(index);
        if (++failures >= answeringEndpoints()) {
          failures = 0;
          auto left =
              std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
          std::this_thread::sleep_for(
              std::max(std::chrono::milliseconds(0), std::min(backoff, left)));
          backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
        }
      };
      if (auto e = conn.open(std::min(deadline, Clock::now() + options_.connect_timeout))) {
        fail(e->message, e->kind);
        continue;
      }
      auto status = conn.startStream("/v3/watch", payload, deadline, &error);
      if (!status.isOk()) {
        if (error.kind == FailKind::kTimeout && Clock::now() >= deadline)
          return std::vector<EtcdEvent>{};
        fail(error.message, error.kind);
        continue;
      }
      markAnswered(index);
      if (status.value() != 200) {
        int code = 0;
        std::string message;
        parseErrorBody(conn.readRest(std::min(deadline, Clock::now() + options_.request_timeout)),
                       &code, &message);
        if (retriableEtcdError(status.value(), code, message)) {
          fail(message);
          continue;
        }
        return Status(codeOfGrpc(code), "etcd " + ep.name + " /v3/watch: " + message);
      }
      bool retry = false;
      while (!retry) {
        auto line = conn.readLine(deadline, &error);
        if (!line) {
          if (error.kind == FailKind::kTimeout) return std::vector<EtcdEvent>{};
          fail(error.message);
          retry = true;
          break;
        }
        if (line->empty()) continue;
        json j = json::parse(*line, nullptr, false);
        if (j.is_discarded() || !j.is_object()) {
          return Status(StatusCode::kProtocolError,
                        "etcd " + ep.name + " /v3/watch: not JSON: " + line->substr(0, 200));
        }
        if (j.contains("error")) {
          int code = 0;
          std::string message;
          parseErrorBody(*line, &code, &message);
          if (retriableEtcdError(200, code, message)) {
            fail(message);
            retry = true;
            break;
          }
          return Status(codeOfGrpc(code), "etcd " + ep.name + " /v3/watch: " + message);
        }
        const json& r = j.contains("result") ? j["result"] : j;
        if (boolField(r, "canceled")) {
          int64_t compacted = int64Field(r, "compact_revision");
          if (compacted > 0) {
            return Status(StatusCode::kNotFound,
                          "etcd " + ep.name + " /v3/watch: revision " +
                              std::to_string(from_revision) +
                              " was compacted (oldest kept: " + std::to_string(compacted) + ")");
          }
          std::string reason = r.value("cancel_reason", std::string("no reason given"));
          return unavailable("etcd " + ep.name + " /v3/watch: canceled: " + reason);
        }
        if (boolField(r, "created") && !created_reported) {
          created_reported = true;
          if (on_created) on_created();
        }
        auto events = r.find("events");
        if (events == r.end() || !events->is_array() || events->empty()) continue;
        std::vector<EtcdEvent> out;
        for (const auto& e : *events) {
          EtcdEvent ev;
          ev.type = e.value("type", std::string("PUT")) == "DELETE" ? EtcdEvent::Type::kDelete
                                                                    : EtcdEvent::Type::kPut;
          if (e.contains("kv")) ev.kv = keyValueFrom(e["kv"]);
          out.push_back(std::move(ev));
        }
        return out;
      }
    }
    // The deadline came before every member was asked (a stream that broke as the deadline
    // came, e.g. its member was killed): nothing is known to be unavailable yet, so this is
    // the deadline's empty answer and the caller's next watch asks the next member.
    if (std::set<std::string>(tried.begin(), tried.end()).size() < endpoints_.size()) {
      return std::vector<EtcdEvent>{};
    }
    return unavailable("etcd /v3/watch failed on " + joinNames(tried) + " (" + tlsNote() +
                       "); last error: " + last_error);
  }

  std::string currentEndpoint() {
    std::lock_guard<std::mutex> lock(mutex_);
    return endpoints_[current_].name;
  }

  const EtcdClientOptions& options() const { return options_; }
  uint64_t requestsMade() const { return requests_.load(std::memory_order_relaxed); }

 private:
  // One request on the current endpoint, connecting first when needed. REQUIRES: mutex_ held.
  Result<HttpReply> attempt(http::verb verb, const std::string& target, const std::string& body,
                            Clock::time_point deadline, ConnError* error) {
    if (!conn_) {
      auto conn = std::make_unique<Connection>(endpoints_[current_], ssl_ ? &*ssl_ : nullptr);
      if (auto e = conn->open(std::min(deadline, Clock::now() + options_.connect_timeout))) {
        *error = *e;
        return unavailable(e->message);
      }
      conn_ = std::move(conn);
    }
    auto reply = conn_->exchange(verb, target, body, deadline, error);
    if (!reply.isOk()) conn_.reset();
    return reply;
  }

  void markSilent(size_t i) {
    std::lock_guard<std::mutex> lock(silent_mu_);
    silent_until_.resize(endpoints_.size());
    silent_until_[i] = Clock::now() + options_.request_timeout * 10;
  }
  void markAnswered(size_t i) {
    std::lock_guard<std::mutex> lock(silent_mu_);
    silent_until_.resize(endpoints_.size());
    silent_until_[i] = Clock::time_point{};
  }
  // The next endpoint after `from` that is not silent (the one after `from` if all are).
  size_t nextEndpoint(size_t from) {
    std::lock_guard<std::mutex> lock(silent_mu_);
    silent_until_.resize(endpoints_.size());
    const auto now = Clock::now();
    for (size_t k = 1; k <= endpoints_.size(); ++k) {
      const size_t c = (from + k) % endpoints_.size();
      if (silent_until_[c] <= now) return c;
    }
    return (from + 1) % endpoints_.size();
  }
  // How many endpoints are not silent (at least 1): one round of tries.
  size_t answeringEndpoints() {
    std::lock_guard<std::mutex> lock(silent_mu_);
    silent_until_.resize(endpoints_.size());
    const auto now = Clock::now();
    size_t n = 0;
    for (const auto& t : silent_until_) n += t <= now ? 1 : 0;
    return std::max<size_t>(n, 1);
  }
  static bool wentSilent(FailKind kind) {
    return kind == FailKind::kTimeout || kind == FailKind::kConnect;
  }

  std::string tlsNote() const {
    if (!options_.tls) return "plain HTTP";
    return "TLS with CA '" + options_.tls_files.ca_file + "', client certificate '" +
           options_.tls_files.cert_file + "'";
  }

  EtcdClientOptions options_;
  std::vector<Endpoint> endpoints_;
  std::optional<ssl::context> ssl_;
  std::atomic<uint64_t> requests_{0};  // calls and watches made (requestsMade())
  std::mutex mutex_;
  size_t current_ = 0;                // REQUIRES: mutex_
  std::unique_ptr<Connection> conn_;  // REQUIRES: mutex_
  // Endpoints that went silent (a connection or a request timed out, or was refused) are
  // skipped for a while as long as another one is not: one member cut off by the network must
  // not eat a call's whole budget (one request timeout per try) while the others elect a
  // leader. An endpoint that answers is trusted again at once.
  std::mutex silent_mu_;
  std::vector<Clock::time_point> silent_until_;  // REQUIRES: silent_mu_; by endpoint index
};

Result<std::unique_ptr<EtcdClient>> EtcdClient::connect(EtcdClientOptions options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  Status s = impl->init();
  if (!s.isOk()) return s;
  return std::unique_ptr<EtcdClient>(new EtcdClient(std::move(impl)));
}

EtcdClient::EtcdClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
EtcdClient::~EtcdClient() = default;

std::string EtcdClient::currentEndpoint() const { return impl_->currentEndpoint(); }
const EtcdClientOptions& EtcdClient::options() const { return impl_->options(); }
uint64_t EtcdClient::requestsMade() const { return impl_->requestsMade(); }

Result<std::optional<EtcdKeyValue>> EtcdClient::get(const std::string& key, int64_t* revision) {
  auto r = impl_->call("/v3/kv/range", rangeRequest(key, false), true);
  if (!r.isOk()) return r.status();
  if (revision != nullptr) *revision = headerRevision(r.value());
  auto kvs = kvsFrom(r.value());
  if (kvs.empty()) return std::optional<EtcdKeyValue>();
  return std::optional<EtcdKeyValue>(std::move(kvs.front()));
}

Result<std::vector<EtcdKeyValue>> EtcdClient::getPrefix(const std::string& prefix,
                                                        int64_t* revision, bool keys_only) {
  auto r = impl_->call("/v3/kv/range", rangeRequest(prefix, true, false, keys_only), true);
  if (!r.isOk()) return r.status();
  if (revision != nullptr) *revision = headerRevision(r.value());
  return kvsFrom(r.value());
}

Result<int64_t> EtcdClient::countPrefix(const std::string& prefix) {
  auto r = impl_->call("/v3/kv/range", rangeRequest(prefix, true, true), true);
  if (!r.isOk()) return r.status();
  return int64Field(r.value(), "count");
}

Result<int64_t> EtcdClient::put(const std::string& key, const std::string& value, int64_t lease) {
  auto r = impl_->call("/v3/kv/put", putRequest(key, value, lease), true);
  if (!r.isOk()) return r.status();
  return headerRevision(r.value());
}

Result<int64_t> EtcdClient::deleteKey(const std::string& key) {
  auto r = impl_->call("/v3/kv/deleterange", deleteRequest(key, false), true);
  if (!r.isOk()) return r.status();
  return int64Field(r.value(), "deleted");
}

Result<EtcdTxnResult> EtcdClient::txn(const EtcdTxn& txn) {
  json body = {{"compare", json::array()}, {"success", json::array()}, {"failure", json::array()}};
  for (const auto& c : txn.compare) body["compare"].push_back(compareRequest(c));
  for (const auto& op : txn.success) body["success"].push_back(opRequest(op));
  for (const auto& op : txn.failure) body["failure"].push_back(opRequest(op));
  auto r = impl_->call("/v3/kv/txn", body, false);
  if (!r.isOk()) return r.status();
  const json& j = r.value();
  EtcdTxnResult out;
  out.succeeded = boolField(j, "succeeded");
  out.revision = headerRevision(j);
  const auto& ops = out.succeeded ? txn.success : txn.failure;
  auto responses = j.find("responses");
  for (size_t i = 0; i < ops.size(); ++i) {
    EtcdOpResult op;
    op.kind = ops[i].kind;
    if (responses != j.end() && responses->is_array() && i < responses->size()) {
      const json& resp = (*responses)[i];
      if (resp.contains("response_range")) op.kvs = kvsFrom(resp["response_range"]);
      if (resp.contains("response_delete_range")) {
        op.deleted = int64Field(resp["response_delete_range"], "deleted");
      }
    }
    out.responses.push_back(std::move(op));
  }
  return out;
}

Result<int64_t> EtcdClient::grantLease(std::chrono::seconds ttl, std::chrono::seconds* granted) {
  if (ttl.count() <= 0) {
    return invalidArgument("etcd lease TTL must be positive, got " + std::to_string(ttl.count()));
  }
  auto r = impl_->call("/v3/lease/grant", json{{"TTL", std::to_string(ttl.count())}}, true);
  if (!r.isOk()) return r.status();
  if (r.value().contains("error") && r.value()["error"].is_string() &&
      !r.value()["error"].get<std::string>().empty()) {
    return internalError("etcd lease grant: " + r.value()["error"].get<std::string>());
  }
  int64_t id = int64Field(r.value(), "ID");
  if (id == 0) return Status(StatusCode::kProtocolError, "etcd lease grant: no lease ID in reply");
  if (granted != nullptr) *granted = std::chrono::seconds(int64Field(r.value(), "TTL"));
  return id;
}

Result<std::chrono::seconds> EtcdClient::keepAlive(int64_t lease) {
  auto r = impl_->call("/v3/lease/keepalive", json{{"ID", std::to_string(lease)}}, true);
  if (!r.isOk()) return r.status();
  const json& j = r.value();
  if (j.contains("error")) {
    int code = 0;
    std::string message;
    parseErrorBody(j.dump(), &code, &message);
    return Status(codeOfGrpc(code),
                  "etcd lease keepalive " + std::to_string(lease) + ": " + message);
  }
  const json& res = j.contains("result") ? j["result"] : j;
  int64_t ttl = int64Field(res, "TTL");
  if (ttl <= 0) {
    return Status(StatusCode::kNotFound,
                  "etcd lease " + std::to_string(lease) + " has expired or was revoked");
  }
  return std::chrono::seconds(ttl);
}

Status EtcdClient::revokeLease(int64_t lease) {
  auto r = impl_->call("/v3/lease/revoke", json{{"ID", std::to_string(lease)}}, true);
  return r.isOk() ? Status::ok() : r.status();
}

Result<std::vector<EtcdEvent>> EtcdClient::watch(const std::string& key, bool prefix,
                                                 int64_t from_revision,
                                                 std::chrono::milliseconds timeout,
                                                 const std::function<void()>& on_created,
                                                 bool deletes_only) {
  return impl_->watch(key, prefix, from_revision, timeout, on_created, deletes_only);
}

}  // namespace cpprun::rendezvous
