#pragma once
// Losses (PyTorch's torch.nn.functional.cross_entropy and mse_loss).
//
// Layout: the class dimension is the LAST one. logits (N, C) with targets (N) is exactly
// PyTorch's layout; for sequences, logits (B, T, C) go with targets (B, T) (PyTorch would want
// (B, C, T) — headgrad keeps the layout its layers produce).
#include <cstdint>
#include <vector>

#include <autograd/autograd.hpp>

namespace nn {

namespace ag = autograd;

// cross_entropy is the autograd op (autograd/ops.hpp: autograd/src/ops/cross_entropy.cpp), with its
// options and reductions, under nn's names too.
using ag::CrossEntropyOptions;
using ag::Reduction;
using ag::cross_entropy;

// Mean (or summed, or per-element) squared difference; input and target have the same shape and
// dtype. Differentiable in both.
ag::Tensor mse_loss(const ag::Tensor& input, const ag::Tensor& target, Reduction reduction = Reduction::Mean);

}  // namespace nn
