#include "nn/layers.hpp"

#include <memory>

#include "nn/init.hpp"
#include "parameter_budget.hpp"

namespace nn {

// ---- Embedding ----

Embedding::Embedding(std::int64_t num_embeddings, std::int64_t embedding_dim)
    : Embedding(EmbeddingOptions{num_embeddings, embedding_dim}) {}

Embedding::Embedding(const EmbeddingOptions& options) : Embedding(options, ag::default_generator()) {}

Embedding::Embedding(const EmbeddingOptions& options, ag::Generator& gen) : Module("Embedding"), options_(options) {
  if (options.num_embeddings <= 0 || options.embedding_dim <= 0)
    ag::fail("Embedding", "num_embeddings and embedding_dim must be positive, got {} and {}", options.num_embeddings,
             options.embedding_dim);
  if (!ag::is_floating(options.dtype))
    ag::fail("Embedding", "dtype must be Float32 or Float64 (the weight's; indices may be Int64), got {}",
             ag::dtype_name(options.dtype));
  detail::claim_parameter("Embedding", "weight", {options.num_embeddings, options.embedding_dim});
  weight_.bind(
      register_parameter("weight", ag::randn({options.num_embeddings, options.embedding_dim}, options.dtype, gen)));
}

ag::Tensor Embedding::forward(const ag::Tensor& indices) const { return ag::embedding(weight_, indices); }

std::string Embedding::extra_repr() const {
  return fmt::format("{}, {}", options_.num_embeddings, options_.embedding_dim);
}

// ---- LayerNorm ----

LayerNorm::LayerNorm(std::int64_t normalized_size, double eps)
    : LayerNorm(LayerNormOptions{.normalized_shape = {normalized_size}, .eps = eps}) {}

LayerNorm::LayerNorm(const LayerNormOptions& options) : Module("LayerNorm"), options_(options) {
  if (options.normalized_shape.empty()) ag::fail("LayerNorm", "normalized_shape is empty");
  for (auto d : options.normalized_shape)
    if (d <= 0) ag::fail("LayerNorm", "normalized_shape {} must be positive", ag::shape_str(options.normalized_shape));
  if (!(options.eps >= 0.0)) ag::fail("LayerNorm", "eps must be >= 0, got {}", options.eps);
  if (!ag::is_floating(options.dtype))
    ag::fail("LayerNorm", "dtype must be Float32 or Float64, got {}", ag::dtype_name(options.dtype));
  if (options.elementwise_affine) {
    detail::claim_parameter("LayerNorm", "weight", options.normalized_shape);
    weight_.bind(register_parameter("weight", ag::ones(options.normalized_shape, options.dtype)));
    if (options.bias) {
      detail::claim_parameter("LayerNorm", "bias", options.normalized_shape);
      bias_.bind(register_parameter("bias", ag::zeros(options.normalized_shape, options.dtype)));
    }
  }
}

ag::Tensor LayerNorm::forward(const ag::Tensor& x) const {
  return ag::layer_norm(x, options_.normalized_shape, weight_, bias_, options_.eps);
}

std::string LayerNorm::extra_repr() const {
  return fmt::format("{}, eps={}{}", ag::shape_str(options_.normalized_shape), options_.eps,
                     !options_.elementwise_affine ? ", elementwise_affine=false" : options_.bias ? "" : ", bias=false");
}

// ---- Sequential ----

ag::Tensor Sequential::forward(const ag::Tensor& x) const {
  ag::Tensor h = x;
  for (const auto& layer : layers_) h = layer(h);
  return h;
}

}  // namespace nn

namespace nn {

// ---- TransformerBlock ----

namespace {

// The block's hook points, in the order the forward reaches them.
enum BlockPoint : std::size_t { kResidPre, kResidMid, kMlpHidden, kResidPost };

}  // namespace

TransformerBlock::TransformerBlock(std::int64_t d_model, std::int64_t num_heads)
    : TransformerBlock(TransformerBlockOptions{.d_model = d_model, .num_heads = num_heads}) {}

TransformerBlock::TransformerBlock(const TransformerBlockOptions& options)
    : TransformerBlock(options, ag::default_generator()) {}

TransformerBlock::TransformerBlock(const TransformerBlockOptions& options, ag::Generator& gen)
    : Module("TransformerBlock"), options_(options) {
  declare_hook_points({"resid_pre", "resid_mid", "mlp_hidden", "resid_post"});
  if (options_.d_model <= 0) ag::fail("TransformerBlock", "d_model must be positive, got {}", options_.d_model);
  if (options_.d_ff == 0) options_.d_ff = 4 * options_.d_model;
  if (options_.d_ff < 0) ag::fail("TransformerBlock", "d_ff must be positive, got {}", options_.d_ff);
  const auto& o = options_;
  // bias = false: no bias anywhere, the LayerNorms' included (PyTorch's TransformerEncoderLayer(bias=False))
  if (!options_.layer_norm_bias) options_.layer_norm_bias = o.bias;
  LayerNormOptions ln{.normalized_shape = {o.d_model}, .eps = o.layer_norm_eps, .bias = *o.layer_norm_bias,
                      .dtype = o.dtype};
  ln_1_ = register_module("ln_1", std::make_shared<LayerNorm>(ln));
  MultiHeadAttentionOptions mha;
  mha.embed_dim = o.d_model;
  mha.num_heads = o.num_heads;
  mha.dropout = o.dropout;
  mha.bias = o.bias;
  mha.dtype = o.dtype;
  attn_ = register_module("attn", std::make_shared<MultiHeadAttention>(mha, gen));
  ln_2_ = register_module("ln_2", std::make_shared<LayerNorm>(ln));
  fc_1_ = register_module("fc_1", std::make_shared<Linear>(LinearOptions{o.d_model, o.d_ff, o.bias, o.dtype}, gen));
  fc_2_ = register_module("fc_2", std::make_shared<Linear>(LinearOptions{o.d_ff, o.d_model, o.bias, o.dtype}, gen));
}

ag::Tensor TransformerBlock::forward(const ag::Tensor& x) const {
  AttentionOptions options;
  options.need_weights = false;
  return forward(x, options).output;
}

TransformerBlockOutput TransformerBlock::forward(const ag::Tensor& x, const AttentionOptions& options) const {
  // Each hook point returns its value unchanged (no call, no allocation) when it has no hook.
  const HookPoints& at = hook_points();
  const ag::Tensor x0 = at.run(kResidPre, x);                   // (B, T, d_model)
  const ag::Tensor h = ln_1_->forward(x0);                      // (B, T, d_model)
  AttentionOutput a = attn_->forward(h, h, h, options);         // (B, T, d_model)
  const ag::Tensor x1 = at.run(kResidMid, ag::add(x0, a.output));  // residual
  const ag::Tensor m = ln_2_->forward(x1);                      // (B, T, d_model)
  const ag::Tensor f = fc_1_->forward(m);                       // (B, T, d_ff)
  const ag::Tensor act = at.run(kMlpHidden, options_.gelu ? ag::gelu(f) : ag::relu(f));
  return {at.run(kResidPost, ag::add(x1, fc_2_->forward(act))), a.weights};  // residual
}

std::string TransformerBlock::extra_repr() const {
  return fmt::format("d_model={}, num_heads={}, d_ff={}", options_.d_model, options_.num_heads, options_.d_ff);
}

}  // namespace nn
