#include "nn/module.hpp"

#include <stdexcept>

namespace nn {

ag::Tensor Module::register_parameter(std::string name, ag::Tensor t, bool requires_grad) {
  if (name.empty() || name.find('.') != std::string::npos)
    ag::fail("register_parameter", "name '{}' must be non-empty and contain no '.'", name);
  if (!t.defined()) ag::fail("register_parameter", "parameter '{}' is undefined", name);
  for (const auto& [n, p] : params_)
    if (n == name) ag::fail("register_parameter", "parameter '{}' is already registered", name);
  if (!t.is_leaf()) t = t.detach();
  t.requires_grad_(requires_grad);
  if (t.name().empty()) t.set_name(name);
  params_.emplace_back(std::move(name), t);
  return t;
}

void Module::register_child(std::string name, std::shared_ptr<Module> module) {
  if (name.empty() || name.find('.') != std::string::npos)
    ag::fail("register_module", "name '{}' must be non-empty and contain no '.'", name);
  if (!module) ag::fail("register_module", "module '{}' is null", name);
  for (const auto& [n, m] : children_)
    if (n == name) ag::fail("register_module", "module '{}' is already registered", name);
  children_.emplace_back(std::move(name), std::move(module));
}

void Module::collect(const std::string& prefix, bool recurse, NamedTensors& out) const {
  for (const auto& [name, p] : params_) out.emplace_back(prefix + name, p);
  if (!recurse) return;
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", true, out);
}

NamedTensors Module::named_parameters(bool recurse) const {
  NamedTensors out;
  collect("", recurse, out);
  return out;
}

std::vector<ag::Tensor> Module::parameters(bool recurse) const {
  std::vector<ag::Tensor> out;  // in named_parameters' order, without building the names
  collect_tensors(recurse, out);
  return out;
}

void Module::collect_tensors(bool recurse, std::vector<ag::Tensor>& out) const {
  for (const auto& entry : params_) out.push_back(entry.second);
  if (!recurse) return;
  for (const auto& entry : children_) entry.second->collect_tensors(true, out);
}

std::int64_t Module::num_parameters() const {
  std::int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return n;
}

ag::Tensor Module::parameter(const std::string& dotted_name) const {
  for (auto& [name, p] : named_parameters())
    if (name == dotted_name) return p;
  ag::fail("parameter", "no parameter named '{}' in {}", dotted_name, type_name_);
}

void Module::zero_grad(bool set_to_none) {
  ag::NoGradGuard no_grad;
  // Walks the tree in place (no list of parameters built: a training step allocates nothing).
  for (auto& entry : params_) {
    ag::Tensor& p = entry.second;
    if (set_to_none || !p.grad().defined()) {
      p.set_grad(ag::Tensor());
    } else {
      p.grad().zero_();
    }
  }
  for (auto& entry : children_) entry.second->zero_grad(set_to_none);
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

Module& Module::to(ag::Dtype dtype) {
  ag::NoGradGuard no_grad;
  for (auto& p : parameters())
    if (p.dtype() != dtype) p.set_data(p.detach().to(dtype));
  return *this;
}

void Module::print(std::string& out, const std::string& name, int indent) const {
  const std::string pad(static_cast<std::size_t>(indent) * 2, ' ');
  out += fmt::format("{}{}{}({})  [{} parameters]\n", pad, name.empty() ? "" : name + ": ", type_name_,
                     extra_repr(), num_parameters());
  for (const auto& [n, p] : params_)
    out += fmt::format("{}  {} {} {}\n", pad, n, ag::shape_str(p.shape()), ag::dtype_name(p.dtype()));
  for (const auto& [n, child] : children_) child->print(out, n, indent + 1);
}

std::string Module::to_string() const {
  std::string out;
  print(out, "", 0);
  if (!out.empty()) out.pop_back();
  return out;
}

}  // namespace nn
