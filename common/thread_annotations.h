// Lock discipline the compiler checks: clang's thread-safety attributes (-Wthread-safety, the
// `thread-safety` preset) behind CPPRUN_* macros, and a Mutex, MutexLock and CondVar that carry
// them (libstdc++'s std::mutex is not annotated). Under GCC the macros are empty and the types
// are thin wrappers over std::mutex and std::condition_variable_any.
//
//   Mutex mu_;
//   int count_ CPPRUN_GUARDED_BY(mu_);
//   void bump() CPPRUN_EXCLUDES(mu_) { MutexLock lock(mu_); ++count_; }
//   void bumpLocked() CPPRUN_REQUIRES(mu_) { ++count_; }
//
// A condition's predicate (a lambda, which the analysis checks as a function of its own) starts
// with mu_.assertHeld(): CondVar calls it with the mutex held.
//
// Thread safety: Mutex and CondVar are safe from any thread; a MutexLock belongs to the thread
// that made it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <utility>

#if defined(__clang__)
#define CPPRUN_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define CPPRUN_THREAD_ANNOTATION(x)
#endif

// On a type: it is a capability (a lock) named `x` in messages.
#define CPPRUN_CAPABILITY(x) CPPRUN_THREAD_ANNOTATION(capability(x))
// On a type: an RAII object that holds a capability for its lifetime.
#define CPPRUN_SCOPED_CAPABILITY CPPRUN_THREAD_ANNOTATION(scoped_lockable)
// On a member: read and written only with `x` held.
#define CPPRUN_GUARDED_BY(x) CPPRUN_THREAD_ANNOTATION(guarded_by(x))
// On a pointer member: what it points to is read and written only with `x` held.
#define CPPRUN_PT_GUARDED_BY(x) CPPRUN_THREAD_ANNOTATION(pt_guarded_by(x))
// On a function: the caller holds these.
#define CPPRUN_REQUIRES(...) CPPRUN_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
// On a function: the caller does not hold these (the function takes them).
#define CPPRUN_EXCLUDES(...) CPPRUN_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
// On a function: it takes these (the object itself when empty) and returns holding them.
#define CPPRUN_ACQUIRE(...) CPPRUN_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
// On a function: it releases these (the object itself when empty).
#define CPPRUN_RELEASE(...) CPPRUN_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
// On a function: it takes these when it returns `b`.
#define CPPRUN_TRY_ACQUIRE(...) CPPRUN_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
// On a function: it checks (or the caller knows) that these are held; the analysis then
// assumes so.
#define CPPRUN_ASSERT_CAPABILITY(x) CPPRUN_THREAD_ANNOTATION(assert_capability(x))
// On a function: returns the capability named.
#define CPPRUN_RETURN_CAPABILITY(x) CPPRUN_THREAD_ANNOTATION(lock_returned(x))
// On a function: not analysed (say why where it is used).
#define CPPRUN_NO_THREAD_SAFETY_ANALYSIS CPPRUN_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace cpprun {

// std::mutex, annotated.
class CPPRUN_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() CPPRUN_ACQUIRE() { mu_.lock(); }
  void unlock() CPPRUN_RELEASE() { mu_.unlock(); }
  bool try_lock() CPPRUN_TRY_ACQUIRE(true) { return mu_.try_lock(); }
  // Tells the analysis that the caller holds the mutex (a condition's predicate); no check at
  // run time.
  void assertHeld() const CPPRUN_ASSERT_CAPABILITY(this) {}

 private:
  std::mutex mu_;
};

// std::lock_guard over a Mutex that may also be released and taken again (unlock(), lock()).
class CPPRUN_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) CPPRUN_ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  ~MutexLock() CPPRUN_RELEASE() {
    if (held_) mu_.unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void unlock() CPPRUN_RELEASE() {
    mu_.unlock();
    held_ = false;
  }
  void lock() CPPRUN_ACQUIRE() {
    mu_.lock();
    held_ = true;
  }

 private:
  Mutex& mu_;
  bool held_ = true;
};

// A condition variable over a Mutex (std::condition_variable_any: std::condition_variable wants
// a std::unique_lock<std::mutex>). Every wait is called, and returns, with the mutex held.
class CondVar {
 public:
  void notifyOne() { cv_.notify_one(); }
  void notifyAll() { cv_.notify_all(); }

  template <typename Predicate>
  void wait(Mutex& mu, Predicate ready) CPPRUN_REQUIRES(mu) {
    cv_.wait(mu, std::move(ready));
  }
  // Waits until `ready()` or for `timeout`; returns ready().
  template <typename Rep, typename Period, typename Predicate>
  bool waitFor(Mutex& mu, std::chrono::duration<Rep, Period> timeout, Predicate ready)
      CPPRUN_REQUIRES(mu) {
    return cv_.wait_for(mu, timeout, std::move(ready));
  }

 private:
  std::condition_variable_any cv_;
};

}  // namespace cpprun
