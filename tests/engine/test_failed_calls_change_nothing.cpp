// A call that is refused changes nothing: grad() refuses an input the outputs do not reach
// before it walks (and frees) the graph, so the corrected call still works; gradgradcheck
// refuses bad options and inputs before it runs the function.
#define BOOST_TEST_MODULE failed_calls_change_nothing
#include <boost/test/unit_test.hpp>

#include <stdexcept>
#include <string>

#include <autograd/autograd.hpp>

#include "test_support.hpp"

using namespace test_support::prelude;

namespace {

// y = sum(x * x), whose last node is named 'sum'.
Tensor sum_of_squares(const Tensor& x) { return ag::sum(ag::mul(x, x)); }

}  // namespace

BOOST_AUTO_TEST_SUITE(failed_calls_change_nothing)

BOOST_AUTO_TEST_CASE(grad_refusing_an_unused_leaf_leaves_the_graph_for_the_corrected_call) {
  const Tensor x = f64({1, -2, 3}, {3}).requires_grad_();
  const Tensor z = f64({5}, {1}).requires_grad_();  // not used by y
  const Tensor y = sum_of_squares(x);
  check_throws<std::invalid_argument>([&] { ag::grad({y}, {x, z}); },
                                      {"grad: input 1 [1] is not used by the outputs", "allow_unused"});
  // The graph is still there: the corrected call gets 2x, and backward() works after it.
  const TensorList g = ag::grad({y}, {x}, {.retain_graph = true});
  check_values(g[0], {3}, {2, -4, 6});
  y.backward();
  check_values(x.grad(), {3}, {2, -4, 6});
  BOOST_TEST(!z.grad().defined());
}

BOOST_AUTO_TEST_CASE(grad_refusing_an_output_of_a_reached_node_that_gets_no_gradient_leaves_the_graph) {
  // parts[1] is an output of the split node, which the walk reaches through parts[0]; but no
  // gradient can arrive at parts[1] itself.
  const Tensor x = f64({1, 2, 3, 4}, {4}).requires_grad_();
  const TensorList parts = ag::split(ag::mul(x, 3.0), 2);
  const Tensor y = ag::sum(ag::mul(parts[0], parts[0]));
  check_throws<std::invalid_argument>([&] { ag::grad({y}, {x, parts[1]}); },
                                      {"grad: input 1 [2] is not used by the outputs"});
  const TensorList g = ag::grad({y}, {x});  // d/dx Σ (3x)² over the first half = 18x there
  check_values(g[0], {4}, {18, 36, 0, 0});
}

BOOST_AUTO_TEST_CASE(grad_with_allow_unused_still_gives_an_undefined_gradient_for_the_unused_input) {
  const Tensor x = f64({1, 2}, {2}).requires_grad_();
  const Tensor z = f64({5}, {1}).requires_grad_();
  const TensorList g = ag::grad({sum_of_squares(x)}, {x, z}, {.allow_unused = true});
  check_values(g[0], {2}, {2, 4});
  BOOST_TEST(!g[1].defined());
}

BOOST_AUTO_TEST_CASE(gradgradcheck_refuses_bad_options_before_running_the_function_naming_itself) {
  const Tensor x = f64({0.5, -1.5}, {2}).requires_grad_();
  int calls = 0;
  const ag::GradcheckFn f = [&](const TensorList& in) {
    ++calls;
    return ag::sum(ag::mul(ag::mul(in[0], in[0]), in[0]));
  };
  const std::vector<std::pair<ag::GradcheckOptions, std::string>> cases = {
      {{.eps = 0.0}, "gradgradcheck: eps must be positive and finite, got 0"},
      {{.eps = -1e-6}, "gradgradcheck: eps must be positive and finite, got -1e-06"},
      {{.eps = kInf}, "gradgradcheck: eps must be positive and finite, got inf"},
      {{.max_full_jacobian = -1}, "gradgradcheck: max_full_jacobian must not be negative, got -1"},
      {{.atol = -1.0}, "gradgradcheck: atol and rtol must be finite and >= 0, got atol = -1, rtol = 1e-06"},
      {{.rtol = kNaN}, "gradgradcheck: atol and rtol must be finite and >= 0"},
      {{.num_projections = -2}, "gradgradcheck: num_projections must not be negative, got -2"},
  };
  for (const auto& c : cases) {
    const ag::GradcheckOptions& options = c.first;
    const std::string& message = c.second;
    const std::string got = error_of([&] { (void)ag::gradgradcheck(f, {x}, options); }, "no error");
    BOOST_TEST(got.find(message) == 0u, got);
  }
  BOOST_TEST(calls == 0);
  // The same options through gradcheck name gradcheck.
  BOOST_TEST(error_of([&] { (void)ag::gradcheck(f, {x}, {.eps = 0.0}); }).find("gradcheck: eps must be positive") == 0u);
  BOOST_TEST(calls == 0);
  // Good options run the check, and it passes.
  BOOST_TEST(ag::gradgradcheck(f, {x}).ok);
  BOOST_TEST(calls > 0);
}

BOOST_AUTO_TEST_CASE(gradgradcheck_refuses_bad_inputs_before_running_the_function_naming_itself) {
  int calls = 0;
  const ag::GradcheckFn f = [&](const TensorList& in) {
    ++calls;
    return ag::sum(ag::mul(in[0], in[0]));
  };
  const Tensor f32 = ag::ones({2}).requires_grad_();
  BOOST_TEST(error_of([&] { (void)ag::gradgradcheck(f, {f32}); }) ==
             "gradgradcheck: input 0 [2] is Float32; gradgradcheck needs Float64 inputs");
  const Tensor leaf = f64({1, 2}, {2}).requires_grad_();
  const Tensor made = ag::mul(leaf, 2.0);
  BOOST_TEST(error_of([&] { (void)ag::gradgradcheck(f, {made}); }) ==
             "gradgradcheck: input 0 is not a leaf (it was made by 'mul')");
  BOOST_TEST(error_of([&] { (void)ag::gradgradcheck(f, {Tensor()}); }).find("gradgradcheck: input 0 is") == 0u);
  BOOST_TEST(calls == 0);
}

BOOST_AUTO_TEST_SUITE_END()
