// The panel kernel's AVX2 + FMA tiles: the AVX-512F tiles in 8-float vectors, at most 12 accumulators a tile
// (sixteen registers), float32 weights or bfloat16 ones widened to float32 in the registers (the "widened"
// panels, for CPUs where oneDNN has no bfloat16 products). Included by products.cpp only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "panels.h"

namespace graft {

// k steps a chunk when a block's rows take more than one tile: 12 KiB of a 48-wide block, so that the chunk being
// read and the next one, prefetched meanwhile, both stay in a 32 KiB L1.
constexpr int64_t kChunk = 64;

// Eight weights as floats: float32 as they are; bfloat16 (its bits, uint16) widened in the register - a
// bfloat16 is the high half of the float32 with the same value.
inline __m256 load8(const float* w) { return _mm256_loadu_ps(w); }
inline __m256 load8(const uint16_t* w) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

// Rows per tile for blocks of V vectors of weights of type W, so that the tile fits sixteen registers: float32
// weights are memory operands (R x V accumulators and the broadcast row value); bfloat16 ones are widened once a
// k step into a register that every row reuses (R x V accumulators, R row values, the widened vector).
template <typename W>
constexpr int tile_rows(int v) {
  return std::is_same_v<W, float> ? 12 / v : 15 / (v + 1);
}

// As the AVX-512F tile, in 8-float vectors: y[m0 .. m0 + R) x [n0 .. n0 + 8 V) (+)= x @ block^T over [k0, k1).
// Float32 weights are read as memory operands (once from memory, then from L1 for the tile's other rows).
// Each accumulator adds its k terms in order whatever R and the k ranges. While it works it prefetches
// `ahead_lines` cache lines from `ahead`, spread evenly over its k steps (panel_block passes its share of the
// next chunk). A single tile over a whole block (one or two rows) prefetches nothing: a software prefetch there
// measured slower than the hardware prefetcher alone.
template <int R, int V, typename W>
inline void panel_tile(const float* __restrict x, int64_t x_stride, const W* __restrict block, int64_t k0, int64_t k1,
                       float* __restrict y, int64_t n_size, int64_t n0, int64_t m0, const char* ahead = nullptr,
                       int64_t ahead_lines = 0) {
  __m256 acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v)
      acc[r][v] = k0 == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(y + (m0 + r) * n_size + n0 + 8 * v);
  const W* w = block + k0 * 8 * V;
  const float* xk = x + m0 * x_stride + k0;  // x row-major: row r's value at k is xk[r * x_stride]
  const int64_t steps = k1 - k0;
  int64_t owed = 0;  // ahead_lines / steps lines a k step, carried as in Bresenham's line
  for (int64_t k = k0; k < k1; ++k, w += 8 * V, ++xk) {
    prefetch_share<_MM_HINT_T0>(owed, ahead_lines, steps, ahead);
    if constexpr (std::is_same_v<W, float>) {
      for (int r = 0; r < R; ++r) {
        const __m256 value = _mm256_broadcast_ss(xk + r * x_stride);
        for (int v = 0; v < V; ++v) acc[r][v] = _mm256_fmadd_ps(value, load8(w + 8 * v), acc[r][v]);
      }
    } else {
      __m256 values[R];
      for (int r = 0; r < R; ++r) values[r] = _mm256_broadcast_ss(xk + r * x_stride);
      for (int v = 0; v < V; ++v) {
        const __m256 weights = load8(w + 8 * v);
        for (int r = 0; r < R; ++r) acc[r][v] = _mm256_fmadd_ps(values[r], weights, acc[r][v]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) _mm256_storeu_ps(y + (m0 + r) * n_size + n0 + 8 * v, acc[r][v]);
}

// A float32 block of 48 columns for 3 to 8 rows: the tiles in the 2-row form above read each weight vector once
// per row (14 loads for 12 FMAs a k step). Here a tile is 4 rows x 24 columns with its three weight vectors held
// in registers (7 loads for 12 FMAs), and the block is worked in two column halves that take turns over 32-step
// chunks, prefetching the next chunk as panel_block does. Beyond 8 rows the 2-row tiles measured faster and stay.
constexpr int kHalfRows = 4, kHalfMaxRows = 8;
constexpr int64_t kHalfChunk = 32;

// y[m0 .. m0 + R) x [n0 + 8 c .. n0 + 8 c + 24) (+)= x @ block^T over [k0, k1), for a float32 block 48 wide.
// Each accumulator adds its k terms in order, as panel_tile's do, so the bits match theirs.
template <int R>
inline void half_tile(const float* __restrict x, int64_t x_stride, const float* __restrict block, int c, int64_t k0,
                      int64_t k1, float* __restrict y, int64_t n_size, int64_t n0, int64_t m0, const char* ahead,
                      int64_t ahead_lines) {
  constexpr int VB = 6, VT = 3;
  __m256 acc[R][VT];
  float* yt = y + m0 * n_size + n0 + 8 * c;
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < VT; ++v) acc[r][v] = k0 == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(yt + r * n_size + 8 * v);
  const float* w = block + k0 * 8 * VB + 8 * c;
  const float* xk = x + m0 * x_stride + k0;
  const int64_t steps = k1 - k0;
  int64_t owed = 0;
  for (int64_t k = k0; k < k1; ++k, w += 8 * VB, ++xk) {
    prefetch_share<_MM_HINT_T0>(owed, ahead_lines, steps, ahead);
    __m256 weights[VT];
    for (int v = 0; v < VT; ++v) {
      weights[v] = _mm256_loadu_ps(w + 8 * v);
      __asm__("" : "+x"(weights[v]));  // kept in a register: as a memory operand it is reloaded once per row
    }
    for (int r = 0; r < R; ++r) {
      __m256 value = _mm256_broadcast_ss(xk + r * x_stride);
      __asm__("" : "+x"(value));
      for (int v = 0; v < VT; ++v) acc[r][v] = _mm256_fmadd_ps(value, weights[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < VT; ++v) _mm256_storeu_ps(yt + r * n_size + 8 * v, acc[r][v]);
}

template <int R = 1>
inline void half_rest(int64_t left, const float* x, int64_t x_stride, const float* block, int c, int64_t k0, int64_t k1,
                      float* y, int64_t n_size, int64_t n0, int64_t m0, const char* ahead, int64_t lines) {
  if constexpr (R < kHalfRows) {
    if (left == R) half_tile<R>(x, x_stride, block, c, k0, k1, y, n_size, n0, m0, ahead, lines);
    else half_rest<R + 1>(left, x, x_stride, block, c, k0, k1, y, n_size, n0, m0, ahead, lines);
  }
}

inline void half_block(const float* x, int64_t rows, const float* block, int64_t k_size, float* y, int64_t n_size,
                       int64_t n0, const float* next_block) {
  const int64_t tiles = 2 * ((rows + kHalfRows - 1) / kHalfRows);
  for (int64_t k0 = 0; k0 < k_size; k0 += kHalfChunk) {
    const int64_t k1 = std::min(k_size, k0 + kHalfChunk);
    const NextChunk<48 * sizeof(float)> next(block, next_block, k1, k_size, kHalfChunk, tiles, true);
    for (int64_t m0 = 0, t = 0; m0 < rows; m0 += kHalfRows) {
      for (int c = 0; c < 6; c += 3, ++t) {
        const char* ahead = next.ahead(t);
        const int64_t mine = next.lines_of(t);
        if (m0 + kHalfRows <= rows) half_tile<kHalfRows>(x, k_size, block, c, k0, k1, y, n_size, n0, m0, ahead, mine);
        else half_rest(rows - m0, x, k_size, block, c, k0, k1, y, n_size, n0, m0, ahead, mine);
      }
    }
  }
}

// The last rows of a block (fewer than a full tile), one tile of exactly that many.
template <int V, typename W, int R = 1>
inline void panel_rest(int64_t left, const float* x, int64_t x_stride, const W* block, int64_t k0, int64_t k1,
                       float* y, int64_t n_size, int64_t n0, int64_t m0) {
  if constexpr (R < tile_rows<W>(V)) {
    if (left == R) panel_tile<R, V>(x, x_stride, block, k0, k1, y, n_size, n0, m0);
    else panel_rest<V, W, R + 1>(left, x, x_stride, block, k0, k1, y, n_size, n0, m0);
  }
}

// One block for every row, tile_rows rows per tile. Beyond one tile the tiles take turns over chunks of the block,
// the first reading the chunk from memory and the others from L1 - and all of them prefetch a share of the next
// chunk (or of `next_block`'s first) meanwhile, so that its read overlaps their arithmetic rather than taking
// turns with it. One prefetch scheme: `modes` (the AVX-512F tiles') are ignored.
template <int V, typename W>
void panel_block(const float* x, int64_t rows, const W* block, int64_t k_size, float* y, int64_t n_size, int64_t n0,
                 const W* next_block, const int64_t* /*modes*/) {
  if constexpr (std::is_same_v<W, float> && V == 6) {
    if (rows >= 3 && rows <= kHalfMaxRows) return half_block(x, rows, block, k_size, y, n_size, n0, next_block);
  }
  constexpr int tile = tile_rows<W>(V);
  const int64_t step = rows > tile ? kChunk : k_size;
  const int64_t full_tiles = rows / tile;  // the rest tile prefetches nothing
  for (int64_t k0 = 0; k0 < k_size; k0 += step) {
    const int64_t k1 = std::min(k_size, k0 + step);
    const NextChunk<8 * V * sizeof(W)> next(block, next_block, k1, k_size, step, full_tiles, rows > tile);
    int64_t m0 = 0;
    for (int64_t t = 0; m0 + tile <= rows; m0 += tile, ++t)
      panel_tile<tile, V>(x, k_size, block, k0, k1, y, n_size, n0, m0, next.ahead(t), next.lines_of(t));
    if (m0 < rows) panel_rest<V>(rows - m0, x, k_size, block, k0, k1, y, n_size, n0, m0);
  }
}

}  // namespace graft
