// Shape ops. reshape, flatten, squeeze and unsqueeze share storage with their input (a new
// TensorImpl over the same Storage); the others copy into a fresh contiguous tensor, since
// storage is always contiguous row-major.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "autograd/detail/small_pool.hpp"
#include "autograd/graph.hpp"
#include "autograd/ops.hpp"
#include "ops/parallel.hpp"

namespace autograd {

namespace {

// Element counts above which the copy kernels split their outer loop across threads.
constexpr std::int64_t kParallelElements = 1 << 16;

void check_defined(std::string_view op, const Tensor& x) {
  if (!x.defined()) fail(op, "tensor is undefined");
}

std::int64_t product(const Shape& s, std::size_t begin, std::size_t end) {
  std::int64_t n = 1;
  for (std::size_t i = begin; i < end; ++i) n *= s[i];
  return n;
}

// A new TensorImpl of another shape over the same Storage (like Tensor::detach).
Tensor view_as_shape(const Tensor& x, const Shape& shape) {
  auto impl = std::allocate_shared<TensorImpl>(detail::PoolAllocator<TensorImpl>{});
  impl->shape = shape;
  impl->dtype = x.dtype();
  impl->storage = x.impl()->storage;
  return Tensor(std::move(impl));
}

// A storage-sharing view recorded under `name`; its backward views the gradient back.
Tensor view_op(std::string name, const Tensor& x, const Shape& shape) {
  Tensor y = view_as_shape(x, shape);
  if (needs_grad(x)) {
    // y = x viewed as shape  =>  dx = dy viewed as x.shape
    return record(std::move(name), {x}, y, [in_shape = x.shape()](const TensorList& g, const Node&) {
      return GradList{reshape(g[0], in_shape)};
    });
  }
  return y;
}

// Resolves one -1 and checks the element count.
Shape infer_shape(const Tensor& x, const Shape& shape) {
  const std::int64_t numel = x.numel();
  std::int64_t known = 1;
  std::int64_t infer_at = -1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (infer_at >= 0) fail("reshape", "only one dimension can be -1, got {}", shape_str(shape));
      infer_at = static_cast<std::int64_t>(i);
    } else if (shape[i] < 0) {
      fail("reshape", "invalid size {} in shape {}", shape[i], shape_str(shape));
    } else {
      known *= shape[i];
    }
  }
  Shape out = shape;
  if (infer_at >= 0) {
    if (known == 0 || numel % known != 0)
      fail("reshape", "cannot reshape {} ({} elements) into {}", shape_str(x.shape()), numel, shape_str(shape));
    out[static_cast<std::size_t>(infer_at)] = numel / known;
  } else if (known != numel) {
    fail("reshape", "cannot reshape {} ({} elements) into {}", shape_str(x.shape()), numel, shape_str(shape));
  }
  return out;
}

// ---- the strided gather kernel (permute, transpose, expand) ----
//
// dst is contiguous with shape `shape`; dst[i0, ..., ik] = src[sum(i_j * src_strides[j])].
// Stride 0 repeats an element (broadcast).

// Drops size-1 dims and merges neighbours that are contiguous in both src and dst, so a
// permute that moves whole blocks becomes a few long copies.
void coalesce(Shape& shape, Shape& src_strides) {
  Shape s, st;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 1) continue;
    if (!s.empty() && st.back() == src_strides[i] * shape[i]) {
      s.back() *= shape[i];
      st.back() = src_strides[i];
    } else {
      s.push_back(shape[i]);
      st.push_back(src_strides[i]);
    }
  }
  shape = std::move(s);
  src_strides = std::move(st);
}

template <class T>
void gather_strided(const T* src, T* dst, Shape shape, Shape src_strides) {
  const std::int64_t n = shape_numel(shape);
  if (n == 0) return;
  coalesce(shape, src_strides);
  const auto rank = static_cast<std::int64_t>(shape.size());
  if (rank == 0) {
    dst[0] = src[0];
    return;
  }
  const std::int64_t inner = shape[rank - 1];
  const std::int64_t inner_stride = src_strides[rank - 1];

  // Fast path: the last two dims read the source down its columns (a transposed matrix whose
  // rows are inner_stride apart), copied in 16 x 16 tiles through Eigen so both sides stay in cache.
  if (rank >= 2 && inner_stride > 1 && src_strides[rank - 2] == 1) {
    const std::int64_t rows = shape[rank - 2], cols = inner;  // dst block is rows x cols
    const std::int64_t blocks = n / (rows * cols);
    constexpr std::int64_t tile = 16;
    using SourceMap = Eigen::Map<const RowMatrix<T>, Eigen::Unaligned, Eigen::OuterStride<>>;
    parallel_for(blocks, n > kParallelElements, [&](std::int64_t b) {
      std::int64_t offset = 0, rest = b;
      for (std::int64_t d = rank - 3; d >= 0; --d) {
        offset += (rest % shape[d]) * src_strides[d];
        rest /= shape[d];
      }
      SourceMap s(src + offset, cols, rows, Eigen::OuterStride<>(inner_stride));  // untransposed
      Eigen::Map<RowMatrix<T>> out(dst + b * rows * cols, rows, cols);
      for (std::int64_t i0 = 0; i0 < rows; i0 += tile)
        for (std::int64_t j0 = 0; j0 < cols; j0 += tile) {
          const std::int64_t bi = std::min(tile, rows - i0), bj = std::min(tile, cols - j0);
          out.block(i0, j0, bi, bj) = s.block(j0, i0, bj, bi).transpose();
        }
    });
    return;
  }

  // General path: the innermost dim as a plain loop (a memcpy when contiguous).
  const std::int64_t lines = n / inner;
  parallel_for(lines, n > kParallelElements, [&](std::int64_t line) {
    std::int64_t offset = 0, rest = line;
    for (std::int64_t d = rank - 2; d >= 0; --d) {
      offset += (rest % shape[d]) * src_strides[d];
      rest /= shape[d];
    }
    const T* s = src + offset;
    T* out = dst + line * inner;
    if (inner_stride == 1) {
      std::memcpy(out, s, static_cast<std::size_t>(inner) * sizeof(T));
    } else if (inner_stride == 0) {
      std::fill(out, out + inner, *s);
    } else {
      for (std::int64_t j = 0; j < inner; ++j) out[j] = s[j * inner_stride];
    }
  });
}

// out[..., k, ...] = x[..., dims permuted ...]: the copy behind permute and transpose.
Tensor permute_copy(const Tensor& x, const std::vector<std::int64_t>& perm) {
  const Shape& in = x.shape();
  const Shape in_strides = contiguous_strides(in);
  Shape out_shape(perm.size()), src_strides(perm.size());
  for (std::size_t i = 0; i < perm.size(); ++i) {
    out_shape[i] = in[static_cast<std::size_t>(perm[i])];
    src_strides[i] = in_strides[static_cast<std::size_t>(perm[i])];
  }
  Tensor y = Tensor::empty(out_shape, x.dtype());
  dispatch(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    gather_strided<T>(x.data<T>(), y.data<T>(), out_shape, src_strides);
  });
  return y;
}

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
  dispatch(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* src = x.data<T>();
    T* dst = y.data<T>();
    parallel_for(outer, y.numel() > kParallelElements, [&](std::int64_t o) {
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
Tensor slice_scatter(const Tensor& g, const Shape& in_shape, std::int64_t dim, std::int64_t start,
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
    parallel_for(outer, g.numel() > kParallelElements, [&](std::int64_t o) {
      const T* s = src + o * count * inner;
      T* d = dst + (o * size + start) * inner;
      for (std::int64_t k = 0; k < count; ++k)
        std::memcpy(d + k * step * inner, s + k * inner, static_cast<std::size_t>(inner) * sizeof(T));
    });
  });
  return dx;
}

// Copies xs (same rank, equal except along dim) side by side along dim into a tensor of out_shape.
Tensor cat_copy(const TensorList& xs, std::int64_t dim, const Shape& out_shape, Dtype dtype) {
  Tensor y = Tensor::empty(out_shape, dtype);
  if (y.numel() == 0) return y;
  const std::int64_t outer = product(out_shape, 0, static_cast<std::size_t>(dim));
  const std::int64_t inner = product(out_shape, static_cast<std::size_t>(dim) + 1, out_shape.size());
  const std::int64_t out_block = out_shape[static_cast<std::size_t>(dim)] * inner;
  dispatch(dtype, [&](auto zero) {
    using T = decltype(zero);
    T* dst = y.data<T>();
    std::int64_t offset = 0;
    for (const auto& x : xs) {
      const std::int64_t block = x.shape()[static_cast<std::size_t>(dim)] * inner;
      const T* src = x.data<T>();
      if (block > 0) {
        parallel_for(outer, outer * block > kParallelElements, [&](std::int64_t o) {
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
    if (!xs[i].defined()) fail(op, "tensor {} is undefined", i);
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

// ---- views: reshape, flatten, squeeze, unsqueeze (share storage) ----

Tensor reshape(const Tensor& x, const Shape& shape) {
  check_defined("reshape", x);
  return view_op("reshape", x, infer_shape(x, shape));
}

Tensor flatten(const Tensor& x, std::int64_t start_dim, std::int64_t end_dim) {
  check_defined("flatten", x);
  if (x.dim() == 0) return view_op("flatten", x, {1});
  const std::int64_t start = normalize_dim("flatten", start_dim, x.dim());
  const std::int64_t end = normalize_dim("flatten", end_dim, x.dim());
  if (start > end)
    fail("flatten", "start_dim {} comes after end_dim {} for shape {}", start_dim, end_dim, shape_str(x.shape()));
  const Shape& in = x.shape();
  Shape out(in.begin(), in.begin() + start);
  out.push_back(product(in, static_cast<std::size_t>(start), static_cast<std::size_t>(end) + 1));
  out.insert(out.end(), in.begin() + end + 1, in.end());
  return view_op("flatten", x, out);
}

Tensor squeeze(const Tensor& x) {
  check_defined("squeeze", x);
  Shape out;
  for (auto d : x.shape())
    if (d != 1) out.push_back(d);
  return view_op("squeeze", x, out);
}

Tensor squeeze(const Tensor& x, std::int64_t dim) {
  check_defined("squeeze", x);
  if (x.dim() == 0) {
    normalize_dim("squeeze", dim, 0);
    return view_op("squeeze", x, {});
  }
  const std::int64_t d = normalize_dim("squeeze", dim, x.dim());
  Shape out = x.shape();
  if (out[static_cast<std::size_t>(d)] == 1) out.erase(out.begin() + d);  // PyTorch: other sizes stay
  return view_op("squeeze", x, out);
}

Tensor unsqueeze(const Tensor& x, std::int64_t dim) {
  check_defined("unsqueeze", x);
  const std::int64_t d = normalize_dim("unsqueeze", dim, x.dim() + 1);
  Shape out = x.shape();
  out.insert(out.begin() + d, 1);
  return view_op("unsqueeze", x, out);
}

// ---- copies: permute, transpose, expand ----

Tensor permute(const Tensor& x, const std::vector<std::int64_t>& dims) {
  check_defined("permute", x);
  const std::int64_t rank = x.dim();
  if (static_cast<std::int64_t>(dims.size()) != rank)
    fail("permute", "got {} dims {} for a tensor of rank {} (shape {})", dims.size(), shape_str(dims), rank,
         shape_str(x.shape()));
  std::vector<std::int64_t> perm(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (std::size_t i = 0; i < dims.size(); ++i) {
    perm[i] = normalize_dim("permute", dims[i], rank);
    if (seen[static_cast<std::size_t>(perm[i])])
      fail("permute", "dim {} repeats in {}", dims[i], shape_str(dims));
    seen[static_cast<std::size_t>(perm[i])] = true;
  }
  Tensor y = permute_copy(x, perm);
  if (needs_grad(x)) {
    std::vector<std::int64_t> inverse(perm.size());
    for (std::size_t i = 0; i < perm.size(); ++i) inverse[static_cast<std::size_t>(perm[i])] = static_cast<std::int64_t>(i);
    // y[i_0..i_k] = x[i_perm⁻¹...], y.dim(i) = x.dim(perm[i])  =>  dx = permute(dy, perm⁻¹)
    return record("permute", {x}, y, [inverse](const TensorList& g, const Node&) {
      return GradList{permute(g[0], inverse)};
    });
  }
  return y;
}

Tensor transpose(const Tensor& x, std::int64_t dim0, std::int64_t dim1) {
  check_defined("transpose", x);
  if (x.dim() == 0) {  // like PyTorch: a scalar transposes to itself
    normalize_dim("transpose", dim0, 0);
    normalize_dim("transpose", dim1, 0);
    return x.clone();
  }
  const std::int64_t d0 = normalize_dim("transpose", dim0, x.dim());
  const std::int64_t d1 = normalize_dim("transpose", dim1, x.dim());
  std::vector<std::int64_t> perm(static_cast<std::size_t>(x.dim()));
  std::iota(perm.begin(), perm.end(), 0);
  std::swap(perm[static_cast<std::size_t>(d0)], perm[static_cast<std::size_t>(d1)]);
  Tensor y = permute_copy(x, perm);
  if (needs_grad(x)) {
    // y = x with dims d0, d1 swapped  =>  dx = dy with them swapped back
    return record("transpose", {x}, y, [d0, d1](const TensorList& g, const Node&) {
      return GradList{transpose(g[0], d0, d1)};
    });
  }
  return y;
}

Tensor expand(const Tensor& x, const Shape& shape) {
  check_defined("expand", x);
  const Shape& in = x.shape();
  if (shape.size() < in.size())
    fail("expand", "cannot expand {} to {}: the target has fewer dims", shape_str(in), shape_str(shape));
  const std::size_t lead = shape.size() - in.size();
  const Shape in_strides = contiguous_strides(in);
  Shape out_shape(shape.size()), src_strides(shape.size(), 0);
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i < lead) {
      if (shape[i] < 0) fail("expand", "cannot expand {} to {}: new leading dims need a size", shape_str(in), shape_str(shape));
      out_shape[i] = shape[i];
      continue;
    }
    const std::int64_t have = in[i - lead];
    const std::int64_t want = shape[i] == -1 ? have : shape[i];
    if (want < 0) fail("expand", "invalid size {} in {}", shape[i], shape_str(shape));
    if (have != want && have != 1)
      fail("expand", "cannot expand {} to {}: dim {} has size {} (only size-1 dims can grow)", shape_str(in),
           shape_str(shape), i, have);
    out_shape[i] = want;
    src_strides[i] = have == want ? in_strides[i - lead] : 0;
  }
  Tensor y = Tensor::empty(out_shape, x.dtype());
  dispatch(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    gather_strided<T>(x.data<T>(), y.data<T>(), out_shape, src_strides);
  });
  if (needs_grad(x)) {
    // y = broadcast(x)  =>  dx = dy summed over the broadcast dims
    return record("expand", {x}, y, [in_shape = in](const TensorList& g, const Node&) {
      return GradList{sum_to(g[0], in_shape)};
    });
  }
  return y;
}

// ---- slices ----

Tensor narrow(const Tensor& x, std::int64_t dim, std::int64_t start, std::int64_t length) {
  check_defined("narrow", x);
  if (x.dim() == 0) fail("narrow", "cannot narrow a 0-d tensor");
  const std::int64_t d = normalize_dim("narrow", dim, x.dim());
  const std::int64_t size = x.shape()[static_cast<std::size_t>(d)];
  if (start < -size || start > size)
    fail("narrow", "start {} is out of range for dim {} of size {} (shape {})", start, dim, size, shape_str(x.shape()));
  if (start < 0) start += size;
  if (length < 0 || start + length > size)
    fail("narrow", "start {} + length {} exceeds dim {} of size {} (shape {})", start, length, dim, size,
         shape_str(x.shape()));
  Tensor y = slice_copy(x, d, start, length, 1);
  if (needs_grad(x)) {
    // y = x[..., start : start + length, ...]  =>  dx = zeros with dy written at those positions
    return record("narrow", {x}, y, [in_shape = x.shape(), d, start](const TensorList& g, const Node&) {
      return GradList{slice_scatter(g[0], in_shape, d, start, 1)};
    });
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
  const std::int64_t count = end > start ? (end - start + step - 1) / step : 0;
  Tensor y = slice_copy(x, d, start, count, step);
  if (needs_grad(x)) {
    // y = x[..., start : end : step, ...]  =>  dx = zeros with dy written at those positions
    return record("slice", {x}, y, [in_shape = x.shape(), d, start, step](const TensorList& g, const Node&) {
      return GradList{slice_scatter(g[0], in_shape, d, start, step)};
    });
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
  out_shape[static_cast<std::size_t>(d)] = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const Shape& s = xs[i].shape();
    bool fits = static_cast<std::int64_t>(s.size()) == rank;
    for (std::int64_t j = 0; fits && j < rank; ++j)
      fits = j == d || s[static_cast<std::size_t>(j)] == xs[0].shape()[static_cast<std::size_t>(j)];
    if (!fits)
      fail("cat", "shapes {} differ outside dim {} (tensor {} has shape {})", shapes_str(xs), dim, i, shape_str(s));
    out_shape[static_cast<std::size_t>(d)] += s[static_cast<std::size_t>(d)];
  }
  Tensor y = cat_copy(xs, d, out_shape, xs[0].dtype());
  if (needs_grad(xs)) {
    std::vector<std::int64_t> sizes;
    for (const auto& x : xs) sizes.push_back(x.shape()[static_cast<std::size_t>(d)]);
    // y = [x_0 | x_1 | ...] along d  =>  dx_i = dy[..., offset_i : offset_i + size_i, ...]
    return record("cat", xs, y, [sizes, d](const TensorList& g, const Node& node) {
      TensorList dxs(sizes.size());
      std::int64_t offset = 0;
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        if (node.needs_input_grad(i)) dxs[i] = slice_copy(g[0], d, offset, sizes[i], 1);
        offset += sizes[i];
      }
      return dxs;
    });
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
  Tensor y = cat_copy(pieces, d, out_shape, xs[0].dtype());
  if (needs_grad(xs)) {
    // y[..., i, ...] = x_i  =>  dx_i = dy[..., i, ...]
    return record("stack", xs, y, [shape, d](const TensorList& g, const Node& node) {
      TensorList dxs(node.next_edges.size());
      for (std::size_t i = 0; i < dxs.size(); ++i)
        if (node.needs_input_grad(i))
          dxs[i] = view_as_shape(slice_copy(g[0], d, static_cast<std::int64_t>(i), 1, 1), shape);
      return dxs;
    });
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
  std::vector<std::int64_t> sizes;
  for (std::int64_t start = 0; start < size; start += split_size) sizes.push_back(std::min(split_size, size - start));
  if (sizes.empty()) sizes.push_back(0);  // an empty dim splits into one empty piece
  return split_sizes("split", x, sizes, d);
}

TensorList split(const Tensor& x, const std::vector<std::int64_t>& sizes, std::int64_t dim) {
  check_defined("split", x);
  if (x.dim() == 0) fail("split", "cannot split a 0-d tensor");
  const std::int64_t d = normalize_dim("split", dim, x.dim());
  const std::int64_t size = x.shape()[static_cast<std::size_t>(d)];
  std::int64_t total = 0;
  for (auto s : sizes) {
    if (s < 0) fail("split", "negative size {} in {}", s, shape_str(sizes));
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
  const std::int64_t piece = (size + chunks - 1) / chunks;
  std::vector<std::int64_t> sizes;
  for (std::int64_t start = 0; start < size; start += piece) sizes.push_back(std::min(piece, size - start));
  if (sizes.empty()) sizes.push_back(0);
  return split_sizes("chunk", x, sizes, d);
}

}  // namespace autograd
