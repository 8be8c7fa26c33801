// Second derivatives through nn::MultiHeadAttention on both cores (the fused op, packed or
// heads-last, and the composed one) and through nn::TransformerBlock: gradgradcheck through the
// inputs and every parameter (float64, default tolerances) with each mask kind, dropout with a
// fixed mask, add_bias_kv / add_zero_attn, kdim / vdim and need_weights on and off; and the two
// cores' Hessian-vector products and gradient-penalty gradients agreeing to 1e-12.
#define BOOST_TEST_MODULE double_backward_mha
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <nn/nn.hpp>

#include "test_support.hpp"

using namespace test_support::prelude;
using test_support::all_finite;
using test_support::max_abs_diff;
using nn::AttentionCore;

namespace {

struct Case {
  std::string name;
  std::int64_t E = 4, H = 2, B = 2, T = 3, S = 3, kdim = 0, vdim = 0;
  bool self_attention = false;
  bool add_bias_kv = false, add_zero_attn = false;
  bool padding = false;       // the last key of batch 0 is padding
  int attn_mask = 0;          // 0: none, 2: (T, S), 3: (B·H, T, S); random values, some -inf
  bool causal = false;
  bool blocked_rows = false;  // batch B-1 all padding, and query row 1 fully -inf in attn_mask
  double dropout = 0.0;       // drawn from a generator reseeded at every evaluation
  bool need_weights = true;   // per head (average_attn_weights = false)
};

const std::vector<Case> kCases = [] {
  std::vector<Case> cs;
  Case c;
  c.name = "no_masks"; cs.push_back(c);
  c.need_weights = false; c.name = "no_masks_no_weights"; cs.push_back(c);
  c = Case{}; c.name = "self_packed"; c.self_attention = true; cs.push_back(c);
  c = Case{}; c.name = "self_packed_causal_mask_3d_padding"; c.self_attention = true; c.causal = true; c.attn_mask = 3; c.padding = true; cs.push_back(c);
  c = Case{}; c.name = "cross_kdim_vdim_padding"; c.E = 4; c.S = 4; c.kdim = 3; c.vdim = 2; c.padding = true; cs.push_back(c);
  c = Case{}; c.name = "mask_2d"; c.S = 4; c.attn_mask = 2; cs.push_back(c);
  c = Case{}; c.name = "mask_3d_causal"; c.attn_mask = 3; c.causal = true; cs.push_back(c);
  c = Case{}; c.name = "bias_kv_zero_attn_causal_padding"; c.add_bias_kv = true; c.add_zero_attn = true; c.causal = true; c.padding = true; cs.push_back(c);
  c = Case{}; c.name = "blocked_rows"; c.S = 4; c.attn_mask = 2; c.blocked_rows = true; cs.push_back(c);
  c = Case{}; c.name = "dropout_mask_2d"; c.S = 4; c.attn_mask = 2; c.dropout = 0.4; cs.push_back(c);
  c = Case{}; c.name = "self_dropout_causal_no_weights"; c.self_attention = true; c.causal = true; c.dropout = 0.3; c.need_weights = false; cs.push_back(c);
  return cs;
}();

const Case& case_named(const std::string& name) {
  for (const auto& c : kCases)
    if (c.name == name) return c;
  throw std::runtime_error("no case " + name);
}

void set(const Tensor& param, const Tensor& values) {
  ag::NoGradGuard no_grad;
  Tensor p = param;
  p.copy_(values);
}

struct Setup {
  std::shared_ptr<nn::MultiHeadAttention> mha;
  Tensor query, key, value;
  nn::AttentionOptions ao;
  TensorList inputs;  // query, key, value (once each), then every parameter
};

Setup make_setup(const Case& c, AttentionCore core, std::uint64_t seed = 1) {
  ag::Generator gen(seed);
  nn::MultiHeadAttentionOptions opt{c.E, c.H, c.dropout, true, c.kdim, c.vdim, c.add_bias_kv, c.add_zero_attn};
  opt.dtype = F64;
  opt.core = core;
  Setup s;
  s.mha = std::make_shared<nn::MultiHeadAttention>(opt, gen);
  // Nonzero biases of a useful size (the initialisation leaves them 0).
  for (auto& [name, p] : s.mha->named_parameters()) set(p, ag::randn(p.shape(), F64, gen) * 0.5);
  s.query = ag::randn({c.B, c.T, c.E}, F64, gen).requires_grad_();
  if (c.self_attention) {
    s.key = s.value = s.query;
  } else {
    s.key = ag::randn({c.B, c.S, c.kdim ? c.kdim : c.E}, F64, gen).requires_grad_();
    s.value = ag::randn({c.B, c.S, c.vdim ? c.vdim : c.E}, F64, gen).requires_grad_();
  }
  const std::int64_t S = c.self_attention ? c.T : c.S;
  if (c.padding || c.blocked_rows) {
    std::vector<double> kpm(static_cast<std::size_t>(c.B * S), 0.0);
    if (c.padding) kpm[static_cast<std::size_t>(S - 1)] = 1.0;
    if (c.blocked_rows)
      for (std::int64_t j = 0; j < S; ++j) kpm[static_cast<std::size_t>((c.B - 1) * S + j)] = 1.0;
    s.ao.key_padding_mask = ag::tensor(kpm, {c.B, S}, F64);
  }
  if (c.attn_mask) {
    const Shape shape = c.attn_mask == 2 ? Shape{c.T, S} : Shape{c.B * c.H, c.T, S};
    std::vector<double> m = ag::randn(shape, F64, gen).to_vector();
    for (std::size_t i = 0; i < m.size(); ++i) {
      const std::int64_t j = static_cast<std::int64_t>(i) % S, row = (static_cast<std::int64_t>(i) / S) % c.T;
      if (j != 0 && gen.uniform() < 0.3) m[i] = -kInf;  // key 0 stays visible ...
      if (c.blocked_rows && row == 1) m[i] = -kInf;     // ... except in row 1 when asked
    }
    s.ao.attn_mask = ag::tensor(m, shape, F64);
  }
  s.ao.is_causal = c.causal;
  s.ao.need_weights = c.need_weights;
  s.ao.average_attn_weights = false;
  s.inputs = {s.query};
  if (!s.key.is_same(s.query)) s.inputs.push_back(s.key);
  if (!s.value.is_same(s.query)) s.inputs.push_back(s.value);
  for (auto& p : s.mha->parameters()) s.inputs.push_back(p);
  return s;
}

Tensor flat(const Tensor& t) { return ag::reshape(t, {-1}); }

// The layer's results laid end to end (the weights per head, when asked for); the module reads
// its parameters itself, and gradgradcheck perturbs them in place. Same dropout mask every time.
ag::GradcheckFn mha_fn(const Setup& s) {
  return [s](const TensorList&) {
    s.mha->dropout_generator().manual_seed(5);
    const nn::AttentionOutput r = s.mha->forward(s.query, s.key, s.value, s.ao);
    return r.weights.defined() ? ag::cat({flat(r.output), flat(r.weights)}, 0) : flat(r.output);
  };
}

const char* core_name(AttentionCore core) { return core == AttentionCore::Fused ? "fused" : "composed"; }

void check_gradgrad(const Case& c) {
  for (AttentionCore core : {AttentionCore::Fused, AttentionCore::Composed}) {
    const Setup s = make_setup(c, core);
    const ag::GradcheckResult r = ag::gradgradcheck(mha_fn(s), s.inputs);
    BOOST_TEST(r.ok, c.name << " " << core_name(core) << ": " << fmt::format("{}", r));
    BOOST_TEST_MESSAGE(fmt::format("gradgradcheck MultiHeadAttention {} {}: worst abs error {:.3g}, rel {:.3g}",
                                   c.name, core_name(core), r.max_abs_error, r.max_rel_error));
  }
}

// A scalar loss, nonlinear in the output and the weights: Σ tanh(out)·R1 + Σ weights²·R2.
ag::GradcheckFn loss_fn(const Setup& s) {
  return [s](const TensorList&) {
    s.mha->dropout_generator().manual_seed(5);
    const nn::AttentionOutput r = s.mha->forward(s.query, s.key, s.value, s.ao);
    ag::Generator gen(77);
    Tensor loss = ag::sum(ag::tanh(r.output) * ag::randn(r.output.shape(), F64, gen));
    if (r.weights.defined()) loss = loss + ag::sum(ag::square(r.weights) * ag::randn(r.weights.shape(), F64, gen));
    return loss;
  };
}

TensorList random_like(const TensorList& xs, std::uint64_t seed) {
  ag::Generator gen(seed);
  TensorList v;
  for (const Tensor& x : xs) v.push_back(ag::randn(x.shape(), F64, gen));
  return v;
}

TensorList penalty_gradient(const ag::GradcheckFn& loss, const TensorList& x) {
  const TensorList g = ag::grad({loss(x)}, x, {.create_graph = true});
  Tensor penalty = ag::sum(ag::square(g[0]));
  for (std::size_t i = 1; i < g.size(); ++i) penalty = penalty + ag::sum(ag::square(g[i]));
  return ag::grad({penalty}, x);
}

// The same layer (same parameters, inputs, masks and dropout draws) on both cores: their Hessian-
// vector products and gradient-penalty gradients agree to 1e-12.
void check_cores_agree(const Case& c) {
  const Setup fused = make_setup(c, AttentionCore::Fused), composed = make_setup(c, AttentionCore::Composed);
  const TensorList v = random_like(fused.inputs, 21);
  const TensorList hf = ag::hvp(loss_fn(fused), fused.inputs, v), hc = ag::hvp(loss_fn(composed), composed.inputs, v);
  const TensorList pf = penalty_gradient(loss_fn(fused), fused.inputs);
  const TensorList pc = penalty_gradient(loss_fn(composed), composed.inputs);
  for (std::size_t i = 0; i < hf.size(); ++i) {
    BOOST_TEST(all_finite(hf[i]), c.name << ": Hv of input " << i);
    BOOST_TEST(max_abs_diff(hf[i], hc[i]) <= 1e-12, c.name << ": Hv of input " << i);
    BOOST_TEST(max_abs_diff(pf[i], pc[i]) <= 1e-12, c.name << ": penalty gradient of input " << i);
  }
}

}  // namespace

#define CASE_TESTS(name)                                                                \
  BOOST_AUTO_TEST_CASE(gradgradcheck_##name) { check_gradgrad(case_named(#name)); }     \
  BOOST_AUTO_TEST_CASE(cores_agree_in_second_order_##name) { check_cores_agree(case_named(#name)); }

BOOST_AUTO_TEST_SUITE(multihead_attention)
CASE_TESTS(no_masks)
CASE_TESTS(no_masks_no_weights)
CASE_TESTS(self_packed)
CASE_TESTS(self_packed_causal_mask_3d_padding)
CASE_TESTS(cross_kdim_vdim_padding)
CASE_TESTS(mask_2d)
CASE_TESTS(mask_3d_causal)
CASE_TESTS(bias_kv_zero_attn_causal_padding)
CASE_TESTS(blocked_rows)
CASE_TESTS(dropout_mask_2d)
CASE_TESTS(self_dropout_causal_no_weights)
BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(transformer_block)

// A small block (d_model 4, 2 heads, d_ff 6) on both cores, causal, with attention dropout and
// GELU or ReLU: gradgradcheck through the input and every parameter.
BOOST_AUTO_TEST_CASE(gradgradcheck_through_every_parameter) {
  for (bool gelu : {true, false})
    for (AttentionCore core : {AttentionCore::Fused, AttentionCore::Composed}) {
      ag::Generator gen(3);
      nn::TransformerBlockOptions opt{.d_model = 4, .num_heads = 2, .d_ff = 6, .dropout = 0.25, .gelu = gelu};
      opt.dtype = F64;
      auto block = std::make_shared<nn::TransformerBlock>(opt, gen);
      block->attn().set_core(core);
      for (auto& [name, p] : block->named_parameters()) set(p, p + ag::randn(p.shape(), F64, gen) * 0.3);
      Tensor x = ag::randn({2, 3, 4}, F64, gen).requires_grad_();
      TensorList inputs{x};
      for (auto& p : block->parameters()) inputs.push_back(p);
      nn::AttentionOptions ao;
      ao.is_causal = true;
      ao.average_attn_weights = false;
      const auto fn = [block, x, ao](const TensorList&) {
        block->attn().dropout_generator().manual_seed(8);
        const nn::TransformerBlockOutput r = block->forward(x, ao);
        return ag::cat({flat(r.output), flat(r.weights)}, 0);
      };
      const ag::GradcheckResult r = ag::gradgradcheck(fn, inputs);
      BOOST_TEST(r.ok, core_name(core) << (gelu ? " gelu: " : " relu: ") << fmt::format("{}", r));
      BOOST_TEST_MESSAGE(fmt::format("gradgradcheck TransformerBlock {} {}: worst abs error {:.3g}, rel {:.3g}",
                                     core_name(core), gelu ? "gelu" : "relu", r.max_abs_error, r.max_rel_error));
    }
}

BOOST_AUTO_TEST_SUITE_END()
