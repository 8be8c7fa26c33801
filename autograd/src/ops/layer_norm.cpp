// layer_norm over the last dims: each row of D = numel(normalized_shape) elements is brought to
// zero mean and unit variance, then scaled and shifted by the (optional) weight and bias:
//
//   y = x̂ ⊙ w + b,   x̂ = (x − μ)·r,   μ = mean(x),   σ² = mean((x − μ)²) (biased),   r = 1/√(σ² + eps)
//
// μ and r are computed in float64 (stable for float32 rows) and kept per row for backward.
//
// Backward, per row, with dy the gradient of y:
//   b and w are shared by every row, so their gradients add up over the rows:
//     db = Σ_rows dy,   dw = Σ_rows dy ⊙ x̂
//   The gradient reaching x̂ is dx̂ = dy ⊙ w (dy without a weight). x̂_i depends on every x_j of its
//   row, through x_i itself, through μ (∂μ/∂x_j = 1/D) and through r: ∂σ²/∂x_j = 2·(x_j − μ)/D
//   (μ's own change cancels, as Σ_i (x_i − μ) = 0), so ∂r/∂x_j = −½·r³·∂σ²/∂x_j = −r²·x̂_j/D and
//     ∂x̂_i/∂x_j = r·(δ_ij − 1/D) + (x_i − μ)·∂r/∂x_j = r·(δ_ij − 1/D − x̂_i·x̂_j/D)
//   and summing dx̂_i·∂x̂_i/∂x_j over i:
//     dx = r · (dx̂ − mean(dx̂) − x̂ · mean(dx̂ ⊙ x̂))
//
// That backward is a recorded op of its own, layer_norm_backward(dy, x, w) -> (dx, dw, db): the
// kernels below, and, for a backward that builds a graph (create_graph), a node whose rule (the
// derivative of the backward, derived at LayerNormBackwardRule) is written once from
// differentiable ops.
//
// Threads: rows are independent, so both passes split the rows among the threads. dw and db are
// sums over rows: a large input's rows are cut into fixed chunks (by its shape alone), each chunk
// sums its own part, and the parts are added in chunk order. Every element is computed the same
// way whatever the thread count.
//
// Float32 rows run instruction-set kernels (kernels/exact.hpp) unless the generic variant is in use: the
// same formulas, with the row sums added in another order (exact.hpp gives the bounds).
//
// Rows of extreme magnitude: the kernels form x − μ and r in the input's type, which overflows or
// loses its precision when the row's spread is near the type's range (a float32 row of 3e38 and
// −3e38 has x − μ ≈ −5.8e38, beyond float; r would be a float32 denormal), although x̂ is bounded
// by √D. Such a row shows in its r, computed in double: r outside [2^-100, 2^100] for float32
// ([2^-500, 2^500] for float64), or NaN. Only those rows are redone in long double, in the
// forward and in the backward (which sees the same r, saved); every other row keeps the kernels'
// bits. Inside the bounds nothing overflows: |x_i − μ| ≤ √(D·σ²) ≤ √D / r. The rule of the
// backward op recomputes x̂ and r from differentiable ops on such rows scaled by a power of two
// (row_scales).
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <span>
#include <type_traits>
#include <vector>

#include "autograd/graph.hpp"
#include "autograd/ops.hpp"
#include "kernels/exact.hpp"
#include "ops/checks.hpp"

namespace autograd {
namespace {

constexpr const char* kOp = "layer_norm";
// Rows of one chunk of a backward pass split among threads.
constexpr std::int64_t kChunkRows = 64;

// The input seen as N rows of D elements.
struct Rows {
  std::int64_t n = 0, d = 0;
  bool parallel() const { return n * d >= kParallelElementwise; }
};

Rows check_layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                      double eps) {
  check_defined(kOp, x);
  check_floating(kOp, x, "the input");
  const std::size_t k = normalized_shape.size();
  if (k == 0) fail(kOp, "normalized_shape is empty");
  if (x.dim() < static_cast<std::int64_t>(k) ||
      !std::equal(normalized_shape.begin(), normalized_shape.end(), x.shape().end() - static_cast<std::ptrdiff_t>(k)))
    fail(kOp, "input {} does not end with normalized_shape {}", shape_str(x.shape()), shape_str(normalized_shape));
  for (const auto* p : {&weight, &bias}) {
    if (!p->defined()) continue;
    const char* what = p == &weight ? "weight" : "bias";
    check_floating(kOp, *p, what);
    if (p->shape() != normalized_shape)
      fail(kOp, "{} {} must have normalized_shape {}", what, shape_str(p->shape()), shape_str(normalized_shape));
    if (p->dtype() != x.dtype())
      fail(kOp, "dtypes differ: input {} and {} {}", dtype_name(x.dtype()), what, dtype_name(p->dtype()));
  }
  if (!(eps >= 0.0)) fail(kOp, "eps must be >= 0, got {}", eps);
  const std::int64_t d = shape_numel(normalized_shape);
  return {d == 0 ? 0 : x.numel() / d, d};
}

// A row whose r (computed in double by the kernels) says that its x − μ or r may not fit T.
template <class T>
bool is_wide(double rstd) {
  constexpr double lo = std::is_same_v<T, float> ? 0x1p-100 : 0x1p-500;
  constexpr double hi = std::is_same_v<T, float> ? 0x1p100 : 0x1p500;
  return !(rstd >= lo && rstd <= hi);  // NaN too
}

// μ and r of a wide row in long double, whose range holds any float32 or float64 row's sums.
struct WideStats {
  long double mu = 0, r = 0;
};

template <class T>
WideStats wide_stats(const T* x, std::int64_t D, double eps) {
  long double sum = 0, sq = 0;
  for (std::int64_t i = 0; i < D; ++i) sum += x[i];
  const long double mu = sum / static_cast<long double>(D);
  for (std::int64_t i = 0; i < D; ++i) sq += (x[i] - mu) * (x[i] - mu);
  return {mu, 1 / std::sqrt(sq / static_cast<long double>(D) + eps)};
}

// y of a wide row, in long double, rounded once to T.
template <class T>
void wide_forward_row(const T* x, std::int64_t D, const T* w, const T* b, double eps, T* y) {
  const WideStats s = wide_stats(x, D, eps);
  for (std::int64_t i = 0; i < D; ++i) {
    long double v = (x[i] - s.mu) * s.r;
    if (w) v *= w[i];
    if (b) v += b[i];
    y[i] = static_cast<T>(v);
  }
}

// The gradients of a wide row, as backward_rows computes them, in long double.
template <class T>
void wide_backward_row(const T* x, const T* dy, std::int64_t D, const T* w, double eps, T* dx, T* dw, T* db) {
  const WideStats s = wide_stats(x, D, eps);
  long double m1 = 0, m2 = 0;
  for (std::int64_t i = 0; i < D; ++i) {
    const long double xh = (x[i] - s.mu) * s.r, g = w ? static_cast<long double>(dy[i]) * w[i] : dy[i];
    m1 += g;
    m2 += g * xh;
    if (db) db[i] += dy[i];
    if (dw) dw[i] += static_cast<T>(dy[i] * xh);
  }
  if (!dx) return;
  m1 /= static_cast<long double>(D);
  m2 /= static_cast<long double>(D);
  for (std::int64_t i = 0; i < D; ++i) {
    const long double xh = (x[i] - s.mu) * s.r, g = w ? static_cast<long double>(dy[i]) * w[i] : dy[i];
    dx[i] = static_cast<T>(s.r * (g - m1 - xh * m2));
  }
}

// One row through Eigen: μ and r in double (stats = {μ, r}), y in T.
template <class T>
void generic_forward_row(const T* x, std::int64_t D, const T* w, const T* b, double eps, double* stats, T* y) {
  ConstArrayView<T> row(x, D);
  ArrayView<T> out(y, D);
  // mean and biased variance accumulated in double
  const double mu = row.template cast<double>().mean();
  const double var = (row.template cast<double>() - mu).square().mean();
  const double rstd = 1.0 / std::sqrt(var + eps);
  stats[0] = mu;
  stats[1] = rstd;
  out = (row - static_cast<T>(mu)) * static_cast<T>(rstd);
  if (w) out *= ConstArrayView<T>(w, D);
  if (b) out += ConstArrayView<T>(b, D);
}

// y = x̂ ⊙ w + b row by row; stats[2n] = μ and stats[2n + 1] = r of row n (as the kernels found
// them, also for a wide row, whose backward redoes them).
template <class T>
void forward_rows(const Rows& s, const T* xs, const T* w, const T* b, double eps, double* stats, T* ys) {
  const std::int64_t D = s.d;
  parallel_for(s.n, s.parallel(), [=](std::int64_t n) {
    const T* x = xs + n * D;
    T* y = ys + n * D;
    double* st = stats + 2 * n;
    bool done = false;
    if constexpr (std::is_same_v<T, float>) done = exact::layer_norm_forward(x, D, w, b, eps, st, y);
    if (!done) generic_forward_row(x, D, w, b, eps, st, y);
    if (is_wide<T>(st[1])) wide_forward_row(x, D, w, b, eps, y);
  });
}

// The gradients of rows [begin, end): dx (when dx is not null) and, added into dw and db
// (either may be null), Σ dy ⊙ x̂ and Σ dy. x̂ and dx̂ of the current row go in `scratch` (2·D).
template <class T>
void backward_rows(const Rows& s, std::int64_t begin, std::int64_t end, const T* xs, const T* dys, const T* w,
                   const double* stats, double eps, T* scratch, T* dx, T* dw, T* db) {
  const std::int64_t D = s.d;
  ArrayView<T> xhat(scratch, D), dxhat(scratch + D, D);
  for (std::int64_t n = begin; n < end; ++n) {
    if (is_wide<T>(stats[2 * n + 1])) {
      wide_backward_row(xs + n * D, dys + n * D, D, w, eps, dx ? dx + n * D : nullptr, dw, db);
      continue;
    }
    if constexpr (std::is_same_v<T, float>) {
      if (exact::layer_norm_backward(xs + n * D, dys + n * D, D, w, stats + 2 * n, dx ? dx + n * D : nullptr, dw, db))
        continue;
    }
    ConstArrayView<T> dy(dys + n * D, D);
    const T r = static_cast<T>(stats[2 * n + 1]);
    xhat = (ConstArrayView<T>(xs + n * D, D) - static_cast<T>(stats[2 * n])) * r;
    if (db) ArrayView<T>(db, D) += dy;
    if (dw) ArrayView<T>(dw, D) += dy * xhat;
    if (!dx) continue;
    if (w) {
      dxhat = dy * ConstArrayView<T>(w, D);
    } else {
      dxhat = dy;
    }
    const T mean_dxhat = dxhat.mean();
    const T mean_dxhat_xhat = (dxhat * xhat).mean();
    ArrayView<T>(dx + n * D, D) = r * (dxhat - mean_dxhat - xhat * mean_dxhat_xhat);
  }
}

// All the gradients. A small input is one chunk of rows, added in order; a larger one is split
// into chunks of kChunkRows rows, each summing its own partial dw and db, and the partials are
// added in chunk order afterwards. The chunks depend on the shape only.
template <class T>
void backward(const Rows& s, const T* xs, const T* dys, const T* w, const double* stats, double eps, T* dx, T* dw,
              T* db) {
  const std::int64_t D = s.d;
  const std::int64_t chunks = s.parallel() ? (s.n + kChunkRows - 1) / kChunkRows : 1;
  const std::int64_t chunk_rows = chunks > 1 ? kChunkRows : s.n;
  // per chunk: its partial dw, then its partial db (only with more than one chunk)
  const Tensor partial = chunks > 1 ? Tensor::empty({chunks, 2, D}, dtype_of<T>()) : Tensor();
  parallel_region(chunks > 1, [&] {
    // this thread's x̂ and dx̂ of one row, from its pool (no allocation once warm)
    const Tensor scratch = Tensor::empty({2, D}, dtype_of<T>());
#pragma omp for schedule(static)
    for (std::int64_t k = 0; k < chunks; ++k) {
      T* pw = dw;
      T* pb = db;
      if (chunks > 1) {
        T* base = partial.data<T>() + 2 * k * D;
        ArrayView<T>(base, 2 * D).setZero();
        pw = dw ? base : nullptr;
        pb = db ? base + D : nullptr;
      }
      backward_rows<T>(s, k * chunk_rows, std::min(s.n, (k + 1) * chunk_rows), xs, dys, w, stats, eps,
                       scratch.data<T>(), dx, pw, pb);
    }
  });
  for (std::int64_t k = 0; chunks > 1 && k < chunks; ++k) {
    const T* base = partial.data<T>() + 2 * k * D;
    if (dw) ArrayView<T>(dw, D) += ConstArrayView<T>(base, D);
    if (db) ArrayView<T>(db, D) += ConstArrayView<T>(base + D, D);
  }
}

// For x̂ and r from differentiable ops (normalized) of an input with wide rows: per row (N, 1) a power of two s that
// brings max(|x|, √eps) of a wide row near 1 (1 for the other rows), and eps·s². x̂ of s·x with
// eps·s² is x̂ of x, and r(x) = s·r(s·x), so the composed ops on s·x stay in range. Undefined
// tensors when no row is wide (the ops then run on x itself).
struct RowScales {
  Tensor s, eps;
};

RowScales row_scales(const Tensor& xs, const Tensor& stats, double eps) {
  RowScales out;
  dispatch(xs.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const std::int64_t N = xs.size(0), D = xs.size(1);
    const double* st = stats.data<double>();
    const T* x = xs.data<T>();
    std::vector<double> s(static_cast<std::size_t>(N), 1.0), e(static_cast<std::size_t>(N), eps);
    bool any = false;
    for (std::int64_t n = 0; n < N; ++n) {
      if (!is_wide<T>(st[2 * n + 1])) continue;
      double top = std::sqrt(eps);
      for (std::int64_t i = 0; i < D; ++i) top = std::max(top, std::fabs(static_cast<double>(x[n * D + i])));
      if (!(top > 0.0) || !std::isfinite(top)) continue;
      int exp = 0;
      std::frexp(top, &exp);  // top < 2^exp
      exp = std::max(exp, 3 - std::numeric_limits<T>::max_exponent);  // 2^-exp must fit T
      const auto k = static_cast<std::size_t>(n);
      s[k] = std::ldexp(1.0, -exp);
      e[k] = eps * s[k] * s[k];
      any = true;
    }
    if (!any) return;
    out.s = tensor(s, {N, 1}, xs.dtype());
    out.eps = tensor(e, {N, 1}, xs.dtype());
  });
  return out;
}

// What the backward needs from the forward pass, besides x and w.
struct Saved {
  Tensor stats;  // [N, 2] float64: μ and r per row
  Rows rows;
  Shape param_shape;  // the weight's and bias's (normalized_shape)
  double eps = 0.0;
};

// x̂ and r (N, 1) of the rows xs (N, D), from differentiable ops (the forward recomputed).
struct Normalized {
  Tensor xhat, r;
};

Normalized normalized(const Saved& st, const Tensor& xs) {
  const RowScales scales = row_scales(xs, st.stats, st.eps);
  const bool scaled = scales.s.defined();
  const Tensor xin = scaled ? mul(xs, scales.s) : xs;
  const Tensor centred = sub(xin, mean(xin, 1, /*keepdim=*/true));
  const Tensor var = mean(mul(centred, centred), 1, /*keepdim=*/true);
  const Tensor r = rsqrt(scaled ? add(var, scales.eps) : add(var, st.eps));
  return {mul(centred, r), scaled ? mul(r, scales.s) : r};
}

// The gradients of one backward call, undefined where not asked for.
struct Grads {
  Tensor dx, dw, db;
};

Grads layer_norm_backward(const Saved& st, const Tensor& dy, const Tensor& x, const Tensor& w, bool want_dx,
                          bool want_dw, bool want_db);

// The rule of layer_norm_backward, per row, with g = dy ⊙ w (dy without a weight), J = ∂x̂/∂x =
// r·(I − 1/D − x̂ x̂ᵀ/D) (symmetric, so dx = J g), and u, gw, gb the gradients reaching dx, dw and
// db. Writing L = ⟨u, dx⟩ + ⟨gw, dw⟩ + ⟨gb, db⟩ = r·(⟨u, g⟩ − mean(g)·Σu − ⟨g, x̂⟩⟨u, x̂⟩/D)
// + Σ_rows ⟨gw ⊙ dy, x̂⟩ + ⟨gb, db⟩:
//   d/d(dy) = w ⊙ J u + x̂ ⊙ gw + gb,      d/dw = Σ_rows dy ⊙ J u,
//   d/dx    = J θ − r · mean(J u ⊙ g) · x̂,  θ = gw ⊙ dy − r · (mean(u ⊙ x̂) · g + mean(g ⊙ x̂) · u)
// (θ is ∂L/∂x̂ at fixed r, and ∂L/∂r = ⟨u, dx⟩/r = ⟨J u, g⟩/r times ∂r/∂x = −r²·x̂/D gives the
// second term). J v is the op itself at dy = v without a weight; x̂ and r are recomputed.
struct LayerNormBackwardRule {
  static constexpr const char* name = "layer_norm_backward";
  Saved st;
  SavedTensor dy, x, w;
  bool want_dx = false, want_dw = false, want_db = false;

  GradList operator()(const TensorList& g, const Node& node) const {
    const std::int64_t N = st.rows.n, D = st.rows.d;
    std::size_t k = 0;
    const Tensor u = want_dx ? reshape(g[k++], {N, D}) : Tensor();
    const Tensor gw = want_dw ? reshape(g[k++], {1, D}) : Tensor();
    const Tensor gb = want_db ? reshape(g[k++], {1, D}) : Tensor();
    const bool has_w = w.defined();
    const bool need_dy = node.needs_input_grad(0), need_x = node.needs_input_grad(1),
               need_w = has_w && node.needs_input_grad(2);
    const Tensor xv = x.get(name);
    const Tensor dys = reshape(dy.get(name), {N, D});
    const Tensor ws = has_w ? reshape(w.get(name), {1, D}) : Tensor();
    auto j = [&](const Tensor& v) {  // J v, v (N, D)
      return reshape(layer_norm_backward(st, reshape(v, xv.shape()), xv, Tensor(), true, false, false).dx, {N, D});
    };
    const Tensor ju = want_dx && (need_dy || need_x || need_w) ? j(u) : Tensor();
    const Normalized z =
        (need_dy && want_dw) || (need_x && want_dx) ? normalized(st, reshape(xv, {N, D})) : Normalized{};
    auto plus = [](const Tensor& a, const Tensor& b) { return a.defined() ? add(a, b) : b; };
    GradList grads(has_w ? 3 : 2);
    if (need_dy) {
      Tensor t;
      if (want_dx) t = has_w ? mul(ju, ws) : ju;
      if (want_dw) t = plus(t, mul(z.xhat, gw));
      if (want_db) t = t.defined() ? add(t, gb) : expand(gb, {N, D});
      grads[0] = reshape(t, node.input_meta[0].shape);
    }
    if (need_x && (want_dx || want_dw)) {
      const Tensor gs = has_w ? mul(dys, ws) : dys;
      Tensor theta;
      if (want_dw) theta = mul(dys, gw);
      if (want_dx) {
        const Tensor inner = add(mul(mean(mul(u, z.xhat), 1, true), gs), mul(mean(mul(gs, z.xhat), 1, true), u));
        theta = theta.defined() ? sub(theta, mul(z.r, inner)) : neg(mul(z.r, inner));
      }
      Tensor dx = j(theta);
      if (want_dx) dx = sub(dx, mul(mul(z.r, mean(mul(ju, gs), 1, true)), z.xhat));
      grads[1] = reshape(dx, node.input_meta[1].shape);
    }
    if (need_w && want_dx) grads[2] = reshape(sum(mul(dys, ju), 0), node.input_meta[2].shape);
    return grads;
  }
};

// dx (want_dx), dw (want_dw) and db (want_db) of layer_norm at x with weight w (undefined: none)
// for the gradient dy of y, through the kernels; a recorded op of its own when its inputs need
// grad (dy, x, w; the bias does not enter the backward).
Grads layer_norm_backward(const Saved& st, const Tensor& dy, const Tensor& x, const Tensor& w, bool want_dx,
                          bool want_dw, bool want_db) {
  Grads out;
  if (want_dx) out.dx = Tensor::empty(x.shape(), x.dtype());
  if (want_dw) out.dw = zeros(st.param_shape, x.dtype());
  if (want_db) out.db = zeros(st.param_shape, x.dtype());
  if (!want_dx && !want_dw && !want_db) return out;
  dispatch(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    auto ptr = [](const Tensor& t) { return t.defined() ? t.data<T>() : nullptr; };
    backward<T>(st.rows, x.data<T>(), dy.data<T>(), want_dx ? ptr(w) : nullptr, st.stats.data<double>(), st.eps,
                ptr(out.dx), ptr(out.dw), ptr(out.db));
  });
  const std::array<Tensor, 3> inputs{dy, x, w};
  const std::span<const Tensor> in(inputs.data(), w.defined() ? 3 : 2);
  if (!needs_grad(in)) return out;
  std::array<Tensor, 3> outputs;
  std::size_t n_out = 0;
  for (const Tensor* t : {&out.dx, &out.dw, &out.db})
    if (t->defined()) outputs[n_out++] = *t;
  record(LayerNormBackwardRule::name, in, std::span<const Tensor>(outputs.data(), n_out),
         LayerNormBackwardRule{st, SavedTensor(dy), SavedTensor(x), w.defined() ? SavedTensor(w) : SavedTensor(),
                               want_dx, want_dw, want_db});
  return out;  // (the outputs share their tensors with out's, which now point at the node)
}

// layer_norm's rules. Backward: layer_norm_backward. Forward mode: with x̂ = (x − μ)·r,
// ẏ = ẋ̂ ⊙ w + x̂ ⊙ ẇ + ḃ, where x̂'s Jacobian r·(I − 1/D − x̂·x̂ᵀ/D) is symmetric, so ẋ̂ is the
// weightless backward applied to ẋ.
struct LayerNormRule {
  Saved st;
  SavedTensor saved_x, saved_w;
  bool has_weight = false, has_bias = false;

  GradList operator()(const TensorList& g, const Node& node) const {
    const std::size_t bias_input = has_weight ? 2 : 1;
    const bool want_dx = node.needs_input_grad(0);
    const Tensor wv = has_weight && want_dx ? saved_w.get(kOp) : Tensor();
    const Grads d = layer_norm_backward(st, g[0], saved_x.get(kOp), wv, want_dx, has_weight && node.needs_input_grad(1),
                                        has_bias && node.needs_input_grad(bias_input));
    GradList grads{d.dx};
    if (has_weight) grads.push_back(d.dw);
    if (has_bias) grads.push_back(d.db);
    return grads;
  }

  GradList tangents(const TensorList& t, const Node& node, std::uint64_t) const {
    const std::int64_t N = st.rows.n, D = st.rows.d;
    const Tensor xv = saved_x.get(kOp);
    const Tensor dw = has_weight ? t[1] : Tensor(), db = has_bias ? t[has_weight ? 2 : 1] : Tensor();
    Tensor y;  // (N, D)
    auto plus = [&](const Tensor& term) { y = y.defined() ? add(y, term) : term; };
    if (t[0].defined()) {
      const Tensor dxhat = reshape(layer_norm_backward(st, t[0], xv, Tensor(), true, false, false).dx, {N, D});
      plus(has_weight ? mul(dxhat, reshape(saved_w.get(kOp), {1, D})) : dxhat);
    }
    if (dw.defined()) plus(mul(normalized(st, reshape(xv, {N, D})).xhat, reshape(dw, {1, D})));
    if (db.defined()) plus(y.defined() ? reshape(db, {1, D}) : add(zeros({N, D}, db.dtype()), reshape(db, {1, D})));
    return GradList{reshape(y, node.output_meta[0].shape)};
  }
};

}  // namespace

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  const Rows rows = check_layer_norm(x, normalized_shape, weight, bias, eps);
  // (a tensor, so that a warm loop reuses its buffer)
  const Tensor stats = Tensor::empty({rows.n, 2}, Dtype::Float64);
  Tensor y = Tensor::empty(x.shape(), x.dtype());
  dispatch(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    forward_rows<T>(rows, x.data<T>(), weight.defined() ? weight.data<T>() : nullptr,
                    bias.defined() ? bias.data<T>() : nullptr, eps, stats.data<double>(), y.data<T>());
  });
  if (eps == 0.0) {  // a row of zero variance has r = 1/√0: refused, not returned as NaN
    const double* st = stats.data<double>();
    for (std::int64_t n = 0; n < rows.n; ++n)
      if (std::isinf(st[2 * n + 1]))
        fail(kOp, "with eps = 0, row {} of the input {} (normalized_shape {}) has zero variance, so 1/sqrt(var + eps) "
             "is infinite; use eps > 0 (e.g. 1e-5)", n, shape_str(x.shape()), shape_str(normalized_shape));
  }
  std::array<Tensor, 3> all_inputs{x};
  std::size_t n_inputs = 1;
  if (weight.defined()) all_inputs[n_inputs++] = weight;
  if (bias.defined()) all_inputs[n_inputs++] = bias;
  const std::span<const Tensor> inputs(all_inputs.data(), n_inputs);
  if (!needs_grad(inputs)) return y;
  const bool has_weight = weight.defined(), has_bias = bias.defined();
  // x is needed for dx and dw; w only for dx
  record(kOp, inputs, std::span<const Tensor>(&y, 1),
         LayerNormRule{Saved{stats, rows, normalized_shape, eps}, SavedTensor(x),
                       has_weight && x.requires_grad() ? SavedTensor(weight) : SavedTensor(), has_weight, has_bias});
  return y;
}

}  // namespace autograd
