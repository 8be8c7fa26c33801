#include "autograd/function.hpp"

#include <stdexcept>

#include <fmt/format.h>

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

namespace autograd {

void once_differentiable_error(const std::string& name) {
  throw std::runtime_error(fmt::format(
      "backward of '{}' is declared once_differentiable: it computes with raw values, so it cannot be "
      "differentiated again (create_graph); use first-order backward through it, or write its backward with "
      "ag ops and drop once_differentiable",
      printable(name)));
}

}  // namespace autograd
