// The tensor factories: tensors made from values, filled with one value, or counting.
#include <algorithm>
#include <cmath>

#include "autograd/tensor.hpp"
#include "convert.hpp"

namespace autograd {

// ---- factories ----

Tensor tensor(const std::vector<double>& values, const Shape& shape, Dtype dtype) {
  const std::int64_t numel = checked_numel("tensor", shape);
  if (static_cast<std::int64_t>(values.size()) != numel)
    fail("tensor", "{} values given for shape {} ({} elements)", values.size(), shape_str(shape), numel);
  Tensor t = Tensor::empty(shape, dtype, "tensor");
  dispatch_all(dtype, [&](auto zero) {
    using T = decltype(zero);
    detail::convert_values("tensor", values.data(), t.data<T>(), numel);
  });
  return t;
}

Tensor tensor_int64(const std::vector<std::int64_t>& values, const Shape& shape) {
  const std::int64_t numel = checked_numel("tensor", shape);
  if (static_cast<std::int64_t>(values.size()) != numel)
    fail("tensor", "{} values given for shape {} ({} elements)", values.size(), shape_str(shape), numel);
  Tensor t = Tensor::empty(shape, Dtype::Int64, "tensor");
  std::copy(values.begin(), values.end(), t.data<std::int64_t>());
  return t;
}

Tensor tensor(const std::vector<double>& values, std::initializer_list<std::int64_t> shape, Dtype dtype) {
  return tensor(values, Shape(shape), dtype);
}

namespace {
// A tensor of `shape` with every element `value`, made for the factory `op`.
Tensor filled(std::string_view op, const Shape& shape, double value, Dtype dtype) {
  Tensor t = Tensor::empty(shape, dtype, op);
  dispatch_all(dtype, [&](auto zero) {
    using T = decltype(zero);
    T* d = t.data<T>();
    std::fill(d, d + t.numel(), detail::from_double<T>(op, value));
  });
  return t;
}
}  // namespace

Tensor scalar_tensor(double value, Dtype dtype) { return filled("scalar_tensor", {}, value, dtype); }
Tensor full(const Shape& shape, double value, Dtype dtype) { return filled("full", shape, value, dtype); }
Tensor zeros(const Shape& shape, Dtype dtype) { return filled("zeros", shape, 0.0, dtype); }
Tensor ones(const Shape& shape, Dtype dtype) { return filled("ones", shape, 1.0, dtype); }
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), t.dtype()); }
Tensor ones_like(const Tensor& t) { return ones(t.shape(), t.dtype()); }

Tensor arange(double end, Dtype dtype) { return arange(0.0, end, 1.0, dtype); }

Tensor arange(double start, double end, double step, Dtype dtype) {
  if (step == 0.0 || !std::isfinite(step)) fail("arange", "step must be finite and nonzero, got {}", step);
  if (!std::isfinite(start) || !std::isfinite(end)) fail("arange", "bounds must be finite, got {} and {}", start, end);
  const double count = std::max(0.0, std::ceil((end - start) / step));
  // 2^63 is the first double past the largest count; an infinite count (end - start overflowed) is past it too.
  if (!(count < 0x1p63))
    fail("arange", "[{}, {}) in steps of {} holds {} values, more than a 64-bit count can hold", start, end, step,
         count);
  const auto n = static_cast<std::int64_t>(count);
  Tensor t = Tensor::empty({n}, dtype, "arange");
  dispatch_all(dtype, [&](auto zero) {
    using T = decltype(zero);
    T* d = t.data<T>();
    for (std::int64_t i = 0; i < n; ++i)
      d[i] = detail::from_double<T>("arange", start + static_cast<double>(i) * step);
  });
  return t;
}

}  // namespace autograd
