// Elementwise ops: forward values against hand-computed numbers, float64 gradchecks (broadcast
// and scalar-tensor cases included), float32 agreeing with float64, and the errors.
#define BOOST_TEST_MODULE elementwise
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include <autograd/autograd.hpp>

#include "test_support.hpp"

using namespace test_support::prelude;

namespace {

// Uniform in [low, high), float64, requiring grad.
Tensor input_in(const Shape& shape, double low, double high, std::uint64_t seed) {
  ag::Generator gen(seed);
  return ag::uniform(shape, low, high, Dtype::Float64, gen).requires_grad_();
}

}  // namespace

// ---------------------------------------------------------------- forward values, binary

BOOST_AUTO_TEST_CASE(add_same_shape_adds_elementwise) {
  check_values(ag::add(f64({1, 2, 3, 4}, {2, 2}), f64({10, 20, 30, 40}, {2, 2})), {2, 2}, {11, 22, 33, 44});
}

BOOST_AUTO_TEST_CASE(add_broadcasts_a_row_over_the_rows) {
  check_values(f64({1, 2, 3, 4, 5, 6}, {2, 3}) + f64({10, 20, 30}, {3}), {2, 3}, {11, 22, 33, 14, 25, 36});
}

BOOST_AUTO_TEST_CASE(add_broadcasts_a_column_against_a_row) {
  // [3, 1] + [4] -> [3, 4]
  check_values(f64({0, 10, 20}, {3, 1}) + f64({1, 2, 3, 4}, {4}), {3, 4},
               {1, 2, 3, 4, 11, 12, 13, 14, 21, 22, 23, 24});
}

BOOST_AUTO_TEST_CASE(add_with_a_scalar_tensor_broadcasts_it_everywhere) {
  check_values(f64({1, 2, 3}, {3}) + ag::scalar_tensor(0.5, Dtype::Float64), {3}, {1.5, 2.5, 3.5});
  check_values(ag::scalar_tensor(2, Dtype::Float64) + ag::scalar_tensor(3, Dtype::Float64), {}, {5});
}

BOOST_AUTO_TEST_CASE(mul_broadcasts_middle_and_leading_dims) {
  // [2, 1, 2] * [3, 1] -> [2, 3, 2]: out[i, j, k] = a[i, 0, k] * b[j, 0]
  const Tensor a = f64({1, 2, 3, 4}, {2, 1, 2});
  const Tensor b = f64({1, 10, 100}, {3, 1});
  check_values(a * b, {2, 3, 2}, {1, 2, 10, 20, 100, 200, 3, 4, 30, 40, 300, 400});
}

BOOST_AUTO_TEST_CASE(broadcast_with_size_one_dims_everywhere_matches_index_arithmetic) {
  // [2, 1, 3, 1] - [1, 4, 1, 5] -> [2, 4, 3, 5], checked element by element.
  std::vector<double> av(6), bv(20);
  for (std::size_t i = 0; i < av.size(); ++i) av[i] = 100.0 * static_cast<double>(i);
  for (std::size_t i = 0; i < bv.size(); ++i) bv[i] = static_cast<double>(i);
  const Tensor y = f64(av, {2, 1, 3, 1}) - f64(bv, {1, 4, 1, 5});
  std::vector<double> expected;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j)
      for (int k = 0; k < 3; ++k)
        for (int l = 0; l < 5; ++l) expected.push_back(av[i * 3 + k] - bv[j * 5 + l]);
  check_values(y, {2, 4, 3, 5}, expected);
}

BOOST_AUTO_TEST_CASE(large_broadcast_split_across_threads_matches_index_arithmetic) {
  // Big enough to be split over threads; the split falls inside rows.
  const std::int64_t rows = 997, cols = 131;
  std::vector<double> av(static_cast<std::size_t>(rows * cols)), bv(static_cast<std::size_t>(cols));
  for (std::size_t i = 0; i < av.size(); ++i) av[i] = static_cast<double>(i);
  for (std::size_t i = 0; i < bv.size(); ++i) bv[i] = 0.5 * static_cast<double>(i);
  const Tensor y = f64(av, {rows, cols}) * f64(bv, {cols});
  std::vector<double> expected(av.size());
  for (std::size_t i = 0; i < av.size(); ++i) expected[i] = av[i] * bv[i % static_cast<std::size_t>(cols)];
  check_values(y, {rows, cols}, expected);
}

BOOST_AUTO_TEST_CASE(sub_mul_div_compute_elementwise) {
  const Tensor a = f64({6, -4, 1.5}, {3});
  const Tensor b = f64({2, 8, -0.5}, {3});
  check_values(a - b, {3}, {4, -12, 2});
  check_values(a * b, {3}, {12, -32, -0.75});
  check_values(a / b, {3}, {3, -0.5, -3});
}

BOOST_AUTO_TEST_CASE(pow_raises_elementwise) {
  check_values(ag::pow(f64({2, 9, 4}, {3}), f64({3, 0.5, -1}, {3})), {3}, {8, 3, 0.25});
}

BOOST_AUTO_TEST_CASE(maximum_and_minimum_pick_elementwise) {
  const Tensor a = f64({1, 5, -3, 2}, {4});
  const Tensor b = f64({4, 2, -3, 0}, {4});
  check_values(ag::maximum(a, b), {4}, {4, 5, -3, 2});
  check_values(ag::minimum(a, b), {4}, {1, 2, -3, 0});
}

BOOST_AUTO_TEST_CASE(maximum_propagates_nan) {
  const Tensor a = f64({NAN, 1}, {2});
  const Tensor b = f64({0, NAN}, {2});
  check_values_nonfinite(ag::maximum(a, b), {2}, {NAN, NAN});
  check_values_nonfinite(ag::minimum(a, b), {2}, {NAN, NAN});
}

BOOST_AUTO_TEST_CASE(scalar_forms_compute_elementwise) {
  const Tensor a = f64({1, 2, 4}, {3});
  check_values(ag::add(a, 1.5), {3}, {2.5, 3.5, 5.5});
  check_values(ag::sub(a, 1.5), {3}, {-0.5, 0.5, 2.5});
  check_values(ag::rsub(a, 1.5), {3}, {0.5, -0.5, -2.5});
  check_values(ag::mul(a, -2.0), {3}, {-2, -4, -8});
  check_values(ag::div(a, 4.0), {3}, {0.25, 0.5, 1});
  check_values(ag::rdiv(a, 4.0), {3}, {4, 2, 1});
  check_values(ag::pow(a, 3.0), {3}, {1, 8, 64});
  check_values(ag::pow(a, 2.0), {3}, {1, 4, 16});
  check_values(ag::pow(a, 0.5), {3}, {1, std::sqrt(2.0), 2});
  check_values(ag::pow(a, -1.0), {3}, {1, 0.5, 0.25});
  check_values(ag::pow(a, 1.0), {3}, {1, 2, 4});
  check_values(ag::pow(a, 0.0), {3}, {1, 1, 1});
  check_values(ag::pow(a, -1.5), {3}, {1, std::pow(2.0, -1.5), 0.125});
}

BOOST_AUTO_TEST_CASE(operators_match_the_named_ops) {
  const Tensor a = f64({1, 2, 4}, {3});
  const Tensor b = f64({2, 2, 8}, {3});
  check_values(a + b, {3}, {3, 4, 12});
  check_values(a - b, {3}, {-1, 0, -4});
  check_values(a * b, {3}, {2, 4, 32});
  check_values(a / b, {3}, {0.5, 1, 0.5});
  check_values(a + 1.0, {3}, {2, 3, 5});
  check_values(a - 1.0, {3}, {0, 1, 3});
  check_values(a * 3.0, {3}, {3, 6, 12});
  check_values(a / 2.0, {3}, {0.5, 1, 2});
  check_values(1.0 + a, {3}, {2, 3, 5});
  check_values(1.0 - a, {3}, {0, -1, -3});
  check_values(3.0 * a, {3}, {3, 6, 12});
  check_values(8.0 / a, {3}, {8, 4, 2});
  check_values(-a, {3}, {-1, -2, -4});
}

BOOST_AUTO_TEST_CASE(float32_binary_ops_keep_float32) {
  const Tensor a = ag::tensor({1, 2}, {2});
  const Tensor b = ag::tensor({3, 4}, {2});
  BOOST_TEST(((a * b).dtype() == Dtype::Float32));
  BOOST_TEST(((a / 3.0).dtype() == Dtype::Float32));
  BOOST_TEST(((2.0 - a).dtype() == Dtype::Float32));
}

// ---------------------------------------------------------------- forward values, unary

BOOST_AUTO_TEST_CASE(unary_ops_compute_hand_values) {
  const Tensor x = f64({-2, -0.5, 0, 1, 3}, {5});
  const double e = std::exp(1.0);
  check_values(ag::neg(x), {5}, {2, 0.5, 0, -1, -3});
  check_values(ag::exp(x), {5}, {1 / (e * e), 1 / std::sqrt(e), 1, e, e * e * e});
  check_values(ag::square(x), {5}, {4, 0.25, 0, 1, 9});
  check_values(ag::abs(x), {5}, {2, 0.5, 0, 1, 3});
  check_values(ag::relu(x), {5}, {0, 0, 0, 1, 3});
  check_values(ag::clamp(x, -1, 2), {5}, {-1, -0.5, 0, 1, 2});
  // tanh(x) = (e^2x - 1) / (e^2x + 1)
  std::vector<double> th, sg;
  for (double v : {-2.0, -0.5, 0.0, 1.0, 3.0}) {
    th.push_back((std::exp(2 * v) - 1) / (std::exp(2 * v) + 1));
    sg.push_back(1 / (1 + std::exp(-v)));
  }
  check_values(ag::tanh(x), {5}, th);
  check_values(ag::sigmoid(x), {5}, sg);
  check_values(ag::sigmoid(f64({0}, {1})), {1}, {0.5});
}

BOOST_AUTO_TEST_CASE(log_sqrt_rsqrt_compute_hand_values) {
  const Tensor x = f64({1, 4, 0.25, std::exp(2.0)}, {4});
  check_values(ag::log(x), {4}, {0, std::log(4.0), -std::log(4.0), 2});
  check_values(ag::sqrt(x), {4}, {1, 2, 0.5, std::exp(1.0)});
  check_values(ag::rsqrt(x), {4}, {1, 0.5, 2, std::exp(-1.0)});
}

BOOST_AUTO_TEST_CASE(log_and_sqrt_of_bad_values_follow_ieee) {
  check_values_nonfinite(ag::log(f64({0, -1}, {2})), {2}, {-INFINITY, NAN});
  check_values_nonfinite(ag::sqrt(f64({-1}, {1})), {1}, {NAN});
}

BOOST_AUTO_TEST_CASE(gelu_exact_is_x_times_normal_cdf) {
  // Φ(1) = 0.841344746068543, Φ(-1) = 0.158655253931457, Φ(2) = 0.977249868051821
  check_values(ag::gelu(f64({-1, 0, 1, 2}, {4})), {4},
               {-0.158655253931457, 0, 0.841344746068543, 2 * 0.977249868051821}, 1e-13);
}

BOOST_AUTO_TEST_CASE(gelu_tanh_approximation_matches_its_formula) {
  std::vector<double> expected;
  for (double v : {-1.0, 0.0, 1.0, 2.0})
    expected.push_back(0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))));
  check_values(ag::gelu(f64({-1, 0, 1, 2}, {4}), ag::GeluApproximation::Tanh), {4}, expected);
  // and it stays within 1e-3 of the exact form here
  check_values(ag::gelu(f64({-1, 0, 1, 2}, {4}), ag::GeluApproximation::Tanh), {4},
               {-0.158655253931457, 0, 0.841344746068543, 2 * 0.977249868051821}, 1e-3);
}

BOOST_AUTO_TEST_CASE(gelu_refuses_an_approximation_that_is_not_one_of_the_enum) {
  const auto x = f64({-1, 0, 1}, {3});
  for (int bad : {-1, 2, 255})
    check_throws<std::invalid_argument>([&] { ag::gelu(x, static_cast<ag::GeluApproximation>(bad)); },
                                        {"gelu: approximate must be GeluApproximation::None or Tanh, got " +
                                         std::to_string(bad)});
}

// ---------------------------------------------------------------- selection by mask

BOOST_AUTO_TEST_CASE(masked_fill_fills_where_mask_is_nonzero) {
  const Tensor x = f64({1, 2, 3, 4, 5, 6}, {2, 3});
  check_values(ag::masked_fill(x, f64({0, 1, 0, 2, 0, 0}, {2, 3}), -9), {2, 3}, {1, -9, 3, -9, 5, 6});
}

BOOST_AUTO_TEST_CASE(masked_fill_broadcasts_the_mask) {
  const Tensor x = f64({1, 2, 3, 4, 5, 6}, {2, 3});
  check_values(ag::masked_fill(x, f64({1, 0, 1}, {3}), 0), {2, 3}, {0, 2, 0, 0, 5, 0});
  check_values_nonfinite(ag::masked_fill(x, f64({0, 1}, {2, 1}), -INFINITY), {2, 3}, {1, 2, 3, -INFINITY, -INFINITY, -INFINITY});
}

BOOST_AUTO_TEST_CASE(masked_fill_accepts_a_mask_of_another_dtype) {
  const Tensor x = f64({1, 2, 3}, {3});
  check_values(ag::masked_fill(x, ag::tensor({1, 0, 0}, {3}, Dtype::Float32), 7), {3}, {7, 2, 3});
}

BOOST_AUTO_TEST_CASE(where_picks_a_where_cond_and_b_elsewhere_with_broadcasting) {
  // cond [2, 1], a [3], b [] -> [2, 3]
  const Tensor cond = f64({1, 0}, {2, 1});
  check_values(ag::where(cond, f64({1, 2, 3}, {3}), ag::scalar_tensor(-1, Dtype::Float64)), {2, 3},
               {1, 2, 3, -1, -1, -1});
  check_values(ag::where(f64({0, 1, 1}, {3}), f64({1, 2, 3}, {3}), f64({7, 8, 9}, {3})), {3}, {7, 2, 3});
}

// ---------------------------------------------------------------- gradients (float64)

BOOST_AUTO_TEST_CASE(add_gradients_sum_over_broadcast_rows) {
  check_gradients([](const TensorList& x) { return x[0] + x[1]; }, {input({2, 3}, 1), input({3}, 2)});
}

BOOST_AUTO_TEST_CASE(add_gradient_is_the_row_count_for_a_broadcast_row) {
  Tensor a = input({4, 3}, 1), b = input({3}, 2);
  ag::sum(a + b).backward();
  check_values(b.grad(), {3}, {4, 4, 4});
  check_values(a.grad(), {4, 3}, std::vector<double>(12, 1.0));
}

BOOST_AUTO_TEST_CASE(sub_gradients_with_broadcast) {
  check_gradients([](const TensorList& x) { return x[0] - x[1]; }, {input({2, 3}, 3), input({2, 1}, 4)});
}

BOOST_AUTO_TEST_CASE(mul_gradients_with_middle_broadcast) {
  check_gradients([](const TensorList& x) { return x[0] * x[1]; }, {input({2, 1, 4}, 5), input({3, 1}, 6)});
}

BOOST_AUTO_TEST_CASE(mul_gradients_with_scalar_tensors) {
  check_gradients([](const TensorList& x) { return x[0] * x[1]; }, {input({}, 7), input({2, 3}, 8)});
  check_gradients([](const TensorList& x) { return x[0] * x[1]; }, {input({}, 9), input({}, 10)});
}

BOOST_AUTO_TEST_CASE(div_gradients_with_broadcast) {
  check_gradients([](const TensorList& x) { return x[0] / x[1]; },
                  {input({2, 1, 4}, 11), input_in({3, 1}, 0.5, 2.0, 12)});
}

BOOST_AUTO_TEST_CASE(pow_gradients_in_base_and_exponent) {
  check_gradients([](const TensorList& x) { return ag::pow(x[0], x[1]); },
                  {input_in({2, 3}, 0.5, 2.0, 13), input({3}, 14)});
}

BOOST_AUTO_TEST_CASE(maximum_and_minimum_gradients_with_broadcast) {
  // Inputs drawn apart so that no pair ties (ties are not differentiable).
  check_gradients([](const TensorList& x) { return ag::maximum(x[0], x[1]); }, {input({2, 3}, 15), input({3}, 16)});
  check_gradients([](const TensorList& x) { return ag::minimum(x[0], x[1]); }, {input({2, 1}, 17), input({2, 3}, 18)});
}

BOOST_AUTO_TEST_CASE(maximum_splits_the_gradient_on_ties) {
  Tensor a = f64({1, 2}, {2}).requires_grad_(), b = f64({1, 3}, {2}).requires_grad_();
  ag::sum(ag::maximum(a, b)).backward();
  check_values(a.grad(), {2}, {0.5, 0});
  check_values(b.grad(), {2}, {0.5, 1});
}

BOOST_AUTO_TEST_CASE(scalar_forms_gradients) {
  const Tensor x = input_in({2, 3}, 0.5, 2.0, 19);
  check_gradients([](const TensorList& v) { return ag::add(v[0], 2.5); }, {x});
  check_gradients([](const TensorList& v) { return ag::sub(v[0], 2.5); }, {x});
  check_gradients([](const TensorList& v) { return ag::rsub(v[0], 2.5); }, {x});
  check_gradients([](const TensorList& v) { return ag::mul(v[0], -1.5); }, {x});
  check_gradients([](const TensorList& v) { return ag::div(v[0], -1.5); }, {x});
  check_gradients([](const TensorList& v) { return ag::rdiv(v[0], -1.5); }, {x});
  for (double e : {2.0, 3.0, 0.5, -1.0, 1.0, -1.5, 0.0})
    check_gradients([e](const TensorList& v) { return ag::pow(v[0], e); }, {x});
}

BOOST_AUTO_TEST_CASE(operator_gradients) {
  check_gradients([](const TensorList& v) { return (2.0 - v[0]) * (v[1] / 3.0) + 1.0 / (v[0] + 4.0) - (-v[1]); },
                  {input_in({2, 3}, 0.0, 1.0, 20), input({3}, 21)});
}

BOOST_AUTO_TEST_CASE(unary_gradients) {
  const Tensor x = input({3, 4}, 22);
  const Tensor pos = input_in({3, 4}, 0.2, 3.0, 23);
  check_gradients([](const TensorList& v) { return ag::neg(v[0]); }, {x});
  check_gradients([](const TensorList& v) { return ag::exp(v[0]); }, {x});
  check_gradients([](const TensorList& v) { return ag::log(v[0]); }, {pos});
  check_gradients([](const TensorList& v) { return ag::sqrt(v[0]); }, {pos});
  check_gradients([](const TensorList& v) { return ag::rsqrt(v[0]); }, {pos});
  check_gradients([](const TensorList& v) { return ag::square(v[0]); }, {x});
  check_gradients([](const TensorList& v) { return ag::tanh(v[0]); }, {x});
  check_gradients([](const TensorList& v) { return ag::sigmoid(v[0]); }, {x});
  check_gradients([](const TensorList& v) { return ag::gelu(v[0]); }, {x});
  check_gradients([](const TensorList& v) { return ag::gelu(v[0], ag::GeluApproximation::Tanh); }, {x});
}

BOOST_AUTO_TEST_CASE(kinked_unary_gradients_away_from_the_kinks) {
  // Values bounded away from 0 (abs, relu) and from the clamp bounds ±0.5.
  const Tensor x = f64({-1.3, -0.7, -0.2, 0.3, 0.6, 1.1, -0.45, 0.45}, {2, 4}).requires_grad_();
  check_gradients([](const TensorList& v) { return ag::abs(v[0]); }, {x});
  check_gradients([](const TensorList& v) { return ag::relu(v[0]); }, {x});
  check_gradients([](const TensorList& v) { return ag::clamp(v[0], -0.5, 0.5); }, {x});
}

BOOST_AUTO_TEST_CASE(abs_and_relu_have_zero_gradient_at_zero) {
  Tensor x = f64({0, 0}, {2}).requires_grad_();
  ag::sum(ag::abs(x) + ag::relu(x)).backward();
  check_values(x.grad(), {2}, {0, 0});
}

BOOST_AUTO_TEST_CASE(clamp_gradient_passes_only_strictly_inside) {
  Tensor x = f64({-2, -1, 0, 1, 2}, {5}).requires_grad_();
  ag::sum(ag::clamp(x, -1, 1)).backward();
  check_values(x.grad(), {5}, {0, 0, 1, 0, 0});
}

BOOST_AUTO_TEST_CASE(masked_fill_gradient_is_zero_where_filled) {
  const Tensor mask = f64({1, 0, 0}, {3});
  check_gradients([mask](const TensorList& v) { return ag::masked_fill(v[0], mask, 5.0); }, {input({2, 3}, 24)});
  Tensor x = input({2, 3}, 25);
  ag::sum(ag::masked_fill(x, mask, 5.0) * 2.0).backward();
  check_values(x.grad(), {2, 3}, {0, 2, 2, 0, 2, 2});
}

BOOST_AUTO_TEST_CASE(where_gradients_with_broadcasting) {
  const Tensor cond = f64({1, 0}, {2, 1});
  check_gradients([cond](const TensorList& v) { return ag::where(cond, v[0], v[1]); },
                  {input({3}, 26), input({2, 3}, 27)});
  Tensor a = input({3}, 28), b = input({}, 29);
  ag::sum(ag::where(cond, a, b)).backward();
  check_values(a.grad(), {3}, {1, 1, 1});
  check_values(b.grad(), {}, {3});
}

BOOST_AUTO_TEST_CASE(x_times_x_plus_x_accumulates_both_paths) {
  Tensor x = f64({3}, {1}).requires_grad_();
  ag::sum(x * x + x).backward();
  check_values(x.grad(), {1}, {7});  // d(x² + x) = 2x + 1
}

// ---------------------------------------------------------------- float32 agrees with float64

BOOST_AUTO_TEST_CASE(float32_forward_equals_float64_to_float32_precision) {
  ag::Generator gen(30);
  const Tensor a64 = ag::uniform({5, 7}, 0.3, 2.5, Dtype::Float64, gen);
  const Tensor b64 = ag::uniform({7}, -2.0, 2.0, Dtype::Float64, gen);
  const Tensor a32 = a64.to(Dtype::Float32), b32 = b64.to(Dtype::Float32);
  using Op = std::function<Tensor(const Tensor&, const Tensor&)>;
  const std::vector<std::pair<std::string, Op>> ops = {
      {"add", [](const Tensor& a, const Tensor& b) { return a + b; }},
      {"sub", [](const Tensor& a, const Tensor& b) { return a - b; }},
      {"mul", [](const Tensor& a, const Tensor& b) { return a * b; }},
      {"div", [](const Tensor& a, const Tensor& b) { return a / b; }},
      {"pow", [](const Tensor& a, const Tensor& b) { return ag::pow(a, b); }},
      {"maximum", [](const Tensor& a, const Tensor& b) { return ag::maximum(a, b); }},
      {"minimum", [](const Tensor& a, const Tensor& b) { return ag::minimum(a, b); }},
      {"where", [](const Tensor& a, const Tensor& b) { return ag::where(ag::sub(a, 1.0), a, b); }},
      {"masked_fill", [](const Tensor& a, const Tensor& b) { return ag::masked_fill(a, ag::relu(b), -1.0); }},
      {"scalar forms", [](const Tensor& a, const Tensor&) {
         return ag::rdiv(ag::pow(ag::rsub(ag::mul(ag::div(ag::sub(ag::add(a, 1.0), 0.5), 3.0), 2.0), 4.0), 1.5), 2.0);
       }},
      {"neg", [](const Tensor& a, const Tensor& b) { return ag::neg(a * b); }},
      {"exp", [](const Tensor& a, const Tensor& b) { return ag::exp(a * b); }},
      {"log", [](const Tensor& a, const Tensor&) { return ag::log(a); }},
      {"sqrt", [](const Tensor& a, const Tensor&) { return ag::sqrt(a); }},
      {"rsqrt", [](const Tensor& a, const Tensor&) { return ag::rsqrt(a); }},
      {"square", [](const Tensor& a, const Tensor& b) { return ag::square(a * b); }},
      {"abs", [](const Tensor& a, const Tensor& b) { return ag::abs(a * b); }},
      {"tanh", [](const Tensor& a, const Tensor& b) { return ag::tanh(a * b); }},
      {"sigmoid", [](const Tensor& a, const Tensor& b) { return ag::sigmoid(a * b); }},
      {"relu", [](const Tensor& a, const Tensor& b) { return ag::relu(a * b); }},
      {"gelu", [](const Tensor& a, const Tensor& b) { return ag::gelu(a * b); }},
      {"gelu tanh", [](const Tensor& a, const Tensor& b) { return ag::gelu(a * b, ag::GeluApproximation::Tanh); }},
      {"clamp", [](const Tensor& a, const Tensor& b) { return ag::clamp(a * b, -1.0, 1.0); }},
  };
  for (const auto& [name, op] : ops) {
    const Tensor y32 = op(a32, b32), y64 = op(a64, b64);
    BOOST_TEST((y32.dtype() == Dtype::Float32), name);
    const std::vector<double> v32 = y32.to_vector(), v64 = y64.to_vector();
    double worst = 0;
    for (std::size_t i = 0; i < v64.size(); ++i)
      worst = std::max(worst, std::abs(v32[i] - v64[i]) / (1.0 + std::abs(v64[i])));
    BOOST_TEST(worst < 1e-5, name << ": worst relative difference " << worst);
  }
}

// ---------------------------------------------------------------- errors

BOOST_AUTO_TEST_CASE(incompatible_shapes_throw_naming_both) {
  const Tensor a = ag::zeros({2, 3}), b = ag::zeros({4});
  BOOST_TEST(error_of([&] { ag::add(a, b); }) == "add: shapes cannot be broadcast: [2, 3] and [4]");
  BOOST_TEST(error_of([&] { a * b; }) == "mul: shapes cannot be broadcast: [2, 3] and [4]");
  BOOST_TEST(error_of([&] { ag::sub(a, b); }) == "sub: shapes cannot be broadcast: [2, 3] and [4]");
  BOOST_TEST(error_of([&] { ag::div(a, b); }) == "div: shapes cannot be broadcast: [2, 3] and [4]");
  BOOST_TEST(error_of([&] { ag::pow(a, b); }) == "pow: shapes cannot be broadcast: [2, 3] and [4]");
  BOOST_TEST(error_of([&] { ag::maximum(a, b); }) == "maximum: shapes cannot be broadcast: [2, 3] and [4]");
  BOOST_TEST(error_of([&] { ag::minimum(a, b); }) == "minimum: shapes cannot be broadcast: [2, 3] and [4]");
  BOOST_TEST(error_of([&] { ag::where(ag::zeros({5}), a, a); }) ==
             "where: shapes cannot be broadcast: [5] and [2, 3]");
}

BOOST_AUTO_TEST_CASE(mixed_dtypes_throw_naming_both) {
  const Tensor a = ag::zeros({2}), b = ag::zeros({2}, Dtype::Float64);
  BOOST_TEST(error_of([&] { ag::mul(a, b); }) == "mul: dtypes differ: Float32 and Float64");
  BOOST_TEST(error_of([&] { b + a; }) == "add: dtypes differ: Float64 and Float32");
  BOOST_TEST(error_of([&] { ag::where(a, a, b); }) ==
             "where: dtypes differ: second argument Float32 and third argument Float64");
}

BOOST_AUTO_TEST_CASE(masked_fill_rejects_a_mask_that_does_not_broadcast_to_x) {
  const Tensor x = ag::zeros({2, 3});
  BOOST_TEST(error_of([&] { ag::masked_fill(x, ag::zeros({4, 2, 3}), 0); }) ==
             "masked_fill: mask of shape [4, 2, 3] cannot be broadcast to the input's shape [2, 3]");
  BOOST_TEST(error_of([&] { ag::masked_fill(x, ag::zeros({2}), 0); }) ==
             "masked_fill: shapes cannot be broadcast: [2, 3] and [2]");
}

BOOST_AUTO_TEST_CASE(clamp_rejects_min_above_max) {
  BOOST_TEST(error_of([] { ag::clamp(ag::zeros({2}), 1, -1); }) == "clamp: min 1 is greater than max -1");
}

BOOST_AUTO_TEST_CASE(undefined_tensors_throw) {
  const Tensor undefined;
  BOOST_CHECK_THROW(ag::add(undefined, ag::zeros({2})), std::invalid_argument);
  BOOST_CHECK_THROW(ag::exp(undefined), std::invalid_argument);
  BOOST_CHECK_THROW(ag::where(undefined, ag::zeros({2}), ag::zeros({2})), std::invalid_argument);
  BOOST_TEST(error_of([&] { ag::tanh(undefined); }) == "tanh: argument is an undefined tensor (default-constructed: no value)");
}
