// The lean forward's layer loop (a decode step, a verification, a prompt chunk), and an EAGLE draft head's layer.
//
// On a small model on a CPU, Python running the loop and some twenty small ATen ops per layer (norms, rotary,
// transposes, SwiGLU), each a few microseconds of dispatch and allocation, cost a good part of a decode step beside
// the weight-bound products. Here everything between the products is one pass over the rows in plain loops: the
// RMSNorms, Qwen3's per-head q/k norm, the rotary embedding with keys and values written straight into the cache,
// SiLU(gate) * up, and attention. The products are the panel kernel where it measured faster at load, else oneDNN's
// packed linear (products.cpp). Activations are float32 (products may read bfloat16 weights, the cache may hold
// bfloat16); the callers fall back to Python where the build is missing. Everything but oneDNN's products computes a
// row alone, so with panel products a prompt's rows are the same bits in one chunk or cut into several, at batch 1
// or beside other sequences' rows.
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <vector>

#include "native.h"

namespace graft {
namespace {

// A layer's tensors in graft/cpu/native/build.py's LAYER_FIELDS order: each product as four (packed, small, one_row,
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

// A layer's products in the order of its `prefetch` modes (graft/cpu/native/build.py: PRODUCTS).
// lean_rows runs its segments' attention one thread a segment when none is longer than this many rows
constexpr int64_t kSegmentRowsInParallel = 64;

enum LayerProduct : int { kQkvProduct = 0, kOProduct = 1, kGateUpProduct = 2, kDownProduct = 3, kProducts = 4 };

at::Tensor product_of(const at::Tensor& x, const at::Tensor* w, int field, int64_t small_rows, int64_t prefetch) {
  return product(x, w[field], w[field + 1], w[field + 2], w[field + 3], small_rows, prefetch);
}

// A decoder layer after its input norm: attention reads `input` [n, width] (the normed residual, or a head's
// wider [norm(embeds); norm(hidden)]), both sublayers add into `residual` [n, hidden]; w in LAYER_FIELDS order,
// prefetch the tile prefetch modes of its products in LayerProduct order.
// `attention(qkv, qk_norm)` returns the merged heads [n, heads * head_dim] (one cache, or several sequences').
template <typename Attention>
at::Tensor decoder_layer(const at::Tensor& input, const at::Tensor& residual, const at::Tensor* w,
                         const int64_t* prefetch, const Attention& attention, float eps, int64_t small_rows) {
  at::Tensor qkv = product_of(input, w, kQkv, small_rows, prefetch[kQkvProduct]);
  at::Tensor merged = attention(qkv, w[kQkNorm]);
  at::Tensor x = residual.add(product_of(merged, w, kO, small_rows, prefetch[kOProduct]));  // residual + o(...)
  at::Tensor gate_up =
      product_of(rms_norm_rows(x, w[kPostNorm], eps), w, kGateUp, small_rows, prefetch[kGateUpProduct]);
  return x.add(product_of(swiglu(gate_up), w, kDown, small_rows, prefetch[kDownProduct]));
}

// Where each segment's rows start in a forward over several sequences, and the total at the end.
std::vector<int64_t> segment_offsets(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> offsets(lengths.size() + 1, 0);
  for (size_t s = 0; s < lengths.size(); ++s) offsets[s + 1] = offsets[s] + lengths[s];
  return offsets;
}

// Attention of several sequences' rows: segment s (rows offsets[s]..offsets[s + 1] - 1 of qkv) over its own cache,
// cache slot slots[s] of keys[s], values[s] [slots, kv_heads, capacity, d] after its starts[s] positions, with
// masks[s] as attend's. Each segment runs on raw buffers (attend_raw: no tensor of its own) where the build has the
// few-row kernel, else through attend(). Many short segments run one thread a segment; a long one (a prompt chunk)
// keeps the kernel's own split over its heads. Returns [rows, heads * d].
at::Tensor attend_segments(const at::Tensor& qkv, const at::Tensor& norm, const std::vector<at::Tensor>& keys,
                           const std::vector<at::Tensor>& values, const std::vector<int64_t>& slots, const float* cos,
                           const float* sin, const std::vector<at::Tensor>& masks, const std::vector<int64_t>& starts,
                           const std::vector<int64_t>& offsets, int64_t heads, int64_t kv_heads, int64_t head_dim,
                           double scaling, float eps) {
  const int64_t segments = static_cast<int64_t>(starts.size()), rows = qkv.size(0), d = head_dim;
  const int64_t row_width = qkv.size(1);
  at::Tensor merged = at::empty({rows, heads * d}, qkv.options());
  at::Tensor query = at::empty({rows * heads * d}, qkv.options());  // each segment's [heads, n, d] scratch
  const float* norm_weight = present(norm) ? norm.data_ptr<float>() : nullptr;
  int64_t longest = 0;
  for (int64_t s = 0; s < segments; ++s) {
    longest = std::max(longest, offsets[s + 1] - offsets[s]);
    const int64_t capacity = keys[s].size(2);
    bfloat16_cache(keys[s], values[s]);  // checks the layout
    TORCH_CHECK(starts[s] + offsets[s + 1] - offsets[s] <= capacity, "segment ", s, ": the cache holds ", capacity,
                " positions, not ", starts[s] + offsets[s + 1] - offsets[s]);
  }
  const auto segment = [&](int64_t s) {
    const int64_t first = offsets[s], n = offsets[s + 1] - offsets[s], capacity = keys[s].size(2);
    const bool narrow = keys[s].scalar_type() == at::kBFloat16;
    const int64_t slot_bytes = keys[s].stride(0) * keys[s].element_size();
    const at::Tensor& mask = masks[s];
    const bool raw_mask = !present(mask) || (mask.is_contiguous() && mask.scalar_type() == at::kFloat);
    if (raw_mask && attend_raw(qkv.data_ptr<float>() + first * row_width, n, heads, kv_heads, d, norm_weight,
                               cos + first * d, sin + first * d,
                               static_cast<char*>(keys[s].data_ptr()) + slots[s] * slot_bytes,
                               static_cast<char*>(values[s].data_ptr()) + slots[s] * slot_bytes, narrow, capacity, starts[s],
                               present(mask) ? mask.data_ptr<float>() : nullptr, present(mask) ? mask.size(-1) : 0,
                               static_cast<float>(scaling), eps, query.data_ptr<float>() + first * heads * d,
                               merged.data_ptr<float>() + first * heads * d))
      return;
    merged.narrow(0, first, n).copy_(attend(qkv.narrow(0, first, n), heads, kv_heads, d, norm, cos + first * d,
                                            sin + first * d, keys[s].narrow(0, slots[s], 1),
                                            values[s].narrow(0, slots[s], 1), starts[s], mask, scaling, eps));
  };
  if (segments > 1 && longest <= kSegmentRowsInParallel) {
    // the caller's inference mode holds on the workers (their tensors are inference tensors); nothing else of its
    // thread state does: a Python dispatch mode there would wait for the GIL the caller holds
    const bool inference = c10::InferenceMode::is_enabled();
    at::parallel_for(0, segments, 1, [&](int64_t lo, int64_t hi) {
      const c10::InferenceMode as_caller(inference);
      for (int64_t s = lo; s < hi; ++s) segment(s);
    });
  } else {
    for (int64_t s = 0; s < segments; ++s) segment(s);
  }
  return merged;
}

// What an EAGLE head's attention reads: [norm(embeds); hidden_norm(hidden)] [n, 2H] for EAGLE-3, `hidden` as it
// is for EAGLE-1 (`embeds` empty).
at::Tensor head_input(const at::Tensor& embeds, const at::Tensor& hidden, const std::vector<at::Tensor>& w, float eps) {
  if (!present(embeds)) return hidden;
  TORCH_CHECK(embeds.sizes() == hidden.sizes() && embeds.is_contiguous(), "embeds: contiguous, as hidden");
  const int64_t n = hidden.size(0), width = hidden.size(1);
  at::Tensor input = at::empty({n, 2 * width}, hidden.options());
  at::Tensor both = input.view({n, 2, width});
  both.select(1, 0).copy_(rms_norm_rows(embeds, w[kInputNorm], eps));
  both.select(1, 1).copy_(rms_norm_rows(hidden, w[kHiddenNorm], eps));
  return input;
}

// Attention over one cache: rows start.. of `keys` / `values` written, as attend() does.
auto one_cache(const at::Tensor& keys, const at::Tensor& values, const float* cos, const float* sin,
               const at::Tensor& mask, int64_t start, int64_t heads, int64_t kv_heads, int64_t head_dim, float eps,
               double scaling) {
  return [&, cos, sin, start, heads, kv_heads, head_dim, eps, scaling](const at::Tensor& qkv, const at::Tensor& norm) {
    return attend(qkv, heads, kv_heads, head_dim, norm, cos, sin, keys, values, start, mask, scaling, eps);
  };
}

}  // namespace

// x [n, hidden] float32; per layer `per_layer` tensors (see graft/cpu/native/build.py: LAYER_FIELDS), an empty
// tensor standing for an absent one; each layer's cache keys and values [1, kv_heads, capacity, head_dim]; cos,
// sin [n, head_dim]; mask as attend's; cache rows start..start + n - 1 are written.
// tap_flags[layer]: 1 capture the layer's input, 2 its output. prefetch: each layer's products' tile prefetch
// modes, four a layer (panels.h; graft/cpu/native/build.py: layer_prefetch). Returns [x, captured...] in
// layer order.
std::vector<at::Tensor> lean_layers(at::Tensor x, const std::vector<at::Tensor>& weights, int64_t per_layer,
                                    const std::vector<at::Tensor>& keys_per_layer,
                                    const std::vector<at::Tensor>& values_per_layer, const at::Tensor& cos,
                                    const at::Tensor& sin, const at::Tensor& mask, int64_t start, int64_t heads,
                                    int64_t kv_heads, int64_t head_dim, double eps, double scaling,
                                    int64_t small_rows, const std::vector<int64_t>& tap_flags,
                                    const std::vector<int64_t>& prefetch) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous(), "x: contiguous [n, hidden] float32");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous(), "cos, sin: contiguous [n, head_dim]");
  const int64_t num_layers = static_cast<int64_t>(weights.size()) / per_layer;
  TORCH_CHECK(static_cast<int64_t>(keys_per_layer.size()) == num_layers &&
                  static_cast<int64_t>(values_per_layer.size()) == num_layers &&
                  static_cast<int64_t>(tap_flags.size()) == num_layers &&
                  static_cast<int64_t>(prefetch.size()) == kProducts * num_layers,
              "one cache layer, one tap flag and four prefetch modes per layer");
  const float feps = static_cast<float>(eps);
  std::vector<at::Tensor> result{x};
  for (int64_t layer = 0; layer < num_layers; ++layer) {
    const at::Tensor* w = weights.data() + layer * per_layer;
    if (tap_flags[layer] & 1) result.push_back(x);
    const auto attention = one_cache(keys_per_layer[layer], values_per_layer[layer], cos.data_ptr<float>(),
                                     sin.data_ptr<float>(), mask, start, heads, kv_heads, head_dim, feps, scaling);
    x = decoder_layer(rms_norm_rows(x, w[kInputNorm], feps), x, w, prefetch.data() + kProducts * layer, attention,
                      feps, small_rows);
    if (tap_flags[layer] & 2) result.push_back(x);
  }
  result[0] = x;
  return result;
}

// An EAGLE draft head's decoder layer for n entries: the attention reads [norm(embeds); hidden_norm(hidden)]
// (EAGLE-3; `embeds` empty for EAGLE-1, whose layer reads `hidden`, fc's output, as it is), the residual
// stream is `hidden` [n, H]. `weights` in LAYER_FIELDS order with the EAGLE-3 norms at input_norm (embeds),
// post_norm, and hidden_norm appended; cache, cos, sin and mask as lean_layers', prefetch its four products'
// modes. Returns the new hidden [n, H].
at::Tensor head_layer(const at::Tensor& embeds, const at::Tensor& hidden, const std::vector<at::Tensor>& w,
                      const at::Tensor& keys, const at::Tensor& values, const at::Tensor& cos, const at::Tensor& sin,
                      const at::Tensor& mask, int64_t start, int64_t heads, int64_t kv_heads, int64_t head_dim,
                      double eps, double scaling, int64_t small_rows, const std::vector<int64_t>& prefetch) {
  TORCH_CHECK(hidden.scalar_type() == at::kFloat && hidden.dim() == 2 && hidden.is_contiguous(),
              "hidden: contiguous [n, H] float32");
  TORCH_CHECK(static_cast<int64_t>(prefetch.size()) == kProducts, "four prefetch modes, one per product");
  const float feps = static_cast<float>(eps);
  const at::Tensor input = head_input(embeds, hidden, w, feps);
  const auto attention = one_cache(keys, values, cos.data_ptr<float>(), sin.data_ptr<float>(), mask, start, heads,
                                   kv_heads, head_dim, feps, scaling);
  return decoder_layer(input, hidden, w.data(), prefetch.data(), attention, feps, small_rows);
}

// Several sequences in one forward (a batch's step: trees, decode tokens, prompt chunks): x [total, hidden] holds
// segment s's lengths[s] rows after the previous segments'. The products run once over all rows; segment s's
// attention reads and writes only cache slot slots[s] (keys, values [slots, kv_heads, capacity, head_dim]), after
// its starts[s] positions, with masks[s] as attend's (empty: causal). So a row costs its own prefix and tree, never
// the widest tree or the whole capacity, and its attention is the bits a batch-1 forward gives. cos, sin
// [total, head_dim]; the rest as lean_layers'.
std::vector<at::Tensor> lean_rows(at::Tensor x, const std::vector<at::Tensor>& weights, int64_t per_layer,
                                  const std::vector<at::Tensor>& keys_per_layer,
                                  const std::vector<at::Tensor>& values_per_layer, const at::Tensor& cos,
                                  const at::Tensor& sin, const std::vector<at::Tensor>& masks,
                                  const std::vector<int64_t>& slots, const std::vector<int64_t>& starts,
                                  const std::vector<int64_t>& lengths, int64_t heads, int64_t kv_heads,
                                  int64_t head_dim, double eps, double scaling, int64_t small_rows,
                                  const std::vector<int64_t>& tap_flags, const std::vector<int64_t>& prefetch) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous(), "x: contiguous [n, hidden] float32");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous(), "cos, sin: contiguous [n, head_dim]");
  const int64_t num_layers = static_cast<int64_t>(weights.size()) / per_layer;
  const size_t segments = slots.size();
  TORCH_CHECK(masks.size() == segments && starts.size() == segments && lengths.size() == segments,
              "one mask, start and length per segment");
  TORCH_CHECK(static_cast<int64_t>(keys_per_layer.size()) == num_layers &&
                  static_cast<int64_t>(values_per_layer.size()) == num_layers &&
                  static_cast<int64_t>(tap_flags.size()) == num_layers &&
                  static_cast<int64_t>(prefetch.size()) == kProducts * num_layers,
              "one cache layer, one tap flag and four prefetch modes per layer");
  const std::vector<int64_t> offsets = segment_offsets(lengths);
  TORCH_CHECK(offsets[segments] == x.size(0), "the segments' lengths add up to ", offsets[segments], " rows, not ",
              x.size(0));
  const float feps = static_cast<float>(eps);
  const float* cos_rows = cos.data_ptr<float>();
  const float* sin_rows = sin.data_ptr<float>();
  std::vector<at::Tensor> result{x};
  for (int64_t layer = 0; layer < num_layers; ++layer) {
    const at::Tensor* w = weights.data() + layer * per_layer;
    const at::Tensor& keys = keys_per_layer[layer];
    const at::Tensor& values = values_per_layer[layer];
    const std::vector<at::Tensor> slot_keys(segments, keys), slot_values(segments, values);  // one storage
    const auto attention = [&](const at::Tensor& qkv, const at::Tensor& norm) {
      return attend_segments(qkv, norm, slot_keys, slot_values, slots, cos_rows, sin_rows, masks, starts, offsets,
                             heads, kv_heads, head_dim, scaling, feps);
    };
    if (tap_flags[layer] & 1) result.push_back(x);
    x = decoder_layer(rms_norm_rows(x, w[kInputNorm], feps), x, w, prefetch.data() + kProducts * layer, attention,
                      feps, small_rows);
    if (tap_flags[layer] & 2) result.push_back(x);
  }
  result[0] = x;
  return result;
}

// An EAGLE head's decoder layer over several sequences' entries (a batch's drafting level): embeds, hidden
// [total, H] hold segment s's lengths[s] rows after the previous segments'; segment s's attention reads and writes
// its own head cache keys[s], values[s] after starts[s] positions, with masks[s]; the products run once over every
// row. The rest as head_layer's. Returns the new hidden [total, H].
at::Tensor head_rows(const at::Tensor& embeds, const at::Tensor& hidden, const std::vector<at::Tensor>& w,
                     const std::vector<at::Tensor>& keys, const std::vector<at::Tensor>& values, const at::Tensor& cos,
                     const at::Tensor& sin, const std::vector<at::Tensor>& masks, const std::vector<int64_t>& starts,
                     const std::vector<int64_t>& lengths, int64_t heads, int64_t kv_heads, int64_t head_dim,
                     double eps, double scaling, int64_t small_rows, const std::vector<int64_t>& prefetch) {
  TORCH_CHECK(hidden.scalar_type() == at::kFloat && hidden.dim() == 2 && hidden.is_contiguous(),
              "hidden: contiguous [n, H] float32");
  TORCH_CHECK(static_cast<int64_t>(prefetch.size()) == kProducts, "four prefetch modes, one per product");
  TORCH_CHECK(keys.size() == lengths.size() && values.size() == lengths.size() && masks.size() == lengths.size() &&
                  starts.size() == lengths.size(),
              "one cache, mask, start and length per segment");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous(), "cos, sin: contiguous [n, head_dim]");
  const std::vector<int64_t> offsets = segment_offsets(lengths);
  TORCH_CHECK(offsets.back() == hidden.size(0), "the segments' lengths add up to ", offsets.back(), " rows, not ",
              hidden.size(0));
  const float feps = static_cast<float>(eps);
  const at::Tensor input = head_input(embeds, hidden, w, feps);
  const float* cos_rows = cos.data_ptr<float>();
  const float* sin_rows = sin.data_ptr<float>();
  const std::vector<int64_t> own(keys.size(), 0);  // each segment's cache is a tensor of its own
  const auto attention = [&](const at::Tensor& qkv, const at::Tensor& norm) {
    return attend_segments(qkv, norm, keys, values, own, cos_rows, sin_rows, masks, starts, offsets, heads, kv_heads,
                           head_dim, scaling, feps);
  };
  return decoder_layer(input, hidden, w.data(), prefetch.data(), attention, feps, small_rows);
}

}  // namespace graft
