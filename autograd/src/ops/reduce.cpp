// Reductions: sum, mean, max, argmax — over all elements or along dims.
//
// A reduction over a set of dims runs on a compact view of the input: size-1 dims are dropped
// and neighbouring dims of the same kind (reduced / kept) are merged, so [B, T, C] summed over
// {0, 1} becomes [B·T reduced][C kept]. One recursive walk visits the input in storage order
// and accumulates into the output, so every pattern runs without temporaries and with a
// contiguous, vectorised innermost loop. Backward is the same walk in the other direction: the
// output gradient is broadcast back over the reduced groups.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <span>
#include <type_traits>
#include <vector>

#include "autograd/graph.hpp"
#include "autograd/ops.hpp"
#include "ops/tangent_rules.hpp"
#include "kernels/exact.hpp"
#include "ops/checks.hpp"

namespace autograd {
namespace {

// Which dims a reduction removes; up to 8 dims inline (no allocation).
using DimMask = SmallVector<bool, 8>;

void check_input(std::string_view op, const Tensor& x) { check_defined(op, x); }

// Which dims of x a reduction over `dims` removes. An empty list means every dim (as in
// PyTorch). On a 0-d tensor, dim 0 / -1 is accepted and reduces nothing.
DimMask reduced_mask(std::string_view op, const Tensor& x, std::span<const std::int64_t> dims) {
  const std::int64_t rank = x.dim();
  DimMask mask(static_cast<std::size_t>(rank), dims.empty());
  for (std::int64_t d : dims) {
    const std::int64_t nd = normalize_dim(op, d, rank);
    if (rank == 0) continue;
    if (mask[static_cast<std::size_t>(nd)])
      fail(op, "dim {} appears more than once in [{}]", nd, fmt::join(dims, ", "));
    mask[static_cast<std::size_t>(nd)] = true;
  }
  return mask;
}

Shape reduced_shape(const Shape& s, const DimMask& mask, bool keepdim) {
  Shape out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (!mask[i]) out.push_back(s[i]);
    else if (keepdim) out.push_back(1);
  }
  return out;
}

// out += in, n elements, through the float32 kernels of kernels/exact.hpp (the same bits: one addition
// an element); false (nothing done) for other types, the generic variant, and rows shorter than
// kKernelRow, where the call costs more than the additions (a linear layer's bias gradient sums
// hundreds of rows of 32 to 128).
constexpr std::int64_t kKernelRow = 512;
bool add_rows(const float* in, float* out, std::int64_t n) {
  return n >= kKernelRow && exact::binary(exact::Op::Add, out, 1, in, 1, out, n);
}
template <class T>
bool add_rows(const T*, T*, std::int64_t) {
  return false;
}

// The compact view of a reduction, and the two walks over it.
class ReduceWalk {
 public:
  ReduceWalk(const Shape& s, const DimMask& mask) {
    for (std::size_t i = 0; i < s.size(); ++i) {
      if (s[i] == 1) continue;
      if (!groups_.empty() && groups_.back().reduced == mask[i]) groups_.back().size *= s[i];
      else groups_.push_back({s[i], mask[i]});
    }
    if (groups_.empty()) groups_.push_back({1, false});  // one element: a copy
    const std::size_t n = groups_.size();
    in_stride_.assign(n, 1);
    out_stride_.assign(n, 1);
    for (std::size_t k = n - 1; k > 0; --k) {
      in_stride_[k - 1] = in_stride_[k] * groups_[k].size;
      out_stride_[k - 1] = out_stride_[k] * (groups_[k].reduced ? 1 : groups_[k].size);
    }
  }

  // out = scale · (sum of in over the reduced groups); out has the kept elements, in order.
  template <class T>
  void sum(const T* in, T* out, std::int64_t out_numel, T scale) const {
    if constexpr (std::is_same_v<T, std::int64_t>) {
      sum_int64(in, out, out_numel);
      return;
    }
    std::fill(out, out + out_numel, T(0));
    const Group& g = groups_[0];
    if (!g.reduced && groups_.size() > 1 && g.size * in_stride_[0] >= kParallelCopy) {
      // Outermost group kept: its slices write disjoint outputs.
      parallel_for(g.size, true, [&](std::int64_t i) { sum_at(in + i * in_stride_[0], out + i * out_stride_[0], 1); });
    } else {
      sum_at(in, out, 0);
    }
    if (scale != T(1)) ArrayView<T>(out, out_numel) *= scale;
  }

  // in_grad = scale · out_grad broadcast over the reduced groups.
  template <class T>
  void broadcast(const T* out_grad, T* in_grad, T scale) const {
    broadcast_at(out_grad, in_grad, scale, 0);
  }

 private:
  struct Group {
    std::int64_t size;
    bool reduced;
  };

  // An Int64 sum, exact: accumulated in 128 bits (no partial sum can overflow them), then each
  // result checked to fit in 64 bits. On one thread, since the check throws.
  void sum_int64(const std::int64_t* in, std::int64_t* out, std::int64_t out_numel) const {
    std::vector<__int128> acc(static_cast<std::size_t>(out_numel), 0);
    sum_at(in, acc.data(), 0);
    for (std::int64_t i = 0; i < out_numel; ++i) {
      const __int128 v = acc[static_cast<std::size_t>(i)];
      if (v > std::numeric_limits<std::int64_t>::max() || v < std::numeric_limits<std::int64_t>::min()) [[unlikely]]
        fail("sum", "the Int64 sum overflows: result element {} of {} is outside the 64-bit range [{}, {}]; "
             "convert with .to(Dtype::Float64) to sum approximately", i, out_numel,
             std::numeric_limits<std::int64_t>::min(), std::numeric_limits<std::int64_t>::max());
      out[i] = static_cast<std::int64_t>(v);
    }
  }

  // out (of type A: T, or 128-bit integers for Int64) += the sums of in below group k.
  template <class T, class A>
  void sum_at(const T* in, A* out, std::size_t k) const {
    const Group& g = groups_[k];
    if constexpr (std::is_same_v<T, A>) {
      if (g.reduced && k + 2 == groups_.size() && groups_[k + 1].size < kKernelRow) {
        sum_rows(in, out, g.size, groups_[k + 1].size);  // (rows, short kept row): a bias gradient
        return;
      }
    }
    if (k + 1 == groups_.size()) {
      if constexpr (!std::is_same_v<T, A>) {
        for (std::int64_t i = 0; i < g.size; ++i) out[g.reduced ? 0 : i] += in[i];
      } else if (g.reduced) {
        *out += ConstArrayView<T>(in, g.size).sum();
      } else if (!add_rows(in, out, g.size)) {
        for (std::int64_t i = 0; i < g.size; ++i) out[i] += in[i];  // (vectorised; no call for short rows)
      }
      return;
    }
    for (std::int64_t i = 0; i < g.size; ++i)
      sum_at(in + i * in_stride_[k], out + (g.reduced ? 0 : i * out_stride_[k]), k + 1);
  }

  // out[j] += Σ_r in[r·cols + j], r in row order (the bits of adding the rows one by one), a block
  // of columns at a time held in registers across all the rows: four 512-bit registers (eight
  // 256-bit ones) a block, four independent chains of additions that keep the adder busy where two
  // waited on their own latency, then two for the columns left, then one at a time.
  template <class T>
  static void sum_rows(const T* in, T* out, std::int64_t rows, std::int64_t cols) {
    std::int64_t j = sum_row_blocks<T, 256 / sizeof(T)>(in, out, rows, cols, 0);
    j = sum_row_blocks<T, 128 / sizeof(T)>(in, out, rows, cols, j);
    for (std::int64_t r = 0; j < cols && r < rows; ++r)
      for (std::int64_t c = j; c < cols; ++c) out[c] += in[r * cols + c];
  }

  // sum_rows on the blocks of kBlock columns from column j; returns the first column left.
  template <class T, std::int64_t kBlock>
  static std::int64_t sum_row_blocks(const T* in, T* out, std::int64_t rows, std::int64_t cols, std::int64_t j) {
    for (; j + kBlock <= cols; j += kBlock) {
      T acc[kBlock];
      for (std::int64_t b = 0; b < kBlock; ++b) acc[b] = out[j + b];
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t b = 0; b < kBlock; ++b) acc[b] += in[r * cols + j + b];
      for (std::int64_t b = 0; b < kBlock; ++b) out[j + b] = acc[b];
    }
    return j;
  }

  template <class T>
  void broadcast_at(const T* out_grad, T* in_grad, T scale, std::size_t k) const {
    const Group& g = groups_[k];
    if (k + 1 == groups_.size()) {
      if (g.reduced) ArrayView<T>(in_grad, g.size).setConstant(*out_grad * scale);
      else ArrayView<T>(in_grad, g.size) = ConstArrayView<T>(out_grad, g.size) * scale;
      return;
    }
    for (std::int64_t i = 0; i < g.size; ++i)
      broadcast_at(out_grad + (g.reduced ? 0 : i * out_stride_[k]), in_grad + i * in_stride_[k], scale, k + 1);
  }

  SmallVector<Group, 6> groups_;  // inline: the walk is copied into the backward rule
  SmallVector<std::int64_t, 6> in_stride_, out_stride_;
};

Tensor scaled_sum(std::string_view op, const Tensor& x, const DimMask& mask, bool keepdim, bool mean);

// The backward of sum and mean: dx = scale · dy broadcast back over the reduced dims (the walk in
// the other direction). Recorded as an op of its own when a graph of the backward is built
// (create_graph); its gradient is the same sum or mean of the incoming gradient.
Tensor broadcast_back(const Tensor& dy, const Shape& shape, const ReduceWalk& walk, const DimMask& mask, double scale,
                      bool mean) {
  Tensor dx = Tensor::empty(shape, dy.dtype());
  dispatch(dx.dtype(), [&](auto zero) {
    using T = decltype(zero);
    walk.broadcast(dy.data<T>(), dx.data<T>(), static_cast<T>(scale));
  });
  if (!needs_grad(dy)) return dx;
  const char* name = mean ? "mean_backward" : "sum_backward";
  return record(name, {dy}, dx, [name, mask, mean, dy_shape = dy.shape()](const TensorList& g, const Node&) {
    return GradList{reshape(scaled_sum(name, g[0], mask, /*keepdim=*/true, mean), dy_shape)};
  });
}

// sum (scale 1) and mean (scale 1/count) share everything but the scale.
Tensor scaled_sum(std::string_view op, const Tensor& x, const DimMask& mask, bool keepdim, bool mean) {
  std::int64_t count = 1;
  for (std::size_t i = 0; i < mask.size(); ++i)
    if (mask[i]) count *= x.shape()[i];
  const double scale = mean ? 1.0 / static_cast<double>(count) : 1.0;  // mean of nothing: NaN, as in PyTorch
  if (mean) check_floating(op, x);  // an Int64 sum stays Int64 (as PyTorch's); a mean has no integer result
  Tensor y = Tensor::empty(reduced_shape(x.shape(), mask, keepdim), x.dtype());
  ReduceWalk walk(x.shape(), mask);
  dispatch_all(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    if (mean && count == 0) {
      std::fill(y.data<T>(), y.data<T>() + y.numel(), std::numeric_limits<T>::quiet_NaN());
      return;
    }
    walk.sum(x.data<T>(), y.data<T>(), y.numel(), static_cast<T>(scale));
  });
  if (needs_grad(x)) {
    // y = s · Σ_reduced x  =>  dx = s · dy broadcast back over the reduced dims
    // Forward mode: ẏ = the same sum of ẋ.
    return record(op, {x}, y,
                  with_tangents([walk, scale, mask, mean](const TensorList& g, const Node& n) {
                    return GradList{broadcast_back(g[0], n.input_meta[0].shape, walk, mask, scale, mean)};
                  }, [op, mask, keepdim, mean](const TensorList& t, const Node&) {
                    return GradList{scaled_sum(op, t[0], mask, keepdim, mean)};
                  }));
  }
  return y;
}

// sum or mean over the listed dims (every dim when the list is empty); the list is read, not kept.
Tensor reduce_dims(std::string_view op, const Tensor& x, std::span<const std::int64_t> dims, bool keepdim,
                   bool mean) {
  check_input(op, x);
  return scaled_sum(op, x, reduced_mask(op, x, dims), keepdim, mean);
}

// NaN counts as larger than everything (max propagates NaN, as in PyTorch).
template <class T>
bool beats(T v, T best) {
  return v > best || (std::isnan(v) && !std::isnan(best));
}

// max along one dim of x seen as [outer, n, inner]: values and the index of the first maximum.
struct DimMax {
  Tensor values;
  std::shared_ptr<std::vector<std::int64_t>> index;
  std::int64_t outer, n, inner;
};

DimMax dim_max(std::string_view op, const Tensor& x, std::int64_t dim, bool keepdim) {
  check_input(op, x);
  const std::int64_t rank = x.dim();
  const std::int64_t d = normalize_dim(op, dim, rank);
  DimMax r;
  r.outer = 1;
  r.inner = 1;
  r.n = rank == 0 ? 1 : x.shape()[d];
  for (std::int64_t i = 0; i < d && i < rank; ++i) r.outer *= x.shape()[i];
  for (std::int64_t i = d + 1; i < rank; ++i) r.inner *= x.shape()[i];
  if (r.n == 0) fail(op, "cannot reduce dim {} of size 0 (shape {})", d, shape_str(x.shape()));
  DimMask mask(static_cast<std::size_t>(rank), false);
  if (rank > 0) mask[static_cast<std::size_t>(d)] = true;
  r.values = Tensor::empty(reduced_shape(x.shape(), mask, keepdim), x.dtype());
  r.index = std::make_shared<std::vector<std::int64_t>>(static_cast<std::size_t>(r.outer * r.inner), 0);
  dispatch_all(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* in = x.data<T>();
    T* best = r.values.data<T>();
    std::int64_t* idx = r.index->data();
    for (std::int64_t o = 0; o < r.outer; ++o) {
      const T* slab = in + o * r.n * r.inner;
      T* bo = best + o * r.inner;
      std::int64_t* io = idx + o * r.inner;
      std::copy(slab, slab + r.inner, bo);  // row 0; io is already 0
      for (std::int64_t k = 1; k < r.n; ++k) {
        const T* row = slab + k * r.inner;
        for (std::int64_t i = 0; i < r.inner; ++i)
          if (beats(row[i], bo[i])) {
            bo[i] = row[i];
            io[i] = k;
          }
      }
    }
  });
  return r;
}

// The backward of max along a dim: dy written at the first maximum of each slice, zeros elsewhere
// (x seen as [outer, n, inner]). Recorded as an op of its own when a graph of the backward is
// built; its gradient picks those positions back out (max_pick), whose gradient is this again.
using MaxIndex = std::shared_ptr<const std::vector<std::int64_t>>;
Tensor max_pick(const Tensor& ddx, const MaxIndex& index, std::int64_t outer, std::int64_t n, std::int64_t inner,
                const Shape& dy_shape);

Tensor max_scatter(const Tensor& dy, const MaxIndex& index, std::int64_t outer, std::int64_t n, std::int64_t inner,
                   const Shape& shape) {
  Tensor dx = zeros(shape, dy.dtype());
  dispatch(dx.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* g = dy.data<T>();
    T* d = dx.data<T>();
    const std::int64_t* idx = index->data();
    for (std::int64_t o = 0; o < outer; ++o)
      for (std::int64_t i = 0; i < inner; ++i) d[(o * n + idx[o * inner + i]) * inner + i] = g[o * inner + i];
  });
  if (!needs_grad(dy)) return dx;
  return record("max_backward", {dy}, dx, [=, dy_shape = dy.shape()](const TensorList& g, const Node&) {
    return GradList{max_pick(g[0], index, outer, n, inner, dy_shape)};
  });
}

Tensor max_pick(const Tensor& ddx, const MaxIndex& index, std::int64_t outer, std::int64_t n, std::int64_t inner,
                const Shape& dy_shape) {
  Tensor ddy = Tensor::empty(dy_shape, ddx.dtype());
  dispatch(ddx.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* d = ddx.data<T>();
    T* g = ddy.data<T>();
    const std::int64_t* idx = index->data();
    for (std::int64_t o = 0; o < outer; ++o)
      for (std::int64_t i = 0; i < inner; ++i) g[o * inner + i] = d[(o * n + idx[o * inner + i]) * inner + i];
  });
  if (!needs_grad(ddx)) return ddy;
  return record("max_pick", {ddx}, ddy, [=, shape = ddx.shape()](const TensorList& g, const Node&) {
    return GradList{max_scatter(g[0], index, outer, n, inner, shape)};
  });
}

}  // namespace

Tensor sum(const Tensor& x) {
  check_input("sum", x);
  return scaled_sum("sum", x, DimMask(static_cast<std::size_t>(x.dim()), true), false, false);
}

Tensor sum(const Tensor& x, const std::vector<std::int64_t>& dims, bool keepdim) {
  return reduce_dims("sum", x, dims, keepdim, false);
}

Tensor sum(const Tensor& x, std::int64_t dim, bool keepdim) {
  return reduce_dims("sum", x, std::span<const std::int64_t>(&dim, 1), keepdim, false);
}

Tensor mean(const Tensor& x) {
  check_input("mean", x);
  return scaled_sum("mean", x, DimMask(static_cast<std::size_t>(x.dim()), true), false, true);
}

Tensor mean(const Tensor& x, const std::vector<std::int64_t>& dims, bool keepdim) {
  return reduce_dims("mean", x, dims, keepdim, true);
}

Tensor mean(const Tensor& x, std::int64_t dim, bool keepdim) {
  return reduce_dims("mean", x, std::span<const std::int64_t>(&dim, 1), keepdim, true);
}

Tensor sum_to(const Tensor& grad, const Shape& shape) {
  if (grad.shape() == shape) return grad;
  const auto lead = static_cast<std::int64_t>(grad.dim()) - static_cast<std::int64_t>(shape.size());
  if (lead < 0) fail("sum_to", "cannot reduce {} to the larger rank of {}", shape_str(grad.shape()), shape_str(shape));
  // Sum the leading dims, and the dims where `shape` has 1 and grad does not; every other dim of
  // `shape` must be grad's (shape broadcasts to grad's shape).
  DimMask mask(static_cast<std::size_t>(grad.dim()), false);
  bool any = false;
  for (std::size_t i = 0; i < mask.size(); ++i) {
    const auto k = static_cast<std::int64_t>(i);
    const std::int64_t want = k < lead ? 1 : shape[i - static_cast<std::size_t>(lead)];
    if (k >= lead && want != 1 && want != grad.shape()[i])
      fail("sum_to", "cannot reduce {} to {}: target dim {} has size {}, which is neither 1 nor {}",
           shape_str(grad.shape()), shape_str(shape), k - lead, want, grad.shape()[i]);
    mask[i] = k < lead || (want == 1 && grad.shape()[i] != 1);
    any = any || mask[i];
  }
  const Tensor reduced = any ? scaled_sum("sum", grad, mask, /*keepdim=*/true, /*mean=*/false) : grad;
  return reshape(reduced, shape);
}

Tensor max(const Tensor& x) {
  check_input("max", x);
  if (x.numel() == 0) fail("max", "cannot take the max of an empty tensor of shape {}", shape_str(x.shape()));
  Tensor y = Tensor::empty({}, x.dtype());
  if (x.dtype() == Dtype::Int64) {  // no NaN to propagate, no gradient
    const std::int64_t* xs = x.data<std::int64_t>();
    *y.data<std::int64_t>() = *std::max_element(xs, xs + x.numel());
    return y;
  }
  double m = 0;
  dispatch(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    ConstArrayView<T> xs(x.data<T>(), x.numel());
    const T best = xs.template maxCoeff<Eigen::PropagateNaN>();
    *y.data<T>() = best;
    m = static_cast<double>(best);
  });
  if (needs_grad(x)) {
    // y = max_i x_i  =>  dx_i = dy / k where x_i ties for the maximum (k of them), else 0
    return record("max", {x}, y, [saved_x = SavedTensor(x), m](const TensorList& g, const Node&) {
      // dy · [x_i ties for the maximum] / k, the indicator a constant (piecewise linear: no
      // second derivative)
      Tensor xv = saved_x.get("max");
      Tensor ties = Tensor::empty(xv.shape(), xv.dtype());
      double k = 0;
      dispatch(xv.dtype(), [&](auto zero) {
        using T = decltype(zero);
        const T top = static_cast<T>(m);
        ConstArrayView<T> xs(xv.data<T>(), xv.numel());
        ArrayView<T> d(ties.data<T>(), ties.numel());
        if (std::isnan(top)) d = xs.isNaN().template cast<T>();
        else d = (xs == top).template cast<T>();
        k = static_cast<double>(d.sum());
      });
      return GradList{div(mul(g[0], ties), k)};
    });
  }
  return y;
}

Tensor max(const Tensor& x, std::int64_t dim, bool keepdim) {
  DimMax r = dim_max("max", x, dim, keepdim);
  if (needs_grad(x)) {
    // y = x[argmax]  =>  dx = dy at the first maximum of each slice, 0 elsewhere
    return record("max", {x}, r.values,
                  [index = r.index, outer = r.outer, n = r.n, inner = r.inner, shape = x.shape()](
                      const TensorList& g, const Node&) {
                    return GradList{max_scatter(g[0], index, outer, n, inner, shape)};
                  });
  }
  return r.values;
}

Tensor argmax(const Tensor& x, std::int64_t dim, bool keepdim) {
  DimMax r = dim_max("argmax", x, dim, keepdim);
  Tensor out = Tensor::empty(r.values.shape(), Dtype::Int64);
  std::copy(r.index->begin(), r.index->end(), out.data<std::int64_t>());
  return out;
}

}  // namespace autograd
