#include "autograd/function.hpp"

namespace autograd {

void FunctionCtx::save_for_backward(const TensorList& tensors) {
  saved_.clear();
  for (const auto& t : tensors) saved_.emplace_back(t);
}

TensorList FunctionCtx::saved_tensors() const {
  TensorList out;
  out.reserve(saved_.size());
  for (const auto& s : saved_) out.push_back(s.get(op_name));
  return out;
}

}  // namespace autograd
