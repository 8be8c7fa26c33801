// cross_entropy(logits, targets): the negative log-likelihood of each row's target class under
// softmax(row), computed from the logits in one pass (PyTorch's F.cross_entropy, with the class
// dimension last). With label smoothing ε the target distribution is q = (1−ε)·onehot(t) + ε/C:
//
//   loss_n = Σ_c q_c · (lse_n − x_nc) = (1−ε)·(lse_n − x_nt) + ε·(lse_n − mean_c x_nc),
//   lse_n = log Σ_c exp(x_nc) = m + log Σ_c exp(x_nc − m),   m = max_c x_nc
//
// (subtracting the row maximum m keeps exp from overflowing), summed into a mean over the rows
// not ignored, a sum, or returned per row.
//
// Backward: ∂lse_n/∂x_nc = softmax(x_n)_c = exp(x_nc − lse_n) and Σ_c q_c = 1, so
//   dx_nc = dloss_n · (softmax(x_n)_c − q_c)
// with dloss_n the incoming gradient (times 1/count for the mean); ignored rows get zero. That
// backward is a recorded op of its own (cross_entropy_backward), whose own rule is written once
// from differentiable ops, for a backward that builds a graph (create_graph).
//
// Masked logits (−inf, how a user blocks a class) follow PyTorch:
//   - a −inf logit that is not the target has softmax 0: it adds nothing to the loss and gets
//     gradient −dloss·ε/C (zero without smoothing). The smoothing term of a row holding a −inf
//     logit is +inf (its mean over the classes is −inf), so with ε > 0 that row's loss is +inf.
//     Without smoothing the term is not computed at all (0·inf would be NaN).
//   - a −inf target gives loss +inf; its gradient stays finite (−dloss·(1−ε+ε/C) there).
//   - with ε = 1 the target term has weight 0 and is not computed (PyTorch's 0·inf is NaN there).
//   - a row whose logits are all −inf has no distribution: loss +inf, gradient zero, as
//     −log_softmax picked at the target gives (log_softmax is −inf there, with zero gradient;
//     PyTorch gives NaN).
//
// Threads: rows are independent, so they are split among the threads; the losses are added in
// row order afterwards, so the result is the same whatever the thread count.
#include <algorithm>
#include <cmath>
#include <limits>

#include "autograd/graph.hpp"
#include "autograd/ops.hpp"
#include "ops/checks.hpp"
#include "ops/softmax.hpp"

namespace autograd {
namespace {

constexpr const char* kOp = "cross_entropy";
constexpr double kInf = std::numeric_limits<double>::infinity();

// The logits seen as N rows of C classes.
struct Rows {
  std::int64_t n = 0, c = 0;
  bool parallel() const { return n * c >= kParallelElementwise; }
};

// Per row, what the forward pass found, in a Float64 tensor [N, 3] (a tensor, so a warm loop
// reuses its buffer): the target (−1 for an ignored row; targets are below the class count, so
// float64 holds them exactly), logsumexp, and the row's loss.
constexpr std::int64_t kTarget = 0, kLse = 1, kLoss = 2, kColumns = 3;

Rows check_logits(const Tensor& logits, const CrossEntropyOptions& options) {
  check_defined(kOp, logits, "logits");
  check_floating(kOp, logits, "logits");
  if (logits.dim() < 1) fail(kOp, "logits need a class dimension, got shape {}", shape_str(logits.shape()));
  if (!(options.label_smoothing >= 0.0 && options.label_smoothing <= 1.0))
    fail(kOp, "label_smoothing must be in [0, 1], got {}", options.label_smoothing);
  const std::int64_t C = logits.size(-1);
  if (C == 0) fail(kOp, "logits have no classes: shape {}", shape_str(logits.shape()));
  return {logits.numel() / C, C};
}

// Writes each row's target into the table (−1 when ignored) and returns how many rows count.
template <class Target>
std::int64_t fill_targets(const Rows& rows, Target&& target, const CrossEntropyOptions& options, double* table) {
  std::int64_t counted = 0;
  for (std::int64_t n = 0; n < rows.n; ++n) {
    const std::int64_t t = target(n);
    double* entry = table + kColumns * n;
    entry[kTarget] = -1.0;
    entry[kLse] = 0.0;
    entry[kLoss] = 0.0;
    if (t == options.ignore_index) continue;
    if (t < 0 || t >= rows.c)
      fail(kOp, "target {} at position {} is out of range for {} classes (ignore_index is {})", t, n, rows.c,
           options.ignore_index);
    entry[kTarget] = static_cast<double>(t);
    ++counted;
  }
  return counted;
}

// The loss of every row not ignored (into the table, and into out in T).
template <class T>
void row_losses(const Rows& rows, const T* x, double eps, double* table, T* out) {
  const std::int64_t C = rows.c;
  parallel_for(rows.n, rows.parallel(), [&](std::int64_t n) {
    double* entry = table + kColumns * n;
    out[n] = T(0);
    if (entry[kTarget] < 0) return;  // ignored
    const T* row = x + n * C;
    double m = row[0];
    for (std::int64_t c = 1; c < C; ++c) m = std::max(m, static_cast<double>(row[c]));
    if (m == -kInf) {  // every class masked
      entry[kLse] = -kInf;
      entry[kLoss] = kInf;
      out[n] = static_cast<T>(kInf);
      return;
    }
    double s = 0.0, row_sum = 0.0;
    for (std::int64_t c = 0; c < C; ++c) {
      s += std::exp(static_cast<double>(row[c]) - m);  // exp(−inf) = 0: a masked class adds nothing
      row_sum += static_cast<double>(row[c]);
    }
    const double lse = m + std::log(s);
    const double x_t = static_cast<double>(row[static_cast<std::int64_t>(entry[kTarget])]);
    // each term only when its weight is nonzero: 0·inf would be NaN
    const double mean_x = row_sum / static_cast<double>(C);
    double loss;
    if (eps == 0.0) loss = lse - x_t;
    else if (eps == 1.0) loss = lse - mean_x;
    else loss = (1.0 - eps) * (lse - x_t) + eps * (lse - mean_x);
    entry[kLse] = lse;
    entry[kLoss] = loss;
    out[n] = static_cast<T>(loss);
  });
}

// dx_nc = dloss_n · (softmax(x_n)_c − q_c); zero for ignored and fully masked rows.
// g holds one gradient per row (per_row) or one for the reduced loss; scale is d(result)/d(loss_n).
template <class T>
void row_grads(const Rows& rows, const T* x, const T* g, bool per_row, double scale, double eps, const double* table,
               T* dx) {
  const std::int64_t C = rows.c;
  const double smooth = eps / static_cast<double>(C);
  parallel_for(rows.n, rows.parallel(), [&](std::int64_t n) {
    const double* entry = table + kColumns * n;
    T* drow = dx + n * C;
    const double lse = entry[kLse];
    if (entry[kTarget] < 0 || lse == -kInf) {
      std::fill(drow, drow + C, T(0));
      return;
    }
    const auto t = static_cast<std::int64_t>(entry[kTarget]);
    const double gn = static_cast<double>(per_row ? g[n] : g[0]) * scale;
    const T* row = x + n * C;
    for (std::int64_t c = 0; c < C; ++c)
      drow[c] = static_cast<T>(gn * (std::exp(static_cast<double>(row[c]) - lse) - smooth));
    drow[t] = static_cast<T>(static_cast<double>(drow[t]) - gn * (1.0 - eps));
  });
}

// What the backward needs from the forward pass, besides the logits.
struct Grads {
  Tensor table;
  Rows rows;
  bool per_row = false;
  double scale = 1.0, eps = 0.0;

  // w (N, 1): d(result)/d(loss_n), zero for ignored and fully masked rows.
  Tensor row_weights(Dtype dtype) const {
    const Tensor w = Tensor::empty({rows.n, 1}, dtype);
    dispatch(dtype, [&](auto zero) {
      using T = decltype(zero);
      const double* entries = table.data<double>();
      T* ws = w.data<T>();
      for (std::int64_t n = 0; n < rows.n; ++n) {
        const double* entry = entries + kColumns * n;
        ws[n] = entry[kTarget] >= 0 && entry[kLse] != -kInf ? static_cast<T>(scale) : T(0);
      }
    });
    return w;
  }
};

// dx = dloss · w ⊙ (softmax(x) − q) (row_grads), as a recorded op of its own. Its rule, when a
// graph of the backward is built: dx is linear in dloss, so
//   d/d(dloss) = Σ_c gg ⊙ (the same op at dloss = 1)   (summed over every row when reduced),
// and only softmax(x) depends on x, so
//   d/dx = softmax_backward(gg ⊙ dloss · w, softmax(x))   along the class dim.
Tensor cross_entropy_backward(const Grads& c, const Tensor& dloss, const Tensor& x) {
  Tensor dx = Tensor::empty(x.shape(), x.dtype());
  dispatch(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    row_grads<T>(c.rows, x.data<T>(), dloss.data<T>(), c.per_row, c.scale, c.eps, c.table.data<double>(), dx.data<T>());
  });
  if (!needs_grad(dloss, x)) return dx;
  constexpr const char* name = "cross_entropy_backward";
  return record(name, {dloss, x}, dx, [c, saved_dloss = SavedTensor(dloss), saved_x = SavedTensor(x)](
                                          const TensorList& g, const Node& n) {
    const Tensor xv = saved_x.get(name);
    const Tensor& gg = g[0];
    return GradList{grad_if(n, 0, [&] {
                      const Tensor dloss_v = saved_dloss.get(name);
                      const Tensor per_class = mul(gg, cross_entropy_backward(c, ones_like(dloss_v), xv));
                      return c.per_row ? sum(per_class, -1) : sum(per_class);
                    }),
                    grad_if(n, 1, [&] {
                      const std::int64_t N = c.rows.n, C = c.rows.c;
                      const Tensor dloss_v = saved_dloss.get(name);
                      const Tensor v = mul(mul(reshape(gg, {N, C}), c.row_weights(xv.dtype())),
                                           c.per_row ? reshape(dloss_v, {N, 1}) : dloss_v);
                      return reshape(softmax_backward(v, softmax(reshape(xv, {N, C}), -1), -1), xv.shape());
                    })};
  });
}

// The losses and the node, once the table holds the targets.
Tensor cross_entropy_rows(const Tensor& logits, const Rows& rows, const Tensor& table, std::int64_t counted,
                          const CrossEntropyOptions& options) {
  const double eps = options.label_smoothing;
  Tensor per_row = Tensor::empty(Shape(logits.shape().begin(), logits.shape().end() - 1), logits.dtype());
  double* entries = table.data<double>();
  dispatch(logits.dtype(), [&](auto zero) {
    using T = decltype(zero);
    row_losses<T>(rows, logits.data<T>(), eps, entries, per_row.data<T>());
  });
  double total = 0.0;  // in row order
  for (std::int64_t n = 0; n < rows.n; ++n)
    if (entries[kColumns * n + kTarget] >= 0) total += entries[kColumns * n + kLoss];
  Tensor result;
  double scale = 1.0;  // d(result)/d(per-row loss)
  switch (options.reduction) {
    case Reduction::None:
      result = per_row;
      break;
    case Reduction::Sum:
      result = scalar_tensor(total, logits.dtype());
      break;
    case Reduction::Mean:  // NaN (0/0) when every row is ignored, as in PyTorch
      scale = 1.0 / static_cast<double>(counted);
      result = scalar_tensor(counted > 0 ? total * scale : std::numeric_limits<double>::quiet_NaN(), logits.dtype());
      break;
  }
  if (!needs_grad(logits)) return result;
  return record(kOp, {logits}, result,
                [c = Grads{table, rows, options.reduction == Reduction::None, scale, eps},
                 saved = SavedTensor(logits)](const TensorList& g, const Node&) {
                  return GradList{cross_entropy_backward(c, g[0], saved.get(kOp))};
                });
}

}  // namespace

Tensor cross_entropy(const Tensor& logits, const std::vector<std::int64_t>& targets, const CrossEntropyOptions& options) {
  const Rows rows = check_logits(logits, options);
  if (static_cast<std::int64_t>(targets.size()) != rows.n)
    fail(kOp, "{} targets for logits {} ({} rows of {} classes)", targets.size(), shape_str(logits.shape()), rows.n,
         rows.c);
  const Tensor table = Tensor::empty({rows.n, kColumns}, Dtype::Float64);
  const std::int64_t counted = fill_targets(
      rows, [&](std::int64_t n) { return targets[static_cast<std::size_t>(n)]; }, options, table.data<double>());
  return cross_entropy_rows(logits, rows, table, counted, options);
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, const CrossEntropyOptions& options) {
  check_defined(kOp, logits, "logits");
  check_defined(kOp, targets, "targets");
  if (logits.dim() < 1) fail(kOp, "logits need a class dimension, got shape {}", shape_str(logits.shape()));
  const Shape expected(logits.shape().begin(), logits.shape().end() - 1);
  if (targets.shape() != expected)
    fail(kOp, "targets {} do not match logits {}: expected targets {}", shape_str(targets.shape()),
         shape_str(logits.shape()), shape_str(expected));
  const Rows rows = check_logits(logits, options);
  const Tensor table = Tensor::empty({rows.n, kColumns}, Dtype::Float64);
  std::int64_t counted = 0;
  if (targets.dtype() == Dtype::Int64) {
    const std::int64_t* t = targets.data<std::int64_t>();
    counted = fill_targets(rows, [&](std::int64_t n) { return t[n]; }, options, table.data<double>());
    return cross_entropy_rows(logits, rows, table, counted, options);
  }
  dispatch(targets.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* t = targets.data<T>();
    auto target = [&](std::int64_t n) {
      const double v = static_cast<double>(t[n]);
      if (!(v == std::floor(v)) || std::abs(v) > 9.0e15)
        fail(kOp, "target at position {} is {}, not an integral class index", n, v);
      return static_cast<std::int64_t>(v);
    };
    counted = fill_targets(rows, target, options, table.data<double>());
  });
  return cross_entropy_rows(logits, rows, table, counted, options);
}

}  // namespace autograd
