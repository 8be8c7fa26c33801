#pragma once
// The argument checks the op files share (internal, not installed): that an argument is defined,
// and that it holds floating-point values. Includes the Eigen views of kernels/eigen_views.hpp,
// which every op file computes through.
#include <string_view>

#include "autograd/shape.hpp"
#include "autograd/tensor.hpp"
#include "kernels/eigen_views.hpp"

namespace autograd {

// ---- argument checks ----
// "op: <what> is an undefined tensor (default-constructed: no value)" when t holds no tensor
// (or "<what> is the .grad() of 'x' [2], which is undefined: ...": see undefined_description).
inline void check_defined(std::string_view op, const Tensor& t, std::string_view what = "the input") {
  if (!t.defined()) [[unlikely]]
    fail(op, "{} is {}", what, undefined_description(t));
}

// "op: needs a Float32 or Float64 tensor, got Int64 (shape [3]); convert with .to(Dtype::Float32)"
// (or "op: <what> needs ...")
// when t holds integers: the ops that compute with values (rather than move or compare them)
// call this before dispatch. t must be defined.
inline void check_floating(std::string_view op, const Tensor& t, std::string_view what = {}) {
  if (!is_floating(t.dtype())) [[unlikely]] {
    if (what.empty())
      fail(op, "needs a Float32 or Float64 tensor, got {} (shape {}); convert with .to(Dtype::Float32)",
           dtype_name(t.dtype()), shape_str(t.shape()));
    fail(op, "{} needs a Float32 or Float64 tensor, got {} (shape {}); convert with .to(Dtype::Float32)", what,
         dtype_name(t.dtype()), shape_str(t.shape()));
  }
}

}  // namespace autograd
