// Stall verdict: who caused a hang. A hang in a data-parallel job is one rank that stopped taking
// part and many healthy ranks that wait for it inside a collective; the first rank the watchdog
// notices is almost always one of the waiting. When a stall is declared every agent takes a
// snapshot of all its ranks (stall_watchdog.h) — what each waits in, from the collective record
// below, and the innermost frame of its Python stack — and one verdict is made over the whole
// job's snapshot (single node: by the supervisor; multi-node: by the decider over every node's
// report, job_decision.h):
//
//   - the collective the job waits in: the (process group, sequence number, op) the most ranks
//     are in (ties: the later sequence number);
//   - culprits: every rank that gave its state and is not in that collective — it is between
//     collectives (it never entered this one: a sleep, a blocking read, a busy loop), behind in
//     sequence, in a different collective at the same point (a desync), or it exited elsewhere
//     (a rank that exited inside that collective was torn down there: it waited);
//   - waiting: the ranks in that collective; they are listed as waiting, never as the failure;
//   - no culprit when every rank that gave its state waits in the same collective ("all 16 ranks
//     wait in all_reduce #4; no rank is behind: suspect the network or a device");
//   - no verdict at all (nullopt) when no rank was in a collective: the stall stays the stalled
//     ranks' own, as before (non-Python programs, programs without torch.distributed).
//
// What each rank waits in comes from its collective record (common/collective_record.h), written
// by cpprun's sitecustomize for Python workers (python_progress.h), by the bundled trainer for its
// own collectives, and by any trainer that opts in.
//
// Everything here decodes untrusted bytes (a worker's file, a peer's report) into values or
// errors, never exceptions, with every field bounded (kMaxRankStateBytes per rank).
//
// Thread safety: free functions on values; safe from any thread.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "agent/supervision/failure_report.h"
#include "common/collective_record.h"
#include "common/status.h"

namespace cpprun::agent {

// Field bounds (a longer field is refused): a frame, a stack excerpt.
inline constexpr size_t kMaxFrameBytes = 200;
inline constexpr size_t kMaxStackLines = 24;
inline constexpr size_t kMaxStackLineBytes = 200;
// A rank's digest as it crosses the store: at most this many bytes of JSON (a waiting rank's
// is about 150: no stack; a possible culprit's carries its stack excerpt).
inline constexpr size_t kMaxRankStateBytes = 6 * 1024;

// The main thread's block of a faulthandler dump (its header and File lines, innermost first,
// at most kMaxStackLines of at most kMaxStackLineBytes); empty when there is none.
std::vector<std::string> mainThreadStack(const std::string& faulthandler_text);
// The innermost frame of the main thread in a faulthandler dump ("File \"train.py\", line 6 in
// main" → "train.py:6 in main"), bounded by kMaxFrameBytes; "" when there is none.
std::string innermostPythonFrame(const std::string& faulthandler_text);
// The same from a block mainThreadStack already returned.
std::string innermostFrameOf(const std::vector<std::string>& main_thread_stack);

// One rank's state when a stall was declared.
struct RankState {
  int rank = -1;
  int local_rank = -1;
  int node = -1;     // group rank of its node (filled in by the decider; -1: this node)
  std::string host;  // its node's host ("" on the node itself)
  int pid = 0;
  bool stalled = false;  // past its progress bound when the snapshot was taken
  bool exited = false;   // it had exited
  int exit_code = 0;     // exited: its exit code, or -signal
  std::optional<CollectiveRecord> collective;  // nullopt: no (valid) record
  std::string frame;                           // innermost Python frame, "" when unknown
  std::vector<std::string> stack;              // excerpt; only kept for possible culprits
};

// JSON of a digest (compact keys) and back. The reader never throws: kInvalidArgument naming
// `where` and the field for a wrong type, a value out of range or a field over its bound.
nlohmann::json rankStateToJson(const RankState& state);
Result<RankState> rankStateFromJson(const nlohmann::json& doc, const std::string& where);

// Whether a rank's state on its own node already rules it out as a culprit: it waits in a
// collective the node's other ranks wait in too (its stack is then not shipped).
// `local` are the node's ranks' states.
void trimWaitingStacks(std::vector<RankState>& local);

struct StallVerdict {
  std::vector<size_t> culprits;  // indices into the states, in rank order
  std::vector<size_t> waiting;   // indices of the ranks in the job's collective
  std::vector<size_t> unknown;   // ranks that gave no state
  std::string waited_in;         // "all_reduce #5" (with " of group G" when not the default)
  // One line: "rank 3 (node 1, host-b) did not enter all_reduce #5: it is in train.py:6 in
  // main, after all_reduce #4; 3 ranks wait in all_reduce #5"; or the no-culprit line.
  std::string summary;
  // Per culprit index: why it is one ("did not enter all_reduce #5: ...").
  std::vector<std::string> culprit_reasons;
};

// The verdict over the whole job's states; nullopt when no rank was in a collective.
std::optional<StallVerdict> decideStall(const std::vector<RankState>& states);

// The `stall_verdict` event of attempt `attempt`: summary, waited_in, culprits (rank, node, host,
// why), waiting and unknown ranks.
nlohmann::json stallVerdictEvent(int attempt, const StallVerdict& verdict,
                                 const std::vector<RankState>& states);

// How a culprit's failure message begins.
inline constexpr const char* kHangCulpritPrefix = "the hang's culprit: ";

// Applies a verdict to the failures of the same attempt (matched by rank): every culprit becomes
// a root-cause failure carrying why, its stack and what the others wait in (one is made for a
// culprit that exited 0 or has no failure entry: host from its state); every waiting rank's
// failure is marked waiting (listed, never the root cause). The culprits' failures get the
// earliest time of all, so rootCauseIndex picks the first culprit. No culprit: the stalled
// ranks' failures stay the failures, the verdict's line first.
void applyStallVerdict(const StallVerdict& verdict, const std::vector<RankState>& states,
                       std::vector<WorkerFailure>& failures);

}  // namespace cpprun::agent
