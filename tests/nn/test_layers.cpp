// Layers: forward values by hand, gradients against central differences in float64, names and
// parameter counts, argument errors.
#define BOOST_TEST_MODULE layers
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <nn/nn.hpp>

#include "test_support.hpp"

using namespace test_support::prelude;

namespace {

std::vector<std::string> names_of(const nn::Module& m) {
  std::vector<std::string> out;
  for (const auto& [name, p] : m.named_parameters()) out.push_back(name);
  return out;
}

// Fills every parameter with small random values (so LayerNorm's weight is not all ones, etc.).
void randomize(nn::Module& m, std::uint64_t seed) {
  ag::Generator gen(seed);
  ag::NoGradGuard no_grad;
  for (auto& p : m.parameters()) p.copy_(ag::uniform(p.shape(), -0.8, 0.8, p.dtype(), gen));
}

}  // namespace

// ---- LayerNorm ----

BOOST_AUTO_TEST_CASE(layer_norm_of_a_row_matches_hand_computation) {
  // x = [1, 2, 3]: mean 2, biased variance 2/3  =>  y = (x − 2)/√(2/3 + 1e-5)
  nn::LayerNorm ln(nn::LayerNormOptions{.normalized_shape = {3}, .dtype = F64});
  const auto y = ln(ag::tensor({1, 2, 3}, {1, 3}, F64)).to_vector();
  const double s = std::sqrt(2.0 / 3.0 + 1e-5);
  BOOST_CHECK_CLOSE(y[0], -1.0 / s, 1e-10);
  BOOST_CHECK_SMALL(y[1], 1e-15);
  BOOST_CHECK_CLOSE(y[2], 1.0 / s, 1e-10);
}

BOOST_AUTO_TEST_CASE(layer_norm_rows_have_zero_mean_and_unit_variance) {
  ag::Generator gen(1);
  ag::Tensor x = ag::add(ag::mul(ag::randn({4, 5, 16}, ag::Dtype::Float32, gen), 30.0), 100.0);
  nn::LayerNorm ln(16, 0.0);
  const auto y = ln(x).to_vector();
  for (int r = 0; r < 20; ++r) {
    double mean = 0, sq = 0;
    for (int c = 0; c < 16; ++c) mean += y[static_cast<std::size_t>(r * 16 + c)] / 16;
    for (int c = 0; c < 16; ++c) sq += std::pow(y[static_cast<std::size_t>(r * 16 + c)] - mean, 2) / 16;
    BOOST_CHECK_SMALL(mean, 1e-5);
    BOOST_CHECK_CLOSE(sq, 1.0, 1e-3);
  }
}

BOOST_AUTO_TEST_CASE(layer_norm_applies_weight_and_bias) {
  nn::LayerNorm ln(nn::LayerNormOptions{.normalized_shape = {2}, .eps = 0.0, .dtype = F64});
  {
    ag::NoGradGuard g;
    ag::Tensor(ln.weight()).copy_(ag::tensor({2, 3}, {2}, F64));
    ag::Tensor(ln.bias()).copy_(ag::tensor({10, 20}, {2}, F64));
  }
  // x = [0, 4] normalises to [-1, 1]  =>  [-2 + 10, 3 + 20]
  const auto y = ln(ag::tensor({0, 4}, {2}, F64)).to_vector();
  BOOST_CHECK_CLOSE(y[0], 8.0, 1e-12);
  BOOST_CHECK_CLOSE(y[1], 23.0, 1e-12);
}

BOOST_AUTO_TEST_CASE(layer_norm_gradchecks_in_input_weight_and_bias) {
  ag::Generator gen(2);
  nn::LayerNorm ln(nn::LayerNormOptions{.normalized_shape = {5}, .dtype = F64});
  randomize(ln, 11);
  ag::Tensor x = ag::randn({2, 3, 5}, F64, gen).requires_grad_(true);
  ag::Tensor proj = ag::randn({2, 3, 5}, F64, gen);  // a random projection, so dy is not uniform
  check_gradients([&](const std::vector<ag::Tensor>& in) { return ag::sum(ag::mul(ln(in[0]), proj)); },
                  {x, ln.weight(), ln.bias()});
  // the full Jacobian too (non-scalar output)
  check_gradients([&](const std::vector<ag::Tensor>& in) { return ln(in[0]); }, {x, ln.weight(), ln.bias()});
}

BOOST_AUTO_TEST_CASE(layer_norm_over_two_dims_and_without_affine_gradchecks) {
  ag::Generator gen(4);
  ag::Tensor x = ag::randn({3, 2, 4}, F64, gen).requires_grad_(true);
  nn::LayerNorm ln(nn::LayerNormOptions{.normalized_shape = {2, 4}, .dtype = F64});
  randomize(ln, 5);
  check_gradients([&](const std::vector<ag::Tensor>& in) { return ln(in[0]); }, {x, ln.weight(), ln.bias()});
  nn::LayerNorm plain(nn::LayerNormOptions{.normalized_shape = {4}, .elementwise_affine = false, .dtype = F64});
  BOOST_CHECK_EQUAL(plain.num_parameters(), 0);
  check_gradients([&](const std::vector<ag::Tensor>& in) { return plain(in[0]); }, {x});
}

BOOST_AUTO_TEST_CASE(layer_norm_rejects_a_mismatched_input) {
  nn::LayerNorm ln(4);
  check_message([&] { ln(ag::zeros({2, 3})); }, "layer_norm: input [2, 3] does not end with normalized_shape [4]");
  check_message([&] { ln(ag::zeros({2, 4}, F64)); }, "layer_norm: dtypes differ");
}

BOOST_AUTO_TEST_CASE(layer_norm_with_eps_zero_refuses_a_constant_row_with_and_without_hooks) {
  nn::LayerNorm ln(nn::LayerNormOptions{.normalized_shape = {3}, .eps = 0.0, .dtype = F64});
  const ag::Tensor x = ag::tensor({1.0, 2.0, 4.0, 5.0, 5.0, 5.0}, {2, 3}, F64);
  const std::string message = "layer_norm: with eps = 0, row 1 of the input [2, 3] (normalized_shape [3]) has zero variance";
  check_message([&] { ln(x); }, message);
  const auto handle = ln.add_hook("scale", [](const ag::Tensor& v, const std::string&) { return v; });
  check_message([&] { ln(x); }, message);  // the composed form that hooks run
  // Rows that vary normalise with eps = 0.
  BOOST_TEST(test_support::all_finite(ln(ag::narrow(x, 0, 0, 1))));
}

BOOST_AUTO_TEST_CASE(layer_norm_with_a_scale_hook_equals_the_plain_layer_on_rows_far_from_one) {
  // The hooked form is composed from ops; rows whose squares overflow or underflow the dtype must
  // still give the plain layer's values and gradients (rows {1, -2, 3, 0.5}·m).
  const std::vector<std::pair<ag::Dtype, double>> cases = {
      {F64, 1e154}, {F64, 1e300}, {F64, 1e-200}, {ag::Dtype::Float32, 1.8e19}, {ag::Dtype::Float32, 1e38},
      {ag::Dtype::Float32, 1e-30}, {F64, 1.0}};
  for (const auto& [dtype, m] : cases) {
    BOOST_TEST_CONTEXT(ag::dtype_name(dtype) << ", m = " << m) {
      nn::LayerNorm ln(nn::LayerNormOptions{.normalized_shape = {4}, .dtype = dtype});
      const std::vector<double> row = {1.0 * m, -2.0 * m, 3.0 * m, 0.5 * m};
      ag::Tensor x = ag::tensor(row, {1, 4}, dtype).requires_grad_();
      const ag::Tensor w = ag::tensor({0.3, -1.0, 2.0, 0.7}, {1, 4}, dtype);
      const ag::Tensor plain = ln(x);
      const ag::Tensor plain_grad = ag::grad({ag::sum(ag::mul(plain, w))}, {x})[0];
      const auto handle = ln.add_hook("scale", [](const ag::Tensor& v, const std::string&) { return v; });
      const ag::Tensor hooked = ln(x);
      const ag::Tensor hooked_grad = ag::grad({ag::sum(ag::mul(hooked, w))}, {x})[0];
      const double tol = dtype == F64 ? 1e-12 : 1e-5;
      test_support::check_values(hooked, {1, 4}, plain.to_vector(), tol);
      const std::vector<double> g = plain_grad.to_vector();
      BOOST_TEST(test_support::all_finite(hooked_grad));
      const double gscale = std::abs(g[0]) + std::abs(g[1]) + std::abs(g[2]) + std::abs(g[3]);
      for (std::size_t i = 0; i < 4; ++i)
        BOOST_TEST(std::abs(hooked_grad.to_vector()[i] - g[i]) <= tol * gscale, "element " << i);
    }
  }
}

BOOST_AUTO_TEST_CASE(a_float32_layer_norm_refuses_an_eps_that_rounds_to_zero) {
  check_message([] { nn::LayerNorm(nn::LayerNormOptions{.normalized_shape = {4}, .eps = 1e-46}); },
                "LayerNorm: eps = 1e-46 is 0 in Float32");
  nn::LayerNorm ok(nn::LayerNormOptions{.normalized_shape = {4}, .eps = 1e-46, .dtype = F64});  // float64 holds it
}

// ---- Embedding ----

BOOST_AUTO_TEST_CASE(embedding_returns_the_rows_of_its_table) {
  nn::Embedding emb(nn::EmbeddingOptions{.num_embeddings = 5, .embedding_dim = 3, .dtype = F64});
  BOOST_CHECK(emb.weight().shape() == (ag::Shape{5, 3}));
  const auto table = emb.weight().to_vector();
  const ag::Tensor idx = ag::tensor({4, 0, 4, 2}, {2, 2});
  const ag::Tensor out = emb(idx);
  BOOST_REQUIRE(out.shape() == (ag::Shape{2, 2, 3}));
  const auto v = out.to_vector();
  const std::vector<int> rows = {4, 0, 4, 2};
  for (std::size_t i = 0; i < 4; ++i)
    for (std::size_t c = 0; c < 3; ++c) BOOST_CHECK_EQUAL(v[i * 3 + c], table[static_cast<std::size_t>(rows[i]) * 3 + c]);
}

BOOST_AUTO_TEST_CASE(embedding_gradient_adds_up_over_repeated_indices) {
  nn::Embedding emb(nn::EmbeddingOptions{.num_embeddings = 4, .embedding_dim = 2, .dtype = F64});
  const ag::Tensor idx = ag::tensor({1, 3, 1}, {3});
  ag::sum(emb(idx)).backward();
  BOOST_CHECK(emb.weight().grad().to_vector() == (std::vector<double>{0, 0, 2, 2, 0, 0, 1, 1}));
  ag::Generator gen(9);
  ag::Tensor proj = ag::randn({3, 2}, F64, gen);
  check_gradients([&](const std::vector<ag::Tensor>&) { return ag::sum(ag::mul(emb(idx), proj)); }, {emb.weight()});
}

BOOST_AUTO_TEST_CASE(embedding_is_seeded_by_its_generator) {
  ag::Generator g1(42), g2(42);
  nn::Embedding a(nn::EmbeddingOptions{7, 3}, g1), b(nn::EmbeddingOptions{7, 3}, g2);
  BOOST_CHECK(a.weight().to_vector() == b.weight().to_vector());
}

// ---- activations and Sequential ----

BOOST_AUTO_TEST_CASE(relu_and_gelu_modules_apply_their_functions) {
  const ag::Tensor x = ag::tensor({-1.5, 0.5, 2.0}, {3}, F64);
  BOOST_CHECK(nn::ReLU()(x).to_vector() == (std::vector<double>{0.0, 0.5, 2.0}));
  const auto g = nn::GELU()(x).to_vector();
  // x·Φ(x), Φ(x) = (1 + erf(x/√2))/2
  for (std::size_t i = 0; i < 3; ++i) {
    const double xi = x.to_vector()[i];
    BOOST_CHECK_CLOSE(g[i], xi * 0.5 * (1 + std::erf(xi / std::sqrt(2.0))), 1e-10);
  }
  const auto t = nn::GELU(ag::GeluApproximation::Tanh)(x).to_vector();
  check_throws<std::invalid_argument>([] { nn::GELU(static_cast<ag::GeluApproximation>(7)); },
                                      {"GELU: approximate must be GeluApproximation::None or Tanh, got 7"});
  const double xi = 2.0;
  BOOST_CHECK_CLOSE(t[2], 0.5 * xi * (1 + std::tanh(std::sqrt(2 / M_PI) * (xi + 0.044715 * xi * xi * xi))), 1e-10);
}

BOOST_AUTO_TEST_CASE(activations_gradcheck) {
  ag::Tensor x = ag::tensor({-1.5, -0.3, 0.4, 2.0}, {4}, F64).requires_grad_(true);  // away from relu's kink
  check_gradients([](const std::vector<ag::Tensor>& in) { return nn::ReLU()(in[0]); }, {x});
  check_gradients([](const std::vector<ag::Tensor>& in) { return nn::GELU()(in[0]); }, {x});
  check_gradients([](const std::vector<ag::Tensor>& in) { return nn::GELU(ag::GeluApproximation::Tanh)(in[0]); }, {x});
}

BOOST_AUTO_TEST_CASE(sequential_applies_modules_in_order_and_names_them_by_index) {
  ag::Generator gen(3);
  auto fc1 = std::make_shared<nn::Linear>(nn::LinearOptions{4, 6, true, F64}, gen);
  auto fc2 = std::make_shared<nn::Linear>(nn::LinearOptions{6, 2, true, F64}, gen);
  nn::Sequential seq(fc1, std::make_shared<nn::GELU>(), fc2);
  BOOST_CHECK_EQUAL(seq.size(), 3u);
  const std::vector<std::string> want = {"0.weight", "0.bias", "2.weight", "2.bias"};
  BOOST_CHECK(names_of(seq) == want);
  BOOST_CHECK_EQUAL(seq.num_parameters(), 4 * 6 + 6 + 6 * 2 + 2);
  ag::Tensor x = ag::randn({3, 4}, F64, gen).requires_grad_(true);
  const auto by_hand = fc2->forward(ag::gelu(fc1->forward(x))).to_vector();
  BOOST_CHECK(seq(x).to_vector() == by_hand);
  check_gradients([&](const std::vector<ag::Tensor>& in) { return seq(in[0]); },
                  {x, fc1->weight(), fc1->bias(), fc2->weight(), fc2->bias()});
}

// ---- TransformerBlock ----

BOOST_AUTO_TEST_CASE(transformer_block_has_ln_attn_ln_mlp_in_order) {
  ag::Generator gen(5);
  nn::TransformerBlock block(nn::TransformerBlockOptions{.d_model = 8, .num_heads = 2}, gen);
  const std::vector<std::string> want = {"ln_1.weight", "ln_1.bias", "attn.W_Q", "attn.W_K", "attn.W_V", "attn.W_O",
                                         "attn.b_Q", "attn.b_K", "attn.b_V", "attn.b_O", "ln_2.weight", "ln_2.bias",
                                         "fc_1.weight", "fc_1.bias", "fc_2.weight", "fc_2.bias"};
  BOOST_CHECK(names_of(block) == want);
  // 2 LayerNorms (2·8 each) + attention (4·8² + 4·8) + MLP (8·32 + 32 + 32·8 + 8)
  BOOST_CHECK_EQUAL(block.num_parameters(), 2 * 16 + (4 * 64 + 32) + (256 + 32 + 256 + 8));
}

BOOST_AUTO_TEST_CASE(transformer_block_adds_both_branches_into_the_residual_stream) {
  ag::Generator gen(6);
  nn::TransformerBlock block(nn::TransformerBlockOptions{.d_model = 4, .num_heads = 2, .dtype = F64}, gen);
  ag::Tensor x = ag::randn({2, 3, 4}, F64, gen);
  {
    // With both branches' output layers zeroed, the block is the identity: x + 0 + 0.
    ag::NoGradGuard g;
    ag::Tensor(block.attn().W_O()).zero_();
    ag::Tensor(block.attn().b_O()).zero_();
    ag::Tensor(block.fc_2().weight()).zero_();
    ag::Tensor(block.fc_2().bias()).zero_();
  }
  BOOST_CHECK(block(x).to_vector() == x.to_vector());
  {
    // With only the MLP zeroed, the output is x + attention(ln_1(x)).
    ag::NoGradGuard g;
    randomize(block.attn(), 8);
  }
  const auto h = block.ln_1()(x);
  const auto attn = block.attn().forward(h, h, h).output;
  const auto want = ag::add(x, attn).to_vector();
  const auto got = block(x).to_vector();
  for (std::size_t i = 0; i < got.size(); ++i) BOOST_CHECK_CLOSE(got[i], want[i], 1e-10);
}

BOOST_AUTO_TEST_CASE(transformer_block_gradchecks_in_input_and_every_parameter) {
  ag::Generator gen(7);
  nn::TransformerBlock block(nn::TransformerBlockOptions{.d_model = 4, .num_heads = 2, .d_ff = 6, .dtype = F64}, gen);
  randomize(block, 12);
  ag::Tensor x = ag::randn({2, 3, 4}, F64, gen).requires_grad_(true);
  ag::Tensor proj = ag::randn({2, 3, 4}, F64, gen);
  std::vector<ag::Tensor> inputs{x};
  for (auto& p : block.parameters()) inputs.push_back(p);
  check_gradients([&](const std::vector<ag::Tensor>& in) { return ag::sum(ag::mul(block(in[0]), proj)); }, inputs);
  // causal, with the weights returned
  nn::AttentionOptions causal;
  causal.is_causal = true;
  check_gradients([&](const std::vector<ag::Tensor>& in) { return ag::sum(ag::mul(block.forward(in[0], causal).output, proj)); },
                  inputs);
}

BOOST_AUTO_TEST_CASE(transformer_block_returns_per_head_weights_on_request) {
  nn::TransformerBlock block(8, 2);
  nn::AttentionOptions opt;
  opt.average_attn_weights = false;
  const auto out = block.forward(ag::zeros({3, 5, 8}), opt);
  BOOST_CHECK(out.output.shape() == (ag::Shape{3, 5, 8}));
  BOOST_CHECK(out.weights.shape() == (ag::Shape{3, 2, 5, 5}));
}
