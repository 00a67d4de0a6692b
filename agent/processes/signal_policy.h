// Signal policy: which signals cpprun's two processes (the guardian and the agent) take over so
// that no signal can end either of them by its default action while the job runs.
//
// A signal whose default action ends a process (SIGUSR1, which Slurm sends before pre-emption
// when asked, SIGALRM, SIGXCPU, a real-time signal, ...) must never kill the guardian or the
// agent: the guardian would leave the agent running under PID 1 and report to nobody, the agent
// would take its workers down without a report. Both processes therefore catch every such
// signal: those in --signals-to-handle start the orderly stop (forwarded to the workers, then
// teardown), every other one is logged and ignored. A signal the caller ignored (nohup's
// SIGHUP) stays ignored and is not taken over. Faults (SIGSEGV, SIGBUS, SIGFPE, SIGILL,
// SIGTRAP, SIGABRT, SIGSYS) are not caught: they mean a bug in cpprun and must end it.
//
// Thread safety: the functions are pure or read the process's signal dispositions; call them
// from any thread.
#pragma once

#include <signal.h>

#include <vector>

namespace cpprun::agent {

// Catchable, asynchronous signals whose default action terminates the process, the POSIX ones
// and every real-time signal glibc leaves to applications, ascending.
std::vector<int> terminatingSignals();

// Of terminatingSignals(), the ones this process does not ignore right now (SIG_IGN inherited
// from the caller stays: nohup's SIGHUP is not taken over).
std::vector<int> signalsToTakeOver();

// The drain signal: SIGPWR to one agent of an elastic job makes it leave the job (its workers
// stop, the others re-form without it, no restart used; local_agent.h), unless it is listed
// in --signals-to-handle, which then wins. Not in torchrun's default --signals-to-handle
// (SIGTERM, SIGINT, SIGHUP, SIGQUIT) nor in what Slurm's --signal and pre-emption send (SIGUSR1,
// SIGUSR2, SIGTERM), and no terminal sends it (SIGWINCH would come with every window resize).
inline constexpr int kLeaveSignal = SIGPWR;

// True when `signo`'s disposition in this process is SIG_IGN.
bool isIgnored(int signo);

// A set holding `signals`.
sigset_t signalSetOf(const std::vector<int>& signals);

}  // namespace cpprun::agent
