// The collective record: what a worker waits in, so that when a job hangs cpprun can tell the
// rank that stopped taking part from the ranks that wait for it (agent/supervision/
// stall_verdict.h). The agent gives every worker CPPRUN_COLLECTIVE_FILE, a path in that rank's
// log directory; the worker keeps one line at offset 0:
//
//   "<in|after> <op> <group> <seq>", padded with spaces to kCollectiveRecordBytes (newline last)
//
// `in`: it entered collective number <seq> (from 1) of process group <group> ("world": the
// default group) and has not returned; `after`: it returned from it. <op> and <group> are 1 to
// kMaxCollectiveNameBytes of [A-Za-z0-9_.:-]. Every rank of a group must number the group's
// collectives alike (they call the same collectives in the same order, as torch requires). An
// update is one pwrite(2) in place on a descriptor opened once (about a microsecond); cpprun's
// sitecustomize writes it for Python workers, CollectiveRecorder for C++ ones (the bundled
// trainer), and any trainer may write it by hand. docs/operations.md ("Who caused a hang").
//
// Thread safety: CollectiveRecorder is used by one thread at a time; the free functions are pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>

#include "common/status.h"

namespace cpprun {

inline constexpr const char* kCollectiveFileVariable = "CPPRUN_COLLECTIVE_FILE";
inline constexpr size_t kCollectiveRecordBytes = 128;
inline constexpr size_t kMaxCollectiveNameBytes = 48;

struct CollectiveRecord {
  bool inside = false;  // "in": entered, not returned
  std::string op;       // all_reduce, broadcast, barrier, ...
  std::string group;    // "world" for the default group
  uint64_t seq = 0;     // the collective's number in its group, from 1
};

// 1 to kMaxCollectiveNameBytes of [A-Za-z0-9_.:-]: a valid op or group name.
bool validCollectiveName(const std::string& name);

// Parses a record's text (its first line; the padding is ignored). kInvalidArgument naming what
// is wrong for anything else.
Result<CollectiveRecord> parseCollectiveRecord(const std::string& text);
// The padded line for `record` (kCollectiveRecordBytes long).
std::string formatCollectiveRecord(const CollectiveRecord& record);

// Worker side: numbers one group's collectives and records each. Does nothing (and costs
// nothing) when the variable is unset or the file cannot be opened.
class CollectiveRecorder {
 public:
  // Opens the file named by CPPRUN_COLLECTIVE_FILE, if set; `group` names the group.
  static CollectiveRecorder fromEnvironment(std::string group = "world");
  // Opens `path` (created if missing; empty: a recorder that does nothing).
  CollectiveRecorder(const std::string& path, std::string group);
  ~CollectiveRecorder();
  CollectiveRecorder(CollectiveRecorder&& other) noexcept;
  CollectiveRecorder& operator=(CollectiveRecorder&& other) noexcept;
  CollectiveRecorder(const CollectiveRecorder&) = delete;
  CollectiveRecorder& operator=(const CollectiveRecorder&) = delete;

  // Records "in <op> <group> <n>" for the next n; Scope's end records "after ..." unless an
  // exception ends it (the collective failed: the rank stays recorded in it).
  // REQUIRES: `op` is a valid name (a literal of the caller's).
  class Scope {
   public:
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    friend class CollectiveRecorder;
    Scope(CollectiveRecorder& owner, const char* op)
        : owner_(owner), op_(op), exceptions_(std::uncaught_exceptions()) {}
    CollectiveRecorder& owner_;
    const char* op_;
    int exceptions_;
  };
  [[nodiscard]] Scope enter(const char* op);
  uint64_t count() const { return seq_; }

 private:
  void write(bool inside, const char* op);
  int fd_ = -1;
  std::string group_;
  uint64_t seq_ = 0;
};

}  // namespace cpprun
