// linear(x, W, b) = x·W + b as one op: the leading dims of x fold into the rows of one GEMM, the
// bias is broadcast into the output before the product is added to it, and backward is three
// products at most. The same values as matmul + add, with one graph node instead of four
// (reshape, matmul, add, reshape) and no intermediate tensor.
#include "autograd/graph.hpp"
#include "autograd/ops.hpp"
#include "ops/gemm.hpp"

namespace autograd {
namespace {

template <class T>
using Mat = Eigen::Map<RowMatrix<T>>;
template <class T>
using ConstMat = Eigen::Map<const RowMatrix<T>>;

void check_linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  if (!x.defined()) fail("linear", "input is an undefined tensor");
  if (!w.defined()) fail("linear", "weight is an undefined tensor");
  if (w.dim() != 2) fail("linear", "weight must be 2-D (in, out), got shape {}", shape_str(w.shape()));
  if (x.dim() < 1 || x.size(-1) != w.size(0))
    fail("linear", "input of shape {} does not end in the weight's in = {} (weight {})", shape_str(x.shape()),
         w.size(0), shape_str(w.shape()));
  if (x.dtype() != w.dtype())
    fail("linear", "dtypes differ: input {} and weight {}", dtype_name(x.dtype()), dtype_name(w.dtype()));
  if (b.defined()) {
    if (b.dim() != 1 || b.size(0) != w.size(1))
      fail("linear", "bias must have shape [{}] (the weight's out), got {}", w.size(1), shape_str(b.shape()));
    if (b.dtype() != w.dtype())
      fail("linear", "dtypes differ: bias {} and weight {}", dtype_name(b.dtype()), dtype_name(w.dtype()));
  }
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  check_linear(x, w, b);
  const std::int64_t in = w.size(0), out = w.size(1);
  std::int64_t rows = 1;
  for (std::int64_t d = 0; d + 1 < x.dim(); ++d) rows *= x.size(d);
  Shape out_shape = x.shape();
  out_shape.back() = out;
  Tensor y = Tensor::empty(out_shape, x.dtype());
  dispatch(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    if (b.defined())
      Mat<T>(y.data<T>(), rows, out).rowwise() = Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>>(b.data<T>(), out);
    gemm<T>(false, false, rows, out, in, T(1), x.data<T>(), in, w.data<T>(), out, b.defined() ? T(1) : T(0),
            y.data<T>(), out);
  });
  if (!needs_grad(x, w) && !needs_grad(b)) return y;
  // Y = X·W + 1·bᵀ (X the rows of x)  =>  dX = dY·Wᵀ,  dW = Xᵀ·dY,  db = Σ_rows dY
  SavedTensor saved_x(w.requires_grad() ? x : Tensor()), saved_w(x.requires_grad() ? w : Tensor());
  return record("linear", {x, w, b}, y, [saved_x, saved_w, rows, in, out](const TensorList& g, const Node& n) {
    GradList grads(3);
    dispatch(g[0].dtype(), [&](auto zero) {
      using T = decltype(zero);
      ConstMat<T> dY(g[0].data<T>(), rows, out);
      if (n.needs_input_grad(0)) {
        grads[0] = Tensor::empty(n.input_meta[0].shape, g[0].dtype());
        gemm<T>(false, true, rows, in, out, T(1), dY.data(), out, saved_w.get("linear").data<T>(), out, T(0),
                grads[0].data<T>(), in);  // dY·Wᵀ
      }
      if (n.needs_input_grad(1)) {
        grads[1] = Tensor::empty({in, out}, g[0].dtype());
        gemm<T>(true, false, in, out, rows, T(1), saved_x.get("linear").data<T>(), in, dY.data(), out, T(0),
                grads[1].data<T>(), out);  // Xᵀ·dY
      }
      if (n.needs_input_grad(2)) {
        grads[2] = Tensor::empty({out}, g[0].dtype());
        Eigen::Map<Eigen::Matrix<T, 1, Eigen::Dynamic>>(grads[2].data<T>(), out) = dY.colwise().sum();
      }
    });
    return grads;
  });
}

}  // namespace autograd
