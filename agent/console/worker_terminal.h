// Worker terminals: the pseudo-terminals a worker's stdout and stderr are when cpprun's own
// are terminals (isatty() is then true in the worker: pdb/breakpoint(), input(), colours and
// progress bars behave as they do under torchrun, whose workers inherit the terminal), and the
// few operations on cpprun's own terminal that forwarding stdin and window sizes needs.
//
// A worker pty is made with output post-processing's newline translation off (no ONLCR), so the
// agent reads the bytes as the worker wrote them ("\n", not "\r\n"); cpprun's own terminal adds
// its translation when the line reaches it. The agent reads the master like a pipe (EIO once the
// worker's side is closed is the end of the stream). The stdout pty is the worker's controlling
// terminal (ProcessSpec::controlling_tty_fd): SIGWINCH and the hang-up reach it.
//
// Thread safety: free functions on descriptors; call from any thread. TerminalModes: one thread.
#pragma once

#include <sys/ioctl.h>
#include <termios.h>

#include <optional>

#include "common/status.h"

namespace cpprun::agent {

struct WorkerPty {
  int master = -1;  // close-on-exec, non-blocking: the agent's end
  int slave = -1;   // close-on-exec (the launcher dup2s it into the worker)
};

// A new pseudo-terminal pair for a worker: ONLCR off, window size `size` when given. An error
// (the system's pty limit, say) names the step; the caller falls back to a pipe.
Result<WorkerPty> openWorkerPty(const std::optional<winsize>& size);

// The window size of the first of cpprun's stdout, stderr and stdin that is a terminal.
std::optional<winsize> consoleWindowSize();

// True when `fd` is a terminal whose foreground process group is this process's: only then may
// cpprun read it or change its modes (a background job that did would be stopped by SIGTTIN or
// SIGTTOU).
bool inForegroundOf(int fd);

// Sets the window size of a worker pty's master (the kernel sends SIGWINCH to the worker's
// foreground group when it changed). Errors are ignored: the worker may be gone.
void setWindowSize(int master_fd, const winsize& size);

// cpprun's terminal (its stdin) while keystrokes are forwarded to a worker pty: no echo and no
// line editing here (the worker's pty does both, as a terminal of its own), ISIG kept so Ctrl-C,
// Ctrl-\ and Ctrl-Z still signal cpprun. The modes found are restored by restore() and by the
// destructor; the guardian restores them too if the agent dies (guardian.h).
class TerminalModes {
 public:
  TerminalModes() = default;
  ~TerminalModes() { restore(); }
  TerminalModes(const TerminalModes&) = delete;
  TerminalModes& operator=(const TerminalModes&) = delete;

  // Switches `fd` to forwarding modes. False (nothing changed) when it is not a terminal, cpprun
  // is not its foreground job, or the modes cannot be read or set.
  bool enterForwarding(int fd);
  // Back to the modes found, when they were changed and cpprun is still the foreground job.
  void restore();
  bool active() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
  termios saved_{};
};

// The modes of terminal `fd` (also from the background); nullopt when it is not a terminal.
std::optional<termios> terminalModesOf(int fd);
// Sets `modes` back on terminal `fd` when they differ from its current ones and cpprun is its
// foreground job (the guardian, after the agent ended however it did).
void restoreTerminalModes(int fd, const termios& modes);

// The modes forwarding uses, made from the terminal's own (pure; for tests and the guardian).
termios forwardingModes(termios modes);

}  // namespace cpprun::agent
