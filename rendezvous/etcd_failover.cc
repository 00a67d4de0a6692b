#include "rendezvous/etcd_failover.h"

#include <algorithm>
#include <thread>

namespace cpprun::rendezvous {

using etcd::Clock;
using etcd::Connection;
using etcd::ConnError;
using etcd::FailKind;
using etcd::HttpReply;
using etcd::Json;

Status EtcdClient::Impl::init() {
  if (options_.endpoints.empty()) return invalidArgument("no etcd endpoints given");
  for (const auto& e : options_.endpoints) {
    auto ep = etcd::parseEtcdEndpoint(e);
    if (!ep.isOk()) return ep.status();
    endpoints_.push_back(ep.value());
  }
  if (options_.connect_timeout.count() <= 0 || options_.request_timeout.count() <= 0) {
    return invalidArgument("etcd connect_timeout and request_timeout must be positive");
  }
  rotation_ =
      std::make_unique<etcd::EndpointRotation>(endpoints_.size(), options_.request_timeout * 10);
  if (options_.tls) {
    auto tls = etcd::TlsContext::load(options_.tls_files);
    if (!tls.isOk()) return tls.status();
    tls_ = std::move(tls.value());
  }
  // One round over the endpoints: the first that answers GET /version is used.
  std::lock_guard<std::mutex> lock(mutex_);
  std::string errors;
  bool all_tls = true;  // every endpoint refused the handshake: waiting will not mend that
  for (size_t i = 0; i < endpoints_.size(); ++i) {
    current_ = i;
    ConnError error;
    auto reply = attempt(Connection::Verb::kGet, "/version", "",
                         Clock::now() + options_.request_timeout, &error);
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

Result<Json> EtcdClient::Impl::call(const std::string& target, const Json& body, bool idempotent) {
  countRequest();
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
    const etcd::Endpoint& ep = endpoints_[current_];
    ++attempts;
    tried.push_back(ep.name);
    ConnError error;
    auto reply = attempt(Connection::Verb::kPost, target, payload,
                         std::min(give_up, now + options_.request_timeout), &error);
    if (reply.isOk()) {
      rotation_->markAnswered(current_);
      const HttpReply& r = reply.value();
      if (r.status == 200) {
        Json j = Json::parse(r.body, nullptr, false);
        if (j.is_discarded() || !j.is_object()) {
          return Status(StatusCode::kProtocolError,
                        "etcd " + ep.name + " " + target +
                            ": reply is not a JSON object: " + r.body.substr(0, 200));
        }
        return j;
      }
      int code = 0;
      std::string message;
      etcd::parseErrorBody(r.body, &code, &message);
      if (!etcd::retriableEtcdError(r.status, code, message)) {
        return Status(etcd::codeOfGrpc(code), "etcd " + ep.name + " " + target + ": " + message);
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
      if (wentSilent(error.kind)) rotation_->markSilent(current_, Clock::now());
    }
    current_ = rotation_->next(current_, Clock::now());
    if (++round_failures >= static_cast<int>(rotation_->answering(Clock::now()))) {
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
  return unavailable("etcd " + target + " failed on " + etcd::joinNames(tried) + " (" +
                     std::to_string(attempts) + " attempts in " + std::to_string(took) + " ms, " +
                     tlsNote() + "); last error: " + last_error);
}

Result<HttpReply> EtcdClient::Impl::attempt(Connection::Verb verb, const std::string& target,
                                            const std::string& body, Clock::time_point deadline,
                                            ConnError* error) {
  if (!conn_) {
    auto conn = std::make_unique<Connection>(endpoints_[current_], tls_.get());
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

std::string EtcdClient::Impl::currentEndpoint() {
  std::lock_guard<std::mutex> lock(mutex_);
  return endpoints_[current_].name;
}

size_t EtcdClient::Impl::currentIndex() {
  std::lock_guard<std::mutex> lock(mutex_);
  return current_;
}

std::string EtcdClient::Impl::tlsNote() const {
  if (!options_.tls) return "plain HTTP";
  return "TLS with CA '" + options_.tls_files.ca_file + "', client certificate '" +
         options_.tls_files.cert_file + "'";
}

}  // namespace cpprun::rendezvous
