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

namespace autograd {

void check_function_tangents(const std::string& name, const Node& node, const TensorList& tangents) {
  if (tangents.size() != node.output_meta.size())
    throw std::invalid_argument(fmt::format("jvp of '{}' returned {} tangents, but the function has {} outputs "
                                            "(return one per output, of its shape and dtype)",
                                            printable(name), tangents.size(), node.output_meta.size()));
  for (std::size_t j = 0; j < tangents.size(); ++j) {
    const TensorMeta& m = node.output_meta[j];
    const Tensor& t = tangents[j];
    if (!t.defined() && !is_floating(m.dtype)) continue;  // an integer output has no tangent
    if (!t.defined() || t.shape() != m.shape || t.dtype() != m.dtype)
      throw std::invalid_argument(fmt::format(
          "jvp of '{}' returned for output {} a tangent {}, but that output is {} {}", printable(name), j,
          t.defined() ? fmt::format("{} {}", shape_str(t.shape()), dtype_name(t.dtype())) : std::string("undefined"),
          shape_str(m.shape), dtype_name(m.dtype)));
  }
}

}  // namespace autograd
