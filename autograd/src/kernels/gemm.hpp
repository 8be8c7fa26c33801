#pragma once
// One matrix product for every op (internal, not installed):
//
//   C = alpha·op(A)·op(B) + beta·C      op(X) = X or Xᵀ; all row-major, C is [M, N]
//
// A is stored [M, K] (or [K, M] when trans_a), B [K, N] (or [N, K] when trans_b); lda, ldb, ldc
// are the row strides in elements (>= the stored column count), so a block of rows and columns
// of a larger matrix is used in place. beta = 0 overwrites C (whatever it held, NaN included).
//
// Routes, by shape alone (see gemm.cpp for the measured thresholds and docs/gemm_choice.md):
// tiny products (at most 512 multiply-adds) a plain loop, or the small kernel where it fits;
// products of 2^12 to 2^27 multiply-adds libxsmm's JIT kernels when the build has it
// (HEADGRAD_LIBXSMM, gemm_xsmm.hpp; a transposed B laid out [K, N] first, times alpha); large products the BLAS found at configure time (OpenBLAS,
// HEADGRAD_BLAS), or libxsmm in cache-sized blocks where OpenBLAS runs narrower kernels than
// ours (large_products_in_blocks); small ones (below about 1e5 multiply-adds) a small kernel of our own (AVX-512
// or AVX2, chosen at run time: kernels/isa.hpp) when N is a whole number of 32 bytes or, for A·Bᵀ,
// C has fewer than 16 rows; else Eigen. Threads
// (ag::set_num_threads, i.e. OpenMP's count): a large product is cut into pieces by its shape
// alone (rows or columns of C, or the summed dimension K when C is small and K long, the partial
// sums added in a fixed order), each piece one single-threaded BLAS, libxsmm or Eigen call (their
// own threading is off). Outside our parallel regions the pieces are shared among the threads;
// inside one, or with one thread, they run one after another on the calling thread. So the
// result has the same bits at any thread count and in any context.
#include <cstdint>

#include "gemm_xsmm.hpp"  // (a path relative to this header: tests include it by its own path)

namespace autograd {

template <class T>
void gemm(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, T alpha, const T* A,
          std::int64_t lda, const T* B, std::int64_t ldb, T beta, T* C, std::int64_t ldc);

// One product's shape, strides, alpha and beta, fixed for many operands (the per-slice products
// of the attention cores): operator() gives the bits gemm gives for the same arguments. Where
// gemm would make the product one libxsmm call, its kernel is looked up once, here, and called
// directly (per call, no route chosen and no table searched: at 32x32x16 that overhead was about
// a quarter of the product); otherwise operator() is gemm.
template <class T>
class PreparedGemm {
 public:
  PreparedGemm(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, T alpha, std::int64_t lda,
               std::int64_t ldb, T beta, std::int64_t ldc);
  void operator()(const T* A, const T* B, T* C) const {
    if (kernel_ != nullptr) {
      kernel_(B, A, C);
    } else {
      gemm<T>(trans_a_, trans_b_, M_, N_, K_, alpha_, A, lda_, B, ldb_, beta_, C, ldc_);
    }
  }

 private:
  bool trans_a_, trans_b_;
  std::int64_t M_, N_, K_;
  T alpha_;
  std::int64_t lda_, ldb_;
  T beta_;
  std::int64_t ldc_;
  xsmm::Kernel<T> kernel_ = nullptr;
};

// True when products from 2^27 multiply-adds go to libxsmm in blocks instead of OpenBLAS: the
// build has libxsmm, headgrad's kernels are AVX-512 and OpenBLAS's are AVX2 (its cores "Haswell"
// and "Zen") or there is no BLAS. Changes within a process only with the kernel variant (HEADGRAD_ISA, set_kernel_isa).
bool large_products_in_blocks();

// out[c·ldo + r] = alpha·B[r·ldb + c] for r < rows, c < cols: B [rows, cols] transposed into
// out [cols, rows], each element times alpha (exact copies when alpha = 1), with the vector
// transposes of the instruction set in use. What gemm does to a transposed B; a caller that
// multiplies many row blocks by the same Bᵀ can do it once and pass the result untransposed.
template <class T>
void transpose_scaled(const T* B, std::int64_t ldb, std::int64_t rows, std::int64_t cols, T alpha, T* out,
                      std::int64_t ldo);

extern template void gemm<float>(bool, bool, std::int64_t, std::int64_t, std::int64_t, float, const float*,
                                 std::int64_t, const float*, std::int64_t, float, float*, std::int64_t);
extern template void gemm<double>(bool, bool, std::int64_t, std::int64_t, std::int64_t, double, const double*,
                                  std::int64_t, const double*, std::int64_t, double, double*, std::int64_t);

}  // namespace autograd
