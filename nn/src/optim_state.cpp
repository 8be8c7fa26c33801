// Optimizer state as named tensors: saving, checking and loading (all or nothing).
#include <algorithm>
#include <cmath>
#include <string>
#include <unordered_set>
#include <utility>

#include "nn/optim.hpp"

namespace nn {

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

// What one state entry is, from its name: "param_groups.0.lr", "step_count", "state.<i>.step"
// or "state.<i>.<slot>" (slot = index into the optimizer's slot names).
struct Entry {
  enum class Kind { Lr, Count, Step, Slot } kind = Kind::Lr;
  std::size_t index = 0;
  std::size_t slot = 0;
};

Entry parse_entry(const std::string& op, const std::string& name, std::size_t num_params,
                  std::span<const std::string_view> slots, const std::string& optimizer) {
  if (name == "param_groups.0.lr") return {Entry::Kind::Lr};
  if (name == "step_count") return {Entry::Kind::Count};
  const std::string prefix = "state.";
  const auto dot = name.find('.', prefix.size());
  if (name.rfind(prefix, 0) != 0 || dot == std::string::npos)
    ag::fail(op, "unexpected entry {} (this {} expects state.<i>.<slot>, param_groups.0.lr, step_count)",
             quote_name(name), optimizer);
  const std::string index_text = name.substr(prefix.size(), dot - prefix.size());
  const std::string slot = name.substr(dot + 1);
  if (index_text.empty() || index_text.size() > 9 ||
      !std::all_of(index_text.begin(), index_text.end(), [](char c) { return c >= '0' && c <= '9'; }))
    ag::fail(op, "unexpected entry {}: {} is not a parameter index", quote_name(name), quote_name(index_text));
  const std::size_t index = std::stoul(index_text);
  if (index >= num_params)
    ag::fail(op, "{} refers to parameter {} but this {} has {} parameters", quote_name(name), index, optimizer,
             num_params);
  if (slot == "step") return {Entry::Kind::Step, index};
  const auto it = std::find(slots.begin(), slots.end(), slot);
  if (it == slots.end()) {
    std::string expected;
    for (const auto& n : slots) expected += (expected.empty() ? "" : ", ") + std::string(n);
    ag::fail(op, "unexpected state slot {} in {} (this {} keeps: {})", quote_name(slot), quote_name(name), optimizer,
             expected.empty() ? "step only" : expected);
  }
  return {Entry::Kind::Slot, index, static_cast<std::size_t>(it - slots.begin())};
}

void check_scalar(const std::string& op, const std::string& name, const ag::Tensor& t) {
  if (t.numel() != 1 || t.dim() != 0)
    ag::fail(op, "{} must be a scalar (shape []), got shape {}", quote_name(name), ag::shape_str(t.shape()));
}

// A Float64/Float32 scalar holding a non-negative integer (a step count).
std::int64_t integral_scalar(const std::string& op, const std::string& name, const ag::Tensor& t) {
  check_scalar(op, name, t);
  const double v = t.item();
  if (!(v >= 0.0) || v != std::floor(v) || v > 9.007199254740992e15)
    ag::fail(op, "{} must be a non-negative integer, got {}", quote_name(name), v);
  return static_cast<std::int64_t>(v);
}

}  // namespace

// A state no run can reach (NaN or infinite moments, a negative second moment) would turn every
// weight into NaN on the next step: refused, naming the first bad element.
void Optimizer::check_slot_values(const std::string& op, const std::string& entry, std::size_t i,
                                  std::string_view slot, const ag::Tensor& t) const {
  const bool nonnegative = slot_is_nonnegative(slot);
  ag::dispatch(t.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const auto a = t.template as_array<T>();
    if (a.isFinite().all() && (!nonnegative || (a >= T(0)).all())) return;
    for (Eigen::Index j = 0; j < a.size(); ++j) {
      const T v = a[j];
      if (!std::isfinite(v) || (nonnegative && v < T(0)))
        ag::fail(op, "{} holds {} at element {}, but the {} of {} must be finite{}", quote_name(entry), v, j, slot,
                 describe(i), nonnegative ? " and >= 0" : "");
    }
  });
}

void Optimizer::check_state_dict(const NamedTensors& state) const {
  const std::string op = name_ + ".load_state_dict";
  const auto names = slot_names();
  // Which entries each parameter has: [slot k] and step.
  std::vector<std::vector<bool>> seen(params_.size(), std::vector<bool>(names.size(), false));
  std::vector<bool> has_step(params_.size(), false);
  bool has_lr = false, has_count = false;
  std::unordered_set<std::string> all_names;
  for (const auto& [name, t] : state) {
    if (!all_names.insert(name).second) ag::fail(op, "{} appears twice", quote_name(name));
    if (!t.defined()) ag::fail(op, "{} is undefined", quote_name(name));
    const Entry e = parse_entry(op, name, params_.size(), names, name_);
    if (e.kind == Entry::Kind::Lr) {
      check_scalar(op, name, t);
      const double lr = t.item();
      if (!(lr >= 0.0) || !std::isfinite(lr)) ag::fail(op, "{} must be finite and >= 0, got {}", quote_name(name), lr);
      has_lr = true;
    } else if (e.kind == Entry::Kind::Count) {
      integral_scalar(op, name, t);
      has_count = true;
    } else if (e.kind == Entry::Kind::Step) {
      integral_scalar(op, name, t);
      has_step[e.index] = true;
    } else {
      const auto& p = params_[e.index];
      if (t.shape() != p.shape())
        ag::fail(op, "{} has shape {} but {} is {}", quote_name(name), ag::shape_str(t.shape()), describe(e.index),
                 ag::shape_str(p.shape()));
      if (t.dtype() != p.dtype())
        ag::fail(op, "{} is {} but {} is {}", quote_name(name), ag::dtype_name(t.dtype()), describe(e.index),
                 ag::dtype_name(p.dtype()));
      check_slot_values(op, name, e.index, names[e.slot], t);
      seen[e.index][e.slot] = true;
    }
  }
  if (!has_lr) ag::fail(op, "missing 'param_groups.0.lr'");
  if (!has_count) ag::fail(op, "missing 'step_count'");
  for (std::size_t i = 0; i < params_.size(); ++i) {
    for (std::size_t k = 0; k < names.size(); ++k) {
      if (seen[i][k] && !has_step[i]) ag::fail(op, "'state.{}.{}' is present but 'state.{}.step' is missing", i, names[k], i);
      if (has_step[i] && !seen[i][k]) ag::fail(op, "missing 'state.{}.{}' ({} has a step count)", i, names[k], describe(i));
    }
  }
}

void Optimizer::load_state_dict(const NamedTensors& state) {
  check_state_dict(state);
  ag::NoGradGuard no_grad;
  const auto names = slot_names();
  std::vector<std::vector<ag::Tensor>> slots(params_.size(), std::vector<ag::Tensor>(names.size()));
  std::vector<std::int64_t> steps(params_.size(), 0);
  double lr = lr_;
  std::int64_t count = 0;
  for (const auto& [name, t] : state) {
    const Entry e = parse_entry(name_, name, params_.size(), names, name_);
    if (e.kind == Entry::Kind::Lr) {
      lr = t.item();
    } else if (e.kind == Entry::Kind::Count) {
      count = static_cast<std::int64_t>(t.item());
    } else if (e.kind == Entry::Kind::Step) {
      steps[e.index] = static_cast<std::int64_t>(t.item());
    } else {
      slots[e.index][e.slot] = t.detach().clone();
    }
  }
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (steps[i] == 0) slots[i].clear();
  slots_ = std::move(slots);
  steps_ = std::move(steps);
  lr_ = lr;
  step_count_ = count;
}

}  // namespace nn
