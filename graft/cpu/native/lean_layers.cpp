// The lean forward's layer loop in C++ for a few rows (a decode step, a verification).
//
// On a small model on a CPU, a decode step spent about a fifth of its time between the weight-bound products:
// Python running the loop and some twenty small ATen ops per layer (norms, rotary, transposes, SwiGLU), each
// a few microseconds of dispatch and allocation. Here everything between the products is one pass over the rows
// in plain loops: the RMSNorms, Qwen3's per-head q/k norm, the rotary embedding with keys and values written
// straight into the cache, SiLU(gate) * up, and attention for few rows (SDPA cost some 40 us a layer for one
// row). The products are the panel kernel below (AVX-512F, or AVX2 with FMA in 8-float vectors) where it was
// measured faster at load, else oneDNN's packed linear. Activations and caches are float32 (products may read bfloat16 weights: a bfloat16 draft
// head); graft/cpu/native/__init__.py builds it once, and the callers fall back to Python otherwise.
#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#if defined(__AVX512BF16__)
#define GRAFT_BF16_DOT 1  // bfloat16 panels multiplied by vdpbf16ps (bfloat16_panel_products: "dot")
#endif
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define GRAFT_AVX2 1  // the same kernels in 8-float vectors where AVX-512F is missing (an AMD Zen 3)
#endif

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <type_traits>
#include <vector>

namespace {

using LinearPointwise = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                   c10::string_view, c10::List<std::optional<at::Scalar>>,
                                   std::optional<c10::string_view>);

bool present(const at::Tensor& t) { return t.defined() && t.numel() > 0; }

// ---- the panel kernel: small-row float32 products streaming the weights once -------------------------------
//
// oneDNN's packed linear streamed a decode step's weights at 45-54 GB/s on this project's 2-core CPU where the
// memory gives 60-78, and its cost grew quickly with the rows (8 rows: +35%). The panel layout stores W [N, K]
// as [N / B, K, B] for a block width B of 48, 32 or 16 columns, so that one thread reads one block as a single
// contiguous stream, and a register-blocked micro-kernel (up to 8 rows x 3 vectors of 16 columns: 24
// accumulators) reuses each loaded weight vector for every row. Rows beyond 8 run in groups of 8 that take turns
// over chunks of the block, which the later groups read from L1. Blocks are split between threads; the tiles
// read x as it is (row-major: each row a sequential stream). Needs AVX-512F, or AVX2 with FMA (tiles of at most 12 accumulators of 8 floats there); elsewhere
// `panels_supported()` is false. graft/cpu/products.py measures at load which row counts it serves (oneDNN the others).

bool panels_supported() {
#if defined(__AVX512F__) || defined(GRAFT_AVX2)
  return true;
#else
  return false;
#endif
}

// Whether the panels may hold bfloat16 weights, and how they multiply them (bfloat16_panel_products):
// - "widened" (the AVX2 build, for CPUs where oneDNN has no bfloat16 products: an AMD Zen 3): each weight widened
//   to float32 in the registers, float32 activations, the float32 panels' bits for the widened weights;
// - "dot" (AVX512-BF16: an AMD Zen 4, an Intel Sapphire Rapids): weights in k pairs, activations rounded to
//   bfloat16, vdpbf16ps (two multiply-adds a lane an instruction), as oneDNN's bfloat16 products round them;
// - "" (AVX-512F without BF16): none, oneDNN multiplies bfloat16 there.
bool amx_on();  // below: the AMX tiles granted and wanted

std::string bfloat16_panel_products() {
#if defined(GRAFT_AVX2)
  return "widened";
#elif defined(GRAFT_BF16_DOT)
  return amx_on() ? "amx" : "dot";
#else
  return "";
#endif
}

bool bfloat16_panels_supported() { return !bfloat16_panel_products().empty(); }

#if defined(GRAFT_BF16_DOT) && defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define GRAFT_AMX 1  // bfloat16 panels multiplied by AMX tiles (tdpbf16ps) where the kernel grants the tile state
#include <sys/syscall.h>
#include <unistd.h>
#endif

// AMX (an Intel Sapphire Rapids or later): the "dot" panels' layout read by the tile unit, 16 rows x 16 columns x
// 32 k a tdpbf16ps. Linux hands out the tile state only to a process that asks (arch_prctl), once; where it
// refuses, or use_amx(false) turned them off, the dot products serve. A product uses the tiles for every row
// count or for none (K a multiple of 32), so a row's bits never depend on the rows beside it.
bool amx_granted() {
#if defined(GRAFT_AMX)
  static const bool granted = [] {
    constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
  }();
  return granted;
#else
  return false;
#endif
}
bool amx_wanted = true;
bool amx_on() { return amx_wanted && amx_granted(); }
bool use_amx(bool wanted) {
  amx_wanted = wanted;
  return amx_on();
}

#if defined(GRAFT_BF16_DOT)
constexpr bool kDotPanels = true;  // bfloat16 panels in k pairs, x rounded to bfloat16 pairs
#else
constexpr bool kDotPanels = false;
#endif

int64_t panel_width(int64_t out_features) {
  for (int64_t width : {48, 32, 16})
    if (out_features % width == 0) return width;
  return 0;
}

// W [N, K] float32 (or bfloat16 where bfloat16_panels_supported()) -> [N / B, K, B] (B = panel_width(N)).
// The "dot" bfloat16 panels hold each block as k pairs: [K' / 2, B, 2] for K' = K rounded up to even (a zero
// weight pads an odd K), in a tensor shaped [N / B, K', B], element (k, j) of a block at (k / 2) * 2B + 2j + k % 2.
at::Tensor pack_panels(const at::Tensor& weight) {
  TORCH_CHECK(panels_supported(), "the panel kernel needs AVX-512F or AVX2 with FMA");
  const bool narrow = weight.scalar_type() == at::kBFloat16;
  TORCH_CHECK(weight.dim() == 2 && (weight.scalar_type() == at::kFloat || narrow), "weight: [out, in] float32",
              bfloat16_panels_supported() ? " or bfloat16" : "", ", not ", weight.scalar_type());
  TORCH_CHECK(!narrow || bfloat16_panels_supported(),
              "bfloat16 panels need the AVX2 build or AVX512-BF16 (this one has AVX-512F without BF16)");
  const int64_t n = weight.size(0), k = weight.size(1), width = panel_width(n);
  TORCH_CHECK(width > 0, "the panel kernel needs out_features divisible by 16, not ", n);
  if (narrow && kDotPanels) {
    const at::Tensor even = k % 2 == 0 ? weight.contiguous() : at::constant_pad_nd(weight, {0, 1});
    const int64_t pairs = (k + 1) / 2;
    return even.view({n / width, width, pairs, 2}).permute({0, 2, 1, 3}).contiguous().view({n / width, 2 * pairs, width});
  }
  return weight.contiguous().view({n / width, width, k}).transpose(1, 2).contiguous();
}

#if defined(__AVX512F__) || defined(GRAFT_AVX2)
// A tile's share of a prefetch: `lines` cache lines from `ahead` spread evenly over `steps` k steps, this k step's
// part of them issued here (`owed` carries the remainder, as in Bresenham's line; nothing where lines is 0).
template <int Hint>
inline void prefetch_share(int64_t& owed, int64_t lines, int64_t steps, const char*& ahead) {
  for (owed += lines; owed >= steps && lines > 0; owed -= steps, ahead += 64)
    _mm_prefetch(ahead, static_cast<_mm_hint>(Hint));
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

#ifdef __AVX512F__
constexpr int kLanes = 16;  // floats per vector

// How the AVX-512F tiles prefetch their weight stream; the machines this ran on disagreed, so graft/cpu/products.py times
// the modes at load (hardware.kernels: tile_prefetch), for products of one tile (up to 8 rows) and of several
// apart, and sets each with set_tile_prefetch (before kChunkAhead took single tiles, an AMX Xeon ran 8 rows 14%
// faster streaming ahead and 16 rows 24% faster chunking ahead, in one process):
// - kStreamAhead: every tile prefetches into L1 4.5 KiB ahead of its k step, and beyond 8 rows the tiles take
//   turns over 128-step chunks. On an AMD Zen 5 (2 threads) 5-8 rows went from 15.2-15.7 ms to 13.3-13.8 ms for
//   the embedded model's products with it.
// - kChunkAhead: the tiles take turns over 64-step chunks (12 KiB of a 48-wide block) and prefetch shares of the
//   next chunk into L2 meanwhile, so that the read overlaps the arithmetic of every tile; a single tile (up to 8
//   rows) prefetches all of it. On the AMX Xeon the embedded model's products took 22.9 / 23.5 / 24.7 ms at
//   1 / 4 / 8 rows so, against 23.1 / 25.4 / 29.2 with kStreamAhead and 23.1 / 29.8 / 34.8 with kHardware.
// - kHardware: a single tile leaves the stream to the hardware prefetcher; beyond 8 rows the tiles take turns over
//   64-step chunks with no prefetch. (Before the single tile's chunks, kChunkAhead was this for one tile: on an AMD
//   Zen 4 (2 threads) the products took 13.5 / 14.6 / 23 / 30 ms at 1 / 2 / 12 / 16 rows against 15.8 / 17.3 / 30 /
//   38 ms with kStreamAhead (8 rows alike); prefetching the chunk into L1 instead left 16 rows at 27 ms (layers
//   only, against 23).)
// Every way each accumulator adds its k terms in order, so the mode never changes a product's bits.
enum TilePrefetch : int64_t { kStreamAhead = 0, kChunkAhead = 1, kHardware = 2 };
int64_t tile_prefetch_modes[2] = {kStreamAhead, kStreamAhead};  // [one tile, several tiles]

// `tiles`: 0 the mode of products of one tile (up to 8 rows), 1 of several, -1 both.
void set_tile_prefetch(int64_t mode, int64_t tiles) {
  TORCH_CHECK(mode == kStreamAhead || mode == kChunkAhead || mode == kHardware,
              "tile prefetch mode 0 (stream ahead), 1 (chunk ahead) or 2 (hardware), not ", mode);
  TORCH_CHECK(tiles >= -1 && tiles <= 1, "tiles: 0 (one tile), 1 (several) or -1 (both), not ", tiles);
  if (tiles != 1) tile_prefetch_modes[0] = mode;
  if (tiles != 0) tile_prefetch_modes[1] = mode;
}
int64_t tile_prefetch(int64_t tiles) {
  TORCH_CHECK(tiles == 0 || tiles == 1, "tiles: 0 (one tile) or 1 (several), not ", tiles);
  return tile_prefetch_modes[tiles];
}

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
// TilePrefetch), and the rows are shared out evenly (10 rows: 5 + 5, not 8 + 2), so that no tile has too few
// accumulators to hide the multiply-add's latency (vdpbf16ps: 6 cycles on an AMD Zen 4, one a cycle; a 2-row tile
// of a 32-wide block holds 4). E: float (float32 weights) or uint32_t (bfloat16 pairs, k_size counting pairs).
template <int V, typename E>
void panel_block(const E* x, int64_t rows, const E* block, int64_t k_size, float* y, int64_t n_size, int64_t n0,
                 const E* next_block) {
  using Step = StepOf<E>;
  constexpr int tile = 8;
  constexpr int64_t k_bytes = 16 * V * sizeof(E);
  const bool multi = rows > tile;
  const int64_t mode = tile_prefetch_modes[multi ? 1 : 0];
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
#elif defined(GRAFT_AVX2)
constexpr int kLanes = 8;
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
// next chunk). A single tile over a whole block (one or two rows) prefetches nothing: on an AMD Zen 3 (2 threads,
// 15-20 GB/s) the embedded model's products at one row took 27.5-32.6 ms without a prefetch, 32.4-36.1 ms with
// one 1-4.5 KiB ahead.
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
// per row (14 loads for 12 FMAs a k step) and took 4, 8 rows through four tiles in turn. Here a tile is 4 rows x 24
// columns with its three weight vectors held in registers (7 loads for 12 FMAs), and the block is worked in two
// column halves that take turns over 32-step chunks, prefetching the next chunk as panel_block does. On an AMD
// Zen 3 (2 threads) the embedded model's products took 19.4 / 18.3 / 18.7 / 18.2 / 19.7 ms at 4 / 5 / 6 / 7 / 8
// rows against 22.5 / 21.9 / 22.7 / 23.9 / 24.0 with the 2-row tiles (one row: 16.4); at 12 and 16 rows they were
// slower (27.4 and 35.4 ms against 26.2 and 31.9), so beyond 8 rows the 2-row tiles stay.
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

void half_block(const float* x, int64_t rows, const float* block, int64_t k_size, float* y, int64_t n_size, int64_t n0,
                const float* next_block) {
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
// chunk (or of `next_block`'s first) meanwhile, so that its read overlaps their arithmetic. Without that, the
// read and the arithmetic took turns: 8 rows of the embedded model's products took 48.7 ms against 30.4 with it,
// 16 rows 77.9 against 40.9 (a scratch benchmark on an AMD Zen 3, 2 threads; one row took 23.3).
template <int V, typename W>
void panel_block(const float* x, int64_t rows, const W* block, int64_t k_size, float* y, int64_t n_size, int64_t n0,
                 const W* next_block) {
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
#endif

#ifndef __AVX512F__
// The AVX2 tiles have one prefetch scheme (their panel_block's), so no modes to choose between.
void set_tile_prefetch(int64_t mode, int64_t) {
  TORCH_CHECK(false, "tile prefetch modes are the AVX-512F build's, not ", mode);
}
int64_t tile_prefetch(int64_t) { return -1; }
#endif

// The blocks of one product over the threads, each thread's tiles prefetching into its next block.
template <typename X, typename W>
void panel_blocks(const X* xp, int64_t rows, const W* wp, int64_t blocks, int64_t k_size, int64_t width,
                  float* yp) {
#if defined(__AVX512F__) || defined(GRAFT_AVX2)
  const int64_t n_size = blocks * width;
  at::parallel_for(0, blocks, 1, [&](int64_t first, int64_t last) {
    for (int64_t b = first; b < last; ++b) {
      const W* block = wp + b * k_size * width;
      const W* next = b + 1 < last ? block + k_size * width : nullptr;
      if (width == 48) panel_block<48 / kLanes>(xp, rows, block, k_size, yp, n_size, b * width, next);
      else if (width == 32) panel_block<32 / kLanes>(xp, rows, block, k_size, yp, n_size, b * width, next);
      else panel_block<16 / kLanes>(xp, rows, block, k_size, yp, n_size, b * width, next);
    }
  });
#endif
}

#if defined(GRAFT_BF16_DOT)
// One row of x rounded to bfloat16 (vcvtne2ps2bf16: to nearest even) in k pairs,
// a zero after an odd last value. Row by row, so that a value's rounding never depends on the rows beside it.
void round_to_pairs(const float* x, int64_t k_size, uint32_t* pairs) {
  int64_t k = 0;
  for (; k + 32 <= k_size; k += 32) {
    const __m512bh both = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + k + 16), _mm512_loadu_ps(x + k));
    _mm512_storeu_si512(pairs + k / 2, (__m512i)both);
  }
  if (k < k_size) {  // the last values through the same instruction, zeros after them
    alignas(64) float rest[32] = {};
    std::memcpy(rest, x + k, (k_size - k) * sizeof(float));
    alignas(64) uint32_t rounded[16];
    _mm512_store_si512(rounded, (__m512i)_mm512_cvtne2ps_pbh(_mm512_load_ps(rest + 16), _mm512_load_ps(rest)));
    std::memcpy(pairs + k / 2, rounded, (k_size - k + 1) / 2 * sizeof(uint32_t));
  }
}
#endif

#if defined(GRAFT_AMX)
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0 .. 5 hold y: one 16-column group of a block for up to 16 rows each (float32), tile 3 G + v the group
// v of row group g; tile 6 x's rows for 16 k pairs, tile 7 the weights of one group for those pairs (16 pairs x
// 16 columns x 2).
void configure_tiles(int64_t rows) {
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
void amx_blocks(const uint32_t* x_pairs, int64_t rows, int64_t k_pairs, const uint16_t* wp, int64_t blocks,
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
#endif

// x [M, K] float32 @ W^T (+ bias) with W as pack_panels left it: [N / B, K, B] (bfloat16 "dot" panels: in k pairs,
// x rounded to bfloat16). Returns [M, N] float32.
at::Tensor panel_linear(const at::Tensor& x, const at::Tensor& panels, const at::Tensor& bias) {
  TORCH_CHECK(panels_supported(), "the panel kernel needs AVX-512F or AVX2 with FMA");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "x: [rows, in] float32");
  const bool pairs = kDotPanels && panels.scalar_type() == at::kBFloat16;
  const int64_t laid_out = pairs ? x.size(1) + x.size(1) % 2 : x.size(1);  // the dot panels pad an odd K
  TORCH_CHECK(panels.dim() == 3 && panels.size(1) == laid_out, "panels [N / B, ", laid_out, ", B] for x's ",
              x.size(1), " features");
  const int64_t rows = x.size(0), k_size = x.size(1), blocks = panels.size(0), width = panels.size(2);
  const int64_t n_size = blocks * width;
  at::Tensor y = at::empty({rows, n_size}, x.options());
  if (rows == 0) return y;
#if defined(__AVX512F__) || defined(GRAFT_AVX2)
  // The tiles read x row-major. The AVX-512F tiles used to read x^T, built serially before every product while
  // the other threads waited: on an AMD Zen 4 (2 threads) the embedded model's products took 21.8 / 24.1 / 29.2 ms
  // at 8 / 12 / 16 rows reading x as it is, against 26.3 / 26.8 / 33.1 with the transposition.
  const at::Tensor xc = x.contiguous();
  const float* xp = xc.data_ptr<float>();
  if (panels.scalar_type() == at::kBFloat16) {
#if defined(GRAFT_AVX2)
    const auto* wp = reinterpret_cast<const uint16_t*>(panels.data_ptr<at::BFloat16>());
    panel_blocks(xp, rows, wp, blocks, k_size, width, y.data_ptr<float>());
#elif defined(GRAFT_BF16_DOT)
    const int64_t k_pairs = laid_out / 2;
    std::vector<uint32_t> x_pairs(rows * k_pairs);
    for (int64_t r = 0; r < rows; ++r) round_to_pairs(xp + r * k_size, k_size, x_pairs.data() + r * k_pairs);
#if defined(GRAFT_AMX)
    if (k_pairs % 16 == 0 && amx_on()) {
      const int64_t padded = rows > 16 ? (rows + 15) / 16 * 16 : rows;
      x_pairs.resize(padded * k_pairs, 0u);
      at::Tensor out = padded > rows ? at::empty({padded, n_size}, x.options()) : y;
      const auto* w16 = reinterpret_cast<const uint16_t*>(panels.data_ptr<at::BFloat16>());
      amx_blocks(x_pairs.data(), padded, k_pairs, w16, blocks, width, out.data_ptr<float>());
      y = out.narrow(0, 0, rows);
      return present(bias) ? y.add_(bias) : y;
    }
#endif
    const auto* wp = reinterpret_cast<const uint32_t*>(panels.data_ptr<at::BFloat16>());
    panel_blocks(x_pairs.data(), rows, wp, blocks, k_pairs, width, y.data_ptr<float>());
#else
    TORCH_CHECK(false, "bfloat16 panels need the AVX2 build or AVX512-BF16");
#endif
  } else {
    panel_blocks(xp, rows, panels.data_ptr<float>(), blocks, k_size, width, y.data_ptr<float>());
  }
#endif
  return present(bias) ? y.add_(bias) : y;
}

// One product. One row reads `one_row` where present: W_t [K, N] (x @ W_t) kept beside the panels where it measured
// faster at one row (a decode step) than the panels, which serve 2 .. `small_rows` rows. Up to `small_rows` rows it
// reads `small`, the weights laid out for few rows: the panels (the panel kernel) or W_t [K, N] (x @ W_t, one row);
// above, `packed`: oneDNN's layout, or the panels where oneDNN's copy was dropped. Which layout serves which rows
// was measured at load (graft/cpu/products.py).
at::Tensor product(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& small, const at::Tensor& one_row,
                   const at::Tensor& bias, int64_t small_rows) {
  const bool first = present(one_row) && x.size(0) == 1;
  if (first || (present(small) && x.size(0) <= small_rows)) {
    const at::Tensor& few = first ? one_row : small;
    if (few.dim() == 3) return panel_linear(x, few, bias);
    at::Tensor y = at::mm(x, few);
    return present(bias) ? y.add_(bias) : y;
  }
  if (packed.dim() == 3) return panel_linear(x, packed, bias);  // float32 or bfloat16 panels
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
                       .typed<LinearPointwise>();
  std::optional<at::Tensor> b = present(bias) ? std::optional<at::Tensor>(bias) : std::nullopt;
  const bool half = packed.scalar_type() == at::kBFloat16;  // a bfloat16 head's weights: activations stay float32
  at::Tensor y = op.call(half ? x.to(at::kBFloat16) : x, packed, b, "none", c10::List<std::optional<at::Scalar>>(),
                         c10::string_view(""));
  return half ? y.to(at::kFloat) : y;
}

// A layer's tensors in graft/cpu/native/__init__.py's LAYER_FIELDS order: each product as four (packed, small, one_row,
// bias) from its first index; the EAGLE-3 head's hidden norm appended after them.
enum LayerField : int {
  kInputNorm = 0,
  kQkv = 1,
  kO = 5,
  kPostNorm = 9,
  kGateUp = 10,
  kDown = 14,
  kQkNorm = 18,
  kHiddenNorm = 19,
};

at::Tensor product_of(const at::Tensor& x, const at::Tensor* w, int field, int64_t small_rows) {
  return product(x, w[field], w[field + 1], w[field + 2], w[field + 3], small_rows);
}

// Sum of squares vectorised (omp simd lets the compiler reorder the float reduction).
inline float inverse_rms(const float* x, int64_t d, float eps) {
  float squares = 0.f;
#pragma omp simd reduction(+ : squares)
  for (int64_t i = 0; i < d; ++i) squares += x[i] * x[i];
  return 1.f / std::sqrt(squares / static_cast<float>(d) + eps);
}

// out[r] = weight * (x[r] * rsqrt(mean(x[r]^2) + eps)), as transformers' RMSNorm in float32.
at::Tensor rms_norm_rows(const at::Tensor& x, const at::Tensor& weight, float eps) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == at::kFloat, "x: contiguous [n, d] float32");
  TORCH_CHECK(weight.is_contiguous() && weight.scalar_type() == at::kFloat && weight.numel() == x.size(1),
              "weight: contiguous [d] float32");
  const int64_t rows = x.size(0), d = x.size(1);
  at::Tensor out = at::empty_like(x);
  const float* src = x.data_ptr<float>();
  const float* w = weight.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = src + r * d;
    const float inv = inverse_rms(row, d, eps);
    float* o = dst + r * d;
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) o[i] = w[i] * (row[i] * inv);
  }
  return out;
}

// One head of one row: optionally RMS-normed per head (Qwen3's q_norm / k_norm), then rotated (rotate-half).
inline void norm_rotate(const float* x, const float* norm_weight, const float* cos, const float* sin, float* out,
                        int64_t d, float eps, float* scratch) {
  const float* src = x;
  if (norm_weight != nullptr) {
    const float inv = inverse_rms(x, d, eps);
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) scratch[i] = norm_weight[i] * (x[i] * inv);
    src = scratch;
  }
  const int64_t half = d / 2;
#pragma omp simd
  for (int64_t i = 0; i < half; ++i) out[i] = src[i] * cos[i] - src[i + half] * sin[i];
#pragma omp simd
  for (int64_t i = half; i < d; ++i) out[i] = src[i] * cos[i] + src[i - half] * sin[i];
}

#ifdef __AVX512F__
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

// Softmax attention of n query rows over the cache, for head_dim = 16 V. The G query heads sharing a key/value
// head and all n rows (F = G n queries) are one work item, split in two where the key/value heads are fewer than
// twice the threads: each block of 16 keys is read once for all its queries (first the scores, then, after each
// query's softmax, the weighted values), because reading the cache once per query made verifications of many
// rows over a long context cost several times a decode step's attention. Per query: scores against every visible
// key (mask row i added, or causal from `start`), softmax, weighted sum of values. A query's result does not
// depend on the other queries or on masked positions (their weights are exactly 0, and the sums run over the
// kept keys in key order), so a token's attention is the same bits in a decode step and in a verification.
// query [heads, n, d]; keys, values [kv_heads, capacity, d]; mask [n, mask_stride] or null; out [n, heads * d].
template <int V>
void few_row_attention(const float* query, const float* keys, const float* values, int64_t capacity, int64_t n,
                       int64_t start, int64_t heads, int64_t kv_heads, const float* mask, int64_t mask_stride,
                       float scaling, float* out) {
  constexpr int64_t d = 16 * V;
  const int64_t groups = heads / kv_heads, total = start + n, queries = groups * n;
  const int64_t parts = queries > 1 && kv_heads < 2 * at::get_num_threads() ? 2 : 1;
  const int64_t per_part = (queries + parts - 1) / parts;
  at::parallel_for(0, kv_heads * parts, 1, [&](int64_t first, int64_t last) {
    const int64_t stride = total + 16;
    std::vector<float> scores(per_part * stride), kept(total + 16), sums(per_part);
    const std::vector<float> zeros(total + 16, 0.f);
    for (int64_t item = first; item < last; ++item) {
      const int64_t g = item / parts, lo = (item % parts) * per_part, hi = std::min(queries, lo + per_part);
      if (lo >= hi) continue;
      const float* k_head = keys + g * capacity * d;
      const float* v_head = values + g * capacity * d;
      // folded query f = member * n + row: head g * groups + member, row i
      auto row_of = [&](int64_t f) { return f % n; };
      auto head_of = [&](int64_t f) { return g * groups + f / n; };
      auto visible_of = [&](int64_t f) { return mask != nullptr ? total : start + row_of(f) + 1; };
      std::vector<float> best(hi - lo, -INFINITY);
      for (int64_t s0 = 0; s0 < total; s0 += 16) {  // scores, 16 keys at a time for every query
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
            const float* key = k_head + (s0 + j) * d;
            products[j] = _mm512_mul_ps(qv[0], _mm512_loadu_ps(key));
            for (int v = 1; v < V; ++v) products[j] = _mm512_fmadd_ps(qv[v], _mm512_loadu_ps(key + 16 * v), products[j]);
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
          for (int v = 0; v < V; ++v) value[v] = _mm512_loadu_ps(v_head + s * d + 16 * v);
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
#elif defined(GRAFT_AVX2)
// The AVX-512F attention below in 8-float vectors (AVX2 + FMA): 8 keys a block, lane masks as integer vectors,
// the kept weights packed in key order by a scalar loop (AVX2 has no compress), 2^k built in the exponent bits.
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

// Scores of 4 keys (rows of `key`, head_dim 8 V apart; those from `live` on are 0) for query q0 and, with Pair,
// q1: each key vector loaded once for both. A key's score is its lanes' products summed in one tree,
// ((0+1)+(2+3)) + ((4+5)+(6+7)), whether or not the query is paired.
template <int V, bool Pair>
inline void four_key_scores(const float* q0, const float* q1, const float* key, int live, __m128* sums4) {
  constexpr int64_t d = 8 * V;
  __m256 products[2][4];
  for (int j = 0; j < 4; ++j) products[0][j] = products[1][j] = _mm256_setzero_ps();
  for (int v = 0; v < V && live > 0; ++v) {
    const __m256 a = _mm256_loadu_ps(q0 + 8 * v);
    const __m256 b = Pair ? _mm256_loadu_ps(q1 + 8 * v) : a;
    for (int j = 0; j < 4; ++j) {  // a fixed bound with a break: the accumulators stay in registers
      if (j >= live) break;
      const __m256 k = _mm256_loadu_ps(key + j * d + 8 * v);
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
template <int V, int R, int C>
inline void weighted_values(const float* const* weights, const float* v_head, int c0, int64_t b0, int64_t b1,
                            float* partial) {
  constexpr int64_t d = 8 * V;
  __m256 a[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) a[r][c] = _mm256_loadu_ps(partial + r * d + 8 * (c0 + c));
  for (int64_t s = b0; s < b1; ++s) {
    const float* value = v_head + s * d + 8 * c0;
    for (int r = 0; r < R; ++r) {
      const __m256 w = _mm256_broadcast_ss(weights[r] + s);
      for (int c = 0; c < C; ++c) a[r][c] = _mm256_fmadd_ps(w, _mm256_loadu_ps(value + 8 * c), a[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) _mm256_storeu_ps(partial + r * d + 8 * (c0 + c), a[r][c]);
}

// As the AVX-512F few_row_attention, for head_dim = 8 V; same arguments, same guarantees.
template <int V>
void few_row_attention(const float* query, const float* keys, const float* values, int64_t capacity, int64_t n,
                       int64_t start, int64_t heads, int64_t kv_heads, const float* mask, int64_t mask_stride,
                       float scaling, float* out) {
  constexpr int64_t d = 8 * V;
  const int64_t groups = heads / kv_heads, total = start + n, queries = groups * n;
  const int64_t parts = queries > 1 && kv_heads < 2 * at::get_num_threads() ? 2 : 1;
  const int64_t per_part = (queries + parts - 1) / parts;
  at::parallel_for(0, kv_heads * parts, 1, [&](int64_t first, int64_t last) {
    const int64_t stride = total + 8;
    std::vector<float> scores(per_part * stride), kept(total + 8), sums(per_part), scaled(per_part * d);
    std::vector<float> partial(per_part * d);  // the weighted values' running sums
    for (int64_t item = first; item < last; ++item) {
      const int64_t g = item / parts, lo = (item % parts) * per_part, hi = std::min(queries, lo + per_part);
      if (lo >= hi) continue;
      const float* k_head = keys + g * capacity * d;
      const float* v_head = values + g * capacity * d;
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
            const float* key = k_head + (s0 + 4 * half) * d;
            __m128 sums4[2];
            if (pair) four_key_scores<V, true>(q0, q1, key, live, sums4);
            else four_key_scores<V, false>(q0, q1, key, live, sums4);
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
              for (int c0 = 0; c0 < V; c0 += C) weighted_values<V, R, C>(weights, v_head, c0, b0, b1, rows);
            else
              for (int c0 = 0; c0 < V; c0 += C1) weighted_values<V, 1, C1>(weights, v_head, c0, b0, b1, rows);
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
#endif

// Attention over the cache for n new rows: q/k (optionally normed per head) rotated, keys and values written
// at rows start.. of the cache, then attention over rows 0..start + n - 1 (few_row_attention, or SDPA for other
// head sizes or without AVX-512F or AVX2). qkv [n, (heads + 2 kv_heads) * d];
// mask [1, 1, groups * n, S] additive (tiled along the folded query axis), or empty: causal for n > 1.
// Returns [n, heads * d].
at::Tensor attend(const at::Tensor& qkv, int64_t heads, int64_t kv_heads, int64_t d, const at::Tensor& qk_norm,
                  const float* cos, const float* sin, const at::Tensor& keys, const at::Tensor& values, int64_t start,
                  const at::Tensor& mask, double scaling, float eps) {
  const int64_t n = qkv.size(0), qk_heads = heads + kv_heads, groups = heads / kv_heads, capacity = keys.size(2);
  TORCH_CHECK(keys.is_contiguous() && values.is_contiguous() && keys.scalar_type() == at::kFloat &&
                  values.scalar_type() == at::kFloat,
              "contiguous float32 cache keys and values");
  TORCH_CHECK(start + n <= capacity, "the cache holds ", capacity, " positions, not ", start + n);
  at::Tensor query = at::empty({1, heads, n, d}, qkv.options());  // [1, heads, n, head_dim]
  const float* src = qkv.data_ptr<float>();
  const float* norm = present(qk_norm) ? qk_norm.data_ptr<float>() : nullptr;
  float* q = query.data_ptr<float>();
  float* k_cache = keys.data_ptr<float>();  // [1, kv_heads, capacity, head_dim]
  float* v_cache = values.data_ptr<float>();
  const int64_t row_width = (heads + 2 * kv_heads) * d;
  std::vector<float> scratch(d);
  for (int64_t i = 0; i < n; ++i) {
    const float* row = src + i * row_width;
    for (int64_t j = 0; j < qk_heads; ++j) {
      float* out = j < heads ? q + (j * n + i) * d : k_cache + ((j - heads) * capacity + start + i) * d;
      norm_rotate(row + j * d, norm ? norm + j * d : nullptr, cos + i * d, sin + i * d, out, d, eps, scratch.data());
    }
    for (int64_t j = 0; j < kv_heads; ++j) std::copy_n(row + (qk_heads + j) * d, d, v_cache + (j * capacity + start + i) * d);
  }
#if defined(__AVX512F__) || defined(GRAFT_AVX2)
  auto few_rows = d == 16 ? few_row_attention<16 / kLanes> : d == 32 ? few_row_attention<32 / kLanes>
                : d == 64 ? few_row_attention<64 / kLanes> : d == 128 ? few_row_attention<128 / kLanes> : nullptr;
  if (few_rows != nullptr && (!present(mask) || (mask.is_contiguous() && mask.scalar_type() == at::kFloat))) {
    at::Tensor merged = at::empty({n, heads * d}, qkv.options());  // [n, heads * head_dim]
    const float* rows_mask = present(mask) ? mask.data_ptr<float>() : nullptr;  // its first tile: rows 0..n-1
    const int64_t stride = present(mask) ? mask.size(-1) : 0;
    few_rows(q, k_cache, v_cache, capacity, n, start, heads, kv_heads, rows_mask, stride, static_cast<float>(scaling),
             merged.data_ptr<float>());
    return merged;
  }
#endif
  at::Tensor k = keys.narrow(2, 0, start + n), v = values.narrow(2, 0, start + n);
  at::Tensor attended;  // [1, heads, n, head_dim]
  if (present(mask)) {  // query heads sharing a key/value head folded into the query axis: the cache read in place
    // the folded axis needs the mask tiled once a group (a caller may pass it tiled, or n rows as the few-row path reads it)
    std::vector<int64_t> times(mask.dim(), 1);
    times[mask.dim() - 2] = groups;
    const at::Tensor tiled = groups > 1 && mask.size(-2) == n ? mask.repeat(times) : mask;
    attended =
        at::scaled_dot_product_attention(query.view({1, kv_heads, groups * n, d}), k, v, tiled, 0.0, false, scaling)
            .view({1, heads, n, d});
  } else {
    attended = at::scaled_dot_product_attention(query, k, v, std::nullopt, 0.0, n > 1, scaling, groups > 1);
  }
  return attended.transpose(1, 2).reshape({n, heads * d});
}

// SiLU(g) * u elementwise over `count` floats. SiLU through e = exp(-|g|) (exp_nonpositive, where the build has
// it): g / (1 + e) for g >= 0, g e / (1 + e) below. glibc's scalar expf here was a serial 2-4% of a verification
// of 8 tokens on the embedded model (8 x 1,536 per layer) while the other threads waited.
inline void silu_times(const float* g, const float* u, float* o, int64_t count) {
  int64_t t = 0;
#if defined(__AVX512F__)
  const __m512 one = _mm512_set1_ps(1.f), sign = _mm512_set1_ps(-0.f);
  for (; t + 16 <= count; t += 16) {
    const __m512 x = _mm512_loadu_ps(g + t);
    const __m512 e = exp_nonpositive(_mm512_or_ps(x, sign));  // exp(-|x|)
    const __mmask16 negative = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
    const __m512 top = _mm512_mask_mul_ps(x, negative, x, e);
    _mm512_storeu_ps(o + t, _mm512_mul_ps(_mm512_div_ps(top, _mm512_add_ps(one, e)), _mm512_loadu_ps(u + t)));
  }
#elif defined(GRAFT_AVX2)
  const __m256 one = _mm256_set1_ps(1.f), sign = _mm256_set1_ps(-0.f);
  for (; t + 8 <= count; t += 8) {
    const __m256 x = _mm256_loadu_ps(g + t);
    const __m256 e = exp_nonpositive(_mm256_or_ps(x, sign));
    const __m256 negative = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ);
    const __m256 top = _mm256_blendv_ps(x, _mm256_mul_ps(x, e), negative);
    _mm256_storeu_ps(o + t, _mm256_mul_ps(_mm256_div_ps(top, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + t)));
  }
#endif
  for (; t < count; ++t) o[t] = g[t] / (1.f + std::exp(-g[t])) * u[t];
}

// SiLU(gate) * up for gate_up [n, 2 * inner] -> [n, inner].
at::Tensor swiglu(const at::Tensor& gate_up) {
  const int64_t n = gate_up.size(0), inner = gate_up.size(1) / 2;
  at::Tensor act = at::empty({n, inner}, gate_up.options());
  const float* gu = gate_up.data_ptr<float>();
  float* a = act.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) silu_times(gu + i * 2 * inner, gu + i * 2 * inner + inner, a + i * inner, inner);
  return act;
}

// A decoder layer after its input norm: attention reads `input` [n, width] (the normed residual, or a head's
// wider [norm(embeds); norm(hidden)]), both sublayers add into `residual` [n, hidden]; w in LAYER_FIELDS order.
at::Tensor decoder_layer(const at::Tensor& input, const at::Tensor& residual, const at::Tensor* w,
                         const at::Tensor& keys, const at::Tensor& values, const float* cos, const float* sin,
                         const at::Tensor& mask, int64_t start, int64_t heads, int64_t kv_heads, int64_t head_dim,
                         float eps, double scaling, int64_t small_rows) {
  at::Tensor qkv = product_of(input, w, kQkv, small_rows);
  at::Tensor merged =
      attend(qkv, heads, kv_heads, head_dim, w[kQkNorm], cos, sin, keys, values, start, mask, scaling, eps);
  at::Tensor x = residual + product_of(merged, w, kO, small_rows);
  at::Tensor gate_up = product_of(rms_norm_rows(x, w[kPostNorm], eps), w, kGateUp, small_rows);
  return x + product_of(swiglu(gate_up), w, kDown, small_rows);
}

}  // namespace

// x [n, hidden] float32; per layer `per_layer` tensors (see graft/cpu/native/__init__.py: LAYER_FIELDS), an empty
// tensor standing for an absent one; each layer's cache keys and values [1, kv_heads, capacity, head_dim]; cos,
// sin [n, head_dim]; mask as attend's; cache rows start..start + n - 1 are written.
// tap_flags[layer]: 1 capture the layer's input, 2 its output. Returns [x, captured...] in layer order.
std::vector<at::Tensor> lean_layers(at::Tensor x, const std::vector<at::Tensor>& weights, int64_t per_layer,
                                    const std::vector<at::Tensor>& keys_per_layer,
                                    const std::vector<at::Tensor>& values_per_layer, const at::Tensor& cos,
                                    const at::Tensor& sin, const at::Tensor& mask, int64_t start, int64_t heads,
                                    int64_t kv_heads, int64_t head_dim, double eps, double scaling,
                                    int64_t small_rows, const std::vector<int64_t>& tap_flags) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous(), "x: contiguous [n, hidden] float32");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous(), "cos, sin: contiguous [n, head_dim]");
  const int64_t num_layers = static_cast<int64_t>(weights.size()) / per_layer;
  TORCH_CHECK(static_cast<int64_t>(keys_per_layer.size()) == num_layers &&
                  static_cast<int64_t>(values_per_layer.size()) == num_layers &&
                  static_cast<int64_t>(tap_flags.size()) == num_layers,
              "one cache layer and one tap flag per layer");
  const float feps = static_cast<float>(eps);
  std::vector<at::Tensor> result{x};
  for (int64_t layer = 0; layer < num_layers; ++layer) {
    const at::Tensor* w = weights.data() + layer * per_layer;
    if (tap_flags[layer] & 1) result.push_back(x);
    x = decoder_layer(rms_norm_rows(x, w[kInputNorm], feps), x, w, keys_per_layer[layer], values_per_layer[layer],
                      cos.data_ptr<float>(), sin.data_ptr<float>(), mask, start, heads, kv_heads, head_dim, feps,
                      scaling, small_rows);
    if (tap_flags[layer] & 2) result.push_back(x);
  }
  result[0] = x;
  return result;
}

// An EAGLE draft head's decoder layer for n entries: the attention reads [norm(embeds); hidden_norm(hidden)]
// (EAGLE-3; `embeds` empty for EAGLE-1, whose layer reads `hidden`, fc's output, as it is), the residual
// stream is `hidden` [n, H]. `weights` in LAYER_FIELDS order with the EAGLE-3 norms at input_norm (embeds),
// post_norm, and hidden_norm appended; cache, cos, sin and mask as lean_layers'. Returns the new hidden [n, H].
at::Tensor head_layer(const at::Tensor& embeds, const at::Tensor& hidden, const std::vector<at::Tensor>& w,
                      const at::Tensor& keys, const at::Tensor& values, const at::Tensor& cos, const at::Tensor& sin,
                      const at::Tensor& mask, int64_t start, int64_t heads, int64_t kv_heads, int64_t head_dim,
                      double eps, double scaling, int64_t small_rows) {
  TORCH_CHECK(hidden.scalar_type() == at::kFloat && hidden.dim() == 2 && hidden.is_contiguous(),
              "hidden: contiguous [n, H] float32");
  const float feps = static_cast<float>(eps);
  at::Tensor input = hidden;
  if (present(embeds)) {  // EAGLE-3: both halves normed straight into one [n, 2H] row
    TORCH_CHECK(embeds.sizes() == hidden.sizes() && embeds.is_contiguous(), "embeds: contiguous, as hidden");
    const int64_t n = hidden.size(0), width = hidden.size(1);
    input = at::empty({n, 2 * width}, hidden.options());
    at::Tensor both = input.view({n, 2, width});
    both.select(1, 0).copy_(rms_norm_rows(embeds, w[kInputNorm], feps));
    both.select(1, 1).copy_(rms_norm_rows(hidden, w[kHiddenNorm], feps));
  }
  return decoder_layer(input, hidden, w.data(), keys, values, cos.data_ptr<float>(), sin.data_ptr<float>(), mask, start,
                       heads, kv_heads, head_dim, feps, scaling, small_rows);
}

// Each row's k largest values, largest first, equal values in index order (k = 1 is torch.argmax: the first
// maximum). A verification's acceptance and the recycling table read the argmax and the top-8 of every node's
// logits over the whole vocabulary; ATen's argmax and topk took 190 and 280 us for 8 rows of 49,152 here, some
// 2 GB/s. One pass compares 8 values at a time with the row's current k-th value and inserts only from the rare
// blocks holding a larger one. Returns values [n, k], indices [n, k] and `unordered` (a row held a NaN, whose
// order torch defines otherwise: the caller falls back to ATen).
std::vector<at::Tensor> row_topk(const at::Tensor& x, int64_t k) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous(), "x: contiguous [n, V] float32");
  const int64_t n = x.size(0), width = x.size(1);
  TORCH_CHECK(k >= 1 && k <= width, "k must be in 1..", width, "; got ", k);
  at::Tensor values = at::empty({n, k}, x.options());
  at::Tensor indices = at::empty({n, k}, x.options().dtype(at::kLong));
  std::vector<uint8_t> nan_rows(n, 0);
  const float* xp = x.data_ptr<float>();
  float* vp = values.data_ptr<float>();
  int64_t* ip = indices.data_ptr<int64_t>();
  at::parallel_for(0, n, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* row = xp + r * width;
      float* best = vp + r * k;
      int64_t* where = ip + r * k;
      int64_t held = 0;
      bool nan = false;
      auto offer = [&](int64_t j) {  // insert after every equal value: the earlier index stays first
        const float v = row[j];
        if (std::isnan(v)) {
          nan = true;
          return;
        }
        if (held == k && !(v > best[k - 1])) return;
        int64_t p = held < k ? held++ : k - 1;
        for (; p > 0 && best[p - 1] < v; --p) {
          best[p] = best[p - 1];
          where[p] = where[p - 1];
        }
        best[p] = v;
        where[p] = j;
      };
      int64_t j = 0;
      for (; j < width && held < k; ++j) offer(j);
#if defined(__AVX512F__) || defined(GRAFT_AVX2)  // where immintrin.h is included (AVX2 without FMA: the scalar loop)
      for (; j + 8 <= width; j += 8) {
        const __m256 v = _mm256_loadu_ps(row + j);
        const __m256 hit = _mm256_or_ps(_mm256_cmp_ps(v, _mm256_set1_ps(best[k - 1]), _CMP_GT_OQ),
                                        _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        if (_mm256_movemask_ps(hit) == 0) continue;
        for (int64_t i = j; i < j + 8; ++i) offer(i);
      }
#endif
      for (; j < width; ++j) offer(j);
      nan_rows[r] = nan;
    }
  });
  const bool unordered = std::any_of(nan_rows.begin(), nan_rows.end(), [](uint8_t v) { return v != 0; });
  return {values, indices, at::scalar_tensor(unordered, x.options().dtype(at::kBool))};
}

// Each row's logsumexp, max + log(sum exp(x - max)), as [n, 1]: a draft level's log-probabilities of its top-k
// are their logits minus it (graft/eagle/head.py top_log_probs). ATen's logsumexp of 10 x 8,192 took some 195 us
// of a 1.1 ms draft level (a temporary exp, checks for infinities); here one pass for the max, one for the sum
// through exp_nonpositive (relative error about 1e-7). A row whose max is infinite gives it (-inf for an all -inf
// row); a NaN anywhere gives NaN.
at::Tensor row_logsumexp(const at::Tensor& x) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous(), "x: contiguous [n, V] float32");
  const int64_t n = x.size(0), width = x.size(1);
  at::Tensor out = at::empty({n, 1}, x.options());
  const float* src = x.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  for (int64_t r = 0; r < n; ++r) {
    const float* row = src + r * width;
    float top = -std::numeric_limits<float>::infinity();
    bool nan = false;
    int64_t m = 0;
#if defined(__AVX512F__)
    __m512 tops = _mm512_set1_ps(top);
    __mmask16 unordered = 0;
    for (; m + kLanes <= width; m += kLanes) {
      const __m512 v = _mm512_loadu_ps(row + m);
      tops = _mm512_max_ps(v, tops);
      unordered |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    }
    top = _mm512_reduce_max_ps(tops);
    nan = unordered != 0;
#elif defined(GRAFT_AVX2)
    __m256 tops = _mm256_set1_ps(top), unordered = _mm256_setzero_ps();
    for (; m + kLanes <= width; m += kLanes) {
      const __m256 v = _mm256_loadu_ps(row + m);
      tops = _mm256_max_ps(v, tops);
      unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    top = reduce_max(tops);
    nan = _mm256_movemask_ps(unordered) != 0;
#endif
    for (; m < width; ++m) {
      nan = nan || std::isnan(row[m]);
      top = row[m] > top ? row[m] : top;
    }
    if (nan || !std::isfinite(top)) {
      dst[r] = nan ? std::numeric_limits<float>::quiet_NaN() : top;
      continue;
    }
    float sum = 0.0f;
    int64_t j = 0;
#if defined(__AVX512F__)
    __m512 acc = _mm512_setzero_ps();
    for (; j + kLanes <= width; j += kLanes)
      acc = _mm512_add_ps(acc, exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(row + j), _mm512_set1_ps(top))));
    sum = _mm512_reduce_add_ps(acc);
#elif defined(GRAFT_AVX2)
    __m256 acc = _mm256_setzero_ps();
    for (; j + kLanes <= width; j += kLanes)
      acc = _mm256_add_ps(acc, exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(row + j), _mm256_set1_ps(top))));
    sum = reduce_add(acc);
#endif
    for (; j < width; ++j) sum += std::exp(row[j] - top);
    dst[r] = top + std::log(sum);
  }
  return out;
}

// After a verification the accepted nodes' keys and values move down to close the gaps, in every layer: position
// start + j takes position start + rows[j] (rows ascending, rows[j] >= j, so a forward copy never overwrites a
// row still to be read). Some 60 tensors a step, each [batch, heads, capacity, head_dim]: ATen's indexed copies
// cost a few microseconds each, here one call moves them all.
void move_rows(const std::vector<at::Tensor>& buffers, int64_t start, const at::Tensor& rows) {
  TORCH_CHECK(rows.scalar_type() == at::kLong && rows.dim() == 1 && rows.is_contiguous(), "rows: [count] int64");
  const int64_t count = rows.size(0);
  const int64_t* source = rows.data_ptr<int64_t>();
  for (int64_t j = 0; j < count; ++j) TORCH_CHECK(source[j] >= j && (j == 0 || source[j] > source[j - 1]), "rows must ascend with rows[j] >= j");
  for (const at::Tensor& t : buffers) {
    TORCH_CHECK(t.dim() == 4 && t.is_contiguous() && t.device().is_cpu(), "buffers: contiguous CPU [b, h, capacity, d]");
    TORCH_CHECK(start + (count ? source[count - 1] : 0) < t.size(2), "a row beyond the buffer's capacity");
    const int64_t planes = t.size(0) * t.size(1), capacity = t.size(2);
    const int64_t bytes = t.size(3) * t.element_size();
    char* base = static_cast<char*>(t.data_ptr());
    for (int64_t p = 0; p < planes; ++p) {
      char* plane = base + p * capacity * bytes;
      for (int64_t j = 0; j < count; ++j)
        if (source[j] != j) std::memcpy(plane + (start + j) * bytes, plane + (start + source[j]) * bytes, bytes);
    }
  }
}

#if defined(__AVX512F__) || defined(GRAFT_AVX2)
// Register-only multiply-add chains, Chains::kCount of them a thread on every torch thread, each step one
// instruction doing Chains::kPerStep multiply-adds: the rate in G multiply-adds a second.
template <typename Chains>
double chain_rate(int64_t iterations) {
  using Vec = typename Chains::Vec;
  const int64_t threads = at::get_num_threads();
  std::vector<float> sinks(threads, 0.f);
  const auto start = std::chrono::steady_clock::now();
  at::parallel_for(0, threads, 1, [&](int64_t first, int64_t last) {
    for (int64_t t = first; t < last; ++t) {
      Vec chains[Chains::kCount];
      for (int c = 0; c < Chains::kCount; ++c) chains[c] = Chains::start(static_cast<float>(c));
      for (int64_t i = 0; i < iterations; ++i)
        for (int c = 0; c < Chains::kCount; ++c) chains[c] = Chains::step(chains[c]);
      float sum = 0.f;
      for (int c = 0; c < Chains::kCount; ++c) sum += Chains::lane0(chains[c]);
      sinks[t] = sum;  // the chains' results are used: the loop is not optimised away
    }
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  volatile float keep = std::accumulate(sinks.begin(), sinks.end(), 0.f);
  (void)keep;
  return static_cast<double>(threads) * iterations * Chains::kCount * Chains::kPerStep / seconds / 1e9;
}
#endif

#if defined(__AVX512F__)
struct FmaChains {  // float32 FMAs, 16 lanes
  using Vec = __m512;
  static constexpr int kCount = 16, kPerStep = 16;
  static Vec start(float v) { return _mm512_set1_ps(v); }
  static Vec step(Vec v) { return _mm512_fmadd_ps(v, _mm512_set1_ps(0.999999f), _mm512_set1_ps(1e-7f)); }
  static float lane0(Vec v) { return _mm512_cvtss_f32(v); }
};
#elif defined(GRAFT_AVX2)
struct FmaChains {  // float32 FMAs, 8 lanes
  using Vec = __m256;
  static constexpr int kCount = 12, kPerStep = 8;
  static Vec start(float v) { return _mm256_set1_ps(v); }
  static Vec step(Vec v) { return _mm256_fmadd_ps(v, _mm256_set1_ps(0.999999f), _mm256_set1_ps(1e-7f)); }
  static float lane0(Vec v) { return _mm256_cvtss_f32(v); }
};
#endif
#if defined(GRAFT_BF16_DOT)
struct DotChains {  // vdpbf16ps: two bfloat16 multiply-adds into each of 16 float32 lanes
  using Vec = __m512;
  static constexpr int kCount = 16, kPerStep = 32;
  static Vec start(float v) { return _mm512_set1_ps(v); }
  static Vec step(Vec v) {
    const __m512bh small = (__m512bh)_mm512_set1_epi32(0x3A833A83);  // bfloat16 1e-3 in both halves
    return _mm512_dpbf16_ps(v, small, small);
  }
  static float lane0(Vec v) { return _mm512_cvtss_f32(v); }
};
#endif

// The CPU's float32 multiply-add rate with every torch thread busy and nothing read from memory: each thread runs
// independent chains of vector FMAs (more chains than an FMA's latency times the FMA units, on the CPUs seen),
// `iterations` rounds. The forward profile's compute roof, set beside its bandwidth limit. Returns G FMA/s, or 0
// where the build has no vector kernels.
double fma_rate(int64_t iterations) {
#if defined(__AVX512F__) || defined(GRAFT_AVX2)
  return chain_rate<FmaChains>(iterations);
#else
  return 0.0;
#endif
}

// The bfloat16 "dot" panels' arithmetic roof: G bfloat16 multiply-adds a second through vdpbf16ps (0 where the
// build has none).
double dot_rate(int64_t iterations) {
#if defined(GRAFT_BF16_DOT)
  return chain_rate<DotChains>(iterations);
#else
  return 0.0;
#endif
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("lean_layers", &lean_layers, "the lean forward's layer loop for a few rows (float32)");
  m.def("panels_supported", &panels_supported, "whether this build has the panel kernel (AVX-512F or AVX2)");
  m.def("bfloat16_panels_supported", &bfloat16_panels_supported, "whether the panels may hold bfloat16 weights");
  m.def("bfloat16_panel_products", &bfloat16_panel_products,
        "how the bfloat16 panels multiply: widened (float32 activations), dot (bfloat16 activations), or none");
  m.def("pack_panels", &pack_panels, "W [N, K] float32 (or bfloat16, AVX2) in the panel kernel's layout [N / B, K, B]");
  m.def("panel_linear", &panel_linear, "x @ W^T (+ bias) through the panel kernel (float32 x and y)");
  m.def("set_tile_prefetch", &set_tile_prefetch, "the AVX-512F tiles' prefetch: 0 stream ahead, 1 chunk ahead, 2 hardware",
        py::arg("mode"), py::arg("tiles") = -1);
  m.def("tile_prefetch", &tile_prefetch, "the AVX-512F tiles' prefetch mode for one tile (0) or several (1); -1: none",
        py::arg("tiles") = 0);
  m.def("rms_norm_rows", &rms_norm_rows, "RMSNorm of x [n, d] float32 with a float32 weight [d]");
  m.def("swiglu", &swiglu, "SiLU(gate) * up for gate_up [n, 2 * inner] float32 -> [n, inner]");
  m.def("move_rows", &move_rows, "every buffer's positions start + rows[j] moved to start + j (a commit)");
  m.def("row_logsumexp", &row_logsumexp, "each row's logsumexp of x [n, V] float32, as [n, 1]");
  m.def("row_topk", &row_topk, "each row's k largest float32 values, largest first, ties in index order");
  m.def("use_amx", &use_amx, "the bfloat16 panels through AMX tiles where granted (true) or not; returns whether they are");
  m.def("dot_rate", &dot_rate, "bfloat16 G multiply-adds/s through vdpbf16ps on every torch thread (0: none)");
  m.def("fma_rate", &fma_rate, "float32 G FMA/s with every torch thread running register-only vector FMAs");
  m.def("head_layer", &head_layer, "an EAGLE draft head's decoder layer for a few entries (float32)");
}
