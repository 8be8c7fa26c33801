#pragma once
// nn::TransformerLM: a decoder-only language model to study, configured as TransformerLens's
// HookedTransformerConfig is (n_layers, d_model, n_heads, d_head, d_mlp with 0 = attention-only,
// d_vocab, d_vocab_out, n_ctx, activation, normalisation, positional embedding), with the same forward:
//
//   x = embed(tokens) + pos_embed(0 .. T-1)           "embed_out", "pos_embed_out"   (B, T, E)
//   x = blocks.i(x), i = 0 .. n_layers-1              pre-LayerNorm TransformerBlocks, causal
//   logits = unembed(ln_final(x))                     "logits" (B, T, d_vocab_out)
//
// Children: "embed" (Embedding), "pos_embed" (Embedding n_ctx x E, when learned), "blocks"
// (ModuleList of TransformerBlock "0", "1", ...), "ln_final" (LayerNorm, when normalised),
// "unembed" (Linear E -> d_vocab_out with bias; absent when tied: logits = ln_final(x) · embedᵀ).
// Hook points, named by module path: the model's own "embed_out", "pos_embed_out", "logits", and
// every block's ("blocks.0.resid_pre", "blocks.0.k_input", "blocks.0.attn.pattern", ...,
// "ln_final.scale", "ln_final.normalized"). docs/circuits.md maps them to TransformerLens's names.
//
// TransformerLens's HookedTransformer layout (save/load_transformer_lens_state_dict): the same
// model's parameters under TL's names and shapes, so that
//   HookedTransformer(cfg).load_state_dict(load_file(path), strict=False)
// in transformer-lens 3.9 gives the same logits (transformer_lens_config_json gives cfg).
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <autograd/autograd.hpp>

#include "nn/layers.hpp"
#include "nn/module.hpp"

namespace nn {

enum class PositionalEmbedding { Learned, None };

struct TransformerLMConfig {
  std::int64_t n_layers = 2;
  std::int64_t d_model = 0;
  std::int64_t n_heads = 1;
  std::int64_t d_head = 0;  // 0: d_model / n_heads; otherwise it must equal that
  std::int64_t d_mlp = 0;   // 0: attention-only blocks
  std::int64_t d_vocab = 0;
  std::int64_t n_ctx = 0;   // the longest sequence
  Activation activation = Activation::Gelu;
  Normalization normalization = Normalization::LayerNorm;
  PositionalEmbedding positional_embedding = PositionalEmbedding::Learned;
  bool tied_embeddings = false;  // logits = ln_final(x) · embed.weightᵀ, no unembed bias
  double layer_norm_eps = 1e-5;
  ag::Dtype dtype = ag::Dtype::Float32;
  // Last, so that positional initialisers written before it existed keep their meaning.
  std::int64_t d_vocab_out = 0;  // logits per position; 0: d_vocab (TransformerLens's d_vocab_out = -1)

  // Throws naming the setting at fault (a size not positive, d_model not n_heads · d_head, ...).
  void check() const;
};

class TransformerLM : public Module {
 public:
  // Parameters drawn as TransformerLens's default init ("gpt2"): every weight and embedding from
  // N(0, (0.8 / √d_model)²), biases 0, LayerNorm gains 1.
  explicit TransformerLM(const TransformerLMConfig& config);
  TransformerLM(const TransformerLMConfig& config, ag::Generator& gen);

  // tokens (B, T) or (T), Int64 (or float holding integers) in [0, d_vocab), T <= n_ctx
  // -> logits (B, T, d_vocab_out) (or (T, d_vocab_out)). Always causal.
  ag::Tensor forward(const ag::Tensor& tokens) const;
  ag::Tensor operator()(const ag::Tensor& tokens) const { return forward(tokens); }
  // The logits at the last position alone, (B, d_vocab_out) (or (d_vocab_out)): forward(tokens)'s
  // last row to rounding, with the last block computing only that row and one position unembedded
  // (a task read at one position, such as grokking's "a b =", needs no more). With any hook on the
  // model it is forward(tokens)'s last row itself, every hook point seeing the whole sequence.
  ag::Tensor forward_last(const ag::Tensor& tokens) const;
  // Mean cross entropy of predicting tokens[:, t+1] from tokens[:, :t+1] (TL's lm_cross_entropy_loss).
  ag::Tensor loss(const ag::Tensor& tokens) const;

  // The residual stream going into block `layer` (0 .. n_layers; n_layers = after the last block),
  // and the logits from a residual stream given there: forward(t) == forward_from(L, residual_at(t, L)).
  ag::Tensor residual_at(const ag::Tensor& tokens, std::int64_t layer) const;
  ag::Tensor forward_from(std::int64_t layer, const ag::Tensor& residual) const;
  // The final LayerNorm (identity without normalisation) and the unembedding, on (..., E).
  ag::Tensor unembed(const ag::Tensor& x) const;

  const TransformerLMConfig& config() const { return config_; }
  TransformerBlock& block(std::int64_t layer) const;
  MultiHeadAttention& attn(std::int64_t layer) const { return block(layer).attn(); }
  Embedding& embed() const { return *embed_; }
  Embedding& pos_embed() const;  // throws without a learned positional embedding
  LayerNorm& ln_final() const;   // throws without normalisation
  Linear& unembed_layer() const;  // throws when tied
  // W_U (E, d_vocab_out): unembed.weight, or embed.weightᵀ when tied; b_U (d_vocab_out) or undefined.
  ag::Tensor W_U() const;
  ag::Tensor b_U() const;
  std::string extra_repr() const override;

 private:
  void build(ag::Generator& gen);
  ag::Tensor embed_tokens(const ag::Tensor& tokens) const;  // (B, T) -> (B, T, E)
  ag::Tensor run_blocks(ag::Tensor x, std::int64_t from, std::int64_t to) const;

  TransformerLMConfig config_;
  std::shared_ptr<Embedding> embed_, pos_embed_;
  std::shared_ptr<ModuleList> blocks_;
  std::shared_ptr<LayerNorm> ln_final_;
  std::shared_ptr<Linear> unembed_;
  ag::Tensor positions_;  // 0 .. n_ctx-1, Int64 (with a learned positional embedding)
};

// ---- TransformerLens's HookedTransformer layout ----
// Names and shapes as HookedTransformer.state_dict() has them: embed.W_E (V, E),
// pos_embed.W_pos (n_ctx, E), blocks.i.ln1.w/.b, blocks.i.attn.W_Q/W_K/W_V (H, E, d_head),
// W_O (H, d_head, E), b_Q/b_K/b_V (H, d_head), b_O (E), blocks.i.ln2.w/.b,
// blocks.i.mlp.W_in (E, d_mlp), b_in, W_out (d_mlp, E), b_out, ln_final.w/.b, unembed.W_U (E, V),
// unembed.b_U (V). Without a learned positional embedding W_pos is written as zeros (and must be
// zero to load); tied embeddings write W_U = W_Eᵀ and b_U = 0.
NamedTensors transformer_lens_state_dict(const TransformerLM& model);
// Copies TL-layout tensors into the model (every parameter must be there, shapes must match;
// TL's buffers such as blocks.i.attn.mask and IGNORE are skipped); nothing changes when one is
// refused. Throws naming the tensor and both shapes.
void load_transformer_lens_state_dict(TransformerLM& model, const NamedTensors& tensors);
void save_transformer_lens_state_dict(const TransformerLM& model, const std::string& path);  // safetensors
void load_transformer_lens_state_dict(TransformerLM& model, const std::string& path);
// The HookedTransformerConfig arguments as JSON: HookedTransformerConfig(**json.loads(s)).
std::string transformer_lens_config_json(const TransformerLMConfig& config);
// The inverse: the configuration such arguments describe (what transformer_lens_config_json writes,
// or the same keys of a TransformerLens config): n_layers, d_model, n_heads, d_vocab, n_ctx
// required; d_head, d_vocab_out (-1: d_vocab), d_mlp or attn_only, act_fn ("gelu", "gelu_new",
// "relu"), normalization_type ("LN" or null), positional_embedding_type ("standard"), eps
// optional; other keys are ignored. Throws std::invalid_argument naming the key whose value
// TransformerLM cannot represent (other keys TransformerLens has, such as parallel_attn_mlp or
// use_attn_scale, are not read: leave them at their defaults). What does not come back: the dtype
// (Float32; set it after), tied embeddings (untied: the file holds W_U = W_Eᵀ) and
// PositionalEmbedding::None (Learned: the file holds W_pos = 0, which loads as learned zeros).
TransformerLMConfig config_from_transformer_lens_json(std::string_view json);
// TransformerLens's name of a hook point in our naming: "blocks.0.attn.hook_pattern" ->
// "blocks.0.attn.pattern", "blocks.1.ln1.hook_scale" -> "blocks.1.ln_1.scale", "blocks.0.mlp.hook_post"
// -> "blocks.0.mlp_hidden", "hook_embed" -> "embed_out" (docs/circuits.md's table); "" for a name
// without "hook_". Our q, k, v, z and result put the head dim first: (B, H, T, ·), TL's
// (B, T, H, ·); pattern and attn_scores are (B, H, T, T) in both.
std::string transformer_lens_point_name(std::string_view tl_name);

}  // namespace nn
