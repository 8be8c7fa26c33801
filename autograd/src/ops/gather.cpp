// gather(x, dim, index): out[i][j][k] = x[index[i][j][k]][j][k] for dim 0 (and likewise for the
// other dims), PyTorch's torch.gather. index has x's rank and, in every dim but `dim`, a size no
// larger than x's; the result has index's shape. The gradient is scattered back with +=, so an
// element picked twice collects both gradients.
//
// Each output element reads one element of x, at a flat offset computed once from index; the
// backward adds into the same offsets, and its own backward reads them again.
#include <cstdint>
#include <string>
#include <utility>

#include "autograd/graph.hpp"
#include "autograd/ops.hpp"
#include "ops/checks.hpp"
#include "ops/indexing.hpp"

namespace autograd {
namespace {

constexpr const char* kOp = "gather";

// The flat offset into x of the element each index entry picks (row-major, x's strides).
Indices source_offsets(const Tensor& x, std::int64_t dim, const Tensor& index) {
  Indices picked = to_indices(kOp, index);
  const Shape& xs = x.shape();
  const Shape& is = index.shape();
  const auto rank = static_cast<std::size_t>(x.dim());
  std::vector<std::int64_t> stride(rank, 1), counter(rank, 0);
  for (std::size_t d = rank - 1; d > 0; --d) stride[d - 1] = stride[d] * xs[d];
  const auto gd = static_cast<std::size_t>(dim);
  const std::int64_t size = xs[gd];
  for (std::size_t j = 0; j < picked.size(); ++j) {
    const std::int64_t v = picked[j];
    if (v < 0 || v >= size)
      fail(kOp, "index {} (at position {} of index {}) is out of range for dim {} of size {} (input shape {})", v, j,
           shape_str(is), dim, size, shape_str(xs));
    std::int64_t off = v * stride[gd];
    for (std::size_t d = 0; d < rank; ++d)
      if (d != gd) off += counter[d] * stride[d];
    picked[j] = off;
    for (std::size_t d = rank; d-- > 0;) {  // next multi-index of index, row-major
      if (++counter[d] < is[d]) break;
      counter[d] = 0;
    }
  }
  return picked;
}

Tensor put_along(const Tensor& g, const Shape& x_shape, Indices offsets);

// y[j] = src[offsets[j]], shaped out_shape; differentiable in src.
Tensor take_along(const Tensor& src, Indices offsets, const Shape& out_shape) {
  Tensor y = Tensor::empty(out_shape, src.dtype(), kOp);
  dispatch_all(src.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* s = src.data<T>();
    T* d = y.data<T>();
    parallel_for(y.numel(), y.numel() > kParallelCopy,
                 [&](std::int64_t j) { d[j] = s[offsets[static_cast<std::size_t>(j)]]; });
  });
  if (!needs_grad(src)) return y;
  // y[j] = x[off[j]]  =>  dx[off[j]] += dy[j]
  return record(kOp, {src}, y, [x_shape = src.shape(), offsets = std::move(offsets)](const TensorList& g, const Node&) {
    return GradList{put_along(g[0], x_shape, offsets.copy(kOp))};
  });
}

// dx = zeros(x_shape) with dx[offsets[j]] += g[j]: the gradient of take_along, itself
// differentiable (its gradient is take_along again).
Tensor put_along(const Tensor& g, const Shape& x_shape, Indices offsets) {
  Tensor dx = zeros(x_shape, g.dtype());
  dispatch(g.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* s = g.data<T>();
    T* d = dx.data<T>();
    for (std::size_t j = 0; j < offsets.size(); ++j) d[offsets[j]] += s[j];  // in order: repeats add up
  });
  if (!needs_grad(g)) return dx;
  // dx[off[j]] += dy[j]  =>  ddy[j] = ddx[off[j]]
  return record(std::string(kOp) + "_backward", {g}, dx,
                [offsets = std::move(offsets), g_shape = g.shape()](const TensorList& gg, const Node&) {
                  return GradList{take_along(gg[0], offsets.copy(kOp), g_shape)};
                });
}

}  // namespace

Tensor gather(const Tensor& x, std::int64_t dim, const Tensor& index) {
  check_defined(kOp, x);
  check_defined(kOp, index, "the index");
  if (x.dim() == 0) fail(kOp, "cannot gather from a 0-d tensor");
  const std::int64_t d = normalize_dim(kOp, dim, x.dim());
  if (index.dim() != x.dim())
    fail(kOp, "index must have the input's number of dims: index {} for input {}", shape_str(index.shape()),
         shape_str(x.shape()));
  for (std::int64_t k = 0; k < x.dim(); ++k) {
    const auto ks = static_cast<std::size_t>(k);
    if (k != d && index.shape()[ks] > x.shape()[ks])
      fail(kOp, "index {} is larger than input {} in dim {} (only dim {} may be larger)", shape_str(index.shape()),
           shape_str(x.shape()), k, d);
  }
  return take_along(x, source_offsets(x, d, index), index.shape());
}

}  // namespace autograd
