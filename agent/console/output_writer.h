// OutputWriter: a thread that writes queued bytes to descriptors with plain blocking write(2),
// so that a reader who stalls — a paused `less`, a pipe whose reader sleeps, a full terminal, a
// log file on a slow NFS mount — stalls this thread and never the agent's event loop, which
// also serves the store, the signals and the workers' exits.
//
// The agent cannot make the console non-blocking instead: O_NONBLOCK belongs to the open file
// description, which cpprun shares with its caller (the shell, srun), and setting it would
// break them. A thread per sink keeps the descriptors as they are.
//
// What is queued is accounted by the caller's counters (`queued`, raised by write() and lowered
// once the bytes are written or given up), so a producer can bound what it has in flight: the
// worker output drops console lines over its budget (counted) and pauses reading a worker whose
// log file lags, so log files lose nothing. Chunks to one descriptor are written in the order
// queued; a chunk is written whole before the next, so whole lines stay whole.
//
// Thread safety: every method may be called from any thread (stop() and the destructor from one
// at a time); callbacks run on the writer's thread, under its lock: they must only post work
// elsewhere, never call back into the writer.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace cpprun::agent {

class OutputWriter {
 public:
  // Called once the chunk is written (0) or could not be (the errno; the rest of the chunk is
  // dropped). Runs on the writer's thread.
  using Done = std::function<void(int error)>;

  OutputWriter();
  // stop(exit flush bound) unless stopped already.
  ~OutputWriter();
  OutputWriter(const OutputWriter&) = delete;
  OutputWriter& operator=(const OutputWriter&) = delete;

  // Queues `bytes` for `fd`. The caller keeps `fd` open until the chunk is done (or uses
  // closeAfterWrites). `queued` (may be null) is raised by bytes.size() now and lowered when
  // the chunk is done.
  void write(int fd, std::string bytes, std::shared_ptr<std::atomic<size_t>> queued = nullptr,
             Done done = nullptr);
  // Closes `fd` once every chunk queued before for it is done.
  void closeAfterWrites(int fd);
  // Waits until everything queued so far is done or `bound` passes; true when done.
  bool flush(std::chrono::milliseconds bound);
  // Writes what is queued for at most `bound`, then stops: later writes are dropped. Past the
  // bound what is left is given up, callbacks no longer run, and false is returned.
  bool stop(std::chrono::milliseconds bound);
  // How long the writer has had bytes to write and written none (zero when it has nothing to
  // write or wrote just now): a console that has taken nothing for a while is stalled, not slow.
  std::chrono::milliseconds stalledFor() const;
  // Bytes queued and not yet written, over every descriptor.
  size_t queuedBytes() const { return state_->queued_bytes.load(); }
  void setExitFlushBound(std::chrono::milliseconds bound) { exit_flush_bound_ = bound; }

 private:
  struct Chunk {
    int fd = -1;
    bool close_fd = false;
    std::string bytes;
    std::shared_ptr<std::atomic<size_t>> queued;
    Done done;
  };
  // Shared with the thread, which may outlive this object: a write(2) blocked on a reader who
  // never reads cannot be interrupted portably, so past the exit bound the thread is detached
  // and ends with the process.
  struct State {
    std::mutex mutex;
    std::condition_variable wake;      // work queued, or stopping
    std::condition_variable progress;  // a chunk done
    std::deque<Chunk> chunks;          // guarded by mutex
    uint64_t enqueued = 0;             // guarded by mutex: chunks ever queued
    uint64_t completed = 0;            // guarded by mutex: chunks ever done
    bool stopping = false;             // guarded by mutex
    bool abandoned = false;            // guarded by mutex: stopped before all was written
    std::atomic<size_t> queued_bytes{0};
    // steady_clock nanoseconds of the last write(2) that wrote something, or of the moment
    // the queue became non-empty after being empty.
    std::atomic<int64_t> last_progress_ns{0};
  };
  static void run(const std::shared_ptr<State>& state);
  // Returns 0 or the errno that stopped it.
  static int writeChunk(const Chunk& chunk, State& state);

  std::chrono::milliseconds exit_flush_bound_{10000};
  std::shared_ptr<State> state_ = std::make_shared<State>();
  std::thread thread_;
};

}  // namespace cpprun::agent
