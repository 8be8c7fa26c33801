// Shape ops: reshape and flatten share storage with their input; the others copy into a
// fresh contiguous tensor (storage is always contiguous row-major).
#include <algorithm>
#include <cstring>

#include "autograd/graph.hpp"
#include "autograd/ops.hpp"

namespace autograd {

namespace {

void check_defined(std::string_view op, const Tensor& x) {
  if (!x.defined()) fail(op, "tensor is undefined");
}

// A new TensorImpl of another shape over the same Storage (like Tensor::detach).
Tensor view_as_shape(const Tensor& x, const Shape& shape) {
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape;
  impl->dtype = x.dtype();
  impl->storage = x.impl()->storage;
  return Tensor(std::move(impl));
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

}  // namespace

// ---- reshape, flatten (share storage) ----

Tensor reshape(const Tensor& x, const Shape& shape) {
  check_defined("reshape", x);
  const Shape out_shape = infer_shape(x, shape);
  Tensor y = view_as_shape(x, out_shape);
  if (needs_grad(x)) {
    // y = x viewed as out_shape  =>  dx = dy viewed as x.shape
    return record("reshape", {x}, y, [in_shape = x.shape()](const TensorList& g, const Node&) {
      return TensorList{reshape(g[0], in_shape)};
    });
  }
  return y;
}

}  // namespace autograd
