// The elementwise kernels of rows.hpp for AVX-512 (rows_impl.hpp), compiled with AVX-512 flags
// whatever the build's own (autograd/CMakeLists.txt); run only when the CPU has AVX-512.
// Includes nothing that defines inline code shared with other files (see isa.hpp).
#include <cstdint>

#if HEADGRAD_ISA_AVX512
#include <immintrin.h>

#include "ops/rows_impl.hpp"

namespace autograd::rows {
namespace {

// 16 floats; min and max as std::min and std::max (the first argument when either is NaN), as
// Eigen's pmin and pmax; ldexp as Eigen's pldexp (four exact power-of-two factors).
struct F512 {
  using R = __m512;
  static constexpr int n = 16;
  static R set1(float x) { return _mm512_set1_ps(x); }
  static R load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, R x) { _mm512_storeu_ps(p, x); }
  static __mmask16 first(int m) { return static_cast<__mmask16>((1u << m) - 1); }
  static R load_first(const float* p, int m) { return _mm512_maskz_loadu_ps(first(m), p); }
  static void store_first(float* p, R x, int m) { _mm512_mask_storeu_ps(p, first(m), x); }
  static R add(R a, R b) { return _mm512_add_ps(a, b); }
  static R sub(R a, R b) { return _mm512_sub_ps(a, b); }
  static R zero_where_equal(R a, R b, R x) { return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(a, b, _CMP_NEQ_UQ), x); }
  static R first_or(R a, R b, int m) { return _mm512_mask_mov_ps(b, first(m), a); }
  static float sum(R a) { return _mm512_reduce_add_ps(a); }
  static R mul(R a, R b) { return _mm512_mul_ps(a, b); }
  static R div(R a, R b) { return _mm512_div_ps(a, b); }
  static R fma(R a, R b, R c) { return _mm512_fmadd_ps(a, b, c); }
  static R min(R a, R b) { return _mm512_min_ps(b, a); }
  static R max(R a, R b) { return _mm512_max_ps(b, a); }
  static R floor(R a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEG_INF); }
  static R pow2(__m512i e) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(e, _mm512_set1_epi32(127)), 23)); }
  static R ldexp(R y, R m) {
    const __m512i e = _mm512_cvttps_epi32(m), b = _mm512_srai_epi32(e, 2);  // b = floor(m/4)
    const R c = pow2(b);
    const R out = mul(mul(mul(y, c), c), c);
    return mul(out, pow2(_mm512_sub_epi32(_mm512_sub_epi32(_mm512_sub_epi32(e, b), b), b)));
  }
};

}  // namespace

void gelu_avx512(const float* x, float* y, std::int64_t n) { gelu_run<F512>(x, y, n); }
void gelu_backward_avx512(const float* dy, const float* x, float* dx, std::int64_t n) {
  gelu_backward_run<F512>(dy, x, dx, n);
}

float exp_shifted_avx512(const float* x, float* y, std::int64_t n, float m) { return exp_shifted_run<F512>(x, y, n, m); }

}  // namespace autograd::rows
#endif
