#pragma once
// What the shape, join and indexing ops share (internal, not installed).
#include <cstddef>
#include <cstdint>

#include "autograd/shape.hpp"
#include "autograd/tensor.hpp"

namespace autograd {

// The product of s[begin, end): an outer or inner count of a tensor's own shape. It fits in 64
// bits because the tensor's shape passed checked_numel, whose rule covers every partial product.
inline std::int64_t product(const Shape& s, std::size_t begin, std::size_t end) {
  std::int64_t n = 1;
  for (std::size_t i = begin; i < end; ++i) n *= s[i];
  return n;
}

// A new TensorImpl of another shape (of the same element count) over x's Storage, like
// Tensor::detach; not recorded in any graph.
Tensor view_as_shape(const Tensor& x, const Shape& shape);

}  // namespace autograd
