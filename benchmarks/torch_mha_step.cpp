#include "torch_mha_step.hpp"

#include <limits>

#include <torch/torch.h>

namespace bench {

struct TorchMhaStep::Impl {
  torch::nn::MultiheadAttention mha{nullptr};
  torch::Tensor x, mask;
};

TorchMhaStep::TorchMhaStep(std::int64_t B, std::int64_t T, std::int64_t E, std::int64_t H, bool causal)
    : impl_(std::make_unique<Impl>()) {
  torch::manual_seed(42);
  impl_->mha = torch::nn::MultiheadAttention(torch::nn::MultiheadAttentionOptions(E, H));
  impl_->x = torch::randn({T, B, E}).requires_grad_(true);  // sequence-first
  if (causal) impl_->mask = torch::full({T, T}, -std::numeric_limits<float>::infinity()).triu(1);
}

TorchMhaStep::~TorchMhaStep() = default;

void TorchMhaStep::operator()() {
  impl_->mha->zero_grad();
  impl_->x.mutable_grad() = torch::Tensor();
  auto out = std::get<0>(impl_->mha->forward(impl_->x, impl_->x, impl_->x, /*key_padding_mask=*/{},
                                              /*need_weights=*/false, impl_->mask));
  out.sum().backward();
}

void TorchMhaStep::set_num_threads(int n) { torch::set_num_threads(n); }

}  // namespace bench
