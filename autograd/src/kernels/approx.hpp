#pragma once
// Elementwise float32 kernels in instruction-set variants (internal, not installed): the exact
// gelu and its derivative, whose erf and exp cost the most of the elementwise work of a
// transformer's MLP; the exponentials, maximum and backward slopes of a softmax row; and
// Philox bits for dropout (AVX-512 only). Plain declarations only: approx_avx512.cpp and approx_avx2.cpp, compiled with
// their own -m flags, include this (see isa.hpp for why they share no inline code).
//
// erf and exp are Eigen 3.4's float approximations (the rational erf of SpecialFunctions, the
// Cephes exp), evaluated with the same operations in the same order, so each variant agrees with
// Eigen's vectorised code to an ulp or two, and all its lanes and tails compute alike.
#include <cstdint>

namespace autograd::approx {

// Beyond |x| = 40 gelu's curvature terms are exactly 0 in float32 and float64 (φ(40) = e^-800 and
// 1 - tanh²(u) both round to 0), so its derivatives may take x clamped there (the kernel below and
// the rules of ops/elementwise_unary.cpp).
inline constexpr double kGeluFlat = 40.0;

// y = x/2 · (1 + erf(x/√2)), n elements.
void gelu_avx512(const float* x, float* y, std::int64_t n);
void gelu_avx2(const float* x, float* y, std::int64_t n);
// dx = dy · (Φ(x) + x·φ(x)),  Φ(x) = (1 + erf(x/√2))/2,  φ(x) = e^(-x²/2)/√(2π), n elements.
void gelu_backward_avx512(const float* dy, const float* x, float* dx, std::int64_t n);
void gelu_backward_avx2(const float* dy, const float* x, float* dx, std::int64_t n);

// y = exp(x − m), exactly 0 where x = −inf, n elements; returns Σ y (summed in vector lanes,
// then across them): the exponentials of a softmax row whose maximum is m.
float exp_shifted_avx512(const float* x, float* y, std::int64_t n, float m);
float exp_shifted_avx2(const float* x, float* y, std::int64_t n, float m);

// p = exp(p − m), exactly 0 where p = −inf, and g = p·(g − c) with that new p, n elements, in
// one pass (a softmax row's weights and the slopes dS = P ⊙ (dP − c) of its backward).
void exp_slopes_avx512(float* p, float* g, std::int64_t n, float m, float c);
void exp_slopes_avx2(float* p, float* g, std::int64_t n, float m, float c);

// Softmax of `rows` contiguous rows of `cols` entries (rows > 0, cols a positive multiple of the
// vector width: 16 floats for AVX-512, 8 for AVX2), in place, all rows shifted by the largest row
// maximum: done only when no entry is NaN and every row maximum is finite and within `spread` of
// the largest; otherwise false, p untouched.
bool softmax_rows_shared_avx512(float* p, std::int64_t rows, std::int64_t cols, float spread);
bool softmax_rows_shared_avx2(float* p, std::int64_t rows, std::int64_t cols, float spread);

// The backward of softmax on `rows` rows of `cols` entries (a multiple of the vector width), rows
// ld apart: with c_i = Σ_j g_ij·p_ij, s_ij = p_ij·(g_ij − c_i) into out (when not null) and
// scale·s_ij into g.
void softmax_slopes_rows_avx512(const float* p, float* g, float* out, std::int64_t rows, std::int64_t cols,
                                std::int64_t ld, float scale);
void softmax_slopes_rows_avx2(const float* p, float* g, float* out, std::int64_t rows, std::int64_t cols,
                              std::int64_t ld, float scale);

// The largest of x[0..n) (n > 0), NaN when one of them is: a softmax row's maximum.
float max_avx512(const float* x, std::int64_t n);
float max_avx2(const float* x, std::int64_t n);

// Philox-4x32-10 (kernels/philox.hpp, whose numbering this keeps) of the 16 counters c .. c + 15
// under key (k0, k1), in element order: out[4·g + lane] = word `lane` of counter c + g.
void philox_bits_avx512(std::uint32_t k0, std::uint32_t k1, std::uint64_t c, std::uint32_t* out);

// The same through the variant in use; false (nothing done) for the generic one.
bool gelu(const float* x, float* y, std::int64_t n);
bool gelu_backward(const float* dy, const float* x, float* dx, std::int64_t n);
bool exp_shifted(const float* x, float* y, std::int64_t n, float m, float& sum);
bool exp_slopes(float* p, float* g, std::int64_t n, float m, float c);
bool max(const float* x, std::int64_t n, float& max);
// The floats in one vector of the variant in use: 16 (AVX-512), 8 (AVX2), 0 (generic).
int vector_width();
// These two: false also when cols is not a positive multiple of vector_width() (tails in masked
// loads and stores made rows of 8 slower than Eigen's loop).
bool softmax_rows_shared(float* p, std::int64_t rows, std::int64_t cols, float spread);
bool softmax_slopes_rows(const float* p, float* g, float* out, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                         float scale);
bool philox_bits(std::uint32_t k0, std::uint32_t k1, std::uint64_t c, std::uint32_t* out);  // AVX-512 only

}  // namespace autograd::approx
