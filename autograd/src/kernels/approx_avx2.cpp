// The elementwise kernels of approx.hpp for AVX2 + FMA (approx_impl.hpp), compiled with those flags
// (and without AVX-512) whatever the build's own (autograd/CMakeLists.txt); run only when the
// CPU has them. Includes nothing that defines inline code shared with other files (see isa.hpp).
#include <cstdint>

#if HEADGRAD_ISA_AVX2
#include <immintrin.h>

#include "kernels/approx_impl.hpp"

namespace autograd::approx {
namespace {

// 8 floats; min and max as std::min and std::max (the first argument when either is NaN), as
// Eigen's pmin and pmax; ldexp as Eigen's pldexp (four exact power-of-two factors); the first m
// lanes through a lane mask.
struct F256 {
  using R = __m256;
  static constexpr int n = 8;
  static R set1(float x) { return _mm256_set1_ps(x); }
  static R load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, R x) { _mm256_storeu_ps(p, x); }
  static __m256i first(int m) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(m), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static R load_first(const float* p, int m) { return _mm256_maskload_ps(p, first(m)); }
  static void store_first(float* p, R x, int m) { _mm256_maskstore_ps(p, first(m), x); }
  static R add(R a, R b) { return _mm256_add_ps(a, b); }
  static R sub(R a, R b) { return _mm256_sub_ps(a, b); }
  static R zero_where_below(R a, R b, R x) { return _mm256_and_ps(_mm256_cmp_ps(a, b, _CMP_NLT_UQ), x); }
  static R first_or(R a, R b, int m) { return _mm256_blendv_ps(b, a, _mm256_castsi256_ps(first(m))); }
  static float sum(R a) {
    const __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
  }
  static float hmax(R a) {
    const __m128 h = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    const __m128 q = _mm_max_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_max_ss(q, _mm_movehdup_ps(q)));
  }
  static void sums(const R* v, float* out) {
    for (int i = 0; i < n; ++i) out[i] = sum(v[i]);
  }
  static void maxima(const R* v, float* out) {
    for (int i = 0; i < n; ++i) out[i] = hmax(v[i]);
  }
  static R nan_from(R a, R x) { return _mm256_blendv_ps(a, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q)); }
  static R mul(R a, R b) { return _mm256_mul_ps(a, b); }
  static R div(R a, R b) { return _mm256_div_ps(a, b); }
  static R fma(R a, R b, R c) { return _mm256_fmadd_ps(a, b, c); }
  static R min(R a, R b) { return _mm256_min_ps(b, a); }
  static R max(R a, R b) { return _mm256_max_ps(b, a); }
  static R floor(R a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
  static R pow2(__m256i e) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23)); }
  static R ldexp(R y, R m) {
    const __m256i e = _mm256_cvttps_epi32(m), b = _mm256_srai_epi32(e, 2);  // b = floor(m/4)
    const R c = pow2(b);
    const R out = mul(mul(mul(y, c), c), c);
    return mul(out, pow2(_mm256_sub_epi32(_mm256_sub_epi32(_mm256_sub_epi32(e, b), b), b)));
  }
};

}  // namespace

void gelu_avx2(const float* x, float* y, std::int64_t n) { gelu_run<F256>(x, y, n); }
void gelu_backward_avx2(const float* dy, const float* x, float* dx, std::int64_t n) {
  gelu_backward_run<F256>(dy, x, dx, n);
}

float exp_shifted_avx2(const float* x, float* y, std::int64_t n, float m) { return exp_shifted_run<F256>(x, y, n, m); }
float max_avx2(const float* x, std::int64_t n) { return max_run<F256>(x, n); }
void softmax_slopes_rows_avx2(const float* p, float* g, float* out, std::int64_t rows, std::int64_t cols,
                              std::int64_t ld, float scale) {
  softmax_slopes_rows_run<F256>(p, g, out, rows, cols, ld, scale);
}
bool softmax_rows_shared_avx2(float* p, std::int64_t rows, std::int64_t cols, float spread) {
  return softmax_rows_shared_run<F256>(p, rows, cols, spread);
}
void exp_slopes_avx2(float* p, float* g, std::int64_t n, float m, float c) {
  exp_slopes_run<F256>(p, g, n, m, c);
}

}  // namespace autograd::approx
#endif
