// run_with_cache and ActivationCache: owned snapshots of hook-point values and gradients.
#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "nn/hooks.hpp"
#include "nn/module.hpp"

namespace nn {

namespace {

constexpr std::string_view kOp = "run_with_cache";

// A copy outside any graph, in storage of its own: nothing done to t later changes it.
ag::Tensor snapshot(const ag::Tensor& t) {
  ag::NoGradGuard no_grad;
  return t.detach().clone();
}

// Removes the caching hooks when run_with_cache leaves, normally or by an exception.
struct RemoveOnExit {
  std::vector<HookHandle> handles;
  ~RemoveOnExit() {
    for (auto& h : handles) h.remove();
  }
};

}  // namespace

const ActivationCache::Entry& ActivationCache::entry(std::string_view what, const std::string& name) const {
  for (const auto& e : entries_)
    if (e.name == name) return e;
  if (std::find(asked_.begin(), asked_.end(), name) != asked_.end())
    ag::fail(what, "hook point {} was asked for but the forward never reached it (nothing it ran passes through "
             "that point); the cache holds: {}", quote_name(name),
             entries_.empty() ? std::string("(nothing)") : fmt::format("{}", fmt::join(names(), ", ")));
  ag::fail(what, "no cached hook point {}; the cache holds: {}", quote_name(name),
           entries_.empty() ? std::string("(nothing)") : fmt::format("{}", fmt::join(names(), ", ")));
}

const ag::Tensor& ActivationCache::operator[](const std::string& name) const {
  return entry("ActivationCache", name).value;
}

const ag::Tensor& ActivationCache::grad(const std::string& name) const {
  const Entry& e = entry("ActivationCache::grad", name);
  if (!backward_)
    ag::fail("ActivationCache::grad", "gradients were not cached: run_with_cache with CacheOptions::backward = true "
             "(asked for {})", quote_name(name));
  if (!e.grad.defined())
    ag::fail("ActivationCache::grad", "no gradient reached {}: the loss does not depend on it, or its value did not "
             "require grad (e.g. forward ran under NoGradGuard)", quote_name(name));
  return e.grad;
}

const ag::Tensor& ActivationCache::live(const std::string& name) const {
  const Entry& e = entry("ActivationCache::live", name);
  if (!keep_graph_)
    ag::fail("ActivationCache::live", "live tensors were not kept: run_with_cache with CacheOptions::keep_graph = "
             "true (asked for {})", quote_name(name));
  return e.live;
}

bool ActivationCache::contains(const std::string& name) const {
  for (const auto& e : entries_)
    if (e.name == name) return true;
  return false;
}

bool ActivationCache::has_grad(const std::string& name) const {
  for (const auto& e : entries_)
    if (e.name == name) return e.grad.defined();
  return false;
}

std::vector<std::string> ActivationCache::names() const {
  std::vector<std::string> out;
  for (const auto& e : entries_) out.push_back(e.name);
  return out;
}

ActivationCache run_with_cache(Module& model, const std::function<ag::Tensor()>& forward,
                               const CacheOptions& options) {
  if (!forward) ag::fail(kOp, "forward is empty");
  const std::vector<std::string> names = options.names.empty() ? model.hook_point_names() : options.names;
  for (std::size_t i = 0; i < names.size(); ++i)
    if (std::find(names.begin() + static_cast<std::ptrdiff_t>(i) + 1, names.end(), names[i]) != names.end())
      ag::fail(kOp, "hook point {} is named more than once in CacheOptions::names", quote_name(names[i]));
  // The hooks fill this while forward and backward run; shared so a hook never outlives it.
  auto cache = std::make_shared<ActivationCache>();
  cache->backward_ = options.backward;
  cache->keep_graph_ = options.keep_graph;
  cache->asked_ = names;
  auto find = [cache](const std::string& name) -> ActivationCache::Entry* {
    for (auto& e : cache->entries_)
      if (e.name == name) return &e;
    return nullptr;
  };
  RemoveOnExit hooks;
  for (const auto& name : names) {
    const bool keep = options.keep_graph;
    hooks.handles.push_back(model.add_hook(name, [cache, find, keep](const ag::Tensor& value, const std::string& n) {
      if (find(n) != nullptr)
        ag::fail(kOp, "hook point {} was reached twice in one forward (a module called twice?); the cache keeps one "
                 "value per point", quote_name(n));
      cache->entries_.push_back({n, snapshot(value), {}, keep ? value : ag::Tensor()});
      return ag::Tensor();
    }));
    if (options.backward)
      hooks.handles.push_back(model.add_backward_hook(name, [find](const ag::Tensor& grad, const std::string& n) {
        if (ActivationCache::Entry* e = find(n)) e->grad = snapshot(grad);
      }));
  }
  const ag::Tensor out = forward();
  if (options.backward) {
    if (!out.defined() || out.numel() != 1)
      ag::fail(kOp, "with backward = true, forward must return a one-element loss, got {}",
               out.defined() ? ag::shape_str(out.shape()) : std::string("an undefined tensor"));
    if (!ag::is_floating(out.dtype()))
      ag::fail(kOp, "with backward = true, forward must return a floating (Float32 or Float64) one-element loss to "
               "differentiate, got {} {}", ag::dtype_name(out.dtype()), ag::shape_str(out.shape()));
    if (!out.requires_grad())
      ag::fail(kOp, "with backward = true, the loss must require grad (did forward run under NoGradGuard?)");
    out.backward();
  }
  if (out.defined()) cache->output = snapshot(out);
  ActivationCache result = std::move(*cache);
  return result;
}

}  // namespace nn
