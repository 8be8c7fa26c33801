// ag::linear(x, W, b) = x·W + b as one fused op: its values against matmul + add (and a
// hand-computed case), float64 gradchecks of every input with and without bias and over
// several leading dims, one graph node, and the errors.
#define BOOST_TEST_MODULE linear_op
#include "test_support.hpp"

namespace ag = autograd;
using ag::Dtype;
using ag::Tensor;
using ag::TensorList;
using test_support::check_gradients;
using test_support::check_values;
using test_support::error_of;
using test_support::f64;
using test_support::input;

BOOST_AUTO_TEST_CASE(values_by_hand) {
  // x = [[1, 2]], W = [[1, 0, 2], [0, 1, 3]], b = [10, 20, 30]  =>  [1+10, 2+20, 2+6+30]
  const Tensor x = f64({1, 2}, {1, 2});
  const Tensor w = f64({1, 0, 2, 0, 1, 3}, {2, 3});
  const Tensor b = f64({10, 20, 30}, {3});
  check_values(ag::linear(x, w, b), {1, 3}, {11, 22, 38});
  check_values(ag::linear(x, w), {1, 3}, {1, 2, 8});
}

BOOST_AUTO_TEST_CASE(matches_matmul_plus_bias) {
  for (const ag::Shape& xs : {ag::Shape{5}, ag::Shape{4, 5}, ag::Shape{2, 3, 5}, ag::Shape{2, 1, 3, 5}}) {
    const Tensor x = input(xs, 1), w = input({5, 7}, 2), b = input({7}, 3);
    const Tensor got = ag::linear(x, w, b);
    const Tensor want = ag::matmul(x, w) + b;
    check_values(got, want.shape(), want.to_vector(), 1e-14);
    for (Dtype dt : {Dtype::Float32}) {  // float32 agrees with float64 to float rounding
      const Tensor g32 = ag::linear(x.detach().to(dt), w.detach().to(dt), b.detach().to(dt));
      check_values(g32, want.shape(), want.to_vector(), 1e-5);
    }
  }
}

BOOST_AUTO_TEST_CASE(gradients) {
  for (const ag::Shape& xs : {ag::Shape{5}, ag::Shape{4, 5}, ag::Shape{2, 3, 5}}) {
    const std::string name = ag::shape_str(xs);
    check_gradients("x, W, b " + name, [](const TensorList& in) { return ag::linear(in[0], in[1], in[2]); },
                    {input(xs, 4), input({5, 3}, 5), input({3}, 6)});
    check_gradients("x, W (no bias) " + name, [](const TensorList& in) { return ag::linear(in[0], in[1]); },
                    {input(xs, 7), input({5, 3}, 8)});
  }
  // Only some inputs require grad: the others get none, the rest are still right.
  const Tensor x_const = input({3, 5}, 9).detach();
  const Tensor w = input({5, 2}, 10), b = input({2}, 11);
  check_gradients("W, b only", [&](const TensorList& in) { return ag::linear(x_const, in[0], in[1]); }, {w, b});
  const Tensor w_const = input({5, 2}, 12).detach();
  check_gradients("x only", [&](const TensorList& in) { return ag::linear(in[0], w_const); }, {input({3, 5}, 13)});
  ag::sum(ag::linear(x_const, w, b)).backward();
  BOOST_TEST(!x_const.grad().defined());
  BOOST_TEST(w.grad().defined());
}

BOOST_AUTO_TEST_CASE(one_node) {
  const Tensor x = input({2, 3, 4}, 14), w = input({4, 5}, 15), b = input({5}, 16);
  const Tensor y = ag::linear(x, w, b);
  BOOST_TEST(y.grad_fn()->name() == "linear");
  BOOST_TEST(y.grad_fn()->next_edges.size() == 3u);
  BOOST_TEST(y.grad_fn()->next_edges[0].node->name() == "AccumulateGrad");
}

BOOST_AUTO_TEST_CASE(errors) {
  const Tensor x = f64({1, 2, 3, 4, 5, 6}, {2, 3}), w = f64({1, 2, 3, 4, 5, 6}, {3, 2});
  BOOST_TEST(error_of([&] { ag::linear(x, f64({1, 2, 3}, {3})); }) ==
             "linear: weight must be 2-D (in, out), got shape [3]");
  BOOST_TEST(error_of([&] { ag::linear(x, f64({1, 2, 3, 4}, {2, 2})); }) ==
             "linear: input of shape [2, 3] does not end in the weight's in = 2 (weight [2, 2])");
  BOOST_TEST(error_of([&] { ag::linear(x, w, f64({1, 2, 3}, {3})); }) ==
             "linear: bias must have shape [2] (the weight's out), got [3]");
  BOOST_TEST(error_of([&] { ag::linear(x, w.to(Dtype::Float32)); }) ==
             "linear: dtypes differ: input Float64 and weight Float32");
  BOOST_TEST(error_of([&] { ag::linear(Tensor(), w); }) == "linear: input is an undefined tensor");
}
