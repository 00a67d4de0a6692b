// NCCL bootstrap at scale: how many ncclUniqueIds a job's communicator gets, which node makes
// each one, and how they travel (CPPRUN_NCCL_UNIQUE_IDS, store key cpprun/nccl_unique_ids;
// docs/environment.md).
//
// ncclCommInitRankScalable (NCCL >= 2.23) takes nId ids; NCCL spreads the ranks over them in
// contiguous blocks (the first nranks % nId ids get one rank more) and every rank talks to the
// bootstrap root of its block's id. Each root runs inside the process that called
// ncclGetUniqueId, so the id of a block is made by the agent of the node that holds the block's
// first rank: the roots are spread over the nodes as the ranks are, none is far from its ranks.
//
// The count: one id per kDefaultNcclRanksPerId (256) ranks, the number of connections NCCL's
// root takes at once before it staggers them (NCCL_UID_STAGGER_THRESHOLD, default 256, at
// NCCL_UID_STAGGER_RATE = 7000 per second): with at most 256 ranks per root no rank waits for
// the stagger. A job of at most that many ranks keeps the single id (nothing changes).
// CPPRUN_NCCL_RANKS_PER_ID changes it; 0 turns the scalable ids off.
//
// Thread safety: free functions, pure except exchangeNcclIds (which uses the given Store as its
// own thread safety allows).
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"

namespace cpprun::rendezvous {
class Store;
}

namespace cpprun::agent {

inline constexpr int kDefaultNcclRanksPerId = 256;
inline constexpr const char* kNcclRanksPerIdVariable = "CPPRUN_NCCL_RANKS_PER_ID";
inline constexpr const char* kNcclUniqueIdsVariable = "CPPRUN_NCCL_UNIQUE_IDS";
// The workers' store: the comma-joined ids, beside cpprun/nccl_unique_id.
inline constexpr const char* kNcclUniqueIdsKey = "cpprun/nccl_unique_ids";

// $CPPRUN_NCCL_RANKS_PER_ID as a number of ranks (>= 0; 0: off), kDefaultNcclRanksPerId when
// unset or empty; kInvalidArgument naming the variable and value otherwise.
Result<int> ncclRanksPerId(const std::map<std::string, std::string>& env);

// nId for a communicator of `world_size` ranks: ceil(world_size / ranks_per_id) when
// world_size > ranks_per_id > 0, else 1 (the single id: ncclCommInitRank).
int ncclIdCount(int world_size, int ranks_per_id);

// The first rank of id `id`'s block as NCCL assigns ranks to ids (its rankHasRoot rule).
// REQUIRES: 0 <= id < nid <= nranks.
int firstRankOfId(int id, int nranks, int nid);

// For each of the nid ids, the node (index into `node_ranks`: ranks on each node, in group
// rank order, a node's ranks following the previous node's) that holds its block's first rank,
// so makes it. REQUIRES: nid <= the sum of node_ranks.
std::vector<int> ncclIdOwners(const std::vector<int>& node_ranks, int nid);

// "id0,id1,..." and back. splitNcclIds refuses (kInvalidArgument) an empty list or an id that is
// not 256 hex digits, naming its position.
std::string joinNcclIds(const std::vector<std::string>& ids);
Result<std::vector<std::string>> splitNcclIds(const std::string& text);

// Multi-node: node `node` makes the ids it owns (ncclIdOwners) with `make_id`, sets each under
// "<prefix><i>" in `store`, then waits (at most `timeout`) for all nid keys and returns the ids in
// order; every node calls it with the same prefix, nid and node_ranks, so all get the same list.
// A node whose make_id fails stores "!<why>" in place of the id, so every node returns the same
// error naming that id and node; the keys still missing after `timeout`: kTimeout. `wait`, when
// given, waits for the keys instead of store.wait(keys, timeout) (the agent's coordinator waits
// in slices and watches the other agents' liveness); a Status it returns that is not OK is
// returned as it is. May throw the store's exceptions (other than its timeout).
using WaitForKeys = std::function<Status(const std::vector<std::string>& keys)>;
Result<std::vector<std::string>> exchangeNcclIds(
    rendezvous::Store& store, const std::string& prefix, const std::vector<int>& node_ranks,
    int node, int nid, const std::function<Result<std::string>()>& make_id,
    std::chrono::milliseconds timeout, const WaitForKeys& wait = {});

}  // namespace cpprun::agent
