#pragma once
// Shapes, argument checks and the error type every op throws on bad input.
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace autograd {

using Shape = std::vector<std::int64_t>;

// "[2, 3]" — the form every error message uses.
std::string shape_str(const Shape& s);

std::int64_t shape_numel(const Shape& s);

// Row-major strides of a contiguous tensor of shape s (in elements).
Shape contiguous_strides(const Shape& s);

// Throws std::invalid_argument with the message "op: <formatted text>".
template <class... Args>
[[noreturn]] void fail(std::string_view op, fmt::format_string<Args...> f, Args&&... args) {
  throw std::invalid_argument(fmt::format("{}: {}", op, fmt::format(f, std::forward<Args>(args)...)));
}

// Maps a possibly negative dim into [0, rank) or throws naming the op.
std::int64_t normalize_dim(std::string_view op, std::int64_t dim, std::int64_t rank);

// NumPy broadcasting of two shapes; throws "op: shapes cannot be broadcast: [..] and [..]".
Shape broadcast_shapes(std::string_view op, const Shape& a, const Shape& b);

}  // namespace autograd
