// Checkpoint: what a restarted rank needs to continue training where the job left off — the
// model's parameters, the optimizer's buffers and step count, and how many epochs are done.
//
// File format (little-endian): "CPRNCKPT", u32 version (1), u32 header length, a JSON header
// (model, optimizer, parameter_count, buffers, optimizer_steps, epochs_done, seed, world_size),
// the parameters as f32, each optimizer buffer as f32, and a CRC-32 of everything before it.
// save() writes a temporary file in the same directory, fsyncs it, renames it over the target
// and fsyncs the directory, so a reader sees the old checkpoint or the new one, never half of
// one. load() checks magic, version, sizes and CRC and names the file and the fault.
// Thread safety: pure functions over files.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace cpprun::mnist {

struct Checkpoint {
  std::string model;
  std::string optimizer;
  int epochs_done = 0;
  // Batches of epoch `epochs_done` already trained: non-zero only in a checkpoint written when
  // the job was pre-empted mid-epoch (the shard order is a function of seed and epoch, so the
  // resumed run continues with the next batch).
  int batches_done = 0;
  int64_t optimizer_steps = 0;
  uint64_t seed = 0;
  int world_size = 1;
  std::vector<float> parameters;
  std::vector<std::vector<float>> optimizer_buffers;
};

Status saveCheckpoint(const std::string& path, const Checkpoint& checkpoint);
Result<Checkpoint> loadCheckpoint(const std::string& path);

// Creates `dir` and its parents when missing (mkdir -p); an error names what is in the way.
Status makeCheckpointDirectory(const std::string& dir);

// The file the trainer keeps its latest checkpoint in.
std::string latestCheckpointPath(const std::string& dir);

}  // namespace cpprun::mnist
