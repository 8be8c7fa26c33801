#pragma once
// The backward op of softmax (internal), for other ops whose derivative goes through a softmax.
#include <cstdint>

#include "autograd/tensor.hpp"

namespace autograd {

// dx = y ⊙ (dy − Σ dy ⊙ y) along dim, for y = softmax(x, dim): softmax's backward as a recorded
// op, differentiable in dy and y (zero on the rows where y is all zeros, fully masked rows).
// dy must have y's shape and dtype.
Tensor softmax_backward(const Tensor& dy, const Tensor& y, std::int64_t dim);

}  // namespace autograd
