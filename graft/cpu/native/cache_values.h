// The cache's element types: float32, or bfloat16 held as its 16 bits (half the bytes a step's attention
// streams; at many sequences a step reads their caches more than the weights). Values are written rounded and
// read widened to float32, so every sum in the kernels stays float32.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "common.h"

namespace graft {

// float32 -> bfloat16 rounded to nearest even, a NaN kept a NaN: the bits torch's conversion gives, so a row
// written here and one written by the Python loop (a copy into a bfloat16 tensor) are the same.
inline uint16_t to_bfloat16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

inline void store_row(const float* source, float* row, int64_t d) { std::copy_n(source, d, row); }

inline void store_row(const float* source, uint16_t* row, int64_t d) {
  for (int64_t i = 0; i < d; ++i) row[i] = to_bfloat16(source[i]);
}

#if defined(GRAFT_AVX512)
inline __m512 load_lanes(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load_lanes(const uint16_t* p) {  // 16 bfloat16 values widened: their bits moved up 16
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}
#elif defined(GRAFT_AVX2)
inline __m256 load_lanes(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load_lanes(const uint16_t* p) {  // 8 bfloat16 values widened
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}
#endif

}  // namespace graft
