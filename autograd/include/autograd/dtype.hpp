#pragma once
// Runtime element types, and the switches that turn a runtime dtype into a C++ type.
//
// Float32 and Float64 hold values that can be differentiated; Int64 holds integers (indices,
// class targets, the results of argmax and the comparisons) and never requires grad.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

namespace autograd {

enum class Dtype : std::uint8_t { Float32, Float64, Int64 };

constexpr std::string_view dtype_name(Dtype d) {
  return d == Dtype::Float32 ? "Float32" : d == Dtype::Float64 ? "Float64" : "Int64";
}
constexpr std::size_t dtype_size(Dtype d) { return d == Dtype::Float32 ? 4 : 8; }
constexpr bool is_floating(Dtype d) { return d != Dtype::Int64; }

template <class T>
constexpr Dtype dtype_of() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, std::int64_t>,
                "headgrad stores float, double or std::int64_t");
  return std::is_same_v<T, float> ? Dtype::Float32 : std::is_same_v<T, double> ? Dtype::Float64 : Dtype::Int64;
}

// Calls f(T{}) with T = float or double according to d. Kernels are written once as a
// generic lambda: dispatch(d, [&](auto zero) { using T = decltype(zero); ... });
// An Int64 d is std::invalid_argument: a floating-point kernel never runs on integer data (ops
// check their arguments first and name themselves; this is the last line of defence).
template <class F>
decltype(auto) dispatch(Dtype d, F&& f) {
  if (d == Dtype::Float32) return f(float{});
  if (d == Dtype::Int64) [[unlikely]]
    throw std::invalid_argument(std::string("dispatch: a floating-point kernel was asked to run on ") +
                                std::string(dtype_name(d)) + " data (convert with .to(Dtype::Float32))");
  return f(double{});
}

// Calls f(T{}) with T = float, double or std::int64_t according to d: for kernels that only
// move or compare values, and so work on every dtype.
template <class F>
decltype(auto) dispatch_all(Dtype d, F&& f) {
  if (d == Dtype::Float32) return f(float{});
  if (d == Dtype::Int64) return f(std::int64_t{});
  return f(double{});
}

}  // namespace autograd
