// nn::functional::multi_head_attention_forward (the layer as a free function) against the
// module, its weight checks, and hostile input to the layer: masks holding NaN or +inf, every key
// blocked, zero-length sequences and batches, parameters too large to count.
#define BOOST_TEST_MODULE mha_functional
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <functional>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include <nn/nn.hpp>

#include "test_support.hpp"

namespace ag = autograd;
using test_support::all_finite;
namespace F = nn::functional;
using nn::AttentionCore;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr ag::Dtype F64 = ag::Dtype::Float64;

using test_support::message_has;

ag::Tensor randn64(const ag::Shape& shape, std::uint64_t seed) {
  ag::Generator gen(seed);
  return ag::randn(shape, F64, gen);
}

nn::MultiHeadAttention make_mha(AttentionCore core, bool bias_kv = false, bool zero_attn = false) {
  ag::Generator gen(11);
  nn::MultiHeadAttention mha({.embed_dim = 4, .num_heads = 2, .add_bias_kv = bias_kv, .add_zero_attn = zero_attn,
                              .core = core, .dtype = F64},
                             gen);
  for (ag::Tensor p : mha.parameters()) {  // nonzero biases, so that out = b_O is a real check
    ag::NoGradGuard no_grad;
    if (p.dim() == 1) p.copy_(randn64(p.shape(), 3));
  }
  return mha;
}

F::MultiHeadAttentionConfig config_of(const nn::MultiHeadAttention& mha) {
  F::MultiHeadAttentionConfig c;
  c.num_heads = mha.num_heads();
  c.add_zero_attn = mha.options().add_zero_attn;
  c.core = mha.core();
  return c;
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_functional_form_gives_the_modules_results_bit_for_bit) {
  for (auto core : {AttentionCore::Fused, AttentionCore::Composed})
    for (bool bias_kv : {false, true})
      for (bool self : {false, true}) {
        nn::MultiHeadAttention mha = make_mha(core, bias_kv, bias_kv);
        const ag::Tensor x = randn64({2, 3, 4}, 1).requires_grad_(), y = randn64({2, 3, 4}, 2);
        nn::AttentionOptions ao;
        ao.key_padding_mask = ag::tensor({0, 0, 1, 0, 0, 0}, {2, 3});
        ao.attn_mask = randn64({3, 3}, 4);
        ao.is_causal = true;
        ao.average_attn_weights = false;
        const ag::Tensor& kv = self ? x : y;
        const nn::AttentionOutput a = mha(x, kv, kv, ao);
        ag::sum(a.output).backward();
        const std::vector<double> dx_module = x.grad().to_vector();
        x.grad().zero_();
        const nn::AttentionOutput b = F::multi_head_attention_forward(x, kv, kv, mha.functional_weights(), config_of(mha), ao);
        ag::sum(b.output).backward();
        BOOST_TEST(a.output.to_vector() == b.output.to_vector());
        BOOST_TEST(a.weights.to_vector() == b.weights.to_vector());
        BOOST_TEST(dx_module == x.grad().to_vector());
      }
}

BOOST_AUTO_TEST_CASE(the_functional_form_takes_weights_without_a_module) {
  // W_Q = W_K = W_V = W_O = I, only an output bias: out = attention(x, x, x) + b_O.
  const ag::Tensor I = ag::tensor({1, 0, 0, 1}, {2, 2}, F64);
  F::MultiHeadAttentionWeights w;
  w.W_Q = w.W_K = w.W_V = w.W_O = I;
  w.b_O = ag::tensor({10, 20}, {2}, F64);
  const ag::Tensor x = ag::tensor({1, 0, 0, 1}, {2, 2}, F64);  // unbatched: T = 2, E = 2
  const nn::AttentionOutput r = F::multi_head_attention_forward(x, x, x, w, {});
  // one head, d_k = 2: scores [[1, 0], [0, 1]] / √2, so row 0 weights [p, 1-p] with p = σ(1/√2)
  const double p = 1.0 / (1.0 + std::exp(-1.0 / std::sqrt(2.0)));
  const std::vector<double> want{p + 10, 1 - p + 20, 1 - p + 10, p + 20}, got = r.output.to_vector();
  BOOST_REQUIRE_EQUAL(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) BOOST_TEST(std::abs(got[i] - want[i]) < 1e-15);
  BOOST_TEST(ag::shape_str(r.weights.shape()) == "[2, 2]");
}

BOOST_AUTO_TEST_CASE(weights_that_do_not_fit_together_throw_naming_them) {
  const nn::MultiHeadAttention mha = make_mha(AttentionCore::Fused);
  const ag::Tensor x = randn64({2, 3, 4}, 1);
  auto call = [&](const F::MultiHeadAttentionWeights& w, F::MultiHeadAttentionConfig c) {
    F::multi_head_attention_forward(x, x, x, w, c);
  };
  const F::MultiHeadAttentionConfig c = config_of(mha);
  auto w = mha.functional_weights();
  w.W_Q = randn64({4, 3}, 5);
  BOOST_CHECK_EXCEPTION(call(w, c), std::invalid_argument,
                        [](const auto& e) { return message_has(e, {"MultiHeadAttention", "W_Q", "[4, 3]"}); });
  w = mha.functional_weights();
  w.W_K = randn64({4, 5}, 5);
  BOOST_CHECK_EXCEPTION(call(w, c), std::invalid_argument,
                        [](const auto& e) { return message_has(e, {"W_K", "[4, 5]", "[4, 4]"}); });
  w = mha.functional_weights();
  w.W_O = ag::Tensor();
  BOOST_CHECK_EXCEPTION(call(w, c), std::invalid_argument,
                        [](const auto& e) { return message_has(e, {"W_O", "undefined"}); });
  w = mha.functional_weights();
  w.b_V = randn64({3}, 5);
  BOOST_CHECK_EXCEPTION(call(w, c), std::invalid_argument, [](const auto& e) { return message_has(e, {"b_V", "[3]"}); });
  w = mha.functional_weights();
  w.bias_k = randn64({4}, 5);
  BOOST_CHECK_EXCEPTION(call(w, c), std::invalid_argument,
                        [](const auto& e) { return message_has(e, {"bias_k and bias_v"}); });
  w = mha.functional_weights();
  w.W_O = w.W_O.to(ag::Dtype::Float32);
  BOOST_CHECK_EXCEPTION(call(w, c), std::invalid_argument,
                        [](const auto& e) { return message_has(e, {"W_O", "Float32", "Float64"}); });
  w = mha.functional_weights();
  F::MultiHeadAttentionConfig bad = c;
  bad.num_heads = 3;
  BOOST_CHECK_EXCEPTION(call(w, bad), std::invalid_argument,
                        [](const auto& e) { return message_has(e, {"embed_dim 4", "num_heads 3"}); });
  bad.num_heads = 0;
  BOOST_CHECK_EXCEPTION(call(w, bad), std::invalid_argument, [](const auto& e) { return message_has(e, {"num_heads"}); });
  bad = c;
  bad.dropout_p = 1.0;
  BOOST_CHECK_EXCEPTION(call(w, bad), std::invalid_argument, [](const auto& e) { return message_has(e, {"dropout", "1"}); });
}

BOOST_AUTO_TEST_CASE(a_key_padding_mask_holding_nan_throws_on_both_cores) {
  for (auto core : {AttentionCore::Fused, AttentionCore::Composed}) {
    nn::MultiHeadAttention mha = make_mha(core);
    const ag::Tensor x = randn64({2, 3, 4}, 1);
    nn::AttentionOptions ao;
    ao.key_padding_mask = ag::tensor({0, std::nan(""), 0, 0, 0, 0}, {2, 3});
    BOOST_CHECK_EXCEPTION(mha(x, x, x, ao), std::invalid_argument, [](const auto& e) {
      return message_has(e, {"MultiHeadAttention", "key_padding_mask", "[2, 3]", "NaN"});
    });
  }
}

BOOST_AUTO_TEST_CASE(an_attn_mask_holding_nan_or_plus_inf_throws_on_both_cores) {
  for (auto core : {AttentionCore::Fused, AttentionCore::Composed})
    for (double bad : {std::nan(""), kInf}) {
      nn::MultiHeadAttention mha = make_mha(core);
      const ag::Tensor x = randn64({2, 3, 4}, 1);
      nn::AttentionOptions ao;
      ao.attn_mask = ag::tensor({0, 0, 0, 0, bad, 0, -kInf, 0, 0}, {3, 3}, F64);
      const std::string what = std::isnan(bad) ? "NaN" : "+inf";
      BOOST_CHECK_EXCEPTION(mha(x, x, x, ao), std::invalid_argument, [&](const auto& e) {
        return message_has(e, {"MultiHeadAttention", "attn_mask", "[3, 3]", what});
      });
      ao.attn_mask = ag::tensor({0, 0, 0, 0, -1e30, 0, -kInf, 0, 0}, {3, 3}, F64);  // finite and -inf: fine
      BOOST_CHECK(all_finite(mha(x, x, x, ao).output));
    }
}

BOOST_AUTO_TEST_CASE(every_key_padding_gives_out_b_O_and_zero_gradients) {
  for (auto core : {AttentionCore::Fused, AttentionCore::Composed}) {
    nn::MultiHeadAttention mha = make_mha(core);
    const ag::Tensor x = randn64({2, 3, 4}, 1).requires_grad_();
    nn::AttentionOptions ao;
    ao.key_padding_mask = ag::ones({2, 3});
    const nn::AttentionOutput r = mha(x, x, x, ao);
    ag::sum(r.output).backward();
    const std::vector<double> out = r.output.to_vector(), b_O = mha.b_O().to_vector();
    for (std::size_t i = 0; i < out.size(); ++i) BOOST_TEST(out[i] == b_O[i % 4]);
    for (double w : r.weights.to_vector()) BOOST_TEST(w == 0.0);
    for (double g : x.grad().to_vector()) BOOST_TEST(g == 0.0);
    BOOST_TEST(all_finite(mha.W_Q().grad()));
  }
}

BOOST_AUTO_TEST_CASE(zero_length_sequences_and_batches_give_empty_or_b_O_results) {
  for (auto core : {AttentionCore::Fused, AttentionCore::Composed}) {
    nn::MultiHeadAttention mha = make_mha(core);
    // no queries: an empty output, and nothing to backpropagate but zeros
    const ag::Tensor q0 = randn64({2, 0, 4}, 1).requires_grad_(), kv = randn64({2, 3, 4}, 2).requires_grad_();
    nn::AttentionOutput r = mha(q0, kv, kv);
    BOOST_TEST(ag::shape_str(r.output.shape()) == "[2, 0, 4]");
    BOOST_TEST(ag::shape_str(r.weights.shape()) == "[2, 0, 3]");
    ag::sum(r.output).backward();
    for (double g : kv.grad().to_vector()) BOOST_TEST(g == 0.0);
    // no keys: each query attends to nothing, so out = b_O (as when every key is padding)
    const ag::Tensor q = randn64({2, 3, 4}, 3), k0 = randn64({2, 0, 4}, 4);
    nn::AttentionOptions ao;
    ao.key_padding_mask = ag::zeros({2, 0});
    r = mha(q, k0, k0, ao);
    BOOST_TEST(ag::shape_str(r.weights.shape()) == "[2, 3, 0]");
    const std::vector<double> out = r.output.to_vector(), b_O = mha.b_O().to_vector();
    for (std::size_t i = 0; i < out.size(); ++i) BOOST_TEST(out[i] == b_O[i % 4]);
    // an empty batch, causal self-attention
    ao = {};
    ao.is_causal = true;
    const ag::Tensor e = randn64({0, 3, 4}, 5);
    BOOST_TEST(ag::shape_str(mha.forward(e, ao).output.shape()) == "[0, 3, 4]");
  }
}

BOOST_AUTO_TEST_CASE(a_parameter_too_large_to_count_throws_naming_it) {
  // kdim = 2^62 with E = 4: W_K's element count 2^64 would wrap to 0 and make an empty buffer.
  nn::MultiHeadAttentionOptions o{4, 2};
  o.kdim = std::int64_t{1} << 62;
  BOOST_CHECK_EXCEPTION(nn::MultiHeadAttention{o}, std::invalid_argument, [](const auto& e) {
    return message_has(e, {"MultiHeadAttention", "W_K", "[4611686018427387904, 4]", "too large"});
  });
  BOOST_CHECK_EXCEPTION(nn::MultiHeadAttention(std::int64_t{1} << 32, 1), std::invalid_argument,
                        [](const auto& e) { return message_has(e, {"W_Q", "[4294967296, 4294967296]"}); });
}

BOOST_AUTO_TEST_CASE(masks_of_either_dtype_mean_the_same_and_a_float_mask_takes_its_gradient) {
  for (auto core : {AttentionCore::Fused, AttentionCore::Composed}) {
    nn::MultiHeadAttention mha = make_mha(core);
    const ag::Tensor x = randn64({2, 3, 4}, 1);
    nn::AttentionOptions a, b;
    a.key_padding_mask = ag::tensor({0, 1, 0, 0, 0, 1}, {2, 3}, ag::Dtype::Float32);
    b.key_padding_mask = a.key_padding_mask.to(F64);
    a.attn_mask = ag::tensor({0, -1, 0.5, 0, -kInf, 0, 2, 0, 0}, {3, 3}, ag::Dtype::Float32);
    b.attn_mask = a.attn_mask.to(F64).requires_grad_();
    const nn::AttentionOutput ra = mha(x, x, x, a), rb = mha(x, x, x, b);
    BOOST_TEST(ra.output.to_vector() == rb.output.to_vector());
    ag::sum(rb.output).backward();
    // A float mask that requires grad gets its gradient, as in PyTorch (its values: test_mha_mask_grad.cpp)
    BOOST_TEST(b.attn_mask.grad().defined());
    BOOST_TEST(!a.attn_mask.grad().defined());
  }
}

BOOST_AUTO_TEST_CASE(the_hook_callback_sees_every_point_in_order_and_may_replace_one) {
  nn::MultiHeadAttention mha = make_mha(AttentionCore::Fused, true, true);  // S' = S + 2
  const ag::Tensor x = randn64({2, 3, 4}, 1);
  std::vector<std::string> seen;
  std::vector<std::string> shapes;
  const std::function<ag::Tensor(const char*, const ag::Tensor&)> hooks = [&](const char* point, const ag::Tensor& v) {
    seen.emplace_back(point);
    shapes.push_back(ag::shape_str(v.shape()));
    if (std::string(point) == "z") return ag::zeros_like(v);  // every head removed: out = b_O
    return ag::Tensor();
  };
  F::MultiHeadAttentionConfig c = config_of(mha);
  c.hooks = &hooks;
  nn::AttentionOptions ao;
  ao.average_attn_weights = false;
  const nn::AttentionOutput r = F::multi_head_attention_forward(x, x, x, mha.functional_weights(), c, ao);
  const std::vector<std::string> want{"q", "k", "v", "raw_scores", "attn_scores", "pattern", "z", "concat", "out"};
  BOOST_TEST(seen == want, boost::test_tools::per_element());
  const std::vector<std::string> want_shapes{"[2, 2, 3, 2]", "[2, 2, 5, 2]", "[2, 2, 5, 2]", "[2, 2, 3, 5]",
                                             "[2, 2, 3, 5]", "[2, 2, 3, 5]", "[2, 2, 3, 2]", "[2, 3, 4]", "[2, 3, 4]"};
  BOOST_TEST(shapes == want_shapes, boost::test_tools::per_element());
  const auto out = r.output.to_vector(), b_O = mha.b_O().to_vector();
  for (std::size_t i = 0; i < out.size(); ++i) BOOST_TEST(out[i] == b_O[i % 4]);
  // A replacement of the wrong shape throws naming the point and both shapes.
  const std::function<ag::Tensor(const char*, const ag::Tensor&)> bad = [](const char* point, const ag::Tensor&) {
    return std::string(point) == "attn_scores" ? ag::zeros({2, 3, 5}, F64) : ag::Tensor();
  };
  c.hooks = &bad;
  try {
    F::multi_head_attention_forward(x, x, x, mha.functional_weights(), c, ao);
    BOOST_FAIL("no throw");
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(message_has(e, {"MultiHeadAttention", "'attn_scores'", "[2, 3, 5]", "[2, 2, 3, 5]"}));
  }
}
