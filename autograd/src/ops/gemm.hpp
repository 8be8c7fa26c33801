#pragma once
// One matrix product for every op (internal, not installed):
//
//   C = alpha·op(A)·op(B) + beta·C      op(X) = X or Xᵀ; all row-major, C is [M, N]
//
// A is stored [M, K] (or [K, M] when trans_a), B [K, N] (or [N, K] when trans_b); lda, ldb, ldc
// are the row strides in elements (>= the stored column count), so a block of rows and columns
// of a larger matrix is used in place. beta = 0 overwrites C (whatever it held, NaN included).
//
// Large products go to the BLAS found at configure time (OpenBLAS, HEADGRAD_BLAS), small ones
// (below about 1e5 multiply-adds, see gemm.cpp for the measured threshold) to a small AVX2
// kernel of our own when N is a whole number of vectors, else to Eigen. Threads
// (ag::set_num_threads, i.e. OpenMP's count): inside one of our parallel regions a product runs
// on the calling thread; outside, a large one is cut into pieces by its shape (rows or columns
// of C, or the summed dimension K when C is small and K long) and the pieces are shared among
// the threads, each a single-threaded BLAS call, so the result does not depend on the thread
// count (Eigen's own threading has the same property).
#include <cstdint>

namespace autograd {

template <class T>
void gemm(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, T alpha, const T* A,
          std::int64_t lda, const T* B, std::int64_t ldb, T beta, T* C, std::int64_t ldc);

extern template void gemm<float>(bool, bool, std::int64_t, std::int64_t, std::int64_t, float, const float*,
                                 std::int64_t, const float*, std::int64_t, float, float*, std::int64_t);
extern template void gemm<double>(bool, bool, std::int64_t, std::int64_t, std::int64_t, double, const double*,
                                  std::int64_t, const double*, std::int64_t, double, double*, std::int64_t);

}  // namespace autograd
