// Gradient clipping over a list of parameters (PyTorch's clip_grad_norm_ and clip_grad_value_).
// Both check every entry before changing any gradient.
#include <algorithm>
#include <cmath>
#include <vector>

#include "nn/optim.hpp"

namespace nn {


namespace {

// Every entry is defined, and every gradient present is floating (an Int64 parameter without a
// gradient is skipped, as any parameter without one).
void check_entries(const char* op, const std::vector<ag::Tensor>& params) {
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (!params[i].defined())
      ag::fail(op, "parameter {} of {} is undefined; no gradient was changed", i, params.size());
    const ag::Tensor g = params[i].grad();
    if (g.defined() && !ag::is_floating(g.dtype()))
      ag::fail(op, "the gradient of parameter {} of {} is {} {}; gradients must be Float32 or Float64; no gradient "
               "was changed", i, params.size(), ag::dtype_name(g.dtype()), ag::shape_str(g.shape()));
  }
}

// Whether some tensor is listed more than once. Sorts the identities in a per-thread buffer that
// is reused, so that a warm call allocates nothing.
bool has_repeats(const std::vector<ag::Tensor>& params) {
  thread_local std::vector<const void*> ids;
  ids.clear();
  for (const auto& p : params) ids.push_back(p.impl().get());
  std::sort(ids.begin(), ids.end());
  return std::adjacent_find(ids.begin(), ids.end()) != ids.end();
}

bool listed_before(const std::vector<ag::Tensor>& params, std::size_t i) {
  for (std::size_t j = 0; j < i; ++j)
    if (params[j].is_same(params[i])) return true;
  return false;
}

}  // namespace

double clip_grad_norm_(const std::vector<ag::Tensor>& params, double max_norm, double norm_type) {
  if (!(max_norm >= 0.0)) ag::fail("clip_grad_norm_", "max_norm must be >= 0, got {}", max_norm);
  const bool inf_norm = std::isinf(norm_type) && norm_type > 0;
  if (!inf_norm && !(norm_type > 0.0))
    ag::fail("clip_grad_norm_", "norm_type must be positive or infinity, got {}", norm_type);
  check_entries("clip_grad_norm_", params);
  ag::NoGradGuard no_grad;
  // A tensor listed twice (tied weights) is one gradient: counted and scaled once.
  const bool repeats = has_repeats(params);
  const auto counted = [&](std::size_t i) { return !repeats || !listed_before(params, i); };
  double acc = 0.0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const ag::Tensor g = params[i].grad();
    if (!g.defined() || !counted(i)) continue;
    ag::dispatch(g.dtype(), [&](auto zero) {
      using T = decltype(zero);
      const auto a = g.template as_array<T>().template cast<double>().abs();
      if (inf_norm) {
        if (g.numel() > 0) acc = std::max(acc, a.maxCoeff());
      } else if (norm_type == 2.0) {
        acc += a.square().sum();
      } else if (norm_type == 1.0) {
        acc += a.sum();
      } else {
        acc += a.pow(norm_type).sum();
      }
    });
  }
  const double total = inf_norm ? acc : norm_type == 2.0 ? std::sqrt(acc) : norm_type == 1.0 ? acc : std::pow(acc, 1.0 / norm_type);
  const double coef = max_norm / (total + 1e-6);
  if (coef < 1.0) {
    for (std::size_t i = 0; i < params.size(); ++i) {
      ag::Tensor g = params[i].grad();
      if (g.defined() && counted(i)) g.mul_(coef);
    }
  }
  return total;
}

void clip_grad_value_(const std::vector<ag::Tensor>& params, double clip_value) {
  if (!(clip_value >= 0.0)) ag::fail("clip_grad_value_", "clip_value must be >= 0, got {}", clip_value);
  check_entries("clip_grad_value_", params);
  ag::NoGradGuard no_grad;
  for (const auto& p : params) {
    ag::Tensor g = p.grad();
    if (!g.defined()) continue;
    ag::dispatch(g.dtype(), [&](auto zero) {
      using T = decltype(zero);
      auto a = g.template as_array<T>();
      a = a.max(static_cast<T>(-clip_value)).min(static_cast<T>(clip_value));
    });
    g.mark_modified();
  }
}

}  // namespace nn
