// Who may use the agent's HTTP endpoint (http_server.h): the checks a request's head must pass
// before any route sees it. They stop a web page in a browser on the node from acting on the
// agent (docs/security.md):
//
// - Host (against DNS rebinding): a page whose name the attacker re-points at 127.0.0.1 reaches
//   the endpoint through the browser, but the browser still sends the attacker's name in Host.
//   A request is served only when its Host names this endpoint (hostAllowed): the bound IP
//   address; any IP literal when the endpoint is bound to every interface (0.0.0.0, ::); the
//   name given to --metrics-port; `localhost`, 127.0.0.1 and [::1] when it listens on loopback
//   (bound to it or to every interface); and the node's own host name (full and short). The port
//   in Host, when there is one, is not compared: a tunnel or a NAT forwards another port, and the
//   name is what an attacker controls. No Host, or more than one, is a malformed request (400).
// - Origin (against cross-site request forgery): browsers send Origin with every cross-site
//   POST (and fetch() POSTs); curl, wget, Python's urllib and Prometheus send none. A POST that
//   carries one is refused, whatever its value.
// - A bearer token (optional, --metrics-token-file): a POST must carry
//   `Authorization: Bearer <token>`, compared in constant time; missing or wrong gets 401.
//
// GET and HEAD need only the Host check; POST needs all three, in that order.
//
// Thread safety: pure functions and value types, except nodeHostNames() (reads the system's host
// name; reentrant).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cpprun::agent {

// What an HttpServer checks; all off by default (the server alone knows no policy).
struct HttpAccessOptions {
  // Every request's Host must name the endpoint (see the header comment); else 403.
  bool check_host = false;
  // Further names Host may carry, compared without case: the node's host names.
  std::vector<std::string> host_names;
  // A POST that carries an Origin header gets 403.
  bool refuse_browser_posts = false;
  // Non-empty: a POST must carry `Authorization: Bearer <post_token>`; else 401.
  std::string post_token;
};

// The parts of a request's head the checks read.
struct HttpRequestHead {
  bool post = false;
  std::vector<std::string> hosts;  // the values of its Host fields, in order
  bool has_origin = false;
  std::optional<std::string> authorization;  // the first Authorization field's value
};

struct HttpRefusal {
  int status = 403;               // 400, 401 or 403
  std::string body;               // one line, ending in '\n'
  bool bearer_challenge = false;  // 401: the response says `WWW-Authenticate: Bearer`
};

// Whether a Host field's value ("name", "name:port", "1.2.3.4:80", "[::1]:9400") names an
// endpoint that was asked to bind `configured_host` (as given: an address or a name) and is
// bound to the IP address `bound_address`; `host_names` as in HttpAccessOptions.
bool hostAllowed(std::string_view host_field, const std::string& configured_host,
                 const std::string& bound_address, const std::vector<std::string>& host_names);

// Whether `presented` equals `expected`, in time that depends on expected.size() only.
bool tokenMatches(std::string_view presented, std::string_view expected);

// This node's host name as gethostname() gives it and, when it has dots, its first label
// ("n7.cluster.example" and "n7"); empty when it cannot be read.
std::vector<std::string> nodeHostNames();

// Why `head` is refused, or nullopt when it may be served (see the header comment).
std::optional<HttpRefusal> refuseRequest(const HttpAccessOptions& options,
                                         const HttpRequestHead& head,
                                         const std::string& configured_host,
                                         const std::string& bound_address);

}  // namespace cpprun::agent
