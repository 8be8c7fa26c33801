// Shape ops that keep every element: reshape, flatten, squeeze and unsqueeze share storage with
// their input (a new TensorImpl over the same Storage); permute, transpose and expand copy into a
// fresh contiguous tensor, since storage is always contiguous row-major. Slicing, joining and
// splitting are in join.cpp.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "autograd/detail/small_pool.hpp"
#include "autograd/graph.hpp"
#include "autograd/ops.hpp"
#include "ops/tangent_rules.hpp"
#include "ops/checks.hpp"
#include "ops/view_support.hpp"

namespace autograd {

Tensor view_as_shape(const Tensor& x, const Shape& shape) {
  auto impl = std::allocate_shared<TensorImpl>(detail::PoolAllocator<TensorImpl>{});
  impl->shape = shape;
  impl->dtype = x.dtype();
  impl->storage = x.impl()->storage;
  return Tensor(std::move(impl));
}

namespace {

// A storage-sharing view recorded under `name`; its backward views the gradient back.
Tensor view_op(std::string name, const Tensor& x, const Shape& shape) {
  Tensor y = view_as_shape(x, shape);
  if (needs_grad(x)) {
    // y = x viewed as shape  =>  dx = dy viewed as x.shape
    return record(std::move(name), {x}, y, with_tangents([in_shape = x.shape()](const TensorList& g, const Node&) {
      return GradList{reshape(g[0], in_shape)};
    }, [](const TensorList& t, const Node& n) { return GradList{reshape(t[0], n.output_meta[0].shape)}; }));
  }
  return y;
}

// Resolves one -1 and checks the element count.
Shape infer_shape(const Tensor& x, const Shape& shape) {
  const std::int64_t numel = x.numel();
  std::int64_t infer_at = -1;
  Shape known_sizes = shape;  // the -1 counted as 1
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (infer_at >= 0) fail("reshape", "only one dimension can be -1, got {}", shape_str(shape));
      infer_at = static_cast<std::int64_t>(i);
      known_sizes[i] = 1;
    } else if (shape[i] < 0) {
      fail("reshape", "invalid size {} in shape {}", shape[i], shape_str(shape));
    }
  }
  std::int64_t known = 0;
  if (!numel_fits(known_sizes, known))
    fail("reshape", "cannot reshape {} into {}: its sizes multiply past what a 64-bit count can hold",
         shape_str(x.shape()), shape_str(shape));
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
    parallel_for(blocks, n > kParallelCopy, [&](std::int64_t b) {
      std::int64_t offset = 0, rest = b;
      for (std::int64_t d = rank - 3; d >= 0; --d) {
        offset += (rest % shape[d]) * src_strides[d];
        rest /= shape[d];
      }
      SourceMap s(src + offset, cols, rows, Eigen::OuterStride<>(inner_stride));  // untransposed
      MatrixView<T> out(dst + b * rows * cols, rows, cols);
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
  parallel_for(lines, n > kParallelCopy, [&](std::int64_t line) {
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
  dispatch_all(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    gather_strided<T>(x.data<T>(), y.data<T>(), out_shape, src_strides);
  });
  return y;
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
    return record("permute", {x}, y, with_tangents([inverse](const TensorList& g, const Node&) {
      return GradList{permute(g[0], inverse)};
    }, [perm](const TensorList& t, const Node&) { return GradList{permute(t[0], perm)}; }));
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
    return record("transpose", {x}, y, symmetric([d0, d1](const TensorList& g, const Node&) {
      return GradList{transpose(g[0], d0, d1)};
    }));
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
  Tensor y = Tensor::empty(out_shape, x.dtype(), "expand");
  dispatch_all(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    gather_strided<T>(x.data<T>(), y.data<T>(), out_shape, src_strides);
  });
  if (needs_grad(x)) {
    // y = broadcast(x)  =>  dx = dy summed over the broadcast dims
    return record("expand", {x}, y, with_tangents([in_shape = in](const TensorList& g, const Node&) {
      return GradList{sum_to(g[0], in_shape)};
    }, [](const TensorList& t, const Node& n) { return GradList{expand(t[0], n.output_meta[0].shape)}; }));
  }
  return y;
}

}  // namespace autograd
