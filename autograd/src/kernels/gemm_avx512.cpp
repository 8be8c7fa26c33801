// The small matrix-product kernel for AVX-512 (gemm_small_impl.hpp), compiled with AVX-512
// flags whatever the build's own (autograd/CMakeLists.txt); run only when the CPU has AVX-512.
// Includes nothing that defines inline code shared with other files (see isa.hpp).
#include <cstdint>

#if HEADGRAD_ISA_AVX512
#include <immintrin.h>

#include "kernels/gemm_small_impl.hpp"

namespace autograd::small_gemm {
namespace {

// 16 floats or 8 doubles a register; a partial vector through a lane mask.
struct F512 {
  using R = __m512;
  static constexpr int n = 16, acc = 16;
  static constexpr bool masked = true;
  static R zero() { return _mm512_setzero_ps(); }
  static R set1(float x) { return _mm512_set1_ps(x); }
  static R load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, R x) { _mm512_storeu_ps(p, x); }
  static R load_first(const float* p, int m) { return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << m) - 1), p); }
  static void store_first(float* p, R x, int m) { _mm512_mask_storeu_ps(p, static_cast<__mmask16>((1u << m) - 1), x); }
  static R fma(R a, R b, R c) { return _mm512_fmadd_ps(a, b, c); }
  static R mul(R a, R b) { return _mm512_mul_ps(a, b); }
};
struct D512 {
  using R = __m512d;
  static constexpr int n = 8, acc = 16;
  static constexpr bool masked = true;
  static R zero() { return _mm512_setzero_pd(); }
  static R set1(double x) { return _mm512_set1_pd(x); }
  static R load(const double* p) { return _mm512_loadu_pd(p); }
  static void store(double* p, R x) { _mm512_storeu_pd(p, x); }
  static R load_first(const double* p, int m) { return _mm512_maskz_loadu_pd(static_cast<__mmask8>((1u << m) - 1), p); }
  static void store_first(double* p, R x, int m) { _mm512_mask_storeu_pd(p, static_cast<__mmask8>((1u << m) - 1), x); }
  static R fma(R a, R b, R c) { return _mm512_fmadd_pd(a, b, c); }
  static R mul(R a, R b) { return _mm512_mul_pd(a, b); }
};

// 256-bit vectors for the transposed-B dot products (run_nt), as the AVX2 variant has them.
struct F256 {
  using R = __m256;
  static constexpr int n = 8;
  static R zero() { return _mm256_setzero_ps(); }
  static R load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, R x) { _mm256_storeu_ps(p, x); }
  static R set1(float x) { return _mm256_set1_ps(x); }
  static R mul(R a, R b) { return _mm256_mul_ps(a, b); }
  static R fma(R a, R b, R c) { return _mm256_fmadd_ps(a, b, c); }
  // The lane sums of x[0..7], ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)) each, in one vector.
  static R sums(const R* x) {
    const R h01 = _mm256_hadd_ps(x[0], x[1]), h23 = _mm256_hadd_ps(x[2], x[3]);
    const R h45 = _mm256_hadd_ps(x[4], x[5]), h67 = _mm256_hadd_ps(x[6], x[7]);
    const R q0 = _mm256_hadd_ps(h01, h23), q1 = _mm256_hadd_ps(h45, h67);
    return _mm256_add_ps(_mm256_permute2f128_ps(q0, q1, 0x20), _mm256_permute2f128_ps(q0, q1, 0x31));
  }
};
struct D256 {
  using R = __m256d;
  static constexpr int n = 4;
  static R zero() { return _mm256_setzero_pd(); }
  static R load(const double* p) { return _mm256_loadu_pd(p); }
  static void store(double* p, R x) { _mm256_storeu_pd(p, x); }
  static R set1(double x) { return _mm256_set1_pd(x); }
  static R mul(R a, R b) { return _mm256_mul_pd(a, b); }
  static R fma(R a, R b, R c) { return _mm256_fmadd_pd(a, b, c); }
  // The lane sums of x[0..3], (l0 + l1) + (l2 + l3) each, in one vector.
  static R sums(const R* x) {
    const R h01 = _mm256_hadd_pd(x[0], x[1]), h23 = _mm256_hadd_pd(x[2], x[3]);
    return _mm256_add_pd(_mm256_permute2f128_pd(h01, h23, 0x20), _mm256_permute2f128_pd(h01, h23, 0x31));
  }
};

// One block of at most 16 x 16 floats, transposed in registers: rows r of src (the first `cols`
// lanes, the rest zero) become lanes r of the rows of dst, times alpha unless Scaled is false. Three rounds of shuffles: pairs of
// rows interleaved, then quadruples within each 128-bit lane, then the 128-bit lanes across
// registers.
// Not inlined: the row addresses are formed afresh per block (hoisted out of the loops over blocks
// they would take every register and spill the vectors).
template <bool Full, bool Scaled>
__attribute__((noinline)) void transpose16(const float* s, std::int64_t lds, int rows, int cols, float* d,
                                           std::int64_t ldd, float alpha) {
  const __mmask16 cm = Full ? __mmask16(0xffff) : static_cast<__mmask16>((1u << cols) - 1);
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i, s += lds)
    r[i] = Full ? _mm512_loadu_ps(s) : i < rows ? _mm512_maskz_loadu_ps(cm, s) : _mm512_setzero_ps();
  for (int i = 0; i < 8; ++i) {  // per 128-bit lane l: a[4l] b[4l] a[4l+1] b[4l+1] / a[4l+2] b[4l+2] ...
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // r[4i + j], lane l: rows 4i..4i+3 at column 4l + j
    r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xee);
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xee);
  }
  for (int j = 0; j < 4; ++j) {  // column 4l + j: lane l of r[j], r[4 + j], r[8 + j], r[12 + j]
    const __m512 u0 = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x88), u1 = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xdd);
    const __m512 u2 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x88), u3 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xdd);
    t[j] = _mm512_shuffle_f32x4(u0, u2, 0x88);
    t[4 + j] = _mm512_shuffle_f32x4(u1, u3, 0x88);
    t[8 + j] = _mm512_shuffle_f32x4(u0, u2, 0xdd);
    t[12 + j] = _mm512_shuffle_f32x4(u1, u3, 0xdd);
  }
  const __mmask16 rm = Full ? __mmask16(0xffff) : static_cast<__mmask16>((1u << rows) - 1);
  const __m512 al = _mm512_set1_ps(alpha);
  for (int c = 0; c < (Full ? 16 : cols); ++c, d += ldd) {
    const __m512 x = Scaled ? _mm512_mul_ps(al, t[c]) : t[c];
    if (Full) _mm512_storeu_ps(d, x);
    else _mm512_mask_storeu_ps(d, rm, x);
  }
}

template <bool Scaled>
void transpose_blocks(const float* src, std::int64_t lds, std::int64_t rows, std::int64_t cols, float* dst,
                      std::int64_t ldd, float alpha) {
  for (std::int64_t r = 0; r < rows; r += 16) {
    const int nr = static_cast<int>(rows - r < 16 ? rows - r : 16);
    for (std::int64_t c = 0; c < cols; c += 16) {
      const int nc = static_cast<int>(cols - c < 16 ? cols - c : 16);
      const float* s = src + r * lds + c;
      float* d = dst + c * ldd + r;
      if (nr == 16 && nc == 16) transpose16<true, Scaled>(s, lds, 16, 16, d, ldd, alpha);
      else transpose16<false, Scaled>(s, lds, nr, nc, d, ldd, alpha);
    }
  }
}

}  // namespace

void transpose_avx512(const float* src, std::int64_t lds, std::int64_t rows, std::int64_t cols, float* dst,
                      std::int64_t ldd, float alpha) {
  if (alpha == 1.f) transpose_blocks<false>(src, lds, rows, cols, dst, ldd, alpha);
  else transpose_blocks<true>(src, lds, rows, cols, dst, ldd, alpha);
}

void run_nt_avx512(const Args<float>& a) { run_nt<F256>(a); }
void run_nt_avx512(const Args<double>& a) { run_nt<D256>(a); }
void run_avx512(const Args<float>& a) { run<F512>(a); }
void run_avx512(const Args<double>& a) { run<D512>(a); }

}  // namespace autograd::small_gemm
#endif
