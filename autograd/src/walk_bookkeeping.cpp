// The backward walk's bookkeeping (walk_bookkeeping.hpp says what each piece is); the walk itself
// is in walk.cpp.
#include "walk_bookkeeping.hpp"

#include <atomic>
#include <stdexcept>

#include "autograd/anomaly.hpp"
#include "autograd/grad_mode.hpp"
#include "walk_state.hpp"

namespace autograd {
namespace detail {

void WalkClaim::busy_error(const Node& node) {
  throw std::runtime_error(fmt::format(
      "backward: the graph through '{}' is being walked by another thread right now; backward() "
      "calls on several threads may share leaves, but not other nodes at the same time",
      printable(node.name())));
}

WalkState& walk_state() {
  thread_local WalkState state;
  return state;
}

bool input_grad_unwanted(const Node& node, std::size_t i) {
  const WalkState& s = walk_state();
  return s.edges_wanted != nullptr && s.running == &node && !s.edges_wanted[i];
}

namespace walking {

void SlotMap::begin_walk() {
  if (++generation_ == 0) {  // wrapped: wipe once, start again
    for (auto& e : entries_) e.generation = 0;
    generation_ = 1;
  }
  used_ = 0;
}

std::size_t SlotMap::find(const Node* node) const {
  if (entries_.empty()) return kNoSlot;
  for (std::size_t i = home(node);; i = (i + 1) & (entries_.size() - 1)) {
    const Entry& e = entries_[i];
    if (e.generation != generation_) return kNoSlot;
    if (e.node == node) return e.slot;
  }
}

void SlotMap::grow() {
  std::vector<Entry> old(std::max<std::size_t>(64, 2 * entries_.size()));
  old.swap(entries_);
  used_ = 0;
  for (const auto& e : old)
    if (e.generation == generation_) find_or_insert(e.node, e.slot);
}

void WalkTables::add_root(const Tensor& root) {
  const Edge e = gradient_edge(root);
  if (!e.valid())
    throw std::runtime_error(fmt::format(
        "backward: the tensor of shape {} does not require grad and has no grad_fn (was it computed "
        "under NoGradGuard, or only from tensors that do not require grad?)",
        shape_str(root.shape())));
  roots.push_back({add_node(e.node), e.input_nr});
}

void WalkTables::lay_out_gradients() {
  first_grad.assign(nodes.size() + 1, 0);
  for (std::size_t i = 0; i < nodes.size(); ++i) first_grad[i + 1] = first_grad[i] + nodes[i]->output_meta.size();
  arrived.resize(first_grad.back());
}

void WalkTables::clear() {
  for (const auto& n : nodes)
    if (!n->accumulates_into_leaf()) WalkClaim::release(*n);
  const bool trim = nodes.capacity() > kKeepNodes || arrived.capacity() > kKeepNodes;
  nodes.clear(), pending.clear(), first_edge.clear(), producers.clear(), first_grad.clear();
  arrived.clear(), roots.clear(), ready.clear(), grad_outputs.clear(), grad_inputs.clear();
  if (trim || slots.capacity() > 4 * kKeepNodes) *this = WalkTables();
}

namespace {
std::vector<std::unique_ptr<WalkTables>>& spare_tables() {
  thread_local std::vector<std::unique_ptr<WalkTables>> list;
  return list;
}
}  // namespace

WalkTablesLease::WalkTablesLease() {
  if (spare_tables().empty()) {
    tables_ = std::make_unique<WalkTables>();
  } else {
    tables_ = std::move(spare_tables().back());
    spare_tables().pop_back();
  }
  tables_->slots.begin_walk();
}

WalkTablesLease::~WalkTablesLease() {
  tables_->clear();
  try {
    spare_tables().push_back(std::move(tables_));
  } catch (...) {  // no room to keep them: let them go
  }
}

void Capture::locate(const WalkTables& t) {
  for (const auto& in : inputs_) {
    std::shared_ptr<Node> node = in.grad_fn() ? in.grad_fn() : in.impl()->grad_accumulator.lock();
    const std::size_t slot = node ? t.slots.find(node.get()) : kNoSlot;
    at_.push_back({slot, in.grad_fn() ? in.output_nr() : 0});
  }
  grads.resize(inputs_.size());
  // Consumers before producers (Kahn's order), then backwards: a node is needed when an edge
  // leads to an input's node or to a needed node.
  target_.assign(t.nodes.size(), 0);
  for (const Output& o : at_)
    if (o.slot != kNoSlot) target_[o.slot] = 1;
  std::vector<int> pending = t.pending;
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < pending.size(); ++i)
    if (pending[i] == 0) order.push_back(i);
  for (std::size_t k = 0; k < order.size(); ++k)
    for (std::size_t e = t.first_edge[order[k]]; e < t.first_edge[order[k] + 1]; ++e)
      if (t.producers[e] != kNoSlot && --pending[t.producers[e]] == 0) order.push_back(t.producers[e]);
  needed_.assign(t.nodes.size(), 0);
  for (std::size_t k = order.size(); k-- > 0;) {
    const std::size_t slot = order[k];
    for (std::size_t e = t.first_edge[slot]; e < t.first_edge[slot + 1]; ++e) {
      const std::size_t next = t.producers[e];
      if (next != kNoSlot && (target_[next] || needed_[next])) needed_[slot] = 1;
    }
  }
  // The gradients a running node's rule may skip: those along edges that lead nowhere needed.
  edge_wanted_.assign(t.producers.size(), 0);
  for (std::size_t e = 0; e < t.producers.size(); ++e) {
    const std::size_t next = t.producers[e];
    edge_wanted_[e] = next != kNoSlot && (target_[next] || needed_[next]);
  }
  if (refuse_unreachable_)
    if (const std::size_t i = first_unreachable(t); i != kNoSlot) refuse_unreachable_(i);
}

// The first input that no gradient can reach (its node is not reached, or no edge and no root
// leads to its output of that node), or kNoSlot when each can be reached.
std::size_t Capture::first_unreachable(const WalkTables& t) const {
  std::vector<char> reached(t.first_grad.back(), 0);  // per node output
  for (const Output& o : t.roots) reached[t.first_grad[o.slot] + o.nr] = 1;
  for (std::size_t i = 0; i < t.nodes.size(); ++i) {
    const auto& edges = t.nodes[i]->next_edges;
    for (std::size_t j = 0; j < edges.size(); ++j) {
      const std::size_t next = t.producer(i, j);
      if (next != kNoSlot) reached[t.first_grad[next] + edges[j].input_nr] = 1;
    }
  }
  for (std::size_t i = 0; i < at_.size(); ++i)
    if (at_[i].slot == kNoSlot || !reached[t.first_grad[at_[i].slot] + at_[i].nr]) return i;
  return kNoSlot;
}

void Capture::keep(std::size_t slot, const TensorList& grad_outputs, bool hooked) {
  if (!target_[slot]) return;
  for (std::size_t i = 0; i < at_.size(); ++i)
    if (at_[i].slot == slot && (!hooked || grads[i].defined())) grads[i] = grad_outputs[at_[i].nr];
}

void freed_graph_error(const Node& node) {
  throw std::runtime_error(fmt::format(
      "backward: the graph through '{}' was already freed by an earlier backward(); "
      "call the first backward with retain_graph = true to walk it twice",
      printable(node.name())));
}

namespace {
thread_local int nesting = 0;
}  // namespace

NestingDepth::NestingDepth() {
  if (nesting >= kMaxNesting)
    throw std::runtime_error(fmt::format(
        "backward: {} backward() calls nested in hooks: a hook runs a backward that reaches the same hook "
        "again (remove the hook inside it, or detach what its backward reads)",
        kMaxNesting));
  ++nesting;
}

NestingDepth::~NestingDepth() { --nesting; }

WalkModes::WalkModes(bool create_graph, bool accumulates)
    : grad_(is_grad_enabled()), accumulates_(walk_state().accumulates_grad) {
  set_grad_enabled(create_graph);
  walk_state().accumulates_grad = accumulates;
}

WalkModes::~WalkModes() {
  set_grad_enabled(grad_);
  walk_state().accumulates_grad = accumulates_;
}

}  // namespace walking
}  // namespace detail

bool backward_accumulates_grad() { return detail::walk_state().accumulates_grad; }

}  // namespace autograd
