// The scalable NCCL ids (agent/nccl/nccl_id_groups.h): how many, which node makes each (against
// NCCL's own rankHasRoot rule, copied from its documentation of ncclCommInitRankScalable), the
// list's text form, and the multi-node exchange through one store, several nodes at once.
#include "agent/nccl/nccl_id_groups.h"

#include <catch2/catch.hpp>
#include <future>
#include <set>
#include <string>
#include <vector>

#include "rendezvous/memory_store.h"

using namespace cpprun::agent;
using cpprun::Result;
using namespace std::chrono_literals;

namespace {

// NCCL's documented rule (docs: ncclCommInitRankScalable): whether `rank` creates an id.
bool rankHasRoot(int rank, int nranks, int nids) {
  const int rmr = nranks % nids;
  const int rpr = nranks / nids;
  const int rlim = rmr * (rpr + 1);
  if (rank < rlim) return rank % (rpr + 1) == 0;
  return (rank - rlim) % rpr == 0;
}

// A fake id, 256 hex digits, distinct per (node, call).
std::string fakeId(int node, int call) {
  std::string text = "node " + std::to_string(node) + " call " + std::to_string(call);
  text.resize(128, '\0');
  static const char* digits = "0123456789abcdef";
  std::string hex;
  for (unsigned char b : text) {
    hex += digits[b >> 4];
    hex += digits[b & 15];
  }
  return hex;
}

}  // namespace

TEST_CASE("nId: one id up to the threshold, then one per CPPRUN_NCCL_RANKS_PER_ID ranks",
          "[unit]") {
  CHECK(ncclIdCount(1, 256) == 1);
  CHECK(ncclIdCount(256, 256) == 1);
  CHECK(ncclIdCount(257, 256) == 2);
  CHECK(ncclIdCount(1024, 256) == 4);
  CHECK(ncclIdCount(16384, 256) == 64);
  CHECK(ncclIdCount(16385, 256) == 65);
  CHECK(ncclIdCount(100000, 0) == 1);  // 0: off
  CHECK(ncclRanksPerId({}).value() == kDefaultNcclRanksPerId);
  CHECK(ncclRanksPerId({{"CPPRUN_NCCL_RANKS_PER_ID", ""}}).value() == 256);
  CHECK(ncclRanksPerId({{"CPPRUN_NCCL_RANKS_PER_ID", "2"}}).value() == 2);
  CHECK(ncclRanksPerId({{"CPPRUN_NCCL_RANKS_PER_ID", "0"}}).value() == 0);
  for (const char* bad : {"-1", "x", "12x", "99999999999"}) {
    auto r = ncclRanksPerId({{"CPPRUN_NCCL_RANKS_PER_ID", bad}});
    REQUIRE_FALSE(r.isOk());
    CHECK_THAT(r.status().message(),
               Catch::Contains("CPPRUN_NCCL_RANKS_PER_ID=" + std::string(bad)));
  }
}

TEST_CASE("each id's first rank is the rank NCCL's rankHasRoot names", "[unit]") {
  for (int nranks : {1, 2, 7, 100, 257, 1000, 4099}) {
    for (int nids : {1, 2, 3, 7, 16, 64}) {
      if (nids > nranks) continue;
      std::vector<int> roots;
      for (int r = 0; r < nranks; ++r) {
        if (rankHasRoot(r, nranks, nids)) roots.push_back(r);
      }
      INFO(nranks << " ranks, " << nids << " ids");
      REQUIRE(roots.size() == static_cast<size_t>(nids));
      for (int i = 0; i < nids; ++i) CHECK(firstRankOfId(i, nranks, nids) == roots[i]);
    }
  }
}

TEST_CASE("the ids' roots are spread over the nodes that hold their first ranks", "[unit]") {
  // 4 nodes of 8 ranks, 4 ids: one per node.
  CHECK(ncclIdOwners({8, 8, 8, 8}, 4) == std::vector<int>{0, 1, 2, 3});
  // 2048 ranks on 256 nodes of 8, 8 ids (256 ranks each): nodes 0, 32, 64, ...
  const std::vector<int> owners = ncclIdOwners(std::vector<int>(256, 8), 8);
  CHECK(owners == std::vector<int>{0, 32, 64, 96, 128, 160, 192, 224});
  // Uneven nodes: 3 + 5 + 2 = 10 ranks, 3 ids with first ranks 0, 4, 7: nodes 0, 1, 1.
  CHECK(ncclIdOwners({3, 5, 2}, 3) == std::vector<int>{0, 1, 1});
  // A node with no ranks is skipped.
  CHECK(ncclIdOwners({2, 0, 2}, 2) == std::vector<int>{0, 2});
}

TEST_CASE("the id list's text form round-trips and a bad list is named", "[unit]") {
  const std::vector<std::string> ids = {fakeId(0, 0), fakeId(1, 0), fakeId(2, 0)};
  const std::string text = joinNcclIds(ids);
  CHECK(text.size() == 3 * 256 + 2);
  auto back = splitNcclIds(text);
  REQUIRE(back.isOk());
  CHECK(back.value() == ids);
  CHECK_FALSE(splitNcclIds("").isOk());
  auto short_one = splitNcclIds(fakeId(0, 0) + ",abc");
  REQUIRE_FALSE(short_one.isOk());
  CHECK_THAT(short_one.status().message(), Catch::Contains("NCCL id 1 of the list"));
  CHECK_FALSE(splitNcclIds(fakeId(0, 0) + ",").isOk());
}

TEST_CASE("four nodes exchange 8 ids through one store: each makes its own, all read the same",
          "[unit]") {
  cpprun::rendezvous::MemoryStore store;
  const std::vector<int> node_ranks = {512, 512, 512, 512};  // 2048 ranks
  const int nid = ncclIdCount(2048, 256);
  REQUIRE(nid == 8);
  std::vector<std::future<Result<std::vector<std::string>>>> nodes;
  std::vector<int> made(4, 0);
  // Node 3 first, node 0 last: every node waits for the others' ids, none polls.
  for (int node = 3; node >= 0; --node) {
    nodes.push_back(std::async(std::launch::async, [&, node] {
      return exchangeNcclIds(
          store, "attempt/0/nccl_ids/", node_ranks, node, nid,
          [&, node]() -> Result<std::string> { return fakeId(node, made[node]++); }, 10s);
    }));
  }
  std::set<std::vector<std::string>> lists;
  for (auto& n : nodes) {
    auto ids = n.get();
    REQUIRE(ids.isOk());
    lists.insert(ids.value());
  }
  REQUIRE(lists.size() == 1);  // every node has the same ids, in the same order
  const std::vector<std::string> ids = *lists.begin();
  REQUIRE(ids.size() == 8);
  CHECK(made == std::vector<int>{2, 2, 2, 2});  // two roots on each node
  CHECK(ids[0] == fakeId(0, 0));
  CHECK(ids[1] == fakeId(0, 1));
  CHECK(ids[2] == fakeId(1, 0));
  CHECK(ids[7] == fakeId(3, 1));
}

TEST_CASE("an id that a node fails to make is named, and missing ids end in a bounded wait",
          "[unit]") {
  cpprun::rendezvous::MemoryStore store;
  auto failed = exchangeNcclIds(
      store, "p/", {4, 4}, 0, 2,
      []() -> Result<std::string> { return cpprun::unavailable("ncclGetUniqueId failed with 2"); },
      1s);
  REQUIRE_FALSE(failed.isOk());
  CHECK_THAT(failed.status().message(), Catch::Contains("NCCL id 0 of 2"));
  // Node 1 alone: node 0's id never comes.
  auto alone = exchangeNcclIds(
      store, "q/", {4, 4}, 1, 2, []() -> Result<std::string> { return fakeId(1, 0); }, 100ms);
  REQUIRE_FALSE(alone.isOk());
  CHECK(alone.status().code() == cpprun::StatusCode::kTimeout);
}

TEST_CASE("a node's failure to make its id reaches every node as the same error", "[unit]") {
  cpprun::rendezvous::MemoryStore store;
  auto node1 = std::async(std::launch::async, [&] {
    return exchangeNcclIds(
        store, "r/", {4, 4}, 1, 2,
        []() -> Result<std::string> { return cpprun::unavailable("no libnccl.so.2"); }, 10s);
  });
  auto node0 = exchangeNcclIds(
      store, "r/", {4, 4}, 0, 2, []() -> Result<std::string> { return fakeId(0, 0); }, 10s);
  auto one = node1.get();
  REQUIRE_FALSE(node0.isOk());
  REQUIRE_FALSE(one.isOk());
  CHECK(node0.status().message() == one.status().message());
  CHECK_THAT(node0.status().message(),
             Catch::Contains("NCCL id 1 of 2 (made by node 1): no libnccl.so.2"));
}

TEST_CASE("the caller's wait replaces the store's, and what it returns passes through", "[unit]") {
  cpprun::rendezvous::MemoryStore store;
  std::vector<std::string> waited_for;
  auto ids = exchangeNcclIds(
      store, "w/", {2, 2}, 0, 2, []() -> Result<std::string> { return fakeId(0, 0); }, 1s,
      [&](const std::vector<std::string>& keys) {
        waited_for = keys;
        store.set("w/1", cpprun::rendezvous::toBytes(fakeId(1, 0)));  // node 1 "arrives"
        return cpprun::Status::ok();
      });
  REQUIRE(ids.isOk());
  CHECK(waited_for == std::vector<std::string>{"w/0", "w/1"});
  CHECK(ids.value() == std::vector<std::string>{fakeId(0, 0), fakeId(1, 0)});
  auto lost = exchangeNcclIds(
      store, "x/", {2, 2}, 0, 2, []() -> Result<std::string> { return fakeId(0, 0); }, 1s,
      [](const std::vector<std::string>&) { return cpprun::unavailable("node 1 was lost"); });
  REQUIRE_FALSE(lost.isOk());
  CHECK(lost.status().code() == cpprun::StatusCode::kUnavailable);
  CHECK(lost.status().message() == "node 1 was lost");
}
