// The host's decision for the job (job_decision.h) from hand-made reports, and the records'
// JSON forms (job_keys.h) through a round trip. Pure: no store, no threads.
#include "agent/coordination/job_decision.h"

#include <catch2/catch.hpp>

#include "agent/coordination/job_keys.h"

namespace {

using namespace cpprun;
using namespace cpprun::agent;

const auto kNow = std::chrono::system_clock::time_point(std::chrono::seconds(1'700'000'000));

// Three nodes h0, h1, h2 with 2 workers each.
Membership threeNodes() {
  return membershipOf({{"h0", 2, "a0", -1}, {"h1", 2, "a1", -1}, {"h2", 2, "a2", -1}}, 0);
}

WorkerFailure failure(const std::string& host, int rank, int exit_code, bool teardown = false) {
  WorkerFailure f;
  f.host = host;
  f.rank = rank;
  f.exit_code = exit_code;
  f.teardown = teardown;
  f.time = kNow;
  return f;
}

NodeOutcome reported(AttemptReport::Kind kind, std::vector<WorkerFailure> failures = {}) {
  NodeOutcome o;
  o.report.kind = kind;
  o.report.failures = std::move(failures);
  return o;
}

NodeOutcome lostNode(const std::string& why) {
  NodeOutcome o;
  o.lost = true;
  o.lost_error = why;
  return o;
}

std::map<int, NodeOutcome> allSucceeded() {
  return {{0, reported(AttemptReport::Kind::kSucceeded)},
          {1, reported(AttemptReport::Kind::kSucceeded)},
          {2, reported(AttemptReport::Kind::kSucceeded)}};
}

// Node 2's worker (rank 5) failed and node 2 claimed the stop; nodes 0 and 1 tore theirs down,
// and node 1's rank 2 failed on its own after the stop (an NCCL error once a peer is gone).
std::map<int, NodeOutcome> nodeTwoFailed() {
  return {{0, reported(AttemptReport::Kind::kStopped, {failure("h0", 0, 0, /*teardown=*/true)})},
          {1, reported(AttemptReport::Kind::kStopped,
                       {failure("h1", 2, 134), failure("h1", 3, 0, /*teardown=*/true)})},
          {2, reported(AttemptReport::Kind::kFailed, {failure("h2", 5, 3)})}};
}

StopClaim claimBy(int rank, const std::string& reason, StopCause cause = StopCause::kFailure,
                  int signal = 0) {
  return StopClaim{rank, reason, cause, signal};
}

}  // namespace

TEST_CASE("decide: every node succeeded and nobody claimed the stop: the job succeeded", "[unit]") {
  const JobDecision d =
      decideJob(threeNodes(), allSucceeded(), StopClaim{}, {2, false, 1}, 0, kNow);
  CHECK(d.kind == JobDecision::Kind::kSucceeded);
  CHECK(d.restarts_used == 0);
  CHECK(d.failures.empty());
  CHECK_FALSE(d.membership_change);
}

TEST_CASE("decide: a failure with budget left restarts and uses one restart", "[unit]") {
  const JobDecision d = decideJob(threeNodes(), nodeTwoFailed(),
                                  claimBy(2, "node 2 (h2): worker 5 exited 3"), {3, false, 1},
                                  /*restarts_used=*/1, kNow);
  CHECK(d.kind == JobDecision::Kind::kRestart);
  CHECK(d.restarts_used == 2);
  CHECK_FALSE(d.membership_change);
  CHECK(d.summary == "node 2 (h2): worker 5 exited 3");
}

TEST_CASE("decide: with the budget spent the job fails, root cause first and collateral after",
          "[unit]") {
  const JobDecision d = decideJob(threeNodes(), nodeTwoFailed(),
                                  claimBy(2, "node 2 (h2): worker 5 exited 3"), {1, false, 1},
                                  /*restarts_used=*/1, kNow);
  CHECK(d.kind == JobDecision::Kind::kFailed);
  CHECK(d.restarts_used == 1);
  CHECK(d.summary == "node 2 (h2): worker 5 exited 3");
  REQUIRE(d.failures.size() == 4);
  // The stop claimant's failure is the root cause, never collateral.
  CHECK(d.failures[0].host == "h2");
  CHECK(d.failures[0].rank == 5);
  CHECK_FALSE(d.failures[0].collateral);
  // The others follow in node order; a worker that failed on its own after the stop is
  // collateral, one the agent tore down is not (it is teardown).
  CHECK(d.failures[1].host == "h0");
  CHECK_FALSE(d.failures[1].collateral);
  CHECK(d.failures[2].host == "h1");
  CHECK(d.failures[2].rank == 2);
  CHECK(d.failures[2].collateral);
  CHECK(d.failures[3].rank == 3);
  CHECK_FALSE(d.failures[3].collateral);
}

TEST_CASE("decide: a failure report without a stop claim still uses the budget", "[unit]") {
  auto outcomes = allSucceeded();
  outcomes[1] = reported(AttemptReport::Kind::kFailed, {failure("h1", 2, 1)});
  const JobDecision d = decideJob(threeNodes(), outcomes, StopClaim{}, {0, false, 1}, 0, kNow);
  CHECK(d.kind == JobDecision::Kind::kFailed);
  REQUIRE(d.failures.size() == 1);
  CHECK_FALSE(d.failures[0].collateral);  // nobody claimed the stop: nothing is collateral
}

TEST_CASE("decide: a forwarded signal stops the job whatever else failed", "[unit]") {
  auto outcomes = nodeTwoFailed();
  outcomes[1].report.kind = AttemptReport::Kind::kSignalled;
  outcomes[1].report.signal = 15;
  const JobDecision d =
      decideJob(threeNodes(), outcomes, claimBy(1, "node 1 (h1): SIGTERM", StopCause::kSignal, 15),
                {5, false, 1}, 0, kNow);
  CHECK(d.kind == JobDecision::Kind::kStopped);
  CHECK(d.signal == 15);
  CHECK(d.restarts_used == 0);
  CHECK(d.summary == "node 1 (h1): SIGTERM");
}

TEST_CASE("decide: a node that could not start its workers fails the job, named", "[unit]") {
  auto outcomes = allSucceeded();
  outcomes[2].report.kind = AttemptReport::Kind::kStartFailed;
  outcomes[2].report.error = "cannot run 'train.py'";
  const JobDecision d = decideJob(threeNodes(), outcomes, StopClaim{}, {5, false, 1}, 0, kNow);
  CHECK(d.kind == JobDecision::Kind::kFailed);
  CHECK(d.summary == "node 2: cannot run 'train.py'");
}

TEST_CASE("decide: a start failure on one node outranks a signal on another, as on one node",
          "[unit]") {
  // Node 2 could not start its workers and claimed the stop; node 1 received SIGTERM meanwhile.
  // Before the one restart policy this was kStopped (the signal first), while the same two facts
  // on one node reported kStartFailed and so decided kFailed: the job's end depended on which
  // node the signal reached. Now both name node 2's start failure.
  auto outcomes = allSucceeded();
  outcomes[1].report.kind = AttemptReport::Kind::kSignalled;
  outcomes[1].report.signal = 15;
  outcomes[2].report.kind = AttemptReport::Kind::kStartFailed;
  outcomes[2].report.error = "cannot run 'train.py'";
  const JobDecision d = decideJob(
      threeNodes(), outcomes, claimBy(2, "node 2 (h2): could not start"), {5, false, 1}, 0, kNow);
  CHECK(d.kind == JobDecision::Kind::kFailed);
  CHECK(d.summary == "node 2: cannot run 'train.py'");
  CHECK(d.restarts_used == 0);

  // The same facts on one node: its report says kStartFailed, the decision is the same.
  auto one_node = allSucceeded();
  one_node[2].report.kind = AttemptReport::Kind::kStartFailed;
  one_node[2].report.error = "cannot run 'train.py'";
  const JobDecision same = decideJob(
      threeNodes(), one_node, claimBy(2, "node 2 (h2): could not start"), {5, false, 1}, 0, kNow);
  CHECK(same.kind == d.kind);
  CHECK(same.summary == d.summary);
}

TEST_CASE("decide: a stop claim without a failure restarts while the budget lasts, then fails",
          "[unit]") {
  const StopClaim claim = claimBy(0, "node 0 (h0): stopped");
  auto stopped = allSucceeded();
  stopped[1].report.kind = AttemptReport::Kind::kStopped;
  const JobDecision restart = decideJob(threeNodes(), stopped, claim, {1, false, 1}, 0, kNow);
  CHECK(restart.kind == JobDecision::Kind::kRestart);
  CHECK(restart.restarts_used == 1);
  const JobDecision spent = decideJob(threeNodes(), stopped, claim, {1, false, 1}, 1, kNow);
  CHECK(spent.kind == JobDecision::Kind::kFailed);
  CHECK(spent.restarts_used == 1);
}

TEST_CASE("decide: a lost node fails a static job and stands in first for its workers", "[unit]") {
  auto outcomes = nodeTwoFailed();
  outcomes[1] = lostNode("the agent of node 1 (h1) stopped responding");
  const JobDecision d =
      decideJob(threeNodes(), outcomes, claimBy(1, "x", StopCause::kLost), {5, false, 1}, 0, kNow);
  CHECK(d.kind == JobDecision::Kind::kFailed);
  CHECK(d.summary == "the agent of node 1 (h1) stopped responding");
  CHECK(d.restarts_used == 0);
  REQUIRE_FALSE(d.failures.empty());
  CHECK(d.failures[0].host == "h1");
  CHECK(d.failures[0].rank == 2);  // node 1's first global rank
  CHECK(d.failures[0].exit_code == 1);
  CHECK(d.failures[0].time == kNow);
  CHECK(d.failures[0].message == "the agent of node 1 (h1) stopped responding");
}

TEST_CASE("decide: elastic, a lost node re-forms the group without using the budget", "[unit]") {
  auto outcomes = allSucceeded();
  outcomes[2] = lostNode("node 2 lost");
  const JobDecision d = decideJob(threeNodes(), outcomes, claimBy(2, "x", StopCause::kLost),
                                  {/*max_restarts=*/0, /*elastic=*/true, /*min_nodes=*/2}, 0, kNow);
  CHECK(d.kind == JobDecision::Kind::kRestart);
  CHECK(d.membership_change);
  CHECK(d.restarts_used == 0);
}

TEST_CASE("decide: elastic, fewer than min_nodes left fails naming the minimum", "[unit]") {
  auto outcomes = allSucceeded();
  outcomes[1] = lostNode("node 1 lost");
  outcomes[2] = lostNode("node 2 lost");
  const JobDecision d = decideJob(threeNodes(), outcomes, StopClaim{}, {5, true, 2}, 0, kNow);
  CHECK(d.kind == JobDecision::Kind::kFailed);
  CHECK(d.summary == "node 1 lost; 1 nodes left, fewer than the minimum 2");
  REQUIRE(d.failures.size() == 2);
  CHECK(d.failures[0].host == "h2");  // stand-ins in front, the last found first
  CHECK(d.failures[1].host == "h1");
}

TEST_CASE("decide: elastic, agents waiting to join re-form the group without using the budget",
          "[unit]") {
  auto outcomes = allSucceeded();
  for (auto& [rank, o] : outcomes) o.report.kind = AttemptReport::Kind::kStopped;
  const JobDecision d =
      decideJob(threeNodes(), outcomes, claimBy(0, "1 node(s) waiting to join", StopCause::kJoin),
                {0, true, 1}, 0, kNow);
  CHECK(d.kind == JobDecision::Kind::kRestart);
  CHECK(d.membership_change);
  CHECK(d.restarts_used == 0);
}

TEST_CASE("decide: a failure during a join re-forming uses the budget", "[unit]") {
  auto outcomes = allSucceeded();
  outcomes[1] = reported(AttemptReport::Kind::kFailed, {failure("h1", 2, 1)});
  const JobDecision d = decideJob(threeNodes(), outcomes, claimBy(0, "joiners", StopCause::kJoin),
                                  {0, true, 1}, 0, kNow);
  CHECK(d.kind == JobDecision::Kind::kFailed);
  CHECK_FALSE(d.membership_change);
}

TEST_CASE("job records: report, decision and stop claim survive their JSON form", "[unit]") {
  AttemptReport report;
  report.kind = AttemptReport::Kind::kSignalled;
  report.signal = 10;
  report.failures = {failure("", 3, 7)};
  const AttemptReport back = reportFromJson(reportToJson(report, "h9")).value();
  CHECK(back.kind == AttemptReport::Kind::kSignalled);
  CHECK(back.signal == 10);
  REQUIRE(back.failures.size() == 1);
  CHECK(back.failures[0].host == "h9");  // the reporting node's host is written in
  CHECK(back.failures[0].rank == 3);
  CHECK(back.failures[0].exit_code == 7);
  CHECK(back.failures[0].time == kNow);

  JobDecision decision;
  decision.kind = JobDecision::Kind::kStopped;
  decision.signal = 15;
  decision.summary = "s";
  decision.restarts_used = 2;
  decision.membership_change = true;
  decision.failures = {failure("h1", 1, 2)};
  const Result<DecisionRecord> record = decisionFromJson(decisionToJson(decision, 3), 7);
  REQUIRE(record.isOk());
  CHECK(record.value().readers == 3);
  CHECK(record.value().decision.kind == JobDecision::Kind::kStopped);
  CHECK(record.value().decision.signal == 15);
  CHECK(record.value().decision.summary == "s");
  CHECK(record.value().decision.restarts_used == 2);
  CHECK(record.value().decision.membership_change);
  REQUIRE(record.value().decision.failures.size() == 1);
  CHECK(record.value().decision.failures[0].host == "h1");
  CHECK_FALSE(decisionFromJson(nlohmann::json("garbage"), 1).isOk());

  const StopClaim stop = stopFromJson(stopToJson({2, "why", StopCause::kLost, 0})).value();
  CHECK(stop.by == 2);
  CHECK(stop.reason == "why");
  CHECK(stop.cause == StopCause::kLost);
  CHECK_FALSE(stopFromJson(nlohmann::json()).isOk());

  CHECK_THAT(reportFromJson(nlohmann::json("garbage"), "attempt/0/report/1").status().message(),
             Catch::Contains("attempt/0/report/1") && Catch::Contains("not a JSON object"));
  CHECK_FALSE(agentFromRecord(nlohmann::json{{"host", "h"}}, "node 3's record").isOk());
  CHECK_THAT(agentFromRecord(nlohmann::json{{"host", "h"}}, "node 3's record").status().message(),
             Catch::Contains("node 3's record"));
}

TEST_CASE("membership: base rank and world size from the agents' worker counts", "[unit]") {
  const Membership m =
      membershipOf({{"h0", 2, "a", -1}, {"h1", 3, "b", -1}, {"h2", 1, "c", -1}}, 2);
  CHECK(m.group_rank == 2);
  CHECK(m.group_world_size == 3);
  CHECK(m.base_rank == 5);
  CHECK(m.world_size == 6);
}

TEST_CASE("decide: elastic, a lost node with spares waiting re-forms even below min_nodes",
          "[unit]") {
  auto outcomes = allSucceeded();
  outcomes[2] = lostNode("node 2 lost");
  // --nnodes=3:3 and one spare waiting in the next round: 2 survivors + 1 spare = MIN.
  DecisionPolicy policy{/*max_restarts=*/0, /*elastic=*/true, /*min_nodes=*/3};
  policy.waiting_nodes = 1;
  JobDecision d = decideJob(threeNodes(), outcomes, claimBy(2, "node 2 lost", StopCause::kLost),
                            policy, 0, kNow);
  CHECK(d.kind == JobDecision::Kind::kRestart);
  CHECK(d.membership_change);
  CHECK(d.restarts_used == 0);
  CHECK_THAT(d.summary, Catch::Contains("1 spare node(s) waiting"));
  // Without the spare the same loss fails the job.
  policy.waiting_nodes = 0;
  d = decideJob(threeNodes(), outcomes, claimBy(2, "node 2 lost", StopCause::kLost), policy, 0,
                kNow);
  CHECK(d.kind == JobDecision::Kind::kFailed);
}

TEST_CASE("decide: a node that left re-forms the group without using the budget", "[unit]") {
  std::map<int, NodeOutcome> outcomes = {
      {0, reported(AttemptReport::Kind::kStopped, {failure("h0", 0, 0, /*teardown=*/true)})},
      {1, reported(AttemptReport::Kind::kStopped, {failure("h1", 2, 0, /*teardown=*/true)})},
      {2, reported(AttemptReport::Kind::kStopped, {failure("h2", 4, 0, /*teardown=*/true)})}};
  const StopClaim leave = claimBy(1, "node 1 (h1) left the job (SIGPWR)", StopCause::kLeave);
  JobDecision d = decideJob(threeNodes(), outcomes, leave,
                            {/*max_restarts=*/0, /*elastic=*/true, /*min_nodes=*/2}, 0, kNow);
  CHECK(d.kind == JobDecision::Kind::kRestart);
  CHECK(d.membership_change);
  CHECK(d.restarts_used == 0);
  CHECK(d.summary == "node 1 (h1) left the job (SIGPWR)");
  // The claim survives its JSON round trip.
  CHECK(stopFromJson(stopToJson(leave)).value().cause == StopCause::kLeave);
}

namespace {

RankState rankIn(int rank, bool inside, uint64_t seq) {
  RankState s;
  s.rank = rank;
  s.local_rank = rank % 2;
  s.pid = 100 + rank;
  s.stalled = inside;
  s.collective = CollectiveRecord{inside, "all_reduce", "world", seq};
  return s;
}

}  // namespace

TEST_CASE(
    "job decision: a hang's verdict over every node's states names the culprit's node, "
    "whoever stopped the attempt",
    "[unit]") {
  // Node 0 found its ranks stalled first and claimed the stop; rank 5 on node 2 never entered
  // all_reduce #7. Its digest travels in node 2's report, through the report's JSON.
  std::map<int, NodeOutcome> outcomes = {
      {0, reported(AttemptReport::Kind::kFailed, {failure("h0", 0, 0), failure("h0", 1, 0)})},
      {1, reported(AttemptReport::Kind::kStopped,
                   {failure("h1", 2, 0, true), failure("h1", 3, 0, true)})},
      {2, reported(AttemptReport::Kind::kStopped,
                   {failure("h2", 4, 0, true), failure("h2", 5, 0, true)})}};
  outcomes[0].report.failures[0].message = "stalled: no progress for 4.0 s";
  outcomes[0].report.rank_states = {rankIn(0, true, 7), rankIn(1, true, 7)};
  outcomes[1].report.rank_states = {rankIn(2, true, 7), rankIn(3, true, 7)};
  AttemptReport node2;
  node2.kind = AttemptReport::Kind::kStopped;
  node2.failures = outcomes[2].report.failures;
  node2.rank_states = {rankIn(4, true, 7), rankIn(5, false, 6)};
  node2.rank_states[1].frame = "train.py:40 in save";
  node2.rank_states[1].stack = {"Current thread 0x1 (most recent call first):",
                                "  File \"train.py\", line 40 in save"};
  node2.rank_states[0].stack = {"Current thread 0x1 (most recent call first):"};
  outcomes[2].report = reportFromJson(reportToJson(node2, "h2")).value();
  REQUIRE(outcomes[2].report.rank_states.size() == 2);
  // Rank 4 is alone in its collective on its node (a possible culprit): its stack travels too.
  CHECK(outcomes[2].report.rank_states[0].stack.size() == 1);
  CHECK(outcomes[2].report.rank_states[1].stack.size() == 2);
  // Node 1's ranks wait in the same collective: their stacks stay home.
  for (RankState& s : outcomes[1].report.rank_states) s.stack = {"Current thread 0x1"};
  outcomes[1].report = reportFromJson(reportToJson(outcomes[1].report, "h1")).value();
  REQUIRE(outcomes[1].report.rank_states.size() == 2);
  CHECK(outcomes[1].report.rank_states[0].stack.empty());
  CHECK(outcomes[1].report.rank_states[1].stack.empty());

  JobDecision d =
      decideJob(threeNodes(), outcomes,
                claimBy(0, "node 0 (h0): rank(s) 0 stalled", StopCause::kStall), {}, 0, kNow);
  auto hang = applyJobStallVerdict(threeNodes(), outcomes, d);
  REQUIRE(hang.has_value());
  CHECK(hang->culprit_node == 2);
  CHECK(d.summary ==
        "hang: rank 5 (node 2, h2) did not enter all_reduce #7: it is in train.py:40 "
        "in save, after all_reduce #6; 5 ranks wait in all_reduce #7");
  REQUIRE(!d.failures.empty());
  CHECK(d.failures.front().rank == 5);  // root cause first
  CHECK(d.failures[rootCauseIndex(d.failures)].rank == 5);
  CHECK(d.failures.front().host == "h2");
  CHECK_THAT(d.failures.front().traceback, Catch::Contains("line 40 in save"));
  for (const WorkerFailure& f : d.failures) {
    if (f.rank != 5) CHECK(f.waiting);
  }
}

TEST_CASE("job decision: no rank states, or a malformed report's, leave the decision alone",
          "[unit]") {
  auto outcomes = nodeTwoFailed();
  JobDecision d =
      decideJob(threeNodes(), outcomes, claimBy(2, "node 2: rank 5 exited"), {}, 0, kNow);
  const JobDecision before = d;
  CHECK_FALSE(applyJobStallVerdict(threeNodes(), outcomes, d).has_value());
  CHECK(d.summary == before.summary);
  // Hostile digests in a report are dropped, never thrown.
  nlohmann::json doc = reportToJson(AttemptReport{}, "h1");
  doc["ranks"] = nlohmann::json::array({nlohmann::json({{"r", "x"}}), nlohmann::json(3),
                                        nlohmann::json({{"r", 1}, {"q", -1}, {"op", "a"}})});
  CHECK(reportFromJson(doc).value().rank_states.empty());
  // A report whose ranks are not a list at all is malformed as a whole.
  doc["ranks"] = "not a list";
  CHECK_FALSE(reportFromJson(doc).isOk());
}

TEST_CASE("job decision: at scale the decision lists the root causes first, at most 64 failures",
          "[unit]") {
  JobDecision d;
  d.kind = JobDecision::Kind::kFailed;
  d.summary = "hang: rank 4000 (node 500, h500) did not enter all_reduce #7";
  for (int r = 0; r < 8192; ++r) {
    WorkerFailure f = failure("h" + std::to_string(r / 8), r, 0, /*teardown=*/r != 4000);
    f.waiting = r != 4000;
    d.failures.push_back(f);
  }
  compactDecision(d);
  REQUIRE(d.failures.size() == kMaxDecisionFailures);
  CHECK(d.failures.front().rank == 4000);
  CHECK_THAT(d.summary, Catch::EndsWith("(the report lists 64 of 8192 failures; each node's own "
                                        "lists its ranks)"));
  CHECK(decisionToJson(d, 1024).dump().size() < 64 * 1024);
  // A small job's decision is left as it is.
  JobDecision small;
  small.failures = {failure("h0", 0, 1)};
  small.summary = "node 0: rank 0 exited with code 1";
  compactDecision(small);
  CHECK(small.failures.size() == 1);
  CHECK(small.summary == "node 0: rank 0 exited with code 1");
}

TEST_CASE("job keys: records with fields of the wrong type or range are errors naming the field",
          "[unit]") {
  using nlohmann::json;
  // Issue 36's first finding: {"by":"x","cause":7} in the stop key aborted every agent.
  Result<StopClaim> stop = internalError("unset");
  REQUIRE_NOTHROW(stop = stopFromRecord(R"({"by":"x","cause":7,"signal":"9"})", "attempt/0/stop"));
  REQUIRE_FALSE(stop.isOk());
  CHECK_THAT(stop.status().message(),
             Catch::StartsWith("attempt/0/stop: \"by\" is text, not an integer in -1..65535"));
  REQUIRE_NOTHROW(stop = stopFromJson(json::parse(R"({"by":1e300,"reason":[1],"cause":null})")));
  CHECK_FALSE(stop.isOk());
  CHECK_THAT(
      stopFromJson(json::parse(R"({"by":99999999999,"cause":"failure"})")).status().message(),
      Catch::Contains("99999999999"));
  CHECK_THAT(stopFromJson(json::parse(R"({"by":1,"cause":"mutiny"})")).status().message(),
             Catch::Contains("\"cause\" is not one of the stop causes"));
  CHECK_THAT(stopFromRecord("handled", "attempt/3/stop").status().message(),
             Catch::Equals("attempt/3/stop: the record is not JSON"));
  CHECK(stopFromRecord(R"({"by":1,"cause":"failure"})", "k").isOk());
  const json hostile_failure = json::parse(
      R"({"rank":"3","pid":[],"exit_code":{},"time_us":"x","message":5,"stderr_tail":[1,"a"],
          "teardown":"yes","waiting":1,"host":false,"state":7,"wchan":null})");
  Result<WorkerFailure> f = internalError("unset");
  REQUIRE_NOTHROW(f = failureFromJson(hostile_failure, "a failure"));
  CHECK_THAT(f.status().message(), Catch::Contains("\"rank\" is text"));
  Result<AttemptReport> report = internalError("unset");
  REQUIRE_NOTHROW(report = reportFromJson(json::parse(
                      R"({"kind":3,"signal":"x","error":1,"failures":{"a":1},"ranks":7})")));
  CHECK_FALSE(report.isOk());
  CHECK_FALSE(reportFromJson(json::parse(R"({"kind":"failed","failures":[{"pid":-4}]})")).isOk());
  Result<DecisionRecord> decision = internalError("unset");
  REQUIRE_NOTHROW(decision = decisionFromJson(
                      json::parse(R"({"kind":1,"readers":"all","summary":[],"failures":"none",
                      "excluded":{"rank":"1","agent_id":2}})"),
                      3));
  CHECK_FALSE(decision.isOk());
  CHECK_FALSE(decisionFromJson(json::parse(R"({"kind":"failed","readers":"x"})"), 3).isOk());
  decision = decisionFromJson(json::parse(R"({"kind":"failed"})"), 3);
  REQUIRE(decision.isOk());
  CHECK(decision.value().readers == 3);  // an absent field keeps its default
  // Finding 3: a record asking for more workers than a command line could is refused.
  CHECK_THAT(
      agentFromRecord(json::parse(R"({"host":"h","nproc":2000000000,"id":"x"})"), "slot 1's record")
          .status()
          .message(),
      Catch::Contains("\"nproc\" is 2000000000, not an integer in 1..4096"));
  // Bounded before it is parsed: size and depth.
  CHECK_THAT(stopFromRecord(std::string(9u << 20, ' '), "k").status().message(),
             Catch::Contains("over the bound"));
  CHECK_THAT(stopFromRecord(std::string(100000, '['), "k").status().message(),
             Catch::Contains("nested more than 64 levels"));
}
