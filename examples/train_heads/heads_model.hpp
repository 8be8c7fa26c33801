#pragma once
// train_heads' model: token + position embeddings, ONE pre-LayerNorm transformer block (causal
// multi-head self-attention and an MLP, each added back into the residual stream), a final
// LayerNorm and a linear readout. Without the MLP the block is attention, residual and nothing
// else. The head count only splits the projections, so the parameter count does not depend on it.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nn/nn.hpp>

#include "report.hpp"

namespace heads {

namespace ag = autograd;

struct HeadsModelOptions {
  std::int64_t vocab = 24, seq_len = 12, d_model = 32, d_ff = 128;
  std::int64_t heads = 2;
  std::int64_t classes = 47;
  bool mlp = true;
};

struct HeadsModel : nn::Module {
  std::shared_ptr<nn::Embedding> tok, pos;
  std::shared_ptr<nn::TransformerBlock> block;  // with the MLP
  std::shared_ptr<nn::LayerNorm> ln_1;          // attention-only: LayerNorm and attention
  std::shared_ptr<nn::MultiHeadAttention> attn;
  std::shared_ptr<nn::LayerNorm> ln_f;
  std::shared_ptr<nn::Linear> readout;
  ag::Tensor positions;

  // Parameters are drawn from `gen` in registration order.
  HeadsModel(const HeadsModelOptions& options, ag::Generator& gen);

  struct Output {
    ag::Tensor logits;   // (B, T, classes)
    ag::Tensor weights;  // (B, H, T, T) per head, when asked for
  };
  // tokens: (B, T) token indices as values. forward gives the logits, as every nn layer's
  // forward(x) gives its output; forward_with_weights the logits and each head's weights.
  ag::Tensor forward(const ag::Tensor& tokens) const;
  Output forward_with_weights(const ag::Tensor& tokens) const;

  // The attention layer (the block's, or the attention-only model's own), and the dotted name of
  // one of its hook points, e.g. attention_point("z") is "block.attn.z" (or "attn.z").
  nn::MultiHeadAttention& attention() const;
  std::string attention_point(const std::string& point) const;
};

// The options of a model saved by train_heads, read from the file's "headgrad.config" (the sizes
// of its embeddings, block or attention layer, and readout): the model is rebuilt from the file
// alone. Throws nn::CheckpointError when the config is not a HeadsModel's.
HeadsModelOptions heads_options_from_config(const nn::ModuleConfig& config);
// The model in a file train_heads wrote, in headgrad's naming or PyTorch's: rebuilt from the
// file's config, its parameters loaded.
std::unique_ptr<HeadsModel> load_heads_model(const std::string& path);

// Mean attention weight of each head on the previous, the first and the current position, over
// query positions t >= 2 (where those three are different positions) of every sequence.
// weights: (B, H, T, T).
std::vector<HeadFocus> measure_focus(const ag::Tensor& weights);

}  // namespace heads
