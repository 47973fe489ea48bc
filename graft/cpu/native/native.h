// The functions the files of graft/cpu/native call each other through, and module.cpp binds. Activations and
// caches are float32 throughout.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common.h"

namespace graft {

inline bool present(const at::Tensor& t) { return t.defined() && t.numel() > 0; }

// Row-wise passes (norms, SwiGLU, rounding, placing rows in the cache) split their rows over the threads in
// tasks of at least this many: a prompt's thousands of rows were serial passes while the other threads waited,
// and a decode step's few rows cost less than a fork. Rows are independent, so the split never changes a bit.
constexpr int64_t kRowsPerTask = 64;

// What this build was compiled for: "amx", "avx512bf16", "avx512", "avx2" or "generic" (graft/cpu/native's VARIANTS).
std::string variant();

// products.cpp: the panel kernel and one product of the layer loop
bool panels_supported();
std::string bfloat16_panel_products();
bool bfloat16_panels_supported();
bool use_amx(bool wanted);
bool tile_prefetch_supported();
at::Tensor pack_panels(const at::Tensor& weight);
at::Tensor panel_linear(const at::Tensor& x, const at::Tensor& panels, const at::Tensor& bias, int64_t prefetch);
at::Tensor product(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& small, const at::Tensor& one_row,
                   const at::Tensor& bias, int64_t small_rows, int64_t prefetch);

// attention.cpp
bool attend_raw(const float* qkv_rows, int64_t n, int64_t heads, int64_t kv_heads, int64_t d, const float* norm,
                const float* cos, const float* sin, void* k_cache, void* v_cache, bool bfloat16_cache,
                int64_t capacity, int64_t start, const float* mask, int64_t mask_stride, float scaling, float eps,
                float* q, float* out);
bool bfloat16_cache(const at::Tensor& keys, const at::Tensor& values);
at::Tensor attend(const at::Tensor& qkv, int64_t heads, int64_t kv_heads, int64_t d, const at::Tensor& qk_norm,
                  const float* cos, const float* sin, const at::Tensor& keys, const at::Tensor& values, int64_t start,
                  const at::Tensor& mask, double scaling, float eps);

// rows.cpp: row-wise helpers
at::Tensor rms_norm_rows(const at::Tensor& x, const at::Tensor& weight, float eps);
at::Tensor swiglu(const at::Tensor& gate_up);
std::vector<at::Tensor> row_topk(const at::Tensor& x, int64_t k);
at::Tensor row_logsumexp(const at::Tensor& x);
void move_rows(const std::vector<at::Tensor>& buffers, int64_t start, const at::Tensor& rows);

// layers.cpp: the layer loop and a draft head's layer
std::vector<at::Tensor> lean_layers(at::Tensor x, const std::vector<at::Tensor>& weights, int64_t per_layer,
                                    const std::vector<at::Tensor>& keys_per_layer,
                                    const std::vector<at::Tensor>& values_per_layer, const at::Tensor& cos,
                                    const at::Tensor& sin, const at::Tensor& mask, int64_t start, int64_t heads,
                                    int64_t kv_heads, int64_t head_dim, double eps, double scaling,
                                    int64_t small_rows, const std::vector<int64_t>& tap_flags,
                                    const std::vector<int64_t>& prefetch);
std::vector<at::Tensor> lean_rows(at::Tensor x, const std::vector<at::Tensor>& weights, int64_t per_layer,
                                  const std::vector<at::Tensor>& keys_per_layer,
                                  const std::vector<at::Tensor>& values_per_layer, const at::Tensor& cos,
                                  const at::Tensor& sin, const std::vector<at::Tensor>& masks,
                                  const std::vector<int64_t>& slots, const std::vector<int64_t>& starts,
                                  const std::vector<int64_t>& lengths, int64_t heads, int64_t kv_heads,
                                  int64_t head_dim, double eps, double scaling, int64_t small_rows,
                                  const std::vector<int64_t>& tap_flags, const std::vector<int64_t>& prefetch);
at::Tensor head_rows(const at::Tensor& embeds, const at::Tensor& hidden, const std::vector<at::Tensor>& w,
                     const std::vector<at::Tensor>& keys, const std::vector<at::Tensor>& values, const at::Tensor& cos,
                     const at::Tensor& sin, const std::vector<at::Tensor>& masks, const std::vector<int64_t>& starts,
                     const std::vector<int64_t>& lengths, int64_t heads, int64_t kv_heads, int64_t head_dim,
                     double eps, double scaling, int64_t small_rows, const std::vector<int64_t>& prefetch);
at::Tensor head_layer(const at::Tensor& embeds, const at::Tensor& hidden, const std::vector<at::Tensor>& w,
                      const at::Tensor& keys, const at::Tensor& values, const at::Tensor& cos, const at::Tensor& sin,
                      const at::Tensor& mask, int64_t start, int64_t heads, int64_t kv_heads, int64_t head_dim,
                      double eps, double scaling, int64_t small_rows, const std::vector<int64_t>& prefetch);

// rates.cpp: the arithmetic roofs graft/costmodel's forward profile sets beside the bandwidth
double fma_rate(int64_t iterations);
double dot_rate(int64_t iterations);

}  // namespace graft
