// A JobCoordinator's asynchronous attempt calls as futures, for tests and benchmarks that drive
// coordinators from their own threads: the call is posted to the coordinator's io_context (the
// only thread that may call it) and the future carries its callback's result.
// Thread safety: call from any thread but the io_context's; wait on the future elsewhere.
#pragma once

#include <future>
#include <memory>

#include "agent/coordination/job_coordinator.h"
#include "common/asio.h"

namespace cpprun::testing {

inline std::future<Result<agent::AttemptStart>> beginAttemptFuture(
    boost::asio::io_context& io, agent::JobCoordinator& coordinator, int attempt) {
  auto promise = std::make_shared<std::promise<Result<agent::AttemptStart>>>();
  auto future = promise->get_future();
  boost::asio::post(io, [&coordinator, attempt, promise] {
    coordinator.beginAttempt(attempt,
                             [promise](Result<agent::AttemptStart> r) { promise->set_value(r); });
  });
  return future;
}

inline std::future<Result<agent::JobDecision>> endAttemptFuture(boost::asio::io_context& io,
                                                                agent::JobCoordinator& coordinator,
                                                                int attempt,
                                                                agent::AttemptReport report) {
  auto promise = std::make_shared<std::promise<Result<agent::JobDecision>>>();
  auto future = promise->get_future();
  boost::asio::post(io, [&coordinator, attempt, report, promise] {
    coordinator.endAttempt(attempt, report,
                           [promise](Result<agent::JobDecision> r) { promise->set_value(r); });
  });
  return future;
}

}  // namespace cpprun::testing
