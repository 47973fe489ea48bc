// The panel kernel's AVX-512F tiles: up to 8 rows x 3 vectors of 16 columns (24 accumulators) a tile, float32
// weights, or with AVX512-BF16 bfloat16 weights in k pairs (the "dot" panels). Included by products.cpp only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "panels.h"

namespace graft {

constexpr int64_t kPrefetchAhead = 1152;  // floats: 4.5 KiB (kStreamAhead)

// A k step's operands. Float32: one k value a lane, one FMA. BFloat16 pairs (AVX512-BF16: `Bf16Pairs`): two
// consecutive k values a 32-bit lane, both multiplied and added by one vdpbf16ps, so a k step of pairs does twice
// the multiply-adds of a float32 one for the same instructions and reads half the bytes of weights. Activations are
// rounded to bfloat16 for it, as oneDNN's bfloat16 products do; the products are exact and add in float32.
struct Float32s {
  using Element = float;  // of x and of the weights
  using Vector = __m512;
  static Vector load(const float* w) { return _mm512_loadu_ps(w); }
  static Vector broadcast(const float* x) { return _mm512_set1_ps(*x); }
  static __m512 multiply_add(__m512 acc, Vector x, Vector w) { return _mm512_fmadd_ps(x, w, acc); }
};
#if defined(GRAFT_BF16_DOT)
struct Bf16Pairs {
  using Element = uint32_t;  // two bfloat16: k even in the low half, k + 1 in the high half
  using Vector = __m512bh;
  static Vector load(const uint32_t* w) { return (__m512bh)_mm512_loadu_si512(w); }
  static Vector broadcast(const uint32_t* x) { return (__m512bh)_mm512_set1_epi32(static_cast<int>(*x)); }
  static __m512 multiply_add(__m512 acc, Vector x, Vector w) { return _mm512_dpbf16_ps(acc, x, w); }
};
#endif
template <typename W>
using StepOf = std::conditional_t<std::is_same_v<W, float>, Float32s,
#if defined(GRAFT_BF16_DOT)
                                  Bf16Pairs
#else
                                  void
#endif
                                  >;

// y[m0 .. m0 + R) x [n0 .. n0 + 16 V) (+)= x[m0 .. m0 + R) @ block^T over k steps [k0, k1), for one block [K, 16 V]
// (x row-major, row r's k step at x[r * x_stride + k]; a k step is one float32 or one bfloat16 pair: Step): from
// zero where k0 = 0, else adding to what y holds. Each accumulator adds its k terms in order whatever R and the k
// ranges, so a row's product is the same bits in a decode step and a verification.
// With `stream` it prefetches kPrefetchAhead ahead of each k step; else `ahead_lines` cache lines from `ahead`
// into L2, spread evenly over its k steps (Bresenham), none where that is 0.
template <int R, int V, typename Step, typename E = typename Step::Element>
inline void panel_tile(const E* __restrict x, int64_t x_stride, const E* __restrict block, int64_t k0, int64_t k1,
                       float* __restrict y, int64_t n_size, int64_t n0, int64_t m0, bool stream, const char* ahead,
                       int64_t ahead_lines) {
  using Vector = typename Step::Vector;
  __m512 acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v)
      acc[r][v] = k0 == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(y + (m0 + r) * n_size + n0 + 16 * v);
  const E* w = block + k0 * 16 * V;
  const E* xk = x + m0 * x_stride + k0;
  const int64_t steps = k1 - k0;
  int64_t owed = 0;
  for (int64_t k = k0; k < k1; ++k, w += 16 * V, ++xk) {
    if (stream) {
      for (int v = 0; v < V; ++v) _mm_prefetch(reinterpret_cast<const char*>(w + kPrefetchAhead + 16 * v), _MM_HINT_T0);
    } else {
      prefetch_share<_MM_HINT_T1>(owed, ahead_lines, steps, ahead);
    }
    Vector weights[V];
    for (int v = 0; v < V; ++v) {
      weights[v] = Step::load(w + 16 * v);
      __asm__("" : "+v"(weights[v]));  // kept in a register: as a memory operand it is reloaded once per row
    }
    for (int r = 0; r < R; ++r) {
      Vector value = Step::broadcast(xk + r * x_stride);
      __asm__("" : "+v"(value));
      for (int v = 0; v < V; ++v) acc[r][v] = Step::multiply_add(acc[r][v], value, weights[v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) _mm512_storeu_ps(y + (m0 + r) * n_size + n0 + 16 * v, acc[r][v]);
}

// The last rows of a block (fewer than 8), one tile of exactly that many.
template <int V, typename Step, int R = 1, typename E>
inline void panel_rest(int64_t left, const E* x, int64_t x_stride, const E* block, int64_t k0, int64_t k1, float* y,
                       int64_t n_size, int64_t n0, int64_t m0, bool stream, const char* ahead, int64_t lines) {
  if constexpr (R < 8) {
    if (left == R) panel_tile<R, V, Step>(x, x_stride, block, k0, k1, y, n_size, n0, m0, stream, ahead, lines);
    else panel_rest<V, Step, R + 1>(left, x, x_stride, block, k0, k1, y, n_size, n0, m0, stream, ahead, lines);
  }
}

// One block for every row, in tiles of at most 8 rows. Beyond 8 rows the tiles take turns over chunks of the block,
// so that the later tiles read the chunk from L1 rather than the block from L2 (chunk sizes and prefetch:
// TilePrefetch, the mode `prefetch` names for this many rows), and the rows are shared out evenly (10 rows: 5 + 5,
// not 8 + 2), so that no tile has too few accumulators to hide the multiply-add's latency (a 2-row tile of a
// 32-wide block holds 4). E: float (float32 weights) or uint32_t (bfloat16 pairs, k_size counting pairs).
template <int V, typename E>
void panel_block(const E* x, int64_t rows, const E* block, int64_t k_size, float* y, int64_t n_size, int64_t n0,
                 const E* next_block, const int64_t* modes) {
  using Step = StepOf<E>;
  constexpr int tile = 8;
  constexpr int64_t k_bytes = 16 * V * sizeof(E);
  const bool multi = rows > tile;
  const int64_t mode = modes[multi ? 1 : 0];
  const bool stream = mode == kStreamAhead, chunked = multi || mode == kChunkAhead;
  const int64_t step = !chunked ? k_size : stream ? 128 : 64;
  const int64_t tiles = (rows + tile - 1) / tile, per_tile = (rows + tiles - 1) / tiles;
  for (int64_t k0 = 0; k0 < k_size; k0 += step) {
    const int64_t k1 = std::min(k_size, k0 + step);
    const NextChunk<k_bytes> next(block, next_block, k1, k_size, step, tiles, mode == kChunkAhead);
    for (int64_t m0 = 0, t = 0; m0 < rows; m0 += per_tile, ++t) {
      const char* ahead = next.ahead(t);
      const int64_t mine = next.lines_of(t), count = std::min(per_tile, rows - m0);
      if (count == tile) panel_tile<8, V, Step>(x, k_size, block, k0, k1, y, n_size, n0, m0, stream, ahead, mine);
      else panel_rest<V, Step>(count, x, k_size, block, k0, k1, y, n_size, n0, m0, stream, ahead, mine);
    }
  }
}

}  // namespace graft
