// Indexing: index_select along any dim and embedding lookup (gather is in gather.cpp). The gradient is scattered back
// with +=, so an index that appears twice collects both gradients.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "autograd/graph.hpp"
#include "autograd/ops.hpp"
#include "buffer_pool.hpp"
#include "ops/checks.hpp"
#include "ops/indexing.hpp"
#include "ops/view_support.hpp"

namespace autograd {

namespace {

// dx[o, index[k], :] += dy[o, k, :] into dx (zeros of in_shape), the gradient of a gather.
Tensor scatter_add_values(const Tensor& dy, const Shape& in_shape, std::int64_t d, const Indices& index) {
  const std::int64_t size = in_shape[static_cast<std::size_t>(d)];
  const std::int64_t outer = product(in_shape, 0, static_cast<std::size_t>(d));
  const std::int64_t inner = product(in_shape, static_cast<std::size_t>(d) + 1, in_shape.size());
  const auto count = static_cast<std::int64_t>(index.size());
  Tensor dx = zeros(in_shape, dy.dtype());
  if (dy.numel() == 0) return dx;
  dispatch(dx.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* src = dy.data<T>();
    T* dst = dx.data<T>();
    // Parallel over `outer` only: within one o, repeated indices add into the same row.
    parallel_for(outer, dy.numel() > kParallelCopy, [&](std::int64_t o) {
      for (std::int64_t k = 0; k < count; ++k) {
        ArrayView<T> row(dst + (o * size + index[static_cast<std::size_t>(k)]) * inner, inner);
        row += ConstArrayView<T>(src + (o * count + k) * inner, inner);
      }
    });
  });
  return dx;
}

Tensor scatter_add_along(std::string_view op, const Tensor& dy, const Shape& in_shape, std::int64_t d,
                         const Indices& index);

// y = x[..., index[k], ...] along dim d, shaped out_shape (the caller's layout of
// [outer, index.size(), inner]); recorded as `op`.
Tensor gather_along(std::string_view op, const Tensor& x, std::int64_t d, Indices index,
                    const Shape& out_shape) {
  const Shape& in = x.shape();
  const std::int64_t size = in[static_cast<std::size_t>(d)];
  for (std::size_t k = 0; k < index.size(); ++k)
    if (index[k] < 0 || index[k] >= size)
      fail(op, "index {} (at position {}) is out of range for dim {} of size {} (shape {})", index[k], k, d, size,
           shape_str(in));
  const std::int64_t outer = product(in, 0, static_cast<std::size_t>(d));
  const std::int64_t inner = product(in, static_cast<std::size_t>(d) + 1, in.size());
  const auto count = static_cast<std::int64_t>(index.size());
  Tensor y = Tensor::empty(out_shape, x.dtype(), op);
  if (y.numel() > 0) {
    dispatch_all(x.dtype(), [&](auto zero) {
      using T = decltype(zero);
      const T* src = x.data<T>();
      T* dst = y.data<T>();
      parallel_for(outer * count, y.numel() > kParallelCopy, [&](std::int64_t ok) {
        const std::int64_t o = ok / count, k = ok % count;
        std::memcpy(dst + ok * inner, src + (o * size + index[static_cast<std::size_t>(k)]) * inner,
                    static_cast<std::size_t>(inner) * sizeof(T));
      });
    });
  }
  if (needs_grad(x)) {
    // y[o, k, :] = x[o, index[k], :]  =>  dx[o, index[k], :] += dy[o, k, :]
    return record(op, {x}, y,
                  [in_shape = in, index = std::move(index), d, op](const TensorList& g, const Node&) {
      return GradList{scatter_add_along(op, g[0], in_shape, d, index)};
    });
  }
  return y;
}

// dx = zeros(in_shape) with dy scatter-added at index along d: the gradient of gather_along,
// recorded as an op of its own (named `op`_backward, keeping a copy of the index) when a graph
// of the backward is built; its own gradient is the gather again.
Tensor scatter_add_along(std::string_view op, const Tensor& dy, const Shape& in_shape, std::int64_t d,
                         const Indices& index) {
  Tensor dx = scatter_add_values(dy, in_shape, d, index);
  if (!needs_grad(dy)) return dx;
  // dx[o, index[k], :] += dy[o, k, :]  =>  ddy[o, k, :] = ddx[o, index[k], :]
  return record(std::string(op) + "_backward", {dy}, dx,
                [index = index.copy(op), d, op, dy_shape = dy.shape()](const TensorList& g, const Node&) {
                  return GradList{gather_along(op, g[0], d, index.copy(op), dy_shape)};
                });
}

Tensor select_along(const Tensor& x, std::int64_t dim, Indices index) {
  check_defined("index_select", x);
  if (x.dim() == 0) fail("index_select", "cannot index a 0-d tensor");
  const std::int64_t d = normalize_dim("index_select", dim, x.dim());
  Shape out_shape = x.shape();
  out_shape[static_cast<std::size_t>(d)] = static_cast<std::int64_t>(index.size());
  return gather_along("index_select", x, d, std::move(index), out_shape);
}

}  // namespace

Tensor index_select(const Tensor& x, std::int64_t dim, const std::vector<std::int64_t>& index) {
  return select_along(x, dim, Indices("index_select", index));
}

Tensor index_select(const Tensor& x, std::int64_t dim, const Tensor& index) {
  if (index.defined() && index.dim() > 1)
    fail("index_select", "index must be 0-d or 1-D, got shape {}", shape_str(index.shape()));
  return select_along(x, dim, to_indices("index_select", index));
}

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  check_defined("embedding", weight, "the weight");
  check_floating("embedding", weight, "the weight");
  if (weight.dim() != 2) fail("embedding", "weight must be 2-D (V, D), got shape {}", shape_str(weight.shape()));
  Indices index = to_indices("embedding", indices);
  Shape out_shape = indices.shape();
  out_shape.push_back(weight.shape()[1]);
  return gather_along("embedding", weight, 0, std::move(index), out_shape);
}

}  // namespace autograd
