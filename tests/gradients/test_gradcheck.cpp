// The checker itself: it passes right gradients, fails wrong ones (negative controls), points
// at the wrong element, and leaves its inputs as it found them. Also custom functions.
#define BOOST_TEST_MODULE gradcheck
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <limits>

#include <autograd/autograd.hpp>

#include "test_support.hpp"

namespace ag = autograd;
using ag::Dtype;
using ag::Tensor;
using ag::TensorList;
using test_support::Cube;
using test_support::input;

namespace {

// The same forward, with a backward that is wrong at exactly one element (flat index 4).
struct CubeWrongAtFour : ag::Function<CubeWrongAtFour> {
  static constexpr const char* name = "cube_wrong";
  static Tensor forward(ag::FunctionCtx& ctx, const Tensor& x) {
    ctx.save_for_backward({x});
    return x * x * x;
  }
  static TensorList backward(ag::FunctionCtx& ctx, const TensorList& g) {
    Tensor x = ctx.saved_tensors()[0];
    std::vector<double> bump(static_cast<std::size_t>(x.numel()), 1.0);
    bump[4] = 1.01;  // a 1% error in one element
    return {g[0] * 3.0 * x * x * ag::tensor(bump, x.shape(), x.dtype())};
  }
};

// Two inputs, two outputs: (a·b, a + b), with a correct backward.
struct ProductAndSum : ag::Function<ProductAndSum> {
  static TensorList forward(ag::FunctionCtx& ctx, const Tensor& a, const Tensor& b) {
    ctx.save_for_backward({a, b});
    return {a * b, a + b};
  }
  static TensorList backward(ag::FunctionCtx& ctx, const TensorList& g) {
    auto s = ctx.saved_tensors();
    // p = a·b, q = a + b  =>  da = dp·b + dq, db = dp·a + dq
    return {g[0] * s[1] + g[1], g[0] * s[0] + g[1]};
  }
};

// The identity, with a backward that leaves a 1e-14 residue on every element: also on the
// Jacobian's zero entries, where the numeric derivative is exactly 0.
struct IdentityWithResidue : ag::Function<IdentityWithResidue> {
  static Tensor forward(ag::FunctionCtx&, const Tensor& x) { return x * 1.0; }
  static TensorList backward(ag::FunctionCtx&, const TensorList& g) { return {g[0] + 1e-14}; }
};

}  // namespace

BOOST_AUTO_TEST_CASE(relative_error_ignores_derivatives_below_atol) {
  Tensor x = input({3}, 5);
  auto r = ag::gradcheck([](const TensorList& in) { return IdentityWithResidue::apply(in[0]); }, {x});
  BOOST_TEST_MESSAGE(fmt::format("{}", r));
  BOOST_CHECK(r.ok);
  BOOST_CHECK_GT(r.max_abs_error, 0.0);     // the residue is seen
  BOOST_CHECK_LT(r.max_rel_error, 1e-6);    // but a zero derivative off by 1e-14 is not "100 % off"
}

BOOST_AUTO_TEST_CASE(correct_custom_backward_passes) {
  Tensor x = input({2, 3}, 1);
  auto r = ag::gradcheck([](const TensorList& in) { return Cube::apply(in[0]); }, {x});
  BOOST_TEST_MESSAGE(fmt::format("{}", r));
  BOOST_CHECK(r.ok);
  BOOST_CHECK(!r.projected);
  BOOST_CHECK_EQUAL(r.elements_checked, 36);
  BOOST_CHECK_LT(r.max_rel_error, 1e-8);
}

BOOST_AUTO_TEST_CASE(wrong_backward_fails_and_the_report_points_at_the_element) {
  Tensor x = input({2, 3}, 2);
  auto r = ag::gradcheck([](const TensorList& in) { return CubeWrongAtFour::apply(in[0]); }, {x});
  BOOST_CHECK(!r.ok);
  BOOST_CHECK_EQUAL(r.worst_input, 0);
  BOOST_CHECK_EQUAL(r.worst_element, 4);
  BOOST_CHECK_EQUAL(r.worst_output, 4);  // elementwise: only output 4 depends on input 4
  BOOST_CHECK(r.worst_index == (ag::Shape{1, 1}));
  BOOST_CHECK_CLOSE_FRACTION(r.analytic, 1.01 * r.numeric, 1e-7);
  const std::string text = fmt::format("{}", r);
  BOOST_CHECK(text.find("FAILED") != std::string::npos);
  BOOST_CHECK(text.find("input 0 element 4 [1, 1]") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(random_projections_also_catch_a_wrong_backward) {
  ag::GradcheckOptions opt;
  opt.max_full_jacobian = 0;  // force projections
  Tensor x = input({3, 4}, 3);
  auto good = ag::gradcheck([](const TensorList& in) { return Cube::apply(in[0]); }, {x}, opt);
  BOOST_CHECK(good.projected);
  BOOST_CHECK(good.ok);
  auto bad = ag::gradcheck([](const TensorList& in) { return CubeWrongAtFour::apply(in[0]); }, {x}, opt);
  BOOST_CHECK(!bad.ok);
}

BOOST_AUTO_TEST_CASE(a_coarse_eps_fails_the_tight_tolerance) {
  // Negative control on the numeric side: with eps = 0.1 the central difference of exp is off by
  // about eps²/6 relative, far above rtol = 1e-6, so the checker must say so.
  Tensor x = input({4}, 4);
  ag::GradcheckOptions opt;
  opt.eps = 0.1;
  auto r = ag::gradcheck([](const TensorList& in) { return ag::exp(in[0]); }, {x}, opt);
  BOOST_CHECK(!r.ok);
}

BOOST_AUTO_TEST_CASE(multi_output_custom_function_passes) {
  Tensor a = input({3}, 5), b = input({3}, 6);
  auto r = ag::gradcheck(
      [](const TensorList& in) {
        auto outs = ProductAndSum::apply(in[0], in[1]);
        return ag::sum(outs[0] * outs[0]) + ag::sum(ag::exp(outs[1]));
      },
      {a, b});
  BOOST_CHECK_MESSAGE(r.ok, fmt::format("{}", r));
}

BOOST_AUTO_TEST_CASE(gradient_reaching_only_one_output_of_a_custom_function) {
  Tensor a = input({3}, 7), b = input({3}, 8);
  auto r = ag::gradcheck([](const TensorList& in) { return ag::sum(ProductAndSum::apply(in[0], in[1])[1]); }, {a, b});
  BOOST_CHECK_MESSAGE(r.ok, fmt::format("{}", r));
}

BOOST_AUTO_TEST_CASE(inputs_and_their_grads_are_restored) {
  Tensor x = input({5}, 9);
  const auto before = x.to_vector();
  {
    ag::NoGradGuard no_grad;
    x.set_grad(ag::full({5}, 7.0, Dtype::Float64));
  }
  ag::gradcheck([](const TensorList& in) { return ag::exp(in[0]); }, {x});
  BOOST_CHECK(x.to_vector() == before);
  BOOST_CHECK(x.grad().to_vector() == std::vector<double>(5, 7.0));
}

BOOST_AUTO_TEST_CASE(only_inputs_that_require_grad_are_checked) {
  Tensor x = input({3}, 10);
  Tensor c = ag::tensor({1, 2, 3}, {3}, Dtype::Float64);  // constant
  auto r = ag::gradcheck([](const TensorList& in) { return in[0] * in[1]; }, {x, c});
  BOOST_CHECK(r.ok);
  BOOST_CHECK_EQUAL(r.elements_checked, 9);
}

BOOST_AUTO_TEST_CASE(float32_inputs_are_refused) {
  Tensor x = ag::ones({2}).requires_grad_();
  BOOST_CHECK_EXCEPTION(ag::gradcheck([](const TensorList& in) { return in[0] * 2.0; }, {x}),
                        std::invalid_argument, [](const std::invalid_argument& e) {
                          return std::string(e.what()).find("Float64") != std::string::npos;
                        });
  Tensor y = ag::ones({2}, Dtype::Float64);
  BOOST_CHECK_THROW(ag::gradcheck([](const TensorList& in) { return in[0] * 2.0; }, {y}), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(custom_function_records_its_name_and_skips_graph_under_no_grad) {
  Tensor x = input({2}, 11);
  BOOST_CHECK_EQUAL(Cube::apply(x).grad_fn()->name(), "cube");
  ag::NoGradGuard no_grad;
  BOOST_CHECK(!Cube::apply(x).requires_grad());
}

BOOST_AUTO_TEST_CASE(a_check_of_nothing_is_an_error_not_a_pass) {
  // Negative control: with no full Jacobian and no projection, nothing would be compared.
  Tensor x = input({3}, 12);
  auto f = [](const TensorList& in) { return ag::exp(in[0]); };
  ag::GradcheckOptions none;
  none.max_full_jacobian = 0;
  none.num_projections = 0;
  BOOST_CHECK_EXCEPTION(ag::gradcheck(f, {x}, none), std::invalid_argument, [](const std::invalid_argument& e) {
    const std::string what = e.what();
    return what.find("gradcheck") != std::string::npos && what.find("num_projections = 0") != std::string::npos &&
           what.find("max_full_jacobian = 0") != std::string::npos;
  });
  ag::GradcheckOptions negative;
  negative.num_projections = -3;
  BOOST_CHECK_THROW(ag::gradcheck(f, {x}, negative), std::invalid_argument);
  // An empty input or output has no element to compare either.
  Tensor empty = ag::zeros({0}, Dtype::Float64).requires_grad_();
  BOOST_CHECK_EXCEPTION(ag::gradcheck(f, {empty}), std::invalid_argument, [](const std::invalid_argument& e) {
    return std::string(e.what()).find("nothing to compare") != std::string::npos;
  });
  // One projection is a check.
  ag::GradcheckOptions one = none;
  one.num_projections = 1;
  auto r = ag::gradcheck(f, {x}, one);
  BOOST_CHECK(r.ok);
  BOOST_CHECK_EQUAL(r.elements_checked, 1);
}

BOOST_AUTO_TEST_CASE(tolerances_that_are_nan_or_negative_are_refused) {
  // A NaN tolerance compares false with everything, so the check could neither pass nor name a
  // worst element; a negative one could never pass.
  Tensor x = input({3}, 13);
  auto f = [](const TensorList& in) { return ag::exp(in[0]); };
  for (double bad : {std::nan(""), -1e-6, std::numeric_limits<double>::infinity()}) {
    ag::GradcheckOptions atol, rtol;
    atol.atol = bad;
    rtol.rtol = bad;
    for (const auto& opt : {atol, rtol})
      BOOST_CHECK_EXCEPTION(ag::gradcheck(f, {x}, opt), std::invalid_argument, [](const std::invalid_argument& e) {
        return std::string(e.what()).find("gradcheck: atol and rtol must be finite and >= 0") != std::string::npos;
      });
  }
  BOOST_CHECK(ag::gradcheck(f, {x}).ok);  // the default tolerances are fine
}

// ---- inputs are named by their tensor names ----

BOOST_AUTO_TEST_CASE(a_failing_check_names_the_worst_input_by_its_tensor_name) {
  // Negative control: the wrong backward is on the second input, which has a name.
  Tensor a = input({3}, 14);
  Tensor b = input({2, 3}, 15);
  b.set_name("attn.W_O");
  auto r = ag::gradcheck([](const TensorList& in) { return ag::sum(in[0]) + CubeWrongAtFour::apply(in[1]); }, {a, b});
  BOOST_CHECK(!r.ok);
  BOOST_CHECK_EQUAL(r.worst_input, 1);
  BOOST_CHECK_EQUAL(r.worst_input_name, "attn.W_O");
  BOOST_CHECK_EQUAL(r.worst_element, 4);
  BOOST_TEST(r.message.find("input 1 'attn.W_O' element 4 [1, 1] (output element 4)") == 0u, r.message);
  const std::string text = fmt::format("{}", r);
  BOOST_TEST(text.find("worst: input 1 'attn.W_O' element 4 [1, 1]") != std::string::npos, text);
  BOOST_CHECK_EQUAL(ag::worst_element_text(r), "input 1 'attn.W_O' element 4 [1, 1] (output element 4)");
}

BOOST_AUTO_TEST_CASE(an_unnamed_input_is_named_by_its_index_alone) {
  Tensor x = input({2, 3}, 16);
  auto r = ag::gradcheck([](const TensorList& in) { return CubeWrongAtFour::apply(in[0]); }, {x});
  BOOST_CHECK(!r.ok);
  BOOST_CHECK(r.worst_input_name.empty());
  BOOST_TEST(r.message.find("input 0 element 4 [1, 1] (output element 4)") == 0u, r.message);
}

BOOST_AUTO_TEST_CASE(input_errors_name_the_input_by_its_tensor_name) {
  auto f = [](const TensorList& in) { return ag::sum(in[1]); };
  Tensor ok = input({2}, 17);
  Tensor w = ag::ones({2}).requires_grad_();
  w.set_name("fc_1.weight");
  BOOST_TEST(test_support::error_of([&] { ag::gradcheck(f, {ok, w}); }) ==
             "gradcheck: input 1 'fc_1.weight' [2] is Float32; gradcheck needs Float64 inputs");
  Tensor h = input({2}, 18) * 2.0;
  h.set_name("hidden");
  BOOST_TEST(test_support::error_of([&] { ag::gradcheck(f, {ok, h}); }) ==
             "gradcheck: input 1 'hidden' is not a leaf (it was made by 'mul')");
  BOOST_TEST(test_support::error_of([&] { ag::gradcheck(f, {ok, Tensor()}); }) ==
             "gradcheck: input 1 is an undefined tensor (default-constructed: no value)");
  Tensor p = input({2}, 19);
  p.set_name("b_Q");
  BOOST_TEST(test_support::error_of([&] { ag::gradcheck(f, {ok, p.grad()}); }) ==
             "gradcheck: input 1 is the .grad() of 'b_Q' [2], which is undefined: no backward has reached it yet "
             "(call backward() on a loss that depends on it)");
}

// ---- the forward-mode check (check_forward_ad) ----

namespace {

// x³ whose backward reads raw values without saying so: right at first order; the engine finds
// its gradient outside the graph when create_graph asks for more.
struct CubeFromRawValues : ag::Function<CubeFromRawValues> {
  static constexpr const char* name = "cube_raw";
  static Tensor forward(ag::FunctionCtx& ctx, const Tensor& x) {
    ctx.save_for_backward({x});
    return x * x * x;
  }
  static TensorList backward(ag::FunctionCtx& ctx, const TensorList& g) {
    auto x = ctx.saved_tensors()[0].to_vector(), gv = g[0].to_vector();
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = 3 * x[i] * x[i] * gv[i];
    return {ag::tensor(x, g[0].shape(), g[0].dtype())};
  }
};

// x³ with two rules, as an op with a fast rule and a composed one has: the one used under
// create_graph is 1 % off, the plain one right. First order passes; forward mode must not.
struct CubeWithDriftedComposedRule : ag::Function<CubeWithDriftedComposedRule> {
  static constexpr const char* name = "cube_drifted";
  static Tensor forward(ag::FunctionCtx& ctx, const Tensor& x) {
    ctx.save_for_backward({x});
    return x * x * x;
  }
  static TensorList backward(ag::FunctionCtx& ctx, const TensorList& g) {
    const Tensor x = ctx.saved_tensors()[0];
    return {g[0] * (ag::is_grad_enabled() ? 3.03 : 3.0) * x * x};
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(forward_mode_is_checked_by_default_and_passes_right_rules) {
  Tensor x = input({2, 3}, 11), w = input({3, 2}, 12);
  auto r = ag::gradcheck([](const TensorList& in) { return ag::tanh(ag::matmul(Cube::apply(in[0]), in[1])); }, {x, w});
  BOOST_TEST_MESSAGE(fmt::format("{}", r));
  BOOST_TEST(r.ok);
  BOOST_TEST(r.forward_checked);
  BOOST_TEST(r.forward_ok);
  BOOST_TEST(r.forward_dot_error < 1e-13);
  BOOST_TEST(r.forward_max_abs_error < 1e-8);
  BOOST_TEST(fmt::format("{}", r).find("forward mode ok") != std::string::npos);
  BOOST_TEST(!x.grad().defined());  // nothing left behind
}

BOOST_AUTO_TEST_CASE(forward_mode_fails_a_drifted_composed_rule) {
  Tensor x = input({2, 3}, 13);
  const ag::GradcheckFn fn = [](const TensorList& in) { return CubeWithDriftedComposedRule::apply(in[0]); };
  auto r = ag::gradcheck(fn, {x});
  BOOST_TEST_MESSAGE(fmt::format("{}", r));
  BOOST_TEST(r.reverse_ok);  // first order is right
  BOOST_TEST(!r.forward_ok);
  BOOST_TEST(!r.ok);
  BOOST_TEST(r.forward_dot_error > 1e-3);
  BOOST_TEST(r.message.find("forward mode, direction 0") != std::string::npos, r.message);
  ag::GradcheckOptions first_order_only;
  first_order_only.check_forward_ad = false;
  auto r1 = ag::gradcheck(fn, {x}, first_order_only);
  BOOST_TEST(r1.ok);
  BOOST_TEST(!r1.forward_checked);
  BOOST_TEST(r1.forward_skipped.empty());
}

BOOST_AUTO_TEST_CASE(forward_mode_is_skipped_with_the_reason_for_a_backward_that_cannot_be_differentiated) {
  Tensor x = input({4}, 14);
  for (const auto& [name, fn] : {std::pair<std::string, ag::GradcheckFn>{"cube_once", [](const TensorList& in) {
                                   return test_support::CubeOnce::apply(in[0]);
                                 }},
                                 {"cube_raw", [](const TensorList& in) { return CubeFromRawValues::apply(in[0]); }}}) {
    auto r = ag::gradcheck(fn, {x});
    BOOST_TEST(r.ok, name);
    BOOST_TEST(!r.forward_checked, name);
    BOOST_TEST(r.forward_skipped.find(name) != std::string::npos, r.forward_skipped);
    BOOST_TEST(fmt::format("{}", r).find("forward mode not checked") != std::string::npos, name);
  }
}

BOOST_AUTO_TEST_CASE(gradgradcheck_checks_forward_mode_of_the_gradient_too) {
  Tensor x = input({3}, 15);
  auto good = ag::gradgradcheck([](const TensorList& in) { return ag::sum(ag::exp(in[0]) * in[0]); }, {x});
  BOOST_TEST(good.ok);
  BOOST_TEST(good.forward_checked);
  // Each check names itself in its printout.
  BOOST_TEST(fmt::format("{}", good).find("gradgradcheck ok: ") == 0u, fmt::format("{}", good));
  BOOST_TEST(fmt::format("{}", ag::gradcheck([](const TensorList& in) { return ag::exp(in[0]); }, {x}))
                 .find("gradcheck ok: ") == 0u);
  ag::GradcheckOptions bad_directions;
  bad_directions.forward_directions = 0;
  BOOST_CHECK_THROW(ag::gradcheck([](const TensorList& in) { return in[0] * 2.0; }, {x}, bad_directions),
                    std::invalid_argument);
  bad_directions.check_forward_ad = false;
  BOOST_TEST(ag::gradcheck([](const TensorList& in) { return in[0] * 2.0; }, {x}, bad_directions).ok);
}

// One tensor passed at two positions: the finite differences move it by both steps, as the
// analytic side (one .grad for both) and forward mode (J·v summed over both positions) count it.
BOOST_AUTO_TEST_CASE(one_tensor_given_twice_passes_both_modes) {
  Tensor a = input({3}, 16);
  for (const auto& fn : {ag::GradcheckFn([](const TensorList& v) { return v[0] * v[1]; }),
                         ag::GradcheckFn([](const TensorList& v) { return ag::tanh(v[0]) + v[1] * v[1]; })}) {
    auto r = ag::gradcheck(fn, {a, a});
    BOOST_TEST(r.ok, fmt::format("{}", r));
    BOOST_TEST(r.forward_checked);
    ag::GradcheckOptions projected;
    projected.max_full_jacobian = 0;
    BOOST_TEST(ag::gradcheck(fn, {a, a}, projected).ok);
  }
}

// A function cut from its inputs has a zero first derivative everywhere, analytic and numeric:
// gradgradcheck refuses it instead of passing it.
BOOST_AUTO_TEST_CASE(gradgradcheck_refuses_a_function_with_no_graph) {
  Tensor a = input({3}, 17);
  const ag::GradcheckFn cut = [](const TensorList& v) { return ag::tanh(v[0]).detach(); };
  BOOST_TEST(!ag::gradcheck(cut, {a}).ok);
  try {
    ag::gradgradcheck(cut, {a});
    BOOST_ERROR("gradgradcheck passed a function with no graph");
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(std::string(e.what()).find("gradgradcheck: the function's result does not depend") == 0, e.what());
  }
}
