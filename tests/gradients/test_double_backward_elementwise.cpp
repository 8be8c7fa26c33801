// Second derivatives of the elementwise ops: gradgradcheck of every binary op (with broadcasting
// both ways), its scalar forms, the operators, masked_fill and where, and every unary op, each
// nearest the seed and inside a chain; closed-form second derivatives (mixed partials of pow and
// div included) computed here from the formulas; the conventions at the kinks; and gradients
// built with create_graph equal to the first-order ones.
#define BOOST_TEST_MODULE double_backward_elementwise
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <functional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <autograd/autograd.hpp>

#include "double_backward_support.hpp"
#include "test_support.hpp"

namespace ag = autograd;
using ag::Dtype;
using ag::Tensor;
using ag::TensorList;
using double_backward::check_op;
using double_backward::uniform_input;
using test_support::check_values;
using test_support::input;

namespace {

using Unary = std::function<Tensor(const Tensor&)>;
using Binary = std::function<Tensor(const Tensor&, const Tensor&)>;

ag::GradcheckFn unary_fn(Unary f) {
  return [f](const TensorList& in) { return f(in[0]); };
}
ag::GradcheckFn binary_fn(Binary f) {
  return [f](const TensorList& in) { return f(in[0], in[1]); };
}

// d/dx and d²/dx² of sum(f(x)), elementwise, through create_graph.
std::pair<Tensor, Tensor> first_and_second(const Unary& f, const Tensor& x) {
  const Tensor g = ag::grad({ag::sum(f(x))}, {x}, {.create_graph = true})[0];
  BOOST_TEST(g.requires_grad());
  const Tensor h = ag::grad({ag::sum(g)}, {x})[0];
  return {g, h};
}

// The second derivatives of sum(f(a, b)) in a and b: {d²/da², d²/da db, d²/db da, d²/db²}
// (zeros where a first derivative does not depend on that input).
std::vector<Tensor> hessian_blocks(const Binary& f, const Tensor& a, const Tensor& b) {
  const TensorList g = ag::grad({ag::sum(f(a, b))}, {a, b}, {.create_graph = true});
  std::vector<Tensor> out;
  for (const Tensor& gi : g) {
    const TensorList h = ag::grad({ag::sum(gi)}, {a, b}, {.allow_unused = true});
    out.push_back(h[0].defined() ? h[0] : ag::zeros_like(a));
    out.push_back(h[1].defined() ? h[1] : ag::zeros_like(b));
  }
  return out;
}

std::vector<double> elementwise(const Tensor& x, const std::function<double(double)>& f) {
  std::vector<double> v = x.to_vector();
  for (double& e : v) e = f(e);
  return v;
}

std::vector<double> elementwise2(const Tensor& a, const Tensor& b, const std::function<double(double, double)>& f) {
  std::vector<double> va = a.to_vector(), vb = b.to_vector(), out(va.size());
  for (std::size_t i = 0; i < va.size(); ++i) out[i] = f(va[i], vb[i]);
  return out;
}

constexpr double kPi = 3.14159265358979323846;
double normal_pdf(double x) { return std::exp(-0.5 * x * x) / std::sqrt(2 * kPi); }

}  // namespace

BOOST_AUTO_TEST_SUITE(binary_ops)

// a [2, 1, 4] with b [3, 4]: both broadcast to [2, 3, 4].
BOOST_AUTO_TEST_CASE(tensor_tensor_ops_with_broadcasting) {
  const Tensor a = input({2, 1, 4}, 11), b = input({3, 4}, 12);
  const Tensor b_pos = uniform_input({3, 4}, 0.5, 2.0, 13);
  check_op("binary", "add", binary_fn([](const Tensor& x, const Tensor& y) { return ag::add(x, y); }), {a, b});
  check_op("binary", "sub", binary_fn([](const Tensor& x, const Tensor& y) { return ag::sub(x, y); }), {a, b});
  check_op("binary", "mul", binary_fn([](const Tensor& x, const Tensor& y) { return ag::mul(x, y); }), {a, b});
  check_op("binary", "div", binary_fn([](const Tensor& x, const Tensor& y) { return ag::div(x, y); }), {a, b_pos});
  check_op("binary", "maximum", binary_fn([](const Tensor& x, const Tensor& y) { return ag::maximum(x, y); }), {a, b});
  check_op("binary", "minimum", binary_fn([](const Tensor& x, const Tensor& y) { return ag::minimum(x, y); }), {a, b});
  // the broadcast the other way round, and the same-shape fast case
  check_op("binary", "mul [3, 4] * [2, 1, 4]", binary_fn([](const Tensor& x, const Tensor& y) { return x * y; }),
           {b, a});
  check_op("binary", "div same shapes", binary_fn([](const Tensor& x, const Tensor& y) { return x / y; }),
           {input({3, 4}, 14), b_pos});
}

BOOST_AUTO_TEST_CASE(pow_with_tensor_exponent_in_both_arguments) {
  const Tensor a = uniform_input({2, 1, 4}, 0.5, 2.0, 21), b = uniform_input({3, 4}, -1.5, 2.5, 22);
  check_op("binary", "pow(a, b)", binary_fn([](const Tensor& x, const Tensor& y) { return ag::pow(x, y); }), {a, b});
  // only one argument requires grad
  check_op("binary", "pow(a, const b)", binary_fn([](const Tensor& x, const Tensor& y) { return ag::pow(x, y); }),
           {a, b.detach()});
  check_op("binary", "pow(const a, b)", binary_fn([](const Tensor& x, const Tensor& y) { return ag::pow(x, y); }),
           {a.detach(), b});
}

BOOST_AUTO_TEST_CASE(scalar_forms_and_operators) {
  const Tensor x = input({3, 4}, 31), p = uniform_input({3, 4}, 0.5, 2.0, 32);
  check_op("binary", "add scalar", unary_fn([](const Tensor& t) { return ag::add(t, 0.7); }), {x});
  check_op("binary", "sub scalar", unary_fn([](const Tensor& t) { return ag::sub(t, 0.7); }), {x});
  check_op("binary", "rsub", unary_fn([](const Tensor& t) { return ag::rsub(t, 0.7); }), {x});
  check_op("binary", "mul scalar", unary_fn([](const Tensor& t) { return ag::mul(t, -1.3); }), {x});
  check_op("binary", "div scalar", unary_fn([](const Tensor& t) { return ag::div(t, 0.6); }), {x});
  check_op("binary", "rdiv", unary_fn([](const Tensor& t) { return ag::rdiv(t, 1.7); }), {p});
  for (double e : {2.0, 1.0, 0.5, -1.0, 3.0, -0.7, 0.0})
    check_op("binary", fmt::format("pow scalar {}", e), unary_fn([e](const Tensor& t) { return ag::pow(t, e); }), {p});
  check_op("binary", "operators",
           binary_fn([](const Tensor& t, const Tensor& q) {
             return (2.0 - t) * (t + 1.5) / q - (t * 0.5 + 3.0) / 2.0 + 1.0 / q - (-t) + q - 0.25;
           }),
           {x, p});
}

BOOST_AUTO_TEST_CASE(masked_fill_and_where_with_broadcasting) {
  const Tensor x = input({2, 3, 4}, 41), a = input({2, 1, 4}, 42), b = input({3, 4}, 43);
  const Tensor mask = ag::tensor({1, 0, 1}, {3, 1}, Dtype::Float64);
  const Tensor mask32 = ag::tensor({0, 1, 1, 0}, {4}, Dtype::Float32);  // converted to the data's dtype
  check_op("selection", "masked_fill",
           unary_fn([mask](const Tensor& t) { return ag::masked_fill(t, mask, 1.5); }), {x});
  check_op("selection", "masked_fill (float32 mask)",
           unary_fn([mask32](const Tensor& t) { return ag::masked_fill(t, mask32, -2.0); }), {x});
  check_op("selection", "where",
           binary_fn([mask](const Tensor& s, const Tensor& t) { return ag::where(mask, s, t); }), {a, b});
  // products around the selection make its second derivative non-zero
  check_op("selection", "where of products",
           binary_fn([mask](const Tensor& s, const Tensor& t) { return ag::where(mask, s * t, t * t) * s; }), {a, b});
  check_op("selection", "masked_fill of a product",
           unary_fn([mask](const Tensor& t) { return ag::masked_fill(t * t, mask, 0.5) * t; }), {x});
}

BOOST_AUTO_TEST_CASE(pow_second_derivatives_and_mixed_partials_match_the_closed_form) {
  const Tensor a = uniform_input({6}, 0.4, 2.5, 51), b = uniform_input({6}, -1.5, 2.5, 52);
  const auto h = hessian_blocks([](const Tensor& x, const Tensor& y) { return ag::pow(x, y); }, a, b);
  // f = a^b: f_aa = b(b-1)a^(b-2), f_ab = f_ba = a^(b-1)(1 + b ln a), f_bb = a^b ln²a
  check_values(h[0], {6}, elementwise2(a, b, [](double x, double y) { return y * (y - 1) * std::pow(x, y - 2); }));
  const auto mixed = elementwise2(a, b, [](double x, double y) { return std::pow(x, y - 1) * (1 + y * std::log(x)); });
  check_values(h[1], {6}, mixed);
  check_values(h[2], {6}, mixed);
  check_values(h[3], {6}, elementwise2(a, b, [](double x, double y) {
                 return std::pow(x, y) * std::log(x) * std::log(x);
               }));
}

BOOST_AUTO_TEST_CASE(div_and_mul_second_derivatives_match_the_closed_form) {
  const Tensor a = input({5}, 61), b = uniform_input({5}, 0.5, 2.0, 62);
  const auto d = hessian_blocks([](const Tensor& x, const Tensor& y) { return x / y; }, a, b);
  // f = a/b: f_aa = 0, f_ab = f_ba = -1/b², f_bb = 2a/b³
  check_values(d[0], {5}, std::vector<double>(5, 0.0));
  const auto mixed = elementwise(b, [](double y) { return -1 / (y * y); });
  check_values(d[1], {5}, mixed);
  check_values(d[2], {5}, mixed);
  check_values(d[3], {5}, elementwise2(a, b, [](double x, double y) { return 2 * x / (y * y * y); }));
  const auto m = hessian_blocks([](const Tensor& x, const Tensor& y) { return x * y; }, a, b);
  // f = a·b: f_ab = f_ba = 1, f_aa = f_bb = 0
  check_values(m[1], {5}, std::vector<double>(5, 1.0));
  check_values(m[2], {5}, std::vector<double>(5, 1.0));
  check_values(m[0], {5}, std::vector<double>(5, 0.0));
  // rdiv: d²(c/x)/dx² = 2c/x³
  const auto [g, h] = first_and_second([](const Tensor& x) { return ag::rdiv(x, 1.7); }, b);
  check_values(h, {5}, elementwise(b, [](double x) { return 2 * 1.7 / (x * x * x); }));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(unary_ops)

BOOST_AUTO_TEST_CASE(every_unary_op) {
  const Tensor x = input({3, 4}, 71), p = uniform_input({3, 4}, 0.3, 2.0, 72);
  const std::vector<std::pair<std::string, Unary>> on_reals = {
      {"neg", [](const Tensor& t) { return ag::neg(t); }},
      {"exp", [](const Tensor& t) { return ag::exp(t); }},
      {"square", [](const Tensor& t) { return ag::square(t); }},
      {"abs", [](const Tensor& t) { return ag::abs(t); }},
      {"tanh", [](const Tensor& t) { return ag::tanh(t); }},
      {"sigmoid", [](const Tensor& t) { return ag::sigmoid(t); }},
      {"relu", [](const Tensor& t) { return ag::relu(t); }},
      {"gelu", [](const Tensor& t) { return ag::gelu(t); }},
      {"gelu (tanh)", [](const Tensor& t) { return ag::gelu(t, ag::GeluApproximation::Tanh); }},
      {"clamp", [](const Tensor& t) { return ag::clamp(t, -0.5, 0.5); }},
  };
  for (const auto& [name, f] : on_reals) check_op("unary", name, unary_fn(f), {x});
  const std::vector<std::pair<std::string, Unary>> on_positives = {
      {"log", [](const Tensor& t) { return ag::log(t); }},
      {"sqrt", [](const Tensor& t) { return ag::sqrt(t); }},
      {"rsqrt", [](const Tensor& t) { return ag::rsqrt(t); }},
  };
  for (const auto& [name, f] : on_positives) check_op("unary", name, unary_fn(f), {p});
  // piecewise-linear ops between smooth ones: second derivatives come from the smooth parts
  check_op("unary", "relu, abs and clamp in products",
           unary_fn([](const Tensor& t) {
             return ag::relu(t) * t + ag::abs(t) * ag::exp(t) + ag::clamp(t, -0.5, 0.5) * t;
           }),
           {x});
}

BOOST_AUTO_TEST_CASE(second_derivatives_match_the_closed_form) {
  const Tensor x = ag::tensor({-2.1, -0.7, -0.2, 0.3, 0.9, 1.8}, {6}, Dtype::Float64).requires_grad_();
  const Tensor p = ag::tensor({0.2, 0.5, 1.0, 1.7, 3.0, 7.5}, {6}, Dtype::Float64).requires_grad_();
  struct Case {
    const char* name;
    Unary f;
    const Tensor* at;
    std::function<double(double)> d1, d2;
  };
  const double s = std::sqrt(2 / kPi), c = 0.044715;
  auto tanh_gelu = [s, c](double v, int order) {  // the tanh-approximated gelu's derivatives, by the chain rule
    const double t = std::tanh(s * (v + c * v * v * v));
    const double du = s * (1 + 3 * c * v * v), d2u = 6 * s * c * v;
    const double dt = (1 - t * t) * du, d2t = -2 * t * dt * du + (1 - t * t) * d2u;
    return order == 1 ? 0.5 * (1 + t) + 0.5 * v * dt : dt + 0.5 * v * d2t;
  };
  auto sig = [](double v) { return 1 / (1 + std::exp(-v)); };
  const std::vector<Case> cases = {
      {"exp", [](const Tensor& t) { return ag::exp(t); }, &x, [](double v) { return std::exp(v); },
       [](double v) { return std::exp(v); }},
      {"log", [](const Tensor& t) { return ag::log(t); }, &p, [](double v) { return 1 / v; },
       [](double v) { return -1 / (v * v); }},
      {"sqrt", [](const Tensor& t) { return ag::sqrt(t); }, &p, [](double v) { return 0.5 / std::sqrt(v); },
       [](double v) { return -0.25 / (v * std::sqrt(v)); }},
      {"rsqrt", [](const Tensor& t) { return ag::rsqrt(t); }, &p, [](double v) { return -0.5 * std::pow(v, -1.5); },
       [](double v) { return 0.75 * std::pow(v, -2.5); }},
      {"tanh", [](const Tensor& t) { return ag::tanh(t); }, &x,
       [](double v) { return 1 - std::tanh(v) * std::tanh(v); },
       [](double v) { return -2 * std::tanh(v) * (1 - std::tanh(v) * std::tanh(v)); }},
      {"sigmoid", [](const Tensor& t) { return ag::sigmoid(t); }, &x, [sig](double v) { return sig(v) * (1 - sig(v)); },
       [sig](double v) { return sig(v) * (1 - sig(v)) * (1 - 2 * sig(v)); }},
      {"gelu", [](const Tensor& t) { return ag::gelu(t); }, &x,
       [](double v) { return 0.5 * (1 + std::erf(v / std::sqrt(2.0))) + v * normal_pdf(v); },
       [](double v) { return normal_pdf(v) * (2 - v * v); }},
      {"gelu (tanh)", [](const Tensor& t) { return ag::gelu(t, ag::GeluApproximation::Tanh); }, &x,
       [tanh_gelu](double v) { return tanh_gelu(v, 1); }, [tanh_gelu](double v) { return tanh_gelu(v, 2); }},
      {"square", [](const Tensor& t) { return ag::square(t); }, &x, [](double v) { return 2 * v; },
       [](double) { return 2.0; }},
      {"pow 3", [](const Tensor& t) { return ag::pow(t, 3.0); }, &x, [](double v) { return 3 * v * v; },
       [](double v) { return 6 * v; }},
      {"pow -0.7", [](const Tensor& t) { return ag::pow(t, -0.7); }, &p, [](double v) { return -0.7 * std::pow(v, -1.7); },
       [](double v) { return 0.7 * 1.7 * std::pow(v, -2.7); }},
  };
  for (const auto& k : cases) {
    BOOST_TEST_CONTEXT(k.name) {
      const auto [g, h] = first_and_second(k.f, *k.at);
      check_values(g, {6}, elementwise(*k.at, k.d1));
      check_values(h, {6}, elementwise(*k.at, k.d2));
    }
  }
}

// Ops that have an equivalent composed of other ops: the same Hessian-vector products.
BOOST_AUTO_TEST_CASE(hessian_vector_products_agree_with_composed_equivalents) {
  const Tensor x = input({3, 4}, 91), p = uniform_input({3, 4}, 0.3, 2.0, 92), w = input({3, 4}, 93);
  const Tensor v = input({3, 4}, 94).detach();
  const double s = std::sqrt(2 / kPi);
  const std::vector<std::tuple<const char*, Unary, Unary, const Tensor*>> pairs = {
      {"sigmoid", [](const Tensor& t) { return ag::sigmoid(t); },
       [](const Tensor& t) { return 1.0 / (ag::exp(-t) + 1.0); }, &x},
      {"tanh", [](const Tensor& t) { return ag::tanh(t); },
       [](const Tensor& t) { return 1.0 - 2.0 / (ag::exp(t * 2.0) + 1.0); }, &x},
      {"gelu (tanh)", [](const Tensor& t) { return ag::gelu(t, ag::GeluApproximation::Tanh); },
       [s](const Tensor& t) { return t * 0.5 * (ag::tanh((t + t * t * t * 0.044715) * s) + 1.0); }, &x},
      {"square", [](const Tensor& t) { return ag::square(t); }, [](const Tensor& t) { return t * t; }, &x},
      {"pow 3", [](const Tensor& t) { return ag::pow(t, 3.0); }, [](const Tensor& t) { return t * t * t; }, &x},
      {"relu", [](const Tensor& t) { return ag::relu(t) * t; },
       [](const Tensor& t) { return ag::maximum(t, ag::zeros_like(t)) * t; }, &x},
      {"clamp", [](const Tensor& t) { return ag::clamp(t, -0.5, 0.5) * t; },
       [](const Tensor& t) {
         const Tensor lo = ag::full(t.shape(), -0.5, Dtype::Float64), hi = ag::full(t.shape(), 0.5, Dtype::Float64);
         return ag::minimum(ag::maximum(t, lo), hi) * t;
       }, &x},
      {"abs", [](const Tensor& t) { return ag::abs(t) * t; },
       [](const Tensor& t) { return ag::maximum(t, -t) * t; }, &x},
      {"rsqrt", [](const Tensor& t) { return ag::rsqrt(t); }, [](const Tensor& t) { return 1.0 / ag::sqrt(t); }, &p},
      {"sqrt", [](const Tensor& t) { return ag::sqrt(t); }, [](const Tensor& t) { return ag::exp(ag::log(t) * 0.5); }, &p},
      {"rdiv", [](const Tensor& t) { return ag::rdiv(t, 2.0); }, [](const Tensor& t) { return ag::pow(t, -1.0) * 2.0; }, &p},
  };
  for (const auto& [name, fused, composed, at] : pairs) {
    BOOST_TEST_CONTEXT(name) {
      auto loss = [w](const Unary& f) {
        return [w, f](const TensorList& in) { return ag::sum(f(in[0]) * w); };
      };
      const Tensor a = ag::hvp(loss(fused), {*at}, {v})[0], b = ag::hvp(loss(composed), {*at}, {v})[0];
      check_values(a, b.shape(), b.to_vector(), 1e-12);
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(third_order)

// The composed backward rules are differentiable again, to any order: third derivatives against
// their closed forms, and gradgradcheck of a function that is itself a gradient (create_graph).
BOOST_AUTO_TEST_CASE(third_derivatives_match_the_closed_form) {
  const Tensor x = ag::tensor({-1.3, -0.4, 0.2, 0.8, 1.6}, {5}, Dtype::Float64).requires_grad_();
  const Tensor p = ag::tensor({0.3, 0.7, 1.0, 2.2, 4.0}, {5}, Dtype::Float64).requires_grad_();
  auto sig = [](double v) { return 1 / (1 + std::exp(-v)); };
  const std::vector<std::tuple<const char*, Unary, const Tensor*, std::function<double(double)>>> cases = {
      {"exp", [](const Tensor& t) { return ag::exp(t); }, &x, [](double v) { return std::exp(v); }},
      {"log", [](const Tensor& t) { return ag::log(t); }, &p, [](double v) { return 2 / (v * v * v); }},
      {"sqrt", [](const Tensor& t) { return ag::sqrt(t); }, &p, [](double v) { return 0.375 * std::pow(v, -2.5); }},
      {"tanh", [](const Tensor& t) { return ag::tanh(t); }, &x,
       [](double v) {
         const double t = std::tanh(v);
         return -2 * (1 - t * t) * (1 - 3 * t * t);
       }},
      {"sigmoid", [](const Tensor& t) { return ag::sigmoid(t); }, &x,
       [sig](double v) {
         const double s = sig(v);
         return s * (1 - s) * (1 - 6 * s + 6 * s * s);
       }},
      {"gelu", [](const Tensor& t) { return ag::gelu(t); }, &x,  // (φ(x)(2 - x²))' = φ(x)(x³ - 4x)
       [](double v) { return normal_pdf(v) * (v * v * v - 4 * v); }},
      {"pow 3.5", [](const Tensor& t) { return ag::pow(t, 3.5); }, &p,
       [](double v) { return 3.5 * 2.5 * 1.5 * std::pow(v, 0.5); }},
  };
  for (const auto& [name, f, at, d3] : cases) {
    BOOST_TEST_CONTEXT(name) {
      const Tensor g = ag::grad({ag::sum(f(*at))}, {*at}, {.create_graph = true})[0];
      const Tensor h = ag::grad({ag::sum(g)}, {*at}, {.create_graph = true})[0];
      check_values(ag::grad({ag::sum(h)}, {*at})[0], {5}, elementwise(*at, d3));
    }
  }
}

BOOST_AUTO_TEST_CASE(gelu_derivatives_at_huge_inputs_are_their_limits_not_nan) {
  // Far out gelu is x (x > 0) or 0 (x < 0): first derivative 1 or 0, second 0. Computing them
  // there must not form 0·inf (φ(x)·x², (1 - tanh²)·x³).
  for (const Dtype dtype : {Dtype::Float64, Dtype::Float32}) {
    const double big = dtype == Dtype::Float64 ? 1e300 : 3e38, mid = dtype == Dtype::Float64 ? 1e30 : 1e20;
    const Tensor x = ag::tensor({-big, -mid, -45.0, 45.0, mid, big}, {6}, dtype).requires_grad_();
    for (const auto approximate : {ag::GeluApproximation::None, ag::GeluApproximation::Tanh}) {
      BOOST_TEST_CONTEXT(ag::dtype_name(dtype) << ", tanh " << (approximate == ag::GeluApproximation::Tanh)) {
        const Tensor g = ag::grad({ag::sum(ag::gelu(x, approximate))}, {x}, {.create_graph = true})[0];
        const Tensor h = ag::grad({ag::sum(g)}, {x})[0];
        check_values(g, {6}, {0, 0, 0, 1, 1, 1});
        check_values(h, {6}, {0, 0, 0, 0, 0, 0});
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(gradgradcheck_of_a_gradient) {
  const Tensor a = input({2, 1, 3}, 95), b = uniform_input({4, 3}, 0.5, 2.0, 96);
  auto gradient = [](const TensorList& in) {
    const Tensor y = ag::pow(in[1], in[0]) * ag::sigmoid(in[0]) / in[1] + ag::gelu(in[0] * in[1]) +
                     ag::maximum(ag::tanh(in[0]), ag::log(in[1]) * 0.3);
    const TensorList g = ag::grad({ag::sum(y * y)}, in, {.create_graph = true});
    return ag::cat({ag::reshape(g[0], {-1}), ag::reshape(g[1], {-1})}, 0);
  };
  double_backward::second_order_ok("third order", "gradient of a mixed expression", gradient, {a, b});
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(conventions)

// At the kinks the first derivative is PyTorch's (relu'(0) = 0, sign(0) = 0, clamp passes only
// strictly inside, ties of maximum/minimum split evenly) and the second derivative is zero.
BOOST_AUTO_TEST_CASE(kinks_have_the_first_order_value_and_zero_second_derivative) {
  const Tensor x = ag::tensor({-1.0, 0.0, 0.5, 1.0}, {4}, Dtype::Float64).requires_grad_();
  const std::vector<std::tuple<const char*, Unary, std::vector<double>>> cases = {
      {"relu", [](const Tensor& t) { return ag::relu(t); }, {0, 0, 1, 1}},
      {"abs", [](const Tensor& t) { return ag::abs(t); }, {-1, 0, 1, 1}},
      {"clamp", [](const Tensor& t) { return ag::clamp(t, 0.0, 1.0); }, {0, 0, 1, 0}},
  };
  for (const auto& [name, f, slope] : cases) {
    BOOST_TEST_CONTEXT(name) {
      const Tensor g = ag::grad({ag::sum(f(x))}, {x}, {.create_graph = true})[0];
      check_values(g, {4}, slope);
      // g is dy times a constant mask: its derivative in x is zero, so no graph leads back to x
      // from it, or one that gives zeros.
      if (g.requires_grad()) {
        const TensorList h = ag::grad({ag::sum(g * g)}, {x}, {.allow_unused = true});
        if (h[0].defined()) check_values(h[0], {4}, {0, 0, 0, 0});
      }
      // inside a chain the second derivative is the smooth part's alone: d²(f(x)²)/dx² = 2f'²
      const Tensor g2 = ag::grad({ag::sum(f(x) * f(x))}, {x}, {.create_graph = true})[0];
      std::vector<double> twice_slope_squared;
      for (double v : slope) twice_slope_squared.push_back(2 * v * v);
      check_values(ag::grad({ag::sum(g2)}, {x})[0], {4}, twice_slope_squared);
    }
  }
  const Tensor a = ag::tensor({1.0, 2.0, 3.0}, {3}, Dtype::Float64).requires_grad_();
  const Tensor b = ag::tensor({1.0, 2.5, 0.5}, {3}, Dtype::Float64).requires_grad_();
  for (bool is_max : {true, false}) {
    const Tensor y = is_max ? ag::maximum(a, b) : ag::minimum(a, b);
    const TensorList g = ag::grad({ag::sum(y)}, {a, b}, {.create_graph = true});
    check_values(g[0], {3}, is_max ? std::vector<double>{0.5, 0, 1} : std::vector<double>{0.5, 1, 0});
    check_values(g[1], {3}, is_max ? std::vector<double>{0.5, 1, 0} : std::vector<double>{0.5, 0, 1});
    if (g[0].requires_grad()) {
      const TensorList h = ag::grad({ag::sum(g[0] * g[0])}, {a, b}, {.allow_unused = true});
      for (const Tensor& t : h)
        if (t.defined()) check_values(t, {3}, {0, 0, 0});
    }
  }
}

// The composed backward is the same gradient as the kernel one.
BOOST_AUTO_TEST_CASE(create_graph_gradients_equal_the_first_order_ones) {
  const Tensor x = input({2, 3, 4}, 81), q = uniform_input({3, 4}, 0.3, 2.0, 82), m = input({3, 1}, 83);
  const Tensor mask = ag::tensor({0, 1, 0}, {3, 1}, Dtype::Float64);
  const std::vector<std::pair<std::string, ag::GradcheckFn>> fns = {
      {"unary", [](const TensorList& in) {
         const Tensor& t = in[0];
         return ag::exp(t) + ag::tanh(t) * ag::sigmoid(t) + ag::relu(t) + ag::abs(t) + ag::gelu(t) +
                ag::gelu(t, ag::GeluApproximation::Tanh) + ag::clamp(t, -0.3, 0.4) + ag::square(t) - t;
       }},
      {"positive", [](const TensorList& in) {
         const Tensor& t = in[1];
         return ag::log(t) + ag::sqrt(t) + ag::rsqrt(t) + ag::pow(t, -0.7) + ag::pow(t, 2.0) + ag::rdiv(t, 3.0);
       }},
      {"binary", [mask](const TensorList& in) {
         return ag::pow(in[1], in[2]) + in[0] / in[1] * in[2] + ag::maximum(in[0], in[2]) - ag::minimum(in[0], in[1]) +
                ag::where(mask, in[0], in[2]) + ag::masked_fill(in[0], mask, 2.0);
       }},
  };
  for (const auto& [name, f] : fns) {
    BOOST_TEST_CONTEXT(name) {
      const TensorList in = {x, q, m};
      const Tensor y = ag::sum(f(in) * f(in));
      const TensorList plain = ag::grad({y}, in, {.retain_graph = true, .allow_unused = true});
      const TensorList graph = ag::grad({y}, in, {.create_graph = true, .allow_unused = true});
      for (std::size_t i = 0; i < in.size(); ++i) {
        BOOST_TEST(plain[i].defined() == graph[i].defined());
        if (plain[i].defined()) check_values(graph[i], plain[i].shape(), plain[i].to_vector(), 1e-14);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(report) { double_backward::print_worst("elementwise"); }

BOOST_AUTO_TEST_SUITE_END()
