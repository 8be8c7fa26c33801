// Dropout: in training each element is zeroed with probability p and the survivors are scaled
// by 1/(1-p), so the expectation is unchanged. The mask comes from the given Generator, one
// uniform draw per element in row-major order, so a seed fixes it.
#include <cmath>

#include "autograd/grad_mode.hpp"
#include "autograd/graph.hpp"
#include "autograd/ops.hpp"
#include "ops/common.hpp"

namespace autograd {

namespace {

// out = a * mask elementwise (same shape and dtype).
Tensor times_mask(const Tensor& a, const Tensor& mask) {
  Tensor out = Tensor::empty(a.shape(), a.dtype());
  dispatch(a.dtype(), [&](auto zero) {
    using T = decltype(zero);
    ArrayView<T>(out.data<T>(), out.numel()) =
        ConstArrayView<T>(a.data<T>(), a.numel()) * ConstArrayView<T>(mask.data<T>(), mask.numel());
  });
  return out;
}

}  // namespace

Tensor dropout(const Tensor& x, double p, bool training, Generator& gen) {
  check_defined("dropout", x);
  check_floating("dropout", x);
  if (!(p >= 0.0 && p <= 1.0)) fail("dropout", "p must be in [0, 1], got {}", p);
  if (!training || p == 0.0) return x;

  // mask = 1/(1-p) where kept, 0 where dropped; p == 1 drops everything (mask all zero, no 1/0).
  // The mask is kept only for backward.
  const bool keep_mask = needs_grad(x);
  Tensor mask = keep_mask ? Tensor::empty(x.shape(), x.dtype()) : Tensor();
  Tensor y = Tensor::empty(x.shape(), x.dtype());
  dispatch(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T scale = p < 1.0 ? static_cast<T>(1.0 / (1.0 - p)) : T(0);
    const T* xs = x.data<T>();
    T* m = keep_mask ? mask.data<T>() : nullptr;
    T* ys = y.data<T>();
    for (std::int64_t i = 0; i < y.numel(); ++i) {
      const T keep = gen.uniform() >= p ? scale : T(0);  // one draw per element, row-major: a seed fixes the mask
      if (m) m[i] = keep;
      ys[i] = xs[i] * keep;
    }
  });
  if (keep_mask) {
    // y = x · mask  =>  dx = dy · mask  (the same mask: it is kept, not redrawn)
    return record("dropout", {x}, y, [mask = SavedTensor(mask)](const TensorList& g, const Node&) {
      // create_graph: the same product from a differentiable op (the mask is a constant)
      if (is_grad_enabled()) return GradList{mul(g[0], mask.get("dropout"))};
      return GradList{times_mask(g[0], mask.get("dropout"))};
    });
  }
  return y;
}

Tensor dropout(const Tensor& x, double p, bool training) { return dropout(x, p, training, default_generator()); }

}  // namespace autograd
