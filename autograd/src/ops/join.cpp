// Shape ops that take part of a tensor or join several: narrow, slice, cat, stack, split and
// chunk. Each copies into a fresh contiguous tensor; the backward of a slice writes the gradient
// into zeros at the sliced positions, the backward of a join slices the gradient back.
#include <algorithm>
#include <cstring>
#include <limits>

#include "autograd/graph.hpp"
#include "autograd/ops.hpp"
#include "ops/tangent_rules.hpp"
#include "ops/checks.hpp"
#include "ops/view_support.hpp"

namespace autograd {

namespace {

// ---- slicing along one dim ----
//
// x seen as [outer, size, inner]; the slice takes positions start, start + step, ... (count of them).

Tensor slice_copy(const Tensor& x, std::int64_t dim, std::int64_t start, std::int64_t count, std::int64_t step) {
  const Shape& in = x.shape();
  Shape out_shape = in;
  out_shape[static_cast<std::size_t>(dim)] = count;
  Tensor y = Tensor::empty(out_shape, x.dtype());
  const std::int64_t outer = product(in, 0, static_cast<std::size_t>(dim));
  const std::int64_t size = in[static_cast<std::size_t>(dim)];
  const std::int64_t inner = product(in, static_cast<std::size_t>(dim) + 1, in.size());
  if (y.numel() == 0) return y;
  dispatch_all(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* src = x.data<T>();
    T* dst = y.data<T>();
    parallel_for(outer, y.numel() > kParallelCopy, [&](std::int64_t o) {
      const T* s = src + (o * size + start) * inner;
      T* d = dst + o * count * inner;
      if (step == 1) {
        std::memcpy(d, s, static_cast<std::size_t>(count * inner) * sizeof(T));
      } else if (inner == 1) {
        for (std::int64_t k = 0; k < count; ++k) d[k] = s[k * step];
      } else {
        for (std::int64_t k = 0; k < count; ++k)
          std::memcpy(d + k * inner, s + k * step * inner, static_cast<std::size_t>(inner) * sizeof(T));
      }
    });
  });
  return y;
}

// The adjoint of slice_copy: zeros of in_shape with g written at the sliced positions.
Tensor slice_scatter_copy(const Tensor& g, const Shape& in_shape, std::int64_t dim, std::int64_t start,
                     std::int64_t step) {
  Tensor dx = zeros(in_shape, g.dtype());
  const std::int64_t count = g.shape()[static_cast<std::size_t>(dim)];
  const std::int64_t outer = product(in_shape, 0, static_cast<std::size_t>(dim));
  const std::int64_t size = in_shape[static_cast<std::size_t>(dim)];
  const std::int64_t inner = product(in_shape, static_cast<std::size_t>(dim) + 1, in_shape.size());
  if (g.numel() == 0) return dx;
  dispatch(g.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* src = g.data<T>();
    T* dst = dx.data<T>();
    parallel_for(outer, g.numel() > kParallelCopy, [&](std::int64_t o) {
      const T* s = src + o * count * inner;
      T* d = dst + (o * size + start) * inner;
      for (std::int64_t k = 0; k < count; ++k)
        std::memcpy(d + k * step * inner, s + k * inner, static_cast<std::size_t>(inner) * sizeof(T));
    });
  });
  return dx;
}

// The backward of a slice: slice_scatter_copy, recorded as an op of its own (its gradient is the
// slice again) when a graph of the backward is built (create_graph).
Tensor slice_scatter(const Tensor& g, const Shape& in_shape, std::int64_t dim, std::int64_t start,
                     std::int64_t step) {
  Tensor dx = slice_scatter_copy(g, in_shape, dim, start, step);
  if (!needs_grad(g)) return dx;
  // dx = zeros with g written at x[..., start : : step, ...]  =>  dg = ddx at those positions
  const std::int64_t count = g.shape()[static_cast<std::size_t>(dim)];
  const std::int64_t end = count > 0 ? start + (count - 1) * step + 1 : start;
  return record("slice_scatter", {g}, dx, [dim, start, end, step](const TensorList& gg, const Node&) {
    return GradList{slice(gg[0], dim, start, end, step)};
  });
}

// Copies xs (same rank, equal except along dim) side by side along dim into a tensor of out_shape.
// `op` names the caller in the error for an out_shape that does not fit in 64 bits.
Tensor cat_copy(std::string_view op, const TensorList& xs, std::int64_t dim, const Shape& out_shape, Dtype dtype) {
  Tensor y = Tensor::empty(out_shape, dtype, op);
  if (y.numel() == 0) return y;
  const std::int64_t outer = product(out_shape, 0, static_cast<std::size_t>(dim));
  const std::int64_t inner = product(out_shape, static_cast<std::size_t>(dim) + 1, out_shape.size());
  const std::int64_t out_block = out_shape[static_cast<std::size_t>(dim)] * inner;
  dispatch_all(dtype, [&](auto zero) {
    using T = decltype(zero);
    T* dst = y.data<T>();
    std::int64_t offset = 0;
    for (const auto& x : xs) {
      const std::int64_t block = x.shape()[static_cast<std::size_t>(dim)] * inner;
      const T* src = x.data<T>();
      if (block > 0) {
        parallel_for(outer, outer * block > kParallelCopy, [&](std::int64_t o) {
          std::memcpy(dst + o * out_block + offset, src + o * block, static_cast<std::size_t>(block) * sizeof(T));
        });
      }
      offset += block;
    }
  });
  return y;
}

void check_same_dtypes(std::string_view op, const TensorList& xs) {
  for (std::size_t i = 0; i < xs.size(); ++i) {
    if (!xs[i].defined()) fail(op, "tensor {} is an undefined tensor", i);
    if (xs[i].dtype() != xs[0].dtype())
      fail(op, "dtypes differ: {} (tensor 0) and {} (tensor {})", dtype_name(xs[0].dtype()),
           dtype_name(xs[i].dtype()), i);
  }
}

std::string shapes_str(const TensorList& xs) {
  std::string s;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    if (i > 0) s += ", ";
    s += shape_str(xs[i].shape());
  }
  return s;
}

// The sizes of pieces of `piece` elements (the last one smaller) that make up `size`; one empty
// piece when size is 0. Counted by piece number, so no offset passes `size`.
std::vector<std::int64_t> even_pieces(std::int64_t size, std::int64_t piece) {
  if (size == 0) return {0};
  const std::int64_t n = (size - 1) / piece + 1;
  std::vector<std::int64_t> sizes;
  sizes.reserve(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) sizes.push_back(std::min(piece, size - i * piece));
  return sizes;
}

// Pieces of x along dim with the given sizes (already validated), recorded as one node.
TensorList split_sizes(std::string name, const Tensor& x, const std::vector<std::int64_t>& sizes, std::int64_t dim) {
  TensorList pieces;
  pieces.reserve(sizes.size());
  std::int64_t start = 0;
  for (auto len : sizes) {
    pieces.push_back(slice_copy(x, dim, start, len, 1));
    start += len;
  }
  if (needs_grad(x)) {
    // y_i = x[..., offset_i : offset_i + size_i, ...]  =>  dx = cat(dy_0, dy_1, ...) along dim
    record(std::move(name), {x}, pieces, [dim](const TensorList& g, const Node&) {
      return GradList{cat(g, dim)};
    });
  }
  return pieces;
}

}  // namespace

// ---- slices ----

Tensor narrow(const Tensor& x, std::int64_t dim, std::int64_t start, std::int64_t length) {
  check_defined("narrow", x);
  if (x.dim() == 0) fail("narrow", "cannot narrow a 0-d tensor");
  const std::int64_t d = normalize_dim("narrow", dim, x.dim());
  const std::int64_t size = x.shape()[static_cast<std::size_t>(d)];
  if (start < -size || start > size)
    fail("narrow", "start {} is out of range for dim {} of size {} (shape {})", start, dim, size, shape_str(x.shape()));
  if (start < 0) start += size;
  if (length < 0 || length > size - start)  // (0 <= start <= size: no overflow)
    fail("narrow", "start {} + length {} exceeds dim {} of size {} (shape {})", start, length, dim, size,
         shape_str(x.shape()));
  Tensor y = slice_copy(x, d, start, length, 1);
  if (needs_grad(x)) {
    // y = x[..., start : start + length, ...]  =>  dx = zeros with dy written at those positions
    return record("narrow", {x}, y, with_tangents([in_shape = x.shape(), d, start](const TensorList& g, const Node&) {
      return GradList{slice_scatter(g[0], in_shape, d, start, 1)};
    }, [d, start, length](const TensorList& t, const Node&) { return GradList{narrow(t[0], d, start, length)}; }));
  }
  return y;
}

Tensor slice(const Tensor& x, std::int64_t dim, std::int64_t start, std::int64_t end, std::int64_t step) {
  check_defined("slice", x);
  if (x.dim() == 0) fail("slice", "cannot slice a 0-d tensor");
  if (step < 1) fail("slice", "step must be at least 1, got {}", step);
  const std::int64_t d = normalize_dim("slice", dim, x.dim());
  const std::int64_t size = x.shape()[static_cast<std::size_t>(d)];
  // Python's rules: negative bounds count from the end, then both clamp to [0, size].
  if (start < 0) start += size;
  if (end < 0) end += size;
  start = std::clamp<std::int64_t>(start, 0, size);
  end = std::clamp<std::int64_t>(end, 0, size);
  const std::int64_t count = end > start ? (end - start - 1) / step + 1 : 0;  // ceil, without overflow
  Tensor y = slice_copy(x, d, start, count, step);
  if (needs_grad(x)) {
    // y = x[..., start : end : step, ...]  =>  dx = zeros with dy written at those positions
    return record("slice", {x}, y, with_tangents([in_shape = x.shape(), d, start, step](const TensorList& g, const Node&) {
      return GradList{slice_scatter(g[0], in_shape, d, start, step)};
    }, [d, start, end, step](const TensorList& t, const Node&) { return GradList{slice(t[0], d, start, end, step)}; }));
  }
  return y;
}

// ---- joining ----

Tensor cat(const TensorList& xs, std::int64_t dim) {
  if (xs.empty()) fail("cat", "needs at least one tensor");
  check_same_dtypes("cat", xs);
  const std::int64_t rank = xs[0].dim();
  if (rank == 0) fail("cat", "cannot concatenate 0-d tensors (shapes {}); use stack", shapes_str(xs));
  const std::int64_t d = normalize_dim("cat", dim, rank);
  Shape out_shape = xs[0].shape();
  std::int64_t total = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const Shape& s = xs[i].shape();
    bool fits = static_cast<std::int64_t>(s.size()) == rank;
    for (std::int64_t j = 0; fits && j < rank; ++j)
      fits = j == d || s[static_cast<std::size_t>(j)] == xs[0].shape()[static_cast<std::size_t>(j)];
    if (!fits)
      fail("cat", "shapes {} differ outside dim {} (tensor {} has shape {})", shapes_str(xs), dim, i, shape_str(s));
    const std::int64_t size = s[static_cast<std::size_t>(d)];
    if (size > std::numeric_limits<std::int64_t>::max() - total)
      fail("cat", "sizes along dim {} of shapes {} add up to more than a 64-bit count can hold", dim, shapes_str(xs));
    total += size;
  }
  out_shape[static_cast<std::size_t>(d)] = total;
  Tensor y = cat_copy("cat", xs, d, out_shape, xs[0].dtype());
  if (needs_grad(xs)) {
    std::vector<std::int64_t> sizes;
    for (const auto& x : xs) sizes.push_back(x.shape()[static_cast<std::size_t>(d)]);
    // y = [x_0 | x_1 | ...] along d  =>  dx_i = dy[..., offset_i : offset_i + size_i, ...]
    return record("cat", xs, y, with_tangents([sizes, d](const TensorList& g, const Node& node) {
      TensorList dxs(sizes.size());
      std::int64_t offset = 0;
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        if (node.needs_input_grad(i)) dxs[i] = narrow(g[0], d, offset, sizes[i]);
        offset += sizes[i];
      }
      return dxs;
    }, [d](const TensorList& t, const Node& node) {  // the tangents joined, zeros for those without one
      TensorList parts(t.size());
      for (std::size_t i = 0; i < t.size(); ++i)
        parts[i] = t[i].defined() ? t[i] : zeros(node.input_meta[i].shape, node.input_meta[i].dtype);
      return GradList{cat(parts, d)};
    }));
  }
  return y;
}

Tensor stack(const TensorList& xs, std::int64_t dim) {
  if (xs.empty()) fail("stack", "needs at least one tensor");
  check_same_dtypes("stack", xs);
  const Shape& shape = xs[0].shape();
  for (std::size_t i = 1; i < xs.size(); ++i)
    if (xs[i].shape() != shape) fail("stack", "all tensors need the same shape, got {}", shapes_str(xs));
  const std::int64_t d = normalize_dim("stack", dim, xs[0].dim() + 1);
  Shape piece_shape = shape;  // each x seen with a size-1 dim at d, then concatenated
  piece_shape.insert(piece_shape.begin() + d, 1);
  TensorList pieces;
  pieces.reserve(xs.size());
  for (const auto& x : xs) pieces.push_back(view_as_shape(x, piece_shape));
  Shape out_shape = piece_shape;
  out_shape[static_cast<std::size_t>(d)] = static_cast<std::int64_t>(xs.size());
  Tensor y = cat_copy("stack", pieces, d, out_shape, xs[0].dtype());
  if (needs_grad(xs)) {
    // y[..., i, ...] = x_i  =>  dx_i = dy[..., i, ...]
    return record("stack", xs, y, with_tangents([shape, d](const TensorList& g, const Node& node) {
      TensorList dxs(node.next_edges.size());
      for (std::size_t i = 0; i < dxs.size(); ++i)
        if (node.needs_input_grad(i)) dxs[i] = reshape(narrow(g[0], d, static_cast<std::int64_t>(i), 1), shape);
      return dxs;
    }, [d](const TensorList& t, const Node& node) {  // the tangents stacked, zeros for those without one
      TensorList parts(t.size());
      for (std::size_t i = 0; i < t.size(); ++i)
        parts[i] = t[i].defined() ? t[i] : zeros(node.input_meta[i].shape, node.input_meta[i].dtype);
      return GradList{stack(parts, d)};
    }));
  }
  return y;
}

// ---- splitting ----

TensorList split(const Tensor& x, std::int64_t split_size, std::int64_t dim) {
  check_defined("split", x);
  if (x.dim() == 0) fail("split", "cannot split a 0-d tensor");
  const std::int64_t d = normalize_dim("split", dim, x.dim());
  const std::int64_t size = x.shape()[static_cast<std::size_t>(d)];
  if (split_size < 1 && !(split_size == 0 && size == 0))
    fail("split", "split_size must be positive, got {} (shape {})", split_size, shape_str(x.shape()));
  return split_sizes("split", x, even_pieces(size, split_size), d);
}

TensorList split(const Tensor& x, const std::vector<std::int64_t>& sizes, std::int64_t dim) {
  check_defined("split", x);
  if (x.dim() == 0) fail("split", "cannot split a 0-d tensor");
  const std::int64_t d = normalize_dim("split", dim, x.dim());
  const std::int64_t size = x.shape()[static_cast<std::size_t>(d)];
  for (auto s : sizes)
    if (s < 0) fail("split", "negative size {} in {}", s, shape_str(sizes));
  std::int64_t total = 0;
  for (auto s : sizes) {
    if (s > size - total)  // (0 <= total <= size: no overflow)
      fail("split", "sizes {} add up to more than dim {} of {} (size {})", shape_str(sizes), dim, shape_str(x.shape()),
           size);
    total += s;
  }
  if (total != size)
    fail("split", "sizes {} add up to {}, but dim {} of {} has size {}", shape_str(sizes), total, dim,
         shape_str(x.shape()), size);
  if (sizes.empty()) fail("split", "needs at least one size");
  return split_sizes("split", x, sizes, d);
}

TensorList chunk(const Tensor& x, std::int64_t chunks, std::int64_t dim) {
  check_defined("chunk", x);
  if (x.dim() == 0) fail("chunk", "cannot chunk a 0-d tensor");
  if (chunks < 1) fail("chunk", "chunks must be positive, got {}", chunks);
  const std::int64_t d = normalize_dim("chunk", dim, x.dim());
  const std::int64_t size = x.shape()[static_cast<std::size_t>(d)];
  // torch.chunk: pieces of ceil(size / chunks), the last smaller; may give fewer than `chunks`.
  const std::int64_t piece = size == 0 ? 0 : (size - 1) / chunks + 1;  // ceil, without overflow
  return split_sizes("chunk", x, even_pieces(size, piece), d);
}

}  // namespace autograd
