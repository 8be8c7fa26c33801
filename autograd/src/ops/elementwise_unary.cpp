// Unary elementwise ops. Each forward is one vectorised Eigen array expression over the whole
// buffer (split across threads when large); each backward is one more. The exact gelu of float32
// tensors runs instruction-set kernels instead (kernels/approx.hpp), unless the generic variant is in
// use: its erf and exp are most of a transformer MLP's elementwise work, and a portable build's
// Eigen code has only SSE2.
#include <cmath>
#include <string_view>

#include <unsupported/Eigen/SpecialFunctions>  // erf, for the exact gelu

#include "autograd/grad_mode.hpp"
#include "autograd/graph.hpp"
#include "autograd/ops.hpp"
#include "kernels/approx.hpp"
#include "kernels/broadcast.hpp"
#include "kernels/isa.hpp"
#include "ops/checks.hpp"

namespace autograd {

using broadcast::scalar_t;

namespace {

// x is defined and holds floats: every op here computes with the values.
void check_defined_arg(std::string_view op, const Tensor& x) {
  check_defined(op, x, "argument");
  check_floating(op, x);
}

// dx = f(dy, saved) elementwise, as the whole backward of a one-input op. While a graph of the
// backward is being built (create_graph), dx = composed(dy, saved) instead: the same gradient
// written with differentiable ops, so it can be differentiated again.
template <class F, class C>
auto backward_with(std::string_view op, const Tensor& saved, F f, C composed) {
  return [op, saved_t = SavedTensor(saved), f, composed](const TensorList& g, const Node&) {
    if (is_grad_enabled()) return GradList{composed(g[0], saved_t.get(op))};
    return GradList{broadcast::map<2>(g[0].shape(), {g[0], saved_t.get(op)}, f)};
  };
}

// 1 where keep(x) is false, 0 where it is true: a constant mask (no graph) for masked_fill.
template <class Keep>
Tensor drop_mask(const Tensor& x, Keep keep) {
  return broadcast::map1(x, [keep](const auto& v) {
    using T = scalar_t<decltype(v)>;
    return T(1) - keep(v).template cast<T>();
  });
}

constexpr double kSqrt1_2 = 0.70710678118654752440;     // 1/√2
constexpr double kInvSqrt2Pi = 0.39894228040143267794;  // 1/√(2π)
constexpr double kSqrt2OverPi = 0.79788456080286535588; // √(2/π)
constexpr double kGeluCubic = 0.044715;

// φ(x) = e^(-x²/2) / √(2π), from differentiable ops.
Tensor normal_pdf(const Tensor& x) { return mul(exp(mul(square(x), -0.5)), kInvSqrt2Pi); }

// Φ(x) = (1 + erf(x/√2)) / 2 as a recorded op of its own (dΦ/dx = φ(x), composed), for the
// differentiable backward of the exact gelu.
Tensor normal_cdf(const Tensor& x) {
  Tensor y = broadcast::map1(x, [](const auto& v) {
    using T = scalar_t<decltype(v)>;
    return T(0.5) * (T(1) + (v * T(kSqrt1_2)).erf());
  });
  if (!needs_grad(x)) return y;
  return record("normal_cdf", {x}, y, [saved_x = SavedTensor(x)](const TensorList& g, const Node&) {
    return GradList{mul(g[0], normal_pdf(saved_x.get("normal_cdf")))};
  });
}

// d/dx of the tanh-approximated gelu, from differentiable ops:
// (1 + t)/2 + x/2 · (1 - t²) · √(2/π)·(1 + 3·0.044715·x²),  t = tanh(√(2/π)·(x + 0.044715·x³))
Tensor gelu_tanh_slope(const Tensor& x) {
  const Tensor x2 = square(x);
  const Tensor t = tanh(mul(add(x, mul(mul(x2, x), kGeluCubic)), kSqrt2OverPi));
  const Tensor du = mul(add(mul(x2, 3 * kGeluCubic), 1.0), kSqrt2OverPi);
  return add(mul(add(t, 1.0), 0.5), mul(mul(mul(x, 0.5), rsub(square(t), 1.0)), du));
}

// The exact gelu and its derivative (dx = dy·(Φ(x) + x·φ(x))) of float32 tensors through the
// instruction-set kernels (kernels/approx.hpp), the same expressions as the Eigen ones below: an
// undefined tensor when they do not apply (another dtype or shape, or the generic variant).
Tensor gelu_kernel(const Tensor& x) {
  if (x.dtype() != Dtype::Float32 || isa::active() == isa::Isa::Generic) return Tensor();
  Tensor y = Tensor::empty(x.shape(), Dtype::Float32);
  const float* xs = x.data<float>();
  float* ys = y.data<float>();
  broadcast::parallel_chunks(x.numel(), [&](std::int64_t b, std::int64_t e) { approx::gelu(xs + b, ys + b, e - b); });
  return y;
}

Tensor gelu_backward_kernel(const Tensor& dy, const Tensor& x) {
  if (x.dtype() != Dtype::Float32 || dy.dtype() != Dtype::Float32 || dy.shape() != x.shape() ||
      isa::active() == isa::Isa::Generic)
    return Tensor();
  Tensor dx = Tensor::empty(x.shape(), Dtype::Float32);
  const float *dys = dy.data<float>(), *xs = x.data<float>();
  float* dxs = dx.data<float>();
  broadcast::parallel_chunks(x.numel(), [&](std::int64_t b, std::int64_t e) {
    approx::gelu_backward(dys + b, xs + b, dxs + b, e - b);
  });
  return dx;
}

}  // namespace

Tensor neg(const Tensor& x) {
  check_defined_arg("neg", x);
  Tensor y = broadcast::map1(x, [](const auto& v) { return -v; });
  if (!needs_grad(x)) return y;
  // y = -x  =>  dx = -dy
  return record("neg", {x}, y, [](const TensorList& g, const Node&) { return GradList{neg(g[0])}; });
}

Tensor exp(const Tensor& x) {
  check_defined_arg("exp", x);
  Tensor y = broadcast::map1(x, [](const auto& v) { return v.exp(); });
  if (!needs_grad(x)) return y;
  // y = eˣ  =>  dx = dy·y
  return record("exp", {x}, y, backward_with(
                  "exp", y, [](const auto& dy, const auto& out) { return dy * out; },
                  [](const Tensor& dy, const Tensor& out) { return mul(dy, out); }));
}

Tensor log(const Tensor& x) {
  check_defined_arg("log", x);
  Tensor y = broadcast::map1(x, [](const auto& v) { return v.log(); });
  if (!needs_grad(x)) return y;
  // y = ln x  =>  dx = dy / x
  return record("log", {x}, y, backward_with(
                  "log", x, [](const auto& dy, const auto& v) { return dy / v; },
                  [](const Tensor& dy, const Tensor& v) { return div(dy, v); }));
}

Tensor sqrt(const Tensor& x) {
  check_defined_arg("sqrt", x);
  Tensor y = broadcast::map1(x, [](const auto& v) { return v.sqrt(); });
  if (!needs_grad(x)) return y;
  // y = √x  =>  dx = dy / (2y)
  return record("sqrt", {x}, y, backward_with("sqrt", y, [](const auto& dy, const auto& out) {
                  return dy * scalar_t<decltype(dy)>(0.5) / out;
                }, [](const Tensor& dy, const Tensor& out) { return div(mul(dy, 0.5), out); }));
}

Tensor rsqrt(const Tensor& x) {
  check_defined_arg("rsqrt", x);
  Tensor y = broadcast::map1(x, [](const auto& v) { return v.rsqrt(); });
  if (!needs_grad(x)) return y;
  // y = x^(-1/2)  =>  dx = -dy·y³/2
  return record("rsqrt", {x}, y, backward_with("rsqrt", y, [](const auto& dy, const auto& out) {
                  return dy * scalar_t<decltype(dy)>(-0.5) * out.cube();
                }, [](const Tensor& dy, const Tensor& out) { return mul(mul(dy, -0.5), mul(square(out), out)); }));
}

Tensor square(const Tensor& x) {
  check_defined_arg("square", x);
  Tensor y = broadcast::map1(x, [](const auto& v) { return v.square(); });
  if (!needs_grad(x)) return y;
  // y = x²  =>  dx = 2x·dy
  return record("square", {x}, y, backward_with("square", x, [](const auto& dy, const auto& v) {
                  return dy * v * scalar_t<decltype(dy)>(2);
                }, [](const Tensor& dy, const Tensor& v) { return mul(mul(dy, v), 2.0); }));
}

Tensor abs(const Tensor& x) {
  check_defined_arg("abs", x);
  Tensor y = broadcast::map1(x, [](const auto& v) { return v.abs(); });
  if (!needs_grad(x)) return y;
  // y = |x|  =>  dx = dy·sign(x)   (sign(0) = 0)
  return record("abs", {x}, y, backward_with(
                  "abs", x, [](const auto& dy, const auto& v) { return dy * v.sign(); },
                  // sign(x) is piecewise constant: no second derivative
                  [](const Tensor& dy, const Tensor& v) {
                    return mul(dy, broadcast::map1(v, [](const auto& e) { return e.sign(); }));
                  }));
}

Tensor tanh(const Tensor& x) {
  check_defined_arg("tanh", x);
  Tensor y = broadcast::map1(x, [](const auto& v) { return v.tanh(); });
  if (!needs_grad(x)) return y;
  // y = tanh x  =>  dx = dy·(1 - y²)
  return record("tanh", {x}, y, backward_with("tanh", y, [](const auto& dy, const auto& out) {
                  return dy * (scalar_t<decltype(dy)>(1) - out.square());
                }, [](const Tensor& dy, const Tensor& out) { return mul(dy, rsub(square(out), 1.0)); }));
}

Tensor sigmoid(const Tensor& x) {
  check_defined_arg("sigmoid", x);
  Tensor y = broadcast::map1(x, [](const auto& v) { return v.logistic(); });
  if (!needs_grad(x)) return y;
  // y = 1 / (1 + e⁻ˣ)  =>  dx = dy·y·(1 - y)
  return record("sigmoid", {x}, y, backward_with("sigmoid", y, [](const auto& dy, const auto& out) {
                  return dy * out * (scalar_t<decltype(dy)>(1) - out);
                }, [](const Tensor& dy, const Tensor& out) { return mul(mul(dy, out), rsub(out, 1.0)); }));
}

Tensor relu(const Tensor& x) {
  check_defined_arg("relu", x);
  Tensor y = broadcast::map1(x, [](const auto& v) { return v.max(scalar_t<decltype(v)>(0)); });
  if (!needs_grad(x)) return y;
  // y = max(x, 0)  =>  dx = dy·[x > 0]
  return record("relu", {x}, y, backward_with("relu", x, [](const auto& dy, const auto& v) {
                  using T = scalar_t<decltype(dy)>;
                  return (v > T(0)).select(dy, T(0));
                }, [](const Tensor& dy, const Tensor& v) {
                  return masked_fill(dy, drop_mask(v, [](const auto& e) { return e > scalar_t<decltype(e)>(0); }), 0.0);
                }));
}

Tensor gelu(const Tensor& x, bool tanh_approximation) {
  check_defined_arg("gelu", x);
  if (tanh_approximation) {
    // y = x/2 · (1 + tanh u),  u = √(2/π)·(x + 0.044715·x³)
    Tensor y = broadcast::map1(x, [](const auto& v) {
      using T = scalar_t<decltype(v)>;
      return T(0.5) * v * (T(1) + (T(kSqrt2OverPi) * (v + T(kGeluCubic) * v.cube())).tanh());
    });
    if (!needs_grad(x)) return y;
    // dy/dx = (1 + t)/2 + x/2 · (1 - t²) · √(2/π)·(1 + 3·0.044715·x²),  t = tanh u
    return record("gelu", {x}, y, backward_with("gelu", x, [](const auto& dy, const auto& v) {
                    using T = scalar_t<decltype(dy)>;
                    const auto t = (T(kSqrt2OverPi) * (v + T(kGeluCubic) * v.cube())).tanh();
                    const auto du = T(kSqrt2OverPi) * (T(1) + T(3 * kGeluCubic) * v.square());
                    return dy * (T(0.5) * (T(1) + t) + T(0.5) * v * (T(1) - t.square()) * du);
                  }, [](const Tensor& dy, const Tensor& v) { return mul(dy, gelu_tanh_slope(v)); }));
  }
  // y = x·Φ(x),  Φ(x) = (1 + erf(x/√2)) / 2
  Tensor y = gelu_kernel(x);
  if (!y.defined()) {
    y = broadcast::map1(x, [](const auto& v) {
      using T = scalar_t<decltype(v)>;
      return T(0.5) * v * (T(1) + (v * T(kSqrt1_2)).erf());
    });
  }
  if (!needs_grad(x)) return y;
  // dy/dx = Φ(x) + x·φ(x),  φ(x) = e^(-x²/2) / √(2π)
  auto generic = backward_with("gelu", x, [](const auto& dy, const auto& v) {
    using T = scalar_t<decltype(dy)>;
    return dy * (T(0.5) * (T(1) + (v * T(kSqrt1_2)).erf()) + v * T(kInvSqrt2Pi) * (T(-0.5) * v.square()).exp());
  }, [](const Tensor& dy, const Tensor& v) { return mul(dy, add(normal_cdf(v), mul(v, normal_pdf(v)))); });
  return record("gelu", {x}, y, [saved_x = SavedTensor(x), generic](const TensorList& g, const Node& node) {
    if (!is_grad_enabled()) {
      Tensor dx = gelu_backward_kernel(g[0], saved_x.get("gelu"));
      if (dx.defined()) return GradList{dx};
    }
    return generic(g, node);
  });
}

Tensor clamp(const Tensor& x, double min, double max) {
  check_defined_arg("clamp", x);
  if (std::isnan(min) || std::isnan(max)) fail("clamp", "bounds must not be NaN (got min {}, max {})", min, max);
  if (min > max) fail("clamp", "min {} is greater than max {}", min, max);
  Tensor y = broadcast::map1(x, [min, max](const auto& v) {
    using T = scalar_t<decltype(v)>;
    return v.max(T(min)).min(T(max));
  });
  if (!needs_grad(x)) return y;
  // y = min(max(x, lo), hi)  =>  dx = dy·[lo < x < hi]
  return record("clamp", {x}, y, backward_with("clamp", x, [min, max](const auto& dy, const auto& v) {
                  using T = scalar_t<decltype(dy)>;
                  return (v > T(min) && v < T(max)).select(dy, T(0));
                }, [min, max](const Tensor& dy, const Tensor& v) {
                  return masked_fill(dy, drop_mask(v, [min, max](const auto& e) {
                                       using T = scalar_t<decltype(e)>;
                                       return e > T(min) && e < T(max);
                                     }), 0.0);
                }));
}

}  // namespace autograd
