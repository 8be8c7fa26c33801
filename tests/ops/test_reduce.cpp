// Reductions (sum, mean, max, argmax): forward values against hand-computed numbers and a
// naive loop, float64 gradchecks (keepdim, negative and non-adjacent dims), float32 agreeing
// with float64, and the errors.
#define BOOST_TEST_MODULE reduce
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

// Naive reference: sum of a row-major tensor over the dims flagged in `reduce`, keepdim shape.
std::vector<double> naive_sum(const std::vector<double>& x, const Shape& shape, const std::vector<bool>& reduce) {
  Shape out_shape = shape;
  for (std::size_t d = 0; d < shape.size(); ++d)
    if (reduce[d]) out_shape[d] = 1;
  std::vector<double> out(static_cast<std::size_t>(ag::shape_numel(out_shape)), 0.0);
  Shape idx(shape.size(), 0);
  for (std::size_t flat = 0; flat < x.size(); ++flat) {
    std::int64_t o = 0;
    for (std::size_t d = 0; d < shape.size(); ++d) o = o * out_shape[d] + (reduce[d] ? 0 : idx[d]);
    out[static_cast<std::size_t>(o)] += x[flat];
    for (std::size_t d = shape.size(); d-- > 0;) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

const Tensor x23 = f64({1, 2, 3, 4, 5, 6}, {2, 3});

}  // namespace

// ---------------------------------------------------------------- sum, forward

BOOST_AUTO_TEST_CASE(sum_of_all_elements_is_a_scalar) { check_values(ag::sum(x23), {}, {21}); }

BOOST_AUTO_TEST_CASE(sum_along_dim0_adds_the_rows) { check_values(ag::sum(x23, 0), {3}, {5, 7, 9}); }

BOOST_AUTO_TEST_CASE(sum_along_dim1_keepdim_keeps_a_size1_dim) {
  check_values(ag::sum(x23, 1, /*keepdim=*/true), {2, 1}, {6, 15});
}

BOOST_AUTO_TEST_CASE(sum_negative_dim_counts_from_the_end) {
  check_values(ag::sum(x23, -1), {2}, {6, 15});
  check_values(ag::sum(x23, -2), {3}, {5, 7, 9});
}

BOOST_AUTO_TEST_CASE(sum_over_two_dims_of_three) {
  // x[i,j,k] = 12i + 4j + k; Σ_{i,k} = 2·4·4j + 4·12·(0+1) + 2·(0+1+2+3) = 32j + 60
  const Tensor x = ag::arange(24, Dtype::Float64);
  const Tensor x3 = ag::reshape(x, {2, 3, 4});
  check_values(ag::sum(x3, {0, 2}), {3}, {60, 92, 124});
  check_values(ag::sum(x3, {-1, 0}, true), {1, 3, 1}, {60, 92, 124});
}

BOOST_AUTO_TEST_CASE(sum_over_non_adjacent_dims_matches_a_naive_loop) {
  const Shape shape{2, 3, 4, 5};
  const Tensor x = input(shape, 1);
  for (const std::vector<std::int64_t>& dims :
       std::vector<std::vector<std::int64_t>>{{1, 3}, {0, 2}, {0, 3}, {0, 1, 3}, {2}, {0}}) {
    std::vector<bool> reduce(4, false);
    Shape keep_shape = shape;
    for (auto d : dims) {
      reduce[static_cast<std::size_t>(d)] = true;
      keep_shape[static_cast<std::size_t>(d)] = 1;
    }
    check_values(ag::sum(x, dims, true), keep_shape, naive_sum(x.to_vector(), shape, reduce));
  }
}

BOOST_AUTO_TEST_CASE(sum_over_size1_dims_and_the_rest) {
  // size-1 dims drop out of the walk; the result must not care
  const Tensor x = ag::reshape(ag::arange(6, Dtype::Float64), {1, 2, 1, 3});
  check_values(ag::sum(x, {0, 3}), {2, 1}, {3, 12});
  check_values(ag::sum(x, {2}), {1, 2, 3}, {0, 1, 2, 3, 4, 5});
}

BOOST_AUTO_TEST_CASE(sum_large_tensor_matches_a_naive_loop) {
  // big enough for the multi-threaded path
  const Shape shape{300, 7, 40};
  const Tensor x = input(shape, 2);
  check_values(ag::sum(x, {1}, true), {300, 1, 40}, naive_sum(x.to_vector(), shape, {false, true, false}), 1e-12);
  check_values(ag::sum(x, {2}, true), {300, 7, 1}, naive_sum(x.to_vector(), shape, {false, false, true}), 1e-12);
}

BOOST_AUTO_TEST_CASE(sum_with_empty_dim_list_reduces_everything) {
  check_values(ag::sum(x23, std::vector<std::int64_t>{}), {}, {21});
}

BOOST_AUTO_TEST_CASE(sum_of_a_scalar_tensor_along_dim0_is_itself) {
  check_values(ag::sum(ag::scalar_tensor(4.5, Dtype::Float64), 0), {}, {4.5});
}

BOOST_AUTO_TEST_CASE(sum_of_an_empty_dim_is_zero) {
  check_values(ag::sum(ag::zeros({2, 0}, Dtype::Float64), 1), {2}, {0, 0});
}

// ---------------------------------------------------------------- mean, forward

BOOST_AUTO_TEST_CASE(mean_of_all_elements) { check_values(ag::mean(x23), {}, {3.5}); }

BOOST_AUTO_TEST_CASE(mean_along_dims) {
  check_values(ag::mean(x23, 0), {3}, {2.5, 3.5, 4.5});
  check_values(ag::mean(x23, -1, true), {2, 1}, {2, 5});
  check_values(ag::mean(x23, {0, 1}), {}, {3.5});
}

BOOST_AUTO_TEST_CASE(mean_of_nothing_is_nan) {
  check_values_nonfinite(ag::mean(ag::zeros({0}, Dtype::Float64)), {}, {std::nan("")});
}

// ---------------------------------------------------------------- max / argmax, forward

BOOST_AUTO_TEST_CASE(max_of_all_elements) { check_values(ag::max(f64({3, -1, 7, 2}, {2, 2})), {}, {7}); }

BOOST_AUTO_TEST_CASE(max_along_a_dim) {
  const Tensor x = f64({1, 9, 3, 7, 2, 8}, {2, 3});
  check_values(ag::max(x, 1), {2}, {9, 8});
  check_values(ag::max(x, 0), {3}, {7, 9, 8});
  check_values(ag::max(x, -1, true), {2, 1}, {9, 8});
}

BOOST_AUTO_TEST_CASE(max_propagates_nan) {
  const double nan = std::nan("");
  check_values_nonfinite(ag::max(f64({1, nan, 3}, {3})), {}, {nan});
  check_values_nonfinite(ag::max(f64({1, nan, 3, 4, 5, 6}, {2, 3}), 1), {2}, {nan, 6});
}

BOOST_AUTO_TEST_CASE(argmax_returns_int64_indices) {
  const Tensor x = f64({1, 5, 5, 7, 2, 9}, {2, 3});
  const Tensor i1 = ag::argmax(x, 1);
  BOOST_TEST((i1.dtype() == Dtype::Int64));
  check_values(i1, {2}, {1, 2});  // the first of tied maxima
  check_values(ag::argmax(x, 0), {3}, {1, 0, 1});
  check_values(ag::argmax(x, 0, true), {1, 3}, {1, 0, 1});
  BOOST_TEST((ag::argmax(ag::tensor({0, 3, 1}, {3}), 0).dtype() == Dtype::Int64));
}

BOOST_AUTO_TEST_CASE(argmax_records_no_gradient) {
  Tensor x = f64({1, 5, 2}, {3}).requires_grad_();
  BOOST_TEST(!ag::argmax(x, 0).requires_grad());
}

// ---------------------------------------------------------------- gradients

BOOST_AUTO_TEST_CASE(sum_backward_broadcasts_the_gradient_back) {
  Tensor x = f64({1, 2, 3, 4, 5, 6}, {2, 3}).requires_grad_();
  ag::sum(x, 1).backward(f64({10, 20}, {2}));
  check_values(x.grad(), {2, 3}, {10, 10, 10, 20, 20, 20});
}

BOOST_AUTO_TEST_CASE(mean_backward_divides_by_the_count) {
  Tensor x = f64({1, 2, 3, 4, 5, 6}, {2, 3}).requires_grad_();
  ag::mean(x, 0).backward(f64({3, 6, 9}, {3}));
  check_values(x.grad(), {2, 3}, {1.5, 3, 4.5, 1.5, 3, 4.5});
}

BOOST_AUTO_TEST_CASE(max_gradient_is_split_among_tied_maxima) {
  Tensor x = f64({1, 3, 3, 2}, {4}).requires_grad_();
  ag::max(x).backward();
  check_values(x.grad(), {4}, {0, 0.5, 0.5, 0});
}

BOOST_AUTO_TEST_CASE(max_along_dim_sends_the_gradient_to_the_first_maximum) {
  Tensor x = f64({1, 5, 5, 7, 2, 7}, {2, 3}).requires_grad_();
  ag::max(x, 1).backward(f64({2, 3}, {2}));
  check_values(x.grad(), {2, 3}, {0, 2, 0, 3, 0, 0});
}

BOOST_AUTO_TEST_CASE(gradcheck_sum_all_and_along_dims) {
  check_gradients([](const TensorList& in) { return ag::sum(in[0]); }, {input({3, 4}, 10)});
  check_gradients([](const TensorList& in) { return ag::sum(in[0], 0); }, {input({3, 4}, 11)});
  check_gradients([](const TensorList& in) { return ag::sum(in[0], -1, true); }, {input({3, 4}, 12)});
  check_gradients([](const TensorList& in) { return ag::sum(in[0], {0, 2}); }, {input({2, 3, 4}, 13)});
  check_gradients([](const TensorList& in) { return ag::sum(in[0], {-3, -1}, true); }, {input({2, 3, 4}, 14)});
  check_gradients([](const TensorList& in) { return ag::sum(in[0], {1, 3}); }, {input({2, 3, 2, 3}, 15)});
}

BOOST_AUTO_TEST_CASE(gradcheck_mean_all_and_along_dims) {
  check_gradients([](const TensorList& in) { return ag::mean(in[0]); }, {input({3, 4}, 20)});
  check_gradients([](const TensorList& in) { return ag::mean(in[0], 1); }, {input({3, 4}, 21)});
  check_gradients([](const TensorList& in) { return ag::mean(in[0], {0, -1}, true); }, {input({2, 3, 4}, 22)});
}

BOOST_AUTO_TEST_CASE(gradcheck_max_all_and_along_dims) {
  // random normal inputs: ties have probability zero
  check_gradients([](const TensorList& in) { return ag::max(in[0]); }, {input({3, 4}, 30)});
  check_gradients([](const TensorList& in) { return ag::max(in[0], 0); }, {input({3, 4}, 31)});
  check_gradients([](const TensorList& in) { return ag::max(in[0], -1, true); }, {input({3, 4}, 32)});
  check_gradients([](const TensorList& in) { return ag::max(in[0], 1); }, {input({2, 3, 4}, 33)});
}

BOOST_AUTO_TEST_CASE(gradcheck_reductions_of_a_scalar_tensor) {
  check_gradients([](const TensorList& in) { return ag::sum(in[0], 0); }, {input({}, 40)});
  check_gradients([](const TensorList& in) { return ag::max(in[0], -1); }, {input({}, 41)});
  check_gradients([](const TensorList& in) { return ag::mean(in[0]); }, {input({}, 42)});
}

// ---------------------------------------------------------------- float32

BOOST_AUTO_TEST_CASE(float32_reductions_agree_with_float64) {
  const Tensor x64 = input({64, 33, 17}, 50).detach();
  const Tensor x32 = x64.to(Dtype::Float32);
  const auto agree = [](const Tensor& a32, const Tensor& a64) {
    BOOST_TEST((a32.dtype() == Dtype::Float32));
    const auto a = a32.to_vector(), b = a64.to_vector();
    BOOST_REQUIRE_EQUAL(a.size(), b.size());
    double worst = 0;
    for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]) / (1 + std::abs(b[i])));
    BOOST_TEST(worst < 1e-5, "worst relative difference " << worst);
  };
  agree(ag::sum(x32), ag::sum(x64));
  agree(ag::sum(x32, {0, 2}), ag::sum(x64, {0, 2}));
  agree(ag::mean(x32, 1, true), ag::mean(x64, 1, true));
  agree(ag::max(x32, 2), ag::max(x64, 2));
  agree(ag::max(x32), ag::max(x64));
  agree(ag::argmax(x32, 1).to(Dtype::Float32), ag::argmax(x64, 1));
}

// ---------------------------------------------------------------- errors

BOOST_AUTO_TEST_CASE(sum_rejects_a_dim_out_of_range) {
  BOOST_CHECK_THROW(ag::sum(x23, 2), std::invalid_argument);
  BOOST_TEST(error_of([] { ag::sum(x23, 2); }) == "sum: dim 2 is out of range for a tensor of rank 2");
  BOOST_TEST(error_of([] { ag::mean(x23, {0, -3}); }) == "mean: dim -3 is out of range for a tensor of rank 2");
}

BOOST_AUTO_TEST_CASE(sum_rejects_a_repeated_dim) {
  BOOST_TEST(error_of([] { ag::sum(x23, {1, -1}); }) == "sum: dim 1 appears more than once in [1, -1]");
}

BOOST_AUTO_TEST_CASE(max_rejects_an_empty_tensor_and_an_empty_dim) {
  BOOST_TEST(error_of([] { ag::max(ag::zeros({0, 3})); }) == "max: cannot take the max of an empty tensor of shape [0, 3]");
  BOOST_TEST(error_of([] { ag::max(ag::zeros({2, 0}), 1); }) == "max: cannot reduce dim 1 of size 0 (shape [2, 0])");
  BOOST_TEST(error_of([] { ag::argmax(ag::zeros({2, 3}), 3); }) == "argmax: dim 3 is out of range for a tensor of rank 2");
}

BOOST_AUTO_TEST_CASE(reductions_reject_an_undefined_tensor) {
  BOOST_TEST(error_of([] { ag::sum(Tensor()); }) == "sum: the input is an undefined tensor (default-constructed: no value)");
  BOOST_TEST(error_of([] { ag::max(Tensor(), 0); }) == "max: the input is an undefined tensor (default-constructed: no value)");
}

BOOST_AUTO_TEST_CASE(sum_to_names_itself_in_its_errors) {
  // A target that does not broadcast to the gradient's shape, same rank and lower rank.
  const Tensor g = ag::ones({2, 3});
  BOOST_TEST(error_of([&] { ag::sum_to(g, {4}); }) ==
             "sum_to: cannot reduce [2, 3] to [4]: target dim 0 has size 4, which is neither 1 nor 3");
  BOOST_TEST(error_of([&] { ag::sum_to(g, {2, 2}); }) ==
             "sum_to: cannot reduce [2, 3] to [2, 2]: target dim 1 has size 2, which is neither 1 nor 3");
  BOOST_TEST(error_of([&] { ag::sum_to(g, {3, 1}); }) ==
             "sum_to: cannot reduce [2, 3] to [3, 1]: target dim 0 has size 3, which is neither 1 nor 2");
  BOOST_TEST(error_of([&] { ag::sum_to(g, {1, 2, 3}); }) == "sum_to: cannot reduce [2, 3] to the larger rank of [1, 2, 3]");
  // What it accepts: leading dims summed away, size-1 dims summed, same shape passed through.
  check_values(ag::sum_to(ag::reshape(ag::arange(6.0, Dtype::Float64), {2, 3}), {1, 3}), {1, 3}, {3, 5, 7});
  check_values(ag::sum_to(ag::reshape(ag::arange(6.0, Dtype::Float64), {2, 3}), {3}), {3}, {3, 5, 7});
  check_values(ag::sum_to(ag::reshape(ag::arange(6.0, Dtype::Float64), {2, 3}), {2, 1}), {2, 1}, {3, 12});
}
