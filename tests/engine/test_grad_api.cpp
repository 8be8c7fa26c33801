// The functional gradient (grad), backward with create_graph, gradgradcheck and hvp: what they
// return, what they leave alone, and how they refuse bad requests. The second derivatives of
// each op family are checked in test_double_backward_*.cpp.
#define BOOST_TEST_MODULE grad_api
#include <boost/test/unit_test.hpp>

#include <autograd/autograd.hpp>

#include "test_support.hpp"

namespace ag = autograd;
using ag::Dtype;
using ag::Tensor;
using ag::TensorList;
using test_support::check_values;
using test_support::Cube;
using test_support::input;

namespace {

// A predicate for BOOST_CHECK_EXCEPTION: the message holds `part`.
auto message_has(const std::string& part) {
  return [part](const std::exception& e) { return test_support::message_has(e, {part}); };
}

Tensor vec(std::vector<double> v) {
  const auto n = static_cast<std::int64_t>(v.size());
  return ag::tensor(v, {n}, Dtype::Float64).requires_grad_();
}

// Cube with a backward that is right to first order but wrong to second: 3x² is computed from
// a detached x, so its derivative through x is lost (the negative control of gradgradcheck).
struct CubeDetachedBackward : ag::Function<CubeDetachedBackward> {
  static constexpr const char* name = "cube_detached";
  static Tensor forward(ag::FunctionCtx& ctx, const Tensor& x) {
    ctx.save_for_backward({x});
    return x * x * x;
  }
  static TensorList backward(ag::FunctionCtx& ctx, const TensorList& g) {
    const Tensor x = ctx.saved_tensors()[0].detach();
    return {g[0] * 3.0 * x * x};
  }
};

// Square whose backward computes with raw values: no graph of it can be built.
struct SquareRawBackward : ag::Function<SquareRawBackward> {
  static constexpr const char* name = "square_raw";
  static Tensor forward(ag::FunctionCtx& ctx, const Tensor& x) {
    ctx.save_for_backward({x});
    return x * x;
  }
  static TensorList backward(ag::FunctionCtx& ctx, const TensorList& g) {
    const auto x = ctx.saved_tensors()[0].to_vector();
    auto d = g[0].to_vector();
    for (std::size_t i = 0; i < d.size(); ++i) d[i] *= 2.0 * x[i];
    return {ag::tensor(d, g[0].shape(), g[0].dtype())};
  }
};

// The same, declared once_differentiable: create_graph through it refuses.
struct SquareOnce : ag::Function<SquareOnce> {
  static constexpr const char* name = "square_once";
  static constexpr bool once_differentiable = true;
  static Tensor forward(ag::FunctionCtx& ctx, const Tensor& x) { return SquareRawBackward::forward(ctx, x); }
  static TensorList backward(ag::FunctionCtx& ctx, const TensorList& g) { return SquareRawBackward::backward(ctx, g); }
};

}  // namespace

BOOST_AUTO_TEST_SUITE(functional_grad)

BOOST_AUTO_TEST_CASE(returns_gradients_and_writes_no_grad) {
  Tensor x = vec({1.0, 2.0, 3.0}), w = vec({0.5, -1.0, 2.0});
  Tensor h = x * w;  // a non-leaf input too
  h.retain_grad();
  Tensor y = ag::sum(h * x);  // y = Σ w x²
  const TensorList g = ag::grad({y}, {x, w, h});
  check_values(g[0], {3}, {2 * 0.5 * 1, 2 * -1.0 * 2, 2 * 2.0 * 3});
  check_values(g[1], {3}, {1, 4, 9});
  check_values(g[2], {3}, {1, 2, 3});
  BOOST_TEST(!x.grad().defined());
  BOOST_TEST(!w.grad().defined());
  BOOST_TEST(!h.grad().defined());  // retain_grad's hook stores nothing for grad()
  BOOST_TEST(!g[0].requires_grad());
}

BOOST_AUTO_TEST_CASE(grad_outputs_weight_the_outputs) {
  Tensor x = vec({1.0, 2.0});
  Tensor y = x * x;
  const TensorList g = ag::grad({y}, {x}, {.grad_outputs = {ag::tensor({3.0, -1.0}, {2}, Dtype::Float64)}});
  check_values(g[0], {2}, {3 * 2 * 1.0, -1 * 2 * 2.0});
}

BOOST_AUTO_TEST_CASE(several_outputs_add_up) {
  Tensor x = vec({1.0, 2.0});
  const TensorList g = ag::grad({ag::sum(x * x), ag::sum(x * 3.0)}, {x});
  check_values(g[0], {2}, {2 + 3, 4 + 3});
}

BOOST_AUTO_TEST_CASE(runs_only_the_graph_between_outputs_and_inputs) {
  // The branch through `other` is not walked: its node keeps its saved tensors, so a later
  // backward can still run it.
  Tensor x = vec({1.0, 2.0}), other = vec({3.0, 4.0});
  Tensor y = ag::sum(x * 2.0) + ag::sum(other * other);
  ag::grad({y}, {x});
  BOOST_TEST(!other.grad().defined());
}

BOOST_AUTO_TEST_CASE(rules_skip_the_input_gradients_grad_did_not_ask_for) {
  // y = p·q through a node that notes what needs_input_grad says while its rule runs. grad() with
  // respect to some inputs asks a rule only for the gradients that lead to one of them (as
  // PyTorch's should_compute_output); backward() asks for every gradient.
  std::vector<std::pair<bool, bool>> asked;
  const auto probe = [&asked](const Tensor& p, const Tensor& q) {
    Tensor out;
    {
      ag::NoGradGuard no_grad;
      out = p * q;
    }
    const Tensor pd = p.detach(), qd = q.detach();
    return ag::record("probe", {p, q}, out, [&asked, pd, qd](const TensorList& g, const ag::Node& node) {
      asked.emplace_back(node.needs_input_grad(0), node.needs_input_grad(1));
      return TensorList{node.needs_input_grad(0) ? g[0] * qd : Tensor(), node.needs_input_grad(1) ? g[0] * pd : Tensor()};
    });
  };
  Tensor a = vec({1.0, 2.0}), b = vec({3.0, 4.0});
  Tensor h = a * 2.0;  // a non-leaf input, and a leaf behind it
  const Tensor y = ag::sum(probe(h, b));
  check_values(ag::grad({y}, {a}, {.retain_graph = true})[0], {2}, {6, 8});
  check_values(ag::grad({y}, {h}, {.retain_graph = true})[0], {2}, {3, 4});
  check_values(ag::grad({y}, {b}, {.retain_graph = true})[0], {2}, {2, 4});
  const TensorList both = ag::grad({y}, {a, b}, {.retain_graph = true});
  check_values(both[0], {2}, {6, 8});
  check_values(both[1], {2}, {2, 4});
  // Outside any walk the edge alone decides.
  BOOST_TEST(y.grad_fn()->needs_input_grad(0));
  y.backward();
  check_values(a.grad(), {2}, {6, 8});
  check_values(b.grad(), {2}, {2, 4});
  const std::vector<std::pair<bool, bool>> expected = {{true, false}, {true, false}, {false, true}, {true, true},
                                                       {true, true}};
  BOOST_TEST((asked == expected));
}

BOOST_AUTO_TEST_CASE(frees_the_graph_unless_retained) {
  Tensor x = vec({1.0, 2.0});
  Tensor y = ag::sum(x * x);
  ag::grad({y}, {x}, {.retain_graph = true});
  ag::grad({y}, {x});
  BOOST_CHECK_EXCEPTION(ag::grad({y}, {x}), std::runtime_error, message_has("already freed"));
}

BOOST_AUTO_TEST_CASE(unused_inputs_are_errors_unless_allowed) {
  Tensor x = vec({1.0, 2.0}), unused = vec({5.0});
  Tensor y = ag::sum(x * x);
  BOOST_CHECK_EXCEPTION(ag::grad({y}, {x, unused}, {.retain_graph = true}), std::invalid_argument,
                        message_has("input 1 [1] is not used by the outputs"));
  const TensorList g = ag::grad({y}, {x, unused}, {.allow_unused = true});
  BOOST_TEST(g[0].defined());
  BOOST_TEST(!g[1].defined());
}

BOOST_AUTO_TEST_CASE(bad_requests_name_what_is_wrong) {
  Tensor x = vec({1.0, 2.0});
  Tensor constant = ag::tensor({1.0, 2.0}, {2}, Dtype::Float64);
  Tensor y = x * x;
  BOOST_CHECK_EXCEPTION(ag::grad({y}, {x}), std::invalid_argument, message_has("only for a one-element output"));
  BOOST_CHECK_EXCEPTION(ag::grad({y}, {constant}), std::invalid_argument, message_has("input 0 [2] does not require grad"));
  BOOST_CHECK_EXCEPTION(ag::grad({constant}, {x}), std::invalid_argument, message_has("output 0 [2] does not require grad"));
  BOOST_CHECK_EXCEPTION(ag::grad({y}, {x}, {.grad_outputs = {ag::ones({3}, Dtype::Float64)}}), std::invalid_argument,
                        message_has("grad_outputs[0] is [3] Float64 but output 0 is [2] Float64"));
  BOOST_CHECK_EXCEPTION(ag::grad({y}, {x}, {.grad_outputs = {ag::ones({2}), ag::ones({2})}}), std::invalid_argument,
                        message_has("1 outputs but 2 grad_outputs"));
  BOOST_CHECK_EXCEPTION(ag::grad({}, {x}), std::invalid_argument, message_has("no outputs"));
  BOOST_CHECK_EXCEPTION(ag::grad({y}, {}), std::invalid_argument, message_has("no inputs"));
  BOOST_CHECK_EXCEPTION(ag::grad({y}, {Tensor()}), std::invalid_argument, message_has("input 0 is an undefined tensor"));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(create_graph)

BOOST_AUTO_TEST_CASE(derivatives_to_any_order) {
  // y = x³ through mul: y' = 3x², y'' = 6x, y''' = 6.
  Tensor x = vec({2.0});
  Tensor y = x * x * x;
  const Tensor d1 = ag::grad({y}, {x}, {.create_graph = true})[0];
  BOOST_TEST(d1.requires_grad());
  const Tensor d2 = ag::grad({d1}, {x}, {.create_graph = true})[0];
  const Tensor d3 = ag::grad({d2}, {x}, {.create_graph = true})[0];
  check_values(d1, {1}, {12.0});
  check_values(d2, {1}, {12.0});
  check_values(d3, {1}, {6.0});
  BOOST_TEST(!d3.requires_grad());  // a constant: nothing further to differentiate
  BOOST_CHECK_EXCEPTION(ag::grad({d3}, {x}), std::invalid_argument, message_has("output 0 [1] does not require grad"));
}

BOOST_AUTO_TEST_CASE(backward_with_create_graph_leaves_a_differentiable_grad) {
  Tensor x = vec({1.0, -2.0});
  Tensor y = ag::sum(x * x * x);
  y.backward({.create_graph = true});
  const Tensor g = x.grad();  // 3x², part of a graph
  check_values(g, {2}, {3.0, 12.0});
  BOOST_TEST(g.requires_grad());
  x.set_grad(Tensor());
  ag::sum(g).backward();  // d(Σ 3x²)/dx = 6x
  check_values(x.grad(), {2}, {6.0, -12.0});
}

BOOST_AUTO_TEST_CASE(a_gradient_penalty_step) {
  // loss = Σ w·x + λ‖d/dx Σ (w·x)²‖², the gradient of the loss in w through the penalty.
  Tensor x = vec({1.0, 2.0}), w = vec({0.5, -1.0});
  const Tensor f = ag::sum((w * x) * (w * x));
  const Tensor gx = ag::grad({f}, {x}, {.create_graph = true})[0];  // 2w²x
  const Tensor loss = ag::sum(gx * gx);                             // Σ 4w⁴x²
  loss.backward();
  // d/dw Σ 4 w⁴ x² = 16 w³ x²
  check_values(w.grad(), {2}, {16 * 0.125 * 1.0, 16 * -1.0 * 4.0});
}

BOOST_AUTO_TEST_CASE(custom_function_with_differentiable_backward) {
  Tensor x = vec({1.5, -0.5});
  const Tensor d1 = ag::grad({ag::sum(Cube::apply(x))}, {x}, {.create_graph = true})[0];
  const Tensor d2 = ag::grad({ag::sum(d1)}, {x})[0];
  check_values(d2, {2}, {6 * 1.5, 6 * -0.5});
}

BOOST_AUTO_TEST_CASE(a_backward_that_cannot_build_a_graph_says_so) {
  Tensor x = vec({1.5, -0.5});
  Tensor y = SquareRawBackward::apply(x);
  Tensor z = ag::sum(y * y);
  BOOST_CHECK_EXCEPTION(ag::grad({z}, {x}, {.create_graph = true}), std::runtime_error,
                        message_has("backward of 'square_raw' cannot be differentiated again"));
  // First order is fine.
  Tensor y2 = SquareRawBackward::apply(x);
  check_values(ag::grad({ag::sum(y2 * y2)}, {x})[0], {2}, {4 * 1.5 * 1.5 * 1.5, 4 * -0.125});
}

BOOST_AUTO_TEST_CASE(a_once_differentiable_function_refuses_create_graph) {
  // Seeded directly (nothing upstream carries a graph), so only the declaration can tell.
  Tensor x = vec({1.5, -0.5});
  BOOST_CHECK_EXCEPTION(ag::grad({ag::sum(SquareOnce::apply(x))}, {x}, {.create_graph = true}), std::runtime_error,
                        message_has("backward of 'square_once' is declared once_differentiable"));
  check_values(ag::grad({ag::sum(SquareOnce::apply(x))}, {x})[0], {2}, {3.0, -1.0});
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(second_order_checks)

BOOST_AUTO_TEST_CASE(gradgradcheck_passes_right_second_derivatives) {
  Tensor a = input({2, 3}, 1), b = input({3}, 2);
  const auto r = ag::gradgradcheck([](const TensorList& in) { return in[0] * in[0] * in[1] + in[1]; }, {a, b});
  BOOST_TEST(r.ok, fmt::format("{}", r));
  BOOST_TEST(r.elements_checked > 0);
  BOOST_TEST(!a.grad().defined());
}

BOOST_AUTO_TEST_CASE(gradgradcheck_fails_a_wrong_double_backward) {
  Tensor x = input({4}, 3);
  const auto right = ag::gradgradcheck([](const TensorList& in) { return Cube::apply(in[0]); }, {x});
  BOOST_TEST(right.ok, fmt::format("{}", right));
  const auto wrong = ag::gradgradcheck([](const TensorList& in) { return CubeDetachedBackward::apply(in[0]); }, {x});
  BOOST_TEST(!wrong.ok);
  BOOST_TEST(wrong.message.find("second derivative of the gradient of input 0") != std::string::npos, wrong.message);
  // First order it is right: gradcheck cannot tell.
  BOOST_TEST(ag::gradcheck([](const TensorList& in) { return CubeDetachedBackward::apply(in[0]); }, {x}).ok);
}

BOOST_AUTO_TEST_CASE(hvp_of_a_quadratic_form) {
  // f(x) = ½ xᵀAx + Σ x³/3 with A symmetric: H = A + diag(2x), so Hv = Av + 2x∘v.
  const std::vector<double> A = {2.0, 1.0, 0.0, 1.0, 3.0, -1.0, 0.0, -1.0, 4.0};
  Tensor x = vec({0.5, -1.0, 2.0});
  const Tensor Am = ag::tensor(A, {3, 3}, Dtype::Float64);
  auto f = [&](const TensorList& in) {
    const Tensor outer = ag::reshape(in[0], {3, 1}) * ag::reshape(in[0], {1, 3});  // x_i x_j
    return ag::sum(Am * outer) * 0.5 +
           ag::sum(in[0] * in[0] * in[0]) / 3.0;
  };
  const Tensor v = ag::tensor({1.0, 2.0, -1.0}, {3}, Dtype::Float64);
  const TensorList hv = ag::hvp(f, {x}, {v});
  std::vector<double> expected(3);
  const auto xs = x.to_vector(), vs = v.to_vector();
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) expected[i] += A[3 * i + j] * vs[j];
    expected[i] += 2 * xs[i] * vs[i];
  }
  check_values(hv[0], {3}, expected);
  BOOST_TEST(!x.grad().defined());
  BOOST_CHECK_EXCEPTION(ag::hvp(f, {x}, {}), std::invalid_argument, message_has("1 inputs but 0 vectors"));
  BOOST_CHECK_EXCEPTION(ag::hvp(f, {x}, {ag::ones({2}, Dtype::Float64)}), std::invalid_argument,
                        message_has("v[0] is [2] Float64 but input 0 is [3] Float64"));
  BOOST_CHECK_EXCEPTION(ag::hvp([](const TensorList& in) { return in[0] * 2.0; }, {x}, {v}), std::invalid_argument,
                        message_has("must return one element"));
}

BOOST_AUTO_TEST_SUITE_END()
