// The emulation's bfloat16: rounding to nearest even as the hardware and CUDA's host path do,
// checked on hand-picked cases and, where the build has CUDA's headers, bit for bit against
// CUDA's own __float2bfloat16 (tests/mnist/cuda_host_bf16_reference.cc).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "examples/mnist/cuda_host/cuda_host.h"
#if CPPRUN_HAVE_CUDA
#include "tests/mnist/cuda_host_bf16_reference.h"
#endif

namespace {

float floatOf(uint32_t bits) {
  float f = 0.0f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

uint16_t bf16Bits(uint32_t float_bits) { return __float2bfloat16(floatOf(float_bits)).__x; }

}  // namespace

TEST_CASE("cuda_host bf16: round to nearest, ties to even, on hand-picked cases", "[unit]") {
  struct Case {
    uint32_t in;
    uint16_t out;
    const char* what;
  };
  const std::vector<Case> cases = {
      {0x3f800000, 0x3f80, "1.0 is exact"},
      {0x3f807fff, 0x3f80, "just below half an ulp rounds down"},
      {0x3f808001, 0x3f81, "just above half an ulp rounds up"},
      {0x3f808000, 0x3f80, "a tie with an even upper half stays"},
      {0x3f818000, 0x3f82, "a tie with an odd upper half rounds up to even"},
      {0xbf818000, 0xbf82, "negative ties round away to even too"},
      {0xbf808000, 0xbf80, "negative tie, even"},
      {0x3fffffff, 0x4000, "the carry runs into the exponent (1.99999 -> 2)"},
      {0x3f7fffff, 0x3f80, "the carry runs into the exponent (0.99999 -> 1)"},
      {0x7f7f0000, 0x7f7f, "the largest finite bf16 is exact"},
      {0x7f7f7fff, 0x7f7f, "below the tie past the largest finite stays finite"},
      {0x7f7f8000, 0x7f80, "the tie past the largest finite (odd) becomes infinity"},
      {0x7f7fffff, 0x7f80, "FLT_MAX becomes infinity"},
      {0xff7fffff, 0xff80, "-FLT_MAX becomes -infinity"},
      {0x7f800000, 0x7f80, "infinity"},
      {0xff800000, 0xff80, "-infinity"},
      {0x7fc00000, 0x7fff, "a quiet NaN becomes the canonical NaN"},
      {0xffc00001, 0x7fff, "a negative NaN becomes the canonical NaN"},
      {0x7f800001, 0x7fff, "a signalling NaN whose payload would round away stays NaN"},
      {0x00000000, 0x0000, "+0"},
      {0x80000000, 0x8000, "-0 keeps its sign"},
      {0x00000001, 0x0000, "the smallest denormal rounds to 0"},
      {0x80000001, 0x8000, "the smallest negative denormal rounds to -0"},
      {0x00008000, 0x0000, "a denormal tie with an even upper half rounds to 0"},
      {0x00018000, 0x0002, "a denormal tie with an odd upper half rounds up"},
      {0x0000ffff, 0x0001, "a denormal rounds up to the smallest bf16 denormal"},
      {0x007fffff, 0x0080, "the largest denormal rounds up to the smallest normal"},
  };
  for (const Case& c : cases) {
    INFO(c.what << " (0x" << std::hex << c.in << ")");
    CHECK(bf16Bits(c.in) == c.out);
  }
  CHECK(sizeof(__nv_bfloat16) == 2);
}

TEST_CASE("cuda_host bf16: every non-NaN bf16 goes to float and back unchanged", "[unit]") {
  int checked = 0;
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const __nv_bfloat16 value{static_cast<unsigned short>(bits)};
    const float f = __bfloat162float(value);
    if (std::isnan(f)) continue;
    uint32_t float_bits = 0;
    std::memcpy(&float_bits, &f, sizeof(f));
    REQUIRE(float_bits == bits << 16);
    REQUIRE(__float2bfloat16(f).__x == bits);
    ++checked;
  }
  CHECK(checked == 65536 - 2 * 127);  // 2 x (2^7 - 1) NaN patterns
}

TEST_CASE("cuda_host bf16: bit for bit as CUDA's own host __float2bfloat16", "[unit]") {
#if CPPRUN_HAVE_CUDA
  using cpprun::testing::cudaFloat2Bfloat16Bits;
  size_t compared = 0;
  size_t mismatches = 0;
  auto compare = [&](uint32_t bits) {
    const float f = floatOf(bits);
    const uint16_t ours = __float2bfloat16(f).__x;
    const uint16_t cudas = cudaFloat2Bfloat16Bits(f);
    ++compared;
    if (ours != cudas && ++mismatches <= 10) {
      FAIL_CHECK("0x" << std::hex << bits << ": emulation 0x" << ours << ", CUDA 0x" << cudas);
    }
  };
  // Every upper half with the lower halves where rounding decides: exact, below, at and above
  // the tie, and the largest (carries, overflow, NaN payloads, denormals, both signs).
  for (uint32_t upper = 0; upper <= 0xffff; ++upper) {
    for (uint32_t lower : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
      compare(upper << 16 | lower);
    }
  }
  std::mt19937 random(20261124);
  for (int i = 0; i < 4'000'000; ++i) compare(static_cast<uint32_t>(random()));
  INFO(compared << " floats compared");
  CHECK(mismatches == 0);
  CHECK(compared == 65536 * 6 + 4'000'000);
#else
  WARN("SKIPPED: built without CUDA's headers (CPPRUN_HAVE_CUDA off): no reference to compare");
#endif
}
