// The stall verdict (agent/supervision/stall_verdict.h): the collective record's grammar, the
// faulthandler reader, the digest's JSON with hostile input, and who is blamed in every shape of
// hang — a rank between collectives, behind, in another collective, exited, and none.
#include "agent/supervision/stall_verdict.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

namespace {

using namespace cpprun;
using namespace cpprun::agent;

RankState inCollective(int rank, const std::string& op, uint64_t seq, int node = -1) {
  RankState s;
  s.rank = rank;
  s.local_rank = rank;
  s.pid = 1000 + rank;
  s.node = node;
  s.stalled = true;
  s.collective = CollectiveRecord{true, op, "world", seq};
  return s;
}

RankState after(int rank, const std::string& op, uint64_t seq, const std::string& frame,
                int node = -1) {
  RankState s = inCollective(rank, op, seq, node);
  s.collective->inside = false;
  s.frame = frame;
  return s;
}

std::vector<int> ranksOf(const std::vector<RankState>& states, const std::vector<size_t>& idx) {
  std::vector<int> out;
  for (size_t i : idx) out.push_back(states[i].rank);
  return out;
}

WorkerFailure stalledFailure(int rank, const std::string& host = "") {
  WorkerFailure f;
  f.rank = rank;
  f.local_rank = rank;
  f.pid = 1000 + rank;
  f.host = host;
  f.signal = 15;
  f.message = "stalled: no progress for 4.0 s";
  f.traceback = f.message + "\nPython stacks (faulthandler):\n  File \"x.py\", line 1\n";
  f.time = std::chrono::system_clock::time_point(std::chrono::seconds(100 + rank));
  return f;
}

}  // namespace

TEST_CASE("stall verdict: the collective record is one padded line, parsed strictly", "[unit]") {
  const CollectiveRecord r{true, "all_reduce", "world", 12};
  const std::string text = formatCollectiveRecord(r);
  CHECK(text.size() == kCollectiveRecordBytes);
  CHECK(text.back() == '\n');
  auto back = parseCollectiveRecord(text);
  REQUIRE(back.isOk());
  CHECK(back.value().inside);
  CHECK(back.value().op == "all_reduce");
  CHECK(back.value().group == "world");
  CHECK(back.value().seq == 12);
  auto done = parseCollectiveRecord("after broadcast g1a2b.4 7\n");
  REQUIRE(done.isOk());
  CHECK_FALSE(done.value().inside);
  for (const char* bad : {"", "   \n", "inside all_reduce world 1", "in all_reduce world",
                          "in all_reduce world -1", "in all_reduce world 1 extra",
                          "in all reduce world 1", "in all_reduce world 99999999999999999999",
                          "in all_reduce w\x01rld 3", "in all_reduce world 1x"}) {
    INFO(bad);
    CHECK_FALSE(parseCollectiveRecord(bad).isOk());
  }
  CHECK_FALSE(
      parseCollectiveRecord("in " + std::string(kMaxCollectiveNameBytes + 1, 'a') + " world 1")
          .isOk());
}

TEST_CASE("stall verdict: the main thread's innermost frame comes from faulthandler's last block",
          "[unit]") {
  const std::string dump =
      "Thread 0x00007f88e49646c0 (most recent call first):\n"
      "  File \"/site/sitecustomize.py\", line 77 in ask\n"
      "  File \"/usr/lib/python3.11/threading.py\", line 975 in run\n"
      "\n"
      "Current thread 0x00007f88e4c5c040 (most recent call first):\n"
      "  File \"/job/train.py\", line 6 in step\n"
      "  File \"/job/train.py\", line 20 in <module>\n";
  CHECK(innermostPythonFrame(dump) == "/job/train.py:6 in step");
  const auto stack = mainThreadStack(dump);
  REQUIRE(stack.size() == 3);
  CHECK(stack[0].rfind("Current thread", 0) == 0);
  // A second dump appended to the file: the last counts.
  CHECK(innermostPythonFrame(dump + "Current thread 0x1 (most recent call first):\n"
                                    "  File \"/job/train.py\", line 9 in other\n") ==
        "/job/train.py:9 in other");
  CHECK(innermostPythonFrame("").empty());
  CHECK(innermostPythonFrame("garbage\n  File \"x\n").empty());
  // Bounded, printable.
  const std::string huge = "Thread 0x1 (most recent call first):\n  File \"/" +
                           std::string(5000, 'a') + "\x01\", line 1 in f\n";
  CHECK(innermostPythonFrame(huge).size() <= kMaxFrameBytes);
}

TEST_CASE("stall verdict: the rank between collectives is the culprit, the others wait", "[unit]") {
  std::vector<RankState> states = {
      inCollective(0, "all_reduce", 5), inCollective(1, "all_reduce", 5),
      after(2, "all_reduce", 4, "train.py:6 in <module>"), inCollective(3, "all_reduce", 5)};
  auto v = decideStall(states);
  REQUIRE(v.has_value());
  CHECK(ranksOf(states, v->culprits) == std::vector<int>{2});
  CHECK(ranksOf(states, v->waiting) == std::vector<int>{0, 1, 3});
  CHECK(v->waited_in == "all_reduce #5");
  CHECK(v->summary ==
        "rank 2 did not enter all_reduce #5: it is in train.py:6 in <module>, after all_reduce #4; "
        "3 ranks wait in all_reduce #5");
}

TEST_CASE("stall verdict: a desync, a rank behind, an exited rank and nodes are named", "[unit]") {
  SECTION("a desync: one rank in a different collective at the same point") {
    std::vector<RankState> states;
    for (int r = 0; r < 8; ++r) states.push_back(inCollective(r, "all_reduce", 12));
    states[5] = inCollective(5, "all_gather", 12);
    auto v = decideStall(states);
    REQUIRE(v.has_value());
    CHECK(ranksOf(states, v->culprits) == std::vector<int>{5});
    CHECK(v->summary ==
          "rank 5 waits in all_gather #12, not all_reduce (a desync); 7 ranks wait in "
          "all_reduce #12");
  }
  SECTION("behind in sequence, on another node") {
    std::vector<RankState> states = {
        inCollective(0, "all_reduce", 9, 0), inCollective(1, "all_reduce", 9, 0),
        inCollective(2, "all_reduce", 8, 1), inCollective(3, "all_reduce", 9, 1)};
    states[2].host = "node-b";
    auto v = decideStall(states);
    REQUIRE(v.has_value());
    CHECK(ranksOf(states, v->culprits) == std::vector<int>{2});
    CHECK_THAT(v->summary, Catch::StartsWith("rank 2 (node 1, node-b) is behind: at all_reduce "
                                             "#8, not #9"));
  }
  SECTION("a rank that exited its loop") {
    std::vector<RankState> states = {inCollective(0, "all_reduce", 4),
                                     after(1, "all_reduce", 3, "")};
    states[1].exited = true;
    states[1].exit_code = 0;
    auto v = decideStall(states);
    REQUIRE(v.has_value());
    CHECK(ranksOf(states, v->culprits) == std::vector<int>{1});
    CHECK(v->summary ==
          "rank 1 exited with code 0 after all_reduce #3 and never entered "
          "all_reduce #4; 1 rank waits in all_reduce #4");
  }
  SECTION("a rank that exited inside the collective the others wait in was torn down there") {
    // Another node's teardown ended its gloo connections before this node's snapshot.
    std::vector<RankState> states = {
        inCollective(0, "all_reduce", 4), after(1, "all_reduce", 3, ""),
        inCollective(2, "all_reduce", 4), inCollective(3, "all_reduce", 4)};
    states[2].exited = true;
    states[2].exit_code = 1;
    states[3].exited = true;
    states[3].exit_code = 1;
    auto v = decideStall(states);
    REQUIRE(v.has_value());
    CHECK(ranksOf(states, v->culprits) == std::vector<int>{1});
    CHECK(ranksOf(states, v->waiting) == std::vector<int>{0, 2, 3});
  }
  SECTION("ties go to the later collective; ranks without a record are unknown, not culprits") {
    std::vector<RankState> states = {inCollective(0, "all_reduce", 3),
                                     inCollective(1, "all_reduce", 4)};
    RankState silent;
    silent.rank = 2;
    states.push_back(silent);
    auto v = decideStall(states);
    REQUIRE(v.has_value());
    CHECK(ranksOf(states, v->waiting) == std::vector<int>{1});
    CHECK(ranksOf(states, v->culprits) == std::vector<int>{0});
    CHECK(ranksOf(states, v->unknown) == std::vector<int>{2});
  }
}

TEST_CASE("stall verdict: no culprit when every rank waits in the same collective", "[unit]") {
  std::vector<RankState> states;
  for (int r = 0; r < 16; ++r) states.push_back(inCollective(r, "all_reduce", 4));
  auto v = decideStall(states);
  REQUIRE(v.has_value());
  CHECK(v->culprits.empty());
  CHECK(v->summary ==
        "all 16 ranks wait in all_reduce #4; no rank is behind: suspect the network or a device");
  // Applied: the stalled ranks stay the failures, the verdict first; nobody is made a culprit.
  std::vector<WorkerFailure> failures = {stalledFailure(0), stalledFailure(1)};
  applyStallVerdict(*v, states, failures);
  CHECK(failures[0].message == v->summary);
  CHECK_FALSE(failures[0].waiting);
  CHECK_THAT(failures[0].traceback, Catch::StartsWith(v->summary + "\nstalled:"));
}

TEST_CASE("stall verdict: none when no rank is in a collective", "[unit]") {
  std::vector<RankState> states = {after(0, "all_reduce", 3, "a.py:1"), RankState{}};
  CHECK_FALSE(decideStall(states).has_value());
  CHECK_FALSE(decideStall({}).has_value());
}

TEST_CASE("stall verdict: applied, the culprit is the root cause and the stalled victims wait",
          "[unit]") {
  std::vector<RankState> states = {
      inCollective(0, "all_reduce", 5, 0), inCollective(1, "all_reduce", 5, 0),
      inCollective(2, "all_reduce", 5, 1), after(3, "all_reduce", 4, "train.py:6 in <module>", 1)};
  states[3].host = "b";
  states[3].stalled = false;  // torn down because node 0 stopped the job
  states[3].stack = {"Current thread 0x1 (most recent call first):",
                     "  File \"train.py\", line 6 in <module>"};
  auto v = decideStall(states);
  REQUIRE(v.has_value());
  // Node 0's ranks stalled first and were the stop's owner's failures; node 1's were torn down.
  std::vector<WorkerFailure> failures = {stalledFailure(0, "a"), stalledFailure(1, "a"),
                                         stalledFailure(2, "b"), stalledFailure(3, "b")};
  failures[2].teardown = true;
  failures[3].teardown = true;
  failures[3].collateral = true;
  failures[3].time += std::chrono::seconds(50);
  applyStallVerdict(*v, states, failures);
  const WorkerFailure& root = failures[rootCauseIndex(failures)];
  CHECK(root.rank == 3);
  CHECK_FALSE(root.teardown);
  CHECK_FALSE(root.collateral);
  CHECK_THAT(root.message, Catch::StartsWith("the hang's culprit: rank 3 (node 1, b) did not "
                                             "enter all_reduce #5"));
  CHECK_THAT(root.traceback, Catch::Contains("line 6 in <module>"));
  CHECK_THAT(root.traceback, Catch::Contains("3 ranks wait in all_reduce #5"));
  for (int r : {0, 1, 2}) {
    CHECK(failures[static_cast<size_t>(r)].waiting);
    CHECK(failures[static_cast<size_t>(r)].message == "waiting in all_reduce #5 for the culprit");
  }
  const std::string report = formatFailureReport("train.py", "a", failures);
  CHECK_THAT(report, Catch::Contains("Root Cause (first observed failure):\n[3]:"));
  CHECK_THAT(report, Catch::Contains("(waiting: stopped by cpprun while it waited for the "
                                     "culprit)"));
}

TEST_CASE("stall verdict: a culprit with no failure entry (it exited 0) gets one", "[unit]") {
  std::vector<RankState> states = {inCollective(0, "all_reduce", 4), after(1, "all_reduce", 3, "")};
  states[1].exited = true;
  states[1].host = "h1";
  auto v = decideStall(states);
  REQUIRE(v.has_value());
  std::vector<WorkerFailure> failures = {stalledFailure(0)};
  applyStallVerdict(*v, states, failures);
  REQUIRE(failures.size() == 2);
  const WorkerFailure& root = failures[rootCauseIndex(failures)];
  CHECK(root.rank == 1);
  CHECK(root.host == "h1");
  CHECK(root.exit_code == 0);
  CHECK_THAT(root.message, Catch::Contains("exited with code 0"));
}

TEST_CASE("stall verdict: a rank's digest survives JSON and hostile digests are refused",
          "[unit]") {
  RankState s = after(7, "broadcast", 99, "t.py:3 in f", 2);
  s.exited = true;
  s.exit_code = -9;
  s.stack = {"Current thread 0x1 (most recent call first):", "  File \"t.py\", line 3 in f"};
  auto back = rankStateFromJson(rankStateToJson(s), "node 2's report");
  REQUIRE(back.isOk());
  CHECK(back.value().rank == 7);
  CHECK(back.value().exited);
  CHECK(back.value().exit_code == -9);
  REQUIRE(back.value().collective.has_value());
  CHECK(back.value().collective->op == "broadcast");
  CHECK(back.value().collective->seq == 99);
  CHECK(back.value().frame == "t.py:3 in f");
  CHECK(back.value().stack == s.stack);
  CHECK(rankStateToJson(s).dump().size() < kMaxRankStateBytes);
  // A waiting rank's digest is small.
  CHECK(rankStateToJson(inCollective(4095, "all_reduce", 123456)).dump().size() < 120);

  using nlohmann::json;
  const std::vector<json> hostile = {
      json(),
      json(7),
      json::array(),
      json({{"l", 1}}),
      json({{"r", "1"}}),
      json({{"r", -1}}),
      json({{"r", 1}, {"p", 1e9}}),
      json({{"r", 1}, {"c", 4000}}),
      json({{"r", 1}, {"s", 1}}),
      json({{"r", 1}, {"op", 5}, {"g", "world"}, {"q", 1}, {"in", true}}),
      json({{"r", 1}, {"op", "all_reduce"}, {"g", "world"}, {"q", -1}, {"in", true}}),
      json({{"r", 1}, {"op", "all_reduce"}, {"g", "world"}, {"q", 1}, {"in", "yes"}}),
      json({{"r", 1}, {"op", "a b"}, {"g", "world"}, {"q", 1}}),
      json({{"r", 1}, {"f", std::string(kMaxFrameBytes + 1, 'x')}}),
      json({{"r", 1}, {"k", json::array({1})}}),
      json({{"r", 1}, {"k", std::vector<std::string>(kMaxStackLines + 1, "x")}}),
      json({{"r", uint64_t{1} << 40}})};
  for (const json& doc : hostile) {
    INFO(doc.dump());
    auto r = rankStateFromJson(doc, "node 3's report");
    REQUIRE_FALSE(r.isOk());
    CHECK_THAT(r.status().message(), Catch::StartsWith("node 3's report: "));
  }
}

TEST_CASE("stall verdict: a node's waiting ranks lose their stacks, possible culprits keep them",
          "[unit]") {
  std::vector<RankState> local = {
      inCollective(0, "all_reduce", 5), inCollective(1, "all_reduce", 5),
      after(2, "all_reduce", 4, "t.py:1"), inCollective(3, "barrier", 5)};
  for (RankState& s : local) s.stack = {"Current thread 0x1 (most recent call first):"};
  trimWaitingStacks(local);
  CHECK(local[0].stack.empty());
  CHECK(local[1].stack.empty());
  CHECK_FALSE(local[2].stack.empty());
  CHECK_FALSE(local[3].stack.empty());  // alone in its collective on this node
}
