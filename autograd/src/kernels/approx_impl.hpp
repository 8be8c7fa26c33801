#pragma once
// The bodies of the elementwise kernels of approx.hpp, written once over a vector type W and
// included only by approx_avx512.cpp and approx_avx2.cpp. Everything here is in an unnamed namespace,
// so each of those files has its own copy compiled with its own flags (see isa.hpp). W provides
// R, n, set1, load, store, load_first / store_first (the first m lanes), add, sub, mul, div,
// fma(a, b, c) = a·b + c, min, max, floor, ldexp(y, m) = y·2^m (rounded once) for y in [1/2, 2]
// and integral m in [-128, 128], first_or(a, b, m) (a's first m lanes, then b's),
// zero_where_below(a, b, x) (x, 0 in the lanes where a < b; NaN lanes of a keep x), nan_from(a, x) (a, with x's lanes where x is
// NaN), sum and hmax (across the lanes; hmax of NaN-free lanes), and sums and maxima (sum and
// hmax of each of W::n vectors at once: out[i] of v[i], sums with the bits of sum).
#include <cstdint>

#include "kernels/approx.hpp"

namespace autograd::approx {
namespace {

// Eigen 3.4's generic_fast_erf_float: x clamped to [-4, 4], a 13/8-degree rational function.
template <class W>
inline __attribute__((always_inline)) typename W::R erf(typename W::R a) {
  using R = typename W::R;
  const R x = W::max(W::min(a, W::set1(4.f)), W::set1(-4.f));
  const R x2 = W::mul(x, x);
  R p = W::fma(x2, W::set1(-2.72614225801306e-10f), W::set1(2.77068142495902e-08f));
  p = W::fma(x2, p, W::set1(-2.10102402082508e-06f));
  p = W::fma(x2, p, W::set1(-5.69250639462346e-05f));
  p = W::fma(x2, p, W::set1(-7.34990630326855e-04f));
  p = W::fma(x2, p, W::set1(-2.95459980854025e-03f));
  p = W::fma(x2, p, W::set1(-1.60960333262415e-02f));
  p = W::mul(x, p);
  R q = W::fma(x2, W::set1(-1.45660718464996e-05f), W::set1(-2.13374055278905e-04f));
  q = W::fma(x2, q, W::set1(-1.68282697438203e-03f));
  q = W::fma(x2, q, W::set1(-7.37332916720468e-03f));
  q = W::fma(x2, q, W::set1(-1.42647390514189e-02f));
  return W::div(p, q);
}

// The body of exp below, for x already in [-88.723, 88.723].
template <class W>
inline __attribute__((always_inline)) typename W::R exp_clamped(typename W::R x) {
  using R = typename W::R;
  const R m = W::floor(W::fma(x, W::set1(1.44269504088896341f), W::set1(0.5f)));
  R r = W::fma(m, W::set1(-0.693359375f), x);
  r = W::fma(m, W::set1(2.12194440e-4f), r);
  const R r2 = W::mul(r, r), r3 = W::mul(r2, r);
  R y = W::fma(W::set1(1.9875691500E-4f), r, W::set1(1.3981999507E-3f));
  R y1 = W::fma(W::set1(4.1665795894E-2f), r, W::set1(1.6666665459E-1f));
  const R y2 = W::add(r, W::set1(1.0f));
  y = W::fma(y, r, W::set1(8.3334519073E-3f));
  y1 = W::fma(y1, r, W::set1(5.0000001201E-1f));
  y = W::fma(y, r3, y1);
  y = W::fma(y, r2, y2);
  return W::ldexp(y, m);
}

// Eigen 3.4's pexp_float (Cephes): exp(x) = 2^m·exp(r), m = floor(x·log2(e) + 1/2), a degree-6
// polynomial for exp(r); x clamped to ±88.723, +inf and NaN passed through.
template <class W>
inline __attribute__((always_inline)) typename W::R exp(typename W::R a) {
  const typename W::R x = W::max(W::min(a, W::set1(88.723f)), W::set1(-88.723f));
  return W::max(exp_clamped<W>(x), a);  // max(·, a): a = +inf gives inf, a NaN gives NaN
}

constexpr float kSqrt1_2 = 0.70710678118654752440f;
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;

template <class W>
inline __attribute__((always_inline)) typename W::R gelu_of(typename W::R v) {
  // (1/2·x)·(1 + erf(x·√½)), in the order of the generic expression
  const typename W::R one = W::set1(1.f);
  return W::mul(W::mul(W::set1(0.5f), v), W::add(one, erf<W>(W::mul(v, W::set1(kSqrt1_2)))));
}

template <class W>
inline __attribute__((always_inline)) typename W::R gelu_slope_of(typename W::R dy, typename W::R v) {
  // dy·(1/2·(1 + erf(x·√½)) + (x·(1/√(2π)))·exp(-1/2·x²)), the second term at x clamped to
  // ±kGeluFlat: exp clamps its argument, so exp(-1/2·x²) is ~3e-39, not 0, far out, and x times
  // that would not vanish for |x| > 1e30; at ±40 the term is below 1e-37.
  using R = typename W::R;
  const R cdf = W::mul(W::set1(0.5f), W::add(W::set1(1.f), erf<W>(W::mul(v, W::set1(kSqrt1_2)))));
  constexpr float flat = static_cast<float>(kGeluFlat);
  const R vc = W::max(W::min(v, W::set1(flat)), W::set1(-flat));
  const R pdf = W::mul(W::mul(vc, W::set1(kInvSqrt2Pi)), exp<W>(W::mul(W::set1(-0.5f), W::mul(vc, vc))));
  return W::mul(dy, W::add(cdf, pdf));
}

template <class W>
void gelu_run(const float* x, float* y, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + W::n <= n; i += W::n) W::store(y + i, gelu_of<W>(W::load(x + i)));
  if (i < n) {
    const int m = static_cast<int>(n - i);
    W::store_first(y + i, gelu_of<W>(W::load_first(x + i, m)), m);
  }
}

template <class W>
void gelu_backward_run(const float* dy, const float* x, float* dx, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + W::n <= n; i += W::n) W::store(dx + i, gelu_slope_of<W>(W::load(dy + i), W::load(x + i)));
  if (i < n) {
    const int m = static_cast<int>(n - i);
    W::store_first(dx + i, gelu_slope_of<W>(W::load_first(dy + i, m), W::load_first(x + i, m)), m);
  }
}

// Below this argument exp clamps (its value there, exp(-88.723) ≈ 2.9e-39, is not exp's).
constexpr float kExpFloor = -88.723f;

// exp(v − shift), exactly 0 in the lanes where v − shift < kExpFloor (v = −inf among them): exp
// clamps its argument there, and a weight of 2.9e-39 in place of a far smaller one is up to 1e7
// times too large once its row is normalised, and is multiplied into the gradients (q or k near
// 1e38 made dK 28 times too large). Those lanes take exp(0) and are then zeroed, so none of them
// forms a subnormal result: on Intel cores each costs a microcode assist (about 70 % of a causal
// softmax's time on a Xeon, when the −inf lanes still went through exp). NaN lanes stay NaN.
template <class W>
inline __attribute__((always_inline)) typename W::R exp_unless_masked(typename W::R v, typename W::R shift) {
  const typename W::R d = W::sub(v, shift), floor = W::set1(kExpFloor);
  return W::zero_where_below(d, floor, exp<W>(W::zero_where_below(d, floor, d)));
}

// y = exp(x − m) (0 where x = −inf), n elements; Σ y in W::n lanes, then W::sum across them.
template <class W>
float exp_shifted_run(const float* x, float* y, std::int64_t n, float m) {
  using R = typename W::R;
  const R shift = W::set1(m), neg_inf = W::set1(-__builtin_inff());
  R acc = W::set1(0.f);
  auto one = [&](R v) {
    const R e = exp_unless_masked<W>(v, shift);
    acc = W::add(acc, e);
    return e;
  };
  std::int64_t i = 0;
  for (; i + W::n <= n; i += W::n) W::store(y + i, one(W::load(x + i)));
  if (i < n) {
    const int k = static_cast<int>(n - i);
    // lanes past the end read as −inf: they add 0 to the sum
    W::store_first(y + i, one(W::first_or(W::load_first(x + i, k), neg_inf, k)), k);
  }
  return W::sum(acc);
}

// p = exp(p − m) (0 where p = −inf) and g = p·(g − c), n elements, as exp_shifted_run's
// exponentials and the plain expression after them.
template <class W>
void exp_slopes_run(float* p, float* g, std::int64_t n, float m, float c) {
  using R = typename W::R;
  const R shift = W::set1(m), cv = W::set1(c);
  auto weight = [&](R v) { return exp_unless_masked<W>(v, shift); };
  std::int64_t i = 0;
  for (; i + W::n <= n; i += W::n) {
    const R e = weight(W::load(p + i));
    W::store(p + i, e);
    W::store(g + i, W::mul(e, W::sub(W::load(g + i), cv)));
  }
  if (i < n) {
    const int k = static_cast<int>(n - i);
    const R e = weight(W::load_first(p + i, k));
    W::store_first(p + i, e, k);
    W::store_first(g + i, W::mul(e, W::sub(W::load_first(g + i, k), cv)), k);
  }
}

// Softmax of `rows` contiguous rows of `cols` entries (rows > 0, cols a positive multiple of
// W::n), in place, with one shift for all rows: the largest row maximum hi. Taken only when no entry is NaN and every row maximum is
// finite and within `spread` of hi; otherwise false, with p untouched. Three passes over each row
// (maximum, exponentials with their sum, the scaling by the sum's reciprocal), each in vector
// lanes; -inf entries get weight exactly 0.
template <class W>
bool softmax_rows_shared_run(float* p, std::int64_t rows, std::int64_t cols, float spread) {
  using R = typename W::R;
  const R neg_inf = W::set1(-__builtin_inff());
  // Rows go in groups of W::n: each row's vectors are combined into one, and W::sums / W::maxima
  // take a group's W::n vectors across their lanes at once, then the exponentials of a group,
  // the reciprocals of their sums and the scaling follow one another, so that no row waits for
  // its own sum and division.
  R lane[W::n];
  float across[W::n];
  // The sum of every entry: NaN when one is (or when it meets both +inf and -inf, or overflows
  // to both: then the rows take the caller's other path, which is right for any input).
  R total = W::set1(0.f);
  float hi = -__builtin_inff(), lo = __builtin_inff();
  for (std::int64_t r0 = 0; r0 < rows; r0 += W::n) {
    const int group = static_cast<int>(rows - r0 < W::n ? rows - r0 : W::n);
    for (int r = 0; r < group; ++r) {
      const float* row = p + (r0 + r) * cols;
      R m = neg_inf;
      for (std::int64_t i = 0; i < cols; i += W::n) {
        const R v = W::load(row + i);
        m = W::max(m, v);
        total = W::add(total, v);
      }
      lane[r] = m;
    }
    for (int r = group; r < W::n; ++r) lane[r] = lane[0];
    W::maxima(lane, across);  // of the entries that are not NaN
    for (int r = 0; r < group; ++r) {
      hi = across[r] > hi ? across[r] : hi;
      lo = across[r] < lo ? across[r] : lo;
    }
  }
  const float sum = W::sum(total);
  if (sum != sum || !(hi - lo <= spread) || !(hi < __builtin_inff())) return false;
  const R shift = W::set1(hi);
  // exp(v − hi), 0 where v − hi < kExpFloor (as exp_unless_masked); the other lanes lie in
  // [kExpFloor, 0] (hi is the largest entry), where exp needs none of its clamps
  const R floor = W::set1(kExpFloor);
  auto weight = [&](R v) {
    const R d = W::sub(v, shift);
    return W::zero_where_below(d, floor, exp_clamped<W>(W::zero_where_below(d, floor, d)));
  };
  for (std::int64_t r0 = 0; r0 < rows; r0 += W::n) {
    const int group = static_cast<int>(rows - r0 < W::n ? rows - r0 : W::n);
    for (int r = 0; r < group; ++r) {
      float* row = p + (r0 + r) * cols;
      R acc = W::set1(0.f);
      for (std::int64_t i = 0; i < cols; i += W::n) {
        const R e = weight(W::load(row + i));
        acc = W::add(acc, e);
        W::store(row + i, e);
      }
      lane[r] = acc;
    }
    for (int r = group; r < W::n; ++r) lane[r] = lane[0];
    W::sums(lane, across);  // across[r] = W::sum(lane[r]), to the bit
    for (int r = 0; r < group; ++r) {
      float* row = p + (r0 + r) * cols;
      const R scale = W::set1(1.f / across[r]);  // sum >= exp(lo - hi) > 0
      for (std::int64_t i = 0; i < cols; i += W::n) W::store(row + i, W::mul(W::load(row + i), scale));
    }
  }
  return true;
}

// The softmax backward of `rows` rows of `cols` entries (rows ld apart; cols a multiple of W::n): in row i,
// c = Σ_j g_ij·p_ij, then s_ij = p_ij·(g_ij − c), written to out (when not null) and, times
// `scale`, to g. Two passes over each row in vector lanes, rows in groups of W::n whose dot
// products are summed across their lanes at once (W::sums).
template <class W>
void softmax_slopes_rows_run(const float* p, float* g, float* out, std::int64_t rows, std::int64_t cols,
                             std::int64_t ld, float scale) {
  using R = typename W::R;
  const R sv = W::set1(scale);
  R lane[W::n];
  float dots[W::n];
  for (std::int64_t r0 = 0; r0 < rows; r0 += W::n) {
    const int group = static_cast<int>(rows - r0 < W::n ? rows - r0 : W::n);
    for (int r = 0; r < group; ++r) {
      const float* pr = p + (r0 + r) * ld;
      const float* gr = g + (r0 + r) * ld;
      R acc = W::set1(0.f);
      for (std::int64_t i = 0; i < cols; i += W::n) acc = W::fma(W::load(gr + i), W::load(pr + i), acc);
      lane[r] = acc;
    }
    for (int r = group; r < W::n; ++r) lane[r] = lane[0];
    W::sums(lane, dots);
    for (int r = 0; r < group; ++r) {
      const float* pr = p + (r0 + r) * ld;
      float* gr = g + (r0 + r) * ld;
      float* orow = out != nullptr ? out + (r0 + r) * ld : nullptr;
      const R c = W::set1(dots[r]);
      auto slope = [&](R pv, R gv) { return W::mul(pv, W::sub(gv, c)); };
      for (std::int64_t i = 0; i < cols; i += W::n) {
        const R sl = slope(W::load(pr + i), W::load(gr + i));
        if (orow != nullptr) W::store(orow + i, sl);
        W::store(gr + i, W::mul(sl, sv));
      }
    }
  }
}

// The largest of x[0..n), NaN when one is (n > 0).
template <class W>
float max_run(const float* x, std::int64_t n) {
  using R = typename W::R;
  const R neg_inf = W::set1(-__builtin_inff());
  R m = neg_inf, nan = neg_inf;  // nan: a NaN seen, in its lane
  std::int64_t i = 0;
  for (; i + W::n <= n; i += W::n) {
    const R v = W::load(x + i);
    m = W::max(m, v);
    nan = W::nan_from(nan, v);
  }
  if (i < n) {
    const R v = W::first_or(W::load_first(x + i, static_cast<int>(n - i)), neg_inf, static_cast<int>(n - i));
    m = W::max(m, v);
    nan = W::nan_from(nan, v);
  }
  const float h = W::hmax(m), any_nan = W::sum(nan);  // sum: NaN iff a lane is NaN (the others -inf)
  return any_nan != any_nan ? any_nan : h;
}

}  // namespace
}  // namespace autograd::approx
