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
// bits. Inside the bounds nothing overflows: |x_i − μ| ≤ √(D·σ²) ≤ √D / r. The composed backward
// (create_graph) works on such rows scaled by a power of two (row_scales).
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <span>
#include <type_traits>
#include <vector>

#include "autograd/grad_mode.hpp"
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

// For the composed backward of an input with wide rows: per row (N, 1) a power of two s that
// brings max(|x|, √eps) of a wide row near 1 (1 for the other rows), and eps·s². x̂ of s·x with
// eps·s² is x̂ of x, and r(x) = s·r(s·x), so the composed ops on s·x stay in range. Undefined
// tensors when no row is wide (the composed ops then run on x itself, as they always did).
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

// The backward rule: what it saved from the forward pass, and the three gradients.
struct LayerNormBackward {
  Tensor stats;  // [N, 2] float64: μ and r per row
  SavedTensor x, weight;
  Rows rows;
  bool has_weight = false, has_bias = false;
  double eps = 0.0;

  GradList operator()(const TensorList& g, const Node& node) const {
    if (is_grad_enabled()) return composed(g[0], node);
    const Tensor xv = x.get(kOp);
    const std::size_t bias_input = has_weight ? 2 : 1;
    Tensor dx, dw, db;
    if (node.needs_input_grad(0)) dx = Tensor::empty(xv.shape(), xv.dtype());
    const Tensor wv = has_weight && dx.defined() ? weight.get(kOp) : Tensor();
    if (has_weight && node.needs_input_grad(1)) dw = zeros(node.input_meta[1].shape, xv.dtype());
    if (has_bias && node.needs_input_grad(bias_input)) db = zeros(node.input_meta[bias_input].shape, xv.dtype());
    dispatch(xv.dtype(), [&](auto zero) {
      using T = decltype(zero);
      const T* xs = xv.data<T>();
      const T* dys = g[0].data<T>();
      const double* st = stats.data<double>();
      auto ptr = [](const Tensor& t) { return t.defined() ? t.data<T>() : nullptr; };
      backward<T>(rows, xs, dys, ptr(wv), st, eps, ptr(dx), ptr(dw), ptr(db));
    });
    GradList grads{dx};
    if (has_weight) grads.push_back(dw);
    if (has_bias) grads.push_back(db);
    return grads;
  }

  // The same gradients composed of differentiable ops, for a backward that builds a graph, on
  // the rows (N, D): x̂ and r recomputed from the connected input, then the formulas above.
  GradList composed(const Tensor& g, const Node& node) const {
    const std::size_t bias_input = has_weight ? 2 : 1;
    const bool want_x = node.needs_input_grad(0), want_w = has_weight && node.needs_input_grad(1);
    const Tensor dy = reshape(g, {rows.n, rows.d});
    GradList grads(bias_input + (has_bias ? 1 : 0));
    if (want_x || want_w) {
      const Tensor xs = reshape(x.get(kOp), {rows.n, rows.d});
      const RowScales scales = row_scales(xs, stats, eps);
      const bool scaled = scales.s.defined();
      const Tensor xin = scaled ? mul(xs, scales.s) : xs;
      const Tensor centred = sub(xin, mean(xin, 1, /*keepdim=*/true));
      const Tensor var = mean(mul(centred, centred), 1, /*keepdim=*/true);
      const Tensor r = rsqrt(scaled ? add(var, scales.eps) : add(var, eps));
      const Tensor xhat = mul(centred, r);
      if (want_w) grads[1] = reshape(sum(mul(dy, xhat), 0), node.input_meta[1].shape);
      if (want_x) {
        const Tensor dxhat = has_weight ? mul(dy, reshape(weight.get(kOp), {1, rows.d})) : dy;
        const Tensor inner = sub(sub(dxhat, mean(dxhat, 1, true)), mul(xhat, mean(mul(dxhat, xhat), 1, true)));
        grads[0] = reshape(mul(scaled ? mul(r, scales.s) : r, inner), node.input_meta[0].shape);
      }
    }
    if (has_bias && node.needs_input_grad(bias_input))
      grads[bias_input] = reshape(sum(dy, 0), node.input_meta[bias_input].shape);
    return grads;
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
  std::array<Tensor, 3> all_inputs{x};
  std::size_t n_inputs = 1;
  if (weight.defined()) all_inputs[n_inputs++] = weight;
  if (bias.defined()) all_inputs[n_inputs++] = bias;
  const std::span<const Tensor> inputs(all_inputs.data(), n_inputs);
  if (!needs_grad(inputs)) return y;
  const bool has_weight = weight.defined();
  // x is needed for dx and dw; w only for dx
  record(kOp, inputs, std::span<const Tensor>(&y, 1),
         LayerNormBackward{stats, SavedTensor(x), has_weight && x.requires_grad() ? SavedTensor(weight) : SavedTensor(),
                           rows, has_weight, bias.defined(), eps});
  return y;
}

}  // namespace autograd
