// Few-row softmax attention over the cache in AVX-512F vectors (16 keys a block). Included by attention.cpp only.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cache_values.h"
#include "vector_math.h"

namespace graft {

// The lane sums of 16 vectors as one vector (lane j: the sum of products[j]'s 16 lanes). Every vector's lanes
// are added in the same tree ((0+2)+(1+3) within each 128-bit block, then (B0+B2)+(B1+B3)) whatever its slot j,
// so a key's score does not depend on which 16 keys it is computed with.
inline __m512 sum_lanes16(const __m512* products) {
  __m512 pairs[8], quads[4];
  for (int i = 0; i < 8; ++i) {
    const __m512 a = products[2 * i], b = products[2 * i + 1];
    pairs[i] = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  }
  for (int i = 0; i < 4; ++i) {
    const __m512 a = pairs[2 * i], b = pairs[2 * i + 1];
    quads[i] = _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x44), _mm512_shuffle_ps(a, b, 0xEE));
  }
  const __m512 low = _mm512_add_ps(_mm512_shuffle_f32x4(quads[0], quads[1], 0x44),
                                   _mm512_shuffle_f32x4(quads[0], quads[1], 0xEE));
  const __m512 high = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2], quads[3], 0x44),
                                    _mm512_shuffle_f32x4(quads[2], quads[3], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_f32x4(low, high, 0x88), _mm512_shuffle_f32x4(low, high, 0xDD));
}

// `count` values from `row` asked into the cache, a line at a time (nothing where count <= 0).
template <typename C>
inline void prefetch_rows(const C* row, int64_t count) {
  const char* bytes = reinterpret_cast<const char*>(row);
  for (int64_t b = 0; b < count * static_cast<int64_t>(sizeof(C)); b += 64) _mm_prefetch(bytes + b, _MM_HINT_T0);
}

// `count` keys' values (a multiple of 16: whole rows of head_dim 16 V) as float32: a float32 cache's in place, a
// bfloat16 cache's widened into `wide`.
inline const float* widened_keys(const float* keys, int64_t, float*) { return keys; }
inline const float* widened_keys(const uint16_t* keys, int64_t count, float* wide) {
  for (int64_t i = 0; i < count; i += 16) _mm512_storeu_ps(wide + i, load_lanes(keys + i));
  return wide;
}

// Softmax attention of n query rows over the cache, for head_dim = 16 V. The G query heads sharing a key/value
// head and all n rows (F = G n queries) are one work item, split in two where the key/value heads are fewer than
// twice the threads: each block of 16 keys is read once for all its queries (first the scores, then, after each
// query's softmax, the weighted values), because reading the cache once per query made verifications of many
// rows over a long context cost several times a decode step's attention. Per query: scores against every visible
// key (mask row i added, or causal from `start`), softmax, weighted sum of values. A query's result does not
// depend on the other queries or on masked positions (their weights are exactly 0, and the sums run over the
// kept keys in key order), so a token's attention is the same bits in a decode step and in a verification.
// query [heads, n, d]; keys, values [kv_heads, capacity, d] of float32 or bfloat16 (C); mask [n, mask_stride] or null; out [n, heads * d].
template <int V, typename C>
void few_row_attention(const float* query, const C* keys, const C* values, int64_t capacity, int64_t n,
                       int64_t start, int64_t heads, int64_t kv_heads, const float* mask, int64_t mask_stride,
                       float scaling, float* out) {
  constexpr int64_t d = 16 * V;
  const int64_t groups = heads / kv_heads, total = start + n, queries = groups * n;
  const int64_t parts = query_parts(queries, kv_heads);
  const int64_t per_part = (queries + parts - 1) / parts;
  at::parallel_for(0, kv_heads * parts, 1, [&](int64_t first, int64_t last) {
    const int64_t stride = total + 16;
    std::vector<float> scores(per_part * stride), kept(total + 16), sums(per_part), wide(16 * d);
    const std::vector<float> zeros(total + 16, 0.f);
    for (int64_t item = first; item < last; ++item) {
      const int64_t g = item / parts, lo = (item % parts) * per_part, hi = std::min(queries, lo + per_part);
      if (lo >= hi) continue;
      const C* k_head = keys + g * capacity * d;
      const C* v_head = values + g * capacity * d;
      // folded query f = member * n + row: head g * groups + member, row i
      auto row_of = [&](int64_t f) { return f % n; };
      auto head_of = [&](int64_t f) { return g * groups + f / n; };
      auto visible_of = [&](int64_t f) { return mask != nullptr ? total : start + row_of(f) + 1; };
      std::vector<float> best(hi - lo, -INFINITY);
      for (int64_t s0 = 0; s0 < total; s0 += 16) {  // scores, 16 keys at a time for every query
        // the keys two blocks ahead and this block's values asked for now: a decode step's short streams (a few
        // KiB a head and sequence) ended before the hardware prefetcher caught up, so the loads waited on memory
        prefetch_rows(k_head + (s0 + 32) * d, std::min<int64_t>(16, total - s0 - 32) * d);
        prefetch_rows(v_head + s0 * d, std::min<int64_t>(16, total - s0) * d);
        // a bfloat16 block widened once for all its queries (the same float32 values each query read widened)
        const float* block = widened_keys(k_head + s0 * d, std::min<int64_t>(16, total - s0) * d, wide.data());
        for (int64_t f = lo; f < hi; ++f) {
          const int64_t visible = visible_of(f);
          if (s0 >= visible) continue;
          const int64_t count = std::min<int64_t>(16, visible - s0);
          const __mmask16 lanes = first_lanes(count);
          const float* q = query + (head_of(f) * n + row_of(f)) * d;
          __m512 qv[V];
          for (int v = 0; v < V; ++v) qv[v] = _mm512_mul_ps(_mm512_loadu_ps(q + 16 * v), _mm512_set1_ps(scaling));
          __m512 products[16];
          for (int j = 0; j < 16; ++j) {
            products[j] = _mm512_setzero_ps();
            if (j >= count) continue;
            const float* key = block + j * d;
            products[j] = _mm512_mul_ps(qv[0], load_lanes(key));
            for (int v = 1; v < V; ++v) products[j] = _mm512_fmadd_ps(qv[v], load_lanes(key + 16 * v), products[j]);
          }
          __m512 score = sum_lanes16(products);
          if (mask != nullptr)
            score = _mm512_add_ps(score, _mm512_maskz_loadu_ps(lanes, mask + row_of(f) * mask_stride + s0));
          _mm512_mask_storeu_ps(scores.data() + (f - lo) * stride + s0, lanes, score);
          best[f - lo] = std::max(best[f - lo], _mm512_mask_reduce_max_ps(lanes, score));
        }
      }
      for (int64_t f = lo; f < hi; ++f) {  // softmax weights in place; their sum over the kept keys in key order
        const int64_t visible = visible_of(f);
        float* row = scores.data() + (f - lo) * stride;
        const __m512 top = _mm512_set1_ps(best[f - lo]);
        int64_t count = 0;
        for (int64_t s = 0; s < visible; s += 16) {
          const __mmask16 lanes = first_lanes(visible - s);
          __m512 e = _mm512_maskz_mov_ps(lanes, exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(lanes, row + s), top)));
          _mm512_mask_storeu_ps(row + s, lanes, e);
          const __mmask16 nonzero = _mm512_cmp_ps_mask(e, _mm512_setzero_ps(), _CMP_NEQ_OQ);
          _mm512_mask_compressstoreu_ps(kept.data() + count, nonzero, e);
          count += __builtin_popcount(static_cast<unsigned>(nonzero));
        }
        __m512 sum = _mm512_setzero_ps();
        for (int64_t c = 0; c < count; c += 16) {
          const __mmask16 lanes = first_lanes(count - c);
          sum = _mm512_add_ps(sum, _mm512_maskz_loadu_ps(lanes, kept.data() + c));
        }
        sums[f - lo] = _mm512_reduce_add_ps(sum);
        std::fill(row + visible, row + total, 0.f);  // keys past a causal row's own: weight 0
      }
      // the weighted values, R queries at a time in registers: each value row is read once per R queries, and
      // each query adds its terms in key order (a masked key's weight is 0, its term exactly 0)
      constexpr int R = V >= 8 ? 2 : V == 4 ? 4 : 8;
      for (int64_t f0 = lo; f0 < hi; f0 += R) {
        const float* weights[R];
        int64_t reach = 0;
        for (int r = 0; r < R; ++r) {
          const bool real = f0 + r < hi;
          weights[r] = real ? scores.data() + (f0 + r - lo) * stride : zeros.data();
          if (real) reach = std::max(reach, visible_of(f0 + r));
        }
        __m512 a[R][V];
        for (int r = 0; r < R; ++r)
          for (int v = 0; v < V; ++v) a[r][v] = _mm512_setzero_ps();
        for (int64_t s = 0; s < reach; ++s) {
          __m512 value[V];
          for (int v = 0; v < V; ++v) value[v] = load_lanes(v_head + s * d + 16 * v);
          for (int r = 0; r < R; ++r) {
            const __m512 w = _mm512_set1_ps(weights[r][s]);
            for (int v = 0; v < V; ++v) a[r][v] = _mm512_fmadd_ps(w, value[v], a[r][v]);
          }
        }
        for (int r = 0; r < R && f0 + r < hi; ++r) {
          const __m512 inverse = _mm512_set1_ps(1.f / sums[f0 + r - lo]);
          float* o = out + row_of(f0 + r) * heads * d + head_of(f0 + r) * d;
          for (int v = 0; v < V; ++v) _mm512_storeu_ps(o + 16 * v, _mm512_mul_ps(a[r][v], inverse));
        }
      }
    }
  });
}

}  // namespace graft
