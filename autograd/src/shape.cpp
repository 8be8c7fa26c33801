#include "autograd/shape.hpp"

#include <algorithm>

namespace autograd {

std::string shape_str(const Shape& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

std::int64_t shape_numel(const Shape& s) {
  std::int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

std::int64_t checked_mul(std::string_view op, std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) fail(op, "size overflow: {} * {} does not fit in 64 bits", a, b);
  return r;
}

std::int64_t checked_add(std::string_view op, std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) fail(op, "size overflow: {} + {} does not fit in 64 bits", a, b);
  return r;
}

bool numel_fits(const Shape& s, std::int64_t& numel) {
  // Zero sizes are left out of the product, so that every partial product of a shape (the
  // strides and outer and inner counts a kernel computes) fits whenever the whole one does.
  std::int64_t n = 1;
  bool empty = false;
  for (auto d : s) {
    if (d < 0) return false;
    if (d == 0) {
      empty = true;
    } else if (__builtin_mul_overflow(n, d, &n)) {
      return false;
    }
  }
  numel = empty ? 0 : n;
  return true;
}

std::int64_t checked_numel(std::string_view op, const Shape& s) {
  std::int64_t n = 0;
  if (numel_fits(s, n)) return n;
  if (std::any_of(s.begin(), s.end(), [](std::int64_t d) { return d < 0; }))
    fail(op, "shape {} has a negative size", shape_str(s));
  if (std::find(s.begin(), s.end(), 0) != s.end())
    fail(op, "shape {} has no elements, but its other sizes multiply past what a 64-bit count can hold",
         shape_str(s));
  fail(op, "shape {} has more elements than a 64-bit count can hold", shape_str(s));
}

Shape contiguous_strides(const Shape& s) {
  Shape strides(s.size(), 1);
  for (std::int64_t i = static_cast<std::int64_t>(s.size()) - 2; i >= 0; --i)
    strides[i] = strides[i + 1] * s[i + 1];
  return strides;
}

std::int64_t normalize_dim(std::string_view op, std::int64_t dim, std::int64_t rank) {
  const std::int64_t lo = -std::max<std::int64_t>(rank, 1), hi = std::max<std::int64_t>(rank, 1) - 1;
  if (dim < lo || dim > hi) fail(op, "dim {} is out of range for a tensor of rank {}", dim, rank);
  return dim < 0 ? dim + std::max<std::int64_t>(rank, 1) : dim;
}

Shape broadcast_shapes(std::string_view op, const Shape& a, const Shape& b) {
  const std::size_t n = std::max(a.size(), b.size());
  Shape out(n);
  bool same = a.size() == b.size();
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const std::int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db) {
      if (da != 1 && db != 1) fail(op, "shapes cannot be broadcast: {} and {}", shape_str(a), shape_str(b));
      same = false;
    }
    out[i] = da == 1 ? db : da;
  }
  // Two shapes that fit can broadcast to one that does not ([2^62, 1, 0] and [1, 8, 0]); equal
  // shapes broadcast to themselves.
  std::int64_t numel = 0;
  if (!same && !numel_fits(out, numel))
    fail(op, "shapes {} and {} broadcast to {}, whose sizes multiply past what a 64-bit count can hold",
         shape_str(a), shape_str(b), shape_str(out));
  return out;
}

}  // namespace autograd
