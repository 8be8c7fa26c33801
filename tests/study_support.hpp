#pragma once
// A small float64 model shaped like train_heads' (token and position embeddings, one pre-LayerNorm
// transformer block or LayerNorm + attention, a final LayerNorm, a linear readout), for the tests of
// hook points, caches, interventions and the studying-attention page.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include <nn/nn.hpp>

#include "test_support.hpp"

namespace study_support {

namespace ag = autograd;
constexpr ag::Dtype F64 = ag::Dtype::Float64;

struct TinyOptions {
  std::int64_t vocab = 5, seq_len = 4, d_model = 4, heads = 2, d_ff = 8, classes = 5;
  bool mlp = true;  // a TransformerBlock "block"; else "ln_1" and "attn"
  std::uint64_t seed = 7;
};

struct TinyModel : nn::Module {
  std::shared_ptr<nn::Embedding> tok, pos;
  std::shared_ptr<nn::TransformerBlock> block;
  std::shared_ptr<nn::LayerNorm> ln_1;
  std::shared_ptr<nn::MultiHeadAttention> attn;
  std::shared_ptr<nn::LayerNorm> ln_f;
  std::shared_ptr<nn::Linear> readout;
  ag::Tensor positions;

  explicit TinyModel(const TinyOptions& o = {}) : Module("TinyModel") {
    ag::Generator gen(o.seed);
    tok = register_module("tok", std::make_shared<nn::Embedding>(nn::EmbeddingOptions{o.vocab, o.d_model, F64}, gen));
    pos = register_module("pos", std::make_shared<nn::Embedding>(nn::EmbeddingOptions{o.seq_len, o.d_model, F64}, gen));
    if (o.mlp) {
      block = register_module("block", std::make_shared<nn::TransformerBlock>(
                                           nn::TransformerBlockOptions{.d_model = o.d_model, .num_heads = o.heads,
                                                                       .d_ff = o.d_ff, .dtype = F64},
                                           gen));
    } else {
      ln_1 = register_module("ln_1", std::make_shared<nn::LayerNorm>(
                                         nn::LayerNormOptions{.normalized_shape = {o.d_model}, .dtype = F64}));
      nn::MultiHeadAttentionOptions mha;
      mha.embed_dim = o.d_model;
      mha.num_heads = o.heads;
      mha.dtype = F64;
      attn = register_module("attn", std::make_shared<nn::MultiHeadAttention>(mha, gen));
    }
    ln_f = register_module("ln_f", std::make_shared<nn::LayerNorm>(
                                       nn::LayerNormOptions{.normalized_shape = {o.d_model}, .dtype = F64}));
    readout = register_module("readout",
                              std::make_shared<nn::Linear>(nn::LinearOptions{o.d_model, o.classes, true, F64}, gen));
    positions = ag::arange(static_cast<double>(o.seq_len), F64);
  }

  nn::MultiHeadAttention& attention() const { return block ? block->attn() : *attn; }
  std::string attention_prefix() const { return block ? "block.attn." : "attn."; }

  // tokens (B, T) -> logits (B, T, classes); causal attention.
  ag::Tensor forward(const ag::Tensor& tokens) const {
    const ag::Tensor x = ag::add(tok->forward(tokens), pos->forward(positions));  // (B, T, D)
    nn::AttentionOptions opt;
    opt.is_causal = true;
    opt.need_weights = false;
    ag::Tensor r;
    if (block) {
      r = block->forward(x, opt).output;
    } else {
      const ag::Tensor h = ln_1->forward(x);
      r = ag::add(x, attn->forward(h, h, h, opt).output);
    }
    return readout->forward(ln_f->forward(r));
  }
};

// Token sequences (B, T) as float64 values.
inline ag::Tensor tokens(const std::vector<std::vector<double>>& rows) {
  std::vector<double> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  return ag::tensor(flat, {static_cast<std::int64_t>(rows.size()), static_cast<std::int64_t>(rows[0].size())}, F64);
}

// The clean and corrupted token batches (2 x 4) and the targets the study tests share.
inline const ag::Tensor kClean = tokens({{1, 2, 3, 0}, {4, 1, 1, 2}});
inline const ag::Tensor kCorrupted = tokens({{3, 2, 0, 0}, {4, 4, 1, 3}});
inline const std::vector<std::int64_t> kTargets{0, 1, 2, 3, 4, 0, 1, 2};

// Mean log-probability of `targets` (B, T) under logits (B, T, C): a one-element metric.
inline ag::Tensor mean_log_prob(const ag::Tensor& logits, const std::vector<std::int64_t>& targets) {
  const std::int64_t C = logits.size(-1);
  const ag::Tensor flat = ag::reshape(ag::log_softmax(logits, -1), {-1});  // (B·T·C)
  std::vector<std::int64_t> index;
  for (std::size_t i = 0; i < targets.size(); ++i) index.push_back(static_cast<std::int64_t>(i) * C + targets[i]);
  return ag::mean(ag::index_select(flat, 0, index));
}

inline double max_abs_diff(const ag::Tensor& a, const ag::Tensor& b) {
  const auto x = a.to_vector(), y = b.to_vector();
  if (x.size() != y.size()) return 1e300;
  double m = 0;
  for (std::size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

// t's values equal `want` within 1e-12 (absolute).
inline void check_values_near(const ag::Tensor& t, const std::vector<double>& want, double tol = 1e-12) {
  const auto got = t.to_vector();
  BOOST_REQUIRE_EQUAL(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    BOOST_TEST(std::abs(got[i] - want[i]) <= tol, "element " << i << ": " << got[i] << " vs " << want[i]);
}

using test_support::message_has;

}  // namespace study_support
