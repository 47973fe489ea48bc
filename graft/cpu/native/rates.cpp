// Benchmark entry points: the build's arithmetic roofs, register-only multiply-add chains on every torch thread
// (graft/costmodel's forward profile sets them beside its bandwidth limit). No kernel calls these.
#include <ATen/Parallel.h>

#include <chrono>
#include <numeric>
#include <vector>

#include "common.h"

namespace graft {
namespace {

#if defined(GRAFT_VECTORS)
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

#if defined(GRAFT_AVX512)
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

}  // namespace

// The CPU's float32 multiply-add rate with every torch thread busy and nothing read from memory: each thread runs
// independent chains of vector FMAs (more chains than an FMA's latency times the FMA units, on the CPUs seen),
// `iterations` rounds. The forward profile's compute roof, set beside its bandwidth limit. Returns G FMA/s, or 0
// where the build has no vector kernels.
double fma_rate(int64_t iterations) {
#if defined(GRAFT_VECTORS)
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

}  // namespace graft
