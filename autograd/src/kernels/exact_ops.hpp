#pragma once
// Float32 elementwise arithmetic on tensors through the instruction-set loops of exact.hpp
// (internal, not installed). Each returns an undefined tensor, having done nothing, for float64
// or while the generic variant is in use; the caller then computes the same with Eigen.
#include "autograd/tensor.hpp"
#include "kernels/exact.hpp"

namespace autograd::exact {

// a ∘ b broadcast to `shape` (the caller has checked the shapes and dtypes).
Tensor binary(Op op, const Shape& shape, const Tensor& a, const Tensor& b);
// a ∘ c, and c ∘ a, for a number c (as a float).
Tensor with_scalar(Op op, const Tensor& a, double c);
Tensor scalar_first(Op op, const Tensor& a, double c);

}  // namespace autograd::exact
