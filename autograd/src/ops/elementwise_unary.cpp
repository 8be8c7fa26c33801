// Unary elementwise ops. Each forward is one vectorised Eigen array expression over the whole
// buffer (split across threads when large); each backward is one more, recorded as an op of its
// own (unary_backward) so that its derivative too is stated once. The exact gelu of float32
// tensors runs instruction-set kernels instead (kernels/approx.hpp), unless the generic variant is in
// use: its erf and exp are most of a transformer MLP's elementwise work, and a portable build's
// Eigen code has only SSE2.
#include <cmath>
#include <string_view>
#include <type_traits>

#include <unsupported/Eigen/SpecialFunctions>  // erf, for the exact gelu

#include "autograd/graph.hpp"
#include "autograd/ops.hpp"
#include "ops/tangent_rules.hpp"
#include "kernels/approx.hpp"
#include "kernels/broadcast.hpp"
#include "kernels/isa.hpp"
#include "ops/checks.hpp"

namespace autograd {

using broadcast::scalar_t;

namespace {

// The backward of a one-input op is a recorded op of its own, `<op>_backward`, as in PyTorch:
// dx = slope(dy, s) = dy·f'(s), one fused pass (s the saved input or output). Each derivative is
// written once. A first-order backward runs that pass alone (grad mode is off, nothing records);
// when a graph of the backward is built (create_graph), the op records a node whose rule is
//   d/d(dy) = the same op on the incoming gradient gg (dx is linear in dy),
//   d/ds    = curvature(gg, dy, s) = gg·dy·(d/ds of f'(s)), from differentiable ops,
// so it is differentiable to any order. `nullptr` as the curvature: f' is piecewise constant.
template <class Slope, class Curvature>
Tensor unary_backward(std::string_view name, const Tensor& dy, const Tensor& s, Slope slope, Curvature curvature) {
  Tensor dx = slope(dy, s);
  if (!needs_grad(dy, s)) return dx;
  return record(name, {dy, s}, dx,
                [name, slope, curvature, saved_dy = SavedTensor(dy), saved_s = SavedTensor(s)](const TensorList& g,
                                                                                               const Node& n) {
                  const Tensor sv = saved_s.get(name);
                  return GradList{grad_if(n, 0, [&] { return unary_backward(name, g[0], sv, slope, curvature); }),
                                  grad_if(n, 1, [&] {
                                    if constexpr (std::is_null_pointer_v<Curvature>) return Tensor();
                                    else return curvature(g[0], saved_dy.get(name), sv);
                                  })};
                });
}

// The rule of a one-input op whose backward is unary_backward on the saved tensor s. Its
// Jacobian is diagonal, so forward mode is the same slope applied to the tangent: ẏ = f'(s)·ẋ.
template <class Slope, class Curvature>
auto rule_of(std::string_view name, const Tensor& s, Slope slope, Curvature curvature) {
  return symmetric([name, slope, curvature, saved_s = SavedTensor(s)](const TensorList& g, const Node& n) {
    return GradList{unary_backward(name, g[0], saved_s.get(n.name()), slope, curvature)};
  });
}

// An Eigen expression f(dy, s) as a slope: one pass over the buffer.
template <class F>
auto pointwise(F f) {
  return [f](const Tensor& dy, const Tensor& s) { return broadcast::map<2>(dy.shape(), {dy, s}, f); };
}

// gg·dy, the common factor of every curvature.
Tensor gg_dy(const Tensor& gg, const Tensor& dy) { return mul(gg, dy); }

constexpr double kSqrt1_2 = 0.70710678118654752440;     // 1/√2
constexpr double kInvSqrt2Pi = 0.39894228040143267794;  // 1/√(2π)
constexpr double kSqrt2OverPi = 0.79788456080286535588; // √(2/π)
constexpr double kGeluCubic = 0.044715;
using approx::kGeluFlat;

// φ(x) = e^(-x²/2) / √(2π), from differentiable ops.
Tensor normal_pdf(const Tensor& x) { return mul(exp(mul(square(x), -0.5)), kInvSqrt2Pi); }

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
  return record("neg", {x}, y, symmetric([](const TensorList& g, const Node&) { return GradList{neg(g[0])}; }));
}

Tensor exp(const Tensor& x) {
  check_defined_arg("exp", x);
  Tensor y = broadcast::map1(x, [](const auto& v) { return v.exp(); });
  if (!needs_grad(x)) return y;
  // y = eˣ  =>  dx = dy·y;  d/dy of that: dy
  return record("exp", {x}, y, rule_of("exp_backward", y,
      pointwise([](const auto& dy, const auto& out) { return dy * out; }),
      [](const Tensor& gg, const Tensor& dy, const Tensor&) { return gg_dy(gg, dy); }));
}

Tensor log(const Tensor& x) {
  check_defined_arg("log", x);
  Tensor y = broadcast::map1(x, [](const auto& v) { return v.log(); });
  if (!needs_grad(x)) return y;
  // y = ln x  =>  dx = dy / x;  d/dx of that: -dy / x²
  return record("log", {x}, y, rule_of("log_backward", x,
      pointwise([](const auto& dy, const auto& v) { return dy / v; }),
      [](const Tensor& gg, const Tensor& dy, const Tensor& v) { return neg(div(gg_dy(gg, dy), square(v))); }));
}

Tensor sqrt(const Tensor& x) {
  check_defined_arg("sqrt", x);
  Tensor y = broadcast::map1(x, [](const auto& v) { return v.sqrt(); });
  if (!needs_grad(x)) return y;
  // y = √x  =>  dx = dy / (2y);  d/dy of that: -dy / (2y²)
  return record("sqrt", {x}, y, rule_of("sqrt_backward", y,
      pointwise([](const auto& dy, const auto& out) { return dy * scalar_t<decltype(dy)>(0.5) / out; }),
      [](const Tensor& gg, const Tensor& dy, const Tensor& out) { return div(mul(gg_dy(gg, dy), -0.5), square(out)); }));
}

Tensor rsqrt(const Tensor& x) {
  check_defined_arg("rsqrt", x);
  Tensor y = broadcast::map1(x, [](const auto& v) { return v.rsqrt(); });
  if (!needs_grad(x)) return y;
  // y = x^(-1/2)  =>  dx = -dy·y³/2;  d/dy of that: -3·dy·y²/2
  return record("rsqrt", {x}, y, rule_of("rsqrt_backward", y,
      pointwise([](const auto& dy, const auto& out) { return dy * scalar_t<decltype(dy)>(-0.5) * out.cube(); }),
      [](const Tensor& gg, const Tensor& dy, const Tensor& out) { return mul(gg_dy(gg, dy), mul(square(out), -1.5)); }));
}

Tensor square(const Tensor& x) {
  check_defined_arg("square", x);
  Tensor y = broadcast::map1(x, [](const auto& v) { return v.square(); });
  if (!needs_grad(x)) return y;
  // y = x²  =>  dx = 2x·dy;  d/dx of that: 2·dy
  return record("square", {x}, y, rule_of("square_backward", x,
      pointwise([](const auto& dy, const auto& v) { return dy * v * scalar_t<decltype(dy)>(2); }),
      [](const Tensor& gg, const Tensor& dy, const Tensor&) { return mul(gg_dy(gg, dy), 2.0); }));
}

Tensor abs(const Tensor& x) {
  check_defined_arg("abs", x);
  Tensor y = broadcast::map1(x, [](const auto& v) { return v.abs(); });
  if (!needs_grad(x)) return y;
  // y = |x|  =>  dx = dy·sign(x)   (sign(0) = 0; piecewise constant: no curvature)
  return record("abs", {x}, y, rule_of("abs_backward", x,
      pointwise([](const auto& dy, const auto& v) { return dy * v.sign(); }), nullptr));
}

Tensor tanh(const Tensor& x) {
  check_defined_arg("tanh", x);
  Tensor y = broadcast::map1(x, [](const auto& v) { return v.tanh(); });
  if (!needs_grad(x)) return y;
  // y = tanh x  =>  dx = dy·(1 - y²);  d/dy of that: -2·dy·y
  return record("tanh", {x}, y, rule_of("tanh_backward", y,
      pointwise([](const auto& dy, const auto& out) { return dy * (scalar_t<decltype(dy)>(1) - out.square()); }),
      [](const Tensor& gg, const Tensor& dy, const Tensor& out) { return mul(gg_dy(gg, dy), mul(out, -2.0)); }));
}

Tensor sigmoid(const Tensor& x) {
  check_defined_arg("sigmoid", x);
  Tensor y = broadcast::map1(x, [](const auto& v) { return v.logistic(); });
  if (!needs_grad(x)) return y;
  // y = 1 / (1 + e⁻ˣ)  =>  dx = dy·y·(1 - y);  d/dy of that: dy·(1 - 2y)
  return record("sigmoid", {x}, y, rule_of("sigmoid_backward", y,
      pointwise([](const auto& dy, const auto& out) { return dy * out * (scalar_t<decltype(dy)>(1) - out); }),
      [](const Tensor& gg, const Tensor& dy, const Tensor& out) { return mul(gg_dy(gg, dy), rsub(mul(out, 2.0), 1.0)); }));
}

Tensor relu(const Tensor& x) {
  check_defined_arg("relu", x);
  Tensor y = broadcast::map1(x, [](const auto& v) { return v.max(scalar_t<decltype(v)>(0)); });
  if (!needs_grad(x)) return y;
  // y = max(x, 0)  =>  dx = dy·[x > 0]   (piecewise constant: no curvature)
  return record("relu", {x}, y, rule_of("relu_backward", x, pointwise([](const auto& dy, const auto& v) {
      using T = scalar_t<decltype(dy)>;
      return (v > T(0)).select(dy, T(0));
    }), nullptr));
}

Tensor gelu(const Tensor& x, GeluApproximation approximate) {
  if (approximate != GeluApproximation::None && approximate != GeluApproximation::Tanh)
    fail("gelu", "approximate must be GeluApproximation::None or Tanh, got {}", static_cast<int>(approximate));
  const bool tanh_approximation = approximate == GeluApproximation::Tanh;
  check_defined_arg("gelu", x);
  if (tanh_approximation) {
    // y = x/2 · (1 + tanh u),  u = √(2/π)·(x + 0.044715·x³)
    Tensor y = broadcast::map1(x, [](const auto& v) {
      using T = scalar_t<decltype(v)>;
      return T(0.5) * v * (T(1) + (T(kSqrt2OverPi) * (v + T(kGeluCubic) * v.cube())).tanh());
    });
    if (!needs_grad(x)) return y;
    // dx = dy·s(x),  s = (1 + t)/2 + x/2 · (1 - t²)·u',  t = tanh u,  u' = √(2/π)·(1 + 3·0.044715·x²);
    // d/dx of that: dy·(1 - t²)·(u' + 3·√(2/π)·0.044715·x² - x·t·u'²).
    // Both are computed at x clamped to ±kGeluFlat: beyond it t = ±1 exactly (1 - t² = 0), so the
    // values are the same, and a huge x does not make x·(1 - t²)·u' a 0·inf NaN.
    return record("gelu", {x}, y, rule_of("gelu_backward", x, pointwise([](const auto& dy, const auto& x_in) {
        using T = scalar_t<decltype(dy)>;
        const auto v = x_in.max(T(-kGeluFlat)).min(T(kGeluFlat));
        const auto t = (T(kSqrt2OverPi) * (v + T(kGeluCubic) * v.cube())).tanh();
        const auto du = T(kSqrt2OverPi) * (T(1) + T(3 * kGeluCubic) * v.square());
        return dy * (T(0.5) * (T(1) + t) + T(0.5) * v * (T(1) - t.square()) * du);
      }), [](const Tensor& gg, const Tensor& dy, const Tensor& x_in) {
        const Tensor v = clamp(x_in, -kGeluFlat, kGeluFlat);
        const Tensor x2 = square(v);
        const Tensor t = tanh(mul(add(v, mul(mul(x2, v), kGeluCubic)), kSqrt2OverPi));
        const Tensor du = mul(add(mul(x2, 3 * kGeluCubic), 1.0), kSqrt2OverPi);
        const Tensor inner = sub(add(du, mul(x2, 3 * kSqrt2OverPi * kGeluCubic)), mul(mul(v, t), square(du)));
        return mul(gg_dy(gg, dy), mul(rsub(square(t), 1.0), inner));
      }));
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
  // dx = dy·(Φ(x) + x·φ(x)),  φ(x) = e^(-x²/2) / √(2π);  d/dx of that: dy·φ(x)·(2 - x²), with x²
  // taken at x clamped to ±kGeluFlat, where φ is already 0 (so a huge x gives 0, not 0·inf = NaN)
  return record("gelu", {x}, y, rule_of("gelu_backward", x, [](const Tensor& dy, const Tensor& v) {
      Tensor dx = gelu_backward_kernel(dy, v);
      if (dx.defined()) return dx;
      return broadcast::map<2>(dy.shape(), {dy, v}, [](const auto& g, const auto& e) {
        using T = scalar_t<decltype(g)>;
        return g * (T(0.5) * (T(1) + (e * T(kSqrt1_2)).erf()) + e * T(kInvSqrt2Pi) * (T(-0.5) * e.square()).exp());
      });
    }, [](const Tensor& gg, const Tensor& dy, const Tensor& v) {
      return mul(gg_dy(gg, dy), mul(normal_pdf(v), rsub(square(clamp(v, -kGeluFlat, kGeluFlat)), 2.0)));
    }));
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
  // y = min(max(x, lo), hi)  =>  dx = dy·[lo < x < hi]   (piecewise constant: no curvature)
  return record("clamp", {x}, y, rule_of("clamp_backward", x, pointwise([min, max](const auto& dy, const auto& v) {
      using T = scalar_t<decltype(dy)>;
      return (v > T(min) && v < T(max)).select(dy, T(0));
    }), nullptr));
}

}  // namespace autograd
