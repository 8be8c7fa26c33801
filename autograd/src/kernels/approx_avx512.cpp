// The elementwise kernels of approx.hpp for AVX-512 (approx_impl.hpp), compiled with AVX-512 flags
// whatever the build's own (autograd/CMakeLists.txt); run only when the CPU has AVX-512.
// Includes nothing that defines inline code shared with other files (see isa.hpp).
#include <cstdint>

#if HEADGRAD_ISA_AVX512
#include <immintrin.h>

#include "kernels/approx_impl.hpp"

namespace autograd::approx {
namespace {

// 16 floats; min and max as std::min and std::max (the first argument when either is NaN), as
// Eigen's pmin and pmax.
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
  static R zero_where_below(R a, R b, R x) { return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(a, b, _CMP_NLT_UQ), x); }
  static R first_or(R a, R b, int m) { return _mm512_mask_mov_ps(b, first(m), a); }
  static float sum(R a) { return _mm512_reduce_add_ps(a); }
  static float hmax(R a) { return _mm512_reduce_max_ps(a); }
  // The sums (or maxima) of 16 vectors across their lanes, in one tree of shuffles for all of
  // them: at each level the halves of two vectors are combined, in the order of
  // _mm512_reduce_add_ps (halves of 256 bits, of 128, pairs, neighbours), so each sum has the
  // bits of sum(). The lanes then hold sum 4·e + L at 4·L + e, put back in order at the end.
  template <class Op>
  static void across16(const R* v, float* out, Op op) {
    R a[8], b[4], c[2];
    for (int i = 0; i < 8; ++i)
      a[i] = op(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    for (int i = 0; i < 4; ++i)
      b[i] = op(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    for (int i = 0; i < 2; ++i)
      c[i] = op(_mm512_shuffle_ps(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                _mm512_shuffle_ps(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    const R f = op(_mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
                   _mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_storeu_ps(out, _mm512_permutexvar_ps(order, f));
  }
  static void sums(const R* v, float* out) { across16(v, out, add); }
  static void maxima(const R* v, float* out) { across16(v, out, max); }
  static R nan_from(R a, R x) { return _mm512_mask_mov_ps(a, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x); }
  static R mul(R a, R b) { return _mm512_mul_ps(a, b); }
  static R div(R a, R b) { return _mm512_div_ps(a, b); }
  static R fma(R a, R b, R c) { return _mm512_fmadd_ps(a, b, c); }
  static R min(R a, R b) { return _mm512_min_ps(b, a); }
  static R max(R a, R b) { return _mm512_max_ps(b, a); }
  static R floor(R a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEG_INF); }
  // y·2^m in one instruction (vscalefps), rounded once. Eigen's pldexp (four power-of-two
  // factors, as the AVX2 variant has it) gives the same bits for exp's y (in [1/2, 2]) and m in
  // [-128, 128]: its first three products stay normal, so only its last one rounds, denormal
  // results included (tests/kernels/test_isa_exp.cpp runs every float through both).
  static R ldexp(R y, R m) { return _mm512_scalef_ps(y, m); }
};

// One Philox round on 8 counters side by side, one in each 64-bit lane with its word in the low
// half (the high halves carry junk that nothing reads): vpmuludq multiplies the low halves to
// the full 64 bits, whose high word is a shift away and whose low half is the new low word.
inline void philox_round8(__m512i& x0, __m512i& x1, __m512i& x2, __m512i& x3, __m512i m0, __m512i m1, __m512i k0,
                          __m512i k1) {
  const __m512i p0 = _mm512_mul_epu32(x0, m0), p1 = _mm512_mul_epu32(x2, m1);
  constexpr int kXor3 = 0x96;  // a ^ b ^ c
  x0 = _mm512_ternarylogic_epi32(_mm512_srli_epi64(p1, 32), x1, k0, kXor3);
  x2 = _mm512_ternarylogic_epi32(_mm512_srli_epi64(p0, 32), x3, k1, kXor3);
  x1 = p1;
  x3 = p0;
}

}  // namespace

// Philox-4x32-10 as kernels/philox.hpp has it (its constants: round multipliers 0xD2511F53 and
// 0xCD9E8D57, key increments 0x9E3779B9 and 0xBB67AE85): counters c .. c + 7 in the 64-bit
// lanes of one set of four vectors, c + 8 .. c + 15 in another.
void philox_bits_avx512(std::uint32_t k0, std::uint32_t k1, std::uint64_t c, std::uint32_t* out) {
  const __m512i iota = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7);
  const __m512i c0 = _mm512_add_epi64(_mm512_set1_epi64(static_cast<long long>(c)), iota);
  const __m512i c1 = _mm512_add_epi64(c0, _mm512_set1_epi64(8));
  // words 0 and 1 of counter c + g: the low and high halves of c + g (its carry included)
  __m512i a0 = c0, a1 = _mm512_srli_epi64(c0, 32), a2 = _mm512_setzero_si512(), a3 = a2;
  __m512i b0 = c1, b1 = _mm512_srli_epi64(c1, 32), b2 = a2, b3 = a2;
  const __m512i m0 = _mm512_set1_epi64(0xD2511F53), m1 = _mm512_set1_epi64(0xCD9E8D57);
  for (int r = 0; r < 10; ++r) {
    const __m512i key0 = _mm512_set1_epi32(static_cast<int>(k0)), key1 = _mm512_set1_epi32(static_cast<int>(k1));
    philox_round8(a0, a1, a2, a3, m0, m1, key0, key1);
    philox_round8(b0, b1, b2, b3, m0, m1, key0, key1);
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  // word w of counters 0..15 in one vector: the low halves of a_w, then of b_w
  const __m512i evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i x0 = _mm512_permutex2var_epi32(a0, evens, b0), x1 = _mm512_permutex2var_epi32(a1, evens, b1);
  const __m512i x2 = _mm512_permutex2var_epi32(a2, evens, b2), x3 = _mm512_permutex2var_epi32(a3, evens, b3);
  // transpose: within each 128-bit lane L, rows r hold counter 4·L + r's four words ...
  const __m512i t = _mm512_unpacklo_epi32(x0, x1), u = _mm512_unpackhi_epi32(x0, x1);
  const __m512i v = _mm512_unpacklo_epi32(x2, x3), w = _mm512_unpackhi_epi32(x2, x3);
  const __m512i r0 = _mm512_unpacklo_epi64(t, v), r1 = _mm512_unpackhi_epi64(t, v);
  const __m512i r2 = _mm512_unpacklo_epi64(u, w), r3 = _mm512_unpackhi_epi64(u, w);
  // ... then output k takes 128-bit lane k of r0..r3: counters 4·k .. 4·k + 3
  const __m512i a = _mm512_shuffle_i32x4(r0, r1, _MM_SHUFFLE(1, 0, 1, 0));
  const __m512i b = _mm512_shuffle_i32x4(r2, r3, _MM_SHUFFLE(1, 0, 1, 0));
  const __m512i e = _mm512_shuffle_i32x4(r0, r1, _MM_SHUFFLE(3, 2, 3, 2));
  const __m512i f = _mm512_shuffle_i32x4(r2, r3, _MM_SHUFFLE(3, 2, 3, 2));
  _mm512_storeu_si512(out, _mm512_shuffle_i32x4(a, b, _MM_SHUFFLE(2, 0, 2, 0)));
  _mm512_storeu_si512(out + 16, _mm512_shuffle_i32x4(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
  _mm512_storeu_si512(out + 32, _mm512_shuffle_i32x4(e, f, _MM_SHUFFLE(2, 0, 2, 0)));
  _mm512_storeu_si512(out + 48, _mm512_shuffle_i32x4(e, f, _MM_SHUFFLE(3, 1, 3, 1)));
}

void gelu_avx512(const float* x, float* y, std::int64_t n) { gelu_run<F512>(x, y, n); }
void gelu_backward_avx512(const float* dy, const float* x, float* dx, std::int64_t n) {
  gelu_backward_run<F512>(dy, x, dx, n);
}

float exp_shifted_avx512(const float* x, float* y, std::int64_t n, float m) { return exp_shifted_run<F512>(x, y, n, m); }
float max_avx512(const float* x, std::int64_t n) { return max_run<F512>(x, n); }
void softmax_slopes_rows_avx512(const float* p, float* g, float* out, std::int64_t rows, std::int64_t cols,
                                std::int64_t ld, float scale) {
  softmax_slopes_rows_run<F512>(p, g, out, rows, cols, ld, scale);
}
bool softmax_rows_shared_avx512(float* p, std::int64_t rows, std::int64_t cols, float spread) {
  return softmax_rows_shared_run<F512>(p, rows, cols, spread);
}
void exp_slopes_avx512(float* p, float* g, std::int64_t n, float m, float c) {
  exp_slopes_run<F512>(p, g, n, m, c);
}

}  // namespace autograd::approx
#endif
