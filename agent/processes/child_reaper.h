// ChildReaper: turns child exits into events on the agent's loop. SIGCHLD arrives through an
// Asio signal_set; each delivery reaps every exited child with waitpid(-1, WNOHANG) — workers
// and, since the agent is a child subreaper, orphans re-parented to it — and reports each
// (pid, wait status). Never polls: without SIGCHLD nothing runs.
//
// Thread safety: loop thread only. Create it before spawning the first child, so no exit is
// missed; nothing else in the process may reap children.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>

namespace boost::asio {
class io_context;
}

namespace cpprun::agent {

class ChildReaper {
 public:
  using OnExit = std::function<void(pid_t pid, int wait_status)>;
  ChildReaper(boost::asio::io_context& io, OnExit on_exit);
  ~ChildReaper();
  ChildReaper(const ChildReaper&) = delete;
  ChildReaper& operator=(const ChildReaper&) = delete;

  // Reaps whatever has exited already (also done on every SIGCHLD).
  void reapNow();
  // Stops listening for SIGCHLD.
  void stop();

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

// Makes this process a child subreaper (PR_SET_CHILD_SUBREAPER): orphaned descendants are
// re-parented to it instead of init, so they can be found and killed.
bool becomeChildSubreaper();

}  // namespace cpprun::agent
