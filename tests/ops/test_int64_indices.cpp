// Int64 index tensors in every op that takes indices (index_select, embedding, gather,
// cross_entropy's targets): the same results and gradients as float indices of the same values,
// float64 gradients against central differences, gather against its definition, and the errors
// for indices out of range.
#define BOOST_TEST_MODULE int64_indices
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <functional>
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

// The same index values as a Float32 tensor (the old way of passing indices).
Tensor as_float(const Tensor& index) { return index.to(Dtype::Float32); }

// f(x, index) with an Int64 index and with the same values as floats: equal values, and equal
// gradients of sum(f · w) for a fixed weight w.
void check_same_with_float_index(const std::string& name, const std::function<Tensor(const Tensor&, const Tensor&)>& f,
                                 const Tensor& x_values, const Tensor& index) {
  Tensor xa = x_values.detach().clone().requires_grad_(), xb = x_values.detach().clone().requires_grad_();
  const Tensor ya = f(xa, index), yb = f(xb, as_float(index));
  BOOST_TEST(ag::shape_str(ya.shape()) == ag::shape_str(yb.shape()), name);
  BOOST_TEST(ya.to_vector() == yb.to_vector(), name);
  const Tensor w = ag::reshape(ag::arange(static_cast<double>(ya.numel()), ya.dtype()), ya.shape());
  ag::sum(ya * w).backward();
  ag::sum(yb * w).backward();
  BOOST_TEST(xa.grad().to_vector() == xb.grad().to_vector(), name);
}

// gather's definition, by loops over index: out[i][j] = x[index[i][j]][j] (dim 0) or
// x[i][index[i][j]] (dim 1), for 2-D x.
std::vector<double> gather_by_definition(const Tensor& x, std::int64_t dim, const Tensor& index) {
  const std::vector<double> xv = x.to_vector();
  const std::int64_t* iv = index.data<std::int64_t>();
  const std::int64_t cols = x.size(1);
  std::vector<double> out;
  for (std::int64_t i = 0; i < index.size(0); ++i)
    for (std::int64_t j = 0; j < index.size(1); ++j) {
      const std::int64_t k = iv[i * index.size(1) + j];
      out.push_back(dim == 0 ? xv[static_cast<std::size_t>(k * cols + j)] : xv[static_cast<std::size_t>(i * cols + k)]);
    }
  return out;
}

}  // namespace

// ---------------------------------------------------------------- Int64 and float indices agree

BOOST_AUTO_TEST_CASE(int64_and_float_indices_give_identical_results_and_gradients) {
  const Tensor x = test_support::input({5, 3}, 11).detach();
  check_same_with_float_index("index_select dim 0", [](const Tensor& t, const Tensor& i) { return ag::index_select(t, 0, i); },
                              x, ints({4, 0, 4, 2}, {4}));
  check_same_with_float_index("index_select dim 1", [](const Tensor& t, const Tensor& i) { return ag::index_select(t, 1, i); },
                              x, ints({2, 2, 1}, {3}));
  check_same_with_float_index("index_select 0-d", [](const Tensor& t, const Tensor& i) { return ag::index_select(t, 0, i); },
                              x, ints({3}, {}));
  check_same_with_float_index("embedding", [](const Tensor& t, const Tensor& i) { return ag::embedding(t, i); }, x,
                              ints({1, 4, 1, 0, 3, 3}, {2, 3}));
  check_same_with_float_index("gather dim 0", [](const Tensor& t, const Tensor& i) { return ag::gather(t, 0, i); }, x,
                              ints({4, 0, 2, 1, 1, 1}, {2, 3}));
  check_same_with_float_index("gather dim 1", [](const Tensor& t, const Tensor& i) { return ag::gather(t, 1, i); }, x,
                              ints({2, 0, 0, 1, 1, 2, 0, 0}, {4, 2}));
  for (const auto& options : {ag::CrossEntropyOptions{}, ag::CrossEntropyOptions{.reduction = ag::Reduction::None},
                              ag::CrossEntropyOptions{.ignore_index = 2, .label_smoothing = 0.1}}) {
    check_same_with_float_index(
        "cross_entropy", [&](const Tensor& t, const Tensor& i) { return ag::cross_entropy(t, i, options); }, x,
        ints({2, 0, 1, 2, 0}, {5}));
  }
}

BOOST_AUTO_TEST_CASE(negative_control_a_different_index_is_noticed) {
  // the comparison above would catch an op that read its Int64 index wrongly: one value off
  // gives different results
  const Tensor x = test_support::input({5, 3}, 11).detach();
  BOOST_TEST(ag::embedding(x, ints({1, 4}, {2})).to_vector() != ag::embedding(x, as_float(ints({1, 3}, {2}))).to_vector());
  BOOST_TEST(ag::gather(x, 0, ints({1, 4, 0}, {1, 3})).to_vector() !=
             ag::gather(x, 0, as_float(ints({1, 4, 1}, {1, 3}))).to_vector());
}

BOOST_AUTO_TEST_CASE(cross_entropy_int64_targets_with_ignore_index) {
  const Tensor logits = f64({1, 2, 3, 0, 0, 5, 2, 2, 2}, {3, 3});
  const Tensor loss = ag::cross_entropy(logits, ints({2, -100, 0}, {3}));
  // by hand: rows 0 and 2 count, each −log softmax at the target
  const auto nll = [](std::vector<double> row, int t) {
    double s = 0;
    for (double v : row) s += std::exp(v);
    return std::log(s) - row[static_cast<std::size_t>(t)];
  };
  const double expected = (nll({1, 2, 3}, 2) + nll({2, 2, 2}, 0)) / 2;
  check_values(loss, {}, {expected}, 1e-14);
  check_values(ag::cross_entropy(logits, I64{2, -100, 0}), {}, {expected}, 1e-14);
  check_throws<std::invalid_argument>([&] { ag::cross_entropy(logits, ints({2, 3, 0}, {3})); },
                                      {"cross_entropy: target 3 at position 1 is out of range for 3 classes"});
  check_throws<std::invalid_argument>([&] { ag::cross_entropy(logits, ints({-1, 0, 0}, {3})); },
                                      {"cross_entropy: target -1 at position 0 is out of range for 3 classes"});
  // float targets keep their check for non-integral values
  check_throws<std::invalid_argument>([&] { ag::cross_entropy(logits, f64({0.5, 0, 0}, {3})); },
                                      {"cross_entropy: target at position 0 is 0.5, not an integral class index"});
}

// ---------------------------------------------------------------- gradients, float64 vs central differences

BOOST_AUTO_TEST_CASE(gradients_through_int64_indices_match_central_differences) {
  const Tensor repeated = ints({3, 0, 3, 3, 1}, {5});
  check_gradients("embedding", [&](const TensorList& in) { return ag::embedding(in[0], ag::reshape(repeated, {5, 1})); },
                  {input({4, 3}, 1)});
  check_gradients("index_select", [&](const TensorList& in) { return ag::index_select(in[0], 1, repeated); },
                  {input({2, 4}, 2)});
  check_gradients("gather dim 0", [](const TensorList& in) { return ag::gather(in[0], 0, ints({2, 2, 0, 1, 2, 2}, {3, 2})); },
                  {input({3, 3}, 3)});
  check_gradients("gather dim -1 of 3-D",
                  [](const TensorList& in) { return ag::gather(in[0], -1, ints({1, 1, 0, 2, 0, 0, 2, 2}, {2, 2, 2})); },
                  {input({2, 3, 3}, 4)});
  for (double eps : {0.0, 0.2})
    check_gradients("cross_entropy",
                    [&](const TensorList& in) {
                      return ag::cross_entropy(in[0], ints({1, -100, 0, 3}, {2, 2}), {.label_smoothing = eps});
                    },
                    {input({2, 2, 4}, 5)});
}

BOOST_AUTO_TEST_CASE(gather_second_derivatives) {
  const ag::GradcheckResult r = ag::gradgradcheck(
      [](const TensorList& in) { return ag::square(ag::gather(in[0], 1, ints({0, 0, 2, 1}, {2, 2}))); }, {input({2, 3}, 6)});
  BOOST_TEST(r.ok, fmt::format("{}", r));
}

// ---------------------------------------------------------------- gather

BOOST_AUTO_TEST_CASE(gather_follows_its_definition) {
  const Tensor x = test_support::iota({3, 4}) * 1.5 - 2.0;
  const Tensor i0 = ints({2, 0, 1, 2, 1, 1, 0, 0}, {2, 4});  // fewer rows than x: allowed in dim 0
  check_values(ag::gather(x, 0, i0), {2, 4}, gather_by_definition(x, 0, i0), 0.0);
  const Tensor i1 = ints({3, 3, 0, 0, 1, 2, 2, 1, 0}, {3, 3});  // fewer columns
  check_values(ag::gather(x, 1, i1), {3, 3}, gather_by_definition(x, 1, i1), 0.0);
  const Tensor i2 = ints({0, 1, 2, 3, 3}, {1, 5});  // more columns than x along dim 1: allowed
  check_values(ag::gather(x, 1, i2), {1, 5}, gather_by_definition(x, 1, i2), 0.0);
  check_values(ag::gather(x, 0, ints({}, {0, 4})), {0, 4}, {});
  // the gradient adds up where an element is picked twice
  Tensor xs = f64({1, 2, 3}, {1, 3}).requires_grad_();
  ag::sum(ag::gather(xs, 1, ints({2, 2, 0}, {1, 3}))).backward();
  check_values(xs.grad(), {1, 3}, {1, 0, 2}, 0.0);
}

BOOST_AUTO_TEST_CASE(gather_errors_name_the_op_and_the_shapes) {
  const Tensor x = ag::zeros({3, 4});
  check_throws<std::invalid_argument>([&] { ag::gather(x, 1, ints({0, 1}, {2})); },
                                      {"gather: index must have the input's number of dims: index [2] for input [3, 4]"});
  check_throws<std::invalid_argument>([&] { ag::gather(x, 1, ints({0, 0, 0, 0}, {4, 1})); },
                                      {"gather: index [4, 1] is larger than input [3, 4] in dim 0"});
  check_throws<std::invalid_argument>([&] { ag::gather(x, 1, ints({0, 4}, {1, 2})); },
                                      {"gather: index 4 (at position 1 of index [1, 2]) is out of range for dim 1 of size 4"});
  check_throws<std::invalid_argument>([&] { ag::gather(x, 0, ints({-1}, {1, 1})); },
                                      {"gather: index -1 (at position 0 of index [1, 1]) is out of range for dim 0 of size 3"});
  check_throws<std::invalid_argument>([&] { ag::gather(x, 2, ints({0}, {1, 1})); }, {"gather: ", "dim 2"});
  check_throws<std::invalid_argument>([&] { ag::gather(x, 0, f64({0.5}, {1, 1})); },
                                      {"gather: indices must hold integral values, got 0.5"});
  check_throws<std::invalid_argument>([&] { ag::gather(ag::scalar_tensor(1), 0, ints({0}, {})); },
                                      {"gather: cannot gather from a 0-d tensor"});
  check_throws<std::invalid_argument>([&] { ag::gather(x, 0, Tensor()); }, {"gather: the index is"});
}

// ---------------------------------------------------------------- out-of-range Int64 indices

BOOST_AUTO_TEST_CASE(out_of_range_int64_indices_name_op_value_and_size) {
  const Tensor w = ag::zeros({4, 2});
  check_throws<std::invalid_argument>([&] { ag::embedding(w, ints({1, 4}, {2})); },
                                      {"embedding: index 4 (at position 1) is out of range for dim 0 of size 4"});
  check_throws<std::invalid_argument>([&] { ag::embedding(w, ints({-1}, {1})); },
                                      {"embedding: index -1 (at position 0) is out of range for dim 0 of size 4"});
  check_throws<std::invalid_argument>([&] { ag::index_select(w, 1, ints({0, 2}, {2})); },
                                      {"index_select: index 2 (at position 1) is out of range for dim 1 of size 2"});
  const std::int64_t huge = std::int64_t{1} << 62;  // not representable as a float index: exact in the message
  check_throws<std::invalid_argument>([&] { ag::index_select(w, 0, ints({huge}, {1})); },
                                      {"index_select: index 4611686018427387904 (at position 0)"});
  check_throws<std::invalid_argument>([&] { ag::index_select(w, 0, ints({0, 1}, {1, 2})); },
                                      {"index_select: index must be 0-d or 1-D, got shape [1, 2]"});
}
