#pragma once
// The body of the small matrix-product kernel (gemm_small.hpp), written once over a vector type
// W and included only by the instruction-set files gemm_avx512.cpp and gemm_avx2.cpp. Everything
// here is in an unnamed namespace, so each of those files has its own copy compiled with its own
// flags (see isa.hpp). W provides: R (the register type), n (lanes), zero, set1, load, store,
// fma(a, b, c) = a·b + c, mul, and, when W::masked, load_first(p, m) / store_first(p, x, m) on
// the first m lanes (a last, partial vector of columns).
//
// C is computed in blocks of up to `rows` rows by V vectors of columns, every accumulator in a
// register, each element of op(A) broadcast against a row of Bp. It skips Eigen's packing and
// blocking, which cost more than the arithmetic at these sizes (the per-head products of small
// attention shapes: 32x32x16, 32x16x32 and the like).
#include <cstdint>

#include "kernels/gemm_small.hpp"

namespace autograd::small_gemm {
namespace {

// Block C[i0 .. i0+R-1, j0 .. j0+V·n-1]; with P (partial), the last vector holds `last` lanes.
template <class W, int R, int V, bool P, class T>
inline __attribute__((always_inline)) void block(const Args<T>& g, std::int64_t i0, std::int64_t j0, int last) {
  using Reg = typename W::R;
  const std::int64_t sr = g.trans_a ? 1 : g.lda, sk = g.trans_a ? g.lda : 1;  // op(A)(i, k) = A[i·sr + k·sk]
  const T* a0 = g.A + i0 * sr;
  Reg acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = W::zero();
  for (std::int64_t k = 0; k < g.K; ++k) {
    const T* b = g.Bp + k * g.ldbp + j0;
    Reg bv[V];
    for (int v = 0; v < V; ++v) bv[v] = P && v == V - 1 ? W::load_first(b + v * W::n, last) : W::load(b + v * W::n);
    const T* ak = a0 + k * sk;
    for (int r = 0; r < R; ++r) {
      const Reg av = W::set1(ak[r * sr]);
      for (int v = 0; v < V; ++v) acc[r][v] = W::fma(av, bv[v], acc[r][v]);
    }
  }
  const Reg al = W::set1(g.alpha), be = W::set1(g.beta);
  for (int r = 0; r < R; ++r) {
    T* c = g.C + (i0 + r) * g.ldc + j0;
    for (int v = 0; v < V; ++v) {
      const bool part = P && v == V - 1;
      Reg x = W::mul(al, acc[r][v]);
      if (g.beta != T(0)) x = W::fma(be, part ? W::load_first(c + v * W::n, last) : W::load(c + v * W::n), x);
      if (part) W::store_first(c + v * W::n, x, last);
      else W::store(c + v * W::n, x);
    }
  }
}

// Columns j0 .. j0+V·n-1 of C (with P, the last vector `last` lanes wide), all rows: R rows at
// a time, then the remaining rows in halving blocks.
template <class W, int R, int V, bool P, class T>
void column_block(const Args<T>& g, std::int64_t j0, int last) {
  std::int64_t i = 0;
  for (; i + R <= g.M; i += R) block<W, R, V, P>(g, i, j0, last);
  if constexpr (R >= 8) {
    if (i + 4 <= g.M) {
      block<W, 4, V, P>(g, i, j0, last);
      i += 4;
    }
  }
  if constexpr (R >= 4) {
    if (i + 2 <= g.M) {
      block<W, 2, V, P>(g, i, j0, last);
      i += 2;
    }
  }
  for (; i < g.M; ++i) block<W, 1, V, P>(g, i, j0, last);
}

// Rows per block for V vectors: about W::acc accumulators in registers.
template <class W>
constexpr int rows_for(int V) {
  const int r = W::acc / V;
  return r >= 8 ? 8 : r >= 4 ? 4 : r >= 2 ? 2 : 1;
}

// The columns after the last group of 4 whole vectors: up to 3 whole ones, and with P a partial
// one after them.
template <class W, bool P, class T>
void column_rest(const Args<T>& g, std::int64_t j, std::int64_t vectors, int last) {
  switch (vectors) {
    case 4: column_block<W, rows_for<W>(4), 4, P>(g, j, last); break;
    case 3: column_block<W, rows_for<W>(3), 3, P>(g, j, last); break;
    case 2: column_block<W, rows_for<W>(2), 2, P>(g, j, last); break;
    case 1: column_block<W, rows_for<W>(1), 1, P>(g, j, last); break;
    default: break;
  }
}

template <class W, class T>
void run(const Args<T>& g) {
  constexpr int L = W::n;
  std::int64_t j = 0;
  for (; j + 4 * L <= g.N; j += 4 * L) column_block<W, rows_for<W>(4), 4, false>(g, j, L);
  const std::int64_t rest = g.N - j;
  // A partial last vector only where W can mask it (the caller guarantees whole vectors else).
  const bool partial = W::masked && rest % L != 0;
  const std::int64_t vectors = partial ? rest / L + 1 : rest / L;
  if (partial) column_rest<W, true>(g, j, vectors, static_cast<int>(rest % L));
  else column_rest<W, false>(g, j, vectors, L);
}

// Transposed B and few rows of C (where packing B costs more than it saves): C(i, j) is the dot
// product of row i of A and row j of B (Bp = B, [N, K], rows ldbp apart), along K in 256-bit
// vectors V: lane l sums the terms k = l, l + n, ... in order (the last vector zero-padded), the n
// lane sums are added in a fixed tree, then times alpha, then plus beta·C. The AVX-512 and AVX2
// variants both run this on 256-bit vectors, so they give the same bits.
inline float fused(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
inline double fused(double a, double b, double c) { return __builtin_fma(a, b, c); }

// The n elements of p from k, zero-padded past K (the last, partial vector).
template <class V, class T>
inline typename V::R load_tail(const T* p, std::int64_t k, std::int64_t K) {
  T buf[V::n] = {};
  for (std::int64_t q = 0; k + q < K; ++q) buf[q] = p[k + q];
  return V::load(buf);
}

template <class V, class T>
inline __attribute__((always_inline)) T lane_sum(typename V::R x) {
  T l[V::n];
  V::store(l, x);
  if constexpr (V::n == 8) return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
  else return (l[0] + l[1]) + (l[2] + l[3]);
}

// Elements j .. j+J-1 of row i of C.
template <class V, int J, class T>
inline __attribute__((always_inline)) void dot_block(const Args<T>& g, std::int64_t i, std::int64_t j) {
  using Reg = typename V::R;
  const std::int64_t K = g.K, whole = K / V::n * V::n;
  const T* const a = g.A + i * g.lda;
  const T* b[J];
  Reg acc[J];
  for (int q = 0; q < J; ++q) {
    b[q] = g.Bp + (j + q) * g.ldbp;
    acc[q] = V::zero();
  }
  for (std::int64_t k = 0; k < whole; k += V::n) {
    const Reg av = V::load(a + k);
    for (int q = 0; q < J; ++q) acc[q] = V::fma(av, V::load(b[q] + k), acc[q]);
  }
  if (whole < K) {
    const Reg av = load_tail<V>(a, whole, K);
    for (int q = 0; q < J; ++q) acc[q] = V::fma(av, load_tail<V>(b[q], whole, K), acc[q]);
  }
  const T alpha = g.alpha, beta = g.beta;
  T* const c = g.C + i * g.ldc + j;
  if constexpr (J == V::n) {  // the n sums at once, by the same tree as lane_sum
    Reg x = V::mul(V::set1(alpha), V::sums(acc));
    if (beta != T(0)) x = V::fma(V::set1(beta), V::load(c), x);
    V::store(c, x);
    return;
  }
  for (int q = 0; q < J; ++q) {
    const T x = alpha * lane_sum<V, T>(acc[q]);
    c[q] = beta == T(0) ? x : fused(beta, c[q], x);
  }
}

template <class V, class T>
void run_nt(const Args<T>& g) {
  for (std::int64_t i = 0; i < g.M; ++i) {
    std::int64_t j = 0;
    for (; j + V::n <= g.N; j += V::n) dot_block<V, V::n>(g, i, j);
    for (; j < g.N; ++j) dot_block<V, 1>(g, i, j);
  }
}

}  // namespace
}  // namespace autograd::small_gemm
