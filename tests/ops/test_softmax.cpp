// softmax and log_softmax: hand-computed values, rows summing to one, stability with large
// inputs, fully masked rows (zeros / -inf, zero gradient, no NaN), float64 gradchecks along
// every dim, float32 agreeing with float64, and the errors.
#define BOOST_TEST_MODULE softmax
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <autograd/autograd.hpp>

#include "test_support.hpp"

using namespace test_support::prelude;

namespace {

constexpr double inf = std::numeric_limits<double>::infinity();

// Naive reference along `dim` of a row-major tensor: exp(x) / Σ exp(x) straight from the
// definition (inputs are small, so no shift is needed), or its log.
std::vector<double> naive_softmax(const Tensor& x, std::int64_t dim, bool log) {
  const Shape& s = x.shape();
  std::int64_t outer = 1, inner = 1;
  for (std::int64_t i = 0; i < dim; ++i) outer *= s[static_cast<std::size_t>(i)];
  for (std::size_t i = static_cast<std::size_t>(dim) + 1; i < s.size(); ++i) inner *= s[i];
  const std::int64_t n = s[static_cast<std::size_t>(dim)];
  const auto v = x.to_vector();
  std::vector<double> out(v.size());
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t i = 0; i < inner; ++i) {
      double total = 0;
      for (std::int64_t k = 0; k < n; ++k) total += std::exp(v[static_cast<std::size_t>((o * n + k) * inner + i)]);
      for (std::int64_t k = 0; k < n; ++k) {
        const auto at = static_cast<std::size_t>((o * n + k) * inner + i);
        out[at] = log ? v[at] - std::log(total) : std::exp(v[at]) / total;
      }
    }
  return out;
}

}  // namespace

// ---------------------------------------------------------------- forward values

BOOST_AUTO_TEST_CASE(softmax_of_one_two_three) {
  // e^k / (e + e² + e³)
  check_values(ag::softmax(f64({1, 2, 3}, {3}), 0), {3}, {0.09003057317038046, 0.24472847105479767, 0.6652409557748219});
}

BOOST_AUTO_TEST_CASE(log_softmax_of_one_two_three) {
  // k - log(e + e² + e³), log(e + e² + e³) = 3.40760596444438
  check_values(ag::log_softmax(f64({1, 2, 3}, {3}), -1), {3}, {-2.40760596444438, -1.40760596444438, -0.40760596444438});
}

BOOST_AUTO_TEST_CASE(softmax_along_dim0_normalises_columns) {
  // columns (1, 3) and (2, 4): both differ by 2 -> 1/(1+e²), e²/(1+e²)
  const double lo = 1 / (1 + std::exp(2.0)), hi = 1 - lo;
  check_values(ag::softmax(f64({1, 2, 3, 4}, {2, 2}), 0), {2, 2}, {lo, lo, hi, hi});
}

BOOST_AUTO_TEST_CASE(softmax_along_every_dim_matches_the_definition) {
  const Tensor x = input({2, 3, 4}, 1).detach();
  for (std::int64_t d = 0; d < 3; ++d) {
    check_values(ag::softmax(x, d), {2, 3, 4}, naive_softmax(x, d, false));
    check_values(ag::log_softmax(x, d - 3), {2, 3, 4}, naive_softmax(x, d, true));
  }
}

BOOST_AUTO_TEST_CASE(softmax_rows_sum_to_one) {
  const Tensor x = input({200, 300}, 2).detach();  // large enough for the threaded path
  for (std::int64_t d : {1, 0}) {
    const auto s = ag::sum(ag::softmax(x, d), d).to_vector();
    for (double v : s) BOOST_TEST(std::abs(v - 1) < 1e-12, "row sum " << v);
  }
}

BOOST_AUTO_TEST_CASE(softmax_is_stable_for_large_inputs) {
  // [1000, 1001] and [-1000, -999] behave like [0, 1]: 1/(1+e), e/(1+e)
  const double lo = 1 / (1 + std::exp(1.0)), hi = 1 - lo;
  check_values(ag::softmax(f64({1000, 1001, -1000, -999}, {2, 2}), 1), {2, 2}, {lo, hi, lo, hi});
  check_values(ag::softmax(f64({1000, -1000, 1001, -999}, {2, 2}), 0), {2, 2}, {lo, lo, hi, hi});
  const double lse = std::log(1 + std::exp(1.0));  // log(e⁰ + e¹)
  check_values(ag::log_softmax(f64({1000, 1001}, {2}), 0), {2}, {-lse, 1 - lse});
  check_values(ag::log_softmax(ag::tensor({1000, 1001}, {2}), 0), {2}, {-lse, 1 - lse}, 1e-6);
  check_values(ag::log_softmax(ag::tensor({1000, -5, 1001, -4}, {2, 2}), 0), {2, 2}, {-lse, -lse, 1 - lse, 1 - lse}, 1e-6);
}

// ---------------------------------------------------------------- masked rows

BOOST_AUTO_TEST_CASE(fully_masked_row_is_zero_not_nan) {
  Tensor x = f64({-inf, -inf, -inf, 0, 0, std::log(2.0)}, {2, 3}).requires_grad_();
  const Tensor y = ag::softmax(x, 1);
  check_values(y, {2, 3}, {0, 0, 0, 0.25, 0.25, 0.5});
  y.backward(f64({1, 2, 3, 1, 2, 3}, {2, 3}));
  // row 0: zero gradient; row 1: y ⊙ (dy − Σ dy⊙y) with Σ = 0.25 + 0.5 + 1.5 = 2.25
  check_values(x.grad(), {2, 3}, {0, 0, 0, 0.25 * -1.25, 0.25 * -0.25, 0.5 * 0.75});
}

BOOST_AUTO_TEST_CASE(fully_masked_column_is_zero_not_nan) {
  Tensor x = f64({-inf, 0, -inf, 0}, {2, 2}).requires_grad_();
  const Tensor y = ag::softmax(x, 0);
  check_values(y, {2, 2}, {0, 0.5, 0, 0.5});
  y.backward(f64({1, 2, 3, 4}, {2, 2}));
  check_values(x.grad(), {2, 2}, {0, -0.5, 0, 0.5});
}

BOOST_AUTO_TEST_CASE(log_softmax_of_a_fully_masked_row_is_minus_inf_with_zero_gradient) {
  for (std::int64_t dim : {1, 0}) {
    Tensor x = f64({-inf, 0, -inf, 0}, {2, 2});
    if (dim == 1) x = f64({-inf, -inf, 0, 0}, {2, 2});
    x.requires_grad_();
    const Tensor y = ag::log_softmax(x, dim);
    const double half = -std::log(2.0);
    check_values_nonfinite(y, {2, 2}, dim == 1 ? std::vector<double>{-inf, -inf, half, half} : std::vector<double>{-inf, half, -inf, half});
    y.backward(f64({1, 2, 3, 4}, {2, 2}));
    // normal row/column: dy − ½·Σdy
    check_values(x.grad(), {2, 2}, dim == 1 ? std::vector<double>{0, 0, -0.5, 0.5} : std::vector<double>{0, -1, 0, 1});
  }
}

BOOST_AUTO_TEST_CASE(partly_masked_rows_ignore_the_masked_entries) {
  const Tensor x = f64({-inf, 1, 2, 3, -inf, 3}, {2, 3});
  const double a = 1 / (1 + std::exp(1.0)), b = 1 - a;
  check_values(ag::softmax(x, 1), {2, 3}, {0, a, b, 0.5, 0, 0.5});
  // the same rows as columns (the strided path)
  check_values_nonfinite(ag::softmax(f64({-inf, 3, 1, -inf, 2, 3}, {3, 2}), 0), {3, 2}, {0, 0.5, a, 0, b, 0.5});
}

BOOST_AUTO_TEST_CASE(nan_spreads_over_its_row) {
  const Tensor y = ag::softmax(f64({1, std::nan(""), 2, 1, 2, 3}, {2, 3}), 1);
  const auto v = y.to_vector();
  for (int i = 0; i < 3; ++i) BOOST_TEST(std::isnan(v[static_cast<std::size_t>(i)]));
  for (int i = 3; i < 6; ++i) BOOST_TEST(std::isfinite(v[static_cast<std::size_t>(i)]));
}

// ---------------------------------------------------------------- gradients

BOOST_AUTO_TEST_CASE(gradcheck_softmax_along_each_dim) {
  for (std::int64_t d : {0, 1, 2, -1})
    check_gradients([d](const TensorList& in) { return ag::softmax(in[0], d); }, {input({2, 3, 4}, 10 + static_cast<std::uint64_t>(d + 1))});
}

BOOST_AUTO_TEST_CASE(gradcheck_log_softmax_along_each_dim) {
  for (std::int64_t d : {0, 1, 2, -2})
    check_gradients([d](const TensorList& in) { return ag::log_softmax(in[0], d); }, {input({2, 3, 4}, 20 + static_cast<std::uint64_t>(d + 2))});
}

BOOST_AUTO_TEST_CASE(gradcheck_softmax_of_attention_scores) {
  // [batch, heads, query, key] scores, softmax over the keys
  check_gradients([](const TensorList& in) { return ag::softmax(in[0], -1); }, {input({2, 2, 3, 5}, 30)});
  check_gradients([](const TensorList& in) { return ag::log_softmax(in[0], 3); }, {input({2, 2, 3, 5}, 31)});
}

BOOST_AUTO_TEST_CASE(gradcheck_softmax_with_masked_entries) {
  // -inf entries (and a fully masked row) stay -inf under perturbation: their gradient is 0.
  // (Not log_softmax: its -inf outputs make central differences NaN.)
  const Tensor mask = f64({0, -inf, 0, 0, -inf, -inf, -inf, -inf, 0, 0, 0, -inf}, {3, 4});
  for (std::int64_t d : {1, 0}) {
    check_gradients([&](const TensorList& in) { return ag::softmax(in[0] + mask, d); }, {input({3, 4}, 40)});
  }
}

BOOST_AUTO_TEST_CASE(gradcheck_softmax_of_a_scalar_tensor) {
  check_gradients([](const TensorList& in) { return ag::softmax(in[0], 0); }, {input({}, 50)});
  check_gradients([](const TensorList& in) { return ag::log_softmax(in[0], -1); }, {input({}, 51)});
}

// ---------------------------------------------------------------- float32

BOOST_AUTO_TEST_CASE(float32_agrees_with_float64) {
  const Tensor x64 = ag::mul(input({8, 16, 33}, 60).detach(), 5.0);
  const Tensor x32 = x64.to(Dtype::Float32);
  for (std::int64_t d : {2, 1}) {
    for (bool log : {false, true}) {
      const auto a = (log ? ag::log_softmax(x32, d) : ag::softmax(x32, d)).to_vector();
      const auto b = (log ? ag::log_softmax(x64, d) : ag::softmax(x64, d)).to_vector();
      double worst = 0;
      for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]) / (1 + std::abs(b[i])));
      BOOST_TEST(worst < 1e-5, "dim " << d << (log ? " log_softmax" : " softmax") << ": worst " << worst);
    }
  }
}

// ---------------------------------------------------------------- errors

BOOST_AUTO_TEST_CASE(dim_out_of_range_is_rejected) {
  BOOST_CHECK_THROW(ag::softmax(ag::zeros({2, 3}), 2), std::invalid_argument);
  BOOST_TEST(error_of([] { ag::softmax(ag::zeros({2, 3}), 2); }) == "softmax: dim 2 is out of range for a tensor of rank 2");
  BOOST_TEST(error_of([] { ag::log_softmax(ag::zeros({2, 3}), -3); }) ==
             "log_softmax: dim -3 is out of range for a tensor of rank 2");
}

BOOST_AUTO_TEST_CASE(undefined_input_is_rejected) {
  BOOST_TEST(error_of([] { ag::softmax(Tensor(), 0); }) == "softmax: the input is an undefined tensor (default-constructed: no value)");
}
