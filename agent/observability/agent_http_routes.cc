#include "agent/observability/agent_http_routes.h"

#include <algorithm>
#include <string>
#include <utility>

namespace cpprun::agent {

StatusBoard::StatusBoard(AgentStatus initial, Options options,
                         std::function<void()> request_refresh)
    : options_(options),
      request_refresh_(std::move(request_refresh)),
      latest_(std::make_shared<const AgentStatus>(std::move(initial))),
      published_at_(Clock::now()),
      publications_(1) {}

void StatusBoard::publish(AgentStatus status) {
  auto next = std::make_shared<const AgentStatus>(std::move(status));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const Clock::time_point now = Clock::now();
    if (refresh_pending_) {
      last_answer_time_ = now - refresh_asked_at_;
      refresh_pending_ = false;
    }
    latest_.swap(next);
    published_at_ = now;
    ++publications_;
  }
  published_.notify_all();
  // `next`, now the previous snapshot, is freed here, outside the lock (or by its last reader).
}

StatusBoard::Clock::duration StatusBoard::reuseWindow() const {
  const Clock::duration floor = options_.reuse_within;
  const Clock::duration cap = std::chrono::seconds(1);
  return std::max(floor, std::min(cap, 10 * last_answer_time_));
}

AgentStatus StatusBoard::read() {
  std::unique_lock<std::mutex> lock(mutex_);
  Clock::time_point now = Clock::now();
  // The initial snapshot (taken before the loop ran: no workers yet) is never reused: a whole
  // one-node start can take less than the reuse window.
  if (publications_ == 1 || now - published_at_ > reuseWindow()) {
    const uint64_t wanted = publications_ + 1;  // the next one is taken after this call began
    if (!refresh_pending_) {
      refresh_pending_ = true;
      refresh_asked_at_ = now;
      lock.unlock();
      request_refresh_();
      lock.lock();
    }
    // Past already when the loop has not answered an earlier request in max_wait.
    const Clock::time_point deadline = refresh_asked_at_ + options_.max_wait;
    published_.wait_until(lock, deadline, [&] { return publications_ >= wanted; });
    now = Clock::now();
  }
  std::shared_ptr<const AgentStatus> latest = latest_;
  const double age = std::chrono::duration<double>(now - published_at_).count();
  lock.unlock();
  return aged(*latest, age);
}

uint64_t StatusBoard::publications() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return publications_;
}

HttpHandler agentStatusRoutes(std::function<AgentStatus()> snapshot) {
  return [snapshot = std::move(snapshot)](const std::string& target) {
    const std::string path = target.substr(0, target.find('?'));
    HttpResponse r;
    if (path == "/healthz") {
      r.body = "ok\n";
    } else if (path == "/metrics") {
      r.content_type = "text/plain; version=0.0.4; charset=utf-8";
      r.body = prometheusText(snapshot());
    } else if (path == "/status") {
      r.content_type = "application/json";
      r.body = statusJson(snapshot()).dump(2) + "\n";
    } else {
      r.status = 404;
      r.body = "not found; cpprun serves /healthz, /metrics and /status\n";
    }
    return r;
  };
}

HttpHandler agentActionRoutes(std::function<HttpResponse()> leave) {
  return [leave = std::move(leave)](const std::string& target) {
    const std::string path = target.substr(0, target.find('?'));
    if (path == "/leave") return leave();
    HttpResponse r;
    r.status = 404;
    r.body = "not found; cpprun acts on POST /leave only\n";
    return r;
  };
}

}  // namespace cpprun::agent
