#pragma once
// The small matrix-product kernel in its instruction-set variants (internal, not installed).
// Plain declarations only: this header is included by the files compiled with their own -m
// flags (see isa.hpp for why they must not share inline code with the rest of the library).
//
//   C[M, N] = alpha·op(A)·Bp + beta·C     (beta = 0 overwrites C, whatever it held)
//
// Bp is op(B) laid out [K, N] (the caller packs a transposed B), rows ldbp apart; op(A)(i, k) is
// A[i·lda + k], or A[k·lda + i] when trans_a. Each element of C is a sum over k in order, one
// fused multiply-add per term, then times alpha, then plus beta·C: the same operations in every
// variant and for every block of C, so the AVX-512 and AVX2 variants give the same bits.
// Precondition: N is a whole number of 8 floats or 4 doubles (32 bytes), K > 0.
#include <cstdint>

namespace autograd::small_gemm {

template <class T>
struct Args {
  bool trans_a;
  std::int64_t M, N, K;
  T alpha;
  const T* A;
  std::int64_t lda;
  const T* Bp;
  std::int64_t ldbp;
  T beta;
  T* C;
  std::int64_t ldc;
};

// C[M, N] = alpha·A·Bᵀ + beta·C with B [N, K] given in place as Bp (rows ldbp apart), trans_a
// false, any N, K > 0: dot products along K (gemm_small_impl.hpp), the same bits in both variants.
void run_nt_avx512(const Args<float>& a);
void run_nt_avx512(const Args<double>& a);
void run_nt_avx2(const Args<float>& a);
void run_nt_avx2(const Args<double>& a);

// dst[c·ldd + r] = alpha·src[r·lds + c] for r < rows, c < cols: the [rows, cols] block at src,
// transposed into the [cols, rows] block at dst (rows ldd apart), each element times alpha (one
// rounding; alpha = 1 copies). So every variant gives the same result. Blocks of 16 x 16
// (AVX-512) or 8 x 8 (AVX2) in registers.
void transpose_avx512(const float* src, std::int64_t lds, std::int64_t rows, std::int64_t cols, float* dst,
                      std::int64_t ldd, float alpha);
void transpose_avx2(const float* src, std::int64_t lds, std::int64_t rows, std::int64_t cols, float* dst,
                    std::int64_t ldd, float alpha);

void run_avx512(const Args<float>& a);
void run_avx512(const Args<double>& a);
void run_avx2(const Args<float>& a);
void run_avx2(const Args<double>& a);

}  // namespace autograd::small_gemm
