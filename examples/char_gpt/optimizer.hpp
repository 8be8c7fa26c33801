#pragma once
// AdamW with the weight decay applied to some parameters only: PyTorch's torch.optim.AdamW with
// two parameter groups, {decayed, weight_decay} and {the rest, 0}, which is how nanoGPT trains
// (weights and embeddings decay; biases and LayerNorm parameters do not). nn::AdamW decays all
// of its parameters alike, so this is a small nn::Optimizer of its own, with nn::AdamW's update
// rule term for term:
//
//   p = p·(1 − lr·weight_decay)                       (decayed parameters only)
//   m = β1·m + (1 − β1)·g;  v = β2·v + (1 − β2)·g²
//   p = p − lr/(1 − β1ᵗ) · m / (√v / √(1 − β2ᵗ) + eps)
//
// Its state ("exp_avg", "exp_avg_sq" per parameter) goes into nn::save_checkpoint like any
// optimizer's; the decay flags are part of its construction, not of its state.
#include <span>
#include <string_view>
#include <vector>

#include <nn/nn.hpp>

namespace char_gpt {

namespace ag = autograd;

struct GroupedAdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

class GroupedAdamW : public nn::Optimizer {
 public:
  // decay: one flag per parameter. Throws std::invalid_argument when the counts differ or a
  // setting is out of range (betas in [0, 1), eps > 0, weight_decay >= 0, all finite).
  GroupedAdamW(nn::OptimizerParams params, std::vector<bool> decay, const GroupedAdamWOptions& options = {});

  const GroupedAdamWOptions& options() const { return options_; }
  const std::vector<bool>& decay() const { return decay_; }

 protected:
  std::span<const std::string_view> slot_names() const override;
  bool slot_is_nonnegative(std::string_view slot) const override;
  void update(std::size_t i, const ag::Tensor& param, const ag::Tensor& grad, std::vector<ag::Tensor>& slots,
              std::int64_t step) override;

 private:
  GroupedAdamWOptions options_;
  std::vector<bool> decay_;
};

}  // namespace char_gpt
