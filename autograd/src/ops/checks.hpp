#pragma once
// The argument checks the op files share (internal, not installed): that an argument is defined,
// and that it holds floating-point values; and grad_if, for rules with several inputs. Includes
// the Eigen views of kernels/eigen_views.hpp, which every op file computes through.
#include <string_view>

#include "autograd/graph.hpp"
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

// x is defined and holds floats: the one-tensor form of both checks. `what` names x in the dtype
// message: empty for a one-input op, "argument" beside a scalar (add(x, 2.0)).
inline void check_defined_arg(std::string_view op, const Tensor& x, std::string_view what = {}) {
  check_defined(op, x, "argument");
  check_floating(op, x, what);
}

// ---- backward rules ----
// The gradient of input i, or an undefined tensor (no gradient) when nobody needs it.
template <class F>
Tensor grad_if(const Node& node, std::size_t i, F&& f) {
  return node.needs_input_grad(i) ? f() : Tensor();
}

}  // namespace autograd
