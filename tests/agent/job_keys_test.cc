// Job keys (job_keys.h): the codec of an elastic round's per-slot assignments and its closed
// mark, pure functions on values.
#include "agent/job_keys.h"

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
