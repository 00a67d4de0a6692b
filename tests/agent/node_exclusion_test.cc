// The pure parts of health checks and exclusion: the exclusion decision and its history, the
// decision record with an excluded node, and the built-in network check.
#include "agent/coordination/node_exclusion.h"

#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>

#include "agent/coordination/job_keys.h"
#include "launcher/cli.h"
#include "launcher/node_health.h"

namespace {

using namespace cpprun::agent;
using std::chrono::seconds;

Membership threeNodes() {
  Membership m;
  m.group_world_size = 3;
  for (int r = 0; r < 3; ++r) {
    AgentInfo a;
    a.host = "n" + std::to_string(r);
    a.id = "id" + std::to_string(r);
    a.nproc = 1;
    m.agents.push_back(a);
  }
  return m;
}

ExclusionInput culprit(int failures) {
  ExclusionInput in;
  in.culprit_rank = 2;
  in.failures = failures;
  in.survivors = 3;
  in.elastic = true;
  in.min_nodes = 2;
  return in;
}

}  // namespace

TEST_CASE("exclusion history: the decider keeps the window's newest records of each node",
          "[unit][exclusion]") {
  const int64_t now = 10'000'000;
  std::vector<NodeFailureRecord> history;
  history.push_back({"old", "h0", now - 61'000});  // outside the 60 s window
  for (int i = 0; i < 10; ++i) {
    history.push_back({"a", "ha", now - 50'000 + i});
    history.push_back({"b", "hb", now - 40'000 + i});
  }
  history.push_back({"ahead", "hc", now + 5'000});  // another decider's clock: kept
  const auto kept = trimFailureHistory(history, seconds(60), now, 3);
  REQUIRE(kept.size() == 7);
  CHECK(kept[0].agent_id == "a");
  CHECK(kept[0].unix_ms == now - 50'000 + 7);  // a's newest three, in order
  CHECK(kept[5].agent_id == "b");
  CHECK(kept[5].unix_ms == now - 40'000 + 9);
  CHECK(kept[6].agent_id == "ahead");
  // Whatever the trim, the exclusion comes out the same for --exclude-after <= per_agent.
  for (const std::string id : {"a", "b", "old"}) {
    CHECK(std::min(failuresWithin(history, id, seconds(60), now), 3) ==
          failuresWithin(kept, id, seconds(60), now));
  }
  // The encoded history decodes to the same records.
  const auto again = decodeFailureHistory(encodeFailureHistory(kept));
  REQUIRE(again.size() == kept.size());
  CHECK(again[3].agent_id == "b");
  CHECK(again[3].host == "hb");
  CHECK(trimFailureHistory(kept, seconds(60), now, 3).size() == kept.size());
}

TEST_CASE("the failure history round-trips and skips malformed lines", "[unit][exclusion]") {
  std::string h = encodeFailureRecord({"id2", "n2", 1000}) + "garbage\n\tx\ty\n12x\ta\tb\n" +
                  encodeFailureRecord({"id1", "n1", 2000});
  const auto records = decodeFailureHistory(h);
  REQUIRE(records.size() == 2);
  CHECK(records[0].agent_id == "id2");
  CHECK(records[0].host == "n2");
  CHECK(records[0].unix_ms == 1000);
  CHECK(records[1].agent_id == "id1");
}

TEST_CASE("failures count per agent within the window only", "[unit][exclusion]") {
  const std::vector<NodeFailureRecord> h = {
      {"a", "n", 1'000}, {"a", "n", 50'000}, {"b", "n", 55'000}, {"a", "n", 60'000}};
  CHECK(failuresWithin(h, "a", seconds(100), 60'000) == 3);
  CHECK(failuresWithin(h, "a", seconds(15), 60'000) == 2);  // 1 s is outside (45 s..60 s]
  CHECK(failuresWithin(h, "b", seconds(100), 60'000) == 1);
  CHECK(failuresWithin(h, "c", seconds(100), 60'000) == 0);
}

TEST_CASE("a node is excluded at K failures, and only when the job can go on without it",
          "[unit][exclusion]") {
  const ExclusionPolicy policy{2, seconds(60)};
  CHECK_FALSE(shouldExclude(policy, culprit(1)));
  CHECK(shouldExclude(policy, culprit(2)));
  CHECK(shouldExclude(policy, culprit(5)));
  CHECK(exclusionBlocked(policy, culprit(1)).empty());  // below K: nothing to block

  ExclusionInput at_min = culprit(2);
  at_min.survivors = 2;
  CHECK_FALSE(shouldExclude(policy, at_min));
  CHECK_THAT(exclusionBlocked(policy, at_min), Catch::Contains("fewer than the minimum 2"));
  // A hot spare waiting takes the culprit's place: the job keeps its minimum.
  ExclusionInput with_spare = at_min;
  with_spare.waiting = 1;
  CHECK(shouldExclude(policy, with_spare));

  ExclusionInput static_job = culprit(2);
  static_job.elastic = false;
  CHECK_FALSE(shouldExclude(policy, static_job));
  CHECK_THAT(exclusionBlocked(policy, static_job), Catch::Contains("static"));

  ExclusionInput store_host = culprit(2);
  store_host.culprit_may_leave = false;
  CHECK_FALSE(shouldExclude(policy, store_host));
  CHECK_THAT(exclusionBlocked(policy, store_host), Catch::Contains("store"));

  CHECK_FALSE(shouldExclude({0, seconds(60)}, culprit(100)));  // off
}

TEST_CASE("an exclusion re-forms the group without using the budget and names the node",
          "[unit][exclusion]") {
  JobDecision d;
  d.kind = JobDecision::Kind::kFailed;  // the budget was spent
  d.restarts_used = 1;
  d.summary = "node 2 (n2): worker 2 exited with code 1";
  applyExclusion(threeNodes(), {2, seconds(60)}, culprit(2), /*restarts_before=*/1, d);
  CHECK(d.kind == JobDecision::Kind::kRestart);
  CHECK(d.membership_change);
  CHECK(d.restarts_used == 1);
  REQUIRE(d.excluded);
  CHECK(d.excluded->rank == 2);
  CHECK(d.excluded->host == "n2");
  CHECK(d.excluded->agent_id == "id2");
  CHECK_THAT(d.summary, Catch::Contains("node 2 (n2) is excluded") &&
                            Catch::Contains("caused 2 failures within 60 s") &&
                            Catch::Contains("worker 2 exited with code 1"));

  JobDecision untouched;
  untouched.kind = JobDecision::Kind::kRestart;
  untouched.restarts_used = 1;
  applyExclusion(threeNodes(), {2, seconds(60)}, culprit(1), 0, untouched);
  CHECK_FALSE(untouched.excluded);
  CHECK(untouched.restarts_used == 1);
  CHECK_FALSE(untouched.membership_change);
}

TEST_CASE("the decision record carries the excluded node", "[unit][exclusion]") {
  JobDecision d;
  d.kind = JobDecision::Kind::kRestart;
  d.excluded = ExcludedNode{2, "n2", "id2", "why"};
  auto back = decisionFromJson(decisionToJson(d, 3), 3);
  REQUIRE(back.isOk());
  REQUIRE(back.value().decision.excluded);
  CHECK(back.value().decision.excluded->agent_id == "id2");
  CHECK(back.value().decision.excluded->reason == "why");
  d.excluded.reset();
  auto none = decisionFromJson(decisionToJson(d, 3), 3);
  REQUIRE(none.isOk());
  CHECK_FALSE(none.value().decision.excluded);
}

TEST_CASE("the built-in network check: the NCCL interface and GLOO_SOCKET_IFNAME must be up",
          "[unit][health]") {
  using cpprun::launcher::checkNodeNetwork;
  using cpprun::launcher::NetworkInterface;
  std::vector<NetworkInterface> ifaces = {{"lo", "127.0.0.1", false, true, true},
                                          {"eth0", "10.0.0.1", false, true, false},
                                          {"ib0", "10.1.0.1", false, false, false}};
  // CPU job, nothing named: nothing to check.
  CHECK(checkNodeNetwork(ifaces, {}, false).empty());
  // GPUs: NCCL prefers ib*, which is down.
  auto problems = checkNodeNetwork(ifaces, {}, true);
  REQUIRE(problems.size() == 1);
  CHECK_THAT(problems[0], Catch::Contains("ib0") && Catch::Contains("down"));
  CHECK(checkNodeNetwork(ifaces, {{"NCCL_SOCKET_IFNAME", "eth0"}}, true).empty());
  problems = checkNodeNetwork(ifaces, {{"GLOO_SOCKET_IFNAME", "eth0,eth9,ib0"}}, false);
  REQUIRE(problems.size() == 2);
  CHECK_THAT(problems[0], Catch::Contains("eth9") && Catch::Contains("does not have"));
  CHECK_THAT(problems[1], Catch::Contains("ib0") && Catch::Contains("down"));
}

TEST_CASE("the built-in directory check makes a missing directory and finds a read-only one",
          "[unit][health]") {
  using cpprun::launcher::checkWritableDirectory;
  char tmpl[] = "/tmp/cpprun-health-XXXXXX";
  const std::string base = ::mkdtemp(tmpl);
  CHECK(checkWritableDirectory(base + "/a/b").empty());
  CHECK(checkWritableDirectory("/proc/1").find("not writable") != std::string::npos);
  std::filesystem::remove_all(base);
}

TEST_CASE("cli: health check and exclusion options, their defaults and bad values", "[unit]") {
  using cpprun::launcher::parseCommandLine;
  auto parse = [](const std::vector<std::string>& args) { return parseCommandLine(args, {}); };
  auto off = parse({"t.py"});
  REQUIRE(off.isOk());
  const auto& d = off.value().config;
  CHECK(d.health_check.empty());
  CHECK(d.health_check_timeout == 60);
  CHECK(d.health_check_dirs.empty());
  CHECK(d.builtin_health_checks);
  CHECK(d.exclude_after == 3);
  CHECK(d.exclude_window == 3600);
  auto set = parse({"--health-check=nvidia-smi -q", "--health-check-timeout=2.5",
                    "--health-check-dirs=/ckpt, /data", "--builtin-health-checks=off",
                    "--exclude-after=0", "--exclude-window=60", "t.py"});
  REQUIRE(set.isOk());
  const auto& c = set.value().config;
  CHECK(c.health_check == "nvidia-smi -q");
  CHECK(c.health_check_timeout == 2.5);
  CHECK(c.health_check_dirs == std::vector<std::string>{"/ckpt", "/data"});
  CHECK_FALSE(c.builtin_health_checks);
  CHECK(c.exclude_after == 0);
  CHECK(c.exclude_window == 60);
  for (const std::vector<std::string>& bad :
       {std::vector<std::string>{"--health-check-timeout=0", "t.py"},
        {"--health-check-dirs=/a,,/b", "t.py"},
        {"--builtin-health-checks=yes", "t.py"},
        {"--exclude-after=-1", "t.py"},
        {"--exclude-window=0.5", "t.py"}}) {
    INFO(bad[0]);
    auto r = parse(bad);
    REQUIRE_FALSE(r.isOk());
    CHECK_THAT(r.status().message(), Catch::Contains(bad[0].substr(0, bad[0].find('='))));
  }
}
