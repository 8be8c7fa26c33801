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
// Masks (AttentionOptions):
//   key_padding_mask (B, S), or (S) unbatched: nonzero = that key is padding (blocked).
//   attn_mask (T, S) or (B·num_heads, T, S) ((num_heads, T, S) unbatched), float, added to the
//     scaled scores; -inf blocks. Row b·num_heads + h of a 3-D mask belongs to batch b, head h.
//   is_causal: query i attends to keys 0..i only (needs T == S). It may be combined with the other
//     masks. (PyTorch treats is_causal as a hint that attn_mask already is the causal mask; here it
//     is a mask of its own.)
// A query row whose keys are all blocked gets zero weights, a zero context (so out = b_O) and
// zero gradients — never NaN (PyTorch returns NaN there).
//
// add_bias_kv appends one learned key (bias_k) and value (bias_v), in projected space, after the
// S keys of every batch entry; add_zero_attn then appends one all-zero key and value. Neither is
// padding, neither is causally blocked: both are visible to every query (PyTorch's behaviour,
// which pads attn_mask and key_padding_mask with a zero column). Returned weights then have
// S + 1 (or S + 2) columns.
//
// Dropout (probability `dropout`) is applied to the attention weights in training mode only,
// drawing from dropout_generator() (seeded from the initialisation generator; reseed it with
// dropout_generator().manual_seed(s)). The returned weights are the softmax weights before
// dropout (PyTorch returns them after dropout).
//
// Two attention cores compute the same thing (tests hold them to 1e-12 in float64):
//   AttentionCore::Fused (default) — ag::scaled_dot_product_attention, one op with a
//     hand-derived backward (docs/attention_backward.md);
//   AttentionCore::Composed — the same steps as separate autograd ops, readable line by line
//     (see compose_attention in src/multihead_attention.cpp).
//
// Study mode (set_study(true)): every forward keeps the per-head Q, K, V, the raw and scaled
// scores, the weights, the context and the concatenated heads of that pass, with retain_grad()
// on each, so that after backward() study().scores.grad() is dL/d(scores) — no hooks needed.
// Study mode always runs the Composed core (the fused op has no intermediate tensors to keep).
#include <cstdint>
#include <string>

#include <autograd/autograd.hpp>

#include "nn/module.hpp"

namespace nn {

enum class AttentionCore { Fused, Composed };

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

struct AttentionOptions {
  ag::Tensor key_padding_mask;  // (B, S), or (S) unbatched; nonzero entry = that key is padding
  bool need_weights = true;
  ag::Tensor attn_mask;  // (T, S) or (B * num_heads, T, S) float, added to the scaled scores
  bool average_attn_weights = true;
  bool is_causal = false;  // query i attends to keys 0..i only
};

struct AttentionOutput {
  ag::Tensor output;   // (B, T, embed_dim), or (T, embed_dim) unbatched
  ag::Tensor weights;  // (B, H, T, S) per head, (B, T, S) averaged, undefined without need_weights
};

// What study mode keeps from the last forward. Always batched: B = 1 for an unbatched input.
// S' = S (+1 with add_bias_kv) (+1 with add_zero_attn). Each tensor is part of the graph and
// retains its gradient (when the forward recorded a graph).
struct AttentionStudy {
  ag::Tensor q;           // (B, H, T, d_k)   per-head queries
  ag::Tensor k;           // (B, H, S', d_k)  per-head keys
  ag::Tensor v;           // (B, H, S', d_k)  per-head values
  ag::Tensor raw_scores;  // (B, H, T, S')    q · kᵀ
  ag::Tensor scores;      // (B, H, T, S')    q · kᵀ / √d_k + masks: the softmax's input
  ag::Tensor weights;     // (B, H, T, S')    softmax(scores), before dropout
  ag::Tensor context;     // (B, H, T, d_k)   (dropped) weights · v
  ag::Tensor concat;      // (B, T, E)        the heads side by side: W_O's input

  // The (rows x cols) matrix of batch entry b, head h of a (B, H, rows, cols) tensor such as
  // scores or scores.grad(), as a new tensor outside the graph.
  static ag::Tensor head(const ag::Tensor& t, std::int64_t h, std::int64_t b = 0);
};

class MultiHeadAttention : public Module {
 public:
  explicit MultiHeadAttention(const MultiHeadAttentionOptions& options);
  // Initialises from gen instead of ag::default_generator().
  MultiHeadAttention(const MultiHeadAttentionOptions& options, ag::Generator& gen);
  MultiHeadAttention(std::int64_t embed_dim, std::int64_t num_heads);

  // query (B, T, E), key (B, S, kdim), value (B, S, vdim); or unbatched (T, E), (S, kdim), (S, vdim).
  AttentionOutput forward(const ag::Tensor& query, const ag::Tensor& key, const ag::Tensor& value,
                          const AttentionOptions& options = {});
  AttentionOutput operator()(const ag::Tensor& query, const ag::Tensor& key, const ag::Tensor& value,
                             const AttentionOptions& options = {}) {
    return forward(query, key, value, options);
  }
  // Self-attention: query = key = value = x.
  AttentionOutput forward(const ag::Tensor& x, const AttentionOptions& options = {}) {
    return forward(x, x, x, options);
  }

  // PyTorch's _reset_parameters, in this layout: W_Q, W_K, W_V Xavier-uniform (as one (3E x E)
  // block when kdim = vdim = E), W_O U(-1/√E, 1/√E), biases zero, bias_k and bias_v Xavier-normal.
  void reset_parameters(ag::Generator& gen);

  void set_core(AttentionCore core) { options_.core = core; }
  AttentionCore core() const { return options_.core; }
  void set_study(bool on);
  bool study_enabled() const { return options_.study; }
  // The intermediates of the last forward in study mode; throws when there are none.
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

  std::string extra_repr() const override;

 private:
  MultiHeadAttentionOptions options_;
  ag::Tensor W_Q_, W_K_, W_V_, W_O_;
  ag::Tensor b_Q_, b_K_, b_V_, b_O_;
  ag::Tensor bias_k_, bias_v_;
  ag::Generator dropout_gen_;
  AttentionStudy study_;
  bool has_study_ = false;
};

}  // namespace nn
