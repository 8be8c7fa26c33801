#pragma once
// char_gpt's model: a GPT over characters, nanoGPT's architecture on headgrad's modules.
//
//   x = drop(wte(tokens) + wpe(0 .. T-1))              token and position embeddings (B, T, E)
//   x = h.i(x), i = 0 .. n_layer-1                      pre-LayerNorm nn::TransformerBlocks, causal
//   logits = ln_f(x) · wteᵀ   (or lm_head(ln_f(x)))     the head, tied to the token embedding
//
// Initialisation is nanoGPT's: every weight and embedding N(0, 0.02²), the two residual
// projections of each block (attn.W_O, fc_2.weight) N(0, (0.02 / √(2·n_layer))²), biases 0,
// LayerNorm gains 1. Parameters are named wte.weight, wpe.weight, h.<i>.<block's names>,
// ln_f.weight, ln_f.bias (and lm_head.weight untied).
//
// Dropout (training mode only): on the embeddings' sum and, inside each block's attention, on the
// attention weights. (nn::TransformerBlock has no dropout on its residual branches, which
// nanoGPT also drops; at nanoGPT's CPU setting, dropout 0, the two are the same model.)
#include <cstdint>
#include <memory>
#include <vector>

#include <nn/nn.hpp>

namespace char_gpt {

namespace ag = autograd;

struct GptConfig {
  std::int64_t vocab_size = 0;
  std::int64_t block_size = 64;  // the longest context
  std::int64_t n_layer = 4;
  std::int64_t n_head = 4;
  std::int64_t n_embd = 128;
  double dropout = 0.0;
  bool bias = false;        // biases in the blocks' linear layers and attention projections
  bool tie_weights = true;  // the head is the token embedding, transposed
  ag::Dtype dtype = ag::Dtype::Float32;

  // Throws std::invalid_argument naming the setting at fault (sizes not positive, n_embd not a
  // multiple of n_head, dropout outside [0, 1)).
  void check() const;
};

class Gpt : public nn::Module {
 public:
  // Draws the initial parameters (and the dropout generators' seeds) from gen.
  Gpt(const GptConfig& config, ag::Generator& gen);

  // tokens: (B, T) token indices held as values, T <= block_size -> logits (B, T, vocab_size).
  ag::Tensor forward(const ag::Tensor& tokens) const;
  // Mean cross entropy of the next-token predictions against targets (B, T).
  ag::Tensor loss(const ag::Tensor& tokens, const ag::Tensor& targets) const;

  const GptConfig& config() const { return config_; }
  nn::TransformerBlock& block(std::int64_t i) const { return *blocks_.at(static_cast<std::size_t>(i)); }
  // The embedding dropout's generator, then each block's attention-dropout generator: their
  // states are what a checkpoint must carry besides the parameters for a run to resume exactly.
  std::vector<ag::Generator*> dropout_generators();

 private:
  void initialise(ag::Generator& gen);

  GptConfig config_;
  std::shared_ptr<nn::Embedding> wte_, wpe_;
  std::vector<std::shared_ptr<nn::TransformerBlock>> blocks_;
  std::shared_ptr<nn::LayerNorm> ln_f_;
  std::shared_ptr<nn::Linear> lm_head_;  // only when not tied
  ag::Tensor positions_;                 // 0 .. block_size-1
  mutable ag::Generator dropout_gen_;
};

// nanoGPT's rule for weight decay: the parameters of two or more dimensions (weights and
// embeddings) decay, biases and LayerNorm parameters do not. One flag per tensor of `params`.
std::vector<bool> decay_mask(const nn::NamedTensors& params);

}  // namespace char_gpt
