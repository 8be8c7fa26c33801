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

// Hook points (TransformerLens's LayerNorm hooks): "scale" √(var + eps), shaped x with its
// normalised dims kept as 1, and "normalized", the output (after weight and bias). With a hook on
// either, the forward is composed from elementwise ops (the same values, to rounding) so that a
// replaced scale changes the output; with none it is the fused op.
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

// x·Φ(x) (exact), or the tanh approximation: GELU(ag::GeluApproximation::Tanh) is PyTorch's
// nn.GELU(approximate="tanh").
class GELU : public Module {
 public:
  explicit GELU(ag::GeluApproximation approximate = ag::GeluApproximation::None)
      : Module("GELU"), approximate_(approximate) {
    if (approximate != ag::GeluApproximation::None && approximate != ag::GeluApproximation::Tanh)
      ag::fail("GELU", "approximate must be GeluApproximation::None or Tanh, got {}", static_cast<int>(approximate));
  }
  ag::Tensor forward(const ag::Tensor& x) const { return ag::gelu(x, approximate_); }
  ag::Tensor operator()(const ag::Tensor& x) const { return forward(x); }
  ag::GeluApproximation approximate() const { return approximate_; }
  std::string extra_repr() const override {
    return approximate_ == ag::GeluApproximation::Tanh ? "approximate=tanh" : "";
  }

 private:
  ag::GeluApproximation approximate_;
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

// ---- ModuleList: modules kept in order, children named "0", "1", ... (no forward of its own) ----
//   auto blocks = std::make_shared<nn::ModuleList>();
//   blocks->push_back(std::make_shared<nn::TransformerBlock>(options, gen));
//   auto& b0 = blocks->at<nn::TransformerBlock>(0);
class ModuleList : public Module {
 public:
  ModuleList() : Module("ModuleList") {}
  template <class M>
  ModuleList& push_back(std::shared_ptr<M> module) {
    if (!module) ag::fail("ModuleList", "module {} is null", modules_.size());
    register_module(std::to_string(modules_.size()), module);
    modules_.push_back(std::move(module));
    return *this;
  }
  std::size_t size() const { return modules_.size(); }
  Module& operator[](std::size_t i) const { return *modules_.at(check(i)); }
  // The module at i as an M; throws naming i and the module's type when it is not one.
  template <class M>
  M& at(std::size_t i) const {
    auto* m = dynamic_cast<M*>(modules_.at(check(i)).get());
    if (m == nullptr) ag::fail("ModuleList", "module {} is a {}, not the type asked for", i, modules_[i]->type_name());
    return *m;
  }

 private:
  std::size_t check(std::size_t i) const {
    if (i >= modules_.size()) ag::fail("ModuleList", "index {} is out of range for {} modules", i, modules_.size());
    return i;
  }
  std::vector<std::shared_ptr<Module>> modules_;
};

// The MLP's activation and the normalisation of a TransformerBlock (and of nn::TransformerLM).
enum class Activation { Gelu, GeluTanh, Relu };  // GELU exact, GELU's tanh form (TL's gelu_new), ReLU
enum class Normalization { LayerNorm, None };

// ---- TransformerBlock: pre-LayerNorm attention and MLP, each added back into the residual stream ----
//   x = x + attn(ln_1(x), ln_1(x), ln_1(x))      (the seed's "add back into the residual stream")
//   x = x + fc_2(act(fc_1(ln_2(x))))
// Children, in order: "ln_1" (LayerNorm), "attn" (MultiHeadAttention), "ln_2" (LayerNorm),
// "fc_1" (Linear d_model -> d_ff), "fc_2" (Linear d_ff -> d_model).
// Hook points (nn/hooks.hpp), in the order forward reaches them, shaped as x (batched or not):
// "resid_pre" (the input x); "q_input", "k_input", "v_input" (the residual stream the layer's
// queries, keys and values are made from, before ln_1: a hook on one of them changes that input
// alone, as TransformerLens's use_split_qkv_input, but shared by the heads, (B, T, d_model), where
// TL has one per head; when a hook replaces one of them, or a backward hook watches one, ln_1
// normalises the three as one stack (..., 3, d_model), so its points are then shaped (..., 3, ·),
// q's, k's, v's, as TL's are per head); "attn_out" (attention's output), "resid_mid" (x after attention is added),
// "mlp_pre" (fc_1's output, d_ff wide), "mlp_hidden" (the activation's output), "mlp_out" (fc_2's),
// "resid_post" (the output); with the children's "attn.q" .. "attn.out", "ln_1.scale", ...
// The attention-only form (mlp = false) has no ln_2, fc_1, fc_2 and no resid_mid or mlp points:
// x = x + attn(ln_1(x)). Normalization::None drops ln_1 and ln_2 (the identity in their place).
struct TransformerBlockOptions {
  std::int64_t d_model = 0;
  std::int64_t num_heads = 1;
  std::int64_t d_ff = 0;        // 0 means 4 * d_model
  double dropout = 0.0;         // attention-weight dropout, as MultiHeadAttention's
  bool gelu = true;             // GELU (exact) in the MLP, or ReLU
  bool gelu_tanh = false;       // with gelu: GELU's tanh approximation (TransformerLens's gelu_new)
  bool mlp = true;              // false: attention-only (no ln_2, fc_1, fc_2)
  Normalization normalization = Normalization::LayerNorm;
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
  // The causal forward's last row alone, (B, 1, d_model) (or (1, d_model)): the last position's
  // query, attention output and MLP, with keys and values from every row. Equals
  // forward(x, {.is_causal = true}) at the last position to rounding. Runs no hook point; throws
  // when the block has hooks.
  ag::Tensor forward_last(const ag::Tensor& x) const;
  // The causal forward of the last rows alone, as a decode with a key-value cache does it: for an
  // input of T rows, x_rows (B, R, d_model) is its rows T-R .. T-1 and k_prev, v_prev (B, T-R,
  // d_model) the keys and values of the rows before, heads side by side (from an earlier call's
  // `keys` and `values`; undefined when R = T). Keys and values are made for the R rows; queries,
  // attention, W_O and the MLP for the last `queries` rows (1 .. R) only. Equal to forward(x,
  // {.is_causal = true}) on those rows to rounding. Runs no hook point; throws when the block has
  // hooks, or dropout would act (training mode with dropout > 0).
  struct Rows {
    ag::Tensor output;        // (B, queries, d_model): the block's output rows T-queries .. T-1
    ag::Tensor keys, values;  // (B, T, d_model): every row's, k_prev and v_prev first
    ag::Tensor z;             // (B, queries, d_model): the heads' contexts side by side (W_O's input)
  };
  Rows forward_rows(const ag::Tensor& x_rows, const ag::Tensor& k_prev, const ag::Tensor& v_prev,
                    std::int64_t queries) const;
  // The block's output from its input x and its attention's output attn_out, both (..., d_model):
  // x + attn_out, then (with an MLP) x1 + fc_2(act(fc_1(ln_2(x1)))). forward's own tail: it runs
  // the hook points attn_out .. resid_post on the way, as forward does.
  ag::Tensor after_attention(const ag::Tensor& x, const ag::Tensor& attn_out) const;
  ag::Tensor operator()(const ag::Tensor& x) const { return forward(x); }

  const TransformerBlockOptions& options() const { return options_; }
  // The children; each throws naming itself when the block's form has none (attention-only, no norm).
  LayerNorm& ln_1() const;
  MultiHeadAttention& attn() const { return *attn_; }
  LayerNorm& ln_2() const;
  Linear& fc_1() const;
  Linear& fc_2() const;
  bool has_mlp() const { return options_.mlp; }
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
