#include "nn/optim.hpp"

#include <cmath>
#include <limits>
#include <utility>


namespace nn {


namespace {

void check_hyper(const std::string& op, const char* what, double value, double low, double high) {
  if (!(value >= low && value <= high))
    ag::fail(op, "{} must be in [{}, {}], got {}", what, low, high, value);
}

std::string shape_and_dtype(const ag::Tensor& t) {
  return fmt::format("{} {}", ag::shape_str(t.shape()), ag::dtype_name(t.dtype()));
}

}  // namespace

// ---- Optimizer ----

OptimizerParams::OptimizerParams(const NamedTensors& named) {
  tensors.reserve(named.size());
  names.reserve(named.size());
  for (const auto& [name, t] : named) {
    names.push_back(name);
    tensors.push_back(t);
  }
}

Optimizer::Optimizer(std::string name, OptimizerParams params, double lr)
    : name_(std::move(name)), params_(std::move(params.tensors)), names_(std::move(params.names)), lr_(lr) {
  names_.resize(params_.size());
  if (params_.empty()) ag::fail(name_, "got an empty parameter list");
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const auto& p = params_[i];
    if (!p.defined()) ag::fail(name_, "{} is undefined", describe(i));
    if (!ag::is_floating(p.dtype()))
      ag::fail(name_, "{} is {} {}; an optimizer takes Float32 or Float64 parameters only (leave Int64 ones out)",
               describe(i), ag::dtype_name(p.dtype()), ag::shape_str(p.shape()));
    // (A frozen leaf, requires_grad = false, is allowed: it never gets a gradient, so it is skipped.)
    if (!p.is_leaf())
      ag::fail(name_, "{} {} is not a leaf (it was computed by an op); pass the tensor itself", describe(i),
               ag::shape_str(p.shape()));
    for (std::size_t j = 0; j < i; ++j)
      if (params_[j].is_same(p)) ag::fail(name_, "{} appears twice (also at {})", describe(i), j);
  }
  set_lr(lr);
  slots_.resize(params_.size());
  steps_.assign(params_.size(), 0);
}

std::string Optimizer::describe(std::size_t i) const {
  if (i < names_.size() && !names_[i].empty()) return fmt::format("parameter {} ({})", i, quote_name(names_[i]));
  return fmt::format("parameter {}", i);
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

// Everything update() relies on, for every parameter, before any parameter changes.
void Optimizer::check_step() const {
  const auto names = slot_names();
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const ag::Tensor& p = params_[i];
    if (!ag::is_floating(p.dtype()))  // converted after construction (set_data)
      ag::fail(name_ + ".step", "{} is {}; an optimizer takes Float32 or Float64 parameters only; no parameter was "
               "changed", describe(i), shape_and_dtype(p));
    const ag::Tensor g = p.grad();
    if (!g.defined()) continue;
    if (g.shape() != p.shape() || g.dtype() != p.dtype())
      ag::fail(name_ + ".step", "the gradient of {} is {} but the parameter is {}; no parameter was changed",
               describe(i), shape_and_dtype(g), shape_and_dtype(p));
    if (slots_[i].size() != names.size()) continue;  // created below, shaped like the parameter
    for (std::size_t k = 0; k < names.size(); ++k) {
      const ag::Tensor& s = slots_[i][k];
      if (s.shape() != p.shape() || s.dtype() != p.dtype())
        ag::fail(name_ + ".step",
                 "{} is {} but its {} state is {}: the parameter changed after its state was created (convert "
                 "the model, e.g. with Module::to, before creating the optimizer); no parameter was changed",
                 describe(i), shape_and_dtype(p), names[k], shape_and_dtype(s));
    }
  }
}

void Optimizer::step() {
  ag::NoGradGuard no_grad;
  check_step();
  const auto names = slot_names();
  // New state first (zero-filled, as if never used), so that nothing can fail once updating starts.
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const ag::Tensor& p = params_[i];
    if (!p.grad().defined() || slots_[i].size() == names.size()) continue;
    std::vector<ag::Tensor> fresh;
    for (std::size_t k = 0; k < names.size(); ++k) fresh.push_back(ag::zeros(p.shape(), p.dtype()));
    slots_[i] = std::move(fresh);
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const ag::Tensor& p = params_[i];
    const ag::Tensor g = p.grad();
    if (!g.defined()) continue;
    ++steps_[i];
    update(i, p, g, slots_[i], steps_[i]);
    p.mark_modified();
  }
  ++step_count_;
}

// ---- SGD ----

SGD::SGD(OptimizerParams params, const SGDOptions& options)
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
    auto p = param.template as_array<T>();
    const auto g0 = grad.template as_array<T>();
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
    auto buf = slots[0].template as_array<T>();
    // g = grad (+ weight_decay·p), passed as an expression: no temporary, so a warm step allocates nothing.
    auto apply = [&](const auto& g) {
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
    };
    if (options_.weight_decay != 0.0) {
      apply(g0 + wd * p);
    } else {
      apply(g0);
    }
  });
}

// ---- Adam / AdamW ----

Adam::Adam(OptimizerParams params, const AdamOptions& options)
    : Adam("Adam", std::move(params), options, false) {}

Adam::Adam(std::string name, OptimizerParams params, const AdamOptions& options, bool decoupled)
    : Optimizer(name, std::move(params), options.lr), options_(options), decoupled_(decoupled) {
  check_hyper(name, "beta1", options.beta1, 0.0, std::nextafter(1.0, 0.0));
  check_hyper(name, "beta2", options.beta2, 0.0, std::nextafter(1.0, 0.0));
  // eps keeps m / (sqrt(v) + eps) finite where v is 0 (a gradient that has always been 0): 0 would
  // make that 0/0 = NaN.
  if (!(options.eps > 0.0) || !std::isfinite(options.eps))
    ag::fail(name, "eps must be positive and finite, got {}", options.eps);
  check_hyper(name, "weight_decay", options.weight_decay, 0.0, std::numeric_limits<double>::max());
}

std::span<const std::string_view> Adam::slot_names() const {
  static constexpr std::string_view kSlots[] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  return std::span<const std::string_view>(kSlots).first(options_.amsgrad ? 3 : 2);
}

bool Adam::slot_is_nonnegative(std::string_view slot) const {
  return slot == "exp_avg_sq" || slot == "max_exp_avg_sq";  // running averages of g²
}

void Adam::update(std::size_t, const ag::Tensor& param, const ag::Tensor& grad, std::vector<ag::Tensor>& slots,
                  std::int64_t step) {
  const double lr_now = lr();
  const double bias_correction1 = 1.0 - std::pow(options_.beta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(options_.beta2, static_cast<double>(step));
  ag::dispatch(param.dtype(), [&](auto zero) {
    using T = decltype(zero);
    auto p = param.template as_array<T>();
    const auto g0 = grad.template as_array<T>();
    auto m = slots[0].template as_array<T>();
    auto v = slots[1].template as_array<T>();
    const T wd = static_cast<T>(options_.weight_decay);
    const T one_minus_b1 = static_cast<T>(1.0 - options_.beta1);
    const T b2 = static_cast<T>(options_.beta2), one_minus_b2 = static_cast<T>(1.0 - options_.beta2);
    const T step_size = static_cast<T>(lr_now / bias_correction1);
    const T bc2_sqrt = static_cast<T>(std::sqrt(bias_correction2));
    const T eps = static_cast<T>(options_.eps);
    if (decoupled_ && options_.weight_decay != 0.0) p *= static_cast<T>(1.0 - lr_now * options_.weight_decay);
    auto moments = [&](const auto& g) {  // g as an expression, no temporary
      m += one_minus_b1 * (g - m);
      v = b2 * v + one_minus_b2 * g * g;
    };
    if (!decoupled_ && options_.weight_decay != 0.0) {
      moments(g0 + wd * p);  // L2 penalty: g = grad + weight_decay·p
    } else {
      moments(g0);
    }
    if (options_.amsgrad) {
      auto vmax = slots[2].template as_array<T>();
      vmax = vmax.max(v);
      p -= step_size * m / (vmax.sqrt() / bc2_sqrt + eps);
    } else {
      p -= step_size * m / (v.sqrt() / bc2_sqrt + eps);
    }
  });
}

AdamW::AdamW(OptimizerParams params, const AdamWOptions& o)
    : Adam("AdamW", std::move(params),
           AdamOptions{.lr = o.lr, .beta1 = o.beta1, .beta2 = o.beta2, .eps = o.eps, .weight_decay = o.weight_decay,
                       .amsgrad = o.amsgrad},
           true) {}

}  // namespace nn
