// Job keys (job_keys.h): every key builder's exact output (the wire's key names: a change here
// is a protocol change, and docs/rendezvous.md lists the same keys), the round's members
// document and the codec of an elastic round's per-slot assignments and its closed mark, pure
// functions on values.
#include "agent/coordination/job_keys.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace {

using namespace cpprun;
using namespace cpprun::agent;
using nlohmann::json;

// A members document as the closer publishes it: records in rank order, each with its slot.
json membersDoc(int attempt, int round, const std::vector<AgentInfo>& agents,
                const std::vector<int64_t>& slots) {
  json doc = {{"attempt", attempt}, {"round", round}, {"members", json::array()}};
  for (size_t i = 0; i < agents.size(); ++i) {
    json m = agentRecord(agents[i], -1);
    m["index"] = slots[i];
    doc["members"].push_back(m);
  }
  return doc;
}

RoundAssignment decoded(const std::string& text) {
  Result<RoundAssignment> a = assignmentFromJson(json::parse(text), "the test's assignment");
  REQUIRE(a.isOk());
  return a.value();
}

}  // namespace

TEST_CASE("job keys: a round's assignments give each member its rank, base rank and sizes",
          "[unit]") {
  // Heterogeneous nproc, members in rank order but slots in join order; slot 2 is a spare the
  // round did not take, slot 5 is counted but empty.
  const std::vector<AgentInfo> agents = {{"n0", 4, "id-0", -1, "n0:1234"},
                                         {"n1", 1, "id-1", -1, "n1:1234"},
                                         {"n2", 2, "id-2", -1, "n2:1234"}};
  const json doc = membersDoc(7, 3, agents, {4, 1, 3});
  const std::vector<std::string> values = roundAssignments(doc, 3, 5);
  REQUIRE(values.size() == 5);
  struct Want {
    int64_t slot;
    int rank;
    int base_rank;
  };
  for (const Want& want : {Want{4, 0, 0}, Want{1, 1, 4}, Want{3, 2, 5}}) {
    const RoundAssignment a = decoded(values[static_cast<size_t>(want.slot - 1)]);
    REQUIRE(a.kind == RoundAssignment::Kind::kMember);
    CHECK(a.attempt == 7);
    CHECK(a.membership.round == 3);
    CHECK(a.membership.group_rank == want.rank);
    CHECK(a.membership.group_world_size == 3);
    CHECK(a.membership.base_rank == want.base_rank);
    CHECK(a.membership.world_size == 7);
    CHECK(a.membership.node0_store_endpoint == "n0:1234");  // node 0's store: MASTER_ADDR
    CHECK(a.membership.agents.empty());
    CHECK(a.membership.members_digest == membersDigest(agents));  // the liveness snapshot's name
    // The same numbers as the whole document gives (membershipOf).
    const Membership full = membershipOf(agents, want.rank);
    CHECK(full.base_rank == a.membership.base_rank);
    CHECK(full.world_size == a.membership.world_size);
  }
  for (int64_t slot : {2, 5}) {
    CHECK(decoded(values[static_cast<size_t>(slot - 1)]).kind == RoundAssignment::Kind::kNotMember);
  }
  // A slot past the ones the closer counted: the closed mark says how many it counted.
  CHECK(json::parse(closedMarker(doc, 5)) == json({{"slots", 5}}));
}

TEST_CASE("job keys: a round's error or the end of the job is every slot's assignment", "[unit]") {
  const json error = {{"error", "rendezvous: only 1 of at least 2 nodes joined within 5 s"}};
  for (const std::string& v : roundAssignments(error, 0, 3)) {
    const RoundAssignment a = decoded(v);
    CHECK(a.kind == RoundAssignment::Kind::kError);
    CHECK(a.message == error["error"]);
  }
  const json over = {{"job_over", "succeeded"}};
  const std::vector<std::string> values = roundAssignments(over, 4, 2);
  REQUIRE(values.size() == 2);
  CHECK(decoded(values[1]).kind == RoundAssignment::Kind::kJobOver);
  CHECK(decoded(values[1]).message == "succeeded");
  // The closed mark carries it, for a slot taken after the closer counted the slots.
  const json marker = json::parse(closedMarker(over, 2));
  CHECK(marker["slots"] == 2);
  CHECK(decoded(roundAssignments(marker, 4, 1).front()).kind == RoundAssignment::Kind::kJobOver);
  CHECK(
      decoded(roundAssignments(json::parse(closedMarker(json::object(), 2)), 4, 1).front()).kind ==
      RoundAssignment::Kind::kNotMember);
}

TEST_CASE("job keys: an assignment is the same size whatever the number of members", "[unit]") {
  const auto largest = [](int n) {
    std::vector<AgentInfo> agents;
    std::vector<int64_t> slots;
    for (int i = 0; i < n; ++i) {
      agents.push_back({"node-" + std::to_string(i), 8, "agent-" + std::to_string(i), -1});
      slots.push_back(i + 1);
    }
    size_t most = 0;
    for (const std::string& v : roundAssignments(membersDoc(0, 0, agents, slots), 0, n)) {
      most = std::max(most, v.size());
    }
    return most;
  };
  const size_t at_10 = largest(10);
  const size_t at_10000 = largest(10000);
  CHECK(at_10 < 160);
  CHECK(at_10000 <= at_10 + 12);  // the numbers' digits only
}

TEST_CASE("job keys: a malformed assignment is an error naming it, not an exception", "[unit]") {
  for (const json& bad : {json("text"), json::object(), json({{"kind", "member"}}),
                          json({{"kind", "error"}}), json({{"kind", "whatever"}}),
                          json({{"kind", "member"},
                                {"attempt", 0},
                                {"round", 0},
                                {"rank", 3},
                                {"nodes", 2},
                                {"base_rank", 0},
                                {"world_size", 4}})}) {
    Result<RoundAssignment> a = assignmentFromJson(bad, "round 2's assignment of this node");
    REQUIRE_FALSE(a.isOk());
    CHECK_THAT(a.status().message(), Catch::Contains("round 2's assignment of this node"));
  }
  Result<RoundMembers> m = roundMembersFromJson(json({{"members", {json({{"host", "x"}})}}}), 5);
  REQUIRE_FALSE(m.isOk());
  CHECK_THAT(m.status().message(), Catch::Contains("round 5"));
}

TEST_CASE("job keys: every builder spells its key as the store has always held it", "[unit]") {
  CHECK(storedRunId("") == "none");
  CHECK(storedRunId("job-a") == "job-a");
  CHECK(jobNamespace("") == "cpprun/none");
  CHECK(jobNamespace("job-a") == "cpprun/job-a");
  CHECK(namespacedKey("job-a", "rdzv/round") == "cpprun/job-a/rdzv/round");
  CHECK(namespacedKey("", kAliveKeyPrefix) == "cpprun/none/alive/");
  CHECK(std::string(kServedRunIdKey) == "cpprun/served_run_id");
  // The static join.
  CHECK(nodeKey(0) == "rdzv/node/0");
  CHECK(nodeKey(12345) == "rdzv/node/12345");
  CHECK(std::string(kStaticJoinedKey) == "rdzv/joined");
  CHECK(std::string(kStaticCompleteKey) == "rdzv/complete");
  // Elastic rounds.
  CHECK(std::string(kRoundCounterKey) == "rdzv/round");
  CHECK(roundJoinedKey(0) == "rdzv/round/0/joined");
  CHECK(roundAgentKey(3, 1) == "rdzv/round/3/agent/1");
  CHECK(roundAgentKey(3, int64_t{100000}) == "rdzv/round/3/agent/100000");
  CHECK(roundMembersKey(7) == "rdzv/round/7/members");
  CHECK(roundAssignedKey(7, 2) == "rdzv/round/7/assigned/2");
  CHECK(roundClosedKey(7) == "rdzv/round/7/closed");
  // Liveness.
  CHECK(heartbeatKey("h1-42-abc") == "heartbeat/h1-42-abc");
  CHECK(std::string(kAliveKeyPrefix) == "alive/");
  CHECK(aliveKey("h1-42-abc") == "alive/h1-42-abc");
  CHECK(aliveSnapshotKey("/cpprun/job-a/alive/", 4, "00ff") ==
        "/cpprun/job-a/alive.snapshot/4/00ff");
  CHECK(aliveSnapshotKey("alive", 4, "00ff") == "alive.snapshot/4/00ff");
  // One attempt.
  CHECK(attemptReadyKey(2, 5) == "attempt/2/ready/5");
  CHECK(attemptGoKey(2) == "attempt/2/go");
  CHECK(attemptNcclIdsPrefix(2) == "attempt/2/nccl_ids/");
  CHECK(attemptStopKey(2) == "attempt/2/stop");
  CHECK(attemptStopAcksKey(2) == "attempt/2/stop_acks");
  CHECK(attemptReportKey(2, 5) == "attempt/2/report/5");
  CHECK(attemptDecisionKey(2) == "attempt/2/decision");
  CHECK(attemptDoneKey(2) == "attempt/2/done");
  CHECK(attemptAllDoneKey(2) == "attempt/2/all_done");
  CHECK(attemptSparesDoneKey(2) == "attempt/2/spares_done");
  CHECK(attemptSparesAllDoneKey(2) == "attempt/2/spares_all_done");
  // Across attempts.
  CHECK(std::string(kExclusionHistoryKey) == "exclusion/failures");
}

TEST_CASE("job keys: a members document is the bytes the closer has always written", "[unit]") {
  const std::vector<RoundMember> members = {{{"n0", 4, "id-0", 1, "n0:29500"}, 0, 3},
                                            {{"n1", 1, "id-1", -1}, -1, 1}};
  const json doc = roundMembersToJson(5, 2, members);
  CHECK(doc.dump() ==
        R"({"attempt":5,"members":[{"host":"n0","id":"id-0","index":3,"nproc":4,)"
        R"("previous_rank":0,"scheduler_rank":1,"store":"n0:29500"},{"host":"n1","id":"id-1",)"
        R"("index":1,"nproc":1,"previous_rank":-1,"scheduler_rank":-1}],"round":2})");
  CHECK(roundErrorToJson("why").dump() == R"({"error":"why"})");
  CHECK(roundJobOverToJson("succeeded").dump() == R"({"job_over":"succeeded"})");
}

TEST_CASE("job keys: a members document round-trips, nproc mixed", "[unit]") {
  const std::vector<RoundMember> members = {{{"a", 8, "id-a", -1, "a:1"}, 2, 4},
                                            {{"b", 1, "id-b", 0}, -1, 2},
                                            {{"c", 3, "id-c", -1}, 1, 1}};
  const json doc = roundMembersToJson(9, 4, members);
  Result<RoundDocument> back = roundDocumentFromJson(json::parse(doc.dump()), 4);
  REQUIRE(back.isOk());
  REQUIRE(back.value().kind == RoundDocument::Kind::kMembers);
  const RoundMembers& rm = back.value().members;
  CHECK(rm.attempt == 9);
  REQUIRE(rm.agents.size() == 3);
  CHECK(rm.slots == std::vector<int64_t>{4, 2, 1});
  for (size_t i = 0; i < members.size(); ++i) {
    CHECK(rm.agents[i].host == members[i].agent.host);
    CHECK(rm.agents[i].nproc == members[i].agent.nproc);
    CHECK(rm.agents[i].id == members[i].agent.id);
    CHECK(rm.agents[i].scheduler_rank == members[i].agent.scheduler_rank);
    CHECK(rm.agents[i].store_endpoint == members[i].agent.store_endpoint);
  }
  // The mixed nproc gives each member its base rank: 0, 8, 9 of 12.
  const Membership m = membershipOf(rm.agents, 2);
  CHECK(m.base_rank == 9);
  CHECK(m.world_size == 12);
  // Each record in the document reads back as the member it came from, slot and previous rank
  // included.
  for (size_t i = 0; i < members.size(); ++i) {
    Result<RoundMember> one =
        roundMemberFromRecord(doc["members"][i], members[i].slot, "member " + std::to_string(i));
    REQUIRE(one.isOk());
    CHECK(one.value().previous_rank == members[i].previous_rank);
    CHECK(one.value().slot == members[i].slot);
    CHECK(one.value().agent.id == members[i].agent.id);
  }
  // An error, the end of the job.
  Result<RoundDocument> error = roundDocumentFromJson(roundErrorToJson("too few"), 4);
  REQUIRE(error.isOk());
  CHECK(error.value().kind == RoundDocument::Kind::kError);
  CHECK(error.value().message == "too few");
  Result<RoundDocument> over = roundDocumentFromJson(roundJobOverToJson("stopped"), 4);
  REQUIRE(over.isOk());
  CHECK(over.value().kind == RoundDocument::Kind::kJobOver);
  CHECK(over.value().message == "stopped");
}

TEST_CASE("job keys: a malformed members document is an error naming its round", "[unit]") {
  for (const json& bad :
       {json("text"), json(nullptr), json::object(), json({{"members", "x"}}), json({{"error", 3}}),
        json({{"job_over", json::array()}}),
        json({{"attempt", 0}, {"members", {json({{"host", "x"}, {"nproc", "2"}})}}}),
        json({{"attempt", 0}, {"members", {json("not a record")}}})}) {
    Result<RoundDocument> doc = roundDocumentFromJson(bad, 6);
    REQUIRE_FALSE(doc.isOk());
    CHECK(doc.status().code() == StatusCode::kInternal);
    CHECK_THAT(doc.status().message(), Catch::Contains("round 6"));
  }
  Result<RoundMember> record = roundMemberFromRecord(json({{"host", "x"}}), 3, "slot 3's record");
  REQUIRE_FALSE(record.isOk());
  CHECK_THAT(record.status().message(), Catch::Contains("slot 3's record"));
}
