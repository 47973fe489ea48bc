// Row-wise helpers of the layer loop and of a draft step, each one pass over the rows where the ATen ops they
// replace cost several passes and their dispatch: RMSNorm, SiLU(gate) * up, each row's top-k and logsumexp,
// and a commit's moves of cache rows.
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/scalar_tensor.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "native.h"
#include "vector_math.h"

namespace graft {
namespace {

// SiLU(g) * u elementwise over `count` floats. SiLU through e = exp(-|g|) (exp_nonpositive, where the build has
// it): g / (1 + e) for g >= 0, g e / (1 + e) below; glibc's scalar expf was a serial part of a verification while
// the other threads waited.
inline void silu_times(const float* g, const float* u, float* o, int64_t count) {
  int64_t t = 0;
#if defined(GRAFT_AVX512)
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

}  // namespace

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
  at::parallel_for(0, rows, kRowsPerTask, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* row = src + r * d;
      const float inv = inverse_rms(row, d, eps);
      float* o = dst + r * d;
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) o[i] = w[i] * (row[i] * inv);
    }
  });
  return out;
}

// SiLU(gate) * up for gate_up [n, 2 * inner] -> [n, inner].
at::Tensor swiglu(const at::Tensor& gate_up) {
  const int64_t n = gate_up.size(0), inner = gate_up.size(1) / 2;
  at::Tensor act = at::empty({n, inner}, gate_up.options());
  const float* gu = gate_up.data_ptr<float>();
  float* a = act.data_ptr<float>();
  at::parallel_for(0, n, kRowsPerTask, [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0; i < r1; ++i) silu_times(gu + i * 2 * inner, gu + i * 2 * inner + inner, a + i * inner, inner);
  });
  return act;
}

// Each row's k largest values, largest first, equal values in index order (k = 1 is torch.argmax: the first
// maximum). A verification's acceptance and the recycling table read the argmax and the top-8 of every node's
// logits over the whole vocabulary, where ATen's argmax and topk read it far below the memory's rate. One pass
// compares 8 values at a time with the row's current k-th value and inserts only from the rare blocks holding a
// larger one. Returns values [n, k], indices [n, k] and `unordered` (a row held a NaN, whose order torch defines
// otherwise: the caller falls back to ATen).
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
#if defined(GRAFT_VECTORS)  // where immintrin.h is included (AVX2 without FMA: the scalar loop)
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
// are their logits minus it (graft/draft_models/eagle/head.py top_log_probs). One pass for the max, one for the sum through
// exp_nonpositive (relative error about 1e-7), where ATen's logsumexp writes a temporary exp and checks for infinities. A
// row whose max is infinite gives it (-inf for an all -inf row); a NaN anywhere gives NaN.
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
#if defined(GRAFT_AVX512)
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
#if defined(GRAFT_AVX512)
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
// row still to be read). Four tensors a layer ([batch, heads, capacity, head_dim]), which ATen would move with
// an indexed copy each; here one call moves them all.
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

}  // namespace graft
