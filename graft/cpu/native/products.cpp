// The products of few rows: the panel kernel (pack_panels, panel_linear) on this build's tiles, and `product`, one
// product of the layer loop through whichever layout graft/cpu/products.py settled for its row count.
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "native.h"
#include "panels.h"

#if defined(GRAFT_AVX512)
#include "panels_avx512.h"
#elif defined(GRAFT_AVX2)
#include "panels_avx2.h"
#endif
#if defined(GRAFT_AMX)
#include <sys/syscall.h>
#include <unistd.h>

#include "panels_amx.h"
#endif

namespace graft {
namespace {

using LinearPointwise = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                   c10::string_view, c10::List<std::optional<at::Scalar>>,
                                   std::optional<c10::string_view>);

// Linux hands out the AMX tile state only to a process that asks (arch_prctl), once; where it refuses, or
// use_amx(false) turned the tiles off, the dot products serve.
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
bool amx_wanted = true;  // a process switch, as the grant is: graft/bench/e2e.py's system without AMX
bool amx_on() { return amx_wanted && amx_granted(); }

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

// The blocks of one product over the threads, each thread's tiles prefetching into its next block.
template <typename X, typename W>
void panel_blocks(const X* xp, int64_t rows, const W* wp, int64_t blocks, int64_t k_size, int64_t width, float* yp,
                  const int64_t* modes) {
#if defined(GRAFT_VECTORS)
  const int64_t n_size = blocks * width;
  at::parallel_for(0, blocks, 1, [&](int64_t first, int64_t last) {
    for (int64_t b = first; b < last; ++b) {
      const W* block = wp + b * k_size * width;
      const W* next = b + 1 < last ? block + k_size * width : nullptr;
      if (width == 48) panel_block<48 / kLanes>(xp, rows, block, k_size, yp, n_size, b * width, next, modes);
      else if (width == 32) panel_block<32 / kLanes>(xp, rows, block, k_size, yp, n_size, b * width, next, modes);
      else panel_block<16 / kLanes>(xp, rows, block, k_size, yp, n_size, b * width, next, modes);
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

}  // namespace

bool panels_supported() {
#if defined(GRAFT_VECTORS)
  return true;
#else
  return false;
#endif
}

// Whether the panels may hold bfloat16 weights, and how they multiply them (bfloat16_panel_products):
// - "widened" (the AVX2 build, for CPUs where oneDNN has no bfloat16 products): each weight widened to float32 in
//   the registers, float32 activations, the float32 panels' bits for the widened weights;
// - "dot" (AVX512-BF16): weights in k pairs, activations rounded to bfloat16, vdpbf16ps (two multiply-adds a lane
//   an instruction), as oneDNN's bfloat16 products round them;
// - "amx" (the AMX build, the tiles granted and wanted): the dot panels' layout read by the tile unit. A product
//   uses the tiles for every row count or for none (K a multiple of 32), so a row's bits never depend on the rows
//   beside it;
// - "" (AVX-512F without BF16): none, oneDNN multiplies bfloat16 there.
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

bool use_amx(bool wanted) {
  amx_wanted = wanted;
  return amx_on();
}

bool tile_prefetch_supported() {
#if defined(GRAFT_AVX512)
  return true;
#else
  return false;
#endif
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

// x [M, K] float32 @ W^T (+ bias) with W as pack_panels left it: [N / B, K, B] (bfloat16 "dot" panels: in k pairs,
// x rounded to bfloat16). `prefetch`: the AVX-512F tiles' TilePrefetch modes (panels.h). Returns [M, N] float32.
at::Tensor panel_linear(const at::Tensor& x, const at::Tensor& panels, const at::Tensor& bias, int64_t prefetch) {
  TORCH_CHECK(panels_supported(), "the panel kernel needs AVX-512F or AVX2 with FMA");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "x: [rows, in] float32");
  const TileModes modes(prefetch);
  TORCH_CHECK(prefetch >= 0 && prefetch < 16 && modes.valid(),
              "tile prefetch: a mode 0 (stream ahead), 1 (chunk ahead) or 2 (hardware) for one tile (bits 0-1) and "
              "for several (bits 2-3), not ",
              prefetch);
  const bool pairs = kDotPanels && panels.scalar_type() == at::kBFloat16;
  const int64_t laid_out = pairs ? x.size(1) + x.size(1) % 2 : x.size(1);  // the dot panels pad an odd K
  TORCH_CHECK(panels.dim() == 3 && panels.size(1) == laid_out, "panels [N / B, ", laid_out, ", B] for x's ",
              x.size(1), " features");
  const int64_t rows = x.size(0), k_size = x.size(1), blocks = panels.size(0), width = panels.size(2);
  const int64_t n_size = blocks * width;
  at::Tensor y = at::empty({rows, n_size}, x.options());
  if (rows == 0) return y;
#if defined(GRAFT_VECTORS)
  // The tiles read x row-major: a transposed copy, built serially before every product while the other threads
  // waited, measured slower.
  const at::Tensor xc = x.contiguous();
  const float* xp = xc.data_ptr<float>();
  if (panels.scalar_type() == at::kBFloat16) {
#if defined(GRAFT_AVX2)
    const auto* wp = reinterpret_cast<const uint16_t*>(panels.data_ptr<at::BFloat16>());
    panel_blocks(xp, rows, wp, blocks, k_size, width, y.data_ptr<float>(), modes.of);
#elif defined(GRAFT_BF16_DOT)
    const int64_t k_pairs = laid_out / 2;
    const int64_t padded = rows > 16 ? (rows + 15) / 16 * 16 : rows;  // the AMX tiles' rows beyond 16
    // rounded over the threads (a prompt's rows were a serial pass), zeros only in the padding rows
    std::unique_ptr<uint32_t[]> x_pairs(new uint32_t[padded * k_pairs]);
    std::fill(x_pairs.get() + rows * k_pairs, x_pairs.get() + padded * k_pairs, 0u);
    at::parallel_for(0, rows, kRowsPerTask, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) round_to_pairs(xp + r * k_size, k_size, x_pairs.get() + r * k_pairs);
    });
#if defined(GRAFT_AMX)
    if (k_pairs % 16 == 0 && amx_on()) {
      at::Tensor out = padded > rows ? at::empty({padded, n_size}, x.options()) : y;
      const auto* w16 = reinterpret_cast<const uint16_t*>(panels.data_ptr<at::BFloat16>());
      amx_blocks(x_pairs.get(), padded, k_pairs, w16, blocks, width, out.data_ptr<float>());
      y = out.narrow(0, 0, rows);
      return present(bias) ? y.add_(bias) : y;
    }
#endif
    const auto* wp = reinterpret_cast<const uint32_t*>(panels.data_ptr<at::BFloat16>());
    panel_blocks(x_pairs.get(), rows, wp, blocks, k_pairs, width, y.data_ptr<float>(), modes.of);
#else
    TORCH_CHECK(false, "bfloat16 panels need the AVX2 build or AVX512-BF16");
#endif
  } else {
    panel_blocks(xp, rows, panels.data_ptr<float>(), blocks, k_size, width, y.data_ptr<float>(), modes.of);
  }
#endif
  return present(bias) ? y.add_(bias) : y;
}

// One product. One row reads `one_row` where present: W_t [K, N] (x @ W_t) kept beside the panels where it measured
// faster at one row (a decode step) than the panels, which serve 2 .. `small_rows` rows. Up to `small_rows` rows it
// reads `small`, the weights laid out for few rows: the panels (the panel kernel) or W_t [K, N] (x @ W_t, one row);
// above, `packed`: oneDNN's layout, or the panels where oneDNN's copy was dropped. Which layout serves which rows
// was measured at load (graft/cpu/products.py), as was `prefetch`, the panels' tile prefetch modes.
at::Tensor product(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& small, const at::Tensor& one_row,
                   const at::Tensor& bias, int64_t small_rows, int64_t prefetch) {
  const bool first = present(one_row) && x.size(0) == 1;
  if (first || (present(small) && x.size(0) <= small_rows)) {
    const at::Tensor& few = first ? one_row : small;
    if (few.dim() == 3) return panel_linear(x, few, bias, prefetch);
    at::Tensor y = at::mm(x, few);
    return present(bias) ? y.add_(bias) : y;
  }
  if (packed.dim() == 3) return panel_linear(x, packed, bias, prefetch);  // float32 or bfloat16 panels
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
                       .typed<LinearPointwise>();
  std::optional<at::Tensor> b = present(bias) ? std::optional<at::Tensor>(bias) : std::nullopt;
  const bool half = packed.scalar_type() == at::kBFloat16;  // a bfloat16 head's weights: activations stay float32
  at::Tensor y = op.call(half ? x.to(at::kBFloat16) : x, packed, b, "none", c10::List<std::optional<at::Scalar>>(),
                         c10::string_view(""));
  return half ? y.to(at::kFloat) : y;
}

}  // namespace graft
