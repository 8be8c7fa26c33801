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

enum class Reduction { None, Mean, Sum };

struct CrossEntropyOptions {
  std::int64_t ignore_index = -100;  // targets equal to this contribute nothing (and no gradient)
  Reduction reduction = Reduction::Mean;  // Mean divides by the number of targets not ignored
  double label_smoothing = 0.0;      // in [0, 1]: the target distribution is (1-ε)·onehot + ε/C
};

// Cross entropy of softmax(logits) against class indices, computed stably from the logits
// (log-sum-exp with the row maximum subtracted): loss_n = logsumexp(x_n) − x_n[target_n].
// logits (..., C), Float32 or Float64; targets shaped like logits without the last dim, holding
// integral values in [0, C) or ignore_index (any dtype; indices are not differentiated).
// Returns a scalar (Mean, Sum) or the per-position losses shaped like targets (None). With Mean
// and every target ignored the result is NaN (0/0), as in PyTorch. Differentiable in logits
// (first order).
ag::Tensor cross_entropy(const ag::Tensor& logits, const ag::Tensor& targets, const CrossEntropyOptions& options = {});
// Same, targets given as row-major indices (logits.numel() / C of them).
ag::Tensor cross_entropy(const ag::Tensor& logits, const std::vector<std::int64_t>& targets,
                         const CrossEntropyOptions& options = {});

// Mean (or summed, or per-element) squared difference; input and target have the same shape and
// dtype. Differentiable in both.
ag::Tensor mse_loss(const ag::Tensor& input, const ag::Tensor& target, Reduction reduction = Reduction::Mean);

}  // namespace nn
