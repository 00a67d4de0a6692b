#include "agent/console/output_writer.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>

namespace cpprun::agent {

namespace {

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

OutputWriter::OutputWriter() {
  thread_ = std::thread([state = state_] { run(state); });
}

OutputWriter::~OutputWriter() { stop(exit_flush_bound_); }

bool OutputWriter::stop(std::chrono::milliseconds bound) {
  if (!thread_.joinable()) return true;
  const bool flushed = flush(bound);
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stopping = true;
    if (!flushed) {
      // What is still queued is given up, and no callback runs any more (its target may be
      // gone); a chunk being written may stay blocked until the process exits.
      state_->abandoned = true;
      for (Chunk& c : state_->chunks) {
        if (c.close_fd) ::close(c.fd);
        if (c.queued) *c.queued -= c.bytes.size();
        state_->queued_bytes -= c.bytes.size();
      }
      state_->chunks.clear();
    }
  }
  state_->wake.notify_all();
  if (flushed) {
    thread_.join();
  } else {
    thread_.detach();
  }
  return flushed;
}

void OutputWriter::write(int fd, std::string bytes, std::shared_ptr<std::atomic<size_t>> queued,
                         Done done) {
  const size_t size = bytes.size();
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (state_->stopping) return;  // stopped: dropped
  if (queued) *queued += size;
  if (state_->queued_bytes.fetch_add(size) == 0) state_->last_progress_ns = nowNs();
  {
    state_->chunks.push_back(
        Chunk{fd, false, std::move(bytes), std::move(queued), std::move(done)});
    ++state_->enqueued;
  }
  state_->wake.notify_one();
}

void OutputWriter::closeAfterWrites(int fd) {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (state_->stopping) {
      ::close(fd);
      return;
    }
    state_->chunks.push_back(Chunk{fd, true, {}, nullptr, nullptr});
    ++state_->enqueued;
  }
  state_->wake.notify_one();
}

bool OutputWriter::flush(std::chrono::milliseconds bound) {
  std::unique_lock<std::mutex> lock(state_->mutex);
  const uint64_t target = state_->enqueued;
  return state_->progress.wait_for(lock, bound, [&] { return state_->completed >= target; });
}

void OutputWriter::run(const std::shared_ptr<State>& state) {
  for (;;) {
    Chunk chunk;
    {
      std::unique_lock<std::mutex> lock(state->mutex);
      state->wake.wait(lock, [&] { return state->stopping || !state->chunks.empty(); });
      if (state->chunks.empty()) return;  // stopping, nothing left
      chunk = std::move(state->chunks.front());
      state->chunks.pop_front();
    }
    int error = 0;
    if (chunk.close_fd) {
      ::close(chunk.fd);
    } else {
      error = writeChunk(chunk, *state);
      if (chunk.queued) *chunk.queued -= chunk.bytes.size();
      state->queued_bytes -= chunk.bytes.size();
    }
    {
      std::lock_guard<std::mutex> lock(state->mutex);
      if (chunk.done && !state->abandoned) chunk.done(error);
      ++state->completed;
    }
    state->progress.notify_all();
  }
}

std::chrono::milliseconds OutputWriter::stalledFor() const {
  if (state_->queued_bytes.load() == 0) return std::chrono::milliseconds(0);
  const int64_t idle_ns = nowNs() - state_->last_progress_ns.load();
  return std::chrono::milliseconds(idle_ns > 0 ? idle_ns / 1000000 : 0);
}

int OutputWriter::writeChunk(const Chunk& chunk, State& state) {
  const char* data = chunk.bytes.data();
  size_t left = chunk.bytes.size();
  while (left > 0) {
    ssize_t n = ::write(chunk.fd, data, left);
    if (n > 0) {
      state.last_progress_ns = nowNs();
      data += n;
      left -= static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      // Someone made the shared description non-blocking: wait here (this thread only).
      pollfd p{chunk.fd, POLLOUT, 0};
      ::poll(&p, 1, -1);
    } else {
      return n < 0 ? errno : EIO;
    }
  }
  return 0;
}

}  // namespace cpprun::agent
