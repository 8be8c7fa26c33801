// ag::linear(x, W, b) = x·W + b as one fused op: its values against matmul + add (and a
// hand-computed case), float64 gradchecks of every input with and without bias and over
// several leading dims, one graph node, and the errors.
#define BOOST_TEST_MODULE linear_op
#include "test_support.hpp"

using namespace test_support::prelude;

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
  BOOST_TEST(error_of([&] { ag::linear(Tensor(), w); }) == "linear: input is an undefined tensor (default-constructed: no value)");
}

// ---- linear_cat: several linears of one input, outputs side by side ----

BOOST_AUTO_TEST_CASE(linear_cat_matches_separate_linears) {
  for (const ag::Shape& xs : {ag::Shape{5}, ag::Shape{4, 5}, ag::Shape{2, 3, 5}}) {
    BOOST_TEST_CONTEXT("x " << ag::shape_str(xs)) {
      const Tensor x = input(xs, 21), w0 = input({5, 3}, 22), w1 = input({5, 2}, 23), w2 = input({5, 4}, 24);
      const Tensor b0 = input({3}, 25), b2 = input({4}, 26);
      const std::vector<Tensor> ws{w0, w1, w2}, bs{b0, Tensor(), b2};  // the middle one without bias
      const Tensor got = ag::linear_cat(x, ws, bs);
      const Tensor want = ag::cat({ag::linear(x, w0, b0), ag::linear(x, w1), ag::linear(x, w2, b2)}, -1);
      check_values(got, want.shape(), want.to_vector(), 1e-14);
      const Tensor no_bias = ag::linear_cat(x, ws);
      const Tensor want_no_bias = ag::cat({ag::linear(x, w0), ag::linear(x, w1), ag::linear(x, w2)}, -1);
      check_values(no_bias, want_no_bias.shape(), want_no_bias.to_vector(), 1e-14);
    }
  }
}

BOOST_AUTO_TEST_CASE(linear_cat_values_by_hand) {
  // x = [[1, 2]], W_0 = [[1], [0]], W_1 = [[0, 2], [1, 3]], b_0 = [10], b_1 = [20, 30]
  //   =>  [1+10 | 2+20, 2+6+30]
  const Tensor x = f64({1, 2}, {1, 2});
  const std::vector<Tensor> ws{f64({1, 0}, {2, 1}), f64({0, 2, 1, 3}, {2, 2})}, bs{f64({10}, {1}), f64({20, 30}, {2})};
  check_values(ag::linear_cat(x, ws, bs), {1, 3}, {11, 22, 38});
}

BOOST_AUTO_TEST_CASE(linear_cat_gradients) {
  for (const ag::Shape& xs : {ag::Shape{5}, ag::Shape{4, 5}, ag::Shape{2, 3, 5}}) {
    const std::string name = ag::shape_str(xs);
    check_gradients("x, W_i, b_i " + name,
                    [](const TensorList& in) {
                      const std::vector<Tensor> ws{in[1], in[2], in[3]}, bs{in[4], in[5], in[6]};
                      return ag::linear_cat(in[0], ws, bs);
                    },
                    {input(xs, 31), input({5, 3}, 32), input({5, 2}, 33), input({5, 3}, 34), input({3}, 35),
                     input({2}, 36), input({3}, 37)});
    check_gradients("x, W_i (no bias) " + name,
                    [](const TensorList& in) {
                      const std::vector<Tensor> ws{in[1], in[2]};
                      return ag::linear_cat(in[0], ws);
                    },
                    {input(xs, 38), input({5, 4}, 39), input({5, 1}, 40)});
  }
  // Only some inputs require grad: the others get none, the rest are still right.
  const Tensor x_const = input({3, 5}, 41).detach(), w_const = input({5, 2}, 42).detach();
  const Tensor w = input({5, 3}, 43), b = input({2}, 44);
  check_gradients("W_1, b_0 only",
                  [&](const TensorList& in) {
                    const std::vector<Tensor> ws{w_const, in[0]}, bs{in[1], Tensor()};
                    return ag::linear_cat(x_const, ws, bs);
                  },
                  {w, b});
  const std::vector<Tensor> ws{w_const, w};
  ag::sum(ag::linear_cat(x_const, ws)).backward();
  BOOST_TEST(!x_const.grad().defined());
  BOOST_TEST(!w_const.grad().defined());
  BOOST_TEST(w.grad().defined());
}

BOOST_AUTO_TEST_CASE(linear_cat_float32_agrees_with_float64) {
  const Tensor x = input({6, 40}, 45), w0 = input({40, 40}, 46), w1 = input({40, 24}, 47), b1 = input({24}, 48);
  const std::vector<Tensor> ws{w0, w1}, bs{Tensor(), b1};
  const Tensor want = ag::linear_cat(x, ws, bs);
  const std::vector<Tensor> ws32{w0.detach().to(Dtype::Float32), w1.detach().to(Dtype::Float32)},
      bs32{Tensor(), b1.detach().to(Dtype::Float32)};
  check_values(ag::linear_cat(x.detach().to(Dtype::Float32), ws32, bs32), want.shape(), want.to_vector(), 1e-4);
}

BOOST_AUTO_TEST_CASE(linear_cat_errors) {
  const Tensor x = f64({1, 2, 3, 4, 5, 6}, {2, 3}), w = f64({1, 2, 3, 4, 5, 6}, {3, 2});
  const std::vector<Tensor> none, five{w, w, w, w, w}, bad_in{w, f64({1, 2}, {2, 1})};
  BOOST_TEST(error_of([&] { ag::linear_cat(x, none); }) == "linear_cat: needs 1 to 4 weights, got 0");
  BOOST_TEST(error_of([&] { ag::linear_cat(x, five); }) == "linear_cat: needs 1 to 4 weights, got 5");
  BOOST_TEST(error_of([&] { ag::linear_cat(x, bad_in); }) ==
             "linear_cat: input of shape [2, 3] does not end in the weight's in = 2 (weight [2, 1])");
  const std::vector<Tensor> ws{w, w}, one_bias{f64({1, 2}, {2})}, bad_bias{f64({1, 2}, {2}), f64({1, 2, 3}, {3})};
  BOOST_TEST(error_of([&] { ag::linear_cat(x, ws, one_bias); }) ==
             "linear_cat: needs no biases or one per weight (2), got 1");
  BOOST_TEST(error_of([&] { ag::linear_cat(x, ws, bad_bias); }) ==
             "linear_cat: bias must have shape [2] (the weight's out), got [3]");
}

// Products large enough for gemm to cut them into pieces (the weight gradient Xᵀ·dY, [96, 96]
// summed over 1024 rows, is cut along the rows it sums over): the cut depends on the shape
// alone, so 1 and 2 threads give the same bits, and float32 agrees with float64.
BOOST_AUTO_TEST_CASE(large_products_do_not_depend_on_the_thread_count) {
  auto run = [](int threads, Dtype dtype) {
    ag::set_num_threads(threads);
    ag::Generator gen(61);
    const Tensor x = ag::randn({2, 512, 96}, dtype, gen).requires_grad_(true);
    const Tensor w0 = ag::randn({96, 96}, dtype, gen).requires_grad_(true);
    const Tensor w1 = ag::randn({96, 192}, dtype, gen).requires_grad_(true);
    const Tensor b1 = ag::randn({192}, dtype, gen).requires_grad_(true);
    const Tensor r = ag::randn({2, 512, 96 + 192}, dtype, gen);
    const std::vector<Tensor> ws{w0, w1}, bs{Tensor(), b1};
    const Tensor y = ag::linear_cat(x, ws, bs);
    const Tensor z = ag::linear(x, w0);
    (ag::sum(y * r) + ag::sum(z)).backward();
    std::vector<std::vector<double>> out;
    for (const Tensor& t : {y, z, x.grad(), w0.grad(), w1.grad(), b1.grad()}) out.push_back(t.to_vector());
    return out;
  };
  const auto one = run(1, Dtype::Float32), two = run(2, Dtype::Float32), exact = run(1, Dtype::Float64);
  ag::set_num_threads(1);
  for (std::size_t i = 0; i < one.size(); ++i) {
    BOOST_TEST_CONTEXT("result " << i) {
      BOOST_TEST((one[i] == two[i]));
      double worst = 0.0, scale = 1.0;
      for (std::size_t j = 0; j < one[i].size(); ++j) {
        worst = std::max(worst, std::abs(one[i][j] - exact[i][j]));
        scale = std::max(scale, std::abs(exact[i][j]));
      }
      BOOST_TEST(worst <= 1e-5 * scale);
    }
  }
}
