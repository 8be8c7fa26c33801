#pragma once
// A tensor's elements seen as a flat Eigen array, no copy (for the optimizers and clipping).
#include <Eigen/Core>

#include <autograd/autograd.hpp>

namespace nn::detail {

template <class T>
using ArrayMap = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>;

// T must be the tensor's element type (checked by Tensor::data).
template <class T>
ArrayMap<T> array_of(const autograd::Tensor& t) {
  return ArrayMap<T>(t.data<T>(), t.numel());
}

}  // namespace nn::detail
