#include "nn/optim.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <stdexcept>
#include <utility>

namespace nn {

namespace {

template <class T>
using ArrayMap = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>;
template <class T>
using ConstArrayMap = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;

template <class T>
ArrayMap<T> array_of(const ag::Tensor& t) {
  return ArrayMap<T>(t.data<T>(), t.numel());
}

void check_hyper(const std::string& op, const char* what, double value, double low, double high) {
  if (!(value >= low && value <= high))
    ag::fail(op, "{} must be in [{}, {}], got {}", what, low, high, value);
}

}  // namespace

// ---- Optimizer ----

Optimizer::Optimizer(std::string name, std::vector<ag::Tensor> params, double lr)
    : name_(std::move(name)), params_(std::move(params)), lr_(lr) {
  if (params_.empty()) ag::fail(name_, "got an empty parameter list");
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const auto& p = params_[i];
    if (!p.defined()) ag::fail(name_, "parameter {} is undefined", i);
    // (A frozen leaf, requires_grad = false, is allowed: it never gets a gradient, so it is skipped.)
    if (!p.is_leaf())
      ag::fail(name_, "parameter {} {} is not a leaf (it was computed by an op); pass the tensor itself", i,
               ag::shape_str(p.shape()));
    for (std::size_t j = 0; j < i; ++j)
      if (params_[j].is_same(p)) ag::fail(name_, "parameter {} appears twice (also at {})", i, j);
  }
  set_lr(lr);
  slots_.resize(params_.size());
  steps_.assign(params_.size(), 0);
}

void Optimizer::set_lr(double lr) {
  if (!(lr >= 0.0) || !std::isfinite(lr)) ag::fail(name_, "learning rate must be finite and >= 0, got {}", lr);
  lr_ = lr;
}

void Optimizer::zero_grad(bool set_to_none) {
  ag::NoGradGuard no_grad;
  for (auto& p : params_) {
    if (set_to_none || !p.grad().defined()) {
      p.set_grad(ag::Tensor());
    } else {
      p.grad().zero_();
    }
  }
}

void Optimizer::step() {
  ag::NoGradGuard no_grad;
  const auto names = slot_names();
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const ag::Tensor& p = params_[i];
    const ag::Tensor g = p.grad();
    if (!g.defined()) continue;
    if (g.shape() != p.shape() || g.dtype() != p.dtype())
      ag::fail(name_, "gradient of parameter {} is {} {} but the parameter is {} {}", i, ag::shape_str(g.shape()),
               ag::dtype_name(g.dtype()), ag::shape_str(p.shape()), ag::dtype_name(p.dtype()));
    if (slots_[i].size() != names.size()) {
      slots_[i].clear();
      for (std::size_t k = 0; k < names.size(); ++k) slots_[i].push_back(ag::zeros(p.shape(), p.dtype()));
    }
    ++steps_[i];
    update(i, p, g, slots_[i], steps_[i]);
    p.mark_modified();
  }
  ++step_count_;
}

NamedTensors Optimizer::state_dict() const {
  ag::NoGradGuard no_grad;
  NamedTensors out;
  const auto names = slot_names();
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (steps_[i] == 0) continue;
    out.emplace_back(fmt::format("state.{}.step", i), ag::scalar_tensor(static_cast<double>(steps_[i]), ag::Dtype::Float64));
    for (std::size_t k = 0; k < names.size(); ++k)
      out.emplace_back(fmt::format("state.{}.{}", i, names[k]), slots_[i][k].detach().clone());
  }
  out.emplace_back("param_groups.0.lr", ag::scalar_tensor(lr_, ag::Dtype::Float64));
  out.emplace_back("step_count", ag::scalar_tensor(static_cast<double>(step_count_), ag::Dtype::Float64));
  return out;
}

namespace {

// A Float64/Float32 scalar holding a non-negative integer (a step count).
std::int64_t integral_scalar(const std::string& op, const std::string& name, const ag::Tensor& t) {
  if (t.numel() != 1 || t.dim() != 0)
    ag::fail(op, "'{}' must be a scalar (shape []), got shape {}", name, ag::shape_str(t.shape()));
  const double v = t.item();
  if (!(v >= 0.0) || v != std::floor(v) || v > 9.007199254740992e15)
    ag::fail(op, "'{}' must be a non-negative integer, got {}", name, v);
  return static_cast<std::int64_t>(v);
}

}  // namespace

void Optimizer::check_state_dict(const NamedTensors& state) const {
  const std::string op = name_ + ".load_state_dict";
  const auto names = slot_names();
  // Which entries each parameter has: [slot k] and step.
  std::vector<std::vector<bool>> seen(params_.size(), std::vector<bool>(names.size(), false));
  std::vector<bool> has_step(params_.size(), false);
  bool has_lr = false, has_count = false;
  std::vector<std::string> all_names;
  for (const auto& [name, t] : state) {
    if (std::find(all_names.begin(), all_names.end(), name) != all_names.end())
      ag::fail(op, "'{}' appears twice", name);
    all_names.push_back(name);
    if (!t.defined()) ag::fail(op, "'{}' is undefined", name);
    if (name == "param_groups.0.lr") {
      if (t.dim() != 0) ag::fail(op, "'{}' must be a scalar (shape []), got shape {}", name, ag::shape_str(t.shape()));
      const double lr = t.item();
      if (!(lr >= 0.0) || !std::isfinite(lr)) ag::fail(op, "'{}' must be finite and >= 0, got {}", name, lr);
      has_lr = true;
      continue;
    }
    if (name == "step_count") {
      integral_scalar(op, name, t);
      has_count = true;
      continue;
    }
    // state.<i>.<slot>
    const std::string prefix = "state.";
    const auto dot = name.find('.', prefix.size());
    if (name.rfind(prefix, 0) != 0 || dot == std::string::npos)
      ag::fail(op, "unexpected entry '{}' (this {} expects state.<i>.<slot>, param_groups.0.lr, step_count)", name,
               name_);
    const std::string index_text = name.substr(prefix.size(), dot - prefix.size());
    const std::string slot = name.substr(dot + 1);
    std::size_t index = 0;
    if (index_text.empty() || index_text.size() > 9 ||
        !std::all_of(index_text.begin(), index_text.end(), [](char c) { return c >= '0' && c <= '9'; }))
      ag::fail(op, "unexpected entry '{}': '{}' is not a parameter index", name, index_text);
    index = std::stoul(index_text);
    if (index >= params_.size())
      ag::fail(op, "'{}' refers to parameter {} but this {} has {} parameters", name, index, name_, params_.size());
    if (slot == "step") {
      integral_scalar(op, name, t);
      has_step[index] = true;
      continue;
    }
    const auto it = std::find(names.begin(), names.end(), slot);
    if (it == names.end()) {
      std::string expected;
      for (const auto& n : names) {
        if (!expected.empty()) expected += ", ";
        expected += n;
      }
      ag::fail(op, "unexpected state slot '{}' in '{}' (this {} keeps: {})", slot, name, name_,
               expected.empty() ? "step only" : expected);
    }
    const auto& p = params_[index];
    if (t.shape() != p.shape())
      ag::fail(op, "'{}' has shape {} but parameter {} is {}", name, ag::shape_str(t.shape()), index,
               ag::shape_str(p.shape()));
    if (t.dtype() != p.dtype())
      ag::fail(op, "'{}' is {} but parameter {} is {}", name, ag::dtype_name(t.dtype()), index, ag::dtype_name(p.dtype()));
    seen[static_cast<std::size_t>(index)][static_cast<std::size_t>(it - names.begin())] = true;
  }
  if (!has_lr) ag::fail(op, "missing 'param_groups.0.lr'");
  if (!has_count) ag::fail(op, "missing 'step_count'");
  for (std::size_t i = 0; i < params_.size(); ++i) {
    for (std::size_t k = 0; k < names.size(); ++k) {
      if (seen[i][k] && !has_step[i]) ag::fail(op, "'state.{}.{}' is present but 'state.{}.step' is missing", i, names[k], i);
      if (has_step[i] && !seen[i][k]) ag::fail(op, "missing 'state.{}.{}' (parameter {} has a step count)", i, names[k], i);
    }
  }
}

void Optimizer::load_state_dict(const NamedTensors& state) {
  check_state_dict(state);
  ag::NoGradGuard no_grad;
  const auto names = slot_names();
  std::vector<std::vector<ag::Tensor>> slots(params_.size());
  std::vector<std::int64_t> steps(params_.size(), 0);
  double lr = lr_;
  std::int64_t count = 0;
  for (std::size_t i = 0; i < params_.size(); ++i) slots[i].resize(names.size());
  for (const auto& [name, t] : state) {
    if (name == "param_groups.0.lr") {
      lr = t.item();
    } else if (name == "step_count") {
      count = static_cast<std::int64_t>(t.item());
    } else {
      const auto dot = name.find('.', 6);
      const std::size_t index = std::stoul(name.substr(6, dot - 6));
      const std::string slot = name.substr(dot + 1);
      if (slot == "step") {
        steps[index] = static_cast<std::int64_t>(t.item());
      } else {
        const auto k = static_cast<std::size_t>(std::find(names.begin(), names.end(), slot) - names.begin());
        slots[index][k] = t.detach().clone();
      }
    }
  }
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (steps[i] == 0) slots[i].clear();
  slots_ = std::move(slots);
  steps_ = std::move(steps);
  lr_ = lr;
  step_count_ = count;
}

// ---- SGD ----

SGD::SGD(std::vector<ag::Tensor> params, const SGDOptions& options)
    : Optimizer("SGD", std::move(params), options.lr), options_(options) {
  check_hyper("SGD", "momentum", options.momentum, 0.0, std::numeric_limits<double>::max());
  check_hyper("SGD", "dampening", options.dampening, 0.0, 1.0);
  check_hyper("SGD", "weight_decay", options.weight_decay, 0.0, std::numeric_limits<double>::max());
  if (options.nesterov && (options.momentum <= 0.0 || options.dampening != 0.0))
    ag::fail("SGD", "Nesterov momentum needs momentum > 0 and dampening = 0 (got momentum {}, dampening {})",
             options.momentum, options.dampening);
}

std::span<const std::string_view> SGD::slot_names() const {
  static constexpr std::string_view kMomentum[] = {"momentum_buffer"};
  if (options_.momentum != 0.0) return kMomentum;
  return {};
}

void SGD::update(std::size_t, const ag::Tensor& param, const ag::Tensor& grad, std::vector<ag::Tensor>& slots,
                 std::int64_t step) {
  ag::dispatch(param.dtype(), [&](auto zero) {
    using T = decltype(zero);
    auto p = array_of<T>(param);
    const auto g0 = array_of<T>(grad);
    const T lr_t = static_cast<T>(lr()), wd = static_cast<T>(options_.weight_decay);
    const T mu = static_cast<T>(options_.momentum), damp = static_cast<T>(1.0 - options_.dampening);
    if (options_.momentum == 0.0) {
      if (options_.weight_decay != 0.0) {
        p -= lr_t * (g0 + wd * p);
      } else {
        p -= lr_t * g0;
      }
      return;
    }
    Eigen::Array<T, Eigen::Dynamic, 1> g = g0;
    if (options_.weight_decay != 0.0) g += wd * p;
    auto buf = array_of<T>(slots[0]);
    if (step == 1) {
      buf = g;  // PyTorch: the first buffer is the gradient itself, undamped
    } else {
      buf = mu * buf + damp * g;
    }
    if (options_.nesterov) {
      p -= lr_t * (g + mu * buf);
    } else {
      p -= lr_t * buf;
    }
  });
}

// ---- Adam / AdamW ----

Adam::Adam(std::vector<ag::Tensor> params, const AdamOptions& options)
    : Adam("Adam", std::move(params), options, false) {}

Adam::Adam(std::string name, std::vector<ag::Tensor> params, const AdamOptions& options, bool decoupled)
    : Optimizer(name, std::move(params), options.lr), options_(options), decoupled_(decoupled) {
  check_hyper(name, "beta1", options.beta1, 0.0, std::nextafter(1.0, 0.0));
  check_hyper(name, "beta2", options.beta2, 0.0, std::nextafter(1.0, 0.0));
  check_hyper(name, "eps", options.eps, 0.0, std::numeric_limits<double>::max());
  check_hyper(name, "weight_decay", options.weight_decay, 0.0, std::numeric_limits<double>::max());
}

std::span<const std::string_view> Adam::slot_names() const {
  static constexpr std::string_view kSlots[] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  return std::span<const std::string_view>(kSlots).first(options_.amsgrad ? 3 : 2);
}

void Adam::update(std::size_t, const ag::Tensor& param, const ag::Tensor& grad, std::vector<ag::Tensor>& slots,
                  std::int64_t step) {
  const double lr_now = lr();
  const double bias_correction1 = 1.0 - std::pow(options_.beta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(options_.beta2, static_cast<double>(step));
  ag::dispatch(param.dtype(), [&](auto zero) {
    using T = decltype(zero);
    auto p = array_of<T>(param);
    const auto g0 = array_of<T>(grad);
    auto m = array_of<T>(slots[0]);
    auto v = array_of<T>(slots[1]);
    const T wd = static_cast<T>(options_.weight_decay);
    const T one_minus_b1 = static_cast<T>(1.0 - options_.beta1);
    const T b2 = static_cast<T>(options_.beta2), one_minus_b2 = static_cast<T>(1.0 - options_.beta2);
    const T step_size = static_cast<T>(lr_now / bias_correction1);
    const T bc2_sqrt = static_cast<T>(std::sqrt(bias_correction2));
    const T eps = static_cast<T>(options_.eps);
    if (decoupled_ && options_.weight_decay != 0.0) p *= static_cast<T>(1.0 - lr_now * options_.weight_decay);
    if (!decoupled_ && options_.weight_decay != 0.0) {
      Eigen::Array<T, Eigen::Dynamic, 1> g = g0 + wd * p;
      m += one_minus_b1 * (g - m);
      v = b2 * v + one_minus_b2 * g * g;
    } else {
      m += one_minus_b1 * (g0 - m);
      v = b2 * v + one_minus_b2 * g0 * g0;
    }
    if (options_.amsgrad) {
      auto vmax = array_of<T>(slots[2]);
      vmax = vmax.max(v);
      p -= step_size * m / (vmax.sqrt() / bc2_sqrt + eps);
    } else {
      p -= step_size * m / (v.sqrt() / bc2_sqrt + eps);
    }
  });
}

AdamW::AdamW(std::vector<ag::Tensor> params, const AdamWOptions& o)
    : Adam("AdamW", std::move(params),
           AdamOptions{.lr = o.lr, .beta1 = o.beta1, .beta2 = o.beta2, .eps = o.eps, .weight_decay = o.weight_decay,
                       .amsgrad = o.amsgrad},
           true) {}

// ---- schedules ----

LRSchedule constant_lr(double lr) {
  return [lr](std::int64_t) { return lr; };
}

LRSchedule step_lr(double lr, std::int64_t step_size, double gamma) {
  if (step_size <= 0) ag::fail("step_lr", "step_size must be positive, got {}", step_size);
  return [=](std::int64_t step) { return lr * std::pow(gamma, static_cast<double>(std::max<std::int64_t>(step, 0) / step_size)); };
}

LRSchedule warmup_cosine_lr(double peak_lr, std::int64_t warmup_steps, std::int64_t total_steps, double min_lr) {
  if (warmup_steps < 0 || total_steps < warmup_steps)
    ag::fail("warmup_cosine_lr", "need 0 <= warmup_steps <= total_steps, got warmup_steps {} and total_steps {}",
             warmup_steps, total_steps);
  return [=](std::int64_t step) {
    if (step < warmup_steps) return peak_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
    if (step >= total_steps) return min_lr;
    const double progress = static_cast<double>(step - warmup_steps) / static_cast<double>(total_steps - warmup_steps);
    return min_lr + 0.5 * (peak_lr - min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
  };
}

LRScheduler::LRScheduler(Optimizer& optimizer, LRSchedule schedule, std::int64_t start_step)
    : optimizer_(&optimizer), schedule_(std::move(schedule)), step_(start_step) {
  if (!schedule_) ag::fail("LRScheduler", "schedule is empty");
  set_step(start_step);
}

void LRScheduler::step() { set_step(step_ + 1); }

void LRScheduler::set_step(std::int64_t step) {
  step_ = step;
  optimizer_->set_lr(schedule_(step_));
}

// ---- clipping ----

double clip_grad_norm_(const std::vector<ag::Tensor>& params, double max_norm, double norm_type) {
  if (!(max_norm >= 0.0)) ag::fail("clip_grad_norm_", "max_norm must be >= 0, got {}", max_norm);
  const bool inf_norm = std::isinf(norm_type) && norm_type > 0;
  if (!inf_norm && !(norm_type > 0.0))
    ag::fail("clip_grad_norm_", "norm_type must be positive or infinity, got {}", norm_type);
  ag::NoGradGuard no_grad;
  double acc = 0.0;
  for (const auto& p : params) {
    if (!p.defined()) ag::fail("clip_grad_norm_", "a parameter is undefined");
    const ag::Tensor g = p.grad();
    if (!g.defined()) continue;
    ag::dispatch(g.dtype(), [&](auto zero) {
      using T = decltype(zero);
      const auto a = array_of<T>(g).template cast<double>().abs();
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
    for (const auto& p : params) {
      ag::Tensor g = p.grad();
      if (g.defined()) g.mul_(coef);
    }
  }
  return total;
}

void clip_grad_value_(const std::vector<ag::Tensor>& params, double clip_value) {
  if (!(clip_value >= 0.0)) ag::fail("clip_grad_value_", "clip_value must be >= 0, got {}", clip_value);
  ag::NoGradGuard no_grad;
  for (const auto& p : params) {
    if (!p.defined()) ag::fail("clip_grad_value_", "a parameter is undefined");
    ag::Tensor g = p.grad();
    if (!g.defined()) continue;
    ag::dispatch(g.dtype(), [&](auto zero) {
      using T = decltype(zero);
      auto a = array_of<T>(g);
      a = a.max(static_cast<T>(-clip_value)).min(static_cast<T>(clip_value));
    });
    g.mark_modified();
  }
}

}  // namespace nn
