// ag::layer_norm, the fused normalisation op: values by hand and against the same formula
// composed of elementary ops, float64 gradchecks of x, weight and bias (with and without the
// affine parts, over one and two dims), a negative control (a backward missing one term of the
// derivation fails the same check), one graph node, float32 agreeing with float64, the same bits
// at any thread count, and the errors.
#define BOOST_TEST_MODULE layer_norm_op
#include "test_support.hpp"

#include <cmath>
#include <limits>

using namespace test_support::prelude;

namespace {

// The same normalisation from elementary ops: (x − μ) / √(σ² + eps) · w + b over the last k dims.
Tensor composed(const Tensor& x, std::size_t k, const Tensor& w, const Tensor& b, double eps) {
  std::vector<std::int64_t> dims;
  for (std::size_t i = 0; i < k; ++i) dims.push_back(-1 - static_cast<std::int64_t>(i));
  const Tensor centred = x - ag::mean(x, dims, true);
  Tensor y = centred * ag::rsqrt(ag::mean(ag::square(centred), dims, true) + eps);
  if (w.defined()) y = y * w;
  if (b.defined()) y = y + b;
  return y;
}

// A layer norm (no affine) whose backward forgets the −x̂·mean(dx̂ ⊙ x̂) term: dx = r·(dx̂ − mean(dx̂)).
struct LayerNormMissingTerm : ag::Function<LayerNormMissingTerm> {
  static constexpr const char* name = "layer_norm_missing_term";
  static Tensor forward(ag::FunctionCtx& ctx, const Tensor& x) {
    ctx.save_for_backward({x});
    return ag::layer_norm(x, {x.size(-1)});
  }
  static TensorList backward(ag::FunctionCtx& ctx, const TensorList& g) {
    const Tensor x = ctx.saved_tensors()[0];
    const Tensor centred = x - ag::mean(x, -1, true);
    const Tensor r = ag::rsqrt(ag::mean(ag::square(centred), -1, true) + 1e-5);
    return {r * (g[0] - ag::mean(g[0], -1, true))};
  }
};

}  // namespace

// ---------------------------------------------------------------- values

BOOST_AUTO_TEST_CASE(values_by_hand) {
  // x = [1, 2, 3]: mean 2, biased variance 2/3  =>  (x − 2)/√(2/3 + 1e-5)
  const double s = std::sqrt(2.0 / 3.0 + 1e-5);
  check_values(ag::layer_norm(f64({1, 2, 3}, {1, 3}), {3}), {1, 3}, {-1 / s, 0, 1 / s});
  // x = [0, 4] normalises to [−1, 1] (eps 0); weight [2, 3], bias [10, 20]  =>  [8, 23]
  check_values(ag::layer_norm(f64({0, 4}, {2}), {2}, f64({2, 3}, {2}), f64({10, 20}, {2}), 0.0), {2}, {8, 23});
}

BOOST_AUTO_TEST_CASE(matches_the_composed_formula) {
  const Tensor x = input({3, 4, 5}, 1).detach(), w5 = input({5}, 2).detach(), b5 = input({5}, 3).detach();
  for (bool with_w : {true, false})
    for (bool with_b : {true, false}) {
      const Tensor w = with_w ? w5 : Tensor(), b = with_b ? b5 : Tensor();
      const Tensor want = composed(x, 1, w, b, 1e-5);
      check_values(ag::layer_norm(x, {5}, w, b, 1e-5), want.shape(), want.to_vector(), 1e-13);
    }
  const Tensor w45 = input({4, 5}, 4).detach(), b45 = input({4, 5}, 5).detach();
  const Tensor want = composed(x, 2, w45, b45, 0.1);
  check_values(ag::layer_norm(x, {4, 5}, w45, b45, 0.1), want.shape(), want.to_vector(), 1e-13);
  // one row without batch dims
  const Tensor v = input({6}, 6).detach();
  const Tensor want_v = composed(v, 1, Tensor(), Tensor(), 1e-5);
  check_values(ag::layer_norm(v, {6}), {6}, want_v.to_vector(), 1e-13);
}

BOOST_AUTO_TEST_CASE(float32_agrees_with_float64) {
  const Tensor x = ag::add(ag::mul(input({8, 3, 40}, 7).detach(), 30.0), 100.0);
  const Tensor w = input({40}, 8).detach(), b = input({40}, 9).detach();
  const Tensor want = ag::layer_norm(x, {40}, w, b);
  const Tensor got = ag::layer_norm(x.to(Dtype::Float32), {40}, w.to(Dtype::Float32), b.to(Dtype::Float32));
  BOOST_TEST((got.dtype() == Dtype::Float32));
  check_values(got, want.shape(), want.to_vector(), 2e-5);
}

// ---------------------------------------------------------------- gradients

BOOST_AUTO_TEST_CASE(gradients_of_input_weight_and_bias) {
  // a full Jacobian (non-scalar output), and through a random projection so that dy is not uniform
  const Tensor proj = input({2, 3, 5}, 10).detach();
  check_gradients("x, w, b", [](const TensorList& in) { return ag::layer_norm(in[0], {5}, in[1], in[2]); },
                  {input({2, 3, 5}, 11), input({5}, 12), input({5}, 13)});
  check_gradients("x, w, b projected",
                  [&](const TensorList& in) { return ag::sum(ag::layer_norm(in[0], {5}, in[1], in[2]) * proj); },
                  {input({2, 3, 5}, 14), input({5}, 15), input({5}, 16)});
  check_gradients("x, w (no bias)", [](const TensorList& in) { return ag::layer_norm(in[0], {5}, in[1]); },
                  {input({4, 5}, 17), input({5}, 18)});
  check_gradients("x, b (no weight)", [](const TensorList& in) { return ag::layer_norm(in[0], {5}, Tensor(), in[1]); },
                  {input({4, 5}, 19), input({5}, 20)});
  check_gradients("x only", [](const TensorList& in) { return ag::layer_norm(in[0], {5}); }, {input({4, 5}, 21)});
}

BOOST_AUTO_TEST_CASE(gradients_over_two_dims_and_of_one_row) {
  check_gradients("over [2, 4]", [](const TensorList& in) { return ag::layer_norm(in[0], {2, 4}, in[1], in[2], 0.01); },
                  {input({3, 2, 4}, 22), input({2, 4}, 23), input({2, 4}, 24)});
  check_gradients("one row", [](const TensorList& in) { return ag::layer_norm(in[0], {7}, in[1], in[2]); },
                  {input({7}, 25), input({7}, 26), input({7}, 27)});
}

BOOST_AUTO_TEST_CASE(gradients_when_only_some_inputs_require_grad) {
  const Tensor x = input({3, 6}, 28).detach();
  check_gradients("w, b of a constant x", [&](const TensorList& in) { return ag::layer_norm(x, {6}, in[0], in[1]); },
                  {input({6}, 29), input({6}, 30)});
  const Tensor w = input({6}, 31).detach();
  check_gradients("x with a constant w", [&](const TensorList& in) { return ag::layer_norm(in[0], {6}, w); },
                  {input({3, 6}, 32)});
  const Tensor b = input({6}, 33);
  ag::sum(ag::layer_norm(x, {6}, w, b)).backward();
  BOOST_TEST(!x.grad().defined());
  BOOST_TEST(!w.grad().defined());
  check_values(b.grad(), {6}, std::vector<double>(6, 3.0));  // db = Σ_rows dy = 3 rows of ones
}

BOOST_AUTO_TEST_CASE(gradients_of_a_large_input_on_the_threaded_path) {
  // 256 · 160 elements: above the size where rows are split among threads; dw and db summed
  // over four chunks of 64 rows
  ag::GradcheckOptions opt;
  opt.max_full_jacobian = 0;  // random projections
  opt.num_projections = 4;
  const auto r = ag::gradcheck([](const TensorList& in) { return ag::layer_norm(in[0], {160}, in[1], in[2]); },
                               {input({256, 160}, 34), input({160}, 35), input({160}, 36)}, opt);
  BOOST_TEST(r.ok, fmt::format("{}", r));
}

BOOST_AUTO_TEST_CASE(gradcheck_catches_a_backward_missing_a_term) {
  // Negative control: the derivation's −x̂·mean(dx̂ ⊙ x̂) term left out must fail the same check.
  const Tensor x = input({3, 5}, 37);
  const auto r = ag::gradcheck([](const TensorList& in) { return LayerNormMissingTerm::apply(in[0]); }, {x});
  BOOST_TEST(!r.ok, fmt::format("{}", r));
  // and the op itself passes it
  check_gradients("the op", [](const TensorList& in) { return ag::layer_norm(in[0], {5}); }, {x});
}

// ---------------------------------------------------------------- graph, threads

BOOST_AUTO_TEST_CASE(one_node_named_layer_norm) {
  const Tensor x = input({2, 4}, 38), w = input({4}, 39), b = input({4}, 40);
  const Tensor y = ag::layer_norm(x, {4}, w, b);
  BOOST_REQUIRE(y.grad_fn() != nullptr);
  BOOST_TEST(y.grad_fn()->name() == "layer_norm");
  BOOST_TEST(y.grad_fn()->next_edges.size() == 3u);
  ag::NoGradGuard no_grad;
  BOOST_TEST(ag::layer_norm(x, {4}, w, b).grad_fn() == nullptr);
}

BOOST_AUTO_TEST_CASE(same_bits_at_any_thread_count) {
  const int before = ag::get_num_threads();
  for (Dtype dt : {Dtype::Float32, Dtype::Float64}) {
    const Tensor x0 = input({300, 129}, 41).detach().to(dt), w0 = input({129}, 42).detach().to(dt);
    const Tensor b0 = input({129}, 43).detach().to(dt), dy = input({300, 129}, 44).detach().to(dt);
    std::vector<std::vector<double>> first;
    for (int threads : {1, 2, 3, 4}) {
      ag::set_num_threads(threads);
      const Tensor x = x0.detach().requires_grad_(), w = w0.detach().requires_grad_(), b = b0.detach().requires_grad_();
      const Tensor y = ag::layer_norm(x, {129}, w, b);
      y.backward(dy);
      const std::vector<std::vector<double>> got = {y.to_vector(), x.grad().to_vector(), w.grad().to_vector(),
                                                    b.grad().to_vector()};
      if (first.empty()) first = got;
      for (std::size_t i = 0; i < got.size(); ++i)
        BOOST_TEST((got[i] == first[i]), "output " << i << " differs at " << threads << " threads");
    }
  }
  ag::set_num_threads(before);
}

// ---------------------------------------------------------------- errors

BOOST_AUTO_TEST_CASE(errors_name_the_op_and_the_shapes) {
  const Tensor x = ag::zeros({2, 4});
  check_message([] { ag::layer_norm(Tensor(), {4}); }, "layer_norm: the input is an undefined tensor");
  check_message([&] { ag::layer_norm(x, {}); }, "layer_norm: normalized_shape is empty");
  check_message([&] { ag::layer_norm(x, {3}); }, "layer_norm: input [2, 4] does not end with normalized_shape [3]");
  check_message([&] { ag::layer_norm(x, {3, 2, 4}); }, "does not end with normalized_shape [3, 2, 4]");
  check_message([&] { ag::layer_norm(x, {4}, ag::ones({3})); }, "layer_norm: weight [3] must have normalized_shape [4]");
  check_message([&] { ag::layer_norm(x, {4}, Tensor(), ag::ones({2, 2})); }, "bias [2, 2] must have normalized_shape [4]");
  check_message([&] { ag::layer_norm(x, {4}, ag::ones({4}, Dtype::Float64)); },
                "layer_norm: dtypes differ: input Float32 and weight Float64");
  check_message([&] { ag::layer_norm(x, {4}, Tensor(), Tensor(), -1.0); }, "layer_norm: eps must be >= 0, got -1");
  check_message([&] { ag::layer_norm(x, {4}, Tensor(), Tensor(), std::nan("")); }, "eps must be >= 0");
}

BOOST_AUTO_TEST_CASE(changing_a_saved_input_in_place_makes_backward_throw) {
  Tensor x = input({2, 3}, 45), w = input({3}, 46);
  const Tensor y = ag::sum(ag::layer_norm(x, {3}, w));
  {
    ag::NoGradGuard no_grad;
    w.copy_(ag::zeros({3}, Dtype::Float64));
  }
  try {
    y.backward();
    BOOST_ERROR("backward did not throw");
  } catch (const std::runtime_error& e) {
    BOOST_TEST(test_support::contains(e.what(), "layer_norm: a tensor of shape [3] saved for backward was changed"),
               e.what());
  }
}
