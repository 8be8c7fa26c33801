// PyTorch-style printing of tensors.
#include "autograd/format.hpp"

#include <cmath>

#include "autograd/graph.hpp"

namespace autograd {

namespace {

constexpr std::int64_t kSummaryThreshold = 1000;  // PyTorch's default
constexpr std::int64_t kEdgeItems = 3;

struct Printer {
  const Shape& shape;
  const std::vector<double>& values;
  const Shape strides;
  bool scientific;
  bool summarise;
  std::size_t indent;  // columns before the outermost '['

  std::string number(double v) const {
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    return scientific ? fmt::format("{:.4e}", v) : fmt::format("{:.4f}", v);
  }

  std::string block(std::size_t dim, std::int64_t offset) const {
    const std::int64_t n = shape[dim];
    std::vector<std::string> parts;
    const bool cut = summarise && n > 2 * kEdgeItems;
    for (std::int64_t i = 0; i < n; ++i) {
      if (cut && i == kEdgeItems) {
        parts.emplace_back("...");
        i = n - kEdgeItems;
      }
      const std::int64_t at = offset + i * strides[dim];
      parts.push_back(dim + 1 == shape.size() ? number(values[static_cast<std::size_t>(at)]) : block(dim + 1, at));
    }
    if (dim + 1 == shape.size()) return fmt::format("[{}]", fmt::join(parts, ", "));
    const std::string blank_lines(shape.size() - dim - 2, '\n');
    const std::string sep = ",\n" + blank_lines + std::string(indent + dim + 1, ' ');
    return fmt::format("[{}]", fmt::join(parts, sep));
  }
};

}  // namespace

std::string to_string(const Tensor& t) {
  if (!t.defined()) return "tensor(undefined)";
  const auto values = t.to_vector();
  bool scientific = false;
  double max_abs = 0.0, min_abs = std::numeric_limits<double>::infinity();
  for (double v : values) {
    if (!std::isfinite(v) || v == 0.0) continue;
    max_abs = std::max(max_abs, std::abs(v));
    min_abs = std::min(min_abs, std::abs(v));
  }
  if (max_abs >= 1e4 || (max_abs > 0 && min_abs < 1e-4)) scientific = true;

  std::string body;
  if (t.dim() == 0) {
    body = Printer{t.shape(), values, {}, scientific, false, 7}.number(values[0]);
  } else if (t.numel() == 0) {
    body = "[]";
  } else {
    Printer p{t.shape(), values, contiguous_strides(t.shape()), scientific, t.numel() > kSummaryThreshold, 7};
    body = p.block(0, 0);
  }
  std::string extra = fmt::format(", dtype={}, shape={}", dtype_name(t.dtype()), shape_str(t.shape()));
  if (t.grad_fn()) {
    extra += fmt::format(", grad_fn=<{}>", printable(t.grad_fn()->name()));
  } else if (t.requires_grad()) {
    extra += ", requires_grad=true";
  }
  return fmt::format("tensor({}{})", body, extra);
}

}  // namespace autograd
