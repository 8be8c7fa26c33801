// Second derivatives through the reductions (sum, mean, max both forms, sum_to), the shape ops
// (reshape, flatten, transpose, permute, squeeze, unsqueeze, expand), slicing and joining
// (narrow, slice, cat, stack, split, chunk), dropout with its saved mask, clone and to:
// gradgradcheck of each, nearest the seed and inside a chain; exact second derivatives of
// small compositions; and gradients built with create_graph equal to the first-order ones.
#define BOOST_TEST_MODULE double_backward_shape
#include <boost/test/unit_test.hpp>

#include <functional>
#include <string>
#include <vector>

#include <autograd/autograd.hpp>

#include "double_backward_support.hpp"
#include "test_support.hpp"

namespace ag = autograd;
using ag::Dtype;
using ag::Tensor;
using ag::TensorList;
using double_backward::check_op;
using test_support::check_values;
using test_support::input;

namespace {

using Unary = std::function<Tensor(const Tensor&)>;

ag::GradcheckFn unary_fn(Unary f) {
  return [f](const TensorList& in) { return f(in[0]); };
}

// Concatenation of pieces, each weighted by its position (1, 2, ...), flattened: one output
// that depends on every piece differently.
Tensor weighted_flat(const TensorList& pieces) {
  TensorList flat;
  for (std::size_t i = 0; i < pieces.size(); ++i)
    flat.push_back(ag::reshape(pieces[i], {-1}) * static_cast<double>(i + 1));
  return ag::cat(flat, 0);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(reductions)

BOOST_AUTO_TEST_CASE(sum_mean_and_max_in_every_form) {
  const Tensor x = input({2, 3, 4}, 101);
  const std::vector<std::pair<std::string, Unary>> ops = {
      {"sum", [](const Tensor& t) { return ag::sum(t); }},
      {"sum dim 1", [](const Tensor& t) { return ag::sum(t, 1); }},
      {"sum dims {0, 2} keepdim", [](const Tensor& t) { return ag::sum(t, std::vector<std::int64_t>{0, 2}, true); }},
      {"mean", [](const Tensor& t) { return ag::mean(t); }},
      {"mean dim -1 keepdim", [](const Tensor& t) { return ag::mean(t, -1, true); }},
      {"mean dims {0, 1}", [](const Tensor& t) { return ag::mean(t, std::vector<std::int64_t>{0, 1}); }},
      {"max", [](const Tensor& t) { return ag::max(t); }},
      {"max dim 1", [](const Tensor& t) { return ag::max(t, 1); }},
      {"max dim 0 keepdim", [](const Tensor& t) { return ag::max(t, 0, true); }},
      {"max dim -1", [](const Tensor& t) { return ag::max(t, -1); }},
      {"sum_to [3, 1]", [](const Tensor& t) { return ag::sum_to(t, {3, 1}); }},
      {"sum_to [1, 4]", [](const Tensor& t) { return ag::sum_to(t, {1, 4}); }},
      // products around the reduction: non-zero second derivatives through it
      {"sum of squares by dim", [](const Tensor& t) { return ag::sum(t * t, 1) * ag::mean(t, 1); }},
      {"max of a product", [](const Tensor& t) { return ag::max(t * t, 2) * ag::max(t); }},
  };
  for (const auto& [name, f] : ops) check_op("reduction", name, unary_fn(f), {x});
  check_op("reduction", "sum of a 0-d tensor", unary_fn([](const Tensor& t) { return ag::sum(t * t); }),
           {input({}, 102)});
}

BOOST_AUTO_TEST_CASE(argmax_has_no_gradient) {
  const Tensor x = input({3, 4}, 111);
  BOOST_TEST(!ag::argmax(x, 1).requires_grad());
  // ... and a function that uses it as a constant still has exact second derivatives
  check_op("reduction", "x² scaled by argmax",
           unary_fn([](const Tensor& t) { return t * t * (ag::argmax(t, 1, true).to(t.dtype()) + 1.0); }), {x});
}

BOOST_AUTO_TEST_CASE(second_derivatives_through_reductions_are_exact) {
  const Tensor x = input({2, 3}, 121);
  // f = (Σx)² + mean(x)³ + max(x)·Σx²: d²f/dx_i dx_j = 2 + 6·mean/n² + 2·[i = j]·max + 2·x_j·[i = argmax]
  //                                                          + 2·x_i·[j = argmax]
  auto f = [](const TensorList& in) {
    const Tensor& t = in[0];
    const Tensor s = ag::sum(t), m = ag::mean(t);
    return s * s + m * m * m + ag::max(t) * ag::sum(t * t);
  };
  const std::vector<double> v = x.to_vector();
  const auto n = static_cast<double>(v.size());
  double mean = 0, top = v[0];
  std::size_t at = 0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    mean += v[i] / n;
    if (v[i] > top) top = v[i], at = i;
  }
  for (std::size_t j = 0; j < v.size(); ++j) {
    Tensor e = ag::zeros({2, 3}, Dtype::Float64);
    e.data<double>()[j] = 1.0;
    const Tensor hv = ag::hvp(f, {x}, {e})[0];  // column j of the Hessian
    std::vector<double> expected(v.size());
    for (std::size_t i = 0; i < v.size(); ++i)
      expected[i] = 2 + 6 * mean / (n * n) + (i == j ? 2 * top : 0.0) + (i == at ? 2 * v[j] : 0.0) +
                    (j == at ? 2 * v[i] : 0.0);
    check_values(hv, {2, 3}, expected);
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(shape_ops)

BOOST_AUTO_TEST_CASE(views_and_copies) {
  const Tensor x = input({2, 3, 4}, 131), col = input({3, 1}, 132);
  const std::vector<std::pair<std::string, Unary>> ops = {
      {"reshape", [](const Tensor& t) { return ag::reshape(t, {4, -1}); }},
      {"flatten", [](const Tensor& t) { return ag::flatten(t, 1); }},
      {"transpose", [](const Tensor& t) { return ag::transpose(t, 0, 2); }},
      {"permute", [](const Tensor& t) { return ag::permute(t, {1, 2, 0}); }},
      {"unsqueeze", [](const Tensor& t) { return ag::unsqueeze(t, 1); }},
      {"squeeze", [](const Tensor& t) { return ag::squeeze(ag::unsqueeze(t, 3)); }},
      {"squeeze dim", [](const Tensor& t) { return ag::squeeze(ag::unsqueeze(t, 0), 0); }},
      {"clone", [](const Tensor& t) { return t.clone(); }},
      {"to the same dtype", [](const Tensor& t) { return t.to(Dtype::Float64); }},
      {"shape ops around a product",
       [](const Tensor& t) {
         return ag::transpose(ag::reshape(t * t, {6, 4}), 0, 1) * ag::transpose(ag::flatten(t, 0, 1).clone(), 0, 1);
       }},
  };
  for (const auto& [name, f] : ops) check_op("shape", name, unary_fn(f), {x});
  check_op("shape", "expand", unary_fn([](const Tensor& t) { return ag::expand(t, {2, 3, 5}); }), {col});
  check_op("shape", "expand of a square",
           unary_fn([](const Tensor& t) { return ag::expand(t * t, {2, 3, 5}) * ag::expand(t, {3, 5}); }), {col});
}

BOOST_AUTO_TEST_CASE(slices) {
  const Tensor x = input({3, 5, 2}, 141);
  const std::vector<std::pair<std::string, Unary>> ops = {
      {"narrow", [](const Tensor& t) { return ag::narrow(t, 1, 1, 3); }},
      {"narrow from the end", [](const Tensor& t) { return ag::narrow(t, 0, -2, 2); }},
      {"slice step 2", [](const Tensor& t) { return ag::slice(t, 1, 0, 5, 2); }},
      {"slice step 3 from 1", [](const Tensor& t) { return ag::slice(t, 1, 1, 5, 3); }},
      {"slice of a product", [](const Tensor& t) { return ag::slice(t * t, 1, 1, 4, 2) * ag::narrow(t, 1, 0, 2); }},
  };
  for (const auto& [name, f] : ops) check_op("slice/join", name, unary_fn(f), {x});
  // an empty slice: the gradient is all zeros, and has a graph in a chain
  const Tensor y = input({3, 4}, 142);
  const Tensor g = ag::grad({ag::sum(ag::exp(ag::slice(y, 1, 2, 2))) + ag::sum(y * y)}, {y}, {.create_graph = true})[0];
  check_values(ag::grad({ag::sum(g)}, {y})[0], {3, 4}, std::vector<double>(12, 2.0));
}

BOOST_AUTO_TEST_CASE(joins_and_splits) {
  const Tensor a = input({2, 3}, 151), b = input({2, 4}, 152), c = input({2, 3}, 153);
  check_op("slice/join", "cat", [](const TensorList& in) { return ag::cat({in[0], in[1], in[0] * in[2]}, 1); },
           {a, b, c});
  check_op("slice/join", "stack", [](const TensorList& in) { return ag::stack({in[0], in[1] * in[0]}, 1); }, {a, c});
  check_op("slice/join", "stack at the end", [](const TensorList& in) { return ag::stack({in[1], in[0]}, -1); },
           {a, c});
  const Tensor x = input({5, 4}, 154);
  check_op("slice/join", "split by size",
           unary_fn([](const Tensor& t) { return weighted_flat(ag::split(t, 2, 0)); }), {x});
  check_op("slice/join", "split by sizes",
           unary_fn([](const Tensor& t) { return weighted_flat(ag::split(t * t, std::vector<std::int64_t>{1, 3}, 1)); }),
           {x});
  check_op("slice/join", "chunk", unary_fn([](const Tensor& t) { return weighted_flat(ag::chunk(t, 3, 1)); }), {x});
  // one piece unused: its gradient comes in as zeros
  check_op("slice/join", "split with a piece unused",
           unary_fn([](const Tensor& t) { return ag::split(t, 2, 0)[1] * ag::sum(ag::split(t, 2, 0)[2]); }), {x});
}

BOOST_AUTO_TEST_CASE(dropout_with_its_saved_mask) {
  const Tensor x = input({4, 6}, 161);
  // the same seed each evaluation: the same mask, so dropout is a fixed linear map
  check_op("dropout", "dropout p=0.3", unary_fn([](const Tensor& t) {
             ag::Generator gen(17);
             return ag::dropout(t, 0.3, true, gen);
           }),
           {x});
  check_op("dropout", "dropout of a product", unary_fn([](const Tensor& t) {
             ag::Generator gen(18);
             return ag::dropout(t * ag::tanh(t), 0.5, true, gen) * t;
           }),
           {x});
  // d²/dx² sum(dropout(x)²) = 2·mask²
  ag::Generator gen(19);
  const Tensor y = ag::dropout(x, 0.4, true, gen);
  std::vector<double> expected;
  const auto xv = x.to_vector(), yv = y.to_vector();
  for (std::size_t i = 0; i < xv.size(); ++i) expected.push_back(2 * (yv[i] / xv[i]) * (yv[i] / xv[i]));
  const Tensor g = ag::grad({ag::sum(y * y)}, {x}, {.create_graph = true})[0];
  check_values(ag::grad({ag::sum(g)}, {x})[0], {4, 6}, expected);
}

BOOST_AUTO_TEST_CASE(to_another_dtype_keeps_the_graph) {
  // through float32 and back: d²/dx² sum(exp(x)) computed in float32 is exp(x) to float32 precision,
  // and the square's second derivative 2 is exact in any dtype.
  const Tensor x = input({5}, 171);
  auto through_f32 = [](const Tensor& t) { return t.to(Dtype::Float32).to(Dtype::Float64); };
  const Tensor g = ag::grad({ag::sum(through_f32(ag::square(through_f32(x))))}, {x}, {.create_graph = true})[0];
  BOOST_TEST(g.requires_grad());
  check_values(ag::grad({ag::sum(g)}, {x})[0], {5}, std::vector<double>(5, 2.0));
  const Tensor ge = ag::grad({ag::sum(ag::exp(x.to(Dtype::Float32)))}, {x}, {.create_graph = true})[0];
  BOOST_TEST((ge.dtype() == Dtype::Float64));
  const auto h = ag::grad({ag::sum(ge)}, {x})[0].to_vector();
  const auto xv = x.to_vector();
  for (std::size_t i = 0; i < xv.size(); ++i)
    BOOST_TEST(std::abs(h[i] - std::exp(xv[i])) <= 1e-6 * std::exp(xv[i]), "element " << i);
}

// The composed backward is the same gradient as the kernel one.
BOOST_AUTO_TEST_CASE(create_graph_gradients_equal_the_first_order_ones) {
  const Tensor x = input({3, 4, 2}, 181);
  auto f = [](const Tensor& t) {
    ag::Generator gen(5);
    const TensorList parts = ag::chunk(t, 2, 1);
    return ag::sum(ag::max(t, 1, true) * ag::mean(t, 2, true)) +
           ag::max(t) * ag::sum(ag::sum(t, std::vector<std::int64_t>{0, 2})) +
           ag::sum(ag::cat({ag::slice(t, 1, 0, 4, 3), ag::reshape(ag::narrow(t, 0, 1, 2), {4, 2, 2})}, 0)) +
           ag::sum(ag::stack(parts, 0) * ag::dropout(ag::stack(parts, 0), 0.5, true, gen)) +
           ag::sum(ag::expand(ag::permute(t, {2, 0, 1}), {2, 2, 3, 4}) *
                   ag::unsqueeze(ag::transpose(ag::transpose(t, 0, 2), 1, 2), 0));
  };
  const Tensor y = f(x) * f(x);
  const Tensor plain = ag::grad({y}, {x}, {.retain_graph = true})[0];
  const Tensor graph = ag::grad({y}, {x}, {.create_graph = true})[0];
  BOOST_TEST(graph.requires_grad());
  check_values(graph, plain.shape(), plain.to_vector(), 1e-14);
}

// The composed rules are differentiable again: gradgradcheck of a gradient (third derivatives).
BOOST_AUTO_TEST_CASE(gradgradcheck_of_a_gradient) {
  const Tensor x = input({3, 4}, 191);
  auto gradient = [](const TensorList& in) {
    const Tensor& t = in[0];
    const TensorList parts = ag::split(t, std::vector<std::int64_t>{1, 3}, 1);
    const Tensor y = ag::max(ag::tanh(t), 1) * ag::mean(t * t, 1) + ag::sum(ag::exp(ag::slice(t, 1, 0, 4, 2)), 1) +
                     ag::sum(ag::square(ag::cat({parts[1], parts[0]}, 1)) * ag::expand(ag::narrow(t, 1, 1, 1), {3, 4}), 1);
    return ag::grad({ag::sum(y * y)}, {t}, {.create_graph = true})[0];
  };
  double_backward::second_order_ok("third order", "gradient through reductions and slices", gradient, {x});
}

BOOST_AUTO_TEST_CASE(report) { double_backward::print_worst("shape"); }

BOOST_AUTO_TEST_SUITE_END()
