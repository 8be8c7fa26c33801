#pragma once
// fmt::print("{}", t) prints a tensor the way PyTorch does:
//   tensor([[1.0000, 2.0000],
//           [3.0000, 4.0000]], dtype=Float64, shape=[2, 2], grad_fn=<mul>)
// Large tensors are summarised with "..." (first and last 3 along each dim).
#include <string>

#include <fmt/format.h>

#include "autograd/tensor.hpp"

namespace autograd {
std::string to_string(const Tensor& t);
}

template <>
struct fmt::formatter<autograd::Tensor> : fmt::formatter<std::string_view> {
  fmt::format_context::iterator format(const autograd::Tensor& t, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(autograd::to_string(t), ctx);
  }
};

template <>
struct fmt::formatter<autograd::Dtype> : fmt::formatter<std::string_view> {
  fmt::format_context::iterator format(autograd::Dtype d, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(autograd::dtype_name(d), ctx);
  }
};
