// EtcdClient::watch: one streamed POST /v3/watch on a connection of its own, with failover.
// Steps: WatchCall::run tries endpoint after endpoint until the deadline; attempt() opens one
// member's stream and checks its status; readEvents() reads the stream's messages
// (etcd_codec's parseWatchMessage) until one carries events; fail() moves to the next member.
#include <algorithm>
#include <set>
#include <thread>

#include "rendezvous/etcd_client.h"
#include "rendezvous/etcd_codec.h"
#include "rendezvous/etcd_connection.h"
#include "rendezvous/etcd_failover.h"

namespace cpprun::rendezvous {

namespace {

using etcd::Clock;
using etcd::Connection;
using etcd::ConnError;
using etcd::FailKind;
using etcd::WatchMessage;
using Events = std::vector<EtcdEvent>;

// One watch() call: its request and how far its failover got.
class WatchCall {
 public:
  WatchCall(EtcdClient::Impl& impl, const std::string& key, bool prefix, int64_t from_revision,
            std::chrono::milliseconds timeout, const std::function<void()>& on_created,
            bool deletes_only)
      : impl_(impl),
        from_revision_(from_revision),
        deadline_(Clock::now() + timeout),
        on_created_(on_created),
        payload_(etcd::watchCreateRequest(key, prefix, from_revision, deletes_only)),
        index_(impl.currentIndex()) {}

  Result<Events> run() {
    while (Clock::now() < deadline_) {
      if (auto done = attempt()) return std::move(*done);
    }
    // The deadline came before every member was asked (a stream that broke as the deadline
    // came, e.g. its member was killed): nothing is known to be unavailable yet, so this is
    // the deadline's empty answer and the caller's next watch asks the next member.
    if (std::set<std::string>(tried_.begin(), tried_.end()).size() < impl_.endpoints().size()) {
      return Events{};
    }
    return unavailable("etcd /v3/watch failed on " + etcd::joinNames(tried_) + " (" +
                       impl_.tlsNote() + "); last error: " + last_error_);
  }

 private:
  // One member: the call's answer, or nullopt to try the next member (fail() was called).
  std::optional<Result<Events>> attempt() {
    const etcd::Endpoint& ep = impl_.endpoints()[index_];
    tried_.push_back(ep.name);
    Connection conn(ep, impl_.tls());
    ConnError error;
    if (auto e = conn.open(std::min(deadline_, Clock::now() + impl_.options().connect_timeout))) {
      fail(ep, e->message, e->kind);
      return std::nullopt;
    }
    auto status = conn.startStream("/v3/watch", payload_, deadline_, &error);
    if (!status.isOk()) {
      if (error.kind == FailKind::kTimeout && Clock::now() >= deadline_) return Events{};
      fail(ep, error.message, error.kind);
      return std::nullopt;
    }
    impl_.rotation().markAnswered(index_);
    if (status.value() != 200) {
      int code = 0;
      std::string message;
      etcd::parseErrorBody(
          conn.readRest(std::min(deadline_, Clock::now() + impl_.options().request_timeout)), &code,
          &message);
      if (etcd::retriableEtcdError(status.value(), code, message)) {
        fail(ep, message);
        return std::nullopt;
      }
      return Result<Events>(
          Status(etcd::codeOfGrpc(code), "etcd " + ep.name + " /v3/watch: " + message));
    }
    return readEvents(conn, ep);
  }

  // The messages of a started stream until one carries events.
  std::optional<Result<Events>> readEvents(Connection& conn, const etcd::Endpoint& ep) {
    const std::string where = "etcd " + ep.name + " /v3/watch: ";
    while (true) {
      ConnError error;
      auto line = conn.readLine(deadline_, &error);
      if (!line) {
        if (error.kind == FailKind::kTimeout) return Events{};
        fail(ep, error.message);
        return std::nullopt;
      }
      WatchMessage m = etcd::parseWatchMessage(*line);
      switch (m.kind) {
        case WatchMessage::Kind::kEmpty:
          continue;
        case WatchMessage::Kind::kNotJson:
          return Result<Events>(
              Status(StatusCode::kProtocolError, where + "not JSON: " + line->substr(0, 200)));
        case WatchMessage::Kind::kError:
          if (etcd::retriableEtcdError(200, m.error_code, m.error_message)) {
            fail(ep, m.error_message);
            return std::nullopt;
          }
          return Result<Events>(Status(etcd::codeOfGrpc(m.error_code), where + m.error_message));
        case WatchMessage::Kind::kCanceled:
          if (m.compact_revision > 0) {
            return Result<Events>(Status(
                StatusCode::kNotFound,
                where + "revision " + std::to_string(from_revision_) +
                    " was compacted (oldest kept: " + std::to_string(m.compact_revision) + ")"));
          }
          return Result<Events>(unavailable(where + "canceled: " + m.cancel_reason));
        case WatchMessage::Kind::kUpdate:
          if (m.created && !created_reported_) {
            created_reported_ = true;
            if (on_created_) on_created_();
          }
          if (m.events.empty()) continue;
          return Result<Events>(std::move(m.events));
      }
    }
  }

  // This member failed: note why, skip it for a while when it went silent, move to the next
  // one, and pause (doubling, at most 500 ms) after a round of failures.
  void fail(const etcd::Endpoint& ep, const std::string& message, FailKind kind = FailKind::kIo) {
    last_error_ = ep.name + ": " + message;
    if (EtcdClient::Impl::wentSilent(kind)) impl_.rotation().markSilent(index_, Clock::now());
    index_ = impl_.rotation().next(index_, Clock::now());
    if (++failures_ >= impl_.rotation().answering(Clock::now())) {
      failures_ = 0;
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now());
      std::this_thread::sleep_for(std::max(std::chrono::milliseconds(0), std::min(backoff_, left)));
      backoff_ = std::min(backoff_ * 2, std::chrono::milliseconds(500));
    }
  }

  EtcdClient::Impl& impl_;
  const int64_t from_revision_;
  const Clock::time_point deadline_;
  const std::function<void()>& on_created_;
  const std::string payload_;
  size_t index_;
  std::vector<std::string> tried_;
  std::string last_error_ = "no attempt";
  std::chrono::milliseconds backoff_{20};
  size_t failures_ = 0;
  bool created_reported_ = false;
};

}  // namespace

Result<std::vector<EtcdEvent>> EtcdClient::watch(const std::string& key, bool prefix,
                                                 int64_t from_revision,
                                                 std::chrono::milliseconds timeout,
                                                 const std::function<void()>& on_created,
                                                 bool deletes_only) {
  impl_->countRequest();
  return WatchCall(*impl_, key, prefix, from_revision, timeout, on_created, deletes_only).run();
}

}  // namespace cpprun::rendezvous
