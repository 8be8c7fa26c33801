#pragma once
// Shapes, argument checks and the error type every op throws on bad input.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "autograd/small_vector.hpp"

namespace autograd {

// A tensor's sizes, outermost first. Up to 6 dims live inside the object (no heap allocation);
// it converts to and from std::vector<std::int64_t>, and reads like one.
class Shape : public SmallVector<std::int64_t, 6> {
 public:
  using SmallVector::SmallVector;
  Shape() = default;
  Shape(const std::vector<std::int64_t>& v) : SmallVector(v.begin(), v.end()) {}  // NOLINT: implicit on purpose
  operator std::vector<std::int64_t>() const { return {begin(), end()}; }         // NOLINT: implicit on purpose

  friend bool operator==(const Shape& a, const Shape& b) {
    return static_cast<const SmallVector&>(a) == static_cast<const SmallVector&>(b);
  }
  friend bool operator==(const Shape& a, const std::vector<std::int64_t>& b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
  }
};

// "[2, 3]" — the form every error message uses.
std::string shape_str(const Shape& s);

// The element count of s. Only for shapes already checked (a tensor's own shape); a shape that
// comes from a caller or a file goes through checked_numel.
std::int64_t shape_numel(const Shape& s);

// Checked size arithmetic. Every element count, byte count and offset computed from a caller's
// numbers goes through these, so a size that does not fit in 64 bits is std::invalid_argument
// naming the op ("op: size overflow: 4611686018427387904 * 8 does not fit in 64 bits"), never a
// wrapped number.
std::int64_t checked_mul(std::string_view op, std::int64_t a, std::int64_t b);
std::int64_t checked_add(std::string_view op, std::int64_t a, std::int64_t b);
// The element count of s: throws (naming the op and the shape) when a dim is negative or the
// product does not fit in 64 bits. A shape with a zero size has no elements, but its other sizes
// must still multiply within 64 bits, so that every partial product of a shape (its strides, the
// outer and inner counts a kernel computes) fits: [2^62, 0] is a shape, [2^62, 4, 0] is not.
std::int64_t checked_numel(std::string_view op, const Shape& s);
// The same test without throwing, for callers that phrase their own message: the element count
// of s into numel, or false (numel unchanged) when checked_numel would throw.
bool numel_fits(const Shape& s, std::int64_t& numel);

// Row-major strides of a contiguous tensor of shape s (in elements).
Shape contiguous_strides(const Shape& s);

// Throws std::invalid_argument with the message "op: <formatted text>".
template <class... Args>
[[noreturn]] void fail(std::string_view op, fmt::format_string<Args...> f, Args&&... args) {
  throw std::invalid_argument(fmt::format("{}: {}", op, fmt::format(f, std::forward<Args>(args)...)));
}

// Maps a possibly negative dim into [0, rank) or throws naming the op.
std::int64_t normalize_dim(std::string_view op, std::int64_t dim, std::int64_t rank);

// NumPy broadcasting of two shapes; throws "op: shapes cannot be broadcast: [..] and [..]", or
// when the broadcast shape's sizes do not fit in 64 bits.
Shape broadcast_shapes(std::string_view op, const Shape& a, const Shape& b);

}  // namespace autograd
