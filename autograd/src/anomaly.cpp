// Anomaly detection: per-thread switch, labels, creation contexts and the NaN/Inf checks.
#include "autograd/anomaly.hpp"

#include <cmath>
#include <cstdint>
#include <vector>

#include <fmt/format.h>

namespace autograd {

namespace {

thread_local bool anomaly_enabled = false;
thread_local AnomalyOptions current_options;
thread_local std::vector<std::string> labels;

// Index of the first element that is NaN (or, when inf_counts, ±Inf); -1 when there is none.
struct NonFinite {
  std::int64_t index = -1;
  double value = 0.0;
};

NonFinite find_non_finite(const Tensor& t, bool inf_counts) {
  NonFinite found;
  if (!t.defined() || t.numel() == 0) return found;
  dispatch(t.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* d = t.data<T>();
    const std::int64_t n = t.numel();
    for (std::int64_t i = 0; i < n; ++i) {
      const bool bad = inf_counts ? !std::isfinite(d[i]) : std::isnan(d[i]);
      if (bad) {
        found = {i, static_cast<double>(d[i])};
        return;
      }
    }
  });
  return found;
}

std::string value_name(double v) {
  if (std::isnan(v)) return "NaN";
  return v > 0 ? "+Inf" : "-Inf";
}

std::string meta_str(const Tensor& t) {
  if (!t.defined()) return "undefined";
  return fmt::format("{} {}", shape_str(t.shape()), dtype_name(t.dtype()));
}

std::string context_of(const Node& node) {
  if (!node.creation_context.empty()) return node.creation_context;
  return fmt::format("'{}' #{} (created before anomaly detection was turned on)", printable(node.name()), node.sequence_nr);
}

}  // namespace

DetectAnomalyGuard::DetectAnomalyGuard(const AnomalyOptions& options)
    : prev_enabled_(anomaly_enabled), prev_options_(current_options) {
  anomaly_enabled = true;
  current_options = options;
}

DetectAnomalyGuard::~DetectAnomalyGuard() {
  anomaly_enabled = prev_enabled_;
  current_options = prev_options_;
}

bool is_anomaly_enabled() { return anomaly_enabled; }
const AnomalyOptions& anomaly_options() { return current_options; }

AnomalyLabel::AnomalyLabel(std::string label) { labels.push_back(std::move(label)); }
AnomalyLabel::~AnomalyLabel() { labels.pop_back(); }

std::string current_anomaly_label() { return fmt::format("{}", fmt::join(labels, "/")); }

namespace detail {

void anomaly_check_forward(Node& node, const TensorList& inputs, const TensorList& outputs) {
  std::vector<std::string> metas;
  metas.reserve(inputs.size());
  for (const auto& in : inputs) metas.push_back(meta_str(in));
  node.creation_context = fmt::format("'{}' #{} from ({})", printable(node.name()), node.sequence_nr, fmt::join(metas, ", "));
  if (!labels.empty()) node.creation_context += fmt::format(" under '{}'", current_anomaly_label());

  if (!current_options.forward) return;
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const NonFinite bad = find_non_finite(outputs[i], current_options.forward_inf);
    if (bad.index < 0) continue;
    throw AnomalyError(fmt::format(
        "anomaly detection: '{}' produced {} in output {} of shape {} (element {}) [created as {}]", printable(node.name()),
        value_name(bad.value), i, shape_str(outputs[i].shape()), bad.index, node.creation_context));
  }
}

void anomaly_check_backward(const Node& node, const TensorList& grad_inputs) {
  if (!current_options.backward) return;
  for (std::size_t i = 0; i < grad_inputs.size(); ++i) {
    const NonFinite bad = find_non_finite(grad_inputs[i], /*inf_counts=*/true);
    if (bad.index < 0) continue;
    throw AnomalyError(fmt::format(
        "anomaly detection: the backward of '{}' returned {} in the gradient for input {} of shape {} "
        "(element {}) [created as {}]",
        printable(node.name()), value_name(bad.value), i, shape_str(grad_inputs[i].shape()), bad.index, context_of(node)));
  }
}

}  // namespace detail

}  // namespace autograd
