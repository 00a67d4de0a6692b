// HttpServer: a small HTTP/1.1 server (Boost.Beast) for the agent's /healthz, /metrics and
// /status, on whatever io_context it is given; HttpServerThread runs one on an io_context and a
// thread of its own, which is how the agent serves it (so no HTTP traffic, however heavy, runs
// on the agent's event loop beside the store). It knows no paths: the caller's handler maps a
// request target to a response.
//
// Each connection reads one request at a time: GET and HEAD go to the handler (HEAD gets the
// headers a GET would, without the body); POST goes to options.post_handler when there is one
// (its body is read, within max_request_bytes, and ignored); any other method gets 405 with
// `Allow: GET, HEAD` (`GET, HEAD, POST` with a post_handler); a
// malformed request (conflicting Content-Length and Transfer-Encoding among them) gets 400, a
// request over max_request_bytes 431 (header) or 413 (body), and the connection is closed after
// that response. Before a handler sees a request, options.access checks its Host, Origin and
// Authorization (http_access.h): a refused one gets 400, 401 (with `WWW-Authenticate: Bearer`)
// or 403 and a one-line reason, and the connection stays open. Keep-alive and `Connection: close`
// are honoured; the response to a connection's max_requests_per_connection-th request says
// `Connection: close`. Every response carries Content-Type, Content-Length and `Server: cpprun`
// (except that a 204 or 304 carries no body and no Content-Length, as HTTP requires).
//
// A connection's life:
//
//   accept --> reading --(request complete)--> writing --(keep-alive)--> reading
//                 |                               |
//                 | (timeout, EOF, error)         | (Connection: close, 400, 413, 431)
//                 v                               v
//              closed <--(EOF or timeout)------ draining (our side shut down; the client's
//                                                          leftover bytes are read and dropped)
//
// stop() closes every connection from any state.
//
// Thread safety: HttpServer: loop thread only. create() may run before the loop starts;
// everything else, the handler included, runs on the thread that runs the io_context, and stop()
// and the destructor must be called there too (or after the loop has finished); port(), host()
// and requestsServed() may be called from any thread. HttpServerThread: any one thread owns it;
// its handler runs on its own thread, so whatever the handler reads must be safe to read there
// (the agent's routes read a snapshot its loop publishes, agent_http_routes.h).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "agent/observability/http_access.h"
#include "common/status.h"

namespace boost::asio {
class io_context;
}

namespace cpprun::agent {

struct HttpResponse {
  int status = 200;  // 200..599; anything else is answered with 500
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

// Called on the server's loop thread for every GET or HEAD request; `target` is the request target
// (path plus optional query). An exception it throws is answered with 500 and logged.
using HttpHandler = std::function<HttpResponse(const std::string& target)>;

struct HttpServerOptions {
  // Address to bind: a literal IPv4/IPv6 address or a host name (resolved, first address).
  // "0.0.0.0" or "::" (both families) binds every interface.
  std::string host = "127.0.0.1";
  uint16_t port = 0;  // 0: the kernel picks a free port; see HttpServer::port()
  // Connections beyond this are accepted and closed at once, with a warning.
  size_t max_connections = 64;
  // A connection is closed when a whole request has not arrived this long after the connection
  // was accepted or the previous response was sent (so a silent client, mid-request or between
  // keep-alive requests, is closed after it). Also bounds writing a response and draining a
  // closing connection.
  std::chrono::milliseconds idle_timeout{10000};
  // Header plus body, in bytes. A larger request gets 431 (header) or 413 (body) and is closed.
  size_t max_request_bytes = 16 * 1024;
  // Requests served on one keep-alive connection; the last one's response closes it (so no one
  // client holds a connection slot for ever).
  size_t max_requests_per_connection = 1000;
  // POST requests, by target, on the server's thread like `handler` (may block it briefly: the
  // agent's POST /leave waits a bounded time for its loop's answer). Empty: POST gets 405.
  HttpHandler post_handler;
  // Host, Origin and bearer-token checks before any handler (http_access.h); off by default.
  HttpAccessOptions access;
};

class HttpServer {
 public:
  // Binds and listens now, so a port in use (kAlreadyExists, the address in the message) or a
  // bad host (kInvalidArgument) is reported here; serving starts when `io` runs.
  // REQUIRES: `io` outlives the returned server; `handler` is not empty.
  static Result<std::unique_ptr<HttpServer>> create(boost::asio::io_context& io,
                                                    HttpServerOptions options, HttpHandler handler);
  ~HttpServer();  // stops (see stop())
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // The bound address, e.g. "127.0.0.1", and the port the kernel picked.
  uint16_t port() const;
  const std::string& host() const;
  // Closes the acceptor and every connection; the handler is never called after it returns.
  // Pending operations then finish on the loop, so io.run() returns once nothing else is
  // queued. Idempotent.
  void stop();
  // Requests answered by a handler; rejected and refused requests are not counted.
  uint64_t requestsServed() const;

  class Impl;

 private:
  explicit HttpServer(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

// An HttpServer on an io_context and a thread of its own: the agent's HTTP endpoint, kept off
// the agent's event loop. The handler runs on that thread.
class HttpServerThread {
 public:
  // Binds and listens on the calling thread (errors as HttpServer::create), then serves on a
  // new thread, whose nice value is raised by `niceness` (0..19; a failure is logged once and
  // ignored) so that under CPU contention HTTP yields to the process's other threads.
  // REQUIRES: `handler` is not empty.
  static Result<std::unique_ptr<HttpServerThread>> start(HttpServerOptions options,
                                                         HttpHandler handler, int niceness = 0);
  ~HttpServerThread();  // stop()
  HttpServerThread(const HttpServerThread&) = delete;
  HttpServerThread& operator=(const HttpServerThread&) = delete;

  uint16_t port() const;
  const std::string& host() const;
  uint64_t requestsServed() const;
  // Closes every connection and joins the thread; the handler is never called after it
  // returns. Idempotent. REQUIRES: not called from the handler.
  void stop();

 private:
  struct State;
  explicit HttpServerThread(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace cpprun::agent
