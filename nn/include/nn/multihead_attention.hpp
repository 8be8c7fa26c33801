#pragma once
// nn::MultiHeadAttention — the seed's mechanism, with PyTorch's torch.nn.MultiheadAttention
// options and semantics (batch-first), and safe where PyTorch is not.
//
//   q = query · W_Q + b_Q        (B, T, E)       E = embed_dim
//   k = key   · W_K + b_K        (B, S, E)       key is (B, S, kdim)
//   v = value · W_V + b_V        (B, S, E)       value is (B, S, vdim)
//   split: head h takes columns h·d_k .. (h+1)·d_k - 1, d_k = E / num_heads  (a reshape)
//   head_h = softmax(q_h · k_hᵀ / √d_k + mask) · v_h              (B, T, d_k)
//   out = concat(head_1 .. head_H) · W_O + b_O                   (B, T, E)
//
// Parameters, in this order: "W_Q" (E x E), "W_K" (kdim x E), "W_V" (vdim x E), "W_O" (E x E),
// with bias "b_Q", "b_K", "b_V", "b_O" (E each), with add_bias_kv "bias_k", "bias_v" (E each).
// 4·E² weights (+ 4·E biases) for kdim = vdim = E, whatever the head count.
//
// forward() is nn::functional::multi_head_attention_forward (nn/functional.hpp) on this module's
// parameters and options: the masks, the fully blocked rows, add_bias_kv and add_zero_attn, the
// two attention cores, dropout and the study are described there. The module adds:
//   - dropout acts in training mode only, drawing from dropout_generator() (seeded from the
//     initialisation generator; reseed it with dropout_generator().manual_seed(s));
//   - study mode (set_study(true)): every forward keeps its intermediates, read with study();
//   - hook points (nn/hooks.hpp), batched as the study (B = 1 for an unbatched input):
//       q, k, v       (B, H, T|S', d_k)  per-head projections
//       raw_scores    (B, H, T, S')      q · kᵀ
//       attn_scores   (B, H, T, S')      raw_scores / √d_k + masks: the softmax's input
//       pattern       (B, H, T, S')      the softmax weights, before dropout
//       z             (B, H, T, d_k)     per-head context: (dropped) pattern · v
//       concat        (B, T, E)          the heads side by side: W_O's input
//       result        (B, H, T, E)       each head's share z_h · W_O[h] (TL's hook_result); when
//                                        hooked, out is their sum plus b_O (equal to rounding)
//       out           (B, T, E)          the output after W_O
//     A hook (or a cache) on q .. concat or result runs the layer on the Composed core; one on out alone
//     keeps the core. With no hook, forward is the hook-free path (fused core, packed projection).
#include <cstdint>
#include <string>

#include <autograd/autograd.hpp>

#include "nn/functional.hpp"
#include "nn/module.hpp"

namespace nn {

struct MultiHeadAttentionOptions {
  std::int64_t embed_dim = 0;
  std::int64_t num_heads = 1;
  double dropout = 0.0;
  bool bias = true;
  std::int64_t kdim = 0;  // 0 means = embed_dim
  std::int64_t vdim = 0;  // 0 means = embed_dim
  bool add_bias_kv = false;
  bool add_zero_attn = false;
  AttentionCore core = AttentionCore::Fused;
  bool study = false;
  ag::Dtype dtype = ag::Dtype::Float32;
};

class MultiHeadAttention : public Module {
 public:
  explicit MultiHeadAttention(const MultiHeadAttentionOptions& options);
  // Initialises from gen instead of ag::default_generator().
  MultiHeadAttention(const MultiHeadAttentionOptions& options, ag::Generator& gen);
  MultiHeadAttention(std::int64_t embed_dim, std::int64_t num_heads);

  // query (B, T, E), key (B, S, kdim), value (B, S, vdim); or unbatched (T, E), (S, kdim), (S, vdim).
  // Returns {output, weights}, as PyTorch's forward returns (attn_output, attn_weights).
  AttentionOutput forward(const ag::Tensor& query, const ag::Tensor& key, const ag::Tensor& value,
                          const AttentionOptions& options = {});
  AttentionOutput operator()(const ag::Tensor& query, const ag::Tensor& key, const ag::Tensor& value,
                             const AttentionOptions& options = {}) {
    return forward(query, key, value, options);
  }
  // Self-attention, query = key = value = x, in the form every layer has (TransformerBlock's too):
  // forward(x) returns the output alone (computing no weights, need_weights = false), and
  // forward(x, options) returns {output, weights}.
  ag::Tensor forward(const ag::Tensor& x) {
    AttentionOptions options;
    options.need_weights = false;
    return forward(x, x, x, options).output;
  }
  AttentionOutput forward(const ag::Tensor& x, const AttentionOptions& options) { return forward(x, x, x, options); }
  ag::Tensor operator()(const ag::Tensor& x) { return forward(x); }

  // The core forward(query, key, value, options) runs on now, and why when it is not the fastest
  // one for the shapes, without running it (the arguments are checked as forward checks them):
  // functional::attention_path with this module's options, mode and hooks. Composed for
  // AttentionCore::Composed, study mode, or a hook on q .. concat or result, whose reason names
  // the first such point ("hook on pattern"); otherwise Tiled or Fused as ag::sdpa_path says
  // ("need_weights" when the weights asked for keep a large call off the tiled core).
  ag::SdpaPath attention_path(const ag::Tensor& query, const ag::Tensor& key, const ag::Tensor& value,
                              const AttentionOptions& options = {}) const;

  // PyTorch's _reset_parameters, in this layout: W_Q, W_K, W_V Xavier-uniform (as one (3E x E)
  // block when kdim = vdim = E), W_O U(-1/√E, 1/√E), biases zero, bias_k and bias_v Xavier-normal.
  void reset_parameters(ag::Generator& gen);

  void set_core(AttentionCore core) { options_.core = core; }
  AttentionCore core() const { return options_.core; }
  void set_study(bool on);
  bool study_enabled() const { return options_.study; }
  // The intermediates of the last forward in study mode: live tensors of that forward's graph,
  // replaced by the next forward (one under NoGradGuard too: then has_graph is false and
  // study().grad(...) throws saying so). Throws when there are none. For values that later
  // forwards leave alone, take owned snapshots with nn::run_with_cache.
  const AttentionStudy& study() const;

  ag::Generator& dropout_generator() { return dropout_gen_; }

  const MultiHeadAttentionOptions& options() const { return options_; }
  std::int64_t embed_dim() const { return options_.embed_dim; }
  std::int64_t num_heads() const { return options_.num_heads; }
  std::int64_t head_dim() const { return options_.embed_dim / options_.num_heads; }
  std::int64_t kdim() const { return options_.kdim; }
  std::int64_t vdim() const { return options_.vdim; }

  const ag::Tensor& W_Q() const { return W_Q_; }
  const ag::Tensor& W_K() const { return W_K_; }
  const ag::Tensor& W_V() const { return W_V_; }
  const ag::Tensor& W_O() const { return W_O_; }
  const ag::Tensor& b_Q() const { return b_Q_; }  // undefined without bias (and so on)
  const ag::Tensor& b_K() const { return b_K_; }
  const ag::Tensor& b_V() const { return b_V_; }
  const ag::Tensor& b_O() const { return b_O_; }
  const ag::Tensor& bias_k() const { return bias_k_; }  // undefined without add_bias_kv
  const ag::Tensor& bias_v() const { return bias_v_; }
  // The parameters' handles on a non-const module (nn::Parameter, nn/module.hpp): in-place
  // writes through them change the layer, `{ ag::NoGradGuard g; mha.W_Q().copy_(w); }`.
  Parameter& W_Q() { return W_Q_; }
  Parameter& W_K() { return W_K_; }
  Parameter& W_V() { return W_V_; }
  Parameter& W_O() { return W_O_; }
  Parameter& b_Q() { return b_Q_; }
  Parameter& b_K() { return b_K_; }
  Parameter& b_V() { return b_V_; }
  Parameter& b_O() { return b_O_; }
  Parameter& bias_k() { return bias_k_; }
  Parameter& bias_v() { return bias_v_; }
  // The parameters as functional::multi_head_attention_forward takes them (handles, not copies).
  functional::MultiHeadAttentionWeights functional_weights() const;

  std::string extra_repr() const override;

 private:
  MultiHeadAttentionOptions options_;
  Parameter W_Q_, W_K_, W_V_, W_O_;
  Parameter b_Q_, b_K_, b_V_, b_O_;
  Parameter bias_k_, bias_v_;
  ag::Generator dropout_gen_;
  AttentionStudy study_;
  bool has_study_ = false;
};

}  // namespace nn
