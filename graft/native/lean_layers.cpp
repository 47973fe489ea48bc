// The lean forward's layer loop in C++ for a few rows (a decode step, a verification).
//
// On a small model on a CPU, a decode step spent about a fifth of its time between the weight-bound products:
// Python running the loop and some twenty small ATen ops per layer (norms, rotary, transposes, SwiGLU), each
// a few microseconds of dispatch and allocation. Here the products and attention stay ATen calls (oneDNN's
// packed linear, SDPA) and everything between them is one pass over the rows in plain loops: the RMSNorms,
// Qwen3's per-head q/k norm, the rotary embedding with keys and values written straight into the cache, and
// SiLU(gate) * up. Activations and caches are float32 (products may read bfloat16 weights: a bfloat16 draft
// head); graft/native/__init__.py builds it once, and the callers fall back to Python otherwise.
#include <torch/extension.h>

#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

namespace {

using LinearPointwise = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                   c10::string_view, c10::List<std::optional<at::Scalar>>,
                                   std::optional<c10::string_view>);

bool present(const at::Tensor& t) { return t.defined() && t.numel() > 0; }

// One product: oneDNN's packed linear, or x @ W_t for one row when that kernel was measured faster at load.
at::Tensor product(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& transposed,
                   const at::Tensor& bias, bool one_row_transposed) {
  if (x.size(0) == 1 && one_row_transposed && present(transposed)) {
    at::Tensor y = at::mm(x, transposed);
    return present(bias) ? y.add_(bias) : y;
  }
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
                       .typed<LinearPointwise>();
  std::optional<at::Tensor> b = present(bias) ? std::optional<at::Tensor>(bias) : std::nullopt;
  const bool half = packed.scalar_type() == at::kBFloat16;  // a bfloat16 head's weights: activations stay float32
  at::Tensor y = op.call(half ? x.to(at::kBFloat16) : x, packed, b, "none", c10::List<std::optional<at::Scalar>>(),
                         c10::string_view(""));
  return half ? y.to(at::kFloat) : y;
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

// Attention over the cache for n new rows: q/k (optionally normed per head) rotated, keys and values written
// at rows start.. of the cache, SDPA over rows 0..start + n - 1. qkv [n, (heads + 2 kv_heads) * d];
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
  at::Tensor k = keys.narrow(2, 0, start + n), v = values.narrow(2, 0, start + n);
  at::Tensor attended;  // [1, heads, n, head_dim]
  if (present(mask)) {  // query heads sharing a key/value head folded into the query axis: the cache read in place
    attended =
        at::scaled_dot_product_attention(query.view({1, kv_heads, groups * n, d}), k, v, mask, 0.0, false, scaling)
            .view({1, heads, n, d});
  } else {
    attended = at::scaled_dot_product_attention(query, k, v, std::nullopt, 0.0, n > 1, scaling, groups > 1);
  }
  return attended.transpose(1, 2).reshape({n, heads * d});
}

// SiLU(gate) * up for gate_up [n, 2 * inner] -> [n, inner].
at::Tensor swiglu(const at::Tensor& gate_up) {
  const int64_t n = gate_up.size(0), inner = gate_up.size(1) / 2;
  at::Tensor act = at::empty({n, inner}, gate_up.options());
  const float* gu = gate_up.data_ptr<float>();
  float* a = act.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) {
    const float* g = gu + i * 2 * inner;
    const float* u = g + inner;
    float* o = a + i * inner;
#pragma omp simd
    for (int64_t t = 0; t < inner; ++t) o[t] = g[t] / (1.f + std::exp(-g[t])) * u[t];
  }
  return act;
}

// A decoder layer after its input norm: attention reads `input` [n, width] (the normed residual, or a head's
// wider [norm(embeds); norm(hidden)]), both sublayers add into `residual` [n, hidden]; w in LAYER_FIELDS order.
at::Tensor decoder_layer(const at::Tensor& input, const at::Tensor& residual, const at::Tensor* w,
                         const at::Tensor& keys, const at::Tensor& values, const float* cos, const float* sin,
                         const at::Tensor& mask, int64_t start, int64_t heads, int64_t kv_heads, int64_t head_dim,
                         float eps, double scaling, bool one_row_transposed) {
  at::Tensor qkv = product(input, w[1], w[2], w[3], one_row_transposed);
  at::Tensor merged = attend(qkv, heads, kv_heads, head_dim, w[14], cos, sin, keys, values, start, mask, scaling, eps);
  at::Tensor x = residual + product(merged, w[4], w[5], w[6], one_row_transposed);
  at::Tensor gate_up = product(rms_norm_rows(x, w[7], eps), w[8], w[9], w[10], one_row_transposed);
  return x + product(swiglu(gate_up), w[11], w[12], w[13], one_row_transposed);
}

}  // namespace

// x [n, hidden] float32; per layer `per_layer` tensors (see graft/native/__init__.py: LAYER_FIELDS), an empty
// tensor standing for an absent one; each layer's cache keys and values [1, kv_heads, capacity, head_dim]; cos,
// sin [n, head_dim]; mask as attend's; cache rows start..start + n - 1 are written.
// tap_flags[layer]: 1 capture the layer's input, 2 its output. Returns [x, captured...] in layer order.
std::vector<at::Tensor> lean_layers(at::Tensor x, const std::vector<at::Tensor>& weights, int64_t per_layer,
                                    const std::vector<at::Tensor>& keys_per_layer,
                                    const std::vector<at::Tensor>& values_per_layer, const at::Tensor& cos,
                                    const at::Tensor& sin, const at::Tensor& mask, int64_t start, int64_t heads,
                                    int64_t kv_heads, int64_t head_dim, double eps, double scaling,
                                    bool one_row_transposed, const std::vector<int64_t>& tap_flags) {
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
    x = decoder_layer(rms_norm_rows(x, w[0], feps), x, w, keys_per_layer[layer], values_per_layer[layer],
                      cos.data_ptr<float>(), sin.data_ptr<float>(), mask, start, heads, kv_heads, head_dim, feps,
                      scaling, one_row_transposed);
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
                      double eps, double scaling, bool one_row_transposed) {
  TORCH_CHECK(hidden.scalar_type() == at::kFloat && hidden.dim() == 2 && hidden.is_contiguous(),
              "hidden: contiguous [n, H] float32");
  const float feps = static_cast<float>(eps);
  at::Tensor input = hidden;
  if (present(embeds)) {  // EAGLE-3: both halves normed straight into one [n, 2H] row
    TORCH_CHECK(embeds.sizes() == hidden.sizes() && embeds.is_contiguous(), "embeds: contiguous, as hidden");
    const int64_t n = hidden.size(0), width = hidden.size(1);
    input = at::empty({n, 2 * width}, hidden.options());
    at::Tensor both = input.view({n, 2, width});
    both.select(1, 0).copy_(rms_norm_rows(embeds, w[0], feps));
    both.select(1, 1).copy_(rms_norm_rows(hidden, w[15], feps));
  }
  return decoder_layer(input, hidden, w.data(), keys, values, cos.data_ptr<float>(), sin.data_ptr<float>(), mask, start,
                       heads, kv_heads, head_dim, feps, scaling, one_row_transposed);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("lean_layers", &lean_layers, "the lean forward's layer loop for a few rows (float32)");
  m.def("head_layer", &head_layer, "an EAGLE draft head's decoder layer for a few entries (float32)");
}
