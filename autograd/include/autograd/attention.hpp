#pragma once
// The fused attention core: scaled dot-product attention over (batch, head) slices, with a
// hand-derived backward (docs/attention_backward.md): src/ops/attention*.cpp.
//
// Per slice (b, h), with M the additive mask and Z the dropout factors (0 or 1/(1-p)):
//   S = scale·Q·Kᵀ + M        [T, S]
//   P = softmax(S) by rows    [T, S]   <- `weights`
//   O = (P ⊙ Z)·V             [T, d_v] <- `output`
// Forward and backward are hand-written kernels: each slice's products go through the engine's
// gemm (a small kernel of its own, libxsmm, OpenBLAS or Eigen, by shape), the slices run in
// parallel with OpenMP, each on one thread alone, so results do not depend on the thread count.
#include <cstdint>
#include <string_view>

#include "autograd/random.hpp"
#include "autograd/tensor.hpp"

namespace autograd {

// The core an attention call ran on.
enum class SdpaCore {
  Fused,     // the untiled kernel: each slice's (T, S) weights formed, kept for backward
  Tiled,     // the tiled core (FlashAttention-2 style): memory linear in T, no weights formed
  Composed,  // separate autograd ops: nn::MultiHeadAttention's Composed core (never an ag op's)
};

// "fused", "tiled" or "composed".
std::string_view core_name(SdpaCore core);

// Which core a call ran on, and why when it is not the op's own choice for the shapes.
//   Tiled: need_weights = false and T·S >= the tiling threshold (2^20 scores, min_tiled_scores in
//     src/kernels/attention_flash_tiles.hpp); reason empty.
//   Fused: T·S below the threshold (the untiled kernel is measured faster there): reason empty;
//     or T·S at or above it with the weights asked for: reason "need_weights".
//   Composed (nn::MultiHeadAttention only): reason "AttentionCore::Composed", "study mode",
//     "hooks" or, from MultiHeadAttention::attention_path, "hook on <point>".
// reason points to a string literal (no allocation).
struct SdpaPath {
  SdpaCore core = SdpaCore::Fused;
  std::string_view reason;  // empty: the core is the one the op picks for these shapes
};

struct SdpaResult {
  Tensor output;   // (B, H, T, d_v)
  Tensor weights;  // (B, H, T, S): the softmax weights after masking (before dropout)
  SdpaPath path = {};  // the core that ran, and why
};

// The settings of one call, every one optional: ag::scaled_dot_product_attention(q, k, v,
// {.need_weights = false, .attn_mask = m, .is_causal = true}).
// The fields that nn::AttentionOptions also has come in its order (need_weights, attn_mask,
// is_causal), the others in PyTorch's (attn_mask, dropout_p, is_causal, scale), so that one
// designated initializer reads alike in both.
struct SdpaOptions {
  bool need_weights = true;
  Tensor attn_mask = {};  // undefined: no mask
  double dropout_p = 0.0;
  bool is_causal = false;
  double scale = 0.0;  // 0 means 1/sqrt(d_k)
  Generator* generator = nullptr;  // for dropout; null: default_generator()
};

// The path a call with T queries, S keys and these options takes (SdpaResult::path), without
// running it: the rule the three ops follow.
SdpaPath sdpa_path(std::int64_t T, std::int64_t S, const SdpaOptions& options = {});

// q (B, H, T, d_k), k (B, H, S, d_k), v (B, H, S, d_v), all one dtype. The options:
// attn_mask: undefined, or an additive float mask of the same dtype that broadcasts to
//   (B, H, T, S) (e.g. (T, S), (B, 1, 1, S), (B, H, T, S)); -inf blocks. It is differentiable
//   (a learned score bias works): its gradient is dL/dS summed back to the mask's shape.
// is_causal: query i sees keys 0..i only (needs T == S); combines with attn_mask if both given.
// scale: multiplies q·kᵀ; 0 means 1/sqrt(d_k).
// A query row whose keys are all blocked gets zero weights, zero output and zero gradients
// (to q, k, v and the mask) — never NaN.
// dropout_p in [0, 1]: > 0 drops weights (scaling the kept ones by 1/(1-p)). The call draws
//   one 64-bit seed from generator (the default generator when null), whatever the sizes; weight
//   (b, h, i, j) is dropped when the counter-based (Philox-4x32-10) uniform of that seed and
//   of its flat index ((b·H + h)·T + i)·S + j is < p: the rule of ag::dropout, so
//   ag::dropout on the (B, H, T, S) weights from the same generator state drops the same
//   weights. The mask does not depend on the dtype, the core, the tiling or the thread count.
//   Pass 0 in eval mode (nothing is drawn then).
// Both results are differentiable outputs of one graph node: gradients may reach the output,
// the weights, or both. All three ops are differentiable to any order (create_graph): the
// kernel's gradients are then the outputs of a recorded op, <op>_backward, whose rule (the
// second derivative, in ag ops) reuses the saved weights or, on the tiled core, recomputes
// them; the dropout mask is a constant.
// need_weights = false: the weights are not asked for, and `weights` comes back undefined. The
//   op then runs a tiled core (FlashAttention-2 style, docs/attention_backward.md §10): blocks
//   of queries against blocks of keys with an online softmax, keeping for backward only q, k,
//   v, the mask, the output and one log-sum-exp per query row, so memory grows linearly in T
//   (not as T·S); backward recomputes the weights tile by tile. Causal tiles above the diagonal
//   are skipped. Results agree with need_weights = true to rounding, and have the same bits at
//   any thread count. With dropout, each tile's mask is regenerated from the call's seed, in
//   forward and again in backward: no (T, S) mask is stored either. When T·S is small the
//   untiled kernel runs instead (its weights are then simply not returned).
// Throws std::invalid_argument naming the op and the shapes for: undefined or non-4-D q, k, v;
// dtype mismatch; B/H, sequence-length or head-dim disagreement; a mask that does not
// broadcast; is_causal with T != S; a non-finite scale; dropout_p outside [0, 1].
SdpaResult scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const SdpaOptions& options = {});

// The same op on heads-last storage, the layout of a multi-head layer's projections: q
// (B, T, H·d_k), k (B, S, H·d_k), v (B, S, H·d_v), head h in columns h·d .. (h+1)·d − 1 of each
// row. The heads are read and the output (B, T, H·d_v) is written in place, with no split into
// (B, H, L, d) copies or merge after; weights are (B, H, T, S) as above, and so are the mask,
// the dropout draws and the results (the output is the other op's, heads side by side).
SdpaResult scaled_dot_product_attention_heads_last(const Tensor& q, const Tensor& k, const Tensor& v,
                                                   std::int64_t num_heads, const SdpaOptions& options = {});

// Self-attention on one packed projection: qkv (B, T, 3·H·d), each row [q | k | v] with head h
// of each in its columns h·d .. (h+1)·d − 1 (the output of one linear by [W_Q | W_K | W_V]).
// Everything else as the heads-last op with q, k, v the three column blocks (S = T): the same
// output (B, T, H·d), weights, mask, dropout draws and results; the gradient is one (B, T, 3·H·d)
// tensor [dq | dk | dv].
SdpaResult scaled_dot_product_attention_packed(const Tensor& qkv, std::int64_t num_heads,
                                               const SdpaOptions& options = {});

}  // namespace autograd
