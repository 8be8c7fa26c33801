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
//
// The backward of each is a recorded op of its own (softmax_backward, log_softmax_backward): the
// kernel below, and, when a graph of the backward is built (create_graph), a node whose rule, the
// derivative of the backward, is written once from differentiable ops.
#include <cmath>
#include <limits>

#include "autograd/graph.hpp"
#include "autograd/ops.hpp"
#include "kernels/approx.hpp"
#include "ops/checks.hpp"
#include "ops/tangent_rules.hpp"
#include "ops/softmax.hpp"

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
void softmax_backward_rows(const Layout& l, const T* y, const T* dy, T* dx) {
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
void log_softmax_backward_rows(const Layout& l, const T* y, const T* dy, T* dx) {
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

// dx of softmax (log = false) or log_softmax (log = true) at the output y, through the kernels
// above; a recorded op of its own, so that the backward is differentiable in turn. d is the dim.
Tensor backward_op(const Layout& l, std::int64_t d, const Tensor& dy, const Tensor& y, bool log) {
  Tensor dx = Tensor::empty(y.shape(), y.dtype());
  if (y.numel() > 0) {
    dispatch(y.dtype(), [&](auto zero) {
      using T = decltype(zero);
      if (log) log_softmax_backward_rows<T>(l, y.data<T>(), dy.data<T>(), dx.data<T>());
      else softmax_backward_rows<T>(l, y.data<T>(), dy.data<T>(), dx.data<T>());
    });
  }
  if (!needs_grad(dy, y)) return dx;
  const char* name = log ? "log_softmax_backward" : "softmax_backward";
  return record(name, {dy, y}, dx,
                [l, d, log, name, saved_dy = SavedTensor(dy), saved_y = SavedTensor(y)](const TensorList& g,
                                                                                        const Node& n) {
    const Tensor yv = saved_y.get(name);
    const Tensor& gg = g[0];
    auto row_sum = [&](const Tensor& t) { return yv.dim() == 0 ? t : sum(t, d, /*keepdim=*/true); };
    if (!log) {
      // dx = y ⊙ (dy − Σ dy ⊙ y) = J dy with J = diag(y) − y yᵀ symmetric, so
      //   d/d(dy) = the same op on gg,   d/dy = gg ⊙ (dy − Σ dy ⊙ y) − dy ⊙ Σ gg ⊙ y
      return GradList{grad_if(n, 0, [&] { return backward_op(l, d, gg, yv, false); }), grad_if(n, 1, [&] {
                        const Tensor dyv = saved_dy.get(name);
                        return sub(mul(gg, sub(dyv, row_sum(mul(dyv, yv)))), mul(dyv, row_sum(mul(gg, yv))));
                      })};
    }
    // dx = dy − e^y · Σ dy on the live rows, 0 on the fully masked ones: with gg zeroed on the
    // masked rows (ĝ),
    //   d/d(dy) = ĝ − Σ ĝ ⊙ e^y   (the transpose of dy ↦ dy − e^y · Σ dy),   d/dy = −ĝ ⊙ e^y · Σ dy
    // (ĝ is 0 on a masked row, so both are 0 there)
    const Tensor keep = yv.numel() > 0 ? live_rows(l, yv, d) : Tensor();
    const Tensor live_gg = keep.defined() ? mul(gg, keep) : gg;
    const Tensor p = exp(yv);
    return GradList{grad_if(n, 0, [&] { return sub(live_gg, row_sum(mul(live_gg, p))); }),
                    grad_if(n, 1, [&] { return neg(mul(mul(live_gg, p), row_sum(saved_dy.get(name)))); })};
  });
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
  // Forward mode: softmax's Jacobian diag(y) − y·yᵀ is symmetric, so ẏ is its backward applied to
  // ẋ; log_softmax's, I − 1·softmaxᵀ, is not: ẏ = ẋ − Σ_d softmax ⊙ ẋ.
  return record(std::string(op), {x}, y, with_tangents(SavedTensor(y),
      [l, log, d](const SavedTensor& saved_y, const TensorList& g, const Node&) {
        return GradList{backward_op(l, d, g[0], saved_y.get(log ? "log_softmax" : "softmax"), log)};
      },
      [l, log, d](const SavedTensor& saved_y, const TensorList& t, const Node&) {
        const Tensor yv = saved_y.get(log ? "log_softmax" : "softmax");
        if (!log) return GradList{backward_op(l, d, t[0], yv, false)};
        return GradList{sub(t[0], sum(mul(exp(yv), t[0]), d, true))};
      }));
}

}  // namespace

Tensor softmax(const Tensor& x, std::int64_t dim) { return softmax_impl("softmax", x, dim, false); }

Tensor log_softmax(const Tensor& x, std::int64_t dim) { return softmax_impl("log_softmax", x, dim, true); }

Tensor softmax_backward(const Tensor& dy, const Tensor& y, std::int64_t dim) {
  const Layout l = layout_of("softmax_backward", y, dim);
  if (dy.shape() != y.shape() || dy.dtype() != y.dtype())
    fail("softmax_backward", "dy {} {} does not match y {} {}", shape_str(dy.shape()), dtype_name(dy.dtype()),
         shape_str(y.shape()), dtype_name(y.dtype()));
  return backward_op(l, normalize_dim("softmax_backward", dim, y.dim()), dy, y, false);
}

}  // namespace autograd
