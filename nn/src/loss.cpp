#include "nn/loss.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

namespace nn {

namespace {

// What backward needs, per row: the target (−1 for an ignored row) and logsumexp, in a Float64
// tensor [N, 2] (a tensor, so a warm loop reuses its buffer). Targets are below the class
// count, so float64 holds them exactly.
struct CrossEntropyContext {
  ag::Tensor rows;
  std::int64_t classes = 0;
  std::int64_t counted = 0;  // rows not ignored
};

}  // namespace

ag::Tensor cross_entropy(const ag::Tensor& logits, const std::vector<std::int64_t>& targets,
                         const CrossEntropyOptions& options) {
  constexpr const char* op = "cross_entropy";
  if (!logits.defined()) ag::fail(op, "logits are undefined");
  if (logits.dim() < 1) ag::fail(op, "logits need a class dimension, got shape {}", ag::shape_str(logits.shape()));
  if (!(options.label_smoothing >= 0.0 && options.label_smoothing <= 1.0))
    ag::fail(op, "label_smoothing must be in [0, 1], got {}", options.label_smoothing);
  const std::int64_t C = logits.size(-1);
  if (C == 0) ag::fail(op, "logits have no classes: shape {}", ag::shape_str(logits.shape()));
  const std::int64_t N = logits.numel() / C;
  if (static_cast<std::int64_t>(targets.size()) != N)
    ag::fail(op, "{} targets for logits {} ({} rows of {} classes)", targets.size(), ag::shape_str(logits.shape()), N, C);

  CrossEntropyContext ctx;
  ctx.rows = ag::Tensor::empty({N, 2}, ag::Dtype::Float64);
  ctx.classes = C;
  double* rows = ctx.rows.data<double>();
  for (std::int64_t n = 0; n < N; ++n) {
    const std::int64_t t = targets[static_cast<std::size_t>(n)];
    rows[2 * n] = t == options.ignore_index ? -1.0 : static_cast<double>(t);
    rows[2 * n + 1] = 0.0;
    if (t == options.ignore_index) continue;
    if (t < 0 || t >= C)
      ag::fail(op, "target {} at position {} is out of range for {} classes (ignore_index is {})", t, n, C,
               options.ignore_index);
    ++ctx.counted;
  }

  const double eps = options.label_smoothing;
  ag::Shape loss_shape(logits.shape().begin(), logits.shape().end() - 1);
  ag::Tensor per_row = ag::Tensor::empty(loss_shape, logits.dtype());
  double total = 0.0;
  ag::dispatch(logits.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* x = logits.data<T>();
    T* out = per_row.data<T>();
    for (std::int64_t n = 0; n < N; ++n) {
      const T* row = x + n * C;
      const std::int64_t t = targets[static_cast<std::size_t>(n)];
      if (t == options.ignore_index) {
        out[n] = T(0);
        continue;
      }
      // loss = logsumexp(x) − x_t, with the maximum subtracted so exp never overflows
      double m = row[0];
      for (std::int64_t c = 1; c < C; ++c) m = std::max(m, static_cast<double>(row[c]));
      double s = 0.0, row_sum = 0.0;
      for (std::int64_t c = 0; c < C; ++c) {
        s += std::exp(static_cast<double>(row[c]) - m);
        row_sum += static_cast<double>(row[c]);
      }
      const double lse = m + std::log(s);
      rows[2 * n + 1] = lse;
      // smoothed: (1−ε)(lse − x_t) + ε·mean_c(lse − x_c)
      const double loss = (1.0 - eps) * (lse - static_cast<double>(row[t])) + eps * (lse - row_sum / static_cast<double>(C));
      out[n] = static_cast<T>(loss);
      total += loss;
    }
  });

  ag::Tensor result;
  double scale = 1.0;  // d(result)/d(per-row loss)
  switch (options.reduction) {
    case Reduction::None:
      result = per_row;
      break;
    case Reduction::Sum:
      result = ag::scalar_tensor(total, logits.dtype());
      break;
    case Reduction::Mean:
      scale = 1.0 / static_cast<double>(ctx.counted);
      result = ag::scalar_tensor(ctx.counted > 0 ? total * scale : std::numeric_limits<double>::quiet_NaN(),
                                 logits.dtype());
      break;
  }
  if (!ag::needs_grad(logits)) return result;

  const Reduction reduction = options.reduction;
  // loss_n = lse(x_n) − Σ_c q_c x_nc, q = (1−ε)·onehot(t) + ε/C  =>  dx_nc = dloss_n · (softmax(x_n)_c − q_c)
  return ag::record("cross_entropy", {logits}, result,
                    [ctx, saved = ag::SavedTensor(logits), reduction, eps, scale](const ag::TensorList& g,
                                                                                         const ag::Node&) {
                      const ag::Tensor x = saved.get("cross_entropy");
                      const std::int64_t C = ctx.classes;
                      const std::int64_t N = ctx.rows.size(0);
                      const double* rows = ctx.rows.data<double>();
                      ag::Tensor dx = ag::Tensor::empty(x.shape(), x.dtype());
                      ag::dispatch(x.dtype(), [&](auto zero) {
                        using T = decltype(zero);
                        const T* xs = x.data<T>();
                        const T* gs = g[0].data<T>();
                        T* d = dx.data<T>();
                        const double smooth = eps / static_cast<double>(C);
                        for (std::int64_t n = 0; n < N; ++n) {
                          T* drow = d + n * C;
                          const auto t = static_cast<std::int64_t>(rows[2 * n]);
                          if (t < 0) {  // ignored
                            std::fill(drow, drow + C, T(0));
                            continue;
                          }
                          const double gn = (reduction == Reduction::None ? static_cast<double>(gs[n])
                                                                          : static_cast<double>(gs[0])) * scale;
                          const double lse = rows[2 * n + 1];
                          const T* row = xs + n * C;
                          for (std::int64_t c = 0; c < C; ++c)
                            drow[c] = static_cast<T>(gn * (std::exp(static_cast<double>(row[c]) - lse) - smooth));
                          drow[t] = static_cast<T>(static_cast<double>(drow[t]) - gn * (1.0 - eps));
                        }
                      });
                      return ag::GradList{dx};
                    });
}

ag::Tensor cross_entropy(const ag::Tensor& logits, const ag::Tensor& targets, const CrossEntropyOptions& options) {
  constexpr const char* op = "cross_entropy";
  if (!logits.defined()) ag::fail(op, "logits are undefined");
  if (!targets.defined()) ag::fail(op, "targets are undefined");
  if (logits.dim() < 1) ag::fail(op, "logits need a class dimension, got shape {}", ag::shape_str(logits.shape()));
  const ag::Shape expected(logits.shape().begin(), logits.shape().end() - 1);
  if (targets.shape() != expected)
    ag::fail(op, "targets {} do not match logits {}: expected targets {}", ag::shape_str(targets.shape()),
             ag::shape_str(logits.shape()), ag::shape_str(expected));
  std::vector<std::int64_t> indices(static_cast<std::size_t>(targets.numel()));
  ag::dispatch(targets.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* t = targets.data<T>();
    for (std::size_t i = 0; i < indices.size(); ++i) {
      const double v = static_cast<double>(t[i]);
      if (!(v == std::floor(v)) || std::abs(v) > 9.0e15)
        ag::fail(op, "target at position {} is {}, not an integral class index", i, v);
      indices[i] = static_cast<std::int64_t>(v);
    }
  });
  return cross_entropy(logits, indices, options);
}

ag::Tensor mse_loss(const ag::Tensor& input, const ag::Tensor& target, Reduction reduction) {
  constexpr const char* op = "mse_loss";
  if (!input.defined() || !target.defined()) ag::fail(op, "input or target is undefined");
  if (input.shape() != target.shape())
    ag::fail(op, "input {} and target {} must have the same shape", ag::shape_str(input.shape()),
             ag::shape_str(target.shape()));
  if (input.dtype() != target.dtype())
    ag::fail(op, "dtypes differ: {} and {}", ag::dtype_name(input.dtype()), ag::dtype_name(target.dtype()));
  ag::Tensor squared = ag::square(ag::sub(input, target));
  switch (reduction) {
    case Reduction::None:
      return squared;
    case Reduction::Sum:
      return ag::sum(squared);
    case Reduction::Mean:
      break;
  }
  return ag::mean(squared);
}

}  // namespace nn
