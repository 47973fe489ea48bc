// The bfloat16 "dot" panels read by AMX tiles (an Intel Sapphire Rapids or later): 16 rows x 16 columns x 32 k a
// tdpbf16ps. Included by products.cpp only, in the AMX build.
#pragma once

#include <algorithm>
#include <cstdint>

#include <ATen/Parallel.h>

#include "common.h"

namespace graft {

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

// Up to 16 rows (amx_block): tiles 0 .. 2 hold y, one 16-column group of a block each (float32), tile 6 x's rows
// for 16 k pairs, tile 7 the weights of one group for those pairs (16 pairs x 16 columns x 2).
inline void configure_tiles(int64_t rows) {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = static_cast<uint8_t>(t < 7 ? rows : 16);
    config.bytes_per_row[t] = 64;
  }
  _tile_loadconfig(&config);
}

// One 16-column group v for 16 k pairs. (The tile intrinsics spell their tile numbers into the instruction:
// literals, not template parameters.)
#define GRAFT_AMX_GROUP(v)                                                                              \
  inline void amx_group_##v(const uint32_t* x, int64_t x_stride, const uint16_t* w, int64_t w_stride) { \
    _tile_loadd(7, w + 32 * v, w_stride);                                                               \
    _tile_loadd(6, x, x_stride);                                                                        \
    _tile_dpbf16ps(v, 6, 7);                                                                            \
  }
GRAFT_AMX_GROUP(0)
GRAFT_AMX_GROUP(1)
GRAFT_AMX_GROUP(2)
#undef GRAFT_AMX_GROUP

// y's rows (as the tiles were configured, up to 16) x [n0, n0 + 16 V) = x_pairs @ one block of the dot panels
// ([k_pairs, 16 V, 2] bfloat16): each k step of 16 pairs reads each group's weights once.
template <int V>
void amx_block(const uint32_t* x_pairs, int64_t k_pairs, const uint16_t* block, float* y, int64_t n_size) {
  const int64_t w_stride = 4 * 16 * V, x_stride = 4 * k_pairs, y_stride = 4 * n_size;
  _tile_zero(0);
  if constexpr (V >= 2) _tile_zero(1);
  if constexpr (V >= 3) _tile_zero(2);
  for (int64_t p = 0; p < k_pairs; p += 16) {
    const uint16_t* w = block + p * 2 * 16 * V;
    amx_group_0(x_pairs + p, x_stride, w, w_stride);
    if constexpr (V >= 2) amx_group_1(x_pairs + p, x_stride, w, w_stride);
    if constexpr (V >= 3) amx_group_2(x_pairs + p, x_stride, w, w_stride);
  }
  _tile_stored(0, y, y_stride);
  if constexpr (V >= 2) _tile_stored(1, y + 16, y_stride);
  if constexpr (V >= 3) _tile_stored(2, y + 32, y_stride);
}

inline void amx_width(int64_t width, const uint32_t* x, int64_t k_pairs, const uint16_t* block, float* y,
                      int64_t n_size) {
  if (width == 48) amx_block<3>(x, k_pairs, block, y, n_size);
  else if (width == 32) amx_block<2>(x, k_pairs, block, y, n_size);
  else amx_block<1>(x, k_pairs, block, y, n_size);
}

// Rows beyond 16: the 16-column groups of a thread's blocks taken two at a time (a pair may span two blocks)
// for two row groups, 2 x 2 accumulators (tiles 0 .. 3), x's two row groups (4, 5) and the pair's weights (6, 7),
// every tile 16 rows (configure_tiles(16)): four tile loads for four tdpbf16ps a k step, where a whole block's
// three groups took nine loads for six. Each accumulator still adds its k steps in order from zero, so a
// product's bits are those of amx_block.
// y's 32 rows x two 16-column groups (columns c0 and c1; their weights w0, w1 in the dot panels' layout, rows
// w_stride bytes apart); `single`: the second group absent.
template <bool single>
inline void amx_pair(const uint32_t* x, int64_t k_pairs, const uint16_t* w0, const uint16_t* w1, int64_t w_stride,
                     int64_t width, float* y0, float* y1, int64_t n_size) {
  const int64_t x_stride = 4 * k_pairs, y_stride = 4 * n_size, rows16 = 16 * k_pairs;
  _tile_zero(0);
  _tile_zero(2);
  if constexpr (!single) {
    _tile_zero(1);
    _tile_zero(3);
  }
  for (int64_t p = 0; p < k_pairs; p += 16) {
    const int64_t step = p * 2 * width;
    _tile_loadd(4, x + p, x_stride);
    _tile_loadd(5, x + rows16 + p, x_stride);
    _tile_loadd(6, w0 + step, w_stride);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(2, 5, 6);
    if constexpr (!single) {
      _tile_loadd(7, w1 + step, w_stride);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, y0, y_stride);
  _tile_stored(2, y0 + 16 * n_size, y_stride);
  if constexpr (!single) {
    _tile_stored(1, y1, y_stride);
    _tile_stored(3, y1 + 16 * n_size, y_stride);
  }
}

// Blocks [first, last) for rows a multiple of 16 beyond 16, 32 rows at a time (the last 16 of an odd count through
// amx_block).
inline void amx_pair_blocks(const uint32_t* x_pairs, int64_t rows, int64_t k_pairs, const uint16_t* wp,
                            int64_t first, int64_t last, int64_t width, float* yp, int64_t n_size) {
  const int64_t per_block = width / 16, groups = (last - first) * per_block, w_stride = 4 * width;
  auto weights = [&](int64_t g) {  // group g of the range: its block's panels, 16 columns in
    return wp + (first + g / per_block) * k_pairs * 2 * width + 32 * (g % per_block);
  };
  auto column = [&](int64_t g) { return (first + g / per_block) * width + 16 * (g % per_block); };
  int64_t m0 = 0;
  configure_tiles(16);  // every tile 16 rows: the pairs', and amx_block's for an odd last 16
  for (; m0 + 32 <= rows; m0 += 32) {
    const uint32_t* xr = x_pairs + m0 * k_pairs;
    float* y = yp + m0 * n_size;
    int64_t g = 0;
    for (; g + 2 <= groups; g += 2)
      amx_pair<false>(xr, k_pairs, weights(g), weights(g + 1), w_stride, width, y + column(g), y + column(g + 1), n_size);
    if (g < groups) amx_pair<true>(xr, k_pairs, weights(g), nullptr, w_stride, width, y + column(g), nullptr, n_size);
  }
  if (m0 < rows) {  // the last 16 rows
    const uint32_t* xr = x_pairs + m0 * k_pairs;
    for (int64_t b = first; b < last; ++b)
      amx_width(width, xr, k_pairs, wp + b * k_pairs * 2 * width, yp + m0 * n_size + b * width, n_size);
  }
}

// Every block over the threads. Up to 16 rows in one group of exactly that many; beyond, x_pairs and y hold `rows`
// rounded up to 16 (zeros after x's rows) and the rows go 32 at a time through amx_pair_blocks.
inline void amx_blocks(const uint32_t* x_pairs, int64_t rows, int64_t k_pairs, const uint16_t* wp, int64_t blocks,
                       int64_t width, float* yp) {
  const int64_t n_size = blocks * width;
  at::parallel_for(0, blocks, 1, [&](int64_t first, int64_t last) {
    if (rows > 16) {
      amx_pair_blocks(x_pairs, rows, k_pairs, wp, first, last, width, yp, n_size);
    } else {
      configure_tiles(rows);
      for (int64_t b = first; b < last; ++b)
        amx_width(width, x_pairs, k_pairs, wp + b * k_pairs * 2 * width, yp + b * width, n_size);
    }
    _tile_release();
  });
}

}  // namespace graft
