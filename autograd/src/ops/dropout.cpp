// Dropout: in training each element is zeroed with probability p and the survivors are scaled
// by 1/(1-p), so the expectation is unchanged. Each call draws one 64-bit seed from the given
// Generator (whatever the tensor's size), and element n (row-major) is kept iff its Philox
// uniform u(seed, n) >= p (kernels/philox.hpp): a seed fixes the mask, which does not depend on the
// dtype or the thread count, and is the one the fused attention ops draw on (B, H, T, S) weights.
#include <algorithm>
#include <cmath>

#include "autograd/graph.hpp"
#include "autograd/ops.hpp"
#include "ops/tangent_rules.hpp"
#include "kernels/parallel.hpp"
#include "kernels/philox.hpp"
#include "ops/checks.hpp"

namespace autograd {

Tensor dropout(const Tensor& x, double p, bool training, Generator& gen) {
  check_defined("dropout", x);
  check_floating("dropout", x);
  if (!(p >= 0.0 && p <= 1.0)) fail("dropout", "p must be in [0, 1], got {}", p);
  if (!training || p == 0.0) return x;

  // mask = 1/(1-p) where kept, 0 where dropped; p == 1 drops everything (mask all zero, no 1/0).
  // The mask is kept only for backward.
  const philox::DropoutStream stream(gen.next_u64(), p);  // the call's one draw
  const bool keep_mask = needs_grad(x);
  Tensor mask = keep_mask ? Tensor::empty(x.shape(), x.dtype()) : Tensor();
  Tensor y = Tensor::empty(x.shape(), x.dtype());
  dispatch(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T scale = static_cast<T>(stream.scale());
    const T* xs = x.data<T>();
    T* m = keep_mask ? mask.data<T>() : nullptr;
    T* ys = y.data<T>();
    // Chunks of elements (a multiple of 4: whole Philox calls), each drawn on its own.
    constexpr std::int64_t chunk = 4096;
    const std::int64_t n = y.numel(), chunks = (n + chunk - 1) / chunk;
    parallel_for(chunks, n >= kParallelElementwise, [&](std::int64_t c) {
      const std::int64_t first = c * chunk, len = std::min(chunk, n - first);
      T* factors = m != nullptr ? m + first : ys + first;  // the factors, then (in ys) the product
      philox::keep_factors(stream, static_cast<std::uint64_t>(first), len, scale, factors);
      ArrayView<T>(ys + first, len) = ConstArrayView<T>(xs + first, len) * ConstArrayView<T>(factors, len);
    });
  });
  if (keep_mask) {
    // y = x · mask  =>  dx = dy · mask  (the same mask: it is kept, not redrawn)
    return record("dropout", {x}, y, symmetric([mask = SavedTensor(mask)](const TensorList& g, const Node&) {
      return GradList{mul(g[0], mask.get("dropout"))};
    }));
  }
  return y;
}

Tensor dropout(const Tensor& x, double p, bool training) { return dropout(x, p, training, default_generator()); }

}  // namespace autograd
