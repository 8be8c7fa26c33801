#pragma once
// The Eigen views that ops and kernels compute through (internal, not installed). Includes
// kernels/parallel.hpp, the thread loops and the work sizes below which they stay on one thread.
#include <cstdint>

#include <Eigen/Core>

#include "autograd/shape.hpp"
#include "autograd/tensor.hpp"
#include "kernels/parallel.hpp"

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

}  // namespace autograd
