// nn::Module's hook-point methods: list the tree's points by dotted name, add and remove hooks.
#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "nn/module.hpp"
#include "nn/transformer_lm.hpp"

namespace nn {

namespace {

std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

}  // namespace

void Module::declare_hook_points(std::vector<std::string> names) { hook_points_ = HookPoints(std::move(names)); }

std::vector<std::string> Module::hook_point_names() const {
  std::vector<std::string> out;
  for (const auto& [prefix, m] : named_modules())
    for (const auto& name : m->hook_points_.names()) out.push_back(join(prefix, name));
  return out;
}

std::pair<Module*, std::size_t> Module::find_hook_point(std::string_view op, const std::string& dotted_name) {
  for (const auto& [prefix, m] : named_modules()) {
    const std::string head = prefix.empty() ? "" : prefix + ".";
    if (dotted_name.size() <= head.size() || dotted_name.compare(0, head.size(), head) != 0) continue;
    const std::size_t point = m->hook_points_.index(std::string_view(dotted_name).substr(head.size()));
    if (point != HookPoints::npos) return {m, point};
  }
  const auto names = hook_point_names();
  // A TransformerLens name ("blocks.0.attn.hook_pattern"): say what it is called here.
  std::string hint;
  if (const std::string ours = transformer_lens_point_name(dotted_name);
      !ours.empty() && std::find(names.begin(), names.end(), ours) != names.end())
    hint = fmt::format(" (TransformerLens's {} is {} here)", quote_name(dotted_name), quote_name(ours));
  ag::fail(op, "no hook point named {} in {}{}; its hook points are: {}", quote_name(dotted_name), type_name_, hint,
           names.empty() ? std::string("(none)") : fmt::format("{}", fmt::join(names, ", ")));
}

HookHandle Module::add_hook(const std::string& dotted_name, ForwardHook hook) {
  if (!hook) ag::fail("add_hook", "the hook for {} is empty", quote_name(dotted_name));
  const auto [module, point] = find_hook_point("add_hook", dotted_name);
  return module->hook_points_.add(point, dotted_name, std::move(hook));
}

HookHandle Module::add_backward_hook(const std::string& dotted_name, BackwardHook hook) {
  if (!hook) ag::fail("add_backward_hook", "the hook for {} is empty", quote_name(dotted_name));
  const auto [module, point] = find_hook_point("add_backward_hook", dotted_name);
  return module->hook_points_.add_backward(point, dotted_name, std::move(hook));
}

std::size_t Module::hook_count() const {
  std::size_t n = 0;
  for (const auto& entry : named_modules()) n += entry.second->hook_points_.count();
  return n;
}

void Module::remove_hooks() {
  for (auto& entry : named_modules()) entry.second->hook_points_.clear();
}

}  // namespace nn
