// The matrix product behind matmul, linear and the attention cores (see gemm.hpp).
#include "gemm.hpp"

#include <algorithm>
#include <climits>
#include <string>
#include <type_traits>
#include <vector>

#include <Eigen/Core>
#include <omp.h>

#include "autograd/tensor.hpp"
#include "kernels/gemm_small.hpp"
#include "kernels/gemm_small_tiny.hpp"
#include "kernels/gemm_xsmm.hpp"
#include "kernels/isa.hpp"
#include "kernels/parallel.hpp"

#ifdef HEADGRAD_HAVE_BLAS
#include <cblas.h>
#endif

namespace autograd {

namespace {

// Eigen's product on strided maps of the row-major buffers.
template <class T>
void eigen_gemm(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, T alpha, const T* A,
                std::int64_t lda, const T* B, std::int64_t ldb, T beta, T* C, std::int64_t ldc) {
  using Stride = Eigen::OuterStride<>;
  using Map = Eigen::Map<RowMatrix<T>, Eigen::Unaligned, Stride>;
  using ConstMap = Eigen::Map<const RowMatrix<T>, Eigen::Unaligned, Stride>;
  Map c(C, M, N, Stride(ldc));
  if (K == 0 || alpha == T(0)) {  // nothing to add: C = beta·C
    if (beta == T(0)) {
      c.setZero();
    } else if (beta != T(1)) {
      c *= beta;
    }
    return;
  }
  const ConstMap a(A, trans_a ? K : M, trans_a ? M : K, Stride(lda));
  const ConstMap b(B, trans_b ? N : K, trans_b ? K : N, Stride(ldb));
  auto run = [&](const auto& op_a, const auto& op_b) {
    if (beta == T(0)) {
      c.noalias() = alpha * op_a * op_b;
    } else {
      if (beta != T(1)) c *= beta;
      c.noalias() += alpha * op_a * op_b;
    }
  };
  if (!trans_a && !trans_b) run(a, b);
  else if (!trans_a) run(a, b.transpose());
  else if (!trans_b) run(a.transpose(), b);
  else run(a.transpose(), b.transpose());
}

// alpha·B, B [rows, cols] (rows ldb apart), transposed into a scratch of the calling thread,
// [cols, rows] (kept between calls: no allocation once warm; valid until the thread's next call).
template <class T>
const T* transposed(const T* B, std::int64_t ldb, std::int64_t rows, std::int64_t cols, T alpha = T(1)) {
  thread_local std::vector<T> scratch;
  if (scratch.size() < static_cast<std::size_t>(rows * cols)) scratch.resize(static_cast<std::size_t>(rows * cols));
  transpose_scaled(B, ldb, rows, cols, alpha, scratch.data(), rows);
  return scratch.data();
}

// Small products (the per-head products of small attention shapes, 32x32x16 and the like) go to
// a register-blocked kernel of our own (gemm_small.hpp), in the variant of the instruction set
// in use (kernels/isa.hpp: AVX-512 or AVX2 + FMA, chosen at run time in every build; none in the
// generic one, which leaves them to Eigen). It skips Eigen's packing and blocking: 2-4x faster
// than Eigen for 32x16x32, 32x32x16 and 32x32x128 (one thread, AVX2, the benchmark machine),
// and it computes every element of C the same way whatever the rest of the product, so results
// do not depend on how a caller cuts a product. Both variants take the same products and give
// the same bits. Used when N is a whole number of 32 bytes; with B transposed only from 16 rows
// of C up (the transposition of B is paid once for all rows; fewer rows: nt_kernel_fits).
template <class T>
bool small_kernel_fits(bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K) {
  constexpr std::int64_t lanes = 32 / sizeof(T);
  return N % lanes == 0 && (!trans_b || M >= 16) && M * N * K < (std::int64_t{1} << 17);
}

// A·Bᵀ with fewer than 16 rows of C: dot products along K, no packing (gemm_small.hpp, run_nt);
// 1.1-2x faster than Eigen for the tiny shape's 8x32x96 and 8x8x8, native build or not. From 8
// columns and 8 terms (fewer: the tiny loop or Eigen, 2x faster than its partial vectors).
bool nt_kernel_fits(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K) {
  return trans_b && !trans_a && M < 16 && N >= 8 && K >= 8 && M * N * K < (std::int64_t{1} << 17);
}

// C = alpha·op(A)·op(B) + beta·C through the small kernel when the instruction set has one and
// the product fits it (K > 0, alpha != 0); false (nothing done) otherwise.
template <class T>
bool small_product(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, T alpha, const T* A,
                   std::int64_t lda, const T* B, std::int64_t ldb, T beta, T* C, std::int64_t ldc) {
  const isa::Isa variant = isa::active();
  if (variant == isa::Isa::Generic || K <= 0 || alpha == T(0)) return false;
  if (nt_kernel_fits(ta, tb, M, N, K)) {
    const small_gemm::Args<T> args{false, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc};
#if HEADGRAD_ISA_AVX512
    if (variant == isa::Isa::Avx512) {
      small_gemm::run_nt_avx512(args);
      return true;
    }
#endif
#if HEADGRAD_ISA_AVX2
    small_gemm::run_nt_avx2(args);
    return true;
#else
    return false;
#endif
  }
  if (!small_kernel_fits<T>(tb, M, N, K)) return false;
  const T* Bp = B;
  std::int64_t ldbp = ldb;
  if (tb) {  // op(B)(k, j) = B[j·ldb + k]: lay it out [K, N]
    Bp = transposed(B, ldb, N, K);
    ldbp = N;
  }
  const small_gemm::Args<T> args{ta, M, N, K, alpha, A, lda, Bp, ldbp, beta, C, ldc};
#if HEADGRAD_ISA_AVX512
  if (variant == isa::Isa::Avx512) {
    small_gemm::run_avx512(args);
    return true;
  }
#endif
#if HEADGRAD_ISA_AVX2
  small_gemm::run_avx2(args);
  return true;
#else
  return false;
#endif
}

#ifdef HEADGRAD_HAVE_BLAS
// When the BLAS takes a product. Measured on the benchmark machine (AMD EPYC Zen 3, AVX2+FMA,
// one thread, OpenBLAS 0.3.21 against Eigen 3.4, float32, all three transpose cases used here):
//   - below ~1e5 multiply-adds Eigen is 5-25 % faster (32x16x32: Eigen 1.2x; 64x64x16: 1.2x);
//   - around 1.3e5 (64x64x32, 48x48x48) they tie;
//   - from 2.6e5 up OpenBLAS wins, 1.1-1.6x (128x32x128: 1.2-1.6x; 128x128x128: 1.5x;
//     2048x128x128: 1.3-1.5x), except when one dimension is as thin as 16 (128x128x16: Eigen
//     1.15x), where OpenBLAS's packing does not pay.
constexpr std::int64_t kBlasMinWork = std::int64_t{1} << 17;  // M·N·K
constexpr std::int64_t kBlasMinDim = 32;                       // min(M, N, K)

bool use_blas(std::int64_t M, std::int64_t N, std::int64_t K, std::int64_t lda, std::int64_t ldb,
              std::int64_t ldc) {
  if (std::min({M, N, K}) < kBlasMinDim || M * N * K < kBlasMinWork) return false;
  if (std::max({M, N, K, lda, ldb, ldc}) > INT_MAX) return false;  // blasint is 32-bit
  // A pthreads build of OpenBLAS does not see our threads: keep it on one thread for good (the
  // OpenMP build follows omp_get_max_threads(), which cut_product holds at 1 around each call).
  static const bool configured = [] {
    if (openblas_get_parallel() == 1) openblas_set_num_threads(1);
    return true;
  }();
  return configured;
}

template <class T>
void blas_call(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, T alpha, const T* A,
               std::int64_t lda, const T* B, std::int64_t ldb, T beta, T* C, std::int64_t ldc) {
  const auto ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
  const auto m = static_cast<blasint>(M), n = static_cast<blasint>(N), k = static_cast<blasint>(K);
  const auto la = static_cast<blasint>(lda), lb = static_cast<blasint>(ldb), lc = static_cast<blasint>(ldc);
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, A, la, B, lb, beta, C, lc);
  } else {
    cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, alpha, A, la, B, lb, beta, C, lc);
  }
}
#else
bool use_blas(std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t) { return false; }
template <class T>
void blas_call(bool, bool, std::int64_t, std::int64_t, std::int64_t, T, const T*, std::int64_t, const T*, std::int64_t,
               T, T*, std::int64_t) {}
#endif  // HEADGRAD_HAVE_BLAS

// Threads. Both OpenBLAS and Eigen give results that depend on how they cut a product among
// their threads (Eigen's blocking of K follows its thread count), so neither chooses: Eigen's
// own threading is off (set_num_threads keeps Eigen::setNbThreads at 1), OpenBLAS is held at one
// thread, and outside our parallel regions a large product is cut into pieces by its shape
// alone, the pieces are shared among our threads, and each is one single-threaded call. Whatever
// the thread count, every element is computed the same way.
// Pieces as small as half a million multiply-adds and 64 rows pay at two threads: the toy
// shape's projections (256x192x64, 256x64x64) run in 2 pieces, about 1.3x faster per step
// (bench_attention --shapes toy --threads 2, interleaved rounds on a quiet machine).
constexpr std::int64_t kPieceWork = std::int64_t{1} << 19;  // multiply-adds per piece, at least
constexpr std::int64_t kPieceMin = 64;                      // rows (or columns) per piece, at least
// At most 4 pieces: enough for the 1-2 threads this is tuned for (and 4), while each extra piece
// packs the operand it does not cut once more (single-thread cost within the noise of the
// measurement for 2048x384x384 cut in 4 or 8). A count of 1, 2 or 4, so that 2 threads get
// equal shares.
constexpr std::int64_t kMaxPieces = 4;
std::int64_t whole_pieces(std::int64_t p) { return p >= 4 ? 4 : p >= 2 ? 2 : 1; }

// A product whose C is too small to cut as finely (a weight gradient Xᵀ·dY: [in, out] summed over
// every row of a batch) is cut along K instead, when K is long: piece p computes
// alpha·op(A)_p·op(B)_p over its run of K, piece 0 into C (with beta), the others into scratch,
// and the partial sums are added to C in piece order. Again the cut depends on the shape alone,
// so every thread count adds the same numbers in the same order. Runs of 128 terms pay already:
// on a Zen 5, one thread, the toy shape's 64x192x256 weight gradient (A transposed) took 28 µs
// in two runs of K where its two pieces of 96 columns took 30, and the char GPT's 128x512x768
// 467 µs in four runs of K against 517 in four pieces of columns (bench_gemm_libs --filter dW).
constexpr std::int64_t kPieceMinK = 128;  // summed terms per K piece, at least

// How a product is cut: `count` pieces of `step` rows of C (by_rows), columns of C, or terms of K.
struct Cut {
  bool by_k = false, by_rows = true;
  std::int64_t length = 0, step = 0, count = 1;
};

Cut cut_of(std::int64_t M, std::int64_t N, std::int64_t K) {
  Cut c;
  // Cut the longer side of C into pieces of whole 16-row (or column) strips.
  c.by_rows = M >= N;
  const std::int64_t side = c.by_rows ? M : N;
  const std::int64_t work_pieces = M * N * K / kPieceWork;
  std::int64_t pieces = whole_pieces(std::min({kMaxPieces, side / kPieceMin, work_pieces}));
  // C too small to cut as finely as K, or K the longer (a weight gradient: cutting K packs
  // nothing twice, cutting C packs the uncut operand once per piece): cut K (see kPieceMinK), in
  // steps of whole 16-term runs.
  const std::int64_t k_pieces = whole_pieces(std::min({kMaxPieces, K / kPieceMinK, work_pieces}));
  c.by_k = k_pieces > pieces || (k_pieces > 1 && k_pieces == pieces && K > side);
  if (c.by_k) pieces = k_pieces;
  c.length = c.by_k ? K : side;
  c.step = std::max<std::int64_t>(((c.length + pieces - 1) / pieces + 15) / 16 * 16, 1);
  c.count = (c.length + c.step - 1) / c.step;
  return c;
}

// C = alpha·op(A)·op(B) + beta·C through `call` (one single-threaded product of the backend), cut
// as cut_of says wherever it runs: its pieces are shared among the threads outside a parallel
// region, and run one after another on the calling thread inside one (a batch of products, each
// on one thread of a team) or with one thread. `hold_omp` holds OpenMP's thread count at 1
// around calls made outside a parallel region (OpenBLAS's OpenMP build follows it).
template <class T, class Call>
void cut_product(Call call, bool hold_omp, bool trans_a, bool trans_b, std::int64_t M, std::int64_t N,
                 std::int64_t K, T alpha, const T* A, std::int64_t lda, const T* B, std::int64_t ldb, T beta, T* C,
                 std::int64_t ldc) {
  // Below kPieceWork multiply-adds a product is one piece (cut_of would say so): no scratch, no region.
  const Cut cut = M * N * K < kPieceWork ? Cut{} : cut_of(M, N, K);
  if (cut.count == 1) {
    const int threads = hold_omp && !omp_in_parallel() ? omp_get_max_threads() : 1;
    if (threads > 1) omp_set_num_threads(1);
    call(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    if (threads > 1) omp_set_num_threads(threads);
    return;
  }
  // Scratch for the partial sums of K pieces 1..count-1, kept by the calling thread between calls.
  thread_local std::vector<T> partial;
  if (cut.by_k) partial.resize(static_cast<std::size_t>((cut.count - 1) * M * N));
  T* const scratch = partial.data();  // the team's threads reach it through this pointer, not their own copy
  auto piece = [&](std::int64_t p) {
    const std::int64_t lo = p * cut.step, len = std::min(cut.step, cut.length - lo);
    if (cut.by_k) {
      const T* a = trans_a ? A + lo * lda : A + lo;  // op(A)'s columns lo..lo+len-1
      const T* b = trans_b ? B + lo : B + lo * ldb;  // op(B)'s rows lo..lo+len-1
      if (p == 0) call(trans_a, trans_b, M, N, len, alpha, a, lda, b, ldb, beta, C, ldc);
      else call(trans_a, trans_b, M, N, len, alpha, a, lda, b, ldb, T(0), scratch + (p - 1) * M * N, N);
    } else if (cut.by_rows) {
      call(trans_a, trans_b, len, N, K, alpha, trans_a ? A + lo : A + lo * lda, lda, B, ldb, beta, C + lo * ldc, ldc);
    } else {
      call(trans_a, trans_b, M, len, K, alpha, A, lda, trans_b ? B + lo * ldb : B + lo, ldb, beta, C + lo, ldc);
    }
  };
  // C += the K pieces' partial sums, in piece order (rows shared among the threads).
  auto add_partials = [&](std::int64_t i) {
    T* c = C + i * ldc;
    for (std::int64_t p = 1; p < cut.count; ++p) {
      const T* s = scratch + (p - 1) * M * N + i * N;
      for (std::int64_t j = 0; j < N; ++j) c[j] += s[j];
    }
  };
  if (cut.count > 1 && threads_available()) {
    isa::choose();  // on the calling thread, before the region (see kernels/parallel.hpp)
#pragma omp parallel
    {
      isa::clear_upper_state();
#pragma omp for schedule(static)
      for (std::int64_t p = 0; p < cut.count; ++p) piece(p);
      if (cut.by_k) {
#pragma omp for schedule(static)
        for (std::int64_t i = 0; i < M; ++i) add_partials(i);
      }
    }
    return;
  }
  const int threads = hold_omp && !omp_in_parallel() ? omp_get_max_threads() : 1;
  if (threads > 1) omp_set_num_threads(1);
  for (std::int64_t p = 0; p < cut.count; ++p) piece(p);
  if (threads > 1) omp_set_num_threads(threads);
  if (cut.by_k)
    for (std::int64_t i = 0; i < M; ++i) add_partials(i);
}

// Eigen's products on one thread each (see cut_product): set once, before this process's first
// product, so that every later product reads it after the write.
void keep_eigen_single_threaded() {
  static const bool done = (Eigen::setNbThreads(1), true);
  (void)done;
}

// One piece of a product libxsmm takes (gemm_xsmm.hpp); a shape it has no kernel for goes the
// way it would without libxsmm (the choice depends on the shape alone).
template <class T>
void xsmm_piece(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, T alpha, const T* A,
                std::int64_t lda, const T* B, std::int64_t ldb, T beta, T* C, std::int64_t ldc) {
  if (xsmm::product<T>(trans_a, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)) return;
  if (small_product(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)) return;
  eigen_gemm<T>(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// Products from libxsmm's upper bound (2^27 multiply-adds) up, cut into blocks that libxsmm's
// kernels take one after another: C in blocks of kTileRows x kTileCols, each the sum over K in runs
// of kTileK terms, added in order (beta for the first run, 1 for the rest). A block of B (kTileK x
// kTileCols, 512 KiB in float32) stays in the core's L2 while it meets every block of rows. The
// blocks depend on the shape alone, so every element is summed the same way at any thread count.
// Used where OpenBLAS runs narrower kernels than headgrad's (large_products_in_blocks).
constexpr std::int64_t kTileRows = 512, kTileCols = 256, kTileK = 512;

template <class T>
void xsmm_tiled(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, T alpha, const T* A,
                std::int64_t lda, const T* B, std::int64_t ldb, T beta, T* C, std::int64_t ldc) {
  for (std::int64_t n0 = 0; n0 < N; n0 += kTileCols) {
    const std::int64_t nb = std::min(kTileCols, N - n0);
    for (std::int64_t k0 = 0; k0 < K; k0 += kTileK) {
      const std::int64_t kb = std::min(kTileK, K - k0);
      const T* b = B + k0 * ldb + n0;
      for (std::int64_t m0 = 0; m0 < M; m0 += kTileRows) {
        const std::int64_t mb = std::min(kTileRows, M - m0);
        const T* a = trans_a ? A + k0 * lda + m0 : A + m0 * lda + k0;
        xsmm_piece<T>(trans_a, trans_b, mb, nb, kb, alpha, a, lda, b, ldb, k0 == 0 ? beta : T(1), C + m0 * ldc + n0,
                      ldc);
      }
    }
  }
}

// Whether the BLAS is narrower than an AVX-512 core: OpenBLAS running its AVX2 kernels (cores
// "Haswell", "Zen"), or no BLAS at all (Eigen would take the product). OpenBLAS chooses by a
// table of the CPUs its release knew, or by OPENBLAS_CORETYPE, which some machines set to Haswell
// for CPUs that older releases get wrong (0.3.21 does not know Zen 5). Read once.
bool blas_is_narrow() {
#ifdef HEADGRAD_HAVE_BLAS
  static const bool narrow = [] {
    const std::string core = openblas_get_corename();
    return core == "Haswell" || core == "Zen";
  }();
  return narrow;
#else
  return true;
#endif
}

}  // namespace

// On an AVX-512 core OpenBLAS's AVX2 kernels reach half of the peak: on a Zen 5 (family 26,
// OPENBLAS_CORETYPE=Haswell) its sgemm ran 115-133 GFLOP/s on the grokking and large-shape
// projections, where libxsmm's AVX-512 kernels in blocks ran 201-268 (bench_gemm_libs, one thread;
// docs/gemm_choice.md). Only the kernel variant in use (HEADGRAD_ISA, set_kernel_isa) can change
// the answer within a process, as it changes the other kernels' bits.
bool large_products_in_blocks() {
  return *xsmm::target() != '\0' && blas_is_narrow() && isa::active() == isa::Isa::Avx512;
}

// One rounding per element (none when alpha = 1): the same values whatever the instruction set.
template <class T>
void transpose_scaled(const T* B, std::int64_t ldb, std::int64_t rows, std::int64_t cols, T alpha, T* out,
                      std::int64_t ldo) {
  if constexpr (std::is_same_v<T, float>) {
    [[maybe_unused]] const isa::Isa variant = isa::active();
#if HEADGRAD_ISA_AVX512
    if (variant == isa::Isa::Avx512) {
      small_gemm::transpose_avx512(B, ldb, rows, cols, out, ldo, alpha);
      return;
    }
#endif
#if HEADGRAD_ISA_AVX2
    if (variant == isa::Isa::Avx2) {
      small_gemm::transpose_avx2(B, ldb, rows, cols, out, ldo, alpha);
      return;
    }
#endif
  }
  for (std::int64_t j = 0; j < rows; ++j)
    for (std::int64_t k = 0; k < cols; ++k) out[k * ldo + j] = alpha == T(1) ? B[j * ldb + k] : alpha * B[j * ldb + k];
}

template void transpose_scaled<float>(const float*, std::int64_t, std::int64_t, std::int64_t, float, float*,
                                      std::int64_t);
template void transpose_scaled<double>(const double*, std::int64_t, std::int64_t, std::int64_t, double, double*,
                                       std::int64_t);

template <class T>
void gemm(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, T alpha, const T* A,
          std::int64_t lda, const T* B, std::int64_t ldb, T beta, T* C, std::int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (alpha != T(0) && tiny_fits(M, N, K)) {  // the small kernel where it fits, else the tiny loop
    if (small_product(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)) return;
    tiny_product(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  keep_eigen_single_threaded();
  // A few rows of C against a transposed B (a vector's backward through a linear, gy·W): dot
  // products along K, before libxsmm, whose copy of B would cost more than the product.
  if (nt_kernel_fits(trans_a, trans_b, M, N, K) &&
      small_product(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc))
    return;
  // libxsmm generates code for the CPU it finds, like the BLAS; HEADGRAD_ISA=generic (no vector
  // kernels chosen at run time) leaves it out too.
  if (isa::active() != isa::Isa::Generic && trans_b && xsmm::fits<T>(false, M, N, K, alpha, lda, N, beta, ldc)) {
    // libxsmm has no kernel for a transposed B: alpha·B once into a scratch of the calling
    // thread, laid out [K, N], and then the product op(A)·(alpha·B)ᵀ, cut as any other (alpha
    // folded into B costs one rounding per element of B and saves a pass over C).
    const T* Bt = transposed(B, ldb, N, K, alpha);
    cut_product<T>(xsmm_piece<T>, false, trans_a, false, M, N, K, T(1), A, lda, Bt, N, beta, C, ldc);
    return;
  }
  if (isa::active() != isa::Isa::Generic && xsmm::fits<T>(trans_b, M, N, K, alpha, lda, ldb, beta, ldc)) {
    cut_product<T>(xsmm_piece<T>, false, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  // From 2^27 multiply-adds, where OpenBLAS's kernels are narrower: libxsmm in blocks (a
  // transposed B laid out first, times alpha, as above).
  if (std::min({M, N, K}) >= 32 && xsmm::fits_in_blocks<T>(false, M, N, K, alpha, lda, trans_b ? N : ldb, beta, ldc) &&
      large_products_in_blocks()) {
    const T* b = trans_b ? transposed(B, ldb, N, K, alpha) : B;
    const T a = trans_b ? T(1) : alpha;
    cut_product<T>(xsmm_tiled<T>, false, trans_a, false, M, N, K, a, A, lda, b, trans_b ? N : ldb, beta, C, ldc);
    return;
  }
  if (use_blas(M, N, K, lda, ldb, ldc)) {
    cut_product<T>(blas_call<T>, true, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  if (small_product(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)) return;
  cut_product<T>(eigen_gemm<T>, false, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// gemm's route for these arguments when it is one call of xsmm::product with alpha = 1: not the
// tiny loop or small kernel, B not transposed, libxsmm's range, below kPieceWork (one piece).
template <class T>
PreparedGemm<T>::PreparedGemm(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, T alpha,
                              std::int64_t lda, std::int64_t ldb, T beta, std::int64_t ldc)
    : trans_a_(trans_a), trans_b_(trans_b), M_(M), N_(N), K_(K), alpha_(alpha), lda_(lda), ldb_(ldb), beta_(beta),
      ldc_(ldc) {
  const bool one_xsmm_call = M > 0 && N > 0 && alpha == T(1) && !trans_b && !tiny_fits(M, N, K) &&
                             isa::active() != isa::Isa::Generic &&
                             xsmm::fits<T>(false, M, N, K, alpha, lda, ldb, beta, ldc) && M * N * K < kPieceWork;
  if (one_xsmm_call) kernel_ = xsmm::kernel<T>(trans_a, M, N, K, lda, ldb, beta, ldc);
}

template class PreparedGemm<float>;
template class PreparedGemm<double>;

template void gemm<float>(bool, bool, std::int64_t, std::int64_t, std::int64_t, float, const float*, std::int64_t,
                          const float*, std::int64_t, float, float*, std::int64_t);
template void gemm<double>(bool, bool, std::int64_t, std::int64_t, std::int64_t, double, const double*,
                           std::int64_t, const double*, std::int64_t, double, double*, std::int64_t);

}  // namespace autograd
