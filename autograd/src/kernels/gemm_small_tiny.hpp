#pragma once
// The plain loop behind gemm's tiny products (internal, not installed; included by gemm.cpp
// only, compiled with the build's own flags).
#include <cstdint>

namespace autograd {
namespace {

// Tiny products (the seed shape's, a few hundred multiply-adds at most) cost less than the
// checks and the set-up of gemm's other routes: a plain loop, each element of C a sum over k in
// order, then times alpha, then plus beta·C (never read when beta = 0), as the small kernel
// computes it. Four elements of a row of C at a time, their sums in registers.
constexpr std::int64_t kTinyWork = 512;  // M·N·K, at most

bool tiny_fits(std::int64_t M, std::int64_t N, std::int64_t K) {
  return M <= kTinyWork && N <= kTinyWork && K > 0 && K <= kTinyWork && M * N * K <= kTinyWork;
}

// Elements j .. j+W-1 of row i of C.
template <class T, bool TA, bool TB, int W>
inline __attribute__((always_inline)) void tiny_block(std::int64_t i, std::int64_t j, std::int64_t K, T alpha,
                                                      const T* A, std::int64_t lda, const T* B, std::int64_t ldb,
                                                      T beta, T* C, std::int64_t ldc) {
  T acc[W] = {};
  for (std::int64_t k = 0; k < K; ++k) {
    const T a = TA ? A[k * lda + i] : A[i * lda + k];
    for (int q = 0; q < W; ++q) acc[q] += a * (TB ? B[(j + q) * ldb + k] : B[k * ldb + j + q]);
  }
  T* c = C + i * ldc + j;
  for (int q = 0; q < W; ++q) c[q] = beta == T(0) ? alpha * acc[q] : alpha * acc[q] + beta * c[q];
}

template <class T, bool TA, bool TB>
void tiny_loop(std::int64_t M, std::int64_t N, std::int64_t K, T alpha, const T* A, std::int64_t lda, const T* B,
               std::int64_t ldb, T beta, T* C, std::int64_t ldc) {
  for (std::int64_t i = 0; i < M; ++i) {
    std::int64_t j = 0;
    for (; j + 4 <= N; j += 4) tiny_block<T, TA, TB, 4>(i, j, K, alpha, A, lda, B, ldb, beta, C, ldc);
    for (; j < N; ++j) tiny_block<T, TA, TB, 1>(i, j, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
}

template <class T>
void tiny_product(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, T alpha, const T* A,
                  std::int64_t lda, const T* B, std::int64_t ldb, T beta, T* C, std::int64_t ldc) {
  if (!ta && !tb) tiny_loop<T, false, false>(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  else if (!ta) tiny_loop<T, false, true>(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  else if (!tb) tiny_loop<T, true, false>(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  else tiny_loop<T, true, true>(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace
}  // namespace autograd
