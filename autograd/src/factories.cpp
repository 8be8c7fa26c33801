// The tensor factories: tensors made from values, filled with one value, or counting.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

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

namespace {
// v holds an integer in the Int64 range (so converts to it exactly).
bool integral_int64(double v) { return v == std::trunc(v) && v >= -0x1p63 && v < 0x1p63; }
}  // namespace

Tensor arange(double start, double end, double step, Dtype dtype) {
  if (step == 0.0 || !std::isfinite(step)) fail("arange", "step must be finite and nonzero, got {}", step);
  if (!std::isfinite(start) || !std::isfinite(end)) fail("arange", "bounds must be finite, got {} and {}", start, end);
  // Into Int64, integers count exactly (start + i·step in doubles repeats values past 2^53).
  if (dtype == Dtype::Int64 && integral_int64(start) && integral_int64(end) && integral_int64(step))
    return detail::arange_exact(static_cast<std::int64_t>(start), static_cast<std::int64_t>(end),
                                static_cast<std::int64_t>(step), dtype);
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

namespace detail {

void arange_argument_out_of_range(const char* what, std::uint64_t value) {
  fail("arange", "{} {} is outside the Int64 range", what, value);
}

Tensor arange_exact(std::int64_t start, std::int64_t end, std::int64_t step, Dtype dtype) {
  if (step == 0) fail("arange", "step must be nonzero, got 0");
  // The count of start + i·step in [start, end) (or (end, start] going down), in unsigned 64-bit
  // arithmetic: the distance between two int64s and the step's size both fit there.
  const bool up = step > 0;
  const auto ustart = static_cast<std::uint64_t>(start), uend = static_cast<std::uint64_t>(end);
  const std::uint64_t size = up ? static_cast<std::uint64_t>(step) : std::uint64_t{0} - static_cast<std::uint64_t>(step);
  std::uint64_t count = 0;
  if (up ? end > start : end < start) {
    const std::uint64_t distance = up ? uend - ustart : ustart - uend;
    count = distance / size + (distance % size != 0 ? 1 : 0);
  }
  if (count > static_cast<std::uint64_t>(INT64_MAX))
    fail("arange", "[{}, {}) in steps of {} holds {} values, more than a 64-bit count can hold", start, end, step,
         count);
  const auto n = static_cast<std::int64_t>(count);
  Tensor t = Tensor::empty({n}, dtype, "arange");
  dispatch_all(dtype, [&](auto zero) {
    using T = decltype(zero);
    T* d = t.data<T>();
    // Each value lies in the range, so the wrapping unsigned sum is the exact value.
    const auto ustep = static_cast<std::uint64_t>(step);
    for (std::int64_t i = 0; i < n; ++i) {
      const auto v = static_cast<std::int64_t>(ustart + static_cast<std::uint64_t>(i) * ustep);
      if constexpr (std::is_same_v<T, std::int64_t>) d[i] = v;
      else d[i] = static_cast<T>(static_cast<double>(v));
    }
  });
  return t;
}

}  // namespace detail

}  // namespace autograd
