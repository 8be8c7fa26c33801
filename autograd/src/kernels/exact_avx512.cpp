// The loops of exact.hpp for AVX-512 (exact_impl.hpp), compiled with AVX-512 flags whatever the
// build's own (autograd/CMakeLists.txt); run only when the CPU has AVX-512. Includes nothing
// that defines inline code shared with other files (see isa.hpp).
#include <cstdint>

#if HEADGRAD_ISA_AVX512
#include <immintrin.h>

#include "kernels/exact_impl.hpp"

namespace autograd::exact {
namespace {

// 16 floats, or 8 doubles; the first m lanes through a lane mask.
struct F512 {
  using R = __m512;
  using D = __m512d;
  static constexpr int n = 16;
  static R set1(float x) { return _mm512_set1_ps(x); }
  static R zero() { return _mm512_setzero_ps(); }
  static R load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, R x) { _mm512_storeu_ps(p, x); }
  static __mmask16 first(int m) { return static_cast<__mmask16>((1u << m) - 1); }
  static R load_first(const float* p, int m) { return _mm512_maskz_loadu_ps(first(m), p); }
  static void store_first(float* p, R x, int m) { _mm512_mask_storeu_ps(p, first(m), x); }
  static R first_or(R a, R b, int m) { return _mm512_mask_mov_ps(b, first(m), a); }
  static R add(R a, R b) { return _mm512_add_ps(a, b); }
  static R sub(R a, R b) { return _mm512_sub_ps(a, b); }
  static R mul(R a, R b) { return _mm512_mul_ps(a, b); }
  static R div(R a, R b) { return _mm512_div_ps(a, b); }
  static float sum(R a) { return _mm512_reduce_add_ps(a); }
  static D widen_lo(R a) { return _mm512_cvtps_pd(_mm512_castps512_ps256(a)); }
  static D widen_hi(R a) { return _mm512_cvtps_pd(_mm512_extractf32x8_ps(a, 1)); }
  static D dset1(double x) { return _mm512_set1_pd(x); }
  static D dadd(D a, D b) { return _mm512_add_pd(a, b); }
  static D dsub(D a, D b) { return _mm512_sub_pd(a, b); }
  static D dmul(D a, D b) { return _mm512_mul_pd(a, b); }
  static double dsum(D a) { return _mm512_reduce_add_pd(a); }
};

}  // namespace

void binary_avx512(Op op, const float* a, std::int64_t sa, const float* b, std::int64_t sb, float* y, std::int64_t n) {
  binary_run<F512>(op, a, sa, b, sb, y, n);
}

void layer_norm_forward_avx512(const float* x, std::int64_t n, const float* w, const float* b, double eps,
                               double* stats, float* y) {
  layer_norm_forward_run<F512>(x, n, w, b, eps, stats, y);
}

void layer_norm_backward_avx512(const float* x, const float* dy, std::int64_t n, const float* w,
                                const double* stats, float* dx, float* dw, float* db) {
  layer_norm_backward_run<F512>(x, dy, n, w, stats, dx, dw, db);
}

}  // namespace autograd::exact
#endif
