#pragma once
// What the op files share (internal, not installed): the Eigen views they compute through, the
// work sizes below which a loop stays on one thread, and the check that an argument is defined.
#include <cstdint>
#include <string_view>

#include <Eigen/Core>

#include "autograd/shape.hpp"
#include "autograd/tensor.hpp"
#include "ops/parallel.hpp"

namespace autograd {

// ---- Eigen views of tensor storage (row-major, like every tensor) ----
// MatrixMap / ConstMatrixMap (tensor.hpp) assume the 64-byte aligned start of a buffer; these
// view any element of it (a slice, a row, a head).
template <class T>
using MatrixView = Eigen::Map<RowMatrix<T>>;
template <class T>
using ConstMatrixView = Eigen::Map<const RowMatrix<T>>;
template <class T>
using Array1 = Eigen::Array<T, Eigen::Dynamic, 1>;
template <class T>
using ArrayView = Eigen::Map<Array1<T>>;
template <class T>
using ConstArrayView = Eigen::Map<const Array1<T>>;

// ---- when to use the threads ----
// Below these sizes a loop runs on one thread: starting the threads costs more than they save.
inline constexpr std::int64_t kParallelElementwise = 32768;  // elements computed by a map or softmax
inline constexpr std::int64_t kParallelCopy = 1 << 16;        // elements moved by a copy or gather
inline constexpr std::int64_t kParallelFlops = 1 << 16;       // multiply-adds of a batch of products

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

// check_defined and check_floating together: the usual first line of a floating-point op.
inline void check_float_input(std::string_view op, const Tensor& t, std::string_view what = "the input") {
  check_defined(op, t, what);
  check_floating(op, t, what == "the input" ? std::string_view{} : what);
}

}  // namespace autograd
