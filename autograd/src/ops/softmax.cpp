// softmax and log_softmax along a dim, numerically stable: the row maximum m is subtracted
// before exponentiating, so exp never overflows (softmax(x) = exp(x - m) / Σ exp(x - m)).
//
// The input is seen as [outer, n, inner] with n the softmax dim. When dim is the last one
// (inner = 1, the common case) each row is contiguous and is one vectorised pass; otherwise the
// n rows of each [n, inner] slab are combined elementwise, still walking storage in order. The
// exponentials of float32 rows (dim last) run an instruction-set kernel (kernels/approx.hpp).
//
// A row whose entries are all -inf (an attention row with every key masked) has no
// distribution. We define:
//   softmax     = all zeros, gradient zero   (not NaN: a fully masked query attends to nothing)
//   log_softmax = all -inf,  gradient zero   (log of those zeros; -inf + ε is still -inf, so
//                                             the output cannot move)
// PyTorch returns NaN for both. NaN inputs propagate to their whole row, as in PyTorch.
#include <cmath>
#include <limits>

#include "autograd/grad_mode.hpp"
#include "autograd/graph.hpp"
#include "autograd/ops.hpp"
#include "kernels/approx.hpp"
#include "ops/checks.hpp"

namespace autograd {
namespace {

struct Layout {
  std::int64_t outer = 1, n = 1, inner = 1;
};

Layout layout_of(std::string_view op, const Tensor& x, std::int64_t dim) {
  check_defined(op, x);
  check_floating(op, x);
  const std::int64_t rank = x.dim();
  const std::int64_t d = normalize_dim(op, dim, rank);
  Layout l;
  if (rank == 0) return l;
  for (std::int64_t i = 0; i < d; ++i) l.outer *= x.shape()[i];
  l.n = x.shape()[d];
  for (std::int64_t i = d + 1; i < rank; ++i) l.inner *= x.shape()[i];
  return l;
}

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// y = exp(x − m), 0 where x = −inf, and sum = Σ y, through the instruction-set kernel of float32
// rows (kernels/approx.hpp); false (nothing done) for float64 or the generic variant.
bool exp_shifted_row(const float* x, float* y, std::int64_t n, float m, float& sum) {
  return approx::exp_shifted(x, y, n, m, sum);
}
bool exp_shifted_row(const double*, double*, std::int64_t, double, double&) { return false; }

// y = softmax(x) (log = false) or log_softmax(x) (log = true) along the middle dim of `l`.
template <class T>
void forward(const Layout& l, const T* x, T* y, bool log) {
  const T neg_inf = static_cast<T>(kNegInf);
  const std::int64_t slab = l.n * l.inner;
  if (l.inner == 1) {
    parallel_for(l.outer, l.outer * l.n >= kParallelElementwise, [&](std::int64_t o) {
      ConstArrayView<T> xr(x + o * l.n, l.n);
      ArrayView<T> yr(y + o * l.n, l.n);
      const T m = xr.template maxCoeff<Eigen::PropagateNaN>();
      if (m == neg_inf) {  // fully masked row
        yr.setConstant(log ? neg_inf : T(0));
      } else if (log) {
        // (x - m) - log Σ: subtracting m first keeps float32 exact near large inputs
        const T log_sum = std::log((xr - m).exp().sum());
        yr = (xr - m) - log_sum;
      } else {
        // float32 rows through the instruction-set kernel when there is one (kernels/approx.hpp)
        T sum{};
        if (!exp_shifted_row(x + o * l.n, y + o * l.n, l.n, m, sum)) {
          // Eigen's vectorised exp clamps its argument, so exp(-inf) would give ~1e-308, not 0
          yr = (xr == neg_inf).select(T(0), (xr - m).exp());
          sum = yr.sum();
        }
        yr *= T(1) / sum;
      }
    });
    return;
  }
  parallel_for(l.outer, l.outer * slab >= kParallelElementwise, [&](std::int64_t o) {
    const T* xs = x + o * slab;
    T* ys = y + o * slab;
    auto row = [&](const T* base, std::int64_t k) { return ConstArrayView<T>(base + k * l.inner, l.inner); };
    Array1<T> m = row(xs, 0);
    // a NaN the max skips still reaches the whole column through the sum s
    for (std::int64_t k = 1; k < l.n; ++k) m = m.max(row(xs, k));
    m = (m == neg_inf).select(T(0), m);  // fully masked columns: exp(-inf - 0) = 0 below
    Array1<T> s = Array1<T>::Zero(l.inner);
    for (std::int64_t k = 0; k < l.n; ++k) {
      ArrayView<T> yk(ys + k * l.inner, l.inner);
      yk = (row(xs, k) == neg_inf).select(T(0), (row(xs, k) - m).exp());  // exp(-inf) = 0 exactly
      s += yk;
    }
    if (log) {
      // s == 0 only in a fully masked column: keep its -inf
      const Array1<T> log_sum = (s == T(0)).select(T(0), s.log());
      for (std::int64_t k = 0; k < l.n; ++k) ArrayView<T>(ys + k * l.inner, l.inner) = (row(xs, k) - m) - log_sum;
    } else {
      const Array1<T> inv = (s == T(0)).select(T(0), s.inverse());
      for (std::int64_t k = 0; k < l.n; ++k) ArrayView<T>(ys + k * l.inner, l.inner) *= inv;
    }
  });
}

// y = softmax(x)  =>  dx = y ⊙ (dy − Σ_row dy ⊙ y)   (zero on fully masked rows, where y = 0)
template <class T>
void softmax_backward(const Layout& l, const T* y, const T* dy, T* dx) {
  const std::int64_t slab = l.n * l.inner;
  if (l.inner == 1) {
    parallel_for(l.outer, l.outer * l.n >= kParallelElementwise, [&](std::int64_t o) {
      ConstArrayView<T> yr(y + o * l.n, l.n), gr(dy + o * l.n, l.n);
      const T dot = (yr * gr).sum();
      ArrayView<T>(dx + o * l.n, l.n) = yr * (gr - dot);
    });
    return;
  }
  parallel_for(l.outer, l.outer * slab >= kParallelElementwise, [&](std::int64_t o) {
    const std::int64_t base = o * slab;
    Array1<T> dot = Array1<T>::Zero(l.inner);
    for (std::int64_t k = 0; k < l.n; ++k) {
      const std::int64_t at = base + k * l.inner;
      dot += ConstArrayView<T>(y + at, l.inner) * ConstArrayView<T>(dy + at, l.inner);
    }
    for (std::int64_t k = 0; k < l.n; ++k) {
      const std::int64_t at = base + k * l.inner;
      ArrayView<T>(dx + at, l.inner) = ConstArrayView<T>(y + at, l.inner) * (ConstArrayView<T>(dy + at, l.inner) - dot);
    }
  });
}

// y = log_softmax(x)  =>  dx = dy − exp(y) · Σ_row dy   (zero on fully masked rows, y = -inf)
template <class T>
void log_softmax_backward(const Layout& l, const T* y, const T* dy, T* dx) {
  const T neg_inf = static_cast<T>(kNegInf);
  const std::int64_t slab = l.n * l.inner;
  if (l.inner == 1) {
    parallel_for(l.outer, l.outer * l.n >= kParallelElementwise, [&](std::int64_t o) {
      ConstArrayView<T> yr(y + o * l.n, l.n), gr(dy + o * l.n, l.n);
      ArrayView<T> dr(dx + o * l.n, l.n);
      // A normal row's maximum has y = -log Σ exp(x - m) > -inf; only a masked row is all -inf.
      if (yr(0) == neg_inf && yr.maxCoeff() == neg_inf) dr.setZero();
      else dr = gr - yr.exp() * gr.sum();
    });
    return;
  }
  parallel_for(l.outer, l.outer * slab >= kParallelElementwise, [&](std::int64_t o) {
    const std::int64_t base = o * slab;
    Array1<T> s = Array1<T>::Zero(l.inner);
    Array1<T> top = Array1<T>::Constant(l.inner, neg_inf);
    for (std::int64_t k = 0; k < l.n; ++k) {
      const std::int64_t at = base + k * l.inner;
      s += ConstArrayView<T>(dy + at, l.inner);
      top = top.max(ConstArrayView<T>(y + at, l.inner));
    }
    s = (top == neg_inf).select(T(0), s);
    for (std::int64_t k = 0; k < l.n; ++k) {
      const std::int64_t at = base + k * l.inner;
      ArrayView<T>(dx + at, l.inner) = (top == neg_inf)
                                        .select(T(0), ConstArrayView<T>(dy + at, l.inner) -
                                                          ConstArrayView<T>(y + at, l.inner).exp() * s);
    }
  });
}

// 1 where the row along the softmax dim holds a finite entry, 0 where it is -inf throughout (a
// fully masked row of log_softmax), shaped like y with that dim kept as 1; undefined when every
// row holds one.
Tensor live_rows(const Layout& l, const Tensor& y, std::int64_t d) {
  Shape shape = y.shape();
  if (!shape.empty()) shape[static_cast<std::size_t>(d)] = 1;
  Tensor keep = Tensor::empty(shape, y.dtype());
  bool any_masked = false;
  dispatch(y.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T neg_inf = static_cast<T>(kNegInf);
    const T* ys = y.data<T>();
    T* out = keep.data<T>();
    for (std::int64_t o = 0; o < l.outer; ++o)
      for (std::int64_t i = 0; i < l.inner; ++i) {
        bool masked = true;
        for (std::int64_t k = 0; k < l.n && masked; ++k) masked = ys[(o * l.n + k) * l.inner + i] == neg_inf;
        out[o * l.inner + i] = masked ? T(0) : T(1);
        any_masked = any_masked || masked;
      }
  });
  return any_masked ? keep : Tensor();
}

// The backward composed of differentiable ops, for a backward that builds a graph; y is the
// connected output. softmax: dx = y ⊙ (g − Σ g ⊙ y); log_softmax: dx = g − exp(y) · Σ g, zero on
// fully masked rows (as the kernels define it).
Tensor composed_backward(const Layout& l, const Tensor& y, const Tensor& g, std::int64_t d, bool log) {
  auto row_sum = [&](const Tensor& t) { return y.dim() == 0 ? t : sum(t, d, /*keepdim=*/true); };
  if (!log) return mul(y, sub(g, row_sum(mul(g, y))));
  const Tensor dx = sub(g, mul(exp(y), row_sum(g)));
  const Tensor keep = y.numel() > 0 ? live_rows(l, y, d) : Tensor();
  return keep.defined() ? mul(dx, keep) : dx;
}

Tensor softmax_impl(std::string_view op, const Tensor& x, std::int64_t dim, bool log) {
  const Layout l = layout_of(op, x, dim);
  Tensor y = Tensor::empty(x.shape(), x.dtype());
  if (x.numel() > 0) {
    dispatch(x.dtype(), [&](auto zero) {
      using T = decltype(zero);
      forward<T>(l, x.data<T>(), y.data<T>(), log);
    });
  }
  if (!needs_grad(x)) return y;
  const std::int64_t d = normalize_dim(op, dim, x.dim());
  return record(std::string(op), {x}, y, [l, log, d, saved_y = SavedTensor(y)](const TensorList& g, const Node&) {
    const Tensor yv = saved_y.get(log ? "log_softmax" : "softmax");
    if (is_grad_enabled()) return GradList{composed_backward(l, yv, g[0], d, log)};
    Tensor dx = Tensor::empty(yv.shape(), yv.dtype());
    if (yv.numel() == 0) return GradList{dx};
    dispatch(yv.dtype(), [&](auto zero) {
      using T = decltype(zero);
      if (log) log_softmax_backward<T>(l, yv.data<T>(), g[0].data<T>(), dx.data<T>());
      else softmax_backward<T>(l, yv.data<T>(), g[0].data<T>(), dx.data<T>());
    });
    return GradList{dx};
  });
}

}  // namespace

Tensor softmax(const Tensor& x, std::int64_t dim) { return softmax_impl("softmax", x, dim, false); }

Tensor log_softmax(const Tensor& x, std::int64_t dim) { return softmax_impl("log_softmax", x, dim, true); }

}  // namespace autograd
