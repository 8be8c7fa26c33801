// linear(x, W, b) = x·W + b as one op: the leading dims of x fold into the rows of one GEMM, the
// bias is broadcast into the output before the product is added to it, and backward is two
// products and a column sum at most. The same values as matmul + add, with one graph node instead of four
// (reshape, matmul, add, reshape) and no intermediate tensor.
#include <array>
#include <utility>

#include "autograd/grad_mode.hpp"
#include "autograd/graph.hpp"
#include "autograd/ops.hpp"
#include "kernels/gemm.hpp"
#include "ops/checks.hpp"
#include "ops/product.hpp"

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

// Y = X·W + 1·bᵀ (X the rows of x)  =>  dX = dY·Wᵀ,  dW = Xᵀ·dY,  db = Σ_rows dY;
// dX and dW are the gradients of the product X·W (product.hpp), whose derivative is its own.
// Forward mode: Ẏ = Ẋ·W + X·Ẇ + 1·ḃᵀ. x is saved when W requires grad, W when x does: what
// each term needs.
struct LinearRule {
  SavedTensor x, w;
  std::int64_t rows, in, out;

  GradList operator()(const TensorList& g, const Node& n) const {
    const MatmulPlan plan = folded_plan(n.input_meta[0].shape, in, out);
    return GradList{grad_if(n, 0, [&] { return product(Slot::A, plan, w.get("linear"), g[0]); }),
                    grad_if(n, 1, [&] { return product(Slot::B, plan, x.get("linear"), g[0]); }),
                    grad_if(n, 2, [&] { return sum(reshape(g[0], {rows, out}), 0); })};
  }

  GradList tangents(const TensorList& t, const Node& n, std::uint64_t) const {
    Tensor y;
    if (t[0].defined()) y = linear(t[0], w.get("linear"), t[2]);
    if (t[1].defined()) {
      const Tensor xw = linear(x.get("linear"), t[1], y.defined() ? Tensor() : t[2]);
      y = y.defined() ? add(y, xw) : xw;
    }
    if (!y.defined()) y = add(zeros(n.output_meta[0].shape, n.output_meta[0].dtype), t[2]);
    return GradList{y};
  }
};

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
  SavedTensor saved_x(w.requires_grad() ? x : Tensor()), saved_w(x.requires_grad() ? w : Tensor());
  return record("linear", {x, w, b}, y, LinearRule{std::move(saved_x), std::move(saved_w), rows, in, out});
}

namespace {

// Where each piece of linear_cat's output lies: piece i is columns [offset[i], offset[i + 1]).
struct CatLayout {
  std::size_t n = 0;
  std::array<std::int64_t, kMaxCat + 1> offset{};
  std::int64_t rows = 1, in = 0, out = 0;
  std::int64_t cols(std::size_t i) const { return offset[i + 1] - offset[i]; }
};

// w = [W_0 | W_1 | …], on plain tensors.
template <class T>
void pack_weights(std::span<const Tensor> weights, const CatLayout& l, Tensor& w) {
  MatrixView<T> packed(w.data<T>(), l.in, l.out);
  for (std::size_t i = 0; i < l.n; ++i)
    packed.middleCols(l.offset[i], l.cols(i)) = ConstMatrixView<T>(weights[i].data<T>(), l.in, l.cols(i));
}

// The piece i of a gradient t of the packed weight (dim 1) or bias (dim 0): its columns of piece i.
Tensor piece(const Tensor& t, std::int64_t dim, const CatLayout& l, std::size_t i) {
  return l.n == 1 ? t : narrow(t, dim, l.offset[i], l.cols(i));
}

// The packed weight W = [W_0 | W_1 | …] as a differentiable op, for linear_cat's dX.
// W = [W_0 | W_1 | …]  =>  dW_i = the columns of piece i of dW
Tensor packed_weight(std::span<const Tensor> weights, const CatLayout& l) {
  Tensor w = Tensor::empty({l.in, l.out}, weights[0].dtype(), "linear_cat");
  dispatch(w.dtype(), [&](auto zero) { pack_weights<decltype(zero)>(weights, l, w); });
  if (!needs_grad(weights)) return w;
  record("linear_cat_pack", weights, std::span<const Tensor>(&w, 1), [l](const TensorList& g, const Node& n) {
    GradList grads(l.n);
    for (std::size_t i = 0; i < l.n; ++i)
      if (n.needs_input_grad(i)) grads[i] = piece(g[0], 1, l, i);
    return grads;
  });
  return w;
}

// y = x·[W_0 | W_1 | …] + [b_0 | b_1 | …]; w receives the packed weight.
template <class T>
void linear_cat_forward(const Tensor& x, std::span<const Tensor> weights, std::span<const Tensor> biases,
                        const CatLayout& l, Tensor& y, Tensor& w) {
  pack_weights<T>(weights, l, w);
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

using CatGrads = InlineTensorList<1 + 2 * kMaxCat>;
using CatWeights = std::array<SavedTensor, kMaxCat>;

// Y = X·W + 1·bᵀ with W = [W_0 | W_1 | …], b = [b_0 | b_1 | …]  =>  dX = dY·Wᵀ,  dW = Xᵀ·dY,
// db = Σ_rows dY, and dW_i, db_i are the columns of piece i of dW, db. dX and dW are the
// gradients of the product X·W (product.hpp), whose derivative is its own. dX reads the
// forward's packed W; when a graph of the backward is built, W is packed again from the
// weights as a recorded op (packed_weight), so that dX depends on them. Inputs: x, the n
// weights, the n biases.
// Forward mode: Ẏ = Ẋ·W + X·[Ẇ_0 | Ẇ_1 | …] + [ḃ_0 | ḃ_1 | …] (zeros for the pieces without one).
struct LinearCatRule {
  SavedTensor saved_x, saved_w;
  CatWeights saved_ws;  // for dX when a graph of the backward is built
  CatLayout l;

  CatGrads operator()(const TensorList& g, const Node& node) const {
    CatGrads grads(1 + 2 * l.n);
    const MatmulPlan plan = folded_plan(node.input_meta[0].shape, l.in, l.out);
    if (node.needs_input_grad(0)) {
      Tensor w = saved_w.get("linear_cat");
      if (is_grad_enabled() && saved_ws[0].defined()) {
        std::array<Tensor, kMaxCat> ws;
        for (std::size_t i = 0; i < l.n; ++i) ws[i] = saved_ws[i].get("linear_cat");
        w = packed_weight(std::span<const Tensor>(ws.data(), l.n), l);
      }
      grads[0] = product(Slot::A, plan, w, g[0]);
    }
    bool any_dw = false, any_db = false;
    for (std::size_t i = 0; i < l.n; ++i) {
      any_dw = any_dw || node.needs_input_grad(1 + i);
      any_db = any_db || node.needs_input_grad(1 + l.n + i);
    }
    if (any_dw) {
      const Tensor dw = product(Slot::B, plan, saved_x.get("linear_cat"), g[0]);
      for (std::size_t i = 0; i < l.n; ++i)
        if (node.needs_input_grad(1 + i)) grads[1 + i] = piece(dw, 1, l, i);
    }
    if (any_db) {
      const Tensor db = sum(reshape(g[0], {l.rows, l.out}), 0);
      for (std::size_t i = 0; i < l.n; ++i)
        if (node.needs_input_grad(1 + l.n + i)) grads[1 + l.n + i] = piece(db, 0, l, i);
    }
    return grads;
  }

  GradList tangents(const TensorList& t, const Node& node, std::uint64_t) const {
    const Dtype dtype = node.output_meta[0].dtype;
    // [ṫ_0 | ṫ_1 | …] of the pieces t[first + i] (dim 1 of a weight, dim 0 of a bias), or
    // undefined when none has a tangent.
    auto packed = [&](std::size_t first, const Shape& shape) {
      bool any = false;
      for (std::size_t i = 0; i < l.n; ++i) any = any || t[first + i].defined();
      if (!any) return Tensor();
      Tensor p = zeros(shape, dtype);
      dispatch(dtype, [&](auto zero) {
        using T = decltype(zero);
        const std::int64_t rows = shape.size() == 2 ? shape[0] : 1;
        MatrixView<T> pm(p.data<T>(), rows, l.out);
        for (std::size_t i = 0; i < l.n; ++i)
          if (t[first + i].defined())
            pm.middleCols(l.offset[i], l.cols(i)) = ConstMatrixView<T>(t[first + i].data<T>(), rows, l.cols(i));
      });
      return p;
    };
    const Tensor dw = packed(1, {l.in, l.out}), db = packed(1 + l.n, {l.out});
    Tensor y;
    if (t[0].defined()) y = linear(t[0], saved_w.get("linear_cat"), db);
    if (dw.defined()) {
      const Tensor xw = linear(saved_x.get("linear_cat"), dw, y.defined() ? Tensor() : db);
      y = y.defined() ? add(y, xw) : xw;
    }
    if (!y.defined()) y = add(zeros(node.output_meta[0].shape, dtype), db);
    return GradList{y};
  }
};

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
  CatWeights saved_ws;  // for dX when a graph of the backward is built
  if (x.requires_grad() && any_weight_grad)
    for (std::size_t i = 0; i < n; ++i) saved_ws[i] = SavedTensor(weights[i]);
  record(op, inputs, std::span<const Tensor>(&y, 1), LinearCatRule{std::move(saved_x), std::move(saved_w), std::move(saved_ws), l});
  return y;
}

}  // namespace autograd
