// Indexing: index_select along any dim (with a list or a tensor of indices) and embedding
// lookup. Forward values against hand-computed numbers, gradients scattered back with
// repeated indices accumulating, float64 gradchecks, and the errors.
#define BOOST_TEST_MODULE indexing
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include <autograd/autograd.hpp>

#include "test_support.hpp"

using namespace test_support::prelude;

BOOST_AUTO_TEST_CASE(index_select_picks_rows_in_index_order) {
  Tensor x = iota({4, 3});
  check_values(ag::index_select(x, 0, std::vector<std::int64_t>{2, 0, 2}), {3, 3}, {6, 7, 8, 0, 1, 2, 6, 7, 8});
  check_values(ag::index_select(x, 1, std::vector<std::int64_t>{2, 1}), {4, 2}, {2, 1, 5, 4, 8, 7, 11, 10});
  check_values(ag::index_select(x, -1, std::vector<std::int64_t>{}), {4, 0}, {});
}

BOOST_AUTO_TEST_CASE(index_select_along_a_middle_dim) {
  Tensor x = iota({2, 3, 2});  // x[a, b, c] = 6a + 2b + c
  check_values(ag::index_select(x, 1, std::vector<std::int64_t>{1, 1, 0}), {2, 3, 2},
               {2, 3, 2, 3, 0, 1, 8, 9, 8, 9, 6, 7});
}

BOOST_AUTO_TEST_CASE(index_select_accepts_an_integral_tensor_index) {
  Tensor x = iota({4, 2});
  check_values(ag::index_select(x, 0, ag::tensor({3, 1}, {2})), {2, 2}, {6, 7, 2, 3});
  check_values(ag::index_select(x, 0, ag::tensor({2}, {1}, Dtype::Float64)), {1, 2}, {4, 5});  // 1-D index [2], float64
  check_values(ag::index_select(x, 0, ag::scalar_tensor(1.0)), {1, 2}, {2, 3});
}

BOOST_AUTO_TEST_CASE(index_select_gradient_accumulates_over_repeated_indices) {
  Tensor x = input({3, 2}, 1);
  Tensor w = f64({1, 2, 3, 4, 5, 6}, {3, 2});
  ag::sum(ag::index_select(x, 0, std::vector<std::int64_t>{0, 2, 0}) * w).backward();
  // rows 0 and 2 of w go to x's row 0, row 1 of w to x's row 2; x's row 1 gets nothing
  check_values(x.grad(), {3, 2}, {1 + 5, 2 + 6, 0, 0, 3, 4});
}

BOOST_AUTO_TEST_CASE(index_select_with_repeated_indices_passes_gradcheck) {
  Tensor x = input({3, 4, 2}, 2);
  check_gradients([](const TensorList& in) { return ag::index_select(in[0], 0, std::vector<std::int64_t>{2, 0, 2, 2}); }, {x});
  check_gradients([](const TensorList& in) { return ag::index_select(in[0], 1, std::vector<std::int64_t>{3, 3, 1, 0, 3}); }, {x});
  check_gradients([](const TensorList& in) { return ag::index_select(in[0], -1, ag::tensor({1, 1, 0}, {3})); }, {x});
}

BOOST_AUTO_TEST_CASE(index_select_errors_name_the_bad_index) {
  Tensor x = ag::zeros({4, 3});
  BOOST_TEST(error_of([&] { ag::index_select(x, 0, std::vector<std::int64_t>{1, 5}); }) ==
             "index_select: index 5 (at position 1) is out of range for dim 0 of size 4 (shape [4, 3])");
  BOOST_TEST(error_of([&] { ag::index_select(x, 1, std::vector<std::int64_t>{-1}); }) ==
             "index_select: index -1 (at position 0) is out of range for dim 1 of size 3 (shape [4, 3])");
  BOOST_TEST(error_of([&] { ag::index_select(x, 0, ag::tensor({0, 1.5}, {2})); }) ==
             "index_select: indices must hold integral values, got 1.5 at position 1 of index shape [2]");
  BOOST_TEST(error_of([&] { ag::index_select(x, 0, ag::zeros({2, 2})); }) ==
             "index_select: index must be 0-d or 1-D, got shape [2, 2]");
  BOOST_TEST(error_of([&] { ag::index_select(x, 2, std::vector<std::int64_t>{0}); }).find("index_select: dim 2 is out of range") == 0);
  BOOST_TEST(error_of([&] { ag::index_select(x, 0, Tensor()); }) == "index_select: the index is an undefined tensor (default-constructed: no value)");
}

BOOST_AUTO_TEST_CASE(embedding_appends_the_embedding_dim_to_the_index_shape) {
  Tensor weight = iota({5, 3});  // row v = 3v, 3v+1, 3v+2
  Tensor ids = ag::tensor({4, 0, 1, 4}, {2, 2});
  check_values(ag::embedding(weight, ids), {2, 2, 3}, {12, 13, 14, 0, 1, 2, 3, 4, 5, 12, 13, 14});
  check_values(ag::embedding(weight, ag::scalar_tensor(2.0)), {3}, {6, 7, 8});
}

BOOST_AUTO_TEST_CASE(embedding_gradient_adds_up_per_token) {
  Tensor weight = input({4, 2}, 3);
  Tensor ids = ag::tensor({1, 3, 1, 1}, {2, 2});
  ag::sum(ag::embedding(weight, ids)).backward();
  check_values(weight.grad(), {4, 2}, {0, 0, 3, 3, 0, 0, 1, 1});
  check_gradients([&](const TensorList& in) { return ag::embedding(in[0], ids); }, {weight});
}

BOOST_AUTO_TEST_CASE(embedding_errors_name_the_op_and_shapes) {
  Tensor weight = ag::zeros({5, 3});
  BOOST_TEST(error_of([&] { ag::embedding(weight, ag::tensor({0, 5}, {2})); }) ==
             "embedding: index 5 (at position 1) is out of range for dim 0 of size 5 (shape [5, 3])");
  BOOST_TEST(error_of([&] { ag::embedding(ag::zeros({5}), ag::tensor({0}, {1})); }) ==
             "embedding: weight must be 2-D (V, D), got shape [5]");
  BOOST_TEST(error_of([&] { ag::embedding(weight, ag::tensor({0.25}, {1})); }).find("embedding: indices must hold integral values") == 0);
}
