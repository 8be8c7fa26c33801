// matmul: torch.matmul's cases (dot, 2-D, vector promotion, broadcast batches) against
// hand-computed numbers and a naive triple loop, float64 gradchecks of each case, float32
// agreeing with float64, and the errors.
#define BOOST_TEST_MODULE matmul
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include <autograd/autograd.hpp>

#include "test_support.hpp"

using namespace test_support::prelude;

namespace {

// Gradcheck of matmul at a and b, named by their shapes.
void check_gradients(const Tensor& a, const Tensor& b) {
  test_support::check_gradients(fmt::format("{} x {}", ag::shape_str(a.shape()), ag::shape_str(b.shape())),
                                [](const TensorList& in) { return ag::matmul(in[0], in[1]); }, {a, b});
}

// Naive reference for a [...a, M, K]·[...b, K, N] product (both at least 2-D): broadcast the
// batch dims by hand and run the triple loop. Returns the values; the shape is checked apart.
std::vector<double> naive_matmul(const Tensor& a, const Tensor& b) {
  const Shape& sa = a.shape();
  const Shape& sb = b.shape();
  const std::int64_t m = sa[sa.size() - 2], k = sa.back(), n = sb.back();
  const Shape ba(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - 2);
  const std::size_t rank = std::max(ba.size(), bb.size());
  auto padded = [&](const Shape& s) {
    Shape p(rank - s.size(), 1);
    p.insert(p.end(), s.begin(), s.end());
    return p;
  };
  const Shape pa = padded(ba), pb = padded(bb);
  Shape batch(rank);
  for (std::size_t d = 0; d < rank; ++d) batch[d] = std::max(pa[d], pb[d]);
  const auto av = a.to_vector(), bv = b.to_vector();
  std::vector<double> out;
  Shape idx(rank, 0);
  for (std::int64_t t = 0; t < ag::shape_numel(batch); ++t) {
    std::int64_t ia = 0, ib = 0;
    for (std::size_t d = 0; d < rank; ++d) {
      ia = ia * pa[d] + (pa[d] == 1 ? 0 : idx[d]);
      ib = ib * pb[d] + (pb[d] == 1 ? 0 : idx[d]);
    }
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (std::int64_t r = 0; r < k; ++r)
          s += av[static_cast<std::size_t>(ia * m * k + i * k + r)] * bv[static_cast<std::size_t>(ib * k * n + r * n + j)];
        out.push_back(s);
      }
    for (std::size_t d = rank; d-- > 0;) {
      if (++idx[d] < batch[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

const Tensor a23 = f64({1, 2, 3, 4, 5, 6}, {2, 3});
const Tensor b32 = f64({7, 8, 9, 10, 11, 12}, {3, 2});

}  // namespace

// ---------------------------------------------------------------- forward values

BOOST_AUTO_TEST_CASE(matrix_times_matrix) {
  // [1 2 3; 4 5 6]·[7 8; 9 10; 11 12] = [58 64; 139 154]
  check_values(ag::matmul(a23, b32), {2, 2}, {58, 64, 139, 154});
}

BOOST_AUTO_TEST_CASE(vector_dot_vector_is_a_scalar) {
  check_values(ag::matmul(f64({1, 2, 3}, {3}), f64({4, 5, 6}, {3})), {}, {32});
}

BOOST_AUTO_TEST_CASE(vector_times_matrix_drops_the_promoted_dim) {
  // [1 2]·[1 2 3; 4 5 6] = [9 12 15]
  check_values(ag::matmul(f64({1, 2}, {2}), a23), {3}, {9, 12, 15});
}

BOOST_AUTO_TEST_CASE(matrix_times_vector_drops_the_promoted_dim) {
  check_values(ag::matmul(a23, f64({1, 0, -1}, {3})), {2}, {-2, -2});
}

BOOST_AUTO_TEST_CASE(batched_times_batched_same_batch) {
  const Tensor a = input({3, 2, 4}, 1), b = input({3, 4, 5}, 2);
  check_values(ag::matmul(a, b), {3, 2, 5}, naive_matmul(a, b));
}

BOOST_AUTO_TEST_CASE(batch_dims_broadcast_like_numpy) {
  const Tensor a = input({2, 1, 3, 4}, 3), b = input({5, 4, 6}, 4);
  check_values(ag::matmul(a, b), {2, 5, 3, 6}, naive_matmul(a, b));
}

BOOST_AUTO_TEST_CASE(batched_times_matrix_folds_the_batch) {
  const Tensor a = input({2, 3, 4}, 5), b = input({4, 5}, 6);
  check_values(ag::matmul(a, b), {2, 3, 5}, naive_matmul(a, b));
}

BOOST_AUTO_TEST_CASE(matrix_times_batched_broadcasts_the_matrix) {
  const Tensor a = input({3, 4}, 7), b = input({2, 4, 5}, 8);
  check_values(ag::matmul(a, b), {2, 3, 5}, naive_matmul(a, b));
}

BOOST_AUTO_TEST_CASE(vector_with_batched_operands) {
  const Tensor v = f64({1, -1, 2, 0.5}, {4});
  const Tensor b = input({2, 4, 5}, 9), a = input({2, 3, 4}, 10);
  check_values(ag::matmul(v, b), {2, 5}, naive_matmul(ag::reshape(v, {1, 4}), b));
  check_values(ag::matmul(a, v), {2, 3}, naive_matmul(a, ag::reshape(v, {4, 1})));
}

BOOST_AUTO_TEST_CASE(large_batched_product_matches_a_naive_loop) {
  // big enough for the batch slices to run on several threads
  const Tensor a = input({6, 20, 30}, 11), b = input({6, 30, 40}, 12);
  check_values(ag::matmul(a, b), {6, 20, 40}, naive_matmul(a, b), 1e-12);
}

BOOST_AUTO_TEST_CASE(empty_inner_dim_gives_zeros) {
  check_values(ag::matmul(ag::zeros({2, 0}, Dtype::Float64), ag::zeros({0, 3}, Dtype::Float64)), {2, 3},
               {0, 0, 0, 0, 0, 0});
}

// ---------------------------------------------------------------- gradients

BOOST_AUTO_TEST_CASE(backward_of_a_matrix_product_by_hand) {
  // C = A·B, L = Σ C  =>  dA = 1·Bᵀ (row sums of B per column of A), dB = Aᵀ·1
  Tensor a = a23.clone().detach().requires_grad_(), b = b32.clone().detach().requires_grad_();
  ag::matmul(a, b).backward(ag::ones({2, 2}, Dtype::Float64));
  check_values(a.grad(), {2, 3}, {15, 19, 23, 15, 19, 23});
  check_values(b.grad(), {3, 2}, {5, 5, 7, 7, 9, 9});
}

BOOST_AUTO_TEST_CASE(gradcheck_matrix_and_vector_cases) {
  check_gradients(input({3, 4}, 20), input({4, 2}, 21));
  check_gradients(input({5}, 22), input({5}, 23));
  check_gradients(input({4}, 24), input({4, 3}, 25));
  check_gradients(input({3, 4}, 26), input({4}, 27));
}

BOOST_AUTO_TEST_CASE(gradcheck_batched_cases) {
  check_gradients(input({2, 3, 4}, 30), input({2, 4, 2}, 31));
  check_gradients(input({2, 3, 4}, 32), input({4, 2}, 33));     // folded
  check_gradients(input({3, 4}, 34), input({2, 4, 2}, 35));     // A broadcast: dA summed
  check_gradients(input({2, 1, 3, 4}, 36), input({5, 4, 2}, 37));  // both broadcast
  check_gradients(input({4}, 38), input({2, 4, 3}, 39));
  check_gradients(input({2, 3, 4}, 40), input({4}, 41));
}

BOOST_AUTO_TEST_CASE(gradcheck_large_batched_product) {
  check_gradients(input({4, 10, 30}, 42), input({4, 30, 60}, 43));
}

BOOST_AUTO_TEST_CASE(gradient_only_for_the_input_that_requires_it) {
  Tensor a = input({2, 3}, 50);
  const Tensor b = input({3, 2}, 51).detach();
  ag::matmul(a, b).backward(ag::ones({2, 2}, Dtype::Float64));
  BOOST_TEST(a.grad().defined());
  BOOST_TEST(!b.grad().defined());
}

// ---------------------------------------------------------------- float32

BOOST_AUTO_TEST_CASE(float32_agrees_with_float64) {
  const Tensor a = input({3, 2, 17, 33}, 60).detach(), b = input({2, 33, 9}, 61).detach();
  const auto c64 = ag::matmul(a, b).to_vector();
  const Tensor c32 = ag::matmul(a.to(Dtype::Float32), b.to(Dtype::Float32));
  BOOST_TEST((c32.dtype() == Dtype::Float32));
  const auto c = c32.to_vector();
  double worst = 0;
  for (std::size_t i = 0; i < c.size(); ++i) worst = std::max(worst, std::abs(c[i] - c64[i]) / (1 + std::abs(c64[i])));
  BOOST_TEST(worst < 1e-5, "worst relative difference " << worst);
}

// ---------------------------------------------------------------- errors

BOOST_AUTO_TEST_CASE(inner_dimensions_must_agree) {
  BOOST_CHECK_THROW(ag::matmul(ag::zeros({2, 3}), ag::zeros({4, 5})), std::invalid_argument);
  BOOST_TEST(error_of([] { ag::matmul(ag::zeros({2, 3}), ag::zeros({4, 5})); }) ==
             "matmul: inner dimensions differ: [2, 3] x [4, 5]");
  BOOST_TEST(error_of([] { ag::matmul(ag::zeros({3}), ag::zeros({4})); }) == "matmul: inner dimensions differ: [3] x [4]");
  BOOST_TEST(error_of([] { ag::matmul(ag::zeros({2, 2, 3}), ag::zeros({2})); }) ==
             "matmul: inner dimensions differ: [2, 2, 3] x [2]");
}

BOOST_AUTO_TEST_CASE(batch_dimensions_must_broadcast) {
  BOOST_TEST(error_of([] { ag::matmul(ag::zeros({2, 3, 4}), ag::zeros({3, 4, 5})); }) ==
             "matmul: batch dimensions cannot be broadcast: [2, 3, 4] x [3, 4, 5]");
}

BOOST_AUTO_TEST_CASE(scalars_are_rejected) {
  BOOST_TEST(error_of([] { ag::matmul(ag::scalar_tensor(1), ag::zeros({2})); }) ==
             "matmul: both arguments need at least one dimension, got [] x [2]");
}

BOOST_AUTO_TEST_CASE(dtypes_must_match) {
  BOOST_TEST(error_of([] { ag::matmul(ag::zeros({2, 2}), ag::zeros({2, 2}, Dtype::Float64)); }) ==
             "matmul: dtypes differ: Float32 and Float64");
}

BOOST_AUTO_TEST_CASE(undefined_arguments_are_rejected) {
  BOOST_TEST(error_of([] { ag::matmul(Tensor(), ag::zeros({2, 2})); }) == "matmul: the first argument is an undefined tensor (default-constructed: no value)");
}
