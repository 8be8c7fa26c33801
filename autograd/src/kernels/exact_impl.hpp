#pragma once
// The bodies of the loops of exact.hpp, written once over a vector type W and included only by
// exact_avx512.cpp and exact_avx2.cpp. Everything here is in an unnamed namespace, so each of those
// files has its own copy compiled with its own flags (see isa.hpp). W provides R (W::n floats),
// set1, zero, load, store, load_first / store_first (the first m lanes), first_or(a, b, m) (a's
// first m lanes, then b's), add, sub, mul, div, sum (across the lanes), and D (W::n / 2 doubles)
// with widen_lo / widen_hi (the low and high halves of an R, converted), dset1, dadd, dsub, dmul
// and dsum.
#include <cstdint>

#include "kernels/exact.hpp"

namespace autograd::exact {
namespace {

// y = f(a, b) over n elements; A / B: a / b advance (else one value repeated).
template <class W, bool A, bool B, class F>
inline __attribute__((always_inline)) void binary_loop(const float* a, const float* b, float* y, std::int64_t n, F f) {
  using R = typename W::R;
  const R fixed_a = A ? W::zero() : W::set1(*a), fixed_b = B ? W::zero() : W::set1(*b);
  std::int64_t i = 0;
  for (; i + W::n <= n; i += W::n)
    W::store(y + i, f(A ? W::load(a + i) : fixed_a, B ? W::load(b + i) : fixed_b));
  if (i < n) {
    const int m = static_cast<int>(n - i);
    W::store_first(y + i, f(A ? W::load_first(a + i, m) : fixed_a, B ? W::load_first(b + i, m) : fixed_b), m);
  }
}

template <class W, class F>
inline __attribute__((always_inline)) void binary_strided(const float* a, std::int64_t sa, const float* b,
                                                          std::int64_t sb, float* y, std::int64_t n, F f) {
  if (sa != 0 && sb != 0) binary_loop<W, true, true>(a, b, y, n, f);
  else if (sa != 0) binary_loop<W, true, false>(a, b, y, n, f);
  else if (sb != 0) binary_loop<W, false, true>(a, b, y, n, f);
  else binary_loop<W, false, false>(a, b, y, n, f);
}

template <class W>
void binary_run(Op op, const float* a, std::int64_t sa, const float* b, std::int64_t sb, float* y, std::int64_t n) {
  using R = typename W::R;
  if (n <= 0) return;
  switch (op) {
    case Op::Add: binary_strided<W>(a, sa, b, sb, y, n, [](R u, R v) { return W::add(u, v); }); return;
    case Op::Sub: binary_strided<W>(a, sa, b, sb, y, n, [](R u, R v) { return W::sub(u, v); }); return;
    case Op::Mul: binary_strided<W>(a, sa, b, sb, y, n, [](R u, R v) { return W::mul(u, v); }); return;
    case Op::Div: binary_strided<W>(a, sa, b, sb, y, n, [](R u, R v) { return W::div(u, v); }); return;
  }
}

// Σ x and then Σ (x − μ)², in double: two accumulators of W::n / 2 lanes each, then across.
template <class W>
double row_sum(const float* x, std::int64_t n) {
  typename W::D s0 = W::dset1(0.0), s1 = W::dset1(0.0);
  std::int64_t i = 0;
  for (; i + W::n <= n; i += W::n) {
    const typename W::R v = W::load(x + i);
    s0 = W::dadd(s0, W::widen_lo(v));
    s1 = W::dadd(s1, W::widen_hi(v));
  }
  double s = W::dsum(W::dadd(s0, s1));
  for (; i < n; ++i) s += static_cast<double>(x[i]);
  return s;
}

template <class W>
double row_squared_deviation(const float* x, std::int64_t n, double mu) {
  using D = typename W::D;
  const D m = W::dset1(mu);
  D s0 = W::dset1(0.0), s1 = W::dset1(0.0);
  std::int64_t i = 0;
  for (; i + W::n <= n; i += W::n) {
    const typename W::R v = W::load(x + i);
    const D d0 = W::dsub(W::widen_lo(v), m), d1 = W::dsub(W::widen_hi(v), m);
    s0 = W::dadd(s0, W::dmul(d0, d0));
    s1 = W::dadd(s1, W::dmul(d1, d1));
  }
  double s = W::dsum(W::dadd(s0, s1));
  for (; i < n; ++i) {
    const double d = static_cast<double>(x[i]) - mu;
    s += d * d;
  }
  return s;
}

template <class W>
void layer_norm_forward_run(const float* x, std::int64_t n, const float* w, const float* b, double eps,
                            double* stats, float* y) {
  using R = typename W::R;
  const double mu = row_sum<W>(x, n) / static_cast<double>(n);
  const double var = row_squared_deviation<W>(x, n, mu) / static_cast<double>(n);
  const double rstd = 1.0 / __builtin_sqrt(var + eps);
  stats[0] = mu;
  stats[1] = rstd;
  const R mf = W::set1(static_cast<float>(mu)), rf = W::set1(static_cast<float>(rstd));
  auto row = [&](R v, R wv, R bv) {
    R t = W::mul(W::sub(v, mf), rf);
    if (w) t = W::mul(t, wv);
    if (b) t = W::add(t, bv);
    return t;
  };
  std::int64_t i = 0;
  for (; i + W::n <= n; i += W::n)
    W::store(y + i, row(W::load(x + i), w ? W::load(w + i) : mf, b ? W::load(b + i) : mf));
  if (i < n) {
    const int m = static_cast<int>(n - i);
    const R wv = w ? W::load_first(w + i, m) : mf, bv = b ? W::load_first(b + i, m) : mf;
    W::store_first(y + i, row(W::load_first(x + i, m), wv, bv), m);
  }
}

// One block of W::n elements (the first m of them valid, m = W::n for a full one) of the first
// pass of layer_norm backward: updates db and dw, adds dx̂ and dx̂·x̂ into s1 and s2.
template <class W>
inline __attribute__((always_inline)) void ln_grads_block(const float* x, const float* dy, const float* w,
                                                          typename W::R mf, typename W::R rf, float* dw, float* db,
                                                          typename W::R& s1, typename W::R& s2, int m) {
  using R = typename W::R;
  const bool full = m == W::n;
  const R xv = full ? W::load(x) : W::load_first(x, m), g = full ? W::load(dy) : W::load_first(dy, m);
  const R xh = W::mul(W::sub(xv, mf), rf);
  if (db) {
    const R s = W::add(full ? W::load(db) : W::load_first(db, m), g);
    full ? W::store(db, s) : W::store_first(db, s, m);
  }
  if (dw) {
    const R s = W::add(full ? W::load(dw) : W::load_first(dw, m), W::mul(g, xh));
    full ? W::store(dw, s) : W::store_first(dw, s, m);
  }
  R gh = w ? W::mul(g, full ? W::load(w) : W::load_first(w, m)) : g;
  R p = W::mul(gh, xh);
  if (!full) {  // the lanes past the end add nothing
    gh = W::first_or(gh, W::zero(), m);
    p = W::first_or(p, W::zero(), m);
  }
  s1 = W::add(s1, gh);
  s2 = W::add(s2, p);
}

template <class W>
void layer_norm_backward_run(const float* x, const float* dy, std::int64_t n, const float* w, const double* stats,
                             float* dx, float* dw, float* db) {
  using R = typename W::R;
  const R mf = W::set1(static_cast<float>(stats[0])), rf = W::set1(static_cast<float>(stats[1]));
  R s1 = W::zero(), s2 = W::zero();
  std::int64_t i = 0;
  auto at = [&](const float* p) { return p ? p + i : p; };
  auto at_out = [&](float* p) { return p ? p + i : p; };
  for (; i + W::n <= n; i += W::n) ln_grads_block<W>(x + i, dy + i, at(w), mf, rf, at_out(dw), at_out(db), s1, s2, W::n);
  if (i < n) ln_grads_block<W>(x + i, dy + i, at(w), mf, rf, at_out(dw), at_out(db), s1, s2, static_cast<int>(n - i));
  if (!dx) return;
  const R m1 = W::set1(W::sum(s1) / static_cast<float>(n)), m2 = W::set1(W::sum(s2) / static_cast<float>(n));
  auto grad = [&](R xv, R g, R wv) {
    const R xh = W::mul(W::sub(xv, mf), rf);
    const R gh = w ? W::mul(g, wv) : g;
    return W::mul(rf, W::sub(W::sub(gh, m1), W::mul(xh, m2)));
  };
  for (i = 0; i + W::n <= n; i += W::n)
    W::store(dx + i, grad(W::load(x + i), W::load(dy + i), w ? W::load(w + i) : mf));
  if (i < n) {
    const int m = static_cast<int>(n - i);
    const R wv = w ? W::load_first(w + i, m) : mf;
    W::store_first(dx + i, grad(W::load_first(x + i, m), W::load_first(dy + i, m), wv), m);
  }
}

}  // namespace
}  // namespace autograd::exact
