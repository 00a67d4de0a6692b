// CUDA's own host-side float -> bfloat16 conversion, behind a name that does not clash with the
// emulation's (cuda_host_bf16_reference.cc includes <cuda_bf16.h>, which the emulation stands in
// for, so the two live in separate translation units).
// Thread safety: a pure function.
#pragma once

#include <cstdint>

namespace cpprun::testing {

// The bits of __float2bfloat16(value) as <cuda_bf16.h>'s host path computes them.
uint16_t cudaFloat2Bfloat16Bits(float value);

}  // namespace cpprun::testing
