// CUDA's host __float2bfloat16 (cuda_bf16.hpp), compiled by the host compiler with the CUDA
// include directory: the reference the emulation's rounding is compared with bit for bit.
#include "tests/mnist/cuda_host_bf16_reference.h"

#include <cuda_bf16.h>

#include <cstring>

namespace cpprun::testing {

uint16_t cudaFloat2Bfloat16Bits(float value) {
  const __nv_bfloat16 converted = __float2bfloat16(value);
  uint16_t bits = 0;
  static_assert(sizeof(converted) == sizeof(bits));
  std::memcpy(&bits, &converted, sizeof(bits));
  return bits;
}

}  // namespace cpprun::testing
