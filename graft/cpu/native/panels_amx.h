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

// Tiles 0 .. 5 hold y: one 16-column group of a block for up to 16 rows each (float32), tile 3 G + v the group
// v of row group g; tile 6 x's rows for 16 k pairs, tile 7 the weights of one group for those pairs (16 pairs x
// 16 columns x 2).
inline void configure_tiles(int64_t rows) {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = static_cast<uint8_t>(t < 7 ? rows : 16);
    config.bytes_per_row[t] = 64;
  }
  _tile_loadconfig(&config);
}

// One 16-column group v of G row groups (16 rows apart in x_pairs) for 16 k pairs. (The tile intrinsics spell
// their tile numbers into the instruction: literals, not template parameters.)
#define GRAFT_AMX_GROUP(v, second)                  \
  template <int G>                                  \
  inline void amx_group_##v(const uint32_t* x, int64_t x_stride, const uint16_t* w, int64_t w_stride) { \
    _tile_loadd(7, w + 32 * v, w_stride);           \
    _tile_loadd(6, x, x_stride);                    \
    _tile_dpbf16ps(v, 6, 7);                        \
    if constexpr (G == 2) {                         \
      _tile_loadd(6, x + 4 * x_stride, x_stride);   \
      _tile_dpbf16ps(second, 6, 7);                 \
    }                                               \
  }
GRAFT_AMX_GROUP(0, 3)
GRAFT_AMX_GROUP(1, 4)
GRAFT_AMX_GROUP(2, 5)
#undef GRAFT_AMX_GROUP

// y rows [0, G x 16) (fewer where the tiles were configured so) x [n0, n0 + 16 V) = those rows of x_pairs @ one
// block of the dot panels ([k_pairs, 16 V, 2] bfloat16): each k step of 16 pairs reads each group's weights once
// (rows 16 V x 4 bytes apart) for both row groups.
template <int V, int G>
void amx_block(const uint32_t* x_pairs, int64_t k_pairs, const uint16_t* block, float* y, int64_t n_size) {
  const int64_t w_stride = 4 * 16 * V, x_stride = 4 * k_pairs, y_stride = 4 * n_size;
  _tile_zero(0);
  if constexpr (V >= 2) _tile_zero(1);
  if constexpr (V >= 3) _tile_zero(2);
  if constexpr (G == 2) {
    _tile_zero(3);
    if constexpr (V >= 2) _tile_zero(4);
    if constexpr (V >= 3) _tile_zero(5);
  }
  for (int64_t p = 0; p < k_pairs; p += 16) {
    const uint16_t* w = block + p * 2 * 16 * V;
    amx_group_0<G>(x_pairs + p, x_stride, w, w_stride);
    if constexpr (V >= 2) amx_group_1<G>(x_pairs + p, x_stride, w, w_stride);
    if constexpr (V >= 3) amx_group_2<G>(x_pairs + p, x_stride, w, w_stride);
  }
  _tile_stored(0, y, y_stride);
  if constexpr (V >= 2) _tile_stored(1, y + 16, y_stride);
  if constexpr (V >= 3) _tile_stored(2, y + 32, y_stride);
  if constexpr (G == 2) {
    float* y1 = y + 16 * n_size;
    _tile_stored(3, y1, y_stride);
    if constexpr (V >= 2) _tile_stored(4, y1 + 16, y_stride);
    if constexpr (V >= 3) _tile_stored(5, y1 + 32, y_stride);
  }
}

template <int G>
void amx_width(int64_t width, const uint32_t* x, int64_t k_pairs, const uint16_t* block, float* y, int64_t n_size) {
  if (width == 48) amx_block<3, G>(x, k_pairs, block, y, n_size);
  else if (width == 32) amx_block<2, G>(x, k_pairs, block, y, n_size);
  else amx_block<1, G>(x, k_pairs, block, y, n_size);
}

// Every block over the threads. Up to 16 rows in one group of exactly that many; beyond, x_pairs and y hold `rows`
// rounded up to 16 (zeros after x's rows) and the groups go two at a time, both from one read of the block.
inline void amx_blocks(const uint32_t* x_pairs, int64_t rows, int64_t k_pairs, const uint16_t* wp, int64_t blocks,
                       int64_t width, float* yp) {
  const int64_t n_size = blocks * width;
  at::parallel_for(0, blocks, 1, [&](int64_t first, int64_t last) {
    configure_tiles(std::min<int64_t>(16, rows));
    for (int64_t m0 = 0; m0 < rows; m0 += 32) {
      const uint32_t* xr = x_pairs + m0 * k_pairs;
      for (int64_t b = first; b < last; ++b) {
        const uint16_t* block = wp + b * k_pairs * 2 * width;
        float* y = yp + m0 * n_size + b * width;
        if (rows - m0 > 16) amx_width<2>(width, xr, k_pairs, block, y, n_size);
        else amx_width<1>(width, xr, k_pairs, block, y, n_size);
      }
    }
    _tile_release();
  });
}

}  // namespace graft
