// Few-row softmax attention over the cache in AVX2 + FMA vectors: the AVX-512F version's work items and
// guarantees with 8 keys a block, the kept weights packed in key order by a permutation (AVX2 has no compress).
// Included by attention.cpp only.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cache_values.h"
#include "vector_math.h"

namespace graft {

// The lane order that packs the lanes set in `bits` first, in lane order (AVX2 has no compress instruction).
inline __m256i compress_order(int bits) {
  static const auto table = [] {
    std::array<std::array<int32_t, 8>, 256> orders{};
    for (int m = 0; m < 256; ++m)
      for (int lane = 0, next = 0; lane < 8; ++lane)
        if (m & (1 << lane)) orders[m][next++] = lane;
    return orders;
  }();
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(table[bits].data()));
}

// Scores of 4 keys (rows of `key`, head_dim 8 V apart; those from `live` on are 0) for query q0 and, with Pair,
// q1: each key vector loaded once for both. A key's score is its lanes' products summed in one tree,
// ((0+1)+(2+3)) + ((4+5)+(6+7)), whether or not the query is paired.
template <int V, bool Pair, typename C>
inline void four_key_scores(const float* q0, const float* q1, const C* key, int live, __m128* sums4) {
  constexpr int64_t d = 8 * V;
  __m256 products[2][4];
  for (int j = 0; j < 4; ++j) products[0][j] = products[1][j] = _mm256_setzero_ps();
  for (int v = 0; v < V && live > 0; ++v) {
    const __m256 a = _mm256_loadu_ps(q0 + 8 * v);
    const __m256 b = Pair ? _mm256_loadu_ps(q1 + 8 * v) : a;
    for (int j = 0; j < 4; ++j) {  // a fixed bound with a break: the accumulators stay in registers
      if (j >= live) break;
      const __m256 k = load_lanes(key + j * d + 8 * v);
      products[0][j] = v == 0 ? _mm256_mul_ps(a, k) : _mm256_fmadd_ps(a, k, products[0][j]);
      if constexpr (Pair) products[1][j] = v == 0 ? _mm256_mul_ps(b, k) : _mm256_fmadd_ps(b, k, products[1][j]);
    }
  }
  for (int p = 0; p < (Pair ? 2 : 1); ++p) {
    const __m256 low = _mm256_hadd_ps(_mm256_hadd_ps(products[p][0], products[p][1]),
                                      _mm256_hadd_ps(products[p][2], products[p][3]));
    sums4[p] = _mm_add_ps(_mm256_castps256_ps128(low), _mm256_extractf128_ps(low, 1));
  }
  if constexpr (!Pair) sums4[1] = sums4[0];
}

// Weighted values of one block of keys [b0, b1) for R queries (weights[r][s]; a padded query's are 0) and C vectors
// from column vector c0, added to their running sums (row r of `partial`, head_dim 8 V apart): each value vector
// loaded once for the R queries; each accumulator adds its terms in key order.
template <int V, int R, int C, typename T>
inline void weighted_values(const float* const* weights, const T* v_head, int c0, int64_t b0, int64_t b1,
                            float* partial) {
  constexpr int64_t d = 8 * V;
  __m256 a[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) a[r][c] = _mm256_loadu_ps(partial + r * d + 8 * (c0 + c));
  for (int64_t s = b0; s < b1; ++s) {
    const T* value = v_head + s * d + 8 * c0;
    for (int r = 0; r < R; ++r) {
      const __m256 w = _mm256_broadcast_ss(weights[r] + s);
      for (int c = 0; c < C; ++c) a[r][c] = _mm256_fmadd_ps(w, load_lanes(value + 8 * c), a[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) _mm256_storeu_ps(partial + r * d + 8 * (c0 + c), a[r][c]);
}

// As the AVX-512F few_row_attention, for head_dim = 8 V; same arguments (a float32 or bfloat16 cache, T), same
// guarantees.
template <int V, typename T>
void few_row_attention(const float* query, const T* keys, const T* values, int64_t capacity, int64_t n,
                       int64_t start, int64_t heads, int64_t kv_heads, const float* mask, int64_t mask_stride,
                       float scaling, float* out) {
  constexpr int64_t d = 8 * V;
  const int64_t groups = heads / kv_heads, total = start + n, queries = groups * n;
  const int64_t parts = query_parts(queries, kv_heads);
  const int64_t per_part = (queries + parts - 1) / parts;
  at::parallel_for(0, kv_heads * parts, 1, [&](int64_t first, int64_t last) {
    const int64_t stride = total + 8;
    std::vector<float> scores(per_part * stride), kept(total + 8), sums(per_part), scaled(per_part * d);
    std::vector<float> partial(per_part * d);  // the weighted values' running sums
    for (int64_t item = first; item < last; ++item) {
      const int64_t g = item / parts, lo = (item % parts) * per_part, hi = std::min(queries, lo + per_part);
      if (lo >= hi) continue;
      const T* k_head = keys + g * capacity * d;
      const T* v_head = values + g * capacity * d;
      auto row_of = [&](int64_t f) { return f % n; };
      auto head_of = [&](int64_t f) { return g * groups + f / n; };
      auto visible_of = [&](int64_t f) { return mask != nullptr ? total : start + row_of(f) + 1; };
      for (int64_t f = lo; f < hi; ++f) {
        const float* q = query + (head_of(f) * n + row_of(f)) * d;
        for (int64_t i = 0; i < d; ++i) scaled[(f - lo) * d + i] = q[i] * scaling;
      }
      std::vector<__m256> best(hi - lo, _mm256_set1_ps(-INFINITY));  // each query's running max, lane-wise
      // scores, 8 keys at a time for every query, two queries at a time (four_key_scores: each key vector loaded
      // once for both); a query's scores are the same bits paired or alone.
      for (int64_t s0 = 0; s0 < total; s0 += 8) {
        for (int64_t f = lo; f < hi; f += 2) {
          const bool pair = f + 1 < hi;
          const int64_t visible = visible_of(f), visible_next = pair ? visible_of(f + 1) : 0;
          if (s0 >= std::max(visible, visible_next)) continue;
          const int64_t count = std::min<int64_t>(8, std::max(visible, visible_next) - s0);  // keys read
          const float* q0 = scaled.data() + (f - lo) * d;
          const float* q1 = pair ? q0 + d : q0;
          __m256 score[2];
          for (int half = 0; half < 2; ++half) {  // keys s0 + 4 half .. + 3
            const int live = static_cast<int>(std::clamp<int64_t>(count - 4 * half, 0, 4));
            const T* key = k_head + (s0 + 4 * half) * d;
            __m128 sums4[2];
            if (pair) four_key_scores<V, true, T>(q0, q1, key, live, sums4);
            else four_key_scores<V, false, T>(q0, q1, key, live, sums4);
            for (int p = 0; p < 2; ++p)
              score[p] = half == 0 ? _mm256_castps128_ps256(sums4[p]) : _mm256_insertf128_ps(score[p], sums4[p], 1);
          }
          for (int p = 0; p < (pair ? 2 : 1); ++p) {
            const int64_t query = f + p, seen = p == 0 ? visible : visible_next;
            if (s0 >= seen) continue;
            float* out_row = scores.data() + (query - lo) * stride + s0;
            const float* mask_row = mask != nullptr ? mask + row_of(query) * mask_stride + s0 : nullptr;
            __m256 sc = score[p];
            if (seen - s0 >= 8) {  // a whole block: plain loads and stores (AMD's masked stores are microcoded)
              if (mask_row != nullptr) sc = _mm256_add_ps(sc, _mm256_loadu_ps(mask_row));
              _mm256_storeu_ps(out_row, sc);
              best[query - lo] = _mm256_max_ps(best[query - lo], sc);
            } else {
              const __m256i lanes = first_lanes(seen - s0);
              if (mask_row != nullptr) sc = _mm256_add_ps(sc, _mm256_maskload_ps(mask_row, lanes));
              _mm256_maskstore_ps(out_row, lanes, sc);
              best[query - lo] = _mm256_max_ps(
                  best[query - lo], _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), sc, _mm256_castsi256_ps(lanes)));
            }
          }
        }
      }
      for (int64_t f = lo; f < hi; ++f) {  // softmax weights in place; their sum over the kept keys in key order
        const int64_t visible = visible_of(f);
        float* row = scores.data() + (f - lo) * stride;
        const __m256 top = _mm256_set1_ps(reduce_max(best[f - lo]));  // the max is exact in any order
        int64_t count = 0;
        for (int64_t s = 0; s < visible; s += 8) {
          __m256 e;
          if (visible - s >= 8) {
            e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(row + s), top));
            _mm256_storeu_ps(row + s, e);
          } else {
            const __m256i lanes = first_lanes(visible - s);
            e = _mm256_and_ps(exp_nonpositive(_mm256_sub_ps(_mm256_maskload_ps(row + s, lanes), top)),
                              _mm256_castsi256_ps(lanes));
            _mm256_maskstore_ps(row + s, lanes, e);
          }
          const int nonzero = _mm256_movemask_ps(_mm256_cmp_ps(e, _mm256_setzero_ps(), _CMP_NEQ_UQ));
          _mm256_storeu_ps(kept.data() + count, _mm256_permutevar8x32_ps(e, compress_order(nonzero)));
          count += __builtin_popcount(static_cast<unsigned>(nonzero));
        }
        __m256 sum = _mm256_setzero_ps();
        for (int64_t c = 0; c < count; c += 8)
          sum = _mm256_add_ps(sum, count - c >= 8 ? _mm256_loadu_ps(kept.data() + c)
                                                  : _mm256_maskload_ps(kept.data() + c, first_lanes(count - c)));
        sums[f - lo] = reduce_add(sum);
        std::fill(row + visible, row + total, 0.f);  // keys past a causal row's own: weight 0
      }
      // the weighted values in blocks of kValueBlock keys, each block read into L1 once for every query: groups of
      // R queries x C vectors of a column chunk in registers (8 accumulators), a last query alone in full rows; the
      // sums carried between blocks in `partial`. Each accumulator adds its keys' terms in key order from 0, so the
      // bits depend neither on the blocks nor on the grouping.
      constexpr int C = V < 4 ? V : 4, R = 8 / C, C1 = V < 8 ? V : 8;
      constexpr int64_t kValueBlock = 32;
      std::fill(partial.begin(), partial.end(), 0.f);
      int64_t reach_all = 0;
      for (int64_t f = lo; f < hi; ++f) reach_all = std::max(reach_all, visible_of(f));
      for (int64_t b0 = 0; b0 < reach_all; b0 += kValueBlock) {
        for (int64_t f0 = lo; f0 < hi;) {
          const int group = hi - f0 >= R ? R : 1;
          const float* weights[R];
          int64_t reach = 0;
          for (int r = 0; r < group; ++r) {
            weights[r] = scores.data() + (f0 + r - lo) * stride;
            reach = std::max(reach, visible_of(f0 + r));
          }
          const int64_t b1 = std::min(reach, b0 + kValueBlock);
          float* rows = partial.data() + (f0 - lo) * d;
          if (b0 < b1) {
            if (group == R)
              for (int c0 = 0; c0 < V; c0 += C) weighted_values<V, R, C, T>(weights, v_head, c0, b0, b1, rows);
            else
              for (int c0 = 0; c0 < V; c0 += C1) weighted_values<V, 1, C1, T>(weights, v_head, c0, b0, b1, rows);
          }
          f0 += group;
        }
      }
      for (int64_t f = lo; f < hi; ++f) {
        const __m256 inverse = _mm256_set1_ps(1.f / sums[f - lo]);
        float* o = out + row_of(f) * heads * d + head_of(f) * d;
        for (int v = 0; v < V; ++v) _mm256_storeu_ps(o + 8 * v, _mm256_mul_ps(_mm256_loadu_ps(partial.data() + (f - lo) * d + 8 * v), inverse));
      }
    }
  });
}

}  // namespace graft
