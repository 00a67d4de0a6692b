// DistributedSampler: which samples each rank trains on in an epoch, with the semantics of
// torch.utils.data.DistributedSampler (shuffle=True, drop_last=False):
//   - every epoch the indices 0..n-1 are permuted from (seed, epoch) alone, so every rank
//     computes the same permutation without talking to the others, and each epoch differs;
//   - the list is padded by repeating its first items up to a multiple of world_size;
//   - rank r takes items r, r + world_size, r + 2 * world_size, ... (interleaved shards).
// So the ranks' shards are disjoint apart from the padding, equally long, and together cover
// every sample. (The permutation is cpprun's own, std::mt19937_64-based, not torch's randperm.)
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <vector>

namespace cpprun::mnist {

// REQUIRES: n > 0, world_size > 0, 0 <= rank < world_size.
std::vector<int> distributedShard(int n, int world_size, int rank, uint64_t seed, int epoch);

// Samples per rank per epoch: ceil(n / world_size).
int shardSize(int n, int world_size);

}  // namespace cpprun::mnist
