// A layer's attention for few rows: q/k normed (Qwen3) and rotated, keys and values written into the cache, then
// softmax attention in one pass of plain loops (attention_avx512.h, attention_avx2.h), where SDPA's dispatch and
// layout work cost more than the few rows' arithmetic; SDPA for other head sizes and in the generic build.
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/scaled_dot_product_attention.h>

#include <algorithm>
#include <optional>
#include <type_traits>
#include <vector>

#include "cache_values.h"
#include "native.h"
#include "vector_math.h"

#if defined(GRAFT_AVX512)
#include "attention_avx512.h"
#elif defined(GRAFT_AVX2)
#include "attention_avx2.h"
#endif

namespace graft {
namespace {

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


}  // namespace

// q/k of n rows (optionally normed per head) rotated into `q` [heads, n, d] and the cache's rows start.. of
// k_cache / v_cache [kv_heads, capacity, d] (float32 or bfloat16, C); values copied there.
// qkv_rows [n, (heads + 2 kv_heads) * d].
template <typename C>
void place_rows(const float* qkv_rows, int64_t n, int64_t heads, int64_t kv_heads, int64_t d, const float* norm,
                const float* cos, const float* sin, float* q, C* k_cache, C* v_cache, int64_t capacity, int64_t start,
                float eps) {
  const int64_t qk_heads = heads + kv_heads, row_width = (heads + 2 * kv_heads) * d;
  at::parallel_for(0, n, kRowsPerTask, [&](int64_t r0, int64_t r1) {
    std::vector<float> scratch(d), rotated(d);
    for (int64_t i = r0; i < r1; ++i) {
      const float* row = qkv_rows + i * row_width;
      for (int64_t j = 0; j < qk_heads; ++j) {
        const float* head_norm = norm ? norm + j * d : nullptr;
        if (j < heads) {
          norm_rotate(row + j * d, head_norm, cos + i * d, sin + i * d, q + (j * n + i) * d, d, eps, scratch.data());
          continue;
        }
        norm_rotate(row + j * d, head_norm, cos + i * d, sin + i * d, rotated.data(), d, eps, scratch.data());
        store_row(rotated.data(), k_cache + ((j - heads) * capacity + start + i) * d, d);
      }
      for (int64_t j = 0; j < kv_heads; ++j)
        store_row(row + (qk_heads + j) * d, v_cache + (j * capacity + start + i) * d, d);
    }
  });
}

// attend()'s few-row path on raw buffers, for callers that lay out many sequences' rows themselves (layers.cpp:
// attend_segments), so that a segment costs no tensor of its own: rows placed (place_rows, `q` [heads, n, d]
// scratch) and attended into out [n, heads * d]; mask [n, mask_stride] or null (causal); the cache's values
// float32, or bfloat16 where `bfloat16_cache`. False, touching nothing, where this build or head size has no
// few-row kernel: the caller then runs attend().
bool attend_raw(const float* qkv_rows, int64_t n, int64_t heads, int64_t kv_heads, int64_t d, const float* norm,
                const float* cos, const float* sin, void* k_cache, void* v_cache, bool bfloat16_cache,
                int64_t capacity, int64_t start, const float* mask, int64_t mask_stride, float scaling, float eps,
                float* q, float* out) {
#if defined(GRAFT_VECTORS)
  if (d != 16 && d != 32 && d != 64 && d != 128) return false;
  const auto run = [&](auto* keys, auto* values) {
    using C = std::remove_pointer_t<decltype(keys)>;
    auto few_rows = d == 16 ? few_row_attention<16 / kLanes, C> : d == 32 ? few_row_attention<32 / kLanes, C>
                  : d == 64 ? few_row_attention<64 / kLanes, C> : few_row_attention<128 / kLanes, C>;
    place_rows(qkv_rows, n, heads, kv_heads, d, norm, cos, sin, q, keys, values, capacity, start, eps);
    few_rows(q, keys, values, capacity, n, start, heads, kv_heads, mask, mask_stride, scaling, out);
  };
  if (bfloat16_cache)
    run(static_cast<uint16_t*>(k_cache), static_cast<uint16_t*>(v_cache));
  else
    run(static_cast<float*>(k_cache), static_cast<float*>(v_cache));
  return true;
#else
  return false;
#endif
}

// A cache's keys and values as the kernels take them: contiguous, float32 or bfloat16, both the same.
bool bfloat16_cache(const at::Tensor& keys, const at::Tensor& values) {
  const auto type = keys.scalar_type();
  TORCH_CHECK(keys.is_contiguous() && values.is_contiguous() && values.scalar_type() == type &&
                  (type == at::kFloat || type == at::kBFloat16),
              "contiguous float32 or bfloat16 cache keys and values, both the same");
  return type == at::kBFloat16;
}

// Attention over the cache for n new rows: q/k (optionally normed per head) rotated, keys and values written
// at rows start.. of the cache, then attention over rows 0..start + n - 1 (few_row_attention, or SDPA for other
// head sizes or without AVX-512F or AVX2). qkv [n, (heads + 2 kv_heads) * d];
// mask [1, 1, groups * n, S] additive (tiled along the folded query axis), or empty: causal for n > 1.
// Returns [n, heads * d].
at::Tensor attend(const at::Tensor& qkv, int64_t heads, int64_t kv_heads, int64_t d, const at::Tensor& qk_norm,
                  const float* cos, const float* sin, const at::Tensor& keys, const at::Tensor& values, int64_t start,
                  const at::Tensor& mask, double scaling, float eps) {
  const int64_t n = qkv.size(0), groups = heads / kv_heads, capacity = keys.size(2);
  const bool narrow_cache = bfloat16_cache(keys, values);
  TORCH_CHECK(start + n <= capacity, "the cache holds ", capacity, " positions, not ", start + n);
  at::Tensor query = at::empty({1, heads, n, d}, qkv.options());  // [1, heads, n, head_dim]
  const float* norm = present(qk_norm) ? qk_norm.data_ptr<float>() : nullptr;
  void* k_cache = keys.data_ptr();  // [1, kv_heads, capacity, head_dim]
  void* v_cache = values.data_ptr();
  if (!present(mask) || (mask.is_contiguous() && mask.scalar_type() == at::kFloat)) {
    at::Tensor merged = at::empty({n, heads * d}, qkv.options());  // [n, heads * head_dim]
    const float* rows_mask = present(mask) ? mask.data_ptr<float>() : nullptr;  // its first tile: rows 0..n-1
    const int64_t stride = present(mask) ? mask.size(-1) : 0;
    if (attend_raw(qkv.data_ptr<float>(), n, heads, kv_heads, d, norm, cos, sin, k_cache, v_cache, narrow_cache,
                   capacity, start, rows_mask, stride, static_cast<float>(scaling), eps, query.data_ptr<float>(),
                   merged.data_ptr<float>()))
      return merged;
  }
  if (narrow_cache)
    place_rows(qkv.data_ptr<float>(), n, heads, kv_heads, d, norm, cos, sin, query.data_ptr<float>(),
               static_cast<uint16_t*>(k_cache), static_cast<uint16_t*>(v_cache), capacity, start, eps);
  else
    place_rows(qkv.data_ptr<float>(), n, heads, kv_heads, d, norm, cos, sin, query.data_ptr<float>(),
               static_cast<float*>(k_cache), static_cast<float*>(v_cache), capacity, start, eps);
  // SDPA reads one dtype: a bfloat16 cache's visible rows widened (this path serves other head sizes only)
  at::Tensor k = keys.narrow(2, 0, start + n).to(at::kFloat), v = values.narrow(2, 0, start + n).to(at::kFloat);
  at::Tensor attended;  // [1, heads, n, head_dim]
  if (present(mask)) {  // query heads sharing a key/value head folded into the query axis: the cache read in place
    // the folded axis needs the mask tiled once a group (a caller may pass it tiled, or n rows as the few-row path reads it)
    std::vector<int64_t> times(mask.dim(), 1);
    times[mask.dim() - 2] = groups;
    const at::Tensor tiled = groups > 1 && mask.size(-2) == n ? mask.repeat(times) : mask;
    attended =
        at::scaled_dot_product_attention(query.view({1, kv_heads, groups * n, d}), k, v, tiled, 0.0, false, scaling)
            .view({1, heads, n, d});
  } else if (n > 1 && start > 0) {  // SDPA's is_causal aligns top-left: new rows after a prefix need their own mask
    const at::Tensor visible = at::empty({n, start + n}, qkv.options().dtype(at::kBool)).fill_(true).tril_(start);
    attended = at::scaled_dot_product_attention(query, k, v, visible, 0.0, false, scaling, groups > 1);
  } else {
    attended = at::scaled_dot_product_attention(query, k, v, std::nullopt, 0.0, n > 1, scaling, groups > 1);
  }
  return attended.transpose(1, 2).reshape({n, heads * d});
}

}  // namespace graft
