// Shape ops: forward values against hand-computed numbers (or the index formula that defines
// the op), float64 gradchecks of every op, float32 agreeing with float64, and the errors.
#define BOOST_TEST_MODULE shape
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include <autograd/autograd.hpp>

#include "test_support.hpp"

using namespace test_support::prelude;

namespace {

// Row-major flat index of idx in shape.
std::int64_t flat(const Shape& shape, const Shape& idx) {
  std::int64_t f = 0;
  for (std::size_t i = 0; i < shape.size(); ++i) f = f * shape[i] + idx[i];
  return f;
}

}  // namespace

// ---- reshape, flatten, squeeze, unsqueeze ----

BOOST_AUTO_TEST_CASE(reshape_infers_minus_one_and_keeps_row_major_order) {
  Tensor x = f64({1, 2, 3, 4, 5, 6}, {2, 3});
  check_values(ag::reshape(x, {3, -1}), {3, 2}, {1, 2, 3, 4, 5, 6});
  check_values(ag::reshape(x, {-1}), {6}, {1, 2, 3, 4, 5, 6});
  check_values(ag::reshape(x, {1, 6, 1}), {1, 6, 1}, {1, 2, 3, 4, 5, 6});
  check_values(ag::reshape(f64({7}, {1, 1}), {}), {}, {7});
}

BOOST_AUTO_TEST_CASE(reshape_shares_storage_with_its_input) {
  Tensor x = f64({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor y = ag::reshape(x, {6});
  BOOST_TEST(y.raw_data() == x.raw_data());
  y.data<double>()[4] = 50.0;
  BOOST_TEST(x.to_vector()[4] == 50.0);
  BOOST_TEST(ag::shape_str(x.shape()) == "[2, 3]");  // the input keeps its own shape
}

BOOST_AUTO_TEST_CASE(reshape_backward_reshapes_the_gradient_back) {
  Tensor x = input({2, 3}, 1);
  Tensor w = f64({1, 2, 3, 4, 5, 6}, {3, 2});
  ag::sum(ag::reshape(x, {3, 2}) * w).backward();
  check_values(x.grad(), {2, 3}, {1, 2, 3, 4, 5, 6});
}

BOOST_AUTO_TEST_CASE(reshape_flatten_squeeze_unsqueeze_pass_gradcheck) {
  Tensor x = input({2, 1, 3, 2}, 2);
  Tensor w = ag::randn({12}, Dtype::Float64);
  check_gradients([](const TensorList& in) { return ag::reshape(in[0], {3, -1}); }, {x});
  check_gradients([&](const TensorList& in) { return ag::sum(ag::flatten(in[0]) * w); }, {x});
  check_gradients([](const TensorList& in) { return ag::flatten(in[0], 1, 2); }, {x});
  check_gradients([](const TensorList& in) { return ag::squeeze(in[0]); }, {x});
  check_gradients([](const TensorList& in) { return ag::squeeze(in[0], 1); }, {x});
  check_gradients([](const TensorList& in) { return ag::unsqueeze(in[0], -1); }, {x});
}

BOOST_AUTO_TEST_CASE(reshape_error_names_both_shapes_and_the_element_count) {
  Tensor x = ag::zeros({2, 3});
  BOOST_TEST(error_of([&] { ag::reshape(x, {4, 2}); }) == "reshape: cannot reshape [2, 3] (6 elements) into [4, 2]");
  BOOST_TEST(error_of([&] { ag::reshape(x, {4, -1}); }) == "reshape: cannot reshape [2, 3] (6 elements) into [4, -1]");
  BOOST_TEST(error_of([&] { ag::reshape(x, {-1, -1}); }).find("only one dimension can be -1") != std::string::npos);
  BOOST_TEST(error_of([&] { ag::reshape(x, {-2, -3}); }).find("reshape: invalid size -2") == 0);
  BOOST_CHECK_THROW(ag::reshape(Tensor(), {1}), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(flatten_merges_the_dims_between_start_and_end) {
  Tensor x = iota({2, 3, 4});
  BOOST_TEST(ag::shape_str(ag::flatten(x).shape()) == "[24]");
  BOOST_TEST(ag::shape_str(ag::flatten(x, 1).shape()) == "[2, 12]");
  BOOST_TEST(ag::shape_str(ag::flatten(x, 0, 1).shape()) == "[6, 4]");
  BOOST_TEST(ag::shape_str(ag::flatten(ag::scalar_tensor(3.0)).shape()) == "[1]");
  BOOST_TEST(error_of([&] { ag::flatten(x, 2, 1); }).find("flatten: start_dim 2 comes after end_dim 1") == 0);
  BOOST_TEST(error_of([&] { ag::flatten(x, 3); }).find("flatten: dim 3 is out of range") == 0);
}

BOOST_AUTO_TEST_CASE(squeeze_drops_size_one_dims_and_unsqueeze_adds_them) {
  Tensor x = iota({1, 3, 1, 2});
  BOOST_TEST(ag::shape_str(ag::squeeze(x).shape()) == "[3, 2]");
  BOOST_TEST(ag::shape_str(ag::squeeze(x, 2).shape()) == "[1, 3, 2]");
  BOOST_TEST(ag::shape_str(ag::squeeze(x, 1).shape()) == "[1, 3, 1, 2]");  // size 3 stays, as in PyTorch
  BOOST_TEST(ag::shape_str(ag::squeeze(x, -4).shape()) == "[3, 1, 2]");
  BOOST_TEST(ag::shape_str(ag::unsqueeze(x, 0).shape()) == "[1, 1, 3, 1, 2]");
  BOOST_TEST(ag::shape_str(ag::unsqueeze(x, 4).shape()) == "[1, 3, 1, 2, 1]");
  BOOST_TEST(ag::shape_str(ag::unsqueeze(x, -1).shape()) == "[1, 3, 1, 2, 1]");
  BOOST_TEST(ag::shape_str(ag::unsqueeze(ag::scalar_tensor(1.0), 0).shape()) == "[1]");
  check_values(ag::squeeze(x), {3, 2}, {0, 1, 2, 3, 4, 5});
  BOOST_TEST(error_of([&] { ag::squeeze(x, 4); }).find("squeeze: dim 4 is out of range for a tensor of rank 4") == 0);
  BOOST_TEST(error_of([&] { ag::unsqueeze(x, 5); }).find("unsqueeze: dim 5 is out of range") == 0);
}

// ---- transpose, permute ----

BOOST_AUTO_TEST_CASE(transpose_of_a_matrix_swaps_rows_and_columns) {
  check_values(ag::transpose(f64({1, 2, 3, 4, 5, 6}, {2, 3}), 0, 1), {3, 2}, {1, 4, 2, 5, 3, 6});
  check_values(ag::transpose(f64({1, 2, 3, 4, 5, 6}, {2, 3}), -1, -2), {3, 2}, {1, 4, 2, 5, 3, 6});
}

BOOST_AUTO_TEST_CASE(transpose_of_large_and_batched_matrices_matches_the_index_formula) {
  // Sizes not multiples of the 32-element tile, so the edge tiles are exercised.
  for (const Shape& s : {Shape{70, 45}, Shape{3, 40, 33}, Shape{2, 3, 37, 5}}) {
    Tensor x = iota(s);
    const std::size_t r = s.size();
    Tensor y = ag::transpose(x, -1, -2);
    Shape ys = s;
    std::swap(ys[r - 1], ys[r - 2]);
    BOOST_REQUIRE(ys == y.shape());
    const auto v = y.to_vector();
    bool all_match = true;
    Shape idx(r, 0);
    for (std::int64_t f = 0; f < y.numel(); ++f) {
      Shape xi = idx;
      std::swap(xi[r - 1], xi[r - 2]);
      all_match = all_match && v[static_cast<std::size_t>(f)] == static_cast<double>(flat(s, xi));
      for (std::int64_t d = static_cast<std::int64_t>(r) - 1; d >= 0 && ++idx[d] == ys[d]; --d) idx[d] = 0;
    }
    BOOST_TEST(all_match, "transpose of " << ag::shape_str(s));
  }
}

BOOST_AUTO_TEST_CASE(permute_of_rank_four_matches_the_index_formula) {
  const Shape s{2, 3, 4, 5};
  const std::vector<std::int64_t> perm{2, 0, 3, 1};
  Tensor y = ag::permute(iota(s), perm);
  BOOST_TEST(ag::shape_str(y.shape()) == "[4, 2, 5, 3]");
  const auto v = y.to_vector();
  int mismatches = 0;
  for (std::int64_t a = 0; a < 4; ++a)
    for (std::int64_t b = 0; b < 2; ++b)
      for (std::int64_t c = 0; c < 5; ++c)
        for (std::int64_t d = 0; d < 3; ++d)  // y[a, b, c, d] = x[b, d, a, c]
          if (v[static_cast<std::size_t>(flat({4, 2, 5, 3}, {a, b, c, d}))] != static_cast<double>(flat(s, {b, d, a, c})))
            ++mismatches;
  BOOST_TEST(mismatches == 0);
  // A permute that keeps the last dim in place moves whole rows; a small hand-checked case.
  check_values(ag::permute(iota({2, 2, 2}), {1, 0, 2}), {2, 2, 2}, {0, 1, 4, 5, 2, 3, 6, 7});
}

BOOST_AUTO_TEST_CASE(permute_and_transpose_pass_gradcheck) {
  Tensor x = input({2, 3, 4, 2}, 3);
  check_gradients([](const TensorList& in) { return ag::permute(in[0], {2, 0, 3, 1}); }, {x});
  check_gradients([](const TensorList& in) { return ag::permute(in[0], {3, 2, 1, 0}); }, {x});
  check_gradients([](const TensorList& in) { return ag::transpose(in[0], 1, 2); }, {x});
  check_gradients([](const TensorList& in) { return ag::transpose(in[0], -1, -2); }, {x});
  Tensor m = input({4, 3}, 4);
  check_gradients([](const TensorList& in) { return ag::transpose(in[0], 0, 1); }, {m});
}

BOOST_AUTO_TEST_CASE(permute_float32_agrees_with_float64) {
  ag::Generator gen(5);
  Tensor x64 = ag::randn({3, 4, 5, 6}, Dtype::Float64, gen);
  Tensor x32 = x64.to(Dtype::Float32);
  const auto a = ag::permute(x64, {1, 3, 0, 2}).to_vector();
  const auto b = ag::permute(x32, {1, 3, 0, 2}).to_vector();
  BOOST_REQUIRE_EQUAL(a.size(), b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  BOOST_TEST(worst <= 1e-6);
}

BOOST_AUTO_TEST_CASE(permute_and_transpose_errors_name_the_dims) {
  Tensor x = ag::zeros({2, 3, 4});
  BOOST_TEST(error_of([&] { ag::permute(x, {0, 1}); }) == "permute: got 2 dims [0, 1] for a tensor of rank 3 (shape [2, 3, 4])");
  BOOST_TEST(error_of([&] { ag::permute(x, {0, 1, -3}); }) == "permute: dim -3 repeats in [0, 1, -3]");
  BOOST_TEST(error_of([&] { ag::permute(x, {0, 1, 3}); }).find("permute: dim 3 is out of range") == 0);
  BOOST_TEST(error_of([&] { ag::transpose(x, 0, 3); }).find("transpose: dim 3 is out of range") == 0);
}

// ---- expand ----

BOOST_AUTO_TEST_CASE(expand_repeats_size_one_dims_and_adds_leading_ones) {
  check_values(ag::expand(f64({1, 2, 3}, {3, 1}), {2, 3, 2}), {2, 3, 2}, {1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3});
  check_values(ag::expand(f64({1, 2}, {1, 2}), {3, -1}), {3, 2}, {1, 2, 1, 2, 1, 2});
  check_values(ag::expand(f64({5}, {}), {2, 2}), {2, 2}, {5, 5, 5, 5});
}

BOOST_AUTO_TEST_CASE(expand_backward_sums_over_the_broadcast_dims) {
  Tensor x = input({3, 1}, 6);
  Tensor w = f64({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {2, 3, 2});
  ag::sum(ag::expand(x, {2, 3, 2}) * w).backward();
  // dx[i] = sum over a, c of w[a, i, c]
  check_values(x.grad(), {3, 1}, {1 + 2 + 7 + 8, 3 + 4 + 9 + 10, 5 + 6 + 11 + 12});
  check_gradients([](const TensorList& in) { return ag::expand(in[0], {2, 3, 4}); }, {x});
  check_gradients([](const TensorList& in) { return ag::expand(in[0], {3, 3}); }, {input({1, 3}, 7)});
}

BOOST_AUTO_TEST_CASE(expand_errors_name_both_shapes) {
  Tensor x = ag::zeros({3, 2});
  BOOST_TEST(error_of([&] { ag::expand(x, {3, 4}); }) ==
             "expand: cannot expand [3, 2] to [3, 4]: dim 1 has size 2 (only size-1 dims can grow)");
  BOOST_TEST(error_of([&] { ag::expand(x, {2}); }).find("expand: cannot expand [3, 2] to [2]") == 0);
  BOOST_TEST(error_of([&] { ag::expand(x, {-1, 3, 2}); }).find("expand: cannot expand [3, 2] to [-1, 3, 2]") == 0);
}

// ---- clone ----

BOOST_AUTO_TEST_CASE(clone_copies_values_shape_and_dtype_into_new_storage) {
  Tensor x = f64({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor y = ag::clone(x);
  check_values(y, {2, 3}, {1, 2, 3, 4, 5, 6});
  BOOST_TEST((y.dtype() == Dtype::Float64));
  BOOST_TEST(y.raw_data() != x.raw_data());
  y.data<double>()[4] = 50.0;  // a write into either leaves the other as it was
  BOOST_TEST(x.to_vector()[4] == 5.0);
  x.fill_(-1.0);
  check_values(y, {2, 3}, {1, 2, 3, 4, 50, 6});
  check_values(ag::clone(ag::tensor({1.5, -2.0}, {2}, Dtype::Float32)), {2}, {1.5, -2.0});
  BOOST_TEST((ag::clone(ag::tensor({1.5, -2.0}, {2}, Dtype::Float32)).dtype() == Dtype::Float32));
  check_values(ag::clone(ag::tensor({7, -3}, {2}, Dtype::Int64)), {2}, {7, -3});
  BOOST_TEST(!ag::clone(x).requires_grad());  // a clone of a tensor outside the graph stays outside
}

BOOST_AUTO_TEST_CASE(clone_passes_the_gradient_through_unchanged) {
  Tensor x = input({2, 3}, 8);
  Tensor w = f64({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor y = ag::clone(x);
  BOOST_TEST(y.requires_grad());
  BOOST_TEST(!y.is_leaf());
  BOOST_TEST(y.grad_fn()->name() == "clone");
  ag::sum(y * w).backward();
  check_values(x.grad(), {2, 3}, {1, 2, 3, 4, 5, 6});
  check_gradients([](const TensorList& in) { return ag::clone(in[0]); }, {x});
  // Differentiable again: d/dz sum(z·z·z) = 3z², and d/dz sum(3z²) = 6z.
  Tensor z = input({3}, 9);
  ag::sum(ag::clone(z) * ag::clone(z) * z).backward({.create_graph = true});
  const std::vector<double> zv = z.to_vector();
  check_values(z.grad(), {3}, {3 * zv[0] * zv[0], 3 * zv[1] * zv[1], 3 * zv[2] * zv[2]});
  const TensorList g2 = ag::grad({ag::sum(z.grad())}, {z});
  check_values(g2[0], {3}, {6 * zv[0], 6 * zv[1], 6 * zv[2]});
}

// ---- narrow, slice ----

BOOST_AUTO_TEST_CASE(narrow_takes_length_elements_from_start) {
  Tensor x = iota({3, 4});
  check_values(ag::narrow(x, 1, 1, 2), {3, 2}, {1, 2, 5, 6, 9, 10});
  check_values(ag::narrow(x, 0, -1, 1), {1, 4}, {8, 9, 10, 11});
  BOOST_TEST(ag::shape_str(ag::narrow(x, 0, 3, 0).shape()) == "[0, 4]");
  check_gradients([](const TensorList& in) { return ag::narrow(in[0], 1, 1, 2); }, {input({3, 4}, 8)});
  BOOST_TEST(error_of([&] { ag::narrow(x, 1, 3, 2); }) ==
             "narrow: start 3 + length 2 exceeds dim 1 of size 4 (shape [3, 4])");
  BOOST_TEST(error_of([&] { ag::narrow(x, 1, 5, 0); }).find("narrow: start 5 is out of range") == 0);
}

BOOST_AUTO_TEST_CASE(slice_follows_python_rules_for_negative_and_out_of_range_bounds) {
  Tensor x = iota({10});
  check_values(ag::slice(x, 0, 1, 8, 3), {3}, {1, 4, 7});
  check_values(ag::slice(x, 0, -3, 100), {3}, {7, 8, 9});
  check_values(ag::slice(x, 0, -100, 2), {2}, {0, 1});
  check_values(ag::slice(x, 0, 0, -7, 2), {2}, {0, 2});
  check_values(ag::slice(x, 0, 2, 10, 4), {2}, {2, 6});
  BOOST_TEST(ag::slice(x, 0, 5, 2).numel() == 0);
  BOOST_TEST(ag::slice(x, 0, 12, 20).numel() == 0);
  check_values(ag::slice(iota({2, 5}), 1, 1, 5, 2), {2, 2}, {1, 3, 6, 8});
  BOOST_TEST(error_of([&] { ag::slice(x, 0, 0, 5, 0); }) == "slice: step must be at least 1, got 0");
}

BOOST_AUTO_TEST_CASE(slice_backward_writes_the_gradient_at_the_taken_positions) {
  Tensor x = input({7}, 9);
  ag::sum(ag::slice(x, 0, 1, 7, 2) * f64({1, 2, 3}, {3})).backward();
  check_values(x.grad(), {7}, {0, 1, 0, 2, 0, 3, 0});
  check_gradients([](const TensorList& in) { return ag::slice(in[0], 1, -4, 5, 2); }, {input({2, 5, 3}, 10)});
  check_gradients([](const TensorList& in) { return ag::slice(in[0], 2, 0, 3); }, {input({2, 5, 3}, 11)});
}

// ---- cat, stack ----

BOOST_AUTO_TEST_CASE(cat_joins_along_a_middle_dim) {
  Tensor a = iota({2, 1, 2});                       // [[[0,1]], [[2,3]]]
  Tensor b = ag::add(iota({2, 2, 2}), 10.0);        // 10..17
  check_values(ag::cat({a, b}, 1), {2, 3, 2}, {0, 1, 10, 11, 12, 13, 2, 3, 14, 15, 16, 17});
  check_values(ag::cat({a, a}, 0), {4, 1, 2}, {0, 1, 2, 3, 0, 1, 2, 3});
  check_values(ag::cat({a, a}, -1), {2, 1, 4}, {0, 1, 0, 1, 2, 3, 2, 3});
  check_values(ag::cat({a}, 1), {2, 1, 2}, {0, 1, 2, 3});
}

BOOST_AUTO_TEST_CASE(cat_passes_gradcheck_along_a_middle_dim) {
  Tensor a = input({2, 1, 3}, 12), b = input({2, 3, 3}, 13), c = input({2, 2, 3}, 14);
  check_gradients([](const TensorList& in) { return ag::cat(in, 1); }, {a, b, c});
  // One input without requires_grad: the others still get theirs.
  Tensor fixed = ag::randn({2, 2, 3}, Dtype::Float64);
  check_gradients([&](const TensorList& in) { return ag::cat({in[0], fixed, in[1]}, 1); }, {a, c});
}

BOOST_AUTO_TEST_CASE(cat_errors_name_the_shapes) {
  Tensor a = ag::zeros({2, 3}), b = ag::zeros({3, 3});
  BOOST_TEST(error_of([&] { ag::cat({a, b}, 1); }) == "cat: shapes [2, 3], [3, 3] differ outside dim 1 (tensor 1 has shape [3, 3])");
  BOOST_TEST(error_of([&] { ag::cat({a, ag::zeros({2, 3, 1})}, 0); }).find("cat: shapes [2, 3], [2, 3, 1] differ") == 0);
  BOOST_TEST(error_of([&] { ag::cat({}, 0); }) == "cat: needs at least one tensor");
  BOOST_TEST(error_of([&] { ag::cat({a, ag::zeros({2, 3}, Dtype::Float64)}, 0); }) ==
             "cat: dtypes differ: Float32 (tensor 0) and Float64 (tensor 1)");
  BOOST_TEST(error_of([&] { ag::cat({a, b}, 2); }).find("cat: dim 2 is out of range") == 0);
}

BOOST_AUTO_TEST_CASE(stack_adds_a_new_dim) {
  Tensor a = f64({1, 2, 3, 4}, {2, 2}), b = f64({5, 6, 7, 8}, {2, 2});
  check_values(ag::stack({a, b}, 0), {2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  check_values(ag::stack({a, b}, 1), {2, 2, 2}, {1, 2, 5, 6, 3, 4, 7, 8});
  check_values(ag::stack({a, b}, -1), {2, 2, 2}, {1, 5, 2, 6, 3, 7, 4, 8});
}

BOOST_AUTO_TEST_CASE(stack_passes_gradcheck_along_a_middle_dim) {
  Tensor a = input({2, 3, 2}, 15), b = input({2, 3, 2}, 16), c = input({2, 3, 2}, 17);
  check_gradients([](const TensorList& in) { return ag::stack(in, 1); }, {a, b, c});
  check_gradients([](const TensorList& in) { return ag::stack(in, 2); }, {a, b, c});
}

BOOST_AUTO_TEST_CASE(stack_errors_name_the_shapes) {
  BOOST_TEST(error_of([&] { ag::stack({ag::zeros({2}), ag::zeros({3})}, 0); }) ==
             "stack: all tensors need the same shape, got [2], [3]");
  BOOST_TEST(error_of([&] { ag::stack({ag::zeros({2})}, 2); }).find("stack: dim 2 is out of range") == 0);
}

// ---- split, chunk ----

BOOST_AUTO_TEST_CASE(split_by_size_leaves_a_smaller_last_piece) {
  const TensorList pieces = ag::split(iota({5, 2}), 2, 0);
  BOOST_REQUIRE_EQUAL(pieces.size(), 3u);
  check_values(pieces[0], {2, 2}, {0, 1, 2, 3});
  check_values(pieces[1], {2, 2}, {4, 5, 6, 7});
  check_values(pieces[2], {1, 2}, {8, 9});
}

BOOST_AUTO_TEST_CASE(split_by_sizes_follows_the_list) {
  const TensorList pieces = ag::split(iota({2, 5}), std::vector<std::int64_t>{1, 0, 4}, 1);
  BOOST_REQUIRE_EQUAL(pieces.size(), 3u);
  check_values(pieces[0], {2, 1}, {0, 5});
  BOOST_TEST(ag::shape_str(pieces[1].shape()) == "[2, 0]");
  check_values(pieces[2], {2, 4}, {1, 2, 3, 4, 6, 7, 8, 9});
}

BOOST_AUTO_TEST_CASE(chunk_matches_torch_chunk_piece_sizes) {
  auto sizes = [](std::int64_t n, std::int64_t chunks) {
    std::vector<std::int64_t> out;
    for (const auto& p : ag::chunk(ag::zeros({n}), chunks)) out.push_back(p.shape()[0]);
    return out;
  };
  BOOST_TEST(sizes(5, 3) == (std::vector<std::int64_t>{2, 2, 1}), boost::test_tools::per_element());
  BOOST_TEST(sizes(6, 4) == (std::vector<std::int64_t>{2, 2, 2}), boost::test_tools::per_element());  // fewer than asked
  BOOST_TEST(sizes(6, 3) == (std::vector<std::int64_t>{2, 2, 2}), boost::test_tools::per_element());
  BOOST_TEST(sizes(2, 5) == (std::vector<std::int64_t>{1, 1}), boost::test_tools::per_element());
  const TensorList pieces = ag::chunk(iota({2, 3}), 2, 1);
  check_values(pieces[0], {2, 2}, {0, 1, 3, 4});
  check_values(pieces[1], {2, 1}, {2, 5});
}

BOOST_AUTO_TEST_CASE(split_and_chunk_outputs_in_a_combined_loss_pass_gradcheck) {
  Tensor x = input({3, 7, 2}, 18);
  Tensor w = ag::randn({3, 2, 2}, Dtype::Float64);
  check_gradients(
      [&](const TensorList& in) {
        const TensorList p = ag::split(in[0], 2, 1);  // sizes 2, 2, 2, 1
        // Pieces used differently, one (p[2]) not at all: its gradient must be zero.
        return ag::sum(p[0] * p[0]) + ag::sum(p[1] * w) + 3.0 * ag::sum(p[3]);
      },
      {x});
  check_gradients(
      [&](const TensorList& in) {
        const TensorList p = ag::split(in[0], std::vector<std::int64_t>{3, 1, 3}, 1);
        return ag::sum(p[0] * p[2]) + ag::sum(p[1] * p[1] * p[1]);
      },
      {x});
  check_gradients(
      [&](const TensorList& in) {
        const TensorList p = ag::chunk(in[0], 2, -1);  // two [3, 7, 1] pieces
        return ag::sum(p[0] * p[1]) + ag::sum(p[0]);
      },
      {x});
}

BOOST_AUTO_TEST_CASE(split_backward_gives_zero_gradient_to_unused_pieces) {
  Tensor x = input({5}, 19);
  const TensorList p = ag::split(x, 2, 0);
  ag::sum(p[1] * 2.0).backward();
  check_values(x.grad(), {5}, {0, 0, 2, 2, 0});
}

BOOST_AUTO_TEST_CASE(split_and_chunk_errors_name_the_sizes) {
  Tensor x = ag::zeros({2, 5});
  BOOST_TEST(error_of([&] { ag::split(x, std::vector<std::int64_t>{2, 2}, 1); }) ==
             "split: sizes [2, 2] add up to 4, but dim 1 of [2, 5] has size 5");
  BOOST_TEST(error_of([&] { ag::split(x, 0, 1); }) == "split: split_size must be positive, got 0 (shape [2, 5])");
  BOOST_TEST(error_of([&] { ag::split(x, std::vector<std::int64_t>{6, -1}, 1); }) == "split: negative size -1 in [6, -1]");
  BOOST_TEST(error_of([&] { ag::chunk(x, 0, 1); }) == "chunk: chunks must be positive, got 0");
  BOOST_TEST(error_of([&] { ag::chunk(x, 2, 2); }).find("chunk: dim 2 is out of range") == 0);
}
