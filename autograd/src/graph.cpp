// The graph's pieces: nodes and their release, leaf accumulators, saved tensors, and the
// recording of an op's node. The walk itself is in walk.cpp.
#include "autograd/graph.hpp"

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>

#include "autograd/anomaly.hpp"
#include "autograd/grad_mode.hpp"
#include "autograd/ops.hpp"
#include "walk_state.hpp"

namespace autograd {

namespace {

std::atomic<std::uint64_t> next_sequence_nr{0};

// The nodes this thread is freeing, whose edges (and hooks, which may hold tensors and so
// graphs) are still to be dropped. The outermost ~Node on a thread empties it in a loop; a ~Node
// run from that loop only adds its edges and hooks to it, so freeing a graph never recurses
// more than one node deep.
struct ReleaseList {
  std::vector<std::shared_ptr<Node>> nodes;
  std::vector<TensorHook> hooks;
  bool draining = false;
  ~ReleaseList();
};
thread_local bool release_list_destroyed = false;  // (trivial: readable during thread exit)
thread_local ReleaseList release_list;
ReleaseList::~ReleaseList() { release_list_destroyed = true; }

// One lock per leaf, picked from a fixed set by the leaf's address: it guards the creation
// of the leaf's accumulator and every addition into its .grad.
std::mutex& leaf_lock(const TensorImpl* leaf) {
  struct alignas(64) Stripe {
    std::mutex mutex;
  };
  static std::array<Stripe, 64> stripes;
  return stripes[(reinterpret_cast<std::uintptr_t>(leaf) >> 6) % stripes.size()].mutex;
}

}  // namespace

Node::Node(std::string_view name) : Node(name, false) {}
Node::Node(std::string_view name, bool accumulates_into_leaf)
    : sequence_nr(next_sequence_nr++), name_(name), accumulates_into_leaf_(accumulates_into_leaf) {}

Node::~Node() {
  if ((next_edges.empty() && output_hooks.empty()) || release_list_destroyed) return;  // (thread exit: plain)
  ReleaseList& list = release_list;
  try {
    for (auto& e : next_edges)
      if (e.node) list.nodes.push_back(std::move(e.node));
    for (auto& hooks : output_hooks)
      for (auto& hook : hooks) list.hooks.push_back(std::move(hook));
  } catch (...) {
    return;  // no memory for the list: what is left is dropped the plain (recursive) way
  }
  if (list.draining) return;  // an outer ~Node on this thread is emptying the list
  list.draining = true;
  while (!list.nodes.empty() || !list.hooks.empty()) {
    if (!list.hooks.empty()) {
      TensorHook hook = std::move(list.hooks.back());
      list.hooks.pop_back();
      hook = nullptr;  // the tensors it captured go; their nodes' ~Node adds to the list
      continue;
    }
    std::shared_ptr<Node> next = std::move(list.nodes.back());
    list.nodes.pop_back();
    next.reset();  // when this was its last owner, its ~Node adds its own edges to the list
  }
  list.draining = false;
}

void Node::mark_released() {
  released_ = true;
  release_saved();
  // Dropping the edges lets the rest of the graph (and what it saved) be freed now, while
  // the tensors that point at this node may live on.
  next_edges.clear();
}

// ---- AccumulateGrad ----

AccumulateGrad::AccumulateGrad(std::shared_ptr<TensorImpl> leaf)
    : Node("AccumulateGrad", /*accumulates_into_leaf=*/true), leaf_(std::move(leaf)) {
  output_meta.push_back({leaf_->shape, leaf_->dtype});
}

void AccumulateGrad::apply(const TensorList& grad_outputs, TensorList&) {
  Tensor g = grad_outputs[0];
  // A graph recorded before set_data gave the leaf another shape or dtype: its gradient is for
  // the data that was replaced, and cannot be added to the leaf's .grad.
  if (g.defined() && (g.shape() != leaf_->shape || g.dtype() != leaf_->dtype))
    throw std::runtime_error(fmt::format(
        "backward: the gradient for the leaf{} is {} {}, but the leaf is now {} {}: its data was replaced "
        "(set_data) after this graph was recorded; run the forward again",
        leaf_->name.empty() ? std::string() : " " + quoted(leaf_->name), shape_str(g.shape()),
        dtype_name(g.dtype()), shape_str(leaf_->shape), dtype_name(leaf_->dtype)));
  for (const auto& hook : leaf_->leaf_hooks) {
    Tensor replaced = hook(g);
    if (!replaced.defined()) continue;
    if (replaced.shape() != leaf_->shape || replaced.dtype() != leaf_->dtype)
      throw std::runtime_error(fmt::format("backward: a hook on a leaf {} {} returned a gradient {} {}",
                                           shape_str(leaf_->shape), dtype_name(leaf_->dtype),
                                           shape_str(replaced.shape()), dtype_name(replaced.dtype())));
    g = replaced;
  }
  // (The hooks ran unlocked: one may run a nested backward that reaches this leaf again.)
  std::lock_guard<std::mutex> lock(leaf_lock(leaf_.get()));
  if (is_grad_enabled()) {  // create_graph: .grad is part of the graph, added out of place
    leaf_->grad = leaf_->grad ? add(Tensor(leaf_->grad), g).impl() : g.clone().impl();
  } else if (leaf_->grad) {
    Tensor(leaf_->grad).add_(g);  // in place: no allocation once .grad exists
  } else {
    leaf_->grad = g.detach().clone().impl();  // own copy: g may be shared with other edges
  }
}

std::shared_ptr<Node> grad_accumulator(const Tensor& leaf) {
  const auto& impl = leaf.impl();
  if (!impl || !impl->requires_grad || impl->grad_fn)
    fail("grad_accumulator", "only leaves that require grad have one");
  std::lock_guard<std::mutex> lock(leaf_lock(impl.get()));
  if (auto existing = impl->grad_accumulator.lock()) return existing;
  auto node = std::allocate_shared<AccumulateGrad>(detail::PoolAllocator<AccumulateGrad>{}, impl);
  impl->grad_accumulator = node;
  return node;
}

// ---- SavedTensor ----

SavedTensor::SavedTensor(const Tensor& t) {
  if (!t.defined()) return;
  data_ = t.detach();
  version_ = t.version();
  const auto& impl = t.impl();
  if (impl->grad_fn) {
    grad_fn_ = impl->grad_fn;
    output_nr_ = impl->output_nr;
  } else if (impl->requires_grad) {
    leaf_ = impl;
  }
}

Tensor SavedTensor::get(std::string_view op) const {
  if (data_.defined() && data_.version() != version_)
    throw std::runtime_error(fmt::format(
        "{}: a tensor of shape {} saved for backward was changed in place after it was saved "
        "(version {} when saved, {} now), so its backward would use the wrong values",
        op, shape_str(data_.shape()), version_, data_.version()));
  if (!data_.defined() || !is_grad_enabled()) return data_;
  return connected();
}

// The saved tensor as part of the graph (grad mode is on: a backward rule builds a graph).
Tensor SavedTensor::connected() const {
  if (leaf_) {
    if (leaf_->storage != data_.impl()->storage)
      fail("backward", "a leaf {} saved for backward was given new data with set_data() since; the graph of "
           "its backward cannot be built", shape_str(leaf_->shape));
    return Tensor(leaf_);
  }
  std::shared_ptr<Node> node = grad_fn_;
  std::uint32_t nr = output_nr_;
  if (!node) {  // perhaps the output of the node being run, saved before the node was made
    Node* running = detail::walk_state().running;
    if (running == nullptr) return data_;
    const Storage* storage = data_.impl()->storage.get();
    const auto& outputs = running->output_meta;
    std::size_t i = 0;
    while (i < outputs.size() && !(outputs[i].storage == storage && outputs[i].shape == data_.shape() &&
                                   outputs[i].dtype == data_.dtype()))
      ++i;
    if (i == outputs.size()) return data_;  // a constant: no graph behind it
    node = running->shared_from_this();
    nr = static_cast<std::uint32_t>(i);
  }
  auto impl = std::allocate_shared<TensorImpl>(detail::PoolAllocator<TensorImpl>{});
  impl->shape = data_.shape();
  impl->dtype = data_.dtype();
  impl->storage = data_.impl()->storage;
  impl->grad_fn = std::move(node);
  impl->output_nr = nr;
  return Tensor(std::move(impl));
}

// ---- recording ----

bool needs_grad(const Tensor& a) { return is_grad_enabled() && a.requires_grad(); }
bool needs_grad(const Tensor& a, const Tensor& b) {
  return is_grad_enabled() && (a.requires_grad() || b.requires_grad());
}
bool needs_grad(const TensorList& inputs) { return needs_grad(std::span<const Tensor>(inputs)); }
bool needs_grad(std::span<const Tensor> inputs) {
  if (!is_grad_enabled()) return false;
  for (const auto& t : inputs)
    if (t.requires_grad()) return true;
  return false;
}

Edge gradient_edge(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  if (t.grad_fn()) return {t.grad_fn(), t.output_nr()};
  return {grad_accumulator(t), 0};
}

void connect(const std::shared_ptr<Node>& node, const TensorList& inputs, const TensorList& outputs) {
  connect(node, std::span<const Tensor>(inputs), std::span<const Tensor>(outputs));
}

void connect(const std::shared_ptr<Node>& node, std::span<const Tensor> inputs, std::span<const Tensor> outputs) {
  node->next_edges.reserve(inputs.size());
  node->input_meta.reserve(inputs.size());
  for (const auto& in : inputs) {
    node->next_edges.push_back(gradient_edge(in));
    if (in.defined()) {
      node->input_meta.push_back({in.shape(), in.dtype()});
    } else {
      node->input_meta.push_back({});
    }
  }
  node->output_meta.reserve(outputs.size());
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const auto& impl = outputs[i].impl();
    node->output_meta.push_back({impl->shape, impl->dtype, impl->storage.get()});
    // An integer output is not differentiable (as PyTorch marks it): it stays out of the graph,
    // requires no grad, and its gradient reaches the rule as zeros (or undefined).
    if (!is_floating(impl->dtype)) continue;
    impl->grad_fn = node;
    impl->output_nr = static_cast<std::uint32_t>(i);
    impl->requires_grad = false;
  }
  // Anomaly detection: remember where the node was made, check its outputs.
  if (is_anomaly_enabled())
    detail::anomaly_check_forward(*node, TensorList(inputs.begin(), inputs.end()),
                                  TensorList(outputs.begin(), outputs.end()));
}

}  // namespace autograd
