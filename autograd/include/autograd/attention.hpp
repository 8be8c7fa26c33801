#pragma once
// The fused attention core: scaled dot-product attention over (batch, head) slices, with a
// hand-derived backward (see docs/attention_backward.md). src/ops/attention.cpp.
#include "autograd/random.hpp"
#include "autograd/tensor.hpp"

namespace autograd {

struct SdpaResult {
  Tensor output;   // (B, H, T, d_v)
  Tensor weights;  // (B, H, T, S): the softmax weights after masking (before dropout)
};

// q (B, H, T, d_k), k (B, H, S, d_k), v (B, H, S, d_v), all one dtype.
// attn_mask: undefined, or an additive float mask that broadcasts to (B, H, T, S); -inf blocks.
// is_causal: query i sees keys 0..i only (needs T == S).
// scale: multiplies q·kᵀ; 0 means 1/sqrt(d_k).
// A query row whose keys are all blocked gets zero weights, zero output and zero gradients.
// dropout_p > 0 drops weights (scaling the kept ones by 1/(1-p)) using gen.
SdpaResult scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const Tensor& attn_mask = Tensor(), bool is_causal = false,
                                        double scale = 0.0, double dropout_p = 0.0,
                                        Generator* gen = nullptr);

}  // namespace autograd
