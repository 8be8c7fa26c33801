// Int64 at its edges: gradcheck with integer and constant inputs beside the checked ones, Int64
// sums that overflow, conversions that fail part-way, comparisons with numbers at ±2^63,
// gradients of the wrong dtype, and the messages of the ops that need floats.
#define BOOST_TEST_MODULE int64_hostile
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <autograd/autograd.hpp>

#include "int64_support.hpp"
#include "test_support.hpp"

using namespace test_support::prelude;
using test_support::I64;
using test_support::int_values;
using test_support::ints;

namespace {

constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();

}  // namespace

// ---------------------------------------------------------------- gradcheck with other inputs

BOOST_AUTO_TEST_CASE(gradcheck_passes_int64_and_constant_inputs_through) {
  const Tensor x = ag::tensor(std::vector<double>{0.3, -1.2, 0.8, 0.1, 0.5, -0.4}, {2, 3}).to(Dtype::Float64).requires_grad_();
  const Tensor targets = ints({2, 0}, {2});
  const Tensor scale = ag::full({}, 2.0, Dtype::Float32);  // Float32, no grad
  const I64 targets_before = int_values(targets);
  const auto f = [](const std::vector<Tensor>& in) {
    return ag::mul(ag::cross_entropy(in[0], in[1]), in[2].to(Dtype::Float64));
  };
  const ag::GradcheckResult r = ag::gradcheck(f, {x, targets, scale});
  BOOST_TEST(r.ok, r.message);
  BOOST_TEST(r.elements_checked == 6);
  const ag::GradcheckResult rr = ag::gradgradcheck(f, {x, targets, scale});
  BOOST_TEST(rr.ok, rr.message);
  BOOST_TEST(int_values(targets) == targets_before, boost::test_tools::per_element());
  BOOST_TEST(scale.item<float>() == 2.0f);
  const std::vector<Tensor> h = ag::hvp(f, {x, targets, scale}, {ag::ones({2, 3}, Dtype::Float64), Tensor(), Tensor()});
  BOOST_TEST(h[0].defined());
  BOOST_TEST(!h[1].defined());
}

BOOST_AUTO_TEST_CASE(gradcheck_failure_says_which_test_failed_with_its_numbers) {
  const Tensor x = ag::tensor(std::vector<double>{1.0, 2.0}, {2}).to(Dtype::Float64).requires_grad_();
  // a backward that is wrong by a factor 2: d(x²)/dx reported as 4x
  const auto f = [](const std::vector<Tensor>& in) {
    const Tensor y = ag::mul(in[0], in[0]);
    return ag::add(y, ag::sub(y, y.detach()));
  };
  ag::GradcheckOptions opt;
  const ag::GradcheckResult r = ag::gradcheck(f, {x}, opt);
  BOOST_REQUIRE(!r.ok);
  const double err = std::abs(r.analytic - r.numeric);
  BOOST_TEST(err > opt.atol + opt.rtol * std::abs(r.numeric));
  const std::string allowed = fmt::format("allowed {:.3e} = atol {:g} + rtol {:g} * |numeric| {:.3e} (eps {:g})",
                                          opt.atol + opt.rtol * std::abs(r.numeric), opt.atol, opt.rtol,
                                          std::abs(r.numeric), opt.eps);
  const std::string diff = fmt::format("|analytic - numeric| = {:.3e} > ", err);
  BOOST_TEST(r.message.find("input 0 element ") == 0u, r.message);  // the location still leads
  BOOST_TEST(contains(r.message, diff + allowed), r.message);
  const std::string text = fmt::format("{}", r);
  BOOST_TEST(text.find("gradcheck FAILED: ") == 0u, text);
  BOOST_TEST(contains(text, diff + allowed), text);
  BOOST_TEST(r.atol == opt.atol);
  BOOST_TEST(r.rtol == opt.rtol);
  BOOST_TEST(r.eps == opt.eps);
}

// ---------------------------------------------------------------- sums that overflow

BOOST_AUTO_TEST_CASE(int64_sum_overflow_is_an_error_not_a_wrap) {
  const std::vector<std::string> parts = {"sum: the Int64 sum overflows", "64-bit range"};
  check_throws<std::invalid_argument>([] { ag::sum(ints({kMax, 1}, {2})); }, parts);
  check_throws<std::invalid_argument>([] { ag::sum(ints({kMin, -1}, {2})); }, parts);
  check_throws<std::invalid_argument>([] { ag::sum(ints({kMax, 0, 1, 0}, {2, 2}), 0); }, parts);
  check_throws<std::invalid_argument>([] { ag::sum(ints({0, 0, kMax, 1}, {2, 2}), 1); }, parts);
  // exact whenever the result fits, whatever the partial sums do
  BOOST_TEST(int_values(ag::sum(ints({kMax, 1, -1}, {3})))[0] == kMax);
  BOOST_TEST(int_values(ag::sum(ints({kMin, -1, 1, kMax}, {4})))[0] == -1);
  BOOST_TEST(int_values(ag::sum(ints({kMax, kMin, -1, 1}, {2, 2}), 0)) == I64({kMax - 1, kMin + 1}),
             boost::test_tools::per_element());
}

// ---------------------------------------------------------------- conversions that fail

BOOST_AUTO_TEST_CASE(copy_into_int64_writes_nothing_when_a_value_cannot_convert) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor t = ints({7, 8, 9}, {3});
  const Tensor bad = ag::tensor(std::vector<double>{1, 2, nan}, {3});
  check_throws<std::invalid_argument>([&] { t.copy_(bad); }, {"copy_: value nan at position 2"});
  BOOST_TEST(int_values(t) == I64({7, 8, 9}), boost::test_tools::per_element());
  const Tensor big = ag::tensor(std::vector<double>{1.0, 1e30, 3.0}, {3}).to(Dtype::Float32);
  check_throws<std::invalid_argument>([&] { t.copy_(big); }, {"copy_: value", "at position 1"});
  BOOST_TEST(int_values(t) == I64({7, 8, 9}), boost::test_tools::per_element());
  check_throws<std::invalid_argument>([&] { t.fill_(nan); }, {"fill_: value nan"});
  BOOST_TEST(int_values(t) == I64({7, 8, 9}), boost::test_tools::per_element());
  t.copy_(ag::tensor(std::vector<double>{-1.5, 2.5, 3.0}, {3}));  // truncated toward zero
  BOOST_TEST(int_values(t) == I64({-1, 2, 3}), boost::test_tools::per_element());
}

// ---------------------------------------------------------------- comparisons at ±2^63

BOOST_AUTO_TEST_CASE(comparisons_with_numbers_at_two_to_the_63_are_exact) {
  const Tensor a = ints({kMax, kMin, kMin + 1, 0}, {4});
  const double inf = std::numeric_limits<double>::infinity();
  // the exact answers: every Int64 v has -2^63 <= v < 2^63, and -2^63 is kMin itself
  struct Case {
    double b;
    I64 eq, lt, gt;
  };
  const std::vector<Case> cases = {
      {0x1p63, {0, 0, 0, 0}, {1, 1, 1, 1}, {0, 0, 0, 0}},
      {inf, {0, 0, 0, 0}, {1, 1, 1, 1}, {0, 0, 0, 0}},
      {0x1p64, {0, 0, 0, 0}, {1, 1, 1, 1}, {0, 0, 0, 0}},
      {-0x1p63, {0, 1, 0, 0}, {0, 0, 0, 0}, {1, 0, 1, 1}},
      {-0x1p64, {0, 0, 0, 0}, {0, 0, 0, 0}, {1, 1, 1, 1}},
      {-inf, {0, 0, 0, 0}, {0, 0, 0, 0}, {1, 1, 1, 1}},
  };
  for (const auto& c : cases) {
    I64 ne, le, ge;
    for (std::size_t k = 0; k < 4; ++k) {
      ne.push_back(1 - c.eq[k]);
      le.push_back(c.lt[k] | c.eq[k]);
      ge.push_back(c.gt[k] | c.eq[k]);
    }
    const std::string b = fmt::format("b = {}", c.b);
    BOOST_TEST(int_values(ag::eq(a, c.b)) == c.eq, b << " eq" << boost::test_tools::per_element());
    BOOST_TEST(int_values(ag::ne(a, c.b)) == ne, b << " ne" << boost::test_tools::per_element());
    BOOST_TEST(int_values(ag::lt(a, c.b)) == c.lt, b << " lt" << boost::test_tools::per_element());
    BOOST_TEST(int_values(ag::le(a, c.b)) == le, b << " le" << boost::test_tools::per_element());
    BOOST_TEST(int_values(ag::gt(a, c.b)) == c.gt, b << " gt" << boost::test_tools::per_element());
    BOOST_TEST(int_values(ag::ge(a, c.b)) == ge, b << " ge" << boost::test_tools::per_element());
  }
  // NaN: nothing holds but ne
  const double nan = std::numeric_limits<double>::quiet_NaN();
  BOOST_TEST(int_values(ag::eq(a, nan)) == I64({0, 0, 0, 0}), boost::test_tools::per_element());
  BOOST_TEST(int_values(ag::ne(a, nan)) == I64({1, 1, 1, 1}), boost::test_tools::per_element());
  BOOST_TEST(int_values(ag::ge(a, nan)) == I64({0, 0, 0, 0}), boost::test_tools::per_element());
}

// ---------------------------------------------------------------- gradients and messages

BOOST_AUTO_TEST_CASE(set_grad_refuses_an_int64_gradient) {
  const Tensor i = ints({1, 2, 3}, {3});
  check_throws<std::invalid_argument>([&] { i.set_grad(ints({0, 0, 0}, {3})); }, {"set_grad: ", "Int64"});
  BOOST_TEST(!i.grad().defined());
  const Tensor f = ag::zeros({3}, Dtype::Float32).requires_grad_();
  check_throws<std::invalid_argument>([&] { f.set_grad(ints({0, 0, 0}, {3})); },
                                      {"set_grad: ", "Int64", ".to(Dtype::Float32)"});
  BOOST_TEST(!f.grad().defined());
}

BOOST_AUTO_TEST_CASE(float_ops_given_int64_name_themselves_and_say_what_to_do) {
  const Tensor i = ints({1, 2, 3}, {3});
  const Tensor i4 = ints({1, 2, 3, 4, 5, 6, 7, 8}, {1, 1, 2, 4});
  const Tensor f4 = ag::ones({1, 1, 2, 4});
  const Tensor f3 = ag::ones({1, 2, 4});
  const Tensor i3 = ints({1, 2, 3, 4, 5, 6, 7, 8}, {1, 2, 4});
  const Tensor fn = ag::ones({3});
  const std::string got = "needs a Float32 or Float64 tensor, got Int64 (shape [3]); convert with .to(Dtype::Float32)";
  const std::string got4 = "needs a Float32 or Float64 tensor, got Int64 (shape [1, 1, 2, 4]); convert with .to(Dtype::Float32)";
  const std::string got3 = "needs a Float32 or Float64 tensor, got Int64 (shape [1, 2, 4]); convert with .to(Dtype::Float32)";
  const std::vector<std::pair<std::string, std::function<void()>>> cases = {
      {"sqrt: " + got, [&] { ag::sqrt(i); }},
      {"abs: " + got, [&] { ag::abs(i); }},
      {"relu: " + got, [&] { ag::relu(i); }},
      {"clamp: " + got, [&] { ag::clamp(i, 0.0, 1.0); }},
      {"square: " + got, [&] { ag::square(i); }},
      {"gelu: " + got, [&] { ag::gelu(i); }},
      {"exp: " + got, [&] { ag::exp(i); }},
      {"log: " + got, [&] { ag::log(i); }},
      {"neg: " + got, [&] { (void)(-i); }},
      {"softmax: " + got, [&] { ag::softmax(i, 0); }},
      {"log_softmax: " + got, [&] { ag::log_softmax(i, 0); }},
      {"layer_norm: the input " + got, [&] { ag::layer_norm(i, {3}); }},
      {"layer_norm: weight " + got, [&] { ag::layer_norm(fn, {3}, i); }},
      {"layer_norm: bias " + got, [&] { ag::layer_norm(fn, {3}, fn, i); }},
      {"scaled_dot_product_attention: q " + got4, [&] { ag::scaled_dot_product_attention(i4, f4, f4); }},
      {"scaled_dot_product_attention: k " + got4, [&] { ag::scaled_dot_product_attention(f4, i4, f4); }},
      {"scaled_dot_product_attention: v " + got4, [&] { ag::scaled_dot_product_attention(f4, f4, i4); }},
      {"scaled_dot_product_attention_heads_last: q " + got3,
       [&] { ag::scaled_dot_product_attention_heads_last(i3, f3, f3, 1); }},
  };
  for (const auto& [expected, f] : cases) BOOST_TEST(error_of(f, "(no error)") == expected);
}

BOOST_AUTO_TEST_CASE(item_of_the_wrong_dtype_names_item_and_the_conversion) {
  check_throws<std::invalid_argument>([] { (void)ints({5}, {1}).item<float>(); },
                                      {"item: tensor holds Int64 but Float32 was asked for", ".to(Dtype::Float32)"});
  check_throws<std::invalid_argument>([] { (void)ag::ones({1}).item<std::int64_t>(); },
                                      {"item: tensor holds Float32 but Int64 was asked for", ".to(Dtype::Int64)"});
}
