// The loops of exact.hpp for AVX2 + FMA (exact_impl.hpp), compiled with those flags (and without
// AVX-512) whatever the build's own (autograd/CMakeLists.txt); run only when the CPU has them.
// Includes nothing that defines inline code shared with other files (see isa.hpp).
#include <cstdint>

#if HEADGRAD_ISA_AVX2
#include <immintrin.h>

#include "kernels/exact_impl.hpp"

namespace autograd::exact {
namespace {

// 8 floats, or 4 doubles; the first m lanes through a lane mask.
struct F256 {
  using R = __m256;
  using D = __m256d;
  static constexpr int n = 8;
  static R set1(float x) { return _mm256_set1_ps(x); }
  static R zero() { return _mm256_setzero_ps(); }
  static R load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, R x) { _mm256_storeu_ps(p, x); }
  static __m256i first(int m) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(m), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static R load_first(const float* p, int m) { return _mm256_maskload_ps(p, first(m)); }
  static void store_first(float* p, R x, int m) { _mm256_maskstore_ps(p, first(m), x); }
  static R first_or(R a, R b, int m) { return _mm256_blendv_ps(b, a, _mm256_castsi256_ps(first(m))); }
  static R add(R a, R b) { return _mm256_add_ps(a, b); }
  static R sub(R a, R b) { return _mm256_sub_ps(a, b); }
  static R mul(R a, R b) { return _mm256_mul_ps(a, b); }
  static R div(R a, R b) { return _mm256_div_ps(a, b); }
  static float sum(R a) {
    const __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
  }
  static D widen_lo(R a) { return _mm256_cvtps_pd(_mm256_castps256_ps128(a)); }
  static D widen_hi(R a) { return _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1)); }
  static D dset1(double x) { return _mm256_set1_pd(x); }
  static D dadd(D a, D b) { return _mm256_add_pd(a, b); }
  static D dsub(D a, D b) { return _mm256_sub_pd(a, b); }
  static D dmul(D a, D b) { return _mm256_mul_pd(a, b); }
  static double dsum(D a) {
    const __m128d h = _mm_add_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));
    return _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
  }
};

}  // namespace

void binary_avx2(Op op, const float* a, std::int64_t sa, const float* b, std::int64_t sb, float* y, std::int64_t n) {
  binary_run<F256>(op, a, sa, b, sb, y, n);
}

void layer_norm_forward_avx2(const float* x, std::int64_t n, const float* w, const float* b, double eps,
                             double* stats, float* y) {
  layer_norm_forward_run<F256>(x, n, w, b, eps, stats, y);
}

void layer_norm_backward_avx2(const float* x, const float* dy, std::int64_t n, const float* w, const double* stats,
                              float* dx, float* dw, float* db) {
  layer_norm_backward_run<F256>(x, dy, n, w, stats, dx, dw, db);
}

}  // namespace autograd::exact
#endif
