#pragma once
// Matrix products through libxsmm's JIT kernels (internal, not installed; gemm.cpp's backend for
// small and mid-size products when the build found libxsmm, HEADGRAD_LIBXSMM).
//
// libxsmm (1.x) generates one kernel per shape, strides and flags for the machine's instruction
// set, the first time it is asked for. Measured against the other routes (docs/gemm_choice.md) it
// wins the products op(A)·B of 2^12 to 2^27 multiply-adds: the per-head P·V, dS·K, Pᵀ·dO and
// dSᵀ·Q of attention and the projections of the shapes up to medium. It has no kernel for a
// transposed B in row-major terms: gemm.cpp lays such a B out [K, N] first (its A·Bᵀ products
// of this range, Q·Kᵀ, dO·Vᵀ and dY·Wᵀ among them, are then faster than through the BLAS). Each thread keeps the kernels it has used in a table of its own, so a warm call
// takes no lock, allocates nothing and generates nothing.
#include <cstdint>

namespace autograd::xsmm {

// Whether libxsmm takes C = alpha·op(A)·B + beta·C (see gemm.hpp for the arguments): built with
// it, B not transposed, beta 0 or 1, alpha not 0, M·N·K from 2^12 to below 2^27, and every size
// and stride within libxsmm's 32-bit integers. Depends on the arguments alone.
template <class T>
bool fits(bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, T alpha, std::int64_t lda,
          std::int64_t ldb, T beta, std::int64_t ldc);

// The same for the products past that range, which gemm.cpp gives libxsmm in blocks (each block
// one call): everything as fits says but M·N·K, here 2^27 and up.
template <class T>
bool fits_in_blocks(bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, T alpha, std::int64_t lda,
                    std::int64_t ldb, T beta, std::int64_t ldc);

// The product on the calling thread, for arguments that fit; false (C untouched) when libxsmm
// gives no kernel for it (then the caller computes it another way). A kernel's order of summation
// may depend on M and N (tests/kernels/test_gemm_paths.cpp saw a product of 300x67x65 differ from
// its pieces of rows), so gemm.cpp cuts a product by its shape alone. alpha other than 1 scales libxsmm's op(A)·B afterwards, with
// beta = 1 through a scratch of the calling thread (kept between calls).
template <class T>
bool product(bool trans_a, std::int64_t M, std::int64_t N, std::int64_t K, T alpha, const T* A, std::int64_t lda,
             const T* B, std::int64_t ldb, T beta, T* C, std::int64_t ldc);

// A kernel of libxsmm, called as kernel(B, A, C) (libxsmm's column-major order; see product).
template <class T>
using Kernel = void (*)(const T* b, const T* a, T* c, ...);

// libxsmm's kernel for C = op(A)·B + beta·C with alpha = 1, for arguments that fit; null when
// libxsmm has none. product() calls the same kernel for the same arguments (so the same bits);
// a caller with many operands of one shape looks it up once.
template <class T>
Kernel<T> kernel(bool trans_a, std::int64_t M, std::int64_t N, std::int64_t K, std::int64_t lda, std::int64_t ldb,
                 T beta, std::int64_t ldc);

// The instruction set libxsmm generates code for ("" when built without it).
const char* target();


}  // namespace autograd::xsmm
