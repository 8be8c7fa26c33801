// linear(x, W, b) = x·W + b as one op: the leading dims of x fold into the rows of one GEMM, the
// bias is broadcast into the output before the product is added to it, and backward is two
// products and a column sum at most. The same values as matmul + add, with one graph node instead of four
// (reshape, matmul, add, reshape) and no intermediate tensor.
#include <array>

#include "autograd/grad_mode.hpp"
#include "autograd/graph.hpp"
#include "autograd/ops.hpp"
#include "kernels/gemm.hpp"
#include "ops/checks.hpp"

namespace autograd {
namespace {

void check_linear(const Tensor& x, const Tensor& w, const Tensor& b, std::string_view op = "linear") {
  check_defined(op, x, "input");
  check_defined(op, w, "weight");
  check_floating(op, x, "input");
  check_floating(op, w, "weight");
  if (w.dim() != 2) fail(op, "weight must be 2-D (in, out), got shape {}", shape_str(w.shape()));
  if (x.dim() < 1 || x.size(-1) != w.size(0))
    fail(op, "input of shape {} does not end in the weight's in = {} (weight {})", shape_str(x.shape()),
         w.size(0), shape_str(w.shape()));
  if (x.dtype() != w.dtype())
    fail(op, "dtypes differ: input {} and weight {}", dtype_name(x.dtype()), dtype_name(w.dtype()));
  if (b.defined()) {
    if (b.dim() != 1 || b.size(0) != w.size(1))
      fail(op, "bias must have shape [{}] (the weight's out), got {}", w.size(1), shape_str(b.shape()));
    if (b.dtype() != w.dtype())
      fail(op, "dtypes differ: bias {} and weight {}", dtype_name(b.dtype()), dtype_name(w.dtype()));
  }
}

// The output's shape: x's with the last dim `out`; throws naming the op when its sizes multiply
// past a 64-bit count (the message names the weights; formatted only then, so a call allocates nothing).
Shape output_shape(std::string_view op, const Tensor& x, std::int64_t out, const Tensor* w) {
  Shape shape = x.shape();
  shape.back() = out;
  std::int64_t numel = 0;
  if (!numel_fits(shape, numel))
    fail(op, "input {} and {} give shape {}, more elements than a 64-bit count can hold", shape_str(x.shape()),
         w != nullptr ? "weight " + shape_str(w->shape()) : fmt::format("weights of {} columns", out),
         shape_str(shape));
  return shape;
}

constexpr std::size_t kMaxCat = 4;  // weights of one linear_cat

// linear's gradients composed of differentiable ops, for a backward that builds a graph:
// dX = dY·Wᵀ, dW = Xᵀ·dY, db = Σ_rows dY, with X and dY seen as (rows, in) and (rows, out).
GradList linear_composed(const Tensor& g, const Node& n, const SavedTensor& saved_x, const SavedTensor& saved_w,
                         std::int64_t rows, std::int64_t in, std::int64_t out) {
  GradList grads(3);
  const Tensor dY = reshape(g, {rows, out});
  if (n.needs_input_grad(0))
    grads[0] = reshape(matmul(dY, transpose(saved_w.get("linear"), 0, 1)), n.input_meta[0].shape);
  if (n.needs_input_grad(1)) grads[1] = matmul(transpose(reshape(saved_x.get("linear"), {rows, in}), 0, 1), dY);
  if (n.needs_input_grad(2)) grads[2] = sum(dY, 0);
  return grads;
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  check_linear(x, w, b);
  const std::int64_t in = w.size(0), out = w.size(1);
  std::int64_t rows = 1;
  for (std::int64_t d = 0; d + 1 < x.dim(); ++d) rows *= x.size(d);
  const Shape out_shape = output_shape("linear", x, out, &w);
  Tensor y = Tensor::empty(out_shape, x.dtype(), "linear");
  dispatch(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    if (b.defined())
      MatrixView<T>(y.data<T>(), rows, out).rowwise() = Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>>(b.data<T>(), out);
    gemm<T>(false, false, rows, out, in, T(1), x.data<T>(), in, w.data<T>(), out, b.defined() ? T(1) : T(0),
            y.data<T>(), out);
  });
  if (!needs_grad(x, w) && !needs_grad(b)) return y;
  // Y = X·W + 1·bᵀ (X the rows of x)  =>  dX = dY·Wᵀ,  dW = Xᵀ·dY,  db = Σ_rows dY
  SavedTensor saved_x(w.requires_grad() ? x : Tensor()), saved_w(x.requires_grad() ? w : Tensor());
  return record("linear", {x, w, b}, y, [saved_x, saved_w, rows, in, out](const TensorList& g, const Node& n) {
    if (is_grad_enabled()) return linear_composed(g[0], n, saved_x, saved_w, rows, in, out);
    GradList grads(3);
    dispatch(g[0].dtype(), [&](auto zero) {
      using T = decltype(zero);
      ConstMatrixView<T> dY(g[0].data<T>(), rows, out);
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

namespace {

// Where each piece of linear_cat's output lies: piece i is columns [offset[i], offset[i + 1]).
struct CatLayout {
  std::size_t n = 0;
  std::array<std::int64_t, kMaxCat + 1> offset{};
  std::int64_t rows = 1, in = 0, out = 0;
  std::int64_t cols(std::size_t i) const { return offset[i + 1] - offset[i]; }
};

// y = x·[W_0 | W_1 | …] + [b_0 | b_1 | …]; w receives the packed weight (kept for dX).
template <class T>
void linear_cat_forward(const Tensor& x, std::span<const Tensor> weights, std::span<const Tensor> biases,
                        const CatLayout& l, Tensor& y, Tensor& w) {
  MatrixView<T> packed(w.data<T>(), l.in, l.out);
  for (std::size_t i = 0; i < l.n; ++i)
    packed.middleCols(l.offset[i], l.cols(i)) = ConstMatrixView<T>(weights[i].data<T>(), l.in, l.cols(i));
  bool any_bias = false;
  for (const auto& b : biases) any_bias = any_bias || b.defined();
  if (any_bias && l.rows > 0) {  // every row of y starts as [b_0 | b_1 | …]
    MatrixView<T> ys(y.data<T>(), l.rows, l.out);
    for (std::size_t i = 0; i < l.n; ++i) {
      auto first = ys.row(0).segment(l.offset[i], l.cols(i));
      if (biases[i].defined()) {
        first = Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>>(biases[i].data<T>(), first.size());
      } else {
        first.setZero();
      }
    }
    ys.bottomRows(l.rows - 1).rowwise() = ys.row(0);
  }
  gemm<T>(false, false, l.rows, l.out, l.in, T(1), x.data<T>(), l.in, w.data<T>(), l.out, any_bias ? T(1) : T(0),
          y.data<T>(), l.out);
}

// Y = X·W + 1·bᵀ with W = [W_0 | W_1 | …], b = [b_0 | b_1 | …]  =>  dX = dY·Wᵀ,
// dW = Xᵀ·dY, so dW_i = the columns of piece i of dW;  db_i = Σ_rows of dY's columns of piece i.
// Inputs: x, then the n weights, then the n biases.
template <class T>
void linear_cat_backward(const Tensor& g, const Node& node, const CatLayout& l, const SavedTensor& saved_x,
                         const SavedTensor& saved_w, InlineTensorList<1 + 2 * kMaxCat>& grads) {
  ConstMatrixView<T> dY(g.data<T>(), l.rows, l.out);
  if (node.needs_input_grad(0)) {
    grads[0] = Tensor::empty(node.input_meta[0].shape, g.dtype());
    gemm<T>(false, true, l.rows, l.in, l.out, T(1), dY.data(), l.out, saved_w.get("linear_cat").data<T>(), l.out,
            T(0), grads[0].data<T>(), l.in);  // dY·Wᵀ
  }
  bool any_dw = false;
  for (std::size_t i = 0; i < l.n; ++i) any_dw = any_dw || node.needs_input_grad(1 + i);
  if (any_dw) {
    Tensor dw = Tensor::empty({l.in, l.out}, g.dtype());
    gemm<T>(true, false, l.in, l.out, l.rows, T(1), saved_x.get("linear_cat").data<T>(), l.in, dY.data(), l.out,
            T(0), dw.data<T>(), l.out);  // Xᵀ·dY
    ConstMatrixView<T> dws(dw.data<T>(), l.in, l.out);
    for (std::size_t i = 0; i < l.n; ++i) {
      if (!node.needs_input_grad(1 + i)) continue;
      grads[1 + i] = Tensor::empty({l.in, l.cols(i)}, g.dtype());
      MatrixView<T>(grads[1 + i].data<T>(), l.in, l.cols(i)) = dws.middleCols(l.offset[i], l.cols(i));
    }
  }
  for (std::size_t i = 0; i < l.n; ++i) {
    if (!node.needs_input_grad(1 + l.n + i)) continue;
    grads[1 + l.n + i] = Tensor::empty({l.cols(i)}, g.dtype());
    Eigen::Map<Eigen::Matrix<T, 1, Eigen::Dynamic>>(grads[1 + l.n + i].data<T>(), l.cols(i)) =
        dY.middleCols(l.offset[i], l.cols(i)).colwise().sum();
  }
}

using CatGrads = InlineTensorList<1 + 2 * kMaxCat>;
using CatWeights = std::array<SavedTensor, kMaxCat>;

// linear_cat's gradients composed of differentiable ops, for a backward that builds a graph:
// with dY_i the columns of piece i, dX = Σ_i dY_i·W_iᵀ, dW_i = Xᵀ·dY_i, db_i = Σ_rows dY_i.
// The weights come from their own saved tensors (the packed copy has no graph).
void linear_cat_composed(const Tensor& g, const Node& node, const CatLayout& l, const SavedTensor& saved_x,
                         const CatWeights& saved_ws, CatGrads& grads) {
  constexpr std::string_view op = "linear_cat";
  const Tensor dY = reshape(g, {l.rows, l.out});
  // The pieces, cut once: one split (whose own backward is one cat), not a narrow per use.
  std::vector<std::int64_t> sizes;
  for (std::size_t i = 0; i < l.n; ++i) sizes.push_back(l.cols(i));
  const TensorList pieces = l.n == 1 ? TensorList{dY} : split(dY, sizes, 1);
  auto piece = [&](std::size_t i) -> const Tensor& { return pieces[i]; };
  if (node.needs_input_grad(0)) {
    Tensor dx;
    for (std::size_t i = 0; i < l.n; ++i) {
      const Tensor term = matmul(piece(i), transpose(saved_ws[i].get(op), 0, 1));
      dx = dx.defined() ? add(dx, term) : term;
    }
    grads[0] = reshape(dx, node.input_meta[0].shape);
  }
  Tensor xt;  // Xᵀ, (in, rows)
  for (std::size_t i = 0; i < l.n; ++i) {
    if (!node.needs_input_grad(1 + i)) continue;
    if (!xt.defined()) xt = transpose(reshape(saved_x.get(op), {l.rows, l.in}), 0, 1);
    grads[1 + i] = matmul(xt, piece(i));
  }
  for (std::size_t i = 0; i < l.n; ++i)
    if (node.needs_input_grad(1 + l.n + i)) grads[1 + l.n + i] = sum(piece(i), 0);
}

}  // namespace

Tensor linear_cat(const Tensor& x, std::span<const Tensor> weights, std::span<const Tensor> biases) {
  constexpr std::string_view op = "linear_cat";
  const std::size_t n = weights.size();
  if (n == 0 || n > kMaxCat) fail(op, "needs 1 to {} weights, got {}", kMaxCat, n);
  if (!biases.empty() && biases.size() != n)
    fail(op, "needs no biases or one per weight ({}), got {}", n, biases.size());
  // inputs: x, the weights, the biases (undefined where none was given)
  std::array<Tensor, 1 + 2 * kMaxCat> all_inputs;
  all_inputs[0] = x;
  for (std::size_t i = 0; i < n; ++i) {
    all_inputs[1 + i] = weights[i];
    if (!biases.empty()) all_inputs[1 + n + i] = biases[i];
  }
  const std::span<const Tensor> bias_list(all_inputs.data() + 1 + n, n);
  CatLayout l;
  l.n = n;
  for (std::size_t i = 0; i < n; ++i) {
    check_linear(x, weights[i], bias_list[i], op);
    l.offset[i + 1] = checked_add(op, l.offset[i], weights[i].size(1));
  }
  l.in = x.size(-1);
  l.out = l.offset[n];
  for (std::int64_t d = 0; d + 1 < x.dim(); ++d) l.rows *= x.size(d);
  const Shape out_shape = output_shape(op, x, l.out, nullptr);
  Tensor y = Tensor::empty(out_shape, x.dtype(), op);
  Tensor w = Tensor::empty({l.in, l.out}, x.dtype(), op);  // [W_0 | W_1 | …]
  dispatch(x.dtype(), [&](auto zero) { linear_cat_forward<decltype(zero)>(x, weights, bias_list, l, y, w); });

  const std::span<const Tensor> inputs(all_inputs.data(), 1 + 2 * n);
  if (!needs_grad(inputs)) return y;
  bool any_weight_grad = false;
  for (std::size_t i = 0; i < n; ++i) any_weight_grad = any_weight_grad || weights[i].requires_grad();
  SavedTensor saved_x(any_weight_grad ? x : Tensor()), saved_w(x.requires_grad() ? w : Tensor());
  CatWeights saved_ws;  // for the composed dX
  if (x.requires_grad())
    for (std::size_t i = 0; i < n; ++i) saved_ws[i] = SavedTensor(weights[i]);
  record(op, inputs, std::span<const Tensor>(&y, 1),
         [saved_x, saved_w, saved_ws, l](const TensorList& g, const Node& node) {
    CatGrads grads(1 + 2 * l.n);
    if (is_grad_enabled()) {
      linear_cat_composed(g[0], node, l, saved_x, saved_ws, grads);
      return grads;
    }
    dispatch(g[0].dtype(),
             [&](auto zero) { linear_cat_backward<decltype(zero)>(g[0], node, l, saved_x, saved_w, grads); });
    return grads;
  });
  return y;
}

}  // namespace autograd
