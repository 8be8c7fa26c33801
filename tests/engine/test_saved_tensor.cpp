// Saved-tensor safety: changing a tensor in place after an op saved it for backward makes that
// backward throw, naming the op, instead of silently differentiating with the new values.
#define BOOST_TEST_MODULE saved_tensor
#include <boost/test/unit_test.hpp>

#include <string>

#include <autograd/autograd.hpp>
#include <nn/nn.hpp>

#include "test_support.hpp"

using namespace test_support::prelude;
using test_support::Cube;

namespace {

// Runs f, expects a std::runtime_error, returns (and logs) its message.
template <class F>
std::string runtime_error_message(F&& f) {
  const std::string message = test_support::message_of<std::runtime_error>(f, "a std::runtime_error");
  BOOST_TEST_MESSAGE("  -> " << message);
  return message;
}

Tensor leaf(const std::vector<double>& values, const ag::Shape& shape) {
  return ag::tensor(values, shape, Dtype::Float64).requires_grad_(true);
}

// The in-place change a user would make: outside the graph, as optimizers do.
void bump(const Tensor& t, double by) {
  ag::NoGradGuard no_grad;
  t.detach().add_(ag::full(t.shape(), by, t.dtype()));
}

}  // namespace

BOOST_AUTO_TEST_CASE(copy_into_a_parameter_used_by_matmul_makes_backward_throw) {
  Tensor x = leaf({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor W1 = leaf({0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9}, {3, 3});
  Tensor W2 = leaf({1, -1, 2}, {3, 1});
  Tensor loss = ag::sum(ag::matmul(ag::tanh(ag::matmul(x, W1)), W2));
  {
    ag::NoGradGuard no_grad;
    W2.copy_(ag::tensor({0, 0, 0}, {3, 1}, Dtype::Float64));  // e.g. loading a checkpoint mid-step
  }
  const auto msg = runtime_error_message([&] { loss.backward(); });
  BOOST_TEST_MESSAGE(msg);
  BOOST_TEST(contains(msg, "matmul:"));
  BOOST_TEST(contains(msg, "shape [3, 1]"));
  BOOST_TEST(contains(msg, "changed in place after it was saved"));
}

BOOST_AUTO_TEST_CASE(optimizer_step_between_forward_and_backward_makes_backward_throw) {
  nn::Linear layer(3, 2);
  layer.to(Dtype::Float64);
  nn::SGD opt(layer.parameters(), {.lr = 0.1});
  Tensor x = ag::randn({4, 3}, Dtype::Float64).requires_grad_(true);
  ag::sum(ag::square(layer(x))).backward();  // grads exist, so step() changes the weights
  Tensor loss = ag::sum(ag::square(layer(x)));
  opt.step();
  const auto msg = runtime_error_message([&] { loss.backward(); });
  BOOST_TEST(contains(msg, "linear:"));  // nn::Linear runs the fused linear op, which saved the weight
  BOOST_TEST(contains(msg, "changed in place after it was saved"));
}

BOOST_AUTO_TEST_CASE(change_through_a_view_sharing_storage_is_caught) {
  Tensor x = leaf({0.5, 1.0, 1.5, 2.0}, {2, 2});
  Tensor y = ag::exp(x);  // saves y
  Tensor loss = ag::sum(y);
  Tensor view = ag::reshape(y, {4});  // same storage as y
  bump(view, 1.0);
  const auto msg = runtime_error_message([&] { loss.backward(); });
  BOOST_TEST(contains(msg, "exp:"));
}

BOOST_AUTO_TEST_CASE(fill_of_the_input_of_log_is_caught) {
  Tensor x = leaf({1, 2, 3}, {3});
  Tensor loss = ag::sum(ag::log(x));  // saves x
  {
    ag::NoGradGuard no_grad;
    x.fill_(7.0);
  }
  BOOST_TEST(contains(runtime_error_message([&] { loss.backward(); }), "log:"));
}

BOOST_AUTO_TEST_CASE(scaling_the_output_of_softmax_is_caught) {
  Tensor x = leaf({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor p = ag::softmax(x, 1);  // saves p
  Tensor loss = ag::sum(p * ag::tensor({1, 2, 3, 4, 5, 6}, {2, 3}, Dtype::Float64));
  {
    ag::NoGradGuard no_grad;
    p.mul_(2.0);
  }
  BOOST_TEST(contains(runtime_error_message([&] { loss.backward(); }), "softmax:"));
}

BOOST_AUTO_TEST_CASE(changing_the_mask_of_masked_fill_is_caught) {
  Tensor x = leaf({1, 2, 3, 4}, {4});
  Tensor mask = ag::tensor({0, 1, 0, 0}, {4}, Dtype::Float64);
  Tensor loss = ag::sum(ag::masked_fill(x, mask, 0.0) * x);
  mask.fill_(1.0);  // does not require grad: allowed, but the saved mask is stale
  BOOST_TEST(contains(runtime_error_message([&] { loss.backward(); }), "masked_fill:"));
}

BOOST_AUTO_TEST_CASE(changing_an_operand_of_mul_is_caught) {
  Tensor a = leaf({1, 2}, {2});
  Tensor b = leaf({3, 4}, {2});
  Tensor loss = ag::sum(a * b);
  bump(b, 1.0);
  BOOST_TEST(contains(runtime_error_message([&] { loss.backward(); }), "mul:"));
}

BOOST_AUTO_TEST_CASE(changing_the_input_of_pow_is_caught) {
  Tensor a = leaf({1, 2}, {2});
  Tensor loss = ag::sum(ag::pow(a, 3.0));
  bump(a, 1.0);
  BOOST_TEST(contains(runtime_error_message([&] { loss.backward(); }), "pow:"));
}

BOOST_AUTO_TEST_CASE(changing_the_input_of_max_is_caught) {
  Tensor a = leaf({1, 5, 2}, {3});
  Tensor loss = ag::max(a);
  bump(a, 1.0);
  BOOST_TEST(contains(runtime_error_message([&] { loss.backward(); }), "max:"));
}

BOOST_AUTO_TEST_CASE(changing_a_key_of_fused_attention_is_caught) {
  Tensor q = ag::randn({1, 2, 3, 4}, Dtype::Float64).requires_grad_(true);
  Tensor k = ag::randn({1, 2, 5, 4}, Dtype::Float64).requires_grad_(true);
  Tensor v = ag::randn({1, 2, 5, 4}, Dtype::Float64).requires_grad_(true);
  Tensor loss = ag::sum(ag::scaled_dot_product_attention(q, k, v).output);
  bump(k, 0.5);
  BOOST_TEST(contains(runtime_error_message([&] { loss.backward(); }), "scaled_dot_product_attention"));
}

BOOST_AUTO_TEST_CASE(changing_a_tensor_saved_by_a_custom_function_names_it) {
  Tensor x = leaf({1, 2}, {2});
  Tensor loss = ag::sum(Cube::apply(x));
  bump(x, 1.0);
  BOOST_TEST(contains(runtime_error_message([&] { loss.backward(); }), "cube:"));
}

BOOST_AUTO_TEST_CASE(a_second_backward_after_a_change_throws_even_when_the_first_passed) {
  Tensor x = leaf({1, 2}, {2});
  Tensor loss = ag::sum(ag::exp(x) * x);
  BOOST_CHECK_NO_THROW(loss.backward({.retain_graph = true}));
  bump(x, 1.0);
  BOOST_CHECK_THROW(loss.backward(), std::runtime_error);
}

BOOST_AUTO_TEST_CASE(a_change_before_the_op_saves_is_harmless) {
  // Negative control: the version is taken when the op saves, so earlier writes are fine and
  // the gradient uses the new values: d/dx sum(x²) = 2x with x = (1, 2) + 1.
  Tensor x = leaf({1, 2}, {2});
  bump(x, 1.0);
  Tensor loss = ag::sum(ag::square(x));
  BOOST_CHECK_NO_THROW(loss.backward());
  BOOST_TEST(x.grad().to_vector() == std::vector<double>({4.0, 6.0}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(ops_that_save_nothing_do_not_care) {
  // add needs neither operand for its backward (dA = dC, dB = dC), so changing one is harmless.
  Tensor a = leaf({1, 2}, {2});
  Tensor b = leaf({3, 4}, {2});
  Tensor loss = ag::sum(a + b);
  bump(a, 1.0);
  BOOST_CHECK_NO_THROW(loss.backward());
  BOOST_TEST(b.grad().to_vector() == std::vector<double>({1.0, 1.0}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(in_place_on_a_tensor_that_requires_grad_needs_no_grad_mode) {
  // The other half of the rule: under grad mode the in-place change itself is refused.
  Tensor x = leaf({1, 2}, {2});
  Tensor y = ag::exp(x);
  BOOST_CHECK_THROW(y.mul_(2.0), std::invalid_argument);
  BOOST_CHECK_THROW(x.copy_(ag::zeros({2}, Dtype::Float64)), std::invalid_argument);
}
