#pragma once
// What functional_attention.cpp takes from functional_attention_checks.cpp (internal): the
// argument checks, which give the sizes of the call, and the masks as one additive tensor.
#include <cstdint>

#include "nn/functional.hpp"

namespace nn::functional::detail {

// The sizes of one call, batched (B = 1 for an unbatched input).
struct Geometry {
  bool batched = true;
  std::int64_t B = 0, T = 0, S = 0;
  std::int64_t S_total = 0;  // S' = S (+1 with bias_k) (+1 with add_zero_attn): the keys attended to
  std::int64_t E = 0, H = 0;
};

// Checks everything a call is given (inputs, weights, config, masks and their values) and
// returns its sizes; throws std::invalid_argument naming "MultiHeadAttention" and the shapes.
Geometry check_arguments(const ag::Tensor& query, const ag::Tensor& key, const ag::Tensor& value,
                         const MultiHeadAttentionWeights& weights, const MultiHeadAttentionConfig& config,
                         const AttentionOptions& options);

struct Masks {
  // What key_padding_mask, attn_mask and (unless causal_flag) is_causal say, as one tensor added
  // to the scaled scores: 0 where a query may see a key, -inf where it may not, attn_mask's
  // values in between. Only the dims some mask varies along are there: it broadcasts to
  // (B, H, T, S'), e.g. (T, S'), (B, 1, 1, S'), (B, 1, T, S'), (B, H, T, S'). Undefined when
  // nothing is masked. The S' - S appended keys are never blocked.
  ag::Tensor additive;
  bool causal_flag = false;  // causality left to the fused op's is_causal flag (not in `additive`)
};

// The masks of a call whose arguments passed check_arguments, in `dtype`. Built from autograd
// ops, outside the graph unless a float attn_mask requires grad (it then gets its gradient).
Masks build_masks(const AttentionOptions& options, const Geometry& g, bool causal_flag, ag::Dtype dtype);

}  // namespace nn::functional::detail
