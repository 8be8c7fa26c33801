#pragma once
// Runtime element types, and the one switch that turns a runtime dtype into a C++ type.
#include <cstdint>
#include <string_view>
#include <type_traits>

namespace autograd {

enum class Dtype : std::uint8_t { Float32, Float64 };

constexpr std::string_view dtype_name(Dtype d) { return d == Dtype::Float32 ? "Float32" : "Float64"; }
constexpr std::size_t dtype_size(Dtype d) { return d == Dtype::Float32 ? 4 : 8; }

template <class T>
constexpr Dtype dtype_of() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "headgrad stores float or double");
  return std::is_same_v<T, float> ? Dtype::Float32 : Dtype::Float64;
}

// Calls f(T{}) with T = float or double according to d. Kernels are written once as a
// generic lambda: dispatch(d, [&](auto zero) { using T = decltype(zero); ... });
template <class F>
decltype(auto) dispatch(Dtype d, F&& f) {
  if (d == Dtype::Float32) return f(float{});
  return f(double{});
}

}  // namespace autograd
