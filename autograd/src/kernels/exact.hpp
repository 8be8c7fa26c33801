#pragma once
// Float32 loops in instruction-set variants (internal, not installed): the binary arithmetic of
// elementwise ops and the rows of layer_norm, which a portable build's Eigen code would run with
// SSE2 only. Plain declarations only: exact_avx512.cpp and exact_avx2.cpp, compiled with their own -m
// flags (and -ffp-contract=off, so that no multiply and add are fused behind the code's back),
// include this (see isa.hpp for why they share no inline code).
//
// The binary arithmetic is one IEEE operation per element: every variant gives the bits of the
// generic code. The layer_norm statistics are sums in a different order (vector lanes, then
// across them); see layer_norm_forward.
#include <cstdint>

namespace autograd::exact {

enum class Op : int { Add = 0, Sub = 1, Mul = 2, Div = 3 };

// y[i] = a[i·sa] ∘ b[i·sb], n elements; sa and sb are 1 (an array) or 0 (one value repeated).
void binary_avx512(Op op, const float* a, std::int64_t sa, const float* b, std::int64_t sb, float* y, std::int64_t n);
void binary_avx2(Op op, const float* a, std::int64_t sa, const float* b, std::int64_t sb, float* y, std::int64_t n);

// One layer_norm row of n elements: μ = Σx / n and σ² = Σ(x − μ)² / n accumulated in double,
// r = 1/√(σ² + eps), y = ((x − μ)·r)·w + b in float (w and b may be null); stats = {μ, r}. The
// two sums add the elements in vector lanes, then across the lanes: against the generic code's
// order they differ by a few units of double rounding (n·2⁻⁵³ relative at most), far below the
// float32 rounding of the results.
void layer_norm_forward_avx512(const float* x, std::int64_t n, const float* w, const float* b, double eps,
                               double* stats, float* y);
void layer_norm_forward_avx2(const float* x, std::int64_t n, const float* w, const float* b, double eps,
                             double* stats, float* y);

// The gradients of one layer_norm row of n elements (stats = {μ, r} of the forward pass), with
// x̂ = (x − μ)·r and dx̂ = dy·w (dy without a weight): db += dy and dw += dy·x̂ when not null, and
// when dx is not null dx = r·((dx̂ − mean(dx̂)) − x̂·mean(dx̂·x̂)), the two means summed in float
// vector lanes, then across them (error n·2⁻²⁴ relative to Σ|·| at most, as any float sum).
void layer_norm_backward_avx512(const float* x, const float* dy, std::int64_t n, const float* w,
                                const double* stats, float* dx, float* dw, float* db);
void layer_norm_backward_avx2(const float* x, const float* dy, std::int64_t n, const float* w,
                              const double* stats, float* dx, float* dw, float* db);

// The same through the variant in use; false (nothing done) for the generic one.
bool binary(Op op, const float* a, std::int64_t sa, const float* b, std::int64_t sb, float* y, std::int64_t n);
bool layer_norm_forward(const float* x, std::int64_t n, const float* w, const float* b, double eps, double* stats,
                        float* y);
bool layer_norm_backward(const float* x, const float* dy, std::int64_t n, const float* w, const double* stats,
                         float* dx, float* dw, float* db);

}  // namespace autograd::exact
