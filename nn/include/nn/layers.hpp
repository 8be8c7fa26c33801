#pragma once
// Layers: Embedding, LayerNorm, ReLU, GELU, Sequential, and a pre-LayerNorm transformer block
// (PyTorch's torch.nn modules of the same names; TransformerBlock is GPT-2's block).
//
// Every layer is an nn::Module with `forward` (also callable as operator()). Embedding and
// LayerNorm register PyTorch's names and layouts ("weight", "bias"), but Linear's weight is
// transposed (linear.hpp), MultiHeadAttention's parameters are W_Q .. b_O rather than
// in_proj_weight and out_proj, and TransformerBlock's children are ln_1, attn, ln_2, fc_1, fc_2:
// move parameters to and from PyTorch with save_torch_state_dict and load_torch_state_dict
// (nn/torch_state_dict.hpp), not load_parameters.
//
// Parameter accessors of a non-const layer (weight(), bias()) return its nn::Parameter handle
// (nn/module.hpp): in-place writes through it change the layer's parameter, as in PyTorch:
//   { ag::NoGradGuard g; layer.weight().copy_(values); }
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <autograd/autograd.hpp>

#include "nn/linear.hpp"
#include "nn/module.hpp"
#include "nn/multihead_attention.hpp"

namespace nn {

// ---- Embedding: a lookup table of num_embeddings rows of width embedding_dim ----
struct EmbeddingOptions {
  std::int64_t num_embeddings = 0;
  std::int64_t embedding_dim = 0;
  ag::Dtype dtype = ag::Dtype::Float32;
};

class Embedding : public Module {
 public:
  Embedding(std::int64_t num_embeddings, std::int64_t embedding_dim);
  explicit Embedding(const EmbeddingOptions& options);
  // "weight" (num_embeddings x embedding_dim) drawn from N(0, 1), as in PyTorch.
  Embedding(const EmbeddingOptions& options, ag::Generator& gen);

  // indices of any shape, Int64 (or a float tensor holding integral values), in
  // [0, num_embeddings) -> indices.shape + [D].
  ag::Tensor forward(const ag::Tensor& indices) const;
  ag::Tensor operator()(const ag::Tensor& indices) const { return forward(indices); }

  const ag::Tensor& weight() const { return weight_; }
  Parameter& weight() { return weight_; }
  const EmbeddingOptions& options() const { return options_; }
  std::string extra_repr() const override;

 private:
  EmbeddingOptions options_;
  Parameter weight_;
};

// ---- LayerNorm over the last dims (normalized_shape) ----
// y = (x − mean) / √(var + eps) · weight + bias, mean and (biased) variance over the last
// normalized_shape.size() dims: the module form of the autograd op ag::layer_norm
// (autograd/src/ops/layer_norm.cpp, one fused kernel forward and backward).
struct LayerNormOptions {
  ag::Shape normalized_shape;
  double eps = 1e-5;
  bool elementwise_affine = true;  // "weight" (ones) and "bias" (zeros), shaped normalized_shape
  bool bias = true;                // only with elementwise_affine
  ag::Dtype dtype = ag::Dtype::Float32;
};

class LayerNorm : public Module {
 public:
  explicit LayerNorm(std::int64_t normalized_size, double eps = 1e-5);
  explicit LayerNorm(const LayerNormOptions& options);

  ag::Tensor forward(const ag::Tensor& x) const;
  ag::Tensor operator()(const ag::Tensor& x) const { return forward(x); }

  const ag::Tensor& weight() const { return weight_; }  // undefined without elementwise_affine
  const ag::Tensor& bias() const { return bias_; }      // undefined without bias
  Parameter& weight() { return weight_; }
  Parameter& bias() { return bias_; }
  const LayerNormOptions& options() const { return options_; }
  std::string extra_repr() const override;

 private:
  LayerNormOptions options_;
  Parameter weight_;
  Parameter bias_;
};

// The same normalisation as a function (weight and bias may be undefined): the autograd op.
using ag::layer_norm;

// ---- activations ----
class ReLU : public Module {
 public:
  ReLU() : Module("ReLU") {}
  ag::Tensor forward(const ag::Tensor& x) const { return ag::relu(x); }
  ag::Tensor operator()(const ag::Tensor& x) const { return forward(x); }
};

// x·Φ(x) (exact), or the tanh approximation (PyTorch's approximate="tanh").
class GELU : public Module {
 public:
  explicit GELU(bool tanh_approximation = false) : Module("GELU"), tanh_(tanh_approximation) {}
  ag::Tensor forward(const ag::Tensor& x) const { return ag::gelu(x, tanh_); }
  ag::Tensor operator()(const ag::Tensor& x) const { return forward(x); }
  std::string extra_repr() const override { return tanh_ ? "approximate=tanh" : ""; }

 private:
  bool tanh_;
};

// ---- Sequential: modules applied in order; children named "0", "1", ... ----
//   auto mlp = std::make_shared<nn::Sequential>(std::make_shared<nn::Linear>(4, 16),
//                                               std::make_shared<nn::GELU>(),
//                                               std::make_shared<nn::Linear>(16, 4));
// Any module with `ag::Tensor forward(const ag::Tensor&)` can be added.
class Sequential : public Module {
 public:
  Sequential() : Module("Sequential") {}
  template <class... Ms>
  explicit Sequential(std::shared_ptr<Ms>... modules) : Module("Sequential") {
    (push_back(std::move(modules)), ...);
  }

  template <class M>
  Sequential& push_back(std::shared_ptr<M> module) {
    return push_back(std::to_string(layers_.size()), std::move(module));
  }
  template <class M>
  Sequential& push_back(std::string name, std::shared_ptr<M> module) {
    if (!module) ag::fail("Sequential", "module '{}' is null", name);
    register_module(std::move(name), module);
    layers_.push_back([m = module.get()](const ag::Tensor& x) { return m->forward(x); });
    return *this;
  }

  ag::Tensor forward(const ag::Tensor& x) const;
  ag::Tensor operator()(const ag::Tensor& x) const { return forward(x); }
  std::size_t size() const { return layers_.size(); }

 private:
  std::vector<std::function<ag::Tensor(const ag::Tensor&)>> layers_;
};

// ---- TransformerBlock: pre-LayerNorm attention and MLP, each added back into the residual stream ----
//   x = x + attn(ln_1(x), ln_1(x), ln_1(x))      (the seed's "add back into the residual stream")
//   x = x + fc_2(act(fc_1(ln_2(x))))
// Children, in order: "ln_1" (LayerNorm), "attn" (MultiHeadAttention), "ln_2" (LayerNorm),
// "fc_1" (Linear d_model -> d_ff), "fc_2" (Linear d_ff -> d_model).
// Hook points (nn/hooks.hpp), shaped as x (batched or not): "resid_pre" (the input x),
// "resid_mid" (x after attention is added), "mlp_hidden" (the activation's output, d_ff wide),
// "resid_post" (the output); with the child's "attn.q" .. "attn.out".
struct TransformerBlockOptions {
  std::int64_t d_model = 0;
  std::int64_t num_heads = 1;
  std::int64_t d_ff = 0;        // 0 means 4 * d_model
  double dropout = 0.0;         // attention-weight dropout, as MultiHeadAttention's
  bool gelu = true;             // GELU (exact) in the MLP, or ReLU
  bool bias = true;             // false: no bias in fc_1, fc_2, attn, nor in ln_1, ln_2 (PyTorch's bias=False)
  double layer_norm_eps = 1e-5;
  ag::Dtype dtype = ag::Dtype::Float32;
  // The LayerNorms' bias on its own; unset: as `bias`. (true with bias = false is the block as it
  // was before bias reached the LayerNorms, which torch's TransformerEncoderLayer cannot express.)
  std::optional<bool> layer_norm_bias = std::nullopt;
};

struct TransformerBlockOutput {
  ag::Tensor output;   // like x
  ag::Tensor weights;  // the attention weights, as MultiHeadAttention returns them (per head when
                       // average_attn_weights is false); undefined when need_weights is false
};

class TransformerBlock : public Module {
 public:
  TransformerBlock(std::int64_t d_model, std::int64_t num_heads);
  explicit TransformerBlock(const TransformerBlockOptions& options);
  TransformerBlock(const TransformerBlockOptions& options, ag::Generator& gen);

  // x (B, T, d_model) or (T, d_model); attention options as MultiHeadAttention's (masks, causal).
  ag::Tensor forward(const ag::Tensor& x) const;
  TransformerBlockOutput forward(const ag::Tensor& x, const AttentionOptions& options) const;
  ag::Tensor operator()(const ag::Tensor& x) const { return forward(x); }

  const TransformerBlockOptions& options() const { return options_; }
  LayerNorm& ln_1() const { return *ln_1_; }
  MultiHeadAttention& attn() const { return *attn_; }
  LayerNorm& ln_2() const { return *ln_2_; }
  Linear& fc_1() const { return *fc_1_; }
  Linear& fc_2() const { return *fc_2_; }
  std::string extra_repr() const override;

 private:
  void build(ag::Generator& gen);

  TransformerBlockOptions options_;
  std::shared_ptr<LayerNorm> ln_1_;
  std::shared_ptr<MultiHeadAttention> attn_;
  std::shared_ptr<LayerNorm> ln_2_;
  std::shared_ptr<Linear> fc_1_;
  std::shared_ptr<Linear> fc_2_;
};

}  // namespace nn
