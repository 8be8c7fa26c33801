// Int64 tensors hold exact integers and carry no gradient: masked_fill fills an Int64 input with
// an exactly representable integer (and refuses any other value), an Int64 output of a custom
// Function does not require grad, and arange counts in Int64 exactly over the whole 64-bit range.
#define BOOST_TEST_MODULE int64_exact_and_not_differentiable
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <autograd/autograd.hpp>

#include "test_support.hpp"

using namespace test_support::prelude;

namespace {

constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();
constexpr std::int64_t k2p53 = std::int64_t{1} << 53;
constexpr std::int64_t k2p62 = std::int64_t{1} << 62;

std::vector<std::int64_t> ints_of(const Tensor& t) {
  BOOST_REQUIRE(t.dtype() == Dtype::Int64);
  const std::int64_t* d = t.data<std::int64_t>();
  return {d, d + t.numel()};
}

// (2x, the index of the largest element): one Float64 and one Int64 output.
int scaled_and_argmax_backward_calls = 0;
std::size_t scaled_and_argmax_gradients_seen = 0;
struct ScaledAndArgmax : ag::Function<ScaledAndArgmax> {
  static constexpr const char* name = "scaled_and_argmax";
  static TensorList forward(ag::FunctionCtx&, const Tensor& x) { return {ag::mul(x, 2.0), ag::argmax(x, 0)}; }
  static TensorList backward(ag::FunctionCtx&, const TensorList& g) {
    ++scaled_and_argmax_backward_calls;
    scaled_and_argmax_gradients_seen = g.size();
    return {ag::mul(g[0], 2.0)};
  }
};

// The index of the largest element only: an Int64 output alone.
struct ArgmaxOnly : ag::Function<ArgmaxOnly> {
  static constexpr const char* name = "argmax_only";
  static Tensor forward(ag::FunctionCtx&, const Tensor& x) { return ag::argmax(x, 0); }
  static TensorList backward(ag::FunctionCtx&, const TensorList&) { return {Tensor()}; }
};

}  // namespace

BOOST_AUTO_TEST_SUITE(int64_exact_and_not_differentiable)

// ---- masked_fill ----

BOOST_AUTO_TEST_CASE(masked_fill_fills_an_int64_input_exactly) {
  const Tensor targets = ag::tensor_int64({4, -100, 7, -100, 0}, {5});
  const Tensor cleaned = ag::masked_fill(targets, ag::eq(targets, -100.0), 0.0);
  BOOST_TEST(ints_of(cleaned) == (std::vector<std::int64_t>{4, 0, 7, 0, 0}), boost::test_tools::per_element());
  BOOST_TEST(!cleaned.requires_grad());
  // A float 0/1 mask, a broadcast mask, and values at the ends of the range, exactly.
  const Tensor grid = ag::tensor_int64({1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor column_mask = ag::tensor({1, 0, 1}, {3});
  BOOST_TEST(ints_of(ag::masked_fill(grid, column_mask, static_cast<double>(k2p62))) ==
                 (std::vector<std::int64_t>{k2p62, 2, k2p62, k2p62, 5, k2p62}),
             boost::test_tools::per_element());
  BOOST_TEST(ints_of(ag::masked_fill(grid, column_mask, -0x1p63)) ==
                 (std::vector<std::int64_t>{kMin, 2, kMin, kMin, 5, kMin}),
             boost::test_tools::per_element());
  BOOST_TEST(ints_of(grid) == (std::vector<std::int64_t>{1, 2, 3, 4, 5, 6}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(masked_fill_refuses_a_value_an_int64_input_cannot_hold) {
  const Tensor t = ag::tensor_int64({1, 2}, {2});
  const Tensor m = ag::tensor_int64({1, 0}, {2});
  BOOST_TEST(error_of([&] { ag::masked_fill(t, m, 0.5); }) ==
             "masked_fill: value 0.5 is not an integer, so an Int64 input cannot hold it");
  BOOST_TEST(error_of([&] { ag::masked_fill(t, m, 0x1p63); }) ==
             "masked_fill: value 9.223372036854776e+18 is outside the Int64 range, so an Int64 input cannot hold it");
  BOOST_TEST(error_of([&] { ag::masked_fill(t, m, kNaN); }) ==
             "masked_fill: value nan is not an integer, so an Int64 input cannot hold it");
  BOOST_TEST(error_of([&] { ag::masked_fill(t, m, -kInf); }) ==
             "masked_fill: value -inf is outside the Int64 range, so an Int64 input cannot hold it");
  BOOST_TEST(error_of([&] { ag::masked_fill(t, ag::ones({3}), 0.0); }).find("masked_fill: ") == 0u);
}

// ---- custom Functions ----

BOOST_AUTO_TEST_CASE(an_int64_output_of_a_custom_function_does_not_require_grad) {
  const Tensor x = f64({0.5, 3.0, -1.0}, {3}).requires_grad_();
  const TensorList out = ScaledAndArgmax::apply(x);
  BOOST_TEST(out[0].requires_grad());
  BOOST_TEST(!out[1].requires_grad());
  BOOST_TEST(!out[1].grad_fn());
  BOOST_TEST(ints_of(out[1]) == (std::vector<std::int64_t>{1}), boost::test_tools::per_element());
  BOOST_TEST(!ag::sum(out[1]).requires_grad());
  const Tensor alone = ArgmaxOnly::apply(x);
  BOOST_TEST(!alone.requires_grad());
  BOOST_TEST(!alone.grad_fn());
  // An op on the Int64 output joins a differentiable loss as a constant: d/dx Σ 2x·(idx + 1) = 2·2.
  scaled_and_argmax_backward_calls = 0;
  const Tensor loss = ag::sum(ag::mul(out[0], ag::add(out[1].to(Dtype::Float64), 1.0)));
  loss.backward();
  check_values(x.grad(), {3}, {4, 4, 4});
  BOOST_TEST(scaled_and_argmax_backward_calls == 1);
  BOOST_TEST(scaled_and_argmax_gradients_seen == 2u);  // still one gradient per output
}

// ---- arange ----

BOOST_AUTO_TEST_CASE(int64_arange_is_exact_past_two_to_the_53) {
  BOOST_TEST(ints_of(ag::arange(k2p53, k2p53 + 6, std::int64_t{1}, Dtype::Int64)) ==
                 (std::vector<std::int64_t>{k2p53, k2p53 + 1, k2p53 + 2, k2p53 + 3, k2p53 + 4, k2p53 + 5}),
             boost::test_tools::per_element());
  // Bounds given as doubles that hold integers exactly count in integers too.
  BOOST_TEST(ints_of(ag::arange(0x1p53, 0x1p53 + 4, 1.0, Dtype::Int64)) ==
                 (std::vector<std::int64_t>{k2p53, k2p53 + 1, k2p53 + 2, k2p53 + 3}),
             boost::test_tools::per_element());
  // Up to the last int64, and down from it.
  BOOST_TEST(ints_of(ag::arange(kMax - 3, kMax, std::int64_t{1}, Dtype::Int64)) ==
                 (std::vector<std::int64_t>{kMax - 3, kMax - 2, kMax - 1}),
             boost::test_tools::per_element());
  BOOST_TEST(ints_of(ag::arange(kMax, kMax - 10, std::int64_t{-3}, Dtype::Int64)) ==
                 (std::vector<std::int64_t>{kMax, kMax - 3, kMax - 6, kMax - 9}),
             boost::test_tools::per_element());
  BOOST_TEST(ints_of(ag::arange(kMin, kMin + 2, std::int64_t{1}, Dtype::Int64)) ==
                 (std::vector<std::int64_t>{kMin, kMin + 1}),
             boost::test_tools::per_element());
  // A step as wide as the range: the two ends.
  BOOST_TEST(ints_of(ag::arange(kMin, kMax, kMax, Dtype::Int64)) == (std::vector<std::int64_t>{kMin, -1, kMax - 1}),
             boost::test_tools::per_element());
  BOOST_TEST(ints_of(ag::arange(std::int64_t{5}, Dtype::Int64)) == (std::vector<std::int64_t>{0, 1, 2, 3, 4}),
             boost::test_tools::per_element());
  BOOST_TEST(ag::arange(std::int64_t{3}, std::int64_t{3}, std::int64_t{1}, Dtype::Int64).numel() == 0);
  // Integer arguments with a floating dtype give the same values as before.
  check_values(ag::arange(2, 11, 3, Dtype::Float64), {3}, {2, 5, 8});
  check_values(ag::arange(4), {4}, {0, 1, 2, 3});
}

BOOST_AUTO_TEST_CASE(int64_arange_refuses_what_does_not_fit_clearly) {
  BOOST_TEST(error_of([] { ag::arange(kMin, kMax, std::int64_t{1}, Dtype::Int64); }) ==
             "arange: [-9223372036854775808, 9223372036854775807) in steps of 1 holds 18446744073709551615 values, "
             "more than a 64-bit count can hold");
  BOOST_TEST(error_of([] { ag::arange(std::int64_t{0}, kMax, std::int64_t{1}, Dtype::Int64); }) ==
             "arange: shape [9223372036854775807] of Int64 needs more bytes than a 64-bit count can hold");
  BOOST_TEST(error_of([] { ag::arange(std::int64_t{0}, std::int64_t{5}, std::int64_t{0}, Dtype::Int64); }) ==
             "arange: step must be nonzero, got 0");
  BOOST_TEST(error_of([] { ag::arange(std::uint64_t{1} << 63, std::uint64_t{1} << 63, std::uint64_t{1}, Dtype::Int64); }) ==
             "arange: start 9223372036854775808 is outside the Int64 range");
}

BOOST_AUTO_TEST_SUITE_END()
