// The panel kernel's pieces shared by its AVX-512F and AVX2 tiles: the tile prefetch modes and the spreading of
// a prefetch over a tile's k steps.
//
// The panel layout stores W [N, K] as [N / B, K, B] for a block width B of 48, 32 or 16 columns, so that one
// thread reads one block as a single contiguous stream, and a register-blocked micro-kernel reuses each loaded
// weight vector for every row of its tile; oneDNN's packed linear streamed the weights of few rows well below
// the memory's rate and slowed quickly with the rows. Blocks are split between threads; the tiles read x as it
// is (row-major: each row a sequential stream). graft/cpu/products.py measures at load which row counts it serves.
#pragma once

#include <algorithm>
#include <cstdint>

#include "common.h"

namespace graft {

// How the AVX-512F tiles prefetch their weight stream. CPUs differ in which is fastest, and a CPU may differ
// between one tile and several, so graft/cpu/products.py times the modes at load and each product carries its
// own (PackedLinear.tile_prefetch, passed down to every panel product):
// - kStreamAhead: every tile prefetches into L1 4.5 KiB ahead of its k step, and beyond 8 rows the tiles take
//   turns over 128-step chunks.
// - kChunkAhead: the tiles take turns over 64-step chunks (12 KiB of a 48-wide block) and prefetch shares of the
//   next chunk into L2 meanwhile, so that the read overlaps the arithmetic of every tile; a single tile (up to 8
//   rows) prefetches all of it.
// - kHardware: a single tile leaves the stream to the hardware prefetcher; beyond 8 rows the tiles take turns over
//   64-step chunks with no prefetch.
// Every way each accumulator adds its k terms in order, so the mode never changes a product's bits.
enum TilePrefetch : int64_t { kStreamAhead = 0, kChunkAhead = 1, kHardware = 2 };

// A product's `prefetch` argument: the mode of products of one tile (up to 8 rows) in bits 0-1, of several tiles
// in bits 2-3 (graft/cpu/products.py: tile_prefetch_code), which the tiles read as [one tile, several]. The AVX2
// tiles have one scheme and ignore them.
struct TileModes {
  int64_t of[2];
  explicit TileModes(int64_t prefetch) : of{prefetch & 3, prefetch >> 2 & 3} {}
  bool valid() const { return of[0] <= kHardware && of[1] <= kHardware; }
};

#if defined(GRAFT_VECTORS)
// A tile's share of a prefetch: `lines` cache lines from `ahead` spread evenly over `steps` k steps, this k step's
// part of them issued here (`owed` carries the remainder, as in Bresenham's line; nothing where lines is 0, owed
// then staying 0). One test a k step: a second one (lines > 0) made the compiler take two branches a step.
template <int Hint>
inline void prefetch_share(int64_t& owed, int64_t lines, int64_t steps, const char*& ahead) {
  for (owed += lines; owed >= steps; owed -= steps, ahead += 64) _mm_prefetch(ahead, static_cast<_mm_hint>(Hint));
}

// What a block's tiles prefetch while they work on its k steps [k0, k1): the block's next `step` k steps, or after
// its last chunk the first `step` of `next_block` (null: nothing), k_bytes bytes a k step; shared out between
// `tiles` tiles, tile t prefetching lines_of(t) cache lines from ahead(t). Nothing where `wanted` is false.
template <int64_t k_bytes>
struct NextChunk {
  const char* start;
  int64_t lines, share;
  NextChunk(const void* block, const void* next_block, int64_t k1, int64_t k_size, int64_t step, int64_t tiles,
            bool wanted) {
    const bool inside = k1 < k_size;
    start = inside ? static_cast<const char*>(block) + k1 * k_bytes : static_cast<const char*>(next_block);
    lines = wanted && start != nullptr && tiles > 0 ? std::min(step, inside ? k_size - k1 : k_size) * k_bytes / 64 : 0;
    share = tiles > 0 ? (lines + tiles - 1) / tiles : 0;
  }
  const char* ahead(int64_t t) const { return start + std::min(lines, t * share) * 64; }
  int64_t lines_of(int64_t t) const { return std::min(share, lines - std::min(lines, t * share)); }
};
#endif

}  // namespace graft
