// Per-sample arithmetic that the CPU engine (layers.cc, trainer.cc) and the GPU engine
// (gpu_engine.cu) must compute identically: the counter-based hash behind dropout masks and
// sample keys, and one sample's log-softmax + negative log-likelihood. Compiled as host code by
// g++ and as host and device code by nvcc, so both engines share one definition.
// Thread safety: pure functions.
#pragma once

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define CPPRUN_HOST_DEVICE __host__ __device__
#else
#define CPPRUN_HOST_DEVICE
#endif

namespace cpprun::mnist {

// SplitMix64's finaliser: a bijective mix of 64 bits.
CPPRUN_HOST_DEVICE inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// Deterministic uniform in [0, 1) from a key and a counter.
CPPRUN_HOST_DEVICE inline float hashUniform(uint64_t key, uint64_t counter) {
  const uint64_t z = mix64(key + 0x9E3779B97F4A7C15ULL * (counter + 1));
  return static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
}

// The factor dropout layer `salt` applies to element `element` of the sample keyed `key`:
// 0 with the given probability, else 1 / (1 - probability).
CPPRUN_HOST_DEVICE inline float dropoutScale(uint64_t key, uint64_t salt, uint64_t element,
                                             float probability) {
  const uint64_t layer_key = key ^ (salt * 0x9E3779B97F4A7C15ULL);
  return hashUniform(layer_key, element) < probability ? 0.0f : 1.0f / (1.0f - probability);
}

// -log_softmax(row)[label] for one sample's logits. Sets *argmax; when drow is not null,
// writes d(loss / batch)/d(row) into it.
CPPRUN_HOST_DEVICE inline double sampleLogSoftmaxNll(const float* row, int label, int classes,
                                                     int batch, float* drow, int* argmax) {
  int best = 0;
  float max = row[0];
  for (int k = 1; k < classes; ++k) {
    if (row[k] > max) {
      max = row[k];
      best = k;
    }
  }
  double sum = 0.0;
  for (int k = 0; k < classes; ++k) sum += exp(static_cast<double>(row[k] - max));
  const double log_sum = log(sum) + max;
  *argmax = best;
  if (drow != nullptr) {
    for (int k = 0; k < classes; ++k) {
      const double p = exp(static_cast<double>(row[k]) - log_sum);
      drow[k] = static_cast<float>((p - (k == label ? 1.0 : 0.0)) / batch);
    }
  }
  return log_sum - row[label];
}

}  // namespace cpprun::mnist
