// Dropout: deterministic for a seed, the dropped fraction near p, the expectation preserved,
// the gradient through the same mask, eval / p == 0 / p == 1, and the errors.
#define BOOST_TEST_MODULE dropout
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include <autograd/autograd.hpp>

#include "test_support.hpp"

using namespace test_support::prelude;

namespace {

double fraction_zero(const Tensor& t) {
  const auto v = t.to_vector();
  double zeros = 0;
  for (double e : v) zeros += e == 0.0;
  return zeros / static_cast<double>(v.size());
}

}  // namespace

BOOST_AUTO_TEST_CASE(same_seed_gives_the_same_mask) {
  Tensor x = ag::ones({1000});
  ag::Generator g1(42), g2(42), g3(43);
  const auto a = ag::dropout(x, 0.5, true, g1).to_vector();
  const auto b = ag::dropout(x, 0.5, true, g2).to_vector();
  const auto c = ag::dropout(x, 0.5, true, g3).to_vector();
  BOOST_TEST(a == b);
  BOOST_TEST(a != c);
  // The generator advances: a second call with the same generator draws a new mask.
  BOOST_TEST(ag::dropout(x, 0.5, true, g1).to_vector() != a);
}

BOOST_AUTO_TEST_CASE(dropped_fraction_is_near_p) {
  Tensor x = ag::ones({200000}, Dtype::Float64);
  ag::Generator gen(7);
  for (double p : {0.1, 0.3, 0.5, 0.9}) {
    // standard deviation of the fraction: sqrt(p(1-p)/n) <= 0.0012; allow 5 of them
    BOOST_TEST(std::abs(fraction_zero(ag::dropout(x, p, true, gen)) - p) <= 0.006, "p = " << p);
  }
}

BOOST_AUTO_TEST_CASE(survivors_are_scaled_so_the_expectation_is_preserved) {
  ag::Generator gen(8);
  Tensor x = ag::uniform({200000}, 1.0, 2.0, Dtype::Float64, gen);
  const double p = 0.25;
  Tensor y = ag::dropout(x, p, true, gen);
  const auto xs = x.to_vector(), ys = y.to_vector();
  bool scaled = true;
  double sum_x = 0, sum_y = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    scaled = scaled && (ys[i] == 0.0 || std::abs(ys[i] - xs[i] / (1 - p)) <= 1e-12 * ys[i]);
    sum_x += xs[i];
    sum_y += ys[i];
  }
  BOOST_TEST(scaled, "every kept element is x / (1 - p)");
  // E[y] = E[x]; the mean of y deviates by ~sqrt(p/(1-p)) * 1.5 / sqrt(n) ≈ 0.002 of it
  BOOST_TEST(std::abs(sum_y / sum_x - 1.0) <= 0.01);
}

BOOST_AUTO_TEST_CASE(float32_dropout_uses_the_same_mask_as_float64) {
  ag::Generator g1(9), g2(9);
  const auto a = ag::dropout(ag::ones({500}, Dtype::Float32), 0.4, true, g1).to_vector();
  const auto b = ag::dropout(ag::ones({500}, Dtype::Float64), 0.4, true, g2).to_vector();
  bool same = true;
  for (std::size_t i = 0; i < a.size(); ++i) same = same && std::abs(a[i] - b[i]) <= 1e-6;
  BOOST_TEST(same);
}

BOOST_AUTO_TEST_CASE(gradient_goes_through_the_same_mask) {
  ag::Generator gen(10);
  Tensor x = ag::randn({3, 50}, Dtype::Float64, gen).requires_grad_();
  const double p = 0.3;
  Tensor y = ag::dropout(x, p, true, gen);
  Tensor w = ag::randn({3, 50}, Dtype::Float64, gen);
  ag::sum(y * w).backward();
  const auto ys = y.to_vector(), ws = w.to_vector(), gs = x.grad().to_vector();
  bool same_mask = true;
  for (std::size_t i = 0; i < ys.size(); ++i) {
    const double expected = ys[i] == 0.0 ? 0.0 : ws[i] / (1 - p);  // kept where the forward kept
    same_mask = same_mask && std::abs(gs[i] - expected) <= 1e-12 * (1 + std::abs(expected));
  }
  BOOST_TEST(same_mask);
}

BOOST_AUTO_TEST_CASE(dropout_with_a_reseeded_generator_passes_gradcheck) {
  ag::Generator init(11);
  Tensor x = ag::randn({4, 5}, Dtype::Float64, init).requires_grad_();
  const auto r = ag::gradcheck(
      [](const TensorList& in) {
        ag::Generator gen(12);  // the same mask at every evaluation
        return ag::dropout(in[0], 0.4, true, gen);
      },
      {x});
  BOOST_TEST(r.ok, fmt::format("{}", r));
}

BOOST_AUTO_TEST_CASE(eval_mode_and_p_zero_return_the_input_unchanged) {
  Tensor x = ag::randn({10});
  BOOST_TEST(ag::dropout(x, 0.5, false).is_same(x));
  BOOST_TEST(ag::dropout(x, 0.0, true).is_same(x));
  ag::Generator gen(1);
  const std::uint64_t before = gen.state();
  ag::dropout(x, 0.5, false, gen);
  BOOST_TEST(gen.state() == before);  // no numbers drawn in eval mode
}

BOOST_AUTO_TEST_CASE(p_one_zeroes_everything_without_nan) {
  Tensor x = ag::randn({20}, Dtype::Float64).requires_grad_();
  Tensor y = ag::dropout(x, 1.0, true);
  for (double v : y.to_vector()) BOOST_TEST(v == 0.0);
  ag::sum(y).backward();
  for (double g : x.grad().to_vector()) BOOST_TEST(g == 0.0);
}

BOOST_AUTO_TEST_CASE(p_outside_zero_one_is_rejected) {
  Tensor x = ag::ones({3});
  BOOST_TEST(error_of([&] { ag::dropout(x, -0.1); }) == "dropout: p must be in [0, 1], got -0.1");
  BOOST_TEST(error_of([&] { ag::dropout(x, 1.5); }) == "dropout: p must be in [0, 1], got 1.5");
  BOOST_TEST(error_of([&] { ag::dropout(x, std::nan("")); }).find("dropout: p must be in [0, 1]") == 0);
  BOOST_TEST(error_of([&] { ag::dropout(x, 2.0, false); }).find("dropout: p must be in [0, 1]") == 0);
  BOOST_TEST(error_of([&] { ag::dropout(Tensor(), 0.5); }) == "dropout: the input is an undefined tensor (default-constructed: no value)");
  ag::Generator gen(3);
  const std::uint64_t before = gen.state();
  BOOST_TEST(error_of([&] { ag::dropout(x, 1.5, true, gen); }) == "dropout: p must be in [0, 1], got 1.5");
  BOOST_TEST(gen.state() == before);  // nothing drawn
}
