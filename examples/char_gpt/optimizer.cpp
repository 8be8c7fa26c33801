#include "optimizer.hpp"

#include <cmath>
#include <stdexcept>
#include <utility>

#include <Eigen/Core>
#include <fmt/format.h>

namespace char_gpt {

namespace {

void check_in(const char* name, double value, double low, double high_exclusive) {
  if (!(value >= low && value < high_exclusive) || !std::isfinite(value))
    throw std::invalid_argument(
        fmt::format("GroupedAdamW: {} must be in [{}, {}), got {}", name, low, high_exclusive, value));
}

template <class T>
Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>> flat(const ag::Tensor& t) {
  return {t.data<T>(), t.numel()};
}

}  // namespace

GroupedAdamW::GroupedAdamW(nn::OptimizerParams params, std::vector<bool> decay, const GroupedAdamWOptions& options)
    : nn::Optimizer("AdamW", std::move(params), options.lr), options_(options), decay_(std::move(decay)) {
  if (decay_.size() != this->params().size())
    throw std::invalid_argument(fmt::format("GroupedAdamW: {} decay flags for {} parameters", decay_.size(),
                                            this->params().size()));
  check_in("beta1", options.beta1, 0.0, 1.0);
  check_in("beta2", options.beta2, 0.0, 1.0);
  if (!(options.eps > 0.0) || !std::isfinite(options.eps))
    throw std::invalid_argument(fmt::format("GroupedAdamW: eps must be positive and finite, got {}", options.eps));
  check_in("weight_decay", options.weight_decay, 0.0, HUGE_VAL);
}

std::span<const std::string_view> GroupedAdamW::slot_names() const {
  static constexpr std::string_view kSlots[] = {"exp_avg", "exp_avg_sq"};
  return kSlots;
}

bool GroupedAdamW::slot_is_nonnegative(std::string_view slot) const { return slot == "exp_avg_sq"; }

void GroupedAdamW::update(std::size_t i, const ag::Tensor& param, const ag::Tensor& grad,
                          std::vector<ag::Tensor>& slots, std::int64_t step) {
  const double lr_now = lr();
  const double bias_correction1 = 1.0 - std::pow(options_.beta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(options_.beta2, static_cast<double>(step));
  auto run = [&](auto zero) {
    using T = decltype(zero);
    auto p = flat<T>(param);
    const auto g = flat<T>(grad);
    auto m = flat<T>(slots[0]);
    auto v = flat<T>(slots[1]);
    const T one_minus_b1 = static_cast<T>(1.0 - options_.beta1);
    const T b2 = static_cast<T>(options_.beta2), one_minus_b2 = static_cast<T>(1.0 - options_.beta2);
    const T step_size = static_cast<T>(lr_now / bias_correction1);
    const T bc2_sqrt = static_cast<T>(std::sqrt(bias_correction2));
    const T eps = static_cast<T>(options_.eps);
    if (decay_[i] && options_.weight_decay != 0.0) p *= static_cast<T>(1.0 - lr_now * options_.weight_decay);
    m += one_minus_b1 * (g - m);
    v = b2 * v + one_minus_b2 * g * g;
    p -= step_size * m / (v.sqrt() / bc2_sqrt + eps);
  };
  if (param.dtype() == ag::Dtype::Float64) {
    run(0.0);
  } else {
    run(0.0f);
  }
}

}  // namespace char_gpt
