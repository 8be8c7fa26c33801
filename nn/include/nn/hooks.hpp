#pragma once
// Hook points: named places inside a module's forward where a study can read a tensor, replace
// it, or catch its gradient (TransformerLens's HookPoint, in C++).
//
//   attn.add_hook("pattern", [](const ag::Tensor& value, const std::string& name) {
//     return ag::Tensor();  // undefined: keep the value; or return a replacement
//   });
//
// Modules declare their points (nn::MultiHeadAttention: q, k, v, raw_scores, attn_scores, pattern, z,
// concat, result, out; nn::TransformerBlock: resid_pre, resid_mid, mlp_hidden, resid_post). A model names
// them with dots, as named_parameters() names parameters: "block.attn.pattern".
//
// Rules:
//   - A forward hook sees the value and the dotted name it was added under; it returns an
//     undefined tensor to keep the value, or a replacement of the same shape and dtype (anything
//     else throws, naming the point and both shapes). The replacement flows on through the rest of
//     the forward and its graph: a replacement that requires grad passes gradients back.
//   - Several hooks on one point run in the order they were added, each on the previous one's result.
//     A hook removed while the point's hooks run (by an earlier hook) does not run; one added then
//     runs from the next time the point is reached. A hook may call forward of its own model, but
//     nesting deeper than kMaxHookDepth throws (a hook that calls forward without end).
//   - A backward hook sees dL/d(value) for the value after every forward hook, in the same
//     backward pass (a tensor hook on that value). It fires only if the hook is still added when
//     backward reaches the point, and only for forwards that recorded a graph.
//   - Hooks stay until removed (HookHandle::remove, Module::remove_hooks); handles are not RAII.
//   - With no hook on a layer, its forward runs exactly as without hook points (fused core).
//   - Hooks are not thread-safe: do not add or remove them while another thread runs forward.
//
// run_with_cache runs a forward (and optionally backward) and returns owned snapshots of the
// values (and gradients) at the hook points asked for: copies outside any graph, which no later
// forward changes.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <autograd/autograd.hpp>

namespace nn {

namespace ag = autograd;

class Module;

// Returns an undefined tensor to keep `value`, or its replacement (same shape and dtype).
using ForwardHook = std::function<ag::Tensor(const ag::Tensor& value, const std::string& name)>;
// Sees the gradient of the loss with respect to the hook point's value.
using BackwardHook = std::function<void(const ag::Tensor& grad, const std::string& name)>;

namespace detail {

template <class Fn>
struct HookEntry {
  std::uint64_t id = 0;
  std::string name;  // the dotted name the hook was added under
  Fn fn;
};

// The hooks of one module's points; shared with the handles (weakly) and with the tensor hooks a
// forward leaves on its graph, so a removed hook never fires.
struct HookState {
  std::vector<std::vector<HookEntry<ForwardHook>>> forward;    // per point
  std::vector<std::vector<HookEntry<BackwardHook>>> backward;  // per point
  std::uint64_t next_id = 1;
  std::size_t count = 0;  // hooks over all points
  int depth = 0;          // forward hooks of this module running now, nested (a hook may call forward)
};

}  // namespace detail

// How deep forward hooks of one module may nest (a hook calling its own model's forward) before
// run throws instead of overflowing the stack.
inline constexpr int kMaxHookDepth = 32;

// Removes one hook. Not RAII: dropping the handle keeps the hook.
class HookHandle {
 public:
  HookHandle() = default;
  void remove();        // no-op when already removed (or its module is gone)
  bool active() const;  // the hook is still added

 private:
  friend class HookPoints;
  HookHandle(std::weak_ptr<detail::HookState> state, std::size_t point, std::uint64_t id, bool backward)
      : state_(std::move(state)), point_(point), id_(id), backward_(backward) {}
  std::weak_ptr<detail::HookState> state_;
  std::size_t point_ = 0;
  std::uint64_t id_ = 0;
  bool backward_ = false;
};

// A module's own hook points (local names, e.g. "pattern") and the hooks on them. Cheap when no
// hook is added: any() is one load and one compare.
class HookPoints {
 public:
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);

  HookPoints() = default;
  explicit HookPoints(std::vector<std::string> names);

  const std::vector<std::string>& names() const { return names_; }
  std::size_t index(std::string_view local_name) const;  // npos when there is no such point
  bool any() const { return state_ != nullptr && state_->count != 0; }
  std::size_t count() const { return state_ != nullptr ? state_->count : 0; }
  bool hooked(std::size_t point) const;  // any forward or backward hook on this point

  // The forward hooks of `point` on value, in order, each replacement checked; then a tensor hook
  // for the point's backward hooks on the result (when it requires grad). Returns the result.
  ag::Tensor run(std::size_t point, const ag::Tensor& value) const;

  HookHandle add(std::size_t point, std::string dotted_name, ForwardHook hook);
  HookHandle add_backward(std::size_t point, std::string dotted_name, BackwardHook hook);
  void clear();

 private:
  std::vector<std::string> names_;
  std::shared_ptr<detail::HookState> state_;
};

// The replacement a hook returned at `name` has value's shape and dtype; throws naming the point
// and both shapes otherwise. `op` starts the message.
void check_replacement(std::string_view op, std::string_view name, const ag::Tensor& value,
                       const ag::Tensor& replacement);

struct CacheOptions {
  std::vector<std::string> names = {};  // dotted hook-point names; empty = every hook point of the model
  bool backward = false;           // also cache each point's gradient: forward must return a one-element loss
  bool keep_graph = false;         // also keep each point's live tensor (in the forward's graph), see live()
};

class ActivationCache {
 public:
  // The value: throws naming the name and what is cached.
  const ag::Tensor& operator[](const std::string& name) const;
  // Its gradient: throws saying backward was not cached, or that no gradient reached the point.
  const ag::Tensor& grad(const std::string& name) const;
  // The tensor in the forward's graph (after any replacement), e.g. to mark it in ag::to_dot;
  // needs CacheOptions::keep_graph. A later in-place change to it shows here, not in operator[].
  const ag::Tensor& live(const std::string& name) const;
  bool contains(const std::string& name) const;
  bool has_grad(const std::string& name) const;
  std::vector<std::string> names() const;  // in the order the forward reached them
  ag::Tensor output;                       // what forward returned, as an owned copy outside the graph

  struct Entry {
    std::string name;
    ag::Tensor value, grad, live;
  };

 private:
  friend ActivationCache run_with_cache(Module&, const std::function<ag::Tensor()>&, const CacheOptions&);
  const Entry& entry(std::string_view what, const std::string& name) const;
  std::vector<Entry> entries_;
  std::vector<std::string> asked_;  // the names run_with_cache hooked
  bool backward_ = false;
  bool keep_graph_ = false;
};

// Runs forward() once (and loss.backward() when options.backward, which accumulates into the
// parameters' .grad as any backward does), with the model's hooks as they are plus caching hooks
// that see each value after those hooks' replacements. The caching hooks are removed afterwards,
// also when forward throws. A point reached twice in one forward (a module called twice) throws.
// Unknown names throw listing the model's hook points, a name given twice throws (before forward
// runs). A name forward never reached has no entry; asking for it says so.
ActivationCache run_with_cache(Module& model, const std::function<ag::Tensor()>& forward,
                               const CacheOptions& options = {});

}  // namespace nn
