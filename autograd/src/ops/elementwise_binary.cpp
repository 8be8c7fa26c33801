// Binary elementwise ops with NumPy broadcasting, their scalar forms, the operators, and the
// selections by mask (masked_fill, where). Gradients of broadcast inputs are summed back to
// each input's shape with sum_to. Float32 +, −, ·, / run instruction-set kernels (kernels/exact_ops.hpp)
// unless the generic variant is in use, with the same results (one IEEE operation an element).
// Every rule here is written with these differentiable ops, once: a first-order backward runs
// it without recording, a create_graph backward records it.
#include <array>
#include <cmath>
#include <string_view>

#include "autograd/graph.hpp"
#include "autograd/ops.hpp"
#include "ops/tangent_rules.hpp"
#include "kernels/broadcast.hpp"
#include "kernels/exact_ops.hpp"
#include "ops/checks.hpp"

namespace autograd {

using broadcast::scalar_t;

namespace {

void check_defined_args(std::string_view op, const Tensor& a, const Tensor& b) {
  check_defined(op, a, "first argument");
  check_defined(op, b, "second argument");
}

// Both defined, both floating, same dtype; returns the broadcast shape (or throws naming both shapes).
Shape check_binary(std::string_view op, const Tensor& a, const Tensor& b) {
  check_defined_args(op, a, b);
  check_floating(op, a, "first argument");
  check_floating(op, b, "second argument");
  if (a.dtype() != b.dtype()) fail(op, "dtypes differ: {} and {}", dtype_name(a.dtype()), dtype_name(b.dtype()));
  if (a.shape() == b.shape()) return a.shape();  // the common case: nothing to broadcast
  return broadcast_shapes(op, a.shape(), b.shape());
}

// A mask or condition (any dtype: an Int64 one from a comparison, or 0/1 floats) in the dtype
// of the data it selects (masks carry no gradient).
Tensor as_selector(const Tensor& m, Dtype dtype) { return m.dtype() == dtype ? m.detach() : m.detach().to(dtype); }

// 1 where pick(a, b) holds, else 0, over the broadcast shape: a constant mask (no graph).
template <class Pick>
Tensor mask_of(const Shape& shape, const Tensor& a, const Tensor& b, Pick pick) {
  return broadcast::map<2>(shape, {a, b}, [pick](const auto& x, const auto& z) {
    return pick(x, z).template cast<scalar_t<decltype(x)>>();
  });
}

}  // namespace

// ---- tensor ∘ tensor ----

Tensor add(const Tensor& a, const Tensor& b) {
  const Shape shape = check_binary("add", a, b);
  Tensor y = exact::binary(exact::Op::Add, shape, a, b);
  if (!y.defined()) y = broadcast::map<2>(shape, {a, b}, [](const auto& x, const auto& z) { return x + z; });
  if (!needs_grad(a, b)) return y;
  // y = a + b  =>  da = sum_to(dy), db = sum_to(dy)
  return record("add", {a, b}, y, with_tangents([](const TensorList& g, const Node& n) {
    return GradList{grad_if(n, 0, [&] { return sum_to(g[0], n.input_meta[0].shape); }),
                      grad_if(n, 1, [&] { return sum_to(g[0], n.input_meta[1].shape); })};
  }, [](const TensorList& t, const Node& n) { return GradList{tangent_sum(t[0], t[1], n)}; }));
}

Tensor sub(const Tensor& a, const Tensor& b) {
  const Shape shape = check_binary("sub", a, b);
  Tensor y = exact::binary(exact::Op::Sub, shape, a, b);
  if (!y.defined()) y = broadcast::map<2>(shape, {a, b}, [](const auto& x, const auto& z) { return x - z; });
  if (!needs_grad(a, b)) return y;
  // y = a - b  =>  da = sum_to(dy), db = -sum_to(dy)
  return record("sub", {a, b}, y, with_tangents([](const TensorList& g, const Node& n) {
    return GradList{grad_if(n, 0, [&] { return sum_to(g[0], n.input_meta[0].shape); }),
                      grad_if(n, 1, [&] { return neg(sum_to(g[0], n.input_meta[1].shape)); })};
  }, [](const TensorList& t, const Node& n) {
    return GradList{tangent_sum(t[0], t[1].defined() ? neg(t[1]) : Tensor(), n)};
  }));
}

Tensor mul(const Tensor& a, const Tensor& b) {
  const Shape shape = check_binary("mul", a, b);
  Tensor y = exact::binary(exact::Op::Mul, shape, a, b);
  if (!y.defined()) y = broadcast::map<2>(shape, {a, b}, [](const auto& x, const auto& z) { return x * z; });
  if (!needs_grad(a, b)) return y;
  // y = a·b  =>  da = sum_to(dy·b), db = sum_to(dy·a)
  SavedTensor saved_a(b.requires_grad() ? a : Tensor()), saved_b(a.requires_grad() ? b : Tensor());
  // ẏ = ȧ·b + a·ḃ
  using Saved = std::array<SavedTensor, 2>;
  return record("mul", {a, b}, y, with_tangents(Saved{std::move(saved_a), std::move(saved_b)},
      [](const Saved& s, const TensorList& g, const Node& n) {
    return GradList{grad_if(n, 0, [&] { return sum_to(mul(g[0], s[1].get("mul")), n.input_meta[0].shape); }),
                      grad_if(n, 1, [&] { return sum_to(mul(g[0], s[0].get("mul")), n.input_meta[1].shape); })};
  }, [](const Saved& s, const TensorList& t, const Node& n) {
    return GradList{tangent_sum(t[0].defined() ? mul(t[0], s[1].get("mul")) : Tensor(),
                                t[1].defined() ? mul(s[0].get("mul"), t[1]) : Tensor(), n)};
  }));
}

Tensor div(const Tensor& a, const Tensor& b) {
  const Shape shape = check_binary("div", a, b);
  Tensor y = exact::binary(exact::Op::Div, shape, a, b);
  if (!y.defined()) y = broadcast::map<2>(shape, {a, b}, [](const auto& x, const auto& z) { return x / z; });
  if (!needs_grad(a, b)) return y;
  // y = a / b  =>  da = sum_to(dy / b), db = sum_to(-dy·a / b²)
  SavedTensor saved_a(b.requires_grad() ? a : Tensor()), saved_b(b);
  // ẏ = ȧ / b − a·ḃ / b²
  using Saved = std::array<SavedTensor, 2>;
  return record("div", {a, b}, y, with_tangents(Saved{std::move(saved_a), std::move(saved_b)},
      [](const Saved& s, const TensorList& g, const Node& n) {
    const Tensor bv = s[1].get("div");
    return GradList{
        grad_if(n, 0, [&] { return sum_to(div(g[0], bv), n.input_meta[0].shape); }),
        grad_if(n, 1, [&] {
          return sum_to(div(mul(neg(g[0]), s[0].get("div")), square(bv)), n.input_meta[1].shape);
        })};
  }, [](const Saved& s, const TensorList& t, const Node& n) {
    const Tensor bv = s[1].get("div");
    return GradList{tangent_sum(t[0].defined() ? div(t[0], bv) : Tensor(),
                                t[1].defined() ? div(mul(neg(s[0].get("div")), t[1]), square(bv)) : Tensor(), n)};
  }));
}

namespace {

// The backward of pow(a, b), from differentiable ops.
GradList pow_rule(const Tensor& dy, const Tensor& a, const Tensor& b, const SavedTensor& saved_y, const Node& n) {
  return GradList{
      grad_if(n, 0, [&] {
        const Tensor b_zero =
            mask_of(b.shape(), b, b, [](const auto& z, const auto&) { return z == scalar_t<decltype(z)>(0); });
        return sum_to(masked_fill(mul(mul(dy, b), pow(a, sub(b, 1.0))), b_zero, 0.0), n.input_meta[0].shape);
      }),
      grad_if(n, 1, [&] {
        const Tensor a_zero = mask_of(dy.shape(), a, b, [](const auto& x, const auto& z) {
          using T = scalar_t<decltype(x)>;
          return x == T(0) && z >= T(0);
        });
        return sum_to(masked_fill(mul(mul(dy, saved_y.get("pow")), log(a)), a_zero, 0.0), n.input_meta[1].shape);
      })};
}

}  // namespace

Tensor pow(const Tensor& a, const Tensor& b) {
  const Shape shape = check_binary("pow", a, b);
  Tensor y = broadcast::map<2>(shape, {a, b}, [](const auto& x, const auto& z) { return x.pow(z); });
  if (!needs_grad(a, b)) return y;
  // y = a^b  =>  da = sum_to(dy·b·a^(b-1)),  db = sum_to(dy·y·ln a)
  // (PyTorch's conventions: da = 0 where b == 0, db = 0 where a == 0 and b >= 0.)
  SavedTensor saved_a(a), saved_b(b), saved_y(b.requires_grad() ? y : Tensor());
  return record("pow", {a, b}, y, [saved_a, saved_b, saved_y](const TensorList& g, const Node& n) {
    return pow_rule(g[0], saved_a.get("pow"), saved_b.get("pow"), saved_y, n);
  });
}

namespace {

// maximum/minimum: the gradient goes to the input that won, split evenly on ties (PyTorch).
template <bool IsMax>
Tensor extremum(std::string_view op, const Tensor& a, const Tensor& b) {
  const Shape shape = check_binary(op, a, b);
  Tensor y = broadcast::map<2>(shape, {a, b}, [](const auto& x, const auto& z) {
    using T = scalar_t<decltype(x)>;
    // NaN in either input gives NaN, like PyTorch.
    if constexpr (IsMax) {
      return x.binaryExpr(z, Eigen::internal::scalar_max_op<T, T, Eigen::PropagateNaN>());
    } else {
      return x.binaryExpr(z, Eigen::internal::scalar_min_op<T, T, Eigen::PropagateNaN>());
    }
  });
  if (!needs_grad(a, b)) return y;
  // y = max(a, b)  =>  da = sum_to(dy·[a > b] + dy/2·[a == b]), db likewise with a and b swapped
  SavedTensor saved_a(a), saved_b(b);
  return record(std::string(op), {a, b}, y, [saved_a, saved_b, op](const TensorList& g, const Node& n) {
    const Tensor av = saved_a.get(op), bv = saved_b.get(op);
    // dy times a constant weight 1, 1/2 or 0 (piecewise linear: no second derivative); exactly 0
    // where the input lost, whatever dy holds
    auto share = [&](const Tensor& self, const Tensor& other, std::size_t i) {
      auto wins = [](const auto& s, const auto& o) {
        if constexpr (IsMax) return s > o;
        else return s < o;
      };
      const Tensor weight = broadcast::map<2>(g[0].shape(), {self, other}, [wins](const auto& s, const auto& o) {
        using T = scalar_t<decltype(s)>;
        return wins(s, o).template cast<T>() + (s == o).template cast<T>() * T(0.5);
      });
      const Tensor loses = mask_of(g[0].shape(), self, other,
                                   [wins](const auto& s, const auto& o) { return !(wins(s, o) || s == o); });
      return sum_to(masked_fill(mul(g[0], weight), loses, 0.0), n.input_meta[i].shape);
    };
    return GradList{grad_if(n, 0, [&] { return share(av, bv, 0); }), grad_if(n, 1, [&] { return share(bv, av, 1); })};
  });
}

}  // namespace

Tensor maximum(const Tensor& a, const Tensor& b) { return extremum<true>("maximum", a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return extremum<false>("minimum", a, b); }

// ---- tensor ∘ scalar ----

Tensor add(const Tensor& a, double b) {
  check_defined_arg("add", a, "argument");
  Tensor y = exact::with_scalar(exact::Op::Add, a, b);
  if (!y.defined()) y = broadcast::map1(a, [b](const auto& x) { return x + scalar_t<decltype(x)>(b); });
  if (!needs_grad(a)) return y;
  // y = a + c  =>  da = dy
  return record("add", {a}, y, symmetric([](const TensorList& g, const Node&) { return GradList{g[0]}; }));
}

Tensor sub(const Tensor& a, double b) {
  check_defined_arg("sub", a, "argument");
  Tensor y = exact::with_scalar(exact::Op::Sub, a, b);
  if (!y.defined()) y = broadcast::map1(a, [b](const auto& x) { return x - scalar_t<decltype(x)>(b); });
  if (!needs_grad(a)) return y;
  // y = a - c  =>  da = dy
  return record("sub", {a}, y, symmetric([](const TensorList& g, const Node&) { return GradList{g[0]}; }));
}

Tensor rsub(const Tensor& a, double b) {
  check_defined_arg("rsub", a, "argument");
  Tensor y = exact::scalar_first(exact::Op::Sub, a, b);
  if (!y.defined()) y = broadcast::map1(a, [b](const auto& x) { return scalar_t<decltype(x)>(b) - x; });
  if (!needs_grad(a)) return y;
  // y = c - a  =>  da = -dy
  return record("rsub", {a}, y, symmetric([](const TensorList& g, const Node&) { return GradList{neg(g[0])}; }));
}

Tensor mul(const Tensor& a, double b) {
  check_defined_arg("mul", a, "argument");
  Tensor y = exact::with_scalar(exact::Op::Mul, a, b);
  if (!y.defined()) y = broadcast::map1(a, [b](const auto& x) { return x * scalar_t<decltype(x)>(b); });
  if (!needs_grad(a)) return y;
  // y = a·c  =>  da = dy·c
  return record("mul", {a}, y, symmetric([b](const TensorList& g, const Node&) { return GradList{mul(g[0], b)}; }));
}

Tensor div(const Tensor& a, double b) {
  check_defined_arg("div", a, "argument");
  Tensor y = exact::with_scalar(exact::Op::Div, a, b);
  if (!y.defined()) y = broadcast::map1(a, [b](const auto& x) { return x / scalar_t<decltype(x)>(b); });
  if (!needs_grad(a)) return y;
  // y = a / c  =>  da = dy / c
  return record("div", {a}, y, symmetric([b](const TensorList& g, const Node&) { return GradList{div(g[0], b)}; }));
}

Tensor rdiv(const Tensor& a, double b) {
  check_defined_arg("rdiv", a, "argument");
  Tensor y = exact::scalar_first(exact::Op::Div, a, b);
  if (!y.defined()) y = broadcast::map1(a, [b](const auto& x) { return scalar_t<decltype(x)>(b) / x; });
  if (!needs_grad(a)) return y;
  // y = c / a  =>  da = -dy·c / a² = -dy·y / a
  SavedTensor saved_a(a), saved_y(y);
  return record("rdiv", {a}, y, symmetric([saved_a, saved_y](const TensorList& g, const Node&) {
    return GradList{div(mul(neg(g[0]), saved_y.get("rdiv")), saved_a.get("rdiv"))};
  }));
}

Tensor pow(const Tensor& a, double exponent) {
  check_defined_arg("pow", a, "argument");
  Tensor y;
  if (exponent == 2.0) {
    y = broadcast::map1(a, [](const auto& x) { return x.square(); });
  } else if (exponent == 1.0) {
    y = broadcast::map1(a, [](const auto& x) { return x; });
  } else if (exponent == 0.5) {
    y = broadcast::map1(a, [](const auto& x) { return x.sqrt(); });
  } else if (exponent == -1.0) {
    y = broadcast::map1(a, [](const auto& x) { return x.inverse(); });
  } else {
    y = broadcast::map1(a, [exponent](const auto& x) { return x.pow(scalar_t<decltype(x)>(exponent)); });
  }
  if (!needs_grad(a)) return y;
  // y = a^e  =>  da = dy·e·a^(e-1)   (0 when e == 0)
  SavedTensor saved_a(a);
  return record("pow", {a}, y, symmetric([saved_a, exponent](const TensorList& g, const Node&) {
    if (exponent == 0.0) return GradList{masked_fill(g[0], ones({}, g[0].dtype()), 0.0)};  // zeros, of the graph
    const Tensor av = saved_a.get("pow");
    return GradList{exponent == 2.0 ? mul(mul(g[0], av), 2.0) : mul(mul(g[0], exponent), pow(av, exponent - 1.0))};
  }));
}

// ---- operators ----

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator+(const Tensor& a, double b) { return add(a, b); }
Tensor operator-(const Tensor& a, double b) { return sub(a, b); }
Tensor operator*(const Tensor& a, double b) { return mul(a, b); }
Tensor operator/(const Tensor& a, double b) { return div(a, b); }
Tensor operator+(double a, const Tensor& b) { return add(b, a); }
Tensor operator-(double a, const Tensor& b) { return rsub(b, a); }
Tensor operator*(double a, const Tensor& b) { return mul(b, a); }
Tensor operator/(double a, const Tensor& b) { return rdiv(b, a); }
Tensor operator-(const Tensor& a) { return neg(a); }

// ---- selection by mask ----

namespace {

// masked_fill of an Int64 input (no gradient): `value` must be an integer the input can hold
// exactly; the mask (any dtype) selects where it is nonzero.
Tensor masked_fill_int64(const Tensor& x, const Tensor& mask, double value) {
  if (!(value == std::trunc(value)) && !std::isinf(value))
    fail("masked_fill", "value {} is not an integer, so an Int64 input cannot hold it", value);
  if (!(value >= -0x1p63 && value < 0x1p63))  // the doubles whose integer fits in 64 bits
    fail("masked_fill", "value {} is outside the Int64 range, so an Int64 input cannot hold it", value);
  const auto fill = static_cast<std::int64_t>(value);
  const Tensor m = mask.shape() == x.shape() ? mask : expand(mask.detach(), x.shape());
  Tensor y = Tensor::empty(x.shape(), Dtype::Int64, "masked_fill");
  const std::int64_t* in = x.data<std::int64_t>();
  std::int64_t* out = y.data<std::int64_t>();
  dispatch_all(m.dtype(), [&](auto zero) {
    using M = decltype(zero);
    const M* sel = m.data<M>();
    for (std::int64_t i = 0; i < y.numel(); ++i) out[i] = sel[i] != M(0) ? fill : in[i];
  });
  return y;
}

}  // namespace

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  check_defined_args("masked_fill", x, mask);
  if (x.dtype() != Dtype::Int64) check_floating("masked_fill", x, "the input");
  if (broadcast_shapes("masked_fill", x.shape(), mask.shape()) != x.shape())
    fail("masked_fill", "mask of shape {} cannot be broadcast to the input's shape {}", shape_str(mask.shape()),
         shape_str(x.shape()));
  if (x.dtype() == Dtype::Int64) return masked_fill_int64(x, mask, value);
  const Tensor m = as_selector(mask, x.dtype());
  Tensor y = broadcast::map<2>(x.shape(), {x, m}, [value](const auto& v, const auto& keep_out) {
    using T = scalar_t<decltype(v)>;
    return (keep_out != T(0)).select(T(value), v);
  });
  if (!needs_grad(x)) return y;
  // y = mask ? c : x  =>  dx = mask ? 0 : dy
  SavedTensor saved_mask(m);
  return record("masked_fill", {x}, y, symmetric([saved_mask](const TensorList& g, const Node&) {
    return GradList{masked_fill(g[0], saved_mask.get("masked_fill"), 0.0)};
  }));
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  // The values are where's second and third arguments (the condition is its first).
  check_defined("where", cond, "condition");
  check_defined("where", a, "second argument");
  check_defined("where", b, "third argument");
  check_floating("where", a, "second argument");
  check_floating("where", b, "third argument");
  if (a.dtype() != b.dtype())
    fail("where", "dtypes differ: second argument {} and third argument {}", dtype_name(a.dtype()),
         dtype_name(b.dtype()));
  const Shape ab = a.shape() == b.shape() ? a.shape() : broadcast_shapes("where", a.shape(), b.shape());
  const Shape shape = broadcast_shapes("where", cond.shape(), ab);
  const Tensor c = as_selector(cond, a.dtype());
  Tensor y = broadcast::map<3>(shape, {c, a, b}, [](const auto& take_a, const auto& x, const auto& z) {
    using T = scalar_t<decltype(x)>;
    return (take_a != T(0)).select(x, z);
  });
  if (!needs_grad(a, b)) return y;
  // y = cond ? a : b  =>  da = sum_to(cond ? dy : 0), db = sum_to(cond ? 0 : dy)
  SavedTensor saved_cond(c);
  return record("where", {a, b}, y, [saved_cond](const TensorList& g, const Node& n) {
    const Tensor cv = saved_cond.get("where");
    const Tensor zero = zeros({}, g[0].dtype());
    return GradList{grad_if(n, 0, [&] { return sum_to(where(cv, g[0], zero), n.input_meta[0].shape); }),
                    grad_if(n, 1, [&] { return sum_to(where(cv, zero, g[0]), n.input_meta[1].shape); })};
  });
}

}  // namespace autograd
