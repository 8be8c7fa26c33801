// The small matrix-product kernel for AVX2 + FMA (gemm_small_impl.hpp), compiled with those
// flags (and without AVX-512) whatever the build's own (autograd/CMakeLists.txt); run only when
// the CPU has them. Includes nothing that defines inline code shared with other files (see
// isa.hpp).
#include <cstdint>

#if HEADGRAD_ISA_AVX2
#include <immintrin.h>

#include "kernels/gemm_small_impl.hpp"

namespace autograd::small_gemm {
namespace {

// 8 floats or 4 doubles a register; the caller hands whole vectors of columns only.
struct F256 {
  using R = __m256;
  static constexpr int n = 8, acc = 8;
  static constexpr bool masked = false;
  static R zero() { return _mm256_setzero_ps(); }
  static R set1(float x) { return _mm256_set1_ps(x); }
  static R load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, R x) { _mm256_storeu_ps(p, x); }
  static R load_first(const float* p, int) { return load(p); }
  static void store_first(float* p, R x, int) { store(p, x); }
  static R fma(R a, R b, R c) { return _mm256_fmadd_ps(a, b, c); }
  // The lane sums of x[0..7], ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)) each, in one vector.
  static R sums(const R* x) {
    const R h01 = _mm256_hadd_ps(x[0], x[1]), h23 = _mm256_hadd_ps(x[2], x[3]);
    const R h45 = _mm256_hadd_ps(x[4], x[5]), h67 = _mm256_hadd_ps(x[6], x[7]);
    const R q0 = _mm256_hadd_ps(h01, h23), q1 = _mm256_hadd_ps(h45, h67);
    return _mm256_add_ps(_mm256_permute2f128_ps(q0, q1, 0x20), _mm256_permute2f128_ps(q0, q1, 0x31));
  }
  static R mul(R a, R b) { return _mm256_mul_ps(a, b); }
};
struct D256 {
  using R = __m256d;
  static constexpr int n = 4, acc = 8;
  static constexpr bool masked = false;
  static R zero() { return _mm256_setzero_pd(); }
  static R set1(double x) { return _mm256_set1_pd(x); }
  static R load(const double* p) { return _mm256_loadu_pd(p); }
  static void store(double* p, R x) { _mm256_storeu_pd(p, x); }
  static R load_first(const double* p, int) { return load(p); }
  static void store_first(double* p, R x, int) { store(p, x); }
  static R fma(R a, R b, R c) { return _mm256_fmadd_pd(a, b, c); }
  // The lane sums of x[0..3], (l0 + l1) + (l2 + l3) each, in one vector.
  static R sums(const R* x) {
    const R h01 = _mm256_hadd_pd(x[0], x[1]), h23 = _mm256_hadd_pd(x[2], x[3]);
    return _mm256_add_pd(_mm256_permute2f128_pd(h01, h23, 0x20), _mm256_permute2f128_pd(h01, h23, 0x31));
  }
  static R mul(R a, R b) { return _mm256_mul_pd(a, b); }
};

// One whole block of 8 x 8 floats transposed in registers: pairs of rows interleaved, then
// quadruples within each 128-bit lane, then the two lanes across registers; times alpha unless
// Scaled is false.
template <bool Scaled>
__attribute__((noinline)) void transpose8(const float* s, std::int64_t lds, float* d, std::int64_t ldd, float alpha) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i, s += lds) r[i] = _mm256_loadu_ps(s);
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {  // r[4i + j], lane l: rows 4i..4i+3 at column 4l + j
    r[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    r[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xee);
    r[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    r[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xee);
  }
  const __m256 al = _mm256_set1_ps(alpha);
  auto scaled = [&](__m256 x) { return Scaled ? _mm256_mul_ps(al, x) : x; };
  for (int j = 0; j < 4; ++j) {  // column 4l + j: lane l of r[j] and r[4 + j]
    _mm256_storeu_ps(d + j * ldd, scaled(_mm256_permute2f128_ps(r[j], r[4 + j], 0x20)));
    _mm256_storeu_ps(d + (4 + j) * ldd, scaled(_mm256_permute2f128_ps(r[j], r[4 + j], 0x31)));
  }
}

template <bool Scaled>
void transpose_blocks(const float* src, std::int64_t lds, std::int64_t rows, std::int64_t cols, float* dst,
                      std::int64_t ldd, float alpha) {
  const std::int64_t rows8 = rows / 8 * 8, cols8 = cols / 8 * 8;
  for (std::int64_t r = 0; r < rows8; r += 8)
    for (std::int64_t c = 0; c < cols8; c += 8)
      transpose8<Scaled>(src + r * lds + c, lds, dst + c * ldd + r, ldd, alpha);
  for (std::int64_t r = 0; r < rows; ++r)  // the edges element by element
    for (std::int64_t c = r < rows8 ? cols8 : 0; c < cols; ++c)
      dst[c * ldd + r] = Scaled ? alpha * src[r * lds + c] : src[r * lds + c];
}

}  // namespace

void transpose_avx2(const float* src, std::int64_t lds, std::int64_t rows, std::int64_t cols, float* dst,
                    std::int64_t ldd, float alpha) {
  if (alpha == 1.f) transpose_blocks<false>(src, lds, rows, cols, dst, ldd, alpha);
  else transpose_blocks<true>(src, lds, rows, cols, dst, ldd, alpha);
}

void run_avx2(const Args<float>& a) { run<F256>(a); }
void run_avx2(const Args<double>& a) { run<D256>(a); }
void run_nt_avx2(const Args<float>& a) { run_nt<F256>(a); }
void run_nt_avx2(const Args<double>& a) { run_nt<D256>(a); }

}  // namespace autograd::small_gemm
#endif
