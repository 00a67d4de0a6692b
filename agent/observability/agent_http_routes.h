// The agent's HTTP routes: /healthz, /metrics (Prometheus text) and /status (JSON), answered
// from a snapshot of the agent (agent_status.h renders it). Any other path gets 404 naming the
// three it serves. One route acts on the job: POST /leave (agentActionRoutes) makes this agent
// leave an elastic job (drain); the action is handed to the agent's loop, and the answer waits
// a bounded time for the loop's verdict (202 accepted, 409 refused with the reason).
//
// StatusBoard is how the HTTP thread (HttpServerThread) sees the agent without touching any
// object of the agent's loop: the loop publishes snapshots, immutable AgentStatus values behind
// a shared_ptr swapped under a mutex, and a reader gets one of them.
//
//   read() --(last one the loop published, younger than the reuse window)------> that one
//      |    (the initial snapshot, taken before the loop ran, is never reused)
//      |
//      +--(else)--> ask the loop for one (request_refresh posts to it; one request at a time)
//                   --(loop publishes within max_wait)--> the new one: taken after read() began
//                   --(max_wait passes: the loop is busy or blocked)--> the last one, aged()
//
// While a request to the loop is older than max_wait, readers get the last snapshot at once, so
// a blocked loop costs one wait of max_wait, not one per request. The reuse window is
// max(reuse_within, 10x the loop's last answer time), capped at 1 s: a flood of requests makes
// the loop take at most about one snapshot per window, so it spends ~10 % of its time on them
// at worst, and the rendering, the JSON and the sockets stay on the HTTP thread.
//
// Thread safety: StatusBoard: publish() and read() from any thread (publish() on the agent's
// loop, read() on the HTTP thread); request_refresh is called on the reading thread, without
// the board's lock. The handler agentStatusRoutes() returns calls `snapshot` on the HTTP
// server's thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>

#include "agent/observability/agent_status.h"
#include "agent/observability/http_server.h"

namespace cpprun::agent {

class StatusBoard {
 public:
  using Clock = std::chrono::steady_clock;
  struct Options {
    // How long a reader waits for the loop's fresh snapshot before it takes the last one.
    std::chrono::milliseconds max_wait{100};
    // A snapshot this young is served without asking the loop (the floor of the reuse window).
    std::chrono::milliseconds reuse_within{10};
  };

  // `initial`: the agent as it stands before its loop runs. `request_refresh` asks the loop
  // for a snapshot: it posts work that calls publish() and returns at once; it must not block.
  StatusBoard(AgentStatus initial, Options options, std::function<void()> request_refresh);

  void publish(AgentStatus status);
  // A snapshot (see the header comment), its clocks advanced to now and age_s set.
  AgentStatus read();
  // Snapshots published so far, the initial one included.
  uint64_t publications() const;

 private:
  Clock::duration reuseWindow() const;  // REQUIRES: mutex_ held

  const Options options_;
  const std::function<void()> request_refresh_;
  mutable std::mutex mutex_;
  std::condition_variable published_;
  std::shared_ptr<const AgentStatus> latest_;  // guarded by mutex_ (the pointer, not the value)
  Clock::time_point published_at_;
  uint64_t publications_ = 0;
  bool refresh_pending_ = false;  // asked the loop, not yet published
  Clock::time_point refresh_asked_at_;
  Clock::duration last_answer_time_{};  // from asking the loop to its publish(), the last time
};

// REQUIRES: `snapshot` is not empty and stays callable while the server serves.
HttpHandler agentStatusRoutes(std::function<AgentStatus()> snapshot);

// POST routes: /leave calls `leave` (on the HTTP thread; it hands the request to the agent's
// loop and waits for its verdict, bounded) and answers what it returns; any other path: 404.
// REQUIRES: `leave` stays callable while the server serves.
HttpHandler agentActionRoutes(std::function<HttpResponse()> leave);

}  // namespace cpprun::agent
