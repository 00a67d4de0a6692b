// The agent's HTTP server: the handler's answers, HEAD, keep-alive, rejected requests, limits,
// idle timeouts, abuse (header bombs, request smuggling, idle connections, slowloris), binding,
// stop(), HttpServerThread, and the access checks (Host, Origin, bearer token: http_access.h).
// The server runs on an io_context in a thread of its own; the tests talk to it over plain
// blocking sockets, each with a receive timeout.
#include "agent/observability/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "agent/observability/http_access.h"
#include "common/asio.h"

namespace {

using namespace cpprun;
using namespace cpprun::agent;
using namespace std::chrono_literals;
namespace asio = boost::asio;

// Answers /healthz, /metrics, /echo... (the body is the target) and /throw; 404 otherwise.
HttpResponse testHandler(const std::string& target) {
  if (target == "/healthz") return HttpResponse{200, "text/plain; charset=utf-8", "ok\n"};
  if (target == "/metrics") {
    return HttpResponse{200, "text/plain; version=0.0.4", "cpprun_workers_running 4\n"};
  }
  if (target.rfind("/echo", 0) == 0) return HttpResponse{200, "text/plain", target};
  if (target == "/throw") throw std::runtime_error("boom");
  return HttpResponse{404, "text/plain; charset=utf-8", "no such page\n"};
}

// An io_context running on its own thread with an HttpServer on it.
class TestServer {
 public:
  explicit TestServer(HttpServerOptions options = {}, HttpHandler handler = testHandler) {
    auto server = HttpServer::create(io_, std::move(options), std::move(handler));
    REQUIRE(server.isOk());
    server_ = std::move(server).value();
    thread_ = std::thread([this] {
      io_.run();
      loop_done_.set_value();
    });
  }
  ~TestServer() {
    if (!thread_.joinable()) return;
    postStop();
    if (!loopFinished()) io_.stop();
    thread_.join();
  }
  TestServer(const TestServer&) = delete;
  TestServer& operator=(const TestServer&) = delete;

  uint16_t port() const { return server_->port(); }
  HttpServer& server() { return *server_; }

  void postStop() {
    asio::post(io_, [this] { server_->stop(); });
  }
  // True once io.run() has returned (waits up to 5 s).
  bool loopFinished() { return loop_done_future_.wait_for(5s) == std::future_status::ready; }
  // Read on the loop thread.
  uint64_t requestsServed() {
    std::promise<uint64_t> result;
    asio::post(io_, [&] { result.set_value(server_->requestsServed()); });
    auto future = result.get_future();
    REQUIRE(future.wait_for(5s) == std::future_status::ready);
    return future.get();
  }

 private:
  asio::io_context io_{1};
  std::unique_ptr<HttpServer> server_;
  std::promise<void> loop_done_;
  std::future<void> loop_done_future_ = loop_done_.get_future();
  std::thread thread_;
};

struct Response {
  int status = 0;
  std::map<std::string, std::string> headers;  // names in lower case
  std::string body;

  std::string header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? "" : it->second;
  }
  bool has(const std::string& name) const { return headers.count(name) != 0; }
};

// A blocking TCP connection to 127.0.0.1 whose reads give up after `timeout`.
class Client {
 public:
  explicit Client(uint16_t port, std::chrono::milliseconds timeout = 5s) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd_ >= 0);
    timeval tv{};
    tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
    tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
    REQUIRE(::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) == 0);
    REQUIRE(::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) == 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    REQUIRE(::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr) == 1);
    REQUIRE(::connect(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0);
  }
  ~Client() { ::close(fd_); }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  bool send(const std::string& data) {
    size_t sent = 0;
    while (sent < data.size()) {
      ssize_t n = ::send(fd_, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return false;
      sent += static_cast<size_t>(n);
    }
    return true;
  }

  std::optional<Response> get(const std::string& target, const std::string& extra_headers = "") {
    if (!send("GET " + target + " HTTP/1.1\r\nHost: test\r\n" + extra_headers + "\r\n")) {
      return std::nullopt;
    }
    return readResponse();
  }

  // One response: the header, then Content-Length bytes of body (none if `head`).
  std::optional<Response> readResponse(bool head = false) {
    size_t end;
    while ((end = pending_.find("\r\n\r\n")) == std::string::npos) {
      if (!readMore()) return std::nullopt;
    }
    Response r;
    std::string header = pending_.substr(0, end + 2);
    pending_.erase(0, end + 4);
    size_t line_end = header.find("\r\n");
    std::string status_line = header.substr(0, line_end);
    if (status_line.rfind("HTTP/1.", 0) != 0 || status_line.size() < 12) return std::nullopt;
    r.status = std::stoi(status_line.substr(9, 3));
    for (size_t pos = line_end + 2; pos < header.size();) {
      size_t next = header.find("\r\n", pos);
      std::string line = header.substr(pos, next - pos);
      pos = next + 2;
      size_t colon = line.find(':');
      if (colon == std::string::npos) return std::nullopt;
      std::string name = line.substr(0, colon);
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      size_t value_start = line.find_first_not_of(' ', colon + 1);
      r.headers[name] = value_start == std::string::npos ? "" : line.substr(value_start);
    }
    size_t length = r.has("content-length") && !head ? std::stoul(r.header("content-length")) : 0;
    while (pending_.size() < length) {
      if (!readMore()) return std::nullopt;
    }
    r.body = pending_.substr(0, length);
    pending_.erase(0, length);
    return r;
  }

  enum class End { kEof, kReset, kTimeout, kData };
  // How the stream ends from here: kEof or kReset with no more bytes, kData if bytes arrive,
  // kTimeout if nothing happens within the receive timeout.
  End readEnd() {
    if (!pending_.empty()) return End::kData;
    char c;
    ssize_t n = ::recv(fd_, &c, 1, 0);
    if (n == 0) return End::kEof;
    if (n > 0) return End::kData;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return End::kTimeout;
    return End::kReset;
  }

  // Bytes received so far but not yet consumed by readResponse().
  const std::string& pending() const { return pending_; }

  // Whether the server closed (or reset) the connection within `wait`: readable with no data.
  // Bytes that arrive meanwhile are kept for readResponse().
  bool closedWithin(std::chrono::milliseconds wait) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(wait.count())) <= 0) return false;
    char buf[4096];
    ssize_t n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) {
      pending_.append(buf, static_cast<size_t>(n));
      return false;
    }
    return n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
  }

 private:
  bool readMore() {
    char buf[4096];
    ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n <= 0) return false;
    pending_.append(buf, static_cast<size_t>(n));
    return true;
  }

  int fd_ = -1;
  std::string pending_;
};

}  // namespace

TEST_CASE("http: GET returns the handler's status, body and content type", "[integration][http]") {
  TestServer server;
  Client client(server.port());

  auto metrics = client.get("/metrics");
  REQUIRE(metrics);
  CHECK(metrics->status == 200);
  CHECK(metrics->body == "cpprun_workers_running 4\n");
  CHECK(metrics->header("content-type") == "text/plain; version=0.0.4");
  CHECK(metrics->header("content-length") == std::to_string(metrics->body.size()));
  CHECK(metrics->header("server") == "cpprun");

  auto missing = client.get("/nowhere");
  REQUIRE(missing);
  CHECK(missing->status == 404);
  CHECK(missing->body == "no such page\n");
  CHECK(missing->header("content-type") == "text/plain; charset=utf-8");

  auto echo = client.get("/echo?verbose=1&x=%20");
  REQUIRE(echo);
  CHECK(echo->body == "/echo?verbose=1&x=%20");  // the target as sent, query included

  CHECK(server.requestsServed() == 3);
}

TEST_CASE("http: a handler that throws gets 500, and the server goes on", "[integration][http]") {
  TestServer server;
  Client client(server.port());
  auto thrown = client.get("/throw");
  REQUIRE(thrown);
  CHECK(thrown->status == 500);
  CHECK(thrown->header("server") == "cpprun");
  auto ok = client.get("/healthz");
  REQUIRE(ok);
  CHECK(ok->status == 200);
}

TEST_CASE("http: HEAD returns the headers of a GET without the body", "[integration][http]") {
  TestServer server;
  Client client(server.port());
  // A GET follows on the same connection: had the HEAD response carried a body, the bytes read
  // next would be that body instead of the GET's status line.
  REQUIRE(
      client.send("HEAD /metrics HTTP/1.1\r\nHost: test\r\n\r\n"
                  "GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n"));
  auto head = client.readResponse(/*head=*/true);
  REQUIRE(head);
  CHECK(head->status == 200);
  CHECK(head->header("content-length") ==
        std::to_string(std::string("cpprun_workers_running 4\n").size()));
  CHECK(head->header("content-type") == "text/plain; version=0.0.4");
  CHECK(head->header("server") == "cpprun");
  auto get = client.readResponse();
  REQUIRE(get);
  CHECK(get->status == 200);
  CHECK(get->body == "ok\n");
}

TEST_CASE("http: keep-alive serves several requests on one connection", "[integration][http]") {
  TestServer server;
  Client client(server.port());

  SECTION("one after the other") {
    auto first = client.get("/healthz");
    REQUIRE(first);
    CHECK(first->body == "ok\n");
    CHECK(first->header("connection") != "close");
    auto second = client.get("/metrics");
    REQUIRE(second);
    CHECK(second->body == "cpprun_workers_running 4\n");
  }

  SECTION("pipelined, answered in order") {
    REQUIRE(
        client.send("GET /echo1 HTTP/1.1\r\nHost: test\r\n\r\n"
                    "GET /echo2 HTTP/1.1\r\nHost: test\r\n\r\n"));
    auto first = client.readResponse();
    auto second = client.readResponse();
    REQUIRE(first);
    REQUIRE(second);
    CHECK(first->body == "/echo1");
    CHECK(second->body == "/echo2");
  }

  SECTION("Connection: close is honoured") {
    auto response = client.get("/healthz", "Connection: close\r\n");
    REQUIRE(response);
    CHECK(response->status == 200);
    CHECK(response->header("connection") == "close");
    CHECK(client.readEnd() == Client::End::kEof);
  }

  SECTION("HTTP/1.0 without keep-alive is closed after the response") {
    REQUIRE(client.send("GET /healthz HTTP/1.0\r\n\r\n"));
    auto response = client.readResponse();
    REQUIRE(response);
    CHECK(response->status == 200);
    CHECK(response->body == "ok\n");
    CHECK(client.readEnd() == Client::End::kEof);
  }
}

TEST_CASE("http: methods other than GET and HEAD get 405 with Allow", "[integration][http]") {
  TestServer server;
  Client client(server.port());
  REQUIRE(client.send("POST /healthz HTTP/1.1\r\nHost: test\r\nContent-Length: 5\r\n\r\nhello"));
  auto post = client.readResponse();
  REQUIRE(post);
  CHECK(post->status == 405);
  CHECK(post->header("allow") == "GET, HEAD");
  CHECK(post->header("content-type") == "text/plain; charset=utf-8");
  CHECK(post->header("content-length") == std::to_string(post->body.size()));
  CHECK(post->header("server") == "cpprun");
  // The request was read whole, so the connection stays usable.
  auto get = client.get("/healthz");
  REQUIRE(get);
  CHECK(get->status == 200);
  CHECK(server.requestsServed() == 1);  // the handler never saw the POST
}

TEST_CASE("http: POST goes to the post handler when there is one, and Allow says POST",
          "[integration][http]") {
  HttpServerOptions options;
  options.post_handler = [](const std::string& target) {
    return HttpResponse{target == "/leave" ? 202 : 404, "text/plain; charset=utf-8",
                        "posted " + target + "\n"};
  };
  TestServer server(options);
  Client client(server.port());
  REQUIRE(client.send("POST /leave HTTP/1.1\r\nHost: test\r\nContent-Length: 5\r\n\r\nhello"));
  auto post = client.readResponse();
  REQUIRE(post);
  CHECK(post->status == 202);
  CHECK(post->body == "posted /leave\n");
  // GET still goes to the GET handler on the same connection; other methods get 405.
  auto get = client.get("/healthz");
  REQUIRE(get);
  CHECK(get->status == 200);
  REQUIRE(client.send("DELETE /leave HTTP/1.1\r\nHost: test\r\n\r\n"));
  auto del = client.readResponse();
  REQUIRE(del);
  CHECK(del->status == 405);
  CHECK(del->header("allow") == "GET, HEAD, POST");
}

TEST_CASE("http: a malformed request gets 400 and only its connection is closed",
          "[integration][http]") {
  TestServer server;
  Client bystander(server.port());
  REQUIRE(bystander.get("/healthz"));

  Client bad(server.port());
  REQUIRE(bad.send("\x01\x02garbage that is not HTTP\r\n\r\n"));
  auto response = bad.readResponse();
  REQUIRE(response);
  CHECK(response->status == 400);
  CHECK(response->header("connection") == "close");
  CHECK(response->header("content-type") == "text/plain; charset=utf-8");
  CHECK(response->header("content-length") == std::to_string(response->body.size()));
  CHECK(bad.readEnd() == Client::End::kEof);

  auto still = bystander.get("/metrics");
  REQUIRE(still);
  CHECK(still->status == 200);
}

TEST_CASE("http: a request over max_request_bytes is rejected and closed", "[integration][http]") {
  HttpServerOptions options;
  options.max_request_bytes = 1024;
  TestServer server(options);
  Client client(server.port());

  SECTION("a header too large: 431") {
    REQUIRE(client.send("GET /healthz HTTP/1.1\r\nHost: test\r\nX-Pad: " + std::string(4000, 'a') +
                        "\r\n\r\n"));
    auto response = client.readResponse();
    REQUIRE(response);
    CHECK(response->status == 431);
    CHECK(response->header("connection") == "close");
    CHECK(client.readEnd() == Client::End::kEof);
  }

  SECTION("a Content-Length too large: 413 before the body is sent") {
    REQUIRE(client.send("GET /healthz HTTP/1.1\r\nHost: test\r\nContent-Length: 5000\r\n\r\n"));
    auto response = client.readResponse();
    REQUIRE(response);
    CHECK(response->status == 413);
    CHECK(client.readEnd() == Client::End::kEof);
  }

  SECTION("header and body together too large: 413") {
    // Each part fits the limit alone, not both together.
    std::string pad(600, 'p');
    REQUIRE(client.send("POST /healthz HTTP/1.1\r\nHost: test\r\nX-Pad: " + pad +
                        "\r\nContent-Length: 600\r\n\r\n" + pad));
    auto response = client.readResponse();
    REQUIRE(response);
    CHECK(response->status == 413);
    CHECK(client.readEnd() == Client::End::kEof);
  }

  SECTION("a chunked body too large: 413") {
    REQUIRE(
        client.send("POST /healthz HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n"
                    "7d0\r\n" +
                    std::string(2000, 'c') + "\r\n0\r\n\r\n"));
    auto response = client.readResponse();
    REQUIRE(response);
    CHECK(response->status == 413);
    CHECK(client.readEnd() == Client::End::kEof);
  }

  SECTION("just under the limit is served") {
    auto response = client.get("/healthz", "X-Pad: " + std::string(900, 'a') + "\r\n");
    REQUIRE(response);
    CHECK(response->status == 200);
  }
}

TEST_CASE("http: a silent client is closed after idle_timeout and stalls nobody",
          "[integration][http]") {
  HttpServerOptions options;
  options.idle_timeout = 200ms;
  TestServer server(options);

  SECTION("silent mid-request") {
    Client slow(server.port());
    auto sent_at = std::chrono::steady_clock::now();
    REQUIRE(slow.send("GET /healthz HTTP/1.1\r\nHo"));
    // Another client is served while the first one's request hangs half-way.
    Client other(server.port());
    auto response = other.get("/healthz");
    REQUIRE(response);
    CHECK(response->status == 200);
    CHECK(slow.readEnd() == Client::End::kEof);
    auto waited = std::chrono::steady_clock::now() - sent_at;
    CHECK(waited >= 100ms);  // the timer started at accept, a little before the send
    CHECK(waited < 4s);
  }

  SECTION("silent between keep-alive requests") {
    Client idle(server.port());
    REQUIRE(idle.get("/healthz"));
    auto served_at = std::chrono::steady_clock::now();
    CHECK(idle.readEnd() == Client::End::kEof);
    auto waited = std::chrono::steady_clock::now() - served_at;
    CHECK(waited >= 150ms);
    CHECK(waited < 4s);
  }
}

TEST_CASE("http: connections beyond max_connections are closed at once", "[integration][http]") {
  HttpServerOptions options;
  options.max_connections = 1;
  TestServer server(options);
  Client first(server.port());
  REQUIRE(first.get("/healthz"));  // accepted and counted
  Client second(server.port());
  auto end = second.readEnd();
  CHECK((end == Client::End::kEof || end == Client::End::kReset));
  auto again = first.get("/healthz");
  REQUIRE(again);
  CHECK(again->status == 200);
}

TEST_CASE("http: port 0 binds a free port", "[integration][http]") {
  TestServer server;
  CHECK(server.port() != 0);
  CHECK(server.server().host() == "127.0.0.1");
  Client client(server.port());
  auto response = client.get("/healthz");
  REQUIRE(response);
  CHECK(response->status == 200);
}

TEST_CASE("http: a port in use and a bad host are clear errors", "[integration][http]") {
  asio::io_context io;
  auto first = HttpServer::create(io, {}, testHandler);
  REQUIRE(first.isOk());
  uint16_t port = first.value()->port();

  HttpServerOptions options;
  options.port = port;
  auto second = HttpServer::create(io, options, testHandler);
  REQUIRE_FALSE(second.isOk());
  CHECK(second.status().code() == StatusCode::kAlreadyExists);
  CHECK_THAT(second.status().message(), Catch::Contains("127.0.0.1:" + std::to_string(port)));

  options.port = 0;
  options.host = "no-such-host.invalid";
  auto third = HttpServer::create(io, options, testHandler);
  REQUIRE_FALSE(third.isOk());
  CHECK(third.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(third.status().message(), Catch::Contains("no-such-host.invalid"));
}

TEST_CASE("http: stop() closes open connections and lets the loop finish", "[integration][http]") {
  std::atomic<int> calls{0};
  TestServer server({}, [&](const std::string& target) {
    ++calls;
    return testHandler(target);
  });
  Client served(server.port());
  REQUIRE(served.get("/healthz"));  // accepted, now waiting for its next request
  Client half(server.port());
  REQUIRE(half.send("GET /healthz HTTP/1.1\r\n"));  // a read pending mid-request
  Client connected(server.port());
  REQUIRE(connected.get("/metrics"));
  REQUIRE(half.pending().empty());

  server.postStop();
  CHECK(served.readEnd() == Client::End::kEof);
  auto half_end = half.readEnd();
  CHECK((half_end == Client::End::kEof || half_end == Client::End::kReset));
  CHECK(connected.readEnd() == Client::End::kEof);
  CHECK(server.loopFinished());  // nothing is left pending: io.run() returned
  // The request completed after stop() never reaches the handler.
  half.send("Host: test\r\n\r\n");
  CHECK(half.readEnd() != Client::End::kData);
  CHECK(calls == 2);
}

TEST_CASE("http: a server destroyed before its loop ever ran leaves nothing behind",
          "[unit][http]") {
  asio::io_context io;
  {
    auto server = HttpServer::create(io, {}, testHandler);
    REQUIRE(server.isOk());
  }
  io.run();  // the cancelled accept completes; nothing else is queued
  SUCCEED();
}

TEST_CASE("http: the response to a connection's last allowed request closes it",
          "[integration][http]") {
  HttpServerOptions options;
  options.max_requests_per_connection = 3;
  TestServer server(options);
  Client client(server.port());
  for (int i = 1; i <= 2; ++i) {
    auto response = client.get("/healthz");
    REQUIRE(response);
    CHECK(response->header("connection") != "close");
  }
  auto last = client.get("/healthz");
  REQUIRE(last);
  CHECK(last->status == 200);
  CHECK(last->header("connection") == "close");
  CHECK(client.readEnd() == Client::End::kEof);
  Client next(server.port());  // a new connection starts a new count
  REQUIRE(next.get("/healthz"));
}

TEST_CASE("http: header bombs get 431 and leave other clients served", "[integration][http]") {
  TestServer server;  // the default limit: 16 KiB per request
  Client bystander(server.port());
  REQUIRE(bystander.get("/healthz"));

  SECTION("many small headers") {
    std::string headers;
    for (int i = 0; i < 5000; ++i) headers += "X-" + std::to_string(i) + ": b\r\n";
    Client bomb(server.port());
    bomb.send("GET /healthz HTTP/1.1\r\nHost: test\r\n" + headers + "\r\n");  // may be cut off
    auto response = bomb.readResponse();
    REQUIRE(response);
    CHECK(response->status == 431);
    auto end = bomb.readEnd();
    CHECK((end == Client::End::kEof || end == Client::End::kReset));
  }

  SECTION("one header of 8 MiB, no end in sight") {
    Client bomb(server.port(), 10s);
    // The server answers once 16 KiB are in and stops reading: the rest of the send may fail.
    bomb.send("GET /healthz HTTP/1.1\r\nHost: test\r\nX-Bomb: " + std::string(8 << 20, 'a'));
    auto response = bomb.readResponse();
    if (response) CHECK(response->status == 431);  // or reset under unread bytes
    auto end = bomb.readEnd();
    CHECK(end != Client::End::kTimeout);
  }

  auto still = bystander.get("/metrics");
  REQUIRE(still);
  CHECK(still->status == 200);
  CHECK(server.requestsServed() == 2);  // the bombs never reached the handler
}

TEST_CASE("http: request smuggling is refused with 400 and the connection closed",
          "[integration][http]") {
  TestServer server;
  Client client(server.port());
  // Each hides a second request in what one reading would take as the first one's body.
  const std::string hidden = "GET /echo-smuggled HTTP/1.1\r\nHost: test\r\n\r\n";
  const std::string length = std::to_string(hidden.size());

  SECTION("Content-Length and Transfer-Encoding together") {
    REQUIRE(client.send("POST /healthz HTTP/1.1\r\nHost: test\r\nContent-Length: " + length +
                        "\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + hidden));
  }
  SECTION("Transfer-Encoding before Content-Length") {
    REQUIRE(
        client.send("POST /healthz HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked"
                    "\r\nContent-Length: " +
                    length + "\r\n\r\n0\r\n\r\n" + hidden));
  }
  SECTION("two different Content-Lengths") {
    REQUIRE(
        client.send("POST /healthz HTTP/1.1\r\nHost: test\r\nContent-Length: 0\r\n"
                    "Content-Length: " +
                    length + "\r\n\r\n" + hidden));
  }
  SECTION("a chunk size that is not hex") {
    REQUIRE(
        client.send("POST /healthz HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked"
                    "\r\n\r\nzz\r\n" +
                    hidden));
  }
  auto response = client.readResponse();
  REQUIRE(response);
  CHECK(response->status == 400);
  CHECK(response->header("connection") == "close");
  CHECK(client.readEnd() == Client::End::kEof);  // the hidden request is never answered
  CHECK(server.requestsServed() == 0);
}

TEST_CASE("http: a GET's body is read as its body, never as the next request",
          "[integration][http]") {
  TestServer server;
  Client client(server.port());
  const std::string hidden = "GET /echo-smuggled HTTP/1.1\r\nHost: test\r\n\r\n";
  REQUIRE(client.send(
      "GET /echo-first HTTP/1.1\r\nHost: test\r\nContent-Length: " + std::to_string(hidden.size()) +
      "\r\n\r\n" + hidden + "GET /echo-second HTTP/1.1\r\nHost: test\r\n\r\n"));
  auto first = client.readResponse();
  auto second = client.readResponse();
  REQUIRE(first);
  REQUIRE(second);
  CHECK(first->body == "/echo-first");
  CHECK(second->body == "/echo-second");
  CHECK(server.requestsServed() == 2);
}

TEST_CASE(
    "http: idle connections fill max_connections, are closed after idle_timeout, and "
    "the server serves again",
    "[integration][http]") {
  HttpServerOptions options;
  options.max_connections = 16;
  options.idle_timeout = 300ms;
  TestServer server(options);
  std::vector<std::unique_ptr<Client>> idle;
  for (size_t i = 0; i < options.max_connections; ++i) {
    idle.push_back(std::make_unique<Client>(server.port()));
  }
  // One more is closed at once: the number of connections stays bounded.
  Client extra(server.port());
  auto extra_end = extra.readEnd();
  CHECK((extra_end == Client::End::kEof || extra_end == Client::End::kReset));
  // Every idle one is closed after the timeout (each read waits at most 5 s).
  const auto t0 = std::chrono::steady_clock::now();
  for (auto& client : idle) CHECK(client->readEnd() == Client::End::kEof);
  CHECK(std::chrono::steady_clock::now() - t0 < 4s);
  idle.clear();
  Client after(server.port());
  auto response = after.get("/healthz");
  REQUIRE(response);
  CHECK(response->status == 200);
}

TEST_CASE("http: a slowloris client dripping its header is closed after idle_timeout",
          "[integration][http]") {
  HttpServerOptions options;
  options.idle_timeout = 300ms;
  TestServer server(options);
  Client slow(server.port());
  const std::string request =
      "GET /healthz HTTP/1.1\r\nHost: test\r\nX-Drip: " + std::string(1000, 'd') + "\r\n\r\n";
  const auto t0 = std::chrono::steady_clock::now();
  bool closed = false;
  size_t sent = 0;
  // One byte, then up to 20 ms waiting for the server to close: a drip the deadline must catch
  // (a per-read timeout would be reset by every byte and never fire).
  while (!closed && sent < request.size() && std::chrono::steady_clock::now() - t0 < 10s) {
    if (!slow.send(request.substr(sent, 1))) break;
    ++sent;
    closed = slow.closedWithin(20ms);
    if (sent == 5) {
      // Others are served meanwhile.
      Client other(server.port());
      auto response = other.get("/healthz");
      REQUIRE(response);
      CHECK(response->status == 200);
    }
  }
  const auto waited = std::chrono::steady_clock::now() - t0;
  CHECK(sent < request.size());  // cut off before the header was whole
  CHECK(waited >= 250ms);
  CHECK(waited < 5s);
  CHECK(server.requestsServed() == 1);
}

TEST_CASE("http: HttpServerThread serves on a thread of its own, niced, and stop() joins it",
          "[integration][http]") {
  std::atomic<std::thread::id> handler_thread{};
  std::atomic<int> handler_nice{-100};
  errno = 0;
  const int caller_nice = ::getpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)));
  REQUIRE(errno == 0);
  auto started = HttpServerThread::start(
      {},
      [&](const std::string& target) {
        handler_thread = std::this_thread::get_id();
        handler_nice = ::getpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)));
        return testHandler(target);
      },
      /*niceness=*/3);
  REQUIRE(started.isOk());
  auto server = std::move(started).value();
  CHECK(server->host() == "127.0.0.1");
  Client client(server->port());
  auto response = client.get("/healthz");
  REQUIRE(response);
  CHECK(response->status == 200);
  CHECK(handler_thread.load() != std::thread::id{});
  CHECK(handler_thread.load() != std::this_thread::get_id());
  // That thread alone yields under contention; the caller's priority is unchanged.
  CHECK(handler_nice == std::min(19, caller_nice + 3));
  CHECK(::getpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid))) == caller_nice);
  CHECK(server->requestsServed() == 1);
  Client idle(server->port());
  REQUIRE(idle.get("/metrics"));
  server->stop();  // with a keep-alive connection open
  CHECK(idle.readEnd() == Client::End::kEof);
  server->stop();  // idempotent
  CHECK(server->requestsServed() == 2);
}

TEST_CASE("http access: Host must name the endpoint: its address, loopback names, the node's name",
          "[unit][http]") {
  const std::vector<std::string> names = {"n7.cluster", "n7"};
  auto allowed = [&](const std::string& host, const std::string& configured,
                     const std::string& bound) {
    return hostAllowed(host, configured, bound, names);
  };
  // Bound to loopback: the address, localhost, 127.0.0.1, [::1] and the node's names, any port.
  for (const char* host : {"127.0.0.1", "127.0.0.1:9400", "localhost", "LOCALHOST:80", "[::1]:9400",
                           "[::1]", "n7", "N7.cluster:9400"}) {
    INFO(host);
    CHECK(allowed(host, "127.0.0.1", "127.0.0.1"));
  }
  // A name the attacker controls (re-pointed at 127.0.0.1), look-alikes and malformed values.
  for (const char* host :
       {"evil.example", "evil.example:9400", "127.0.0.1.nip.io", "localhost.", "localhost.evil",
        "10.0.0.5", "[127.0.0.1]", "::1", "", ":9400", "127.0.0.1:99999", "127.0.0.1:http", "[::1",
        "[localhost]", "localhost:9400 x", "n7.evil"}) {
    INFO(host);
    CHECK_FALSE(allowed(host, "127.0.0.1", "127.0.0.1"));
  }
  // Bound to one address: that address and the node's names; loopback names do not reach it.
  CHECK(allowed("10.1.2.3:9400", "10.1.2.3", "10.1.2.3"));
  CHECK(allowed("n7:9400", "10.1.2.3", "10.1.2.3"));
  CHECK_FALSE(allowed("localhost:9400", "10.1.2.3", "10.1.2.3"));
  CHECK_FALSE(allowed("127.0.0.1:9400", "10.1.2.3", "10.1.2.3"));
  CHECK_FALSE(allowed("10.1.2.4:9400", "10.1.2.3", "10.1.2.3"));
  // Bound through a name: the name given to --metrics-port too, without case.
  CHECK(allowed("Node-A.example:9400", "node-a.example", "10.1.2.3"));
  CHECK_FALSE(allowed("node-b.example:9400", "node-a.example", "10.1.2.3"));
  // Bound to every interface: any IP literal (no name can be re-pointed through one), localhost
  // and the node's names; other names are refused.
  for (const char* bound : {"0.0.0.0", "::"}) {
    INFO(bound);
    CHECK(allowed("10.9.9.9:9400", bound, bound));
    CHECK(allowed("[fe80::1]:9400", bound, bound));
    CHECK(allowed("localhost:9400", bound, bound));
    CHECK(allowed("127.0.0.1", bound, bound));
    CHECK(allowed("n7.cluster", bound, bound));
    CHECK_FALSE(allowed("evil.example:9400", bound, bound));
  }
  // IPv6 loopback: the same address however written, and the loopback names.
  CHECK(allowed("[0:0:0:0:0:0:0:1]:9400", "::1", "::1"));
  CHECK(allowed("localhost", "::1", "::1"));
  CHECK(allowed("127.0.0.1", "::1", "::1"));
  CHECK_FALSE(allowed("[::2]", "::1", "::1"));
}

TEST_CASE("http access: tokens compare whole, and only a whole match passes", "[unit][http]") {
  const std::string token = "0123456789abcdef0123456789abcdef";
  CHECK(tokenMatches(token, token));
  CHECK_FALSE(tokenMatches("0123456789abcdef0123456789abcdeX", token));
  CHECK_FALSE(tokenMatches("X123456789abcdef0123456789abcdef", token));
  CHECK_FALSE(tokenMatches(token.substr(0, 31), token));  // a prefix
  CHECK_FALSE(tokenMatches(token + "0", token));          // longer
  CHECK_FALSE(tokenMatches("", token));
  CHECK_FALSE(tokenMatches(std::string(32, '\0'), token));
}

TEST_CASE("http access: Host, then Origin, then the token, and refusals say why", "[unit][http]") {
  const std::string token = "0123456789abcdef0123456789abcdef";
  HttpAccessOptions options;
  options.check_host = true;
  options.refuse_browser_posts = true;
  options.post_token = token;
  auto refuse = [&](HttpRequestHead head) {
    return refuseRequest(options, head, "127.0.0.1", "127.0.0.1");
  };
  HttpRequestHead get;
  get.hosts = {"127.0.0.1:9400"};
  CHECK_FALSE(refuse(get).has_value());
  get.has_origin = true;  // a GET's Origin does not matter: its answer is unreadable cross-site
  CHECK_FALSE(refuse(get).has_value());

  HttpRequestHead none;
  auto no_host = refuse(none);
  REQUIRE(no_host);
  CHECK(no_host->status == 400);
  CHECK_THAT(no_host->body, Catch::Contains("no Host header"));
  HttpRequestHead two = get;
  two.hosts = {"127.0.0.1", "127.0.0.1"};
  REQUIRE(refuse(two));
  CHECK(refuse(two)->status == 400);
  HttpRequestHead foreign = get;
  foreign.hosts = {"evil.example:9400"};
  auto rebinding = refuse(foreign);
  REQUIRE(rebinding);
  CHECK(rebinding->status == 403);
  CHECK_THAT(rebinding->body, Catch::Contains("'evil.example:9400'") &&
                                  Catch::Contains("DNS rebinding") && Catch::EndsWith("\n"));
  CHECK(std::count(rebinding->body.begin(), rebinding->body.end(), '\n') == 1);

  HttpRequestHead post;
  post.post = true;
  post.hosts = {"localhost:9400"};
  post.authorization = "Bearer " + token;
  CHECK_FALSE(refuse(post).has_value());
  post.authorization = "bearer   " + token + "  ";  // the scheme without case, spaces around
  CHECK_FALSE(refuse(post).has_value());
  HttpRequestHead browser = post;
  browser.has_origin = true;  // even with the right token
  REQUIRE(refuse(browser));
  CHECK(refuse(browser)->status == 403);
  CHECK_THAT(refuse(browser)->body, Catch::Contains("Origin"));
  HttpRequestHead post_foreign = post;
  post_foreign.hosts = {"evil.example"};
  REQUIRE(refuse(post_foreign));
  CHECK(refuse(post_foreign)->status == 403);
  for (std::optional<std::string> wrong : std::vector<std::optional<std::string>>{
           std::nullopt, "", "Bearer", "Bearer ", "Bearer wrong", "Basic " + token, token,
           "Bearer " + token + "x"}) {
    INFO(wrong.value_or("(none)"));
    HttpRequestHead bad = post;
    bad.authorization = wrong;
    auto refusal = refuse(bad);
    REQUIRE(refusal);
    CHECK(refusal->status == 401);
    CHECK(refusal->bearer_challenge);
  }
  // All off (the default): the server alone refuses nothing.
  CHECK_FALSE(refuseRequest(HttpAccessOptions{}, browser, "127.0.0.1", "127.0.0.1"));
  CHECK_FALSE(refuseRequest(HttpAccessOptions{}, none, "127.0.0.1", "127.0.0.1"));
}

TEST_CASE("http: with access checks on, a foreign Host or a browser's POST never reaches a handler",
          "[integration][http]") {
  const std::string token = "0123456789abcdef0123456789abcdef";
  std::atomic<int> posts{0};
  HttpServerOptions options;
  options.access.check_host = true;
  options.access.refuse_browser_posts = true;
  options.access.post_token = token;
  options.post_handler = [&](const std::string& target) {
    ++posts;
    return HttpResponse{202, "text/plain; charset=utf-8", "posted " + target + "\n"};
  };
  TestServer server(options);
  const std::string here = "Host: 127.0.0.1:" + std::to_string(server.port()) + "\r\n";
  Client client(server.port());
  auto request = [&](const std::string& head) -> std::optional<Response> {
    if (!client.send(head + "\r\n")) return std::nullopt;
    return client.readResponse(head.rfind("HEAD", 0) == 0);
  };
  // GET: the Host is checked; a refusal keeps the connection.
  auto rebinding = request("GET /healthz HTTP/1.1\r\nHost: evil.example:8080\r\n");
  REQUIRE(rebinding);
  CHECK(rebinding->status == 403);
  CHECK_THAT(rebinding->body, Catch::Contains("evil.example"));
  auto head = request("HEAD /metrics HTTP/1.1\r\nHost: evil.example\r\n");
  REQUIRE(head);
  CHECK(head->status == 403);
  auto ok = request("GET /healthz HTTP/1.1\r\n" + here);
  REQUIRE(ok);
  CHECK(ok->status == 200);
  CHECK(ok->body == "ok\n");
  // POST: Host, Origin, then the token.
  const std::string leave = "POST /leave HTTP/1.1\r\nContent-Length: 0\r\n";
  const std::string bearer = "Authorization: Bearer " + token + "\r\n";
  auto browser = request(leave + here + bearer + "Origin: http://evil.example\r\n");
  REQUIRE(browser);
  CHECK(browser->status == 403);
  CHECK_THAT(browser->body, Catch::Contains("Origin"));
  auto foreign = request(leave + "Host: evil.example\r\n" + bearer);
  REQUIRE(foreign);
  CHECK(foreign->status == 403);
  auto missing = request(leave + here);
  REQUIRE(missing);
  CHECK(missing->status == 401);
  CHECK(missing->header("www-authenticate") == "Bearer");
  auto wrong = request(leave + here + "Authorization: Bearer " + std::string(32, 'x') + "\r\n");
  REQUIRE(wrong);
  CHECK(wrong->status == 401);
  CHECK(posts == 0);
  auto right = request(leave + here + bearer);
  REQUIRE(right);
  CHECK(right->status == 202);
  CHECK(posts == 1);
  CHECK(server.requestsServed() == 2);  // the refused ones never reached a handler
  // No Host at all (HTTP/1.0 allows it): 400, and the 1.0 connection is closed.
  Client old(server.port());
  REQUIRE(old.send("GET /healthz HTTP/1.0\r\n\r\n"));
  auto no_host = old.readResponse();
  REQUIRE(no_host);
  CHECK(no_host->status == 400);
  CHECK(old.closedWithin(5s));
}
