#include "examples/mnist/distributed_sampler.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <set>

using cpprun::mnist::distributedShard;
using cpprun::mnist::shardSize;

TEST_CASE("shards are equal, disjoint but for the padding, and cover every sample",
          "[unit][mnist]") {
  for (int n : {1, 7, 10, 7996}) {
    for (int world : {1, 2, 3, 4}) {
      INFO("n " << n << " world " << world);
      std::multiset<int> all;
      for (int r = 0; r < world; ++r) {
        std::vector<int> shard = distributedShard(n, world, r, 42, 3);
        CHECK(static_cast<int>(shard.size()) == shardSize(n, world));
        all.insert(shard.begin(), shard.end());
      }
      std::set<int> distinct(all.begin(), all.end());
      CHECK(static_cast<int>(distinct.size()) == n);  // every sample somewhere
      CHECK(*distinct.begin() == 0);
      CHECK(*distinct.rbegin() == n - 1);
      // Only the padding repeats: exactly shardSize * world - n extra entries.
      CHECK(static_cast<int>(all.size()) - n == shardSize(n, world) * world - n);
    }
  }
}

TEST_CASE("the permutation depends on seed and epoch only, and changes every epoch",
          "[unit][mnist]") {
  CHECK(distributedShard(1000, 2, 1, 7, 0) == distributedShard(1000, 2, 1, 7, 0));
  CHECK(distributedShard(1000, 2, 1, 7, 0) != distributedShard(1000, 2, 1, 7, 1));
  CHECK(distributedShard(1000, 2, 1, 7, 0) != distributedShard(1000, 2, 1, 8, 0));
  // World size 1 sees the whole epoch's permutation; world size 2 interleaves it.
  std::vector<int> whole = distributedShard(10, 1, 0, 5, 2);
  std::vector<int> r0 = distributedShard(10, 2, 0, 5, 2);
  std::vector<int> r1 = distributedShard(10, 2, 1, 5, 2);
  for (size_t i = 0; i < 5; ++i) {
    CHECK(r0[i] == whole[2 * i]);
    CHECK(r1[i] == whole[2 * i + 1]);
  }
}
