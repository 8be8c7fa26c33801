#pragma once
// Multi-head attention as a free function (PyTorch's F.multi_head_attention_forward), and the
// types it shares with nn::MultiHeadAttention, which holds the parameters and calls it.
//
//   q = query · W_Q + b_Q        (B, T, E)       E = embed_dim
//   k = key   · W_K + b_K        (B, S, E)       key is (B, S, kdim)
//   v = value · W_V + b_V        (B, S, E)       value is (B, S, vdim)
//   split: head h takes columns h·d_k .. (h+1)·d_k - 1, d_k = E / num_heads  (a reshape)
//   head_h = softmax(q_h · k_hᵀ / √d_k + mask) · v_h              (B, T, d_k)
//   out = concat(head_1 .. head_H) · W_O + b_O                   (B, T, E)
//
// Masks (AttentionOptions):
//   key_padding_mask (B, S), or (S) unbatched, of either dtype: nonzero = that key is padding
//     (blocked). NaN is refused.
//   attn_mask (T, S) or (B·num_heads, T, S) ((num_heads, T, S) unbatched). A Float32/Float64
//     mask is added to the scaled scores; -inf blocks. It holds finite numbers and -inf: NaN and
//     +inf are refused. An Int64 mask (what ag::gt, ag::eq, ... return) is boolean, as PyTorch's
//     bool mask: nonzero = blocked (-inf), zero = allowed. Row b·num_heads + h of a 3-D mask belongs to batch b, head h. A float mask
//     that requires grad gets its gradient (dL/d scores summed to its shape), as in PyTorch; the
//     other masks are constants.
//   is_causal: query i attends to keys 0..i only (needs T == S). It may be combined with the other
//     masks. (PyTorch treats is_causal as a hint that attn_mask already is the causal mask; here it
//     is a mask of its own.)
// A query row whose keys are all blocked (or that has no keys, S = 0) gets zero weights, a zero
// context (so out = b_O) and zero gradients — never NaN (PyTorch returns NaN there).
//
// bias_k and bias_v (add_bias_kv) append one learned key and value, in projected space, after the
// S keys of every batch entry; add_zero_attn then appends one all-zero key and value. Neither is
// padding, neither is causally blocked: both are visible to every query (PyTorch's behaviour,
// which pads attn_mask and key_padding_mask with a zero column). Returned weights then have
// S + 1 (or S + 2) columns.
//
// Dropout (probability dropout_p) is applied to the attention weights, drawing from the
// generator given. The returned weights are the softmax weights before dropout (PyTorch
// returns them after dropout).
//
// Two attention cores compute the same thing (tests hold them to 1e-12 in float64):
//   AttentionCore::Fused (default) — ag::scaled_dot_product_attention_heads_last (or, for
//     self-attention with neither bias_k nor add_zero_attn, one packed projection by
//     [W_Q | W_K | W_V] and ag::scaled_dot_product_attention_packed), one op with a
//     hand-derived backward (docs/attention_backward.md);
//   AttentionCore::Composed — the same steps as separate autograd ops, readable line by line
//     (see compose_attention in src/functional_attention.cpp).
//
// Study (config.study set): the call keeps the per-head Q, K, V, the raw and scaled scores, the
// pattern (the weights), the context z and the concatenated heads, under the names of their hook
// points, with retain_grad() on each, so that after backward() study->attn_scores.grad() is
// dL/d(attn_scores) — no hooks needed. It always runs the
// Composed core (the fused op has no intermediate tensors to keep). The tensors are live: they
// belong to this call's graph, and a forward without a graph (NoGradGuard) gives tensors without
// gradients (study->has_graph says which; study->grad("attn_scores") throws saying so).
//
// Hooks (config.hooks set): the call runs the Composed core and calls (*hooks)(point, value) at
// each point, in this order: "q", "k", "v" (B, H, T|S', d_k), "raw_scores", "attn_scores", "pattern"
// (B, H, T, S'), "z" (B, H, T, d_k), "concat" (B, T, E), "out" (B, T, E), batched as the study.
// The callback returns an undefined tensor to keep the value, or a replacement of the same shape
// and dtype (checked), which the rest of the call uses (the study keeps the replacements).
//
// Bad arguments throw std::invalid_argument starting "MultiHeadAttention:" and naming the shapes
// (or values) at fault: inputs of the wrong rank, width, batch size or dtype; masks of the wrong
// shape or holding NaN (+inf for attn_mask); is_causal with T != S; weights whose shapes or dtypes
// do not fit together; num_heads that does not divide embed_dim; dropout_p outside [0, 1).
#include <cstdint>
#include <functional>
#include <string_view>

#include <autograd/autograd.hpp>

namespace nn {

namespace ag = autograd;

enum class AttentionCore { Fused, Composed };

struct AttentionOptions {
  ag::Tensor key_padding_mask = {};  // (B, S), or (S) unbatched; nonzero entry = that key is padding
  bool need_weights = true;
  ag::Tensor attn_mask = {};  // (T, S) or (B * num_heads, T, S): float added to the scores; Int64 nonzero = blocked
  bool average_attn_weights = true;
  bool is_causal = false;  // query i attends to keys 0..i only
};

struct AttentionOutput {
  ag::Tensor output;   // (B, T, embed_dim), or (T, embed_dim) unbatched
  ag::Tensor weights;  // (B, H, T, S) per head, (B, T, S) averaged, undefined without need_weights
};

// What study mode keeps from the last forward. Always batched: B = 1 for an unbatched input.
// S' = S (+1 with add_bias_kv) (+1 with add_zero_attn). Each tensor is part of the graph and
// retains its gradient (when the forward recorded a graph). The fields are named as the hook
// points that see the same tensors (TransformerLens's hook_q .. hook_z, without "hook_").
struct AttentionStudy {
  ag::Tensor q;            // (B, H, T, d_k)   per-head queries
  ag::Tensor k;            // (B, H, S', d_k)  per-head keys
  ag::Tensor v;            // (B, H, S', d_k)  per-head values
  ag::Tensor raw_scores;   // (B, H, T, S')    q · kᵀ
  ag::Tensor attn_scores;  // (B, H, T, S')    q · kᵀ / √d_k + masks: the softmax's input
  ag::Tensor pattern;      // (B, H, T, S')    softmax(attn_scores), the attention weights, before dropout
  ag::Tensor z;            // (B, H, T, d_k)   per-head context: (dropped) pattern · v
  ag::Tensor concat;       // (B, T, E)        the heads side by side: W_O's input
  bool has_graph = false;  // the forward recorded a graph: the tensors get gradients from backward

  // A field by its name ("q", "k", "v", "raw_scores", "attn_scores", "pattern", "z", "concat");
  // throws naming the names there are.
  const ag::Tensor& value(std::string_view field) const;
  // Its gradient after backward, checked: throws naming the field and saying why there is none
  // (the forward recorded no graph, or no backward has reached it yet).
  ag::Tensor grad(std::string_view field) const;

  // The (rows x cols) matrix of batch entry b, head h of a (B, H, rows, cols) tensor such as
  // attn_scores or attn_scores.grad(), as a new tensor outside the graph.
  static ag::Tensor head(const ag::Tensor& t, std::int64_t h, std::int64_t b = 0);
};

namespace functional {

// The learned tensors of one attention layer, in the seed's layout (y = x · W + b, W stored
// in x out). E = embed_dim is W_Q's size; kdim and vdim are W_K's and W_V's rows.
struct MultiHeadAttentionWeights {
  ag::Tensor W_Q;     // (E, E)
  ag::Tensor W_K;     // (kdim, E)
  ag::Tensor W_V;     // (vdim, E)
  ag::Tensor W_O;     // (E, E)
  ag::Tensor b_Q, b_K, b_V, b_O;  // (E) each; any may be undefined (no bias)
  ag::Tensor bias_k, bias_v;      // (E) each, both or neither: the appended learned key and value
};

// The settings of one call (the layer's options and mode).
struct MultiHeadAttentionConfig {
  std::int64_t num_heads = 1;
  bool add_zero_attn = false;
  double dropout_p = 0.0;                      // on the attention weights; pass 0 in eval mode
  ag::Generator* dropout_generator = nullptr;  // null: ag::default_generator()
  AttentionCore core = AttentionCore::Fused;
  AttentionStudy* study = nullptr;  // when given: run the Composed core and keep its intermediates here
  // When given: run the Composed core and call it at each hook point (see the top of this file).
  const std::function<ag::Tensor(const char* point, const ag::Tensor& value)>* hooks = nullptr;
  // When given: the core the call ran on, and why (the attention_path below), is written here.
  ag::SdpaPath* path = nullptr;
};

// query (B, T, E), key (B, S, kdim), value (B, S, vdim); or unbatched (T, E), (S, kdim),
// (S, vdim), which gives unbatched results. Every tensor of one dtype (masks excepted).
AttentionOutput multi_head_attention_forward(const ag::Tensor& query, const ag::Tensor& key, const ag::Tensor& value,
                                             const MultiHeadAttentionWeights& weights,
                                             const MultiHeadAttentionConfig& config,
                                             const AttentionOptions& options = {});

// The core multi_head_attention_forward runs on for these arguments (checked as it checks them),
// and why when it is not the fastest one for the shapes, without running it. Composed, with the
// reason "AttentionCore::Composed" (config.core), "study mode" (config.study) or "hooks"
// (config.hooks), the first that holds; otherwise the fused op's own path for T queries and S'
// keys (ag::sdpa_path): Tiled without need_weights at T·S' >= 2^20, else Fused, with the reason
// "need_weights" when the weights asked for kept a call that large off the tiled core.
ag::SdpaPath attention_path(const ag::Tensor& query, const ag::Tensor& key, const ag::Tensor& value,
                            const MultiHeadAttentionWeights& weights, const MultiHeadAttentionConfig& config,
                            const AttentionOptions& options = {});

}  // namespace functional

}  // namespace nn
