// The backward walk: dependency counting, gradient accumulation with shape checks, hooks,
// and release of the graph after use.
#include "autograd/graph.hpp"

#include <atomic>
#include <algorithm>
#include <iterator>

#include "autograd/anomaly.hpp"  // anomaly detection hooks (issue 6)
#include "autograd/grad_mode.hpp"
#include "autograd/ops.hpp"

namespace autograd {

namespace {
std::atomic<std::uint64_t> next_sequence_nr{0};
}

Node::Node(std::string_view name) : sequence_nr(next_sequence_nr++), name_(name) {}
Node::~Node() = default;

void Node::mark_released() {
  released_ = true;
  release_saved();
  // Dropping the edges lets the rest of the graph (and what it saved) be freed now, while
  // the tensors that point at this node may live on.
  next_edges.clear();
}

// ---- AccumulateGrad ----

AccumulateGrad::AccumulateGrad(std::shared_ptr<TensorImpl> leaf)
    : Node("AccumulateGrad"), leaf_(std::move(leaf)) {
  output_meta.push_back({leaf_->shape, leaf_->dtype});
}

void AccumulateGrad::apply(const TensorList& grad_outputs, TensorList&) {
  Tensor g = grad_outputs[0];
  for (const auto& hook : leaf_->leaf_hooks) {
    Tensor replaced = hook(g);
    if (!replaced.defined()) continue;
    if (replaced.shape() != leaf_->shape || replaced.dtype() != leaf_->dtype)
      throw std::runtime_error(fmt::format("backward: a hook on a leaf {} {} returned a gradient {} {}",
                                           shape_str(leaf_->shape), dtype_name(leaf_->dtype),
                                           shape_str(replaced.shape()), dtype_name(replaced.dtype())));
    g = replaced;
  }
  if (leaf_->grad) {
    Tensor(leaf_->grad).add_(g);  // in place: no allocation once .grad exists
  } else {
    leaf_->grad = g.detach().clone().impl();  // own copy: g may be shared with other edges
  }
}

std::shared_ptr<Node> grad_accumulator(const Tensor& leaf) {
  const auto& impl = leaf.impl();
  if (!impl || !impl->requires_grad || impl->grad_fn)
    fail("grad_accumulator", "only leaves that require grad have one");
  if (auto existing = impl->grad_accumulator.lock()) return existing;
  auto node = std::allocate_shared<AccumulateGrad>(detail::PoolAllocator<AccumulateGrad>{}, impl);
  impl->grad_accumulator = node;
  return node;
}

// ---- SavedTensor ----

SavedTensor::SavedTensor(const Tensor& t) {
  if (t.defined()) {
    data_ = t.detach();
    version_ = t.version();
  }
}

Tensor SavedTensor::get(std::string_view op) const {
  if (data_.defined() && data_.version() != version_)
    throw std::runtime_error(fmt::format(
        "{}: a tensor of shape {} saved for backward was changed in place after it was saved "
        "(version {} when saved, {} now), so its backward would use the wrong values",
        op, shape_str(data_.shape()), version_, data_.version()));
  return data_;
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
    node->output_meta.push_back({impl->shape, impl->dtype});
    impl->grad_fn = node;
    impl->output_nr = static_cast<std::uint32_t>(i);
    impl->requires_grad = false;
  }
  // Anomaly detection (anomaly.hpp): remember where the node was made, check its outputs.
  if (is_anomaly_enabled())
    detail::anomaly_check_forward(*node, TensorList(inputs.begin(), inputs.end()),
                                  TensorList(outputs.begin(), outputs.end()));
}

// ---- the walk ----

namespace {

[[noreturn]] void freed_graph_error(const Node& node) {
  throw std::runtime_error(fmt::format(
      "backward: the graph through '{}' was already freed by an earlier backward(); "
      "call the first backward with retain_graph = true to walk it twice",
      node.name()));
}

void accumulate(Tensor& slot, const Tensor& g) { slot = slot.defined() ? add(slot, g) : g; }


// The tables of one backward walk. Each thread keeps the tables of finished walks and reuses
// them (cleared, capacity kept), so a warm walk allocates nothing; a walk started inside
// another (from a hook) takes tables of its own.
struct WalkTables {
  std::vector<std::shared_ptr<Node>> nodes;  // every node reached; keeps them alive during the walk
  std::vector<int> pending;                  // per node: consumers not yet run
  std::vector<std::size_t> first_grad;       // per node: where its outputs' gradients start in grads_in
  std::vector<Tensor> grads_in;              // the gradients arriving at each node's outputs
  std::vector<Edge> root_edges;
  std::vector<std::size_t> ready;  // a heap of slots
  TensorList grad_outputs, grad_inputs;
  void clear() {  // drops every tensor and node held, keeps the capacity
    nodes.clear();
    pending.clear();
    first_grad.clear();
    grads_in.clear();
    root_edges.clear();
    ready.clear();
    grad_outputs.clear();
    grad_inputs.clear();
  }
};

class WalkTablesLease {
 public:
  WalkTablesLease() {
    if (free_list().empty()) {
      tables_ = std::make_unique<WalkTables>();
    } else {
      tables_ = std::move(free_list().back());
      free_list().pop_back();
    }
  }
  ~WalkTablesLease() {
    tables_->clear();
    try {
      free_list().push_back(std::move(tables_));
    } catch (...) {  // no room to keep them: let them go
    }
  }
  WalkTablesLease(const WalkTablesLease&) = delete;
  WalkTablesLease& operator=(const WalkTablesLease&) = delete;
  WalkTables& operator*() { return *tables_; }

 private:
  static std::vector<std::unique_ptr<WalkTables>>& free_list() {
    thread_local std::vector<std::unique_ptr<WalkTables>> list;
    return list;
  }
  std::unique_ptr<WalkTables> tables_;
};

}  // namespace

void run_backward(const TensorList& roots, const TensorList& grads, bool retain_graph) {
  run_backward(std::span<const Tensor>(roots), std::span<const Tensor>(grads), retain_graph);
}

void run_backward(std::span<const Tensor> roots, std::span<const Tensor> grads, bool retain_graph) {
  if (roots.size() != grads.size())
    fail("backward", "{} roots but {} gradients", roots.size(), grads.size());
  NoGradGuard no_grad;  // backward rules compute with plain ops; no graph of the graph

  // Every node the walk reaches gets a slot: its index in `nodes`, `pending` and `first_grad`.
  // No per-node allocation.
  static std::atomic<std::uint64_t> next_walk_id{1};
  const std::uint64_t walk = next_walk_id++;
  WalkTablesLease lease;
  WalkTables& t = *lease;
  auto& nodes = t.nodes;
  auto& pending = t.pending;
  auto& first_grad = t.first_grad;
  auto& grads_in = t.grads_in;
  auto& root_edges = t.root_edges;
  auto& ready = t.ready;
  auto& grad_outputs = t.grad_outputs;
  auto& grad_inputs = t.grad_inputs;
  auto slot_of = [&](const std::shared_ptr<Node>& n) {
    if (n->walk_id != walk) {
      n->walk_id = walk;
      n->walk_slot = nodes.size();
      nodes.push_back(n);
      pending.push_back(0);
    }
    return n->walk_slot;
  };

  // 1. Find every node reachable from the roots, counting each node's consumers.
  root_edges.reserve(roots.size());
  for (const auto& root : roots) {
    root_edges.push_back(gradient_edge(root));
    if (!root_edges.back().valid())
      throw std::runtime_error(fmt::format(
          "backward: the tensor of shape {} does not require grad and has no grad_fn (was it computed "
          "under NoGradGuard, or only from tensors that do not require grad?)",
          shape_str(root.shape())));
    slot_of(root_edges.back().node);
  }
  for (std::size_t i = 0; i < nodes.size(); ++i) {  // `nodes` grows as the search goes
    const Node& node = *nodes[i];
    if (node.released()) freed_graph_error(node);
    for (const auto& e : node.next_edges) {
      if (!e.valid()) continue;
      ++pending[slot_of(e.node)];
    }
  }
  first_grad.assign(nodes.size() + 1, 0);
  for (std::size_t i = 0; i < nodes.size(); ++i) first_grad[i + 1] = first_grad[i] + nodes[i]->output_meta.size();
  grads_in.resize(first_grad.back());
  for (std::size_t r = 0; r < roots.size(); ++r)
    accumulate(grads_in[first_grad[root_edges[r].node->walk_slot] + root_edges[r].input_nr], grads[r]);

  // 2. Run nodes once all their consumers have run (Kahn's order, later-created first).
  auto later_first = [&](std::size_t a, std::size_t b) { return nodes[a]->sequence_nr < nodes[b]->sequence_nr; };
  for (std::size_t i = 0; i < nodes.size(); ++i)
    if (pending[i] == 0) ready.push_back(i);
  std::make_heap(ready.begin(), ready.end(), later_first);

  while (!ready.empty()) {
    std::pop_heap(ready.begin(), ready.end(), later_first);
    const std::size_t slot = ready.back();
    ready.pop_back();
    Node* node = nodes[slot].get();
    grad_outputs.assign(std::make_move_iterator(grads_in.begin() + static_cast<std::ptrdiff_t>(first_grad[slot])),
                        std::make_move_iterator(grads_in.begin() + static_cast<std::ptrdiff_t>(first_grad[slot + 1])));

    bool any_grad = false;
    for (const auto& g : grad_outputs) any_grad = any_grad || g.defined();
    grad_inputs.clear();
    if (any_grad) {
      for (std::size_t i = 0; i < grad_outputs.size(); ++i) {
        const auto& meta = node->output_meta[i];
        if (!grad_outputs[i].defined()) {
          if (!node->materialize_grads) continue;  // the rule reads undefined as zero
          grad_outputs[i] = zeros(meta.shape, meta.dtype);
        }
        if (i >= node->output_hooks.size()) continue;
        for (const auto& hook : node->output_hooks[i]) {
          Tensor replaced = hook(grad_outputs[i]);
          if (!replaced.defined()) continue;
          if (replaced.shape() != meta.shape || replaced.dtype() != meta.dtype)
            throw std::runtime_error(fmt::format(
                "backward: a hook on an output of '{}' returned a gradient {} {}, expected {} {}", node->name(),
                shape_str(replaced.shape()), dtype_name(replaced.dtype()), shape_str(meta.shape),
                dtype_name(meta.dtype)));
          grad_outputs[i] = replaced;
        }
      }
      node->apply(grad_outputs, grad_inputs);
      // Anomaly detection (anomaly.hpp): no NaN/Inf gradient may leave a backward rule.
      if (is_anomaly_enabled()) detail::anomaly_check_backward(*node, grad_inputs);
      if (!grad_inputs.empty() && grad_inputs.size() != node->next_edges.size())
        throw std::runtime_error(fmt::format("backward of '{}' returned {} gradients for {} inputs", node->name(),
                                             grad_inputs.size(), node->next_edges.size()));
    }
    grad_outputs.clear();  // drop this node's incoming gradients now

    for (std::size_t j = 0; j < node->next_edges.size(); ++j) {
      const Edge& e = node->next_edges[j];
      if (!e.valid()) continue;
      const std::size_t next = e.node->walk_slot;
      if (j < grad_inputs.size() && grad_inputs[j].defined()) {
        const Tensor& g = grad_inputs[j];
        const auto& meta = node->input_meta[j];
        if (g.shape() != meta.shape || g.dtype() != meta.dtype)
          throw std::runtime_error(fmt::format(
              "backward of '{}' returned a gradient {} {} for input {} of shape {} {}", node->name(),
              shape_str(g.shape()), dtype_name(g.dtype()), j, shape_str(meta.shape), dtype_name(meta.dtype)));
        accumulate(grads_in[first_grad[next] + e.input_nr], g);
      }
      if (--pending[next] == 0) {
        ready.push_back(next);
        std::push_heap(ready.begin(), ready.end(), later_first);
      }
    }
    grad_inputs.clear();
    if (!retain_graph && !dynamic_cast<AccumulateGrad*>(node)) node->mark_released();
  }
}

}  // namespace autograd
