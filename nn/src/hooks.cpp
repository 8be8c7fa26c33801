// Hook points: the per-module hook lists, their handles, and running a point's hooks in forward.
#include "nn/hooks.hpp"

#include <algorithm>

#include "nn/module.hpp"

namespace nn {

namespace {

template <class Entries>
bool erase_id(Entries& entries, std::uint64_t id) {
  const auto it = std::find_if(entries.begin(), entries.end(), [id](const auto& e) { return e.id == id; });
  if (it == entries.end()) return false;
  entries.erase(it);
  return true;
}

template <class Entries>
bool has_id(const Entries& entries, std::uint64_t id) {
  return std::any_of(entries.begin(), entries.end(), [id](const auto& e) { return e.id == id; });
}

}  // namespace

void HookHandle::remove() {
  const auto state = state_.lock();
  if (!state || point_ >= state->forward.size()) return;
  const bool erased = backward_ ? erase_id(state->backward[point_], id_) : erase_id(state->forward[point_], id_);
  if (erased) --state->count;
}

bool HookHandle::active() const {
  const auto state = state_.lock();
  if (!state || point_ >= state->forward.size()) return false;
  return backward_ ? has_id(state->backward[point_], id_) : has_id(state->forward[point_], id_);
}

HookPoints::HookPoints(std::vector<std::string> names)
    : names_(std::move(names)), state_(std::make_shared<detail::HookState>()) {
  state_->forward.resize(names_.size());
  state_->backward.resize(names_.size());
}

std::size_t HookPoints::index(std::string_view local_name) const {
  for (std::size_t i = 0; i < names_.size(); ++i)
    if (names_[i] == local_name) return i;
  return npos;
}

bool HookPoints::hooked(std::size_t point) const {
  return any() && point < names_.size() && (!state_->forward[point].empty() || !state_->backward[point].empty());
}

void check_replacement(std::string_view op, std::string_view name, const ag::Tensor& value,
                       const ag::Tensor& replacement) {
  if (replacement.shape() != value.shape() || replacement.dtype() != value.dtype())
    ag::fail(op, "hook point {}: the replacement has shape {} and dtype {}, the value shape {} and dtype {} (a "
             "replacement must match both)",
             quote_name(name), ag::shape_str(replacement.shape()), ag::dtype_name(replacement.dtype()),
             ag::shape_str(value.shape()), ag::dtype_name(value.dtype()));
}

ag::Tensor HookPoints::run(std::size_t point, const ag::Tensor& value) const {
  if (!hooked(point)) return value;
  ag::Tensor result = value;
  if (!state_->forward[point].empty()) {
    // Counts this module's nested hook runs, so a hook that calls forward without end throws.
    struct Depth {
      detail::HookState& s;
      explicit Depth(detail::HookState& state) : s(state) { ++s.depth; }
      ~Depth() { --s.depth; }
    } depth(*state_);
    if (state_->depth > kMaxHookDepth)
      ag::fail("forward hook", "hook point {}: forward hooks nested {} deep (a hook that calls forward of its own "
               "model, without end?)", quote_name(state_->forward[point].front().name), kMaxHookDepth);
    const auto hooks = state_->forward[point];  // a copy: a hook may add or remove hooks
    for (const auto& h : hooks) {
      if (!has_id(state_->forward[point], h.id)) continue;  // removed by an earlier hook
      ag::Tensor replacement = h.fn(result, h.name);
      if (!replacement.defined()) continue;
      check_replacement("forward hook", h.name, result, replacement);
      result = std::move(replacement);
    }
  }
  if (!state_->backward[point].empty() && result.requires_grad()) {
    // A view of its own, so the hook sees the gradient of the uses after this point only (not
    // of other uses of the same tensor, e.g. the caller's), and a leaf input stays untouched.
    result = ag::reshape(result, result.shape());
    std::vector<std::uint64_t> ids;
    for (const auto& h : state_->backward[point]) ids.push_back(h.id);
    const std::weak_ptr<detail::HookState> weak = state_;
    result.register_hook([weak, point, ids](const ag::Tensor& grad) -> ag::Tensor {
      const auto state = weak.lock();
      if (!state) return {};
      const auto hooks = state->backward[point];  // only those added at forward and still there
      for (const auto& h : hooks)
        if (std::find(ids.begin(), ids.end(), h.id) != ids.end()) h.fn(grad, h.name);
      return {};
    });
  }
  return result;
}

HookHandle HookPoints::add(std::size_t point, std::string dotted_name, ForwardHook hook) {
  const std::uint64_t id = state_->next_id++;
  state_->forward.at(point).push_back({id, std::move(dotted_name), std::move(hook)});
  ++state_->count;
  return HookHandle(state_, point, id, false);
}

HookHandle HookPoints::add_backward(std::size_t point, std::string dotted_name, BackwardHook hook) {
  const std::uint64_t id = state_->next_id++;
  state_->backward.at(point).push_back({id, std::move(dotted_name), std::move(hook)});
  ++state_->count;
  return HookHandle(state_, point, id, true);
}

void HookPoints::clear() {
  if (!state_) return;
  for (auto& f : state_->forward) f.clear();
  for (auto& b : state_->backward) b.clear();
  state_->count = 0;
}

}  // namespace nn
