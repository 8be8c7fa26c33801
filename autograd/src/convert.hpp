#pragma once
// Converting values between dtypes (internal): what to(), copy_(), fill_() and the factories
// share. Into Int64 a value is truncated toward zero, as PyTorch converts; a value with no
// integer to truncate to (NaN, ±inf, or outside the 64-bit range) is an error naming it.
#include <cmath>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "autograd/shape.hpp"

namespace autograd::detail {

// v truncated toward zero, for `op`; `where` says which value it is, for the message.
inline std::int64_t to_int64(std::string_view op, double v, std::int64_t where = -1) {
  // [-2^63, 2^63) are the doubles whose truncation fits; NaN fails both comparisons.
  if (!(v >= -0x1p63 && v < 0x1p63)) [[unlikely]] {
    if (where >= 0) fail(op, "value {} at position {} cannot be converted to Int64 (not finite or out of range)", v, where);
    fail(op, "value {} cannot be converted to Int64 (not finite or out of range)", v);
  }
  return static_cast<std::int64_t>(std::trunc(v));
}

// d[i] = s[i] converted to D, for n values. Into Int64 every value is checked before any is
// written, so a value that cannot convert leaves d as it was.
template <class S, class D>
void convert_values(std::string_view op, const S* s, D* d, std::int64_t n) {
  if constexpr (std::is_same_v<D, std::int64_t> && !std::is_same_v<S, std::int64_t>) {
    for (std::int64_t i = 0; i < n; ++i) (void)to_int64(op, static_cast<double>(s[i]), i);
    for (std::int64_t i = 0; i < n; ++i) d[i] = static_cast<std::int64_t>(std::trunc(static_cast<double>(s[i])));
  } else {
    for (std::int64_t i = 0; i < n; ++i) d[i] = static_cast<D>(s[i]);
  }
}

// value as a T, for fill-like factories.
template <class T>
T from_double(std::string_view op, double value) {
  if constexpr (std::is_same_v<T, std::int64_t>) return to_int64(op, value);
  else return static_cast<T>(value);
}

}  // namespace autograd::detail
