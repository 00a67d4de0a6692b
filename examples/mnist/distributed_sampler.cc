#include "examples/mnist/distributed_sampler.h"

#include <numeric>
#include <random>

#include "common/check.h"

namespace cpprun::mnist {

int shardSize(int n, int world_size) { return (n + world_size - 1) / world_size; }

std::vector<int> distributedShard(int n, int world_size, int rank, uint64_t seed, int epoch) {
  CPPRUN_CHECK(n > 0 && world_size > 0 && rank >= 0 && rank < world_size);
  std::vector<int> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  // Fisher-Yates with our own draws: std::shuffle's use of the engine is unspecified, and every
  // rank (and every build) must agree on the permutation.
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(epoch));
  for (size_t i = order.size() - 1; i > 0; --i) {
    const size_t j = static_cast<size_t>(rng() % (i + 1));
    std::swap(order[i], order[j]);
  }
  const size_t total = static_cast<size_t>(shardSize(n, world_size)) * world_size;
  for (size_t i = 0; order.size() < total; ++i) order.push_back(order[i]);
  std::vector<int> shard;
  shard.reserve(total / static_cast<size_t>(world_size));
  for (size_t i = static_cast<size_t>(rank); i < total; i += static_cast<size_t>(world_size)) {
    shard.push_back(order[i]);
  }
  return shard;
}

}  // namespace cpprun::mnist
