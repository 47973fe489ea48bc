// Vector pieces the attention and the row helpers share: sums of squares, lane masks, exp of non-positive
// values, horizontal reductions.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common.h"

namespace graft {

// The few-row attention kernels take a long prompt chunk's queries this many at a time: their scores stay
// [kQueryBlock, keys] however long the chunk (a query's result never depends on the others beside it).
constexpr int64_t kQueryBlock = 256;

// How many parts a kv head's `queries` go in: two where the kv heads alone would leave threads idle, but not inside
// a parallel region (a batch's segments, one a thread), where a second part would only read the keys twice; and
// at least one per kQueryBlock queries. A query's result never depends on the part it is in.
inline int64_t query_parts(int64_t queries, int64_t kv_heads) {
  const bool split = queries > 1 && kv_heads < 2 * at::get_num_threads() && !at::in_parallel_region();
  return std::max<int64_t>(split ? 2 : 1, (queries + kQueryBlock - 1) / kQueryBlock);
}

// Sum of squares vectorised (omp simd lets the compiler reorder the float reduction).
inline float inverse_rms(const float* x, int64_t d, float eps) {
  float squares = 0.f;
#pragma omp simd reduction(+ : squares)
  for (int64_t i = 0; i < d; ++i) squares += x[i] * x[i];
  return 1.f / std::sqrt(squares / static_cast<float>(d) + eps);
}

#if defined(GRAFT_AVX512)
// The first min(count, 16) lanes of a vector.
inline __mmask16 first_lanes(int64_t count) {
  return count >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << count) - 1);
}

// exp(x) for x <= 0 (scores less their row's maximum): x = k ln2 + r, |r| <= ln2 / 2, e^r by its degree-6
// Taylor polynomial (relative error about 1e-7), times 2^k; below -87 (a masked score) exactly 0.
inline __m512 exp_nonpositive(__m512 x) {
  const __m512 floor = _mm512_set1_ps(-87.f);
  const __mmask16 vanishing = _mm512_cmp_ps_mask(x, floor, _CMP_LT_OQ);
  x = _mm512_max_ps(x, floor);
  const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), x);  // ln2 in two parts (Cody-Waite)
  r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_maskz_mov_ps(static_cast<__mmask16>(~vanishing), _mm512_scalef_ps(p, k));
}
#elif defined(GRAFT_AVX2)
// The AVX-512F pieces in 8-float vectors: lane masks as integer vectors, 2^k built in the exponent bits.
inline __m256i first_lanes(int64_t count) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::min<int64_t>(count, 8))),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// exp(x) for x <= 0 as the AVX-512F version; below -87 exactly 0.
inline __m256 exp_nonpositive(__m256 x) {
  const __m256 floor = _mm256_set1_ps(-87.f);
  const __m256 vanishing = _mm256_cmp_ps(x, floor, _CMP_LT_OQ);
  x = _mm256_max_ps(x, floor);
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.f / 720);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  // k >= -126 here, so 2^k is a normal float: its exponent field is k + 127
  const __m256i two_k = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(vanishing, _mm256_mul_ps(p, _mm256_castsi256_ps(two_k)));
}

inline float reduce_add(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

inline float reduce_max(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}
#endif

}  // namespace graft
