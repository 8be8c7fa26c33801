// Matrix products through libxsmm's JIT kernels (see gemm_xsmm.hpp).
#include "kernels/gemm_xsmm.hpp"

#include <climits>
#include <type_traits>
#include <vector>

#ifdef HEADGRAD_HAVE_LIBXSMM
#include <libxsmm.h>
#endif

namespace autograd::xsmm {

#ifdef HEADGRAD_HAVE_LIBXSMM
namespace {

constexpr std::int64_t kMinWork = std::int64_t{1} << 12;  // M·N·K, from
// Up to the medium shape's projections (2048x384x128 = 2^26.6, cut into pieces of 2^24.6):
// 1.03-1.2x OpenBLAS's time per call there, and on the char GPT's MLP (docs/gemm_choice.md);
// the large shape's (2^28 and up) stay with the BLAS where it runs AVX-512 kernels (faster there
// than one libxsmm call), and go to libxsmm in blocks where it does not (gemm.cpp).
constexpr std::int64_t kMaxWork = std::int64_t{1} << 27;  // M·N·K, below

// One kernel of libxsmm, by everything it was generated for. In libxsmm's column-major terms
// (see product): m = N, n = M, lda = ldb, ldb = lda; `flags` holds trans_a and beta.
struct Key {
  std::int32_t m = 0, n = 0, k = 0, la = 0, lb = 0, lc = 0, flags = -1;
  bool operator==(const Key&) const = default;
};

static_assert(std::is_same_v<Kernel<float>, libxsmm_smmfunction> &&
              std::is_same_v<Kernel<double>, libxsmm_dmmfunction>);

// The kernels this thread has used: a direct-mapped table, plain data in the thread's static TLS
// (no allocation). A miss asks libxsmm, whose own registry generates a kernel only once per
// process and is safe to ask from several threads at once; a shape that evicts another is
// looked up there again, without generating anything.
template <class T>
struct Cache {
  static constexpr std::size_t kSlots = 128;
  Key key[kSlots];
  Kernel<T> kernel[kSlots];
};

std::size_t slot_of(const Key& k) {
  std::uint64_t h = 0x9e3779b97f4a7c15ull;
  for (std::int32_t v : {k.m, k.n, k.k, k.la, k.lb, k.lc, k.flags}) h = (h ^ static_cast<std::uint32_t>(v)) * 0x100000001b3ull;
  return static_cast<std::size_t>(h >> 40);
}

template <class T>
Kernel<T> kernel_for(const Key& key) {
  thread_local Cache<T> cache{};
  const std::size_t s = slot_of(key) % Cache<T>::kSlots;
  if (cache.key[s] == key) return cache.kernel[s];
  const libxsmm_blasint m = key.m, n = key.n, k = key.k, la = key.la, lb = key.lb, lc = key.lc;
  const int flags = (key.flags & 1) != 0 ? LIBXSMM_GEMM_FLAG_TRANS_B : 0;
  const int prefetch = LIBXSMM_PREFETCH_NONE;
  const T one = T(1), beta = (key.flags & 2) != 0 ? T(1) : T(0);
  Kernel<T> kernel;
  if constexpr (std::is_same_v<T, float>) kernel = libxsmm_smmdispatch(m, n, k, &la, &lb, &lc, &one, &beta, &flags, &prefetch);
  else kernel = libxsmm_dmmdispatch(m, n, k, &la, &lb, &lc, &one, &beta, &flags, &prefetch);
  cache.key[s] = key;
  cache.kernel[s] = kernel;
  return kernel;
}

bool int32(std::int64_t v) { return v <= INT_MAX; }

// The arguments libxsmm takes, whatever the size of the product.
template <class T>
bool arguments_fit(bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, T alpha, std::int64_t lda,
                   std::int64_t ldb, T beta, std::int64_t ldc) {
  if (trans_b || alpha == T(0) || (beta != T(0) && beta != T(1)) || K <= 0 || M <= 0 || N <= 0) return false;
  return int32(M) && int32(N) && int32(K) && int32(lda) && int32(ldb) && int32(ldc);
}

}  // namespace

template <class T>
bool fits(bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, T alpha, std::int64_t lda,
          std::int64_t ldb, T beta, std::int64_t ldc) {
  if (!arguments_fit(trans_b, M, N, K, alpha, lda, ldb, beta, ldc)) return false;
  const std::int64_t work = M * N * K;  // below 2^93: no overflow past the int32 checks
  return work >= kMinWork && work < kMaxWork;
}

template <class T>
bool fits_in_blocks(bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, T alpha, std::int64_t lda,
                    std::int64_t ldb, T beta, std::int64_t ldc) {
  return arguments_fit(trans_b, M, N, K, alpha, lda, ldb, beta, ldc) && M * N * K >= kMaxWork;
}

// Row-major C[M, N] is column-major Cᵀ (N x M, stride ldc), so libxsmm computes
// Cᵀ = Bᵀ·op(A)ᵀ: its A is our B (N x K column-major, stride ldb), its B our A (K x M column-major
// when A is [M, K]; with trans_a, A [K, M] is op(A) column-major, so its B is transposed).
namespace {

// C += alpha·(op(A)·B) with alpha other than 1 goes through scratch: the product, then the sum.
template <class T>
bool scaled_sum(T alpha, T beta) {
  return alpha != T(1) && beta != T(0);
}

// The kernel product() calls for these arguments.
template <class T>
Key key_of(bool trans_a, std::int64_t M, std::int64_t N, std::int64_t K, T alpha, std::int64_t lda, std::int64_t ldb,
           T beta, std::int64_t ldc) {
  const bool via_scratch = scaled_sum(alpha, beta);
  const std::int32_t m = static_cast<std::int32_t>(N), n = static_cast<std::int32_t>(M);
  return Key{m, n, static_cast<std::int32_t>(K), static_cast<std::int32_t>(ldb), static_cast<std::int32_t>(lda),
             via_scratch ? m : static_cast<std::int32_t>(ldc),
             (trans_a ? 1 : 0) | (beta != T(0) && !via_scratch ? 2 : 0)};
}

}  // namespace

template <class T>
Kernel<T> kernel(bool trans_a, std::int64_t M, std::int64_t N, std::int64_t K, std::int64_t lda, std::int64_t ldb,
                 T beta, std::int64_t ldc) {
  return kernel_for<T>(key_of(trans_a, M, N, K, T(1), lda, ldb, beta, ldc));
}

template <class T>
bool product(bool trans_a, std::int64_t M, std::int64_t N, std::int64_t K, T alpha, const T* A, std::int64_t lda,
             const T* B, std::int64_t ldb, T beta, T* C, std::int64_t ldc) {
  const Kernel<T> kernel = kernel_for<T>(key_of(trans_a, M, N, K, alpha, lda, ldb, beta, ldc));
  if (kernel == nullptr) return false;
  if (!scaled_sum(alpha, beta)) {
    kernel(B, A, C);
    if (alpha != T(1))
      for (std::int64_t i = 0; i < M; ++i)
        for (std::int64_t j = 0; j < N; ++j) C[i * ldc + j] *= alpha;
    return true;
  }
  thread_local std::vector<T> scratch;  // per thread, kept between calls (no allocation once warm)
  if (scratch.size() < static_cast<std::size_t>(M * N)) scratch.resize(static_cast<std::size_t>(M * N));
  T* const s = scratch.data();
  kernel(B, A, s);
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t j = 0; j < N; ++j) C[i * ldc + j] += alpha * s[i * N + j];
  return true;
}

const char* target() { return libxsmm_get_target_arch(); }

#else  // built without libxsmm

template <class T>
bool fits(bool, std::int64_t, std::int64_t, std::int64_t, T, std::int64_t, std::int64_t, T, std::int64_t) {
  return false;
}
template <class T>
bool product(bool, std::int64_t, std::int64_t, std::int64_t, T, const T*, std::int64_t, const T*, std::int64_t, T, T*,
             std::int64_t) {
  return false;
}
template <class T>
bool fits_in_blocks(bool, std::int64_t, std::int64_t, std::int64_t, T, std::int64_t, std::int64_t, T, std::int64_t) {
  return false;
}
template <class T>
Kernel<T> kernel(bool, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, T, std::int64_t) {
  return nullptr;
}
const char* target() { return ""; }

#endif  // HEADGRAD_HAVE_LIBXSMM

template bool fits<float>(bool, std::int64_t, std::int64_t, std::int64_t, float, std::int64_t, std::int64_t, float,
                          std::int64_t);
template bool fits<double>(bool, std::int64_t, std::int64_t, std::int64_t, double, std::int64_t, std::int64_t, double,
                           std::int64_t);
template bool fits_in_blocks<float>(bool, std::int64_t, std::int64_t, std::int64_t, float, std::int64_t,
                                    std::int64_t, float, std::int64_t);
template bool fits_in_blocks<double>(bool, std::int64_t, std::int64_t, std::int64_t, double, std::int64_t,
                                     std::int64_t, double, std::int64_t);
template Kernel<float> kernel<float>(bool, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, float,
                                     std::int64_t);
template Kernel<double> kernel<double>(bool, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                                       double, std::int64_t);
template bool product<float>(bool, std::int64_t, std::int64_t, std::int64_t, float, const float*, std::int64_t,
                             const float*, std::int64_t, float, float*, std::int64_t);
template bool product<double>(bool, std::int64_t, std::int64_t, std::int64_t, double, const double*, std::int64_t,
                              const double*, std::int64_t, double, double*, std::int64_t);

}  // namespace autograd::xsmm
