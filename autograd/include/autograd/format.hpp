#pragma once
// fmt::print("{}", t) prints a tensor the way PyTorch does (torch.set_printoptions' defaults):
//   tensor([[ 1.0000, -2.5000],
//           [ 3.0000,  4.0000]], dtype=Float64, shape=[2, 2], grad_fn=<mul>)
// Every element is right-aligned to the widest one; a row wider than 80 columns wraps onto
// further lines; a tensor of more than 1000 elements is summarised with "..." (the first and last
// 3 along each dim); fixed-point with 4 decimals, or scientific when the nonzero finite values
// span more than a factor 1000, or one is above 1e8 or below 1e-4 in magnitude; the suffixes wrap
// onto a new line when they would pass column 80. One difference: a float tensor whose values
// are all integers prints 1.0000 where PyTorch prints "1.".
// An Int64 tensor prints its integers exactly, right-aligned, no decimal point, never scientific:
//   tensor([[  3,  -1],
//           [ 10, 250]], dtype=Int64, shape=[2, 2])
#include <cstdint>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "autograd/tensor.hpp"

namespace autograd {

// PyTorch's torch.set_printoptions, passed per call (no global state, so printing is thread-safe).
struct PrintOptions {
  int precision = 4;                // digits after the decimal point, in [0, 30]
  std::int64_t threshold = 1000;    // more elements than this: summarise (>= 0)
  std::int64_t edgeitems = 3;       // elements shown at each end of a summarised dim (>= 0)
  int linewidth = 80;               // columns before a row wraps (>= 1)
  std::optional<bool> sci_mode = std::nullopt;  // unset: chosen from the values as above
};

std::string to_string(const Tensor& t);
// Throws std::invalid_argument naming the option when one is out of range.
std::string to_string(const Tensor& t, const PrintOptions& options);

}  // namespace autograd

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
