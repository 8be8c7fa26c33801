// The backward walk: Kahn's algorithm on consumer counts, iterative. backward()'s walk is
// allocation-free once warm; grad()'s also builds, on each call, its lists of which nodes lead to
// the inputs (Capture, locate).
//
//   discover  every node reachable from the roots gets a slot and a count of its consumers
//   seed      the roots' gradients go to the outputs of their nodes
//   walk      a node runs once all its consumers have run (the ready ones by sequence number,
//             latest first): its hooks, its backward rule, the checks of what the rule returned,
//             and the passing of each input's gradient along its edge; then, without retain_graph,
//             the node's saved tensors and edges are freed
//   release   the walk lets go of the nodes it held (also when something threw)
//
// The walk's bookkeeping (which slot a node has, what arrived at it) lives in tables of its
// own, never on the nodes: a hook may start another walk over the same nodes (a nested
// backward) without disturbing this one. Each thread reuses the tables of its finished walks.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <utility>
#include <vector>

#include "autograd/anomaly.hpp"
#include "autograd/grad_mode.hpp"
#include "autograd/graph.hpp"
#include "autograd/ops.hpp"
#include "walk_state.hpp"

namespace autograd {

namespace detail {

// A walk's hold on a node: Node::walkers_ packs the holding thread's token (high bits) and the
// number of its walks that hold the node (low bits). Walks on one thread nest; a walk on
// another thread that reaches a held node throws. Leaf accumulators are never held (they lock).
class WalkClaim {
 public:
  static void acquire(Node& node) {
    const std::uint64_t mine = thread_token() << kCountBits;
    std::uint64_t held = node.walkers_.load(std::memory_order_relaxed);
    for (;;) {
      if (held != 0 && (held & ~kCountMask) != mine) busy_error(node);
      if ((held & kCountMask) == kCountMask) fail("backward", "walks nested too deeply");
      const std::uint64_t next = held == 0 ? mine | 1 : held + 1;
      if (node.walkers_.compare_exchange_weak(held, next, std::memory_order_acquire, std::memory_order_relaxed))
        return;
    }
  }
  static void release(Node& node) noexcept {
    std::uint64_t held = node.walkers_.load(std::memory_order_relaxed);
    for (;;) {
      const std::uint64_t next = (held & kCountMask) == 1 ? 0 : held - 1;
      if (node.walkers_.compare_exchange_weak(held, next, std::memory_order_release, std::memory_order_relaxed))
        return;
    }
  }

 private:
  static constexpr int kCountBits = 16;
  static constexpr std::uint64_t kCountMask = (std::uint64_t{1} << kCountBits) - 1;
  static std::uint64_t thread_token() {
    static std::atomic<std::uint64_t> next{1};
    thread_local const std::uint64_t token = next++;
    return token;
  }
  [[noreturn]] static void busy_error(const Node& node) {
    throw std::runtime_error(fmt::format(
        "backward: the graph through '{}' is being walked by another thread right now; backward() "
        "calls on several threads may share leaves, but not other nodes at the same time",
        printable(node.name())));
  }
};

}  // namespace detail

namespace {

using detail::WalkClaim;

constexpr std::size_t kNoSlot = static_cast<std::size_t>(-1);

// Node -> slot, open addressing over a power-of-two array. Entries of earlier walks are told
// apart by a generation number, so starting a walk clears nothing and a warm walk allocates
// nothing.
class SlotMap {
 public:
  void begin_walk() {
    if (++generation_ == 0) {  // wrapped: wipe once, start again
      for (auto& e : entries_) e.generation = 0;
      generation_ = 1;
    }
    used_ = 0;
  }
  // The slot of `node`, or (inserting it) `fresh`; .second tells which.
  std::pair<std::size_t, bool> find_or_insert(const Node* node, std::size_t fresh) {
    if (2 * (used_ + 1) > entries_.size()) grow();
    for (std::size_t i = home(node);; i = (i + 1) & (entries_.size() - 1)) {
      Entry& e = entries_[i];
      if (e.generation != generation_) {
        e = {node, static_cast<std::uint32_t>(fresh), generation_};
        ++used_;
        return {fresh, true};
      }
      if (e.node == node) return {e.slot, false};
    }
  }
  // The slot of `node`, or kNoSlot when this walk has not reached it.
  std::size_t find(const Node* node) const {
    if (entries_.empty()) return static_cast<std::size_t>(-1);
    for (std::size_t i = home(node);; i = (i + 1) & (entries_.size() - 1)) {
      const Entry& e = entries_[i];
      if (e.generation != generation_) return static_cast<std::size_t>(-1);
      if (e.node == node) return e.slot;
    }
  }
  void release_memory() { std::vector<Entry>().swap(entries_); }
  std::size_t capacity() const { return entries_.size(); }

 private:
  struct Entry {
    const Node* node = nullptr;
    std::uint32_t slot = 0;
    std::uint32_t generation = 0;  // 0: never used
  };
  std::size_t home(const Node* node) const {
    const auto bits = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(node)) * 0x9E3779B97F4A7C15ull;
    return static_cast<std::size_t>(bits >> 32) & (entries_.size() - 1);
  }
  void grow() {
    std::vector<Entry> old(std::max<std::size_t>(64, 2 * entries_.size()));
    old.swap(entries_);
    used_ = 0;
    for (const auto& e : old)
      if (e.generation == generation_) find_or_insert(e.node, e.slot);
  }
  std::vector<Entry> entries_;
  std::size_t used_ = 0;
  std::uint32_t generation_ = 0;
};

// The tables of one walk, indexed by slot (the order in which discovery reached the node).
struct WalkTables {
  SlotMap slots;                             // node -> slot
  std::vector<std::shared_ptr<Node>> nodes;  // slot -> node; keeps them alive during the walk
  std::vector<int> pending;                  // consumers not yet run
  std::vector<std::size_t> first_edge;       // where the node's edges start in edge_slots
  std::vector<std::size_t> edge_slots;       // the slot each edge leads to (kNoSlot: no gradient)
  std::vector<std::size_t> first_grad;       // where the gradients of the node's outputs start in grads_in
  std::vector<Tensor> grads_in;              // gradients arrived at each output so far
  std::vector<std::pair<std::size_t, std::uint32_t>> roots;  // (slot, output) of each root
  std::vector<std::size_t> ready;            // a heap of runnable slots
  TensorList grad_outputs, grad_inputs;      // of the node running now

  // Lets go of every node (and its hold on it) and tensor; keeps the capacity unless a very
  // large graph made it big.
  void clear() {
    for (const auto& n : nodes)
      if (!n->accumulates_into_leaf()) WalkClaim::release(*n);
    const bool trim = nodes.capacity() > kKeepNodes || grads_in.capacity() > kKeepNodes;
    nodes.clear(), pending.clear(), first_edge.clear(), edge_slots.clear(), first_grad.clear();
    grads_in.clear(), roots.clear(), ready.clear(), grad_outputs.clear(), grad_inputs.clear();
    if (trim || slots.capacity() > 4 * kKeepNodes) *this = WalkTables();
  }
  static constexpr std::size_t kKeepNodes = std::size_t{1} << 16;
};

// This walk's tables, taken from the thread's spares and given back (cleared) at the end.
class WalkTablesLease {
 public:
  WalkTablesLease() {
    if (spares().empty()) {
      tables_ = std::make_unique<WalkTables>();
    } else {
      tables_ = std::move(spares().back());
      spares().pop_back();
    }
  }
  ~WalkTablesLease() {
    tables_->clear();
    try {
      spares().push_back(std::move(tables_));
    } catch (...) {  // no room to keep them: let them go
    }
  }
  WalkTablesLease(const WalkTablesLease&) = delete;
  WalkTablesLease& operator=(const WalkTablesLease&) = delete;
  WalkTables& operator*() { return *tables_; }

 private:
  static std::vector<std::unique_ptr<WalkTables>>& spares() {
    thread_local std::vector<std::unique_ptr<WalkTables>> list;
    return list;
  }
  std::unique_ptr<WalkTables> tables_;
};

[[noreturn]] void freed_graph_error(const Node& node) {
  throw std::runtime_error(fmt::format(
      "backward: the graph through '{}' was already freed by an earlier backward(); "
      "call the first backward with retain_graph = true to walk it twice",
      printable(node.name())));
}

void accumulate(Tensor& slot, const Tensor& g) { slot = slot.defined() ? add(slot, g) : g; }

// Heap order of the ready slots: the node created last comes out first.
struct LaterFirst {
  const std::vector<std::shared_ptr<Node>>& nodes;
  bool operator()(std::size_t a, std::size_t b) const { return nodes[a]->sequence_nr < nodes[b]->sequence_nr; }
};

// grad(): where the gradient of each input arrives (the slot of its node and which output),
// what arrived there, and which nodes lead to some input (only those run).
struct Capture {
  std::vector<std::pair<std::size_t, std::uint32_t>> at;  // per input; kNoSlot: not reached
  TensorList grads;                                        // per input; undefined: none arrived
  std::vector<char> needed;                                // per slot
  std::vector<char> target;                                // per slot: some input's gradient arrives there
  std::vector<char> edge_wanted;                           // per edge: it leads to a needed or target slot
};

class Walk {
 public:
  explicit Walk(WalkTables& t, Capture* capture = nullptr) : t_(t), capture_(capture) { t_.slots.begin_walk(); }

  // Gives each node reachable from the roots a slot, and counts the consumers of each.
  void discover(std::span<const Tensor> roots) {
    for (const auto& root : roots) {
      const Edge e = gradient_edge(root);
      if (!e.valid())
        throw std::runtime_error(fmt::format(
            "backward: the tensor of shape {} does not require grad and has no grad_fn (was it computed "
            "under NoGradGuard, or only from tensors that do not require grad?)",
            shape_str(root.shape())));
      t_.roots.emplace_back(add_node(e.node), e.input_nr);
    }
    for (std::size_t i = 0; i < t_.nodes.size(); ++i) {  // `nodes` grows as the search goes
      const Node& node = *t_.nodes[i];
      if (node.released()) freed_graph_error(node);
      t_.first_edge.push_back(t_.edge_slots.size());
      for (const auto& e : node.next_edges) {
        const std::size_t next = e.valid() ? add_node(e.node) : kNoSlot;
        t_.edge_slots.push_back(next);
        if (next != kNoSlot) ++t_.pending[next];
      }
    }
    t_.first_edge.push_back(t_.edge_slots.size());
  }

  // Lays out the gradient slots of every node's outputs and puts the roots' gradients in.
  void seed(std::span<const Tensor> grads) {
    t_.first_grad.assign(t_.nodes.size() + 1, 0);
    for (std::size_t i = 0; i < t_.nodes.size(); ++i)
      t_.first_grad[i + 1] = t_.first_grad[i] + t_.nodes[i]->output_meta.size();
    t_.grads_in.resize(t_.first_grad.back());
    for (std::size_t r = 0; r < grads.size(); ++r)
      accumulate(t_.grads_in[t_.first_grad[t_.roots[r].first] + t_.roots[r].second], grads[r]);
  }

  // grad(): finds where each input's gradient arrives and marks the nodes that lead there.
  void locate(std::span<const Tensor> inputs) {
    for (const auto& in : inputs) {
      std::shared_ptr<Node> node = in.grad_fn() ? in.grad_fn() : in.impl()->grad_accumulator.lock();
      const std::size_t slot = node ? t_.slots.find(node.get()) : kNoSlot;
      capture_->at.emplace_back(slot, in.grad_fn() ? in.output_nr() : 0);
    }
    capture_->grads.resize(inputs.size());
    // Consumers before producers (Kahn's order), then backwards: a node is needed when an edge
    // leads to an input's node or to a needed node.
    auto& target = capture_->target;
    target.assign(t_.nodes.size(), 0);
    for (const auto& [slot, nr] : capture_->at)
      if (slot != kNoSlot) target[slot] = 1;
    std::vector<int> pending = t_.pending;
    std::vector<std::size_t> order;
    for (std::size_t i = 0; i < pending.size(); ++i)
      if (pending[i] == 0) order.push_back(i);
    for (std::size_t k = 0; k < order.size(); ++k)
      for (std::size_t e = t_.first_edge[order[k]]; e < t_.first_edge[order[k] + 1]; ++e)
        if (t_.edge_slots[e] != kNoSlot && --pending[t_.edge_slots[e]] == 0) order.push_back(t_.edge_slots[e]);
    auto& needed = capture_->needed;
    needed.assign(t_.nodes.size(), 0);
    for (std::size_t k = order.size(); k-- > 0;) {
      const std::size_t slot = order[k];
      for (std::size_t e = t_.first_edge[slot]; e < t_.first_edge[slot + 1]; ++e) {
        const std::size_t next = t_.edge_slots[e];
        if (next != kNoSlot && (target[next] || needed[next])) needed[slot] = 1;
      }
    }
    // The gradients a running node's rule may skip: those along edges that lead nowhere needed.
    auto& wanted = capture_->edge_wanted;
    wanted.assign(t_.edge_slots.size(), 0);
    for (std::size_t e = 0; e < t_.edge_slots.size(); ++e) {
      const std::size_t next = t_.edge_slots[e];
      wanted[e] = next != kNoSlot && (target[next] || needed[next]);
    }
  }

  // grad(), after locate(): the first input that no gradient can reach (its node is not reached,
  // or no edge and no root leads to its output of that node), or kNoSlot when each can be reached.
  std::size_t first_unreachable() const {
    std::vector<char> reached(t_.first_grad.back(), 0);  // per node output
    for (const auto& [slot, nr] : t_.roots) reached[t_.first_grad[slot] + nr] = 1;
    for (std::size_t i = 0; i < t_.nodes.size(); ++i) {
      const auto& edges = t_.nodes[i]->next_edges;
      for (std::size_t j = 0; j < edges.size(); ++j) {
        const std::size_t next = t_.edge_slots[t_.first_edge[i] + j];
        if (next != kNoSlot) reached[t_.first_grad[next] + edges[j].input_nr] = 1;
      }
    }
    for (std::size_t i = 0; i < capture_->at.size(); ++i) {
      const auto [slot, nr] = capture_->at[i];
      if (slot == kNoSlot || !reached[t_.first_grad[slot] + nr]) return i;
    }
    return kNoSlot;
  }

  // Runs every node once all its consumers have run, latest-created first among the ready.
  void run(bool retain_graph) {
    for (std::size_t i = 0; i < t_.nodes.size(); ++i)
      if (t_.pending[i] == 0) t_.ready.push_back(i);
    std::make_heap(t_.ready.begin(), t_.ready.end(), LaterFirst{t_.nodes});
    while (!t_.ready.empty()) {
      std::pop_heap(t_.ready.begin(), t_.ready.end(), LaterFirst{t_.nodes});
      const std::size_t slot = t_.ready.back();
      t_.ready.pop_back();
      Node& node = *t_.nodes[slot];
      if (node.released()) freed_graph_error(node);  // by a walk started from a hook
      take_gradients(slot);
      const bool runs = capture_ == nullptr || capture_->needed[slot];
      const bool captures = capture_ != nullptr && capture_->target[slot];
      if (captures) take_captured(slot, false);
      if ((runs || captures) && any_defined(t_.grad_outputs)) run_hooks(node);
      if (captures) take_captured(slot, true);  // an input's gradient is the one its hooks leave
      if (runs && any_defined(t_.grad_outputs)) {
        {
          detail::RunningNode running(node, capture_ ? capture_->edge_wanted.data() + t_.first_edge[slot] : nullptr);
          node.apply(t_.grad_outputs, t_.grad_inputs);
        }
        check_returned(node);
      }
      t_.grad_outputs.clear();  // drop this node's incoming gradients now
      pass_on(slot, node);
      if (runs && !retain_graph && !node.accumulates_into_leaf()) node.mark_released();
    }
  }

 private:
  std::size_t add_node(const std::shared_ptr<Node>& node) {
    const auto [slot, fresh] = t_.slots.find_or_insert(node.get(), t_.nodes.size());
    if (fresh) {
      t_.nodes.push_back(node);
      t_.pending.push_back(0);
      if (!node->accumulates_into_leaf()) {
        try {
          WalkClaim::acquire(*node);
        } catch (...) {
          t_.nodes.pop_back();  // not held: not to be let go of either
          t_.pending.pop_back();
          throw;
        }
      }
    }
    return slot;
  }

  static bool any_defined(const TensorList& grads) {
    return std::any_of(grads.begin(), grads.end(), [](const Tensor& g) { return g.defined(); });
  }

  // grad(): keeps what arrived at the outputs of this node that are inputs of grad(); once the
  // hooks ran (`hooked`), what they made of it, where a gradient arrived at all.
  void take_captured(std::size_t slot, bool hooked) {
    for (std::size_t i = 0; i < capture_->at.size(); ++i)
      if (capture_->at[i].first == slot && (!hooked || capture_->grads[i].defined()))
        capture_->grads[i] = t_.grad_outputs[capture_->at[i].second];
  }

  // Moves the gradients that arrived at the node's outputs into grad_outputs.
  void take_gradients(std::size_t slot) {
    const auto begin = t_.grads_in.begin() + static_cast<std::ptrdiff_t>(t_.first_grad[slot]);
    const auto end = t_.grads_in.begin() + static_cast<std::ptrdiff_t>(t_.first_grad[slot + 1]);
    t_.grad_outputs.assign(std::make_move_iterator(begin), std::make_move_iterator(end));
  }

  // Stands in zeros for outputs that got no gradient (unless the rule reads undefined as
  // zero) and runs the hooks of each output, which may replace its gradient.
  void run_hooks(const Node& node) {
    for (std::size_t i = 0; i < t_.grad_outputs.size(); ++i) {
      const TensorMeta& meta = node.output_meta[i];
      Tensor& g = t_.grad_outputs[i];
      if (!g.defined()) {
        if (!node.materialize_grads) continue;
        g = zeros(meta.shape, meta.dtype);
      }
      if (i >= node.output_hooks.size()) continue;
      for (const auto& hook : node.output_hooks[i]) {
        Tensor replaced = hook(g);
        if (!replaced.defined()) continue;
        if (replaced.shape() != meta.shape || replaced.dtype() != meta.dtype)
          throw std::runtime_error(fmt::format(
              "backward: a hook on an output of '{}' returned a gradient {} {}, expected {} {}", printable(node.name()),
              shape_str(replaced.shape()), dtype_name(replaced.dtype()), shape_str(meta.shape),
              dtype_name(meta.dtype)));
        g = std::move(replaced);
      }
    }
  }

  // A rule returns one gradient per input, each undefined or of that input's shape and dtype.
  // While a graph of the backward is built, a gradient that arrived as part of that graph must
  // leave as part of it: a rule that computed with raw kernels would cut the graph, and the
  // derivatives through it would silently be zero.
  void check_returned(const Node& node) const {
    if (is_anomaly_enabled()) detail::anomaly_check_backward(node, t_.grad_inputs);
    const auto& grads = t_.grad_inputs;
    if (grads.size() != node.next_edges.size())
      throw std::runtime_error(fmt::format(
          "backward of '{}' returned {} gradients for {} inputs; a backward rule returns one per input "
          "(an undefined tensor for an input that needs none)",
          printable(node.name()), grads.size(), node.next_edges.size()));
    for (std::size_t j = 0; j < grads.size(); ++j) {
      const TensorMeta& meta = node.input_meta[j];
      if (grads[j].defined() && (grads[j].shape() != meta.shape || grads[j].dtype() != meta.dtype))
        throw std::runtime_error(fmt::format("backward of '{}' returned a gradient {} {} for input {} of shape {} {}",
                                             printable(node.name()), shape_str(grads[j].shape()), dtype_name(grads[j].dtype()),
                                             j, shape_str(meta.shape), dtype_name(meta.dtype)));
    }
    if (!is_grad_enabled() || node.accumulates_into_leaf()) return;
    const bool graph_in = std::any_of(t_.grad_outputs.begin(), t_.grad_outputs.end(),
                                      [](const Tensor& g) { return g.defined() && g.requires_grad(); });
    for (std::size_t j = 0; graph_in && j < grads.size(); ++j)
      if (grads[j].defined() && !grads[j].requires_grad())
        throw std::runtime_error(fmt::format(
            "backward of '{}' cannot be differentiated again (create_graph): its gradient for input {} was "
            "computed outside the graph; use first-order backward through it, or write its backward with "
            "differentiable ops",
            printable(node.name()), j));
  }

  // Adds each input's gradient to the output it came from, and readies the nodes whose last
  // consumer this was.
  void pass_on(std::size_t slot, const Node& node) {
    for (std::size_t j = 0; j < node.next_edges.size(); ++j) {
      const std::size_t next = t_.edge_slots[t_.first_edge[slot] + j];
      if (next == kNoSlot) continue;
      if (j < t_.grad_inputs.size() && t_.grad_inputs[j].defined())
        accumulate(t_.grads_in[t_.first_grad[next] + node.next_edges[j].input_nr], t_.grad_inputs[j]);
      if (--t_.pending[next] == 0) {
        t_.ready.push_back(next);
        std::push_heap(t_.ready.begin(), t_.ready.end(), LaterFirst{t_.nodes});
      }
    }
    t_.grad_inputs.clear();
  }

  WalkTables& t_;
  Capture* capture_;  // grad(): what to hand back (null for backward())
};

}  // namespace

namespace {

// How many backward walks this thread is inside (a hook may start one within another). A hook
// whose backward reaches the same hook again would recurse until the stack runs out; past
// kMaxNesting walks deep that is an error instead.
constexpr int kMaxNesting = 64;
thread_local int nesting = 0;
struct NestingDepth {
  NestingDepth() {
    if (nesting >= kMaxNesting)
      throw std::runtime_error(fmt::format(
          "backward: {} backward() calls nested in hooks: a hook runs a backward that reaches the same hook "
          "again (remove the hook inside it, or detach what its backward reads)",
          kMaxNesting));
    ++nesting;
  }
  ~NestingDepth() { --nesting; }
  NestingDepth(const NestingDepth&) = delete;
  NestingDepth& operator=(const NestingDepth&) = delete;
};

}  // namespace

namespace detail {
WalkState& walk_state() {
  thread_local WalkState state;
  return state;
}

bool input_grad_unwanted(const Node& node, std::size_t i) {
  const WalkState& s = walk_state();
  return s.edges_wanted != nullptr && s.running == &node && !s.edges_wanted[i];
}
}  // namespace detail

namespace {

// Grad mode for the backward rules (on only when they build a graph), and whether the walk
// adds into .grad, both restored when the walk ends.
class WalkModes {
 public:
  WalkModes(bool create_graph, bool accumulates)
      : grad_(is_grad_enabled()), accumulates_(detail::walk_state().accumulates_grad) {
    set_grad_enabled(create_graph);
    detail::walk_state().accumulates_grad = accumulates;
  }
  ~WalkModes() {
    set_grad_enabled(grad_);
    detail::walk_state().accumulates_grad = accumulates_;
  }
  WalkModes(const WalkModes&) = delete;
  WalkModes& operator=(const WalkModes&) = delete;

 private:
  bool grad_, accumulates_;
};

}  // namespace

bool backward_accumulates_grad() { return detail::walk_state().accumulates_grad; }

void run_backward(const TensorList& roots, const TensorList& grads, bool retain_graph, bool create_graph) {
  run_backward(std::span<const Tensor>(roots), std::span<const Tensor>(grads), retain_graph, create_graph);
}

void run_backward(std::span<const Tensor> roots, std::span<const Tensor> grads, bool retain_graph,
                  bool create_graph) {
  if (roots.size() != grads.size()) fail("backward", "{} roots but {} gradients", roots.size(), grads.size());
  NestingDepth depth;  // a hook may run a backward, but not without end
  WalkModes modes(create_graph, true);  // without create_graph, rules compute with no graph of the graph
  WalkTablesLease tables;  // the release: its end lets go of every node the walk held
  Walk walk(*tables);
  walk.discover(roots);
  walk.seed(grads);
  walk.run(retain_graph || create_graph);
}

namespace detail {

// grad()'s walk: the outputs' gradients seeded, the inputs' gradients captured where they
// arrive, only the nodes in between run.
TensorList capture_gradients(std::span<const Tensor> outputs, std::span<const Tensor> seeds,
                             std::span<const Tensor> inputs, bool retain_graph, bool create_graph,
                             const std::function<void(std::size_t)>& refuse_unreachable) {
  NestingDepth depth;
  WalkModes modes(create_graph, false);
  WalkTablesLease tables;
  Capture capture;
  Walk walk(*tables, &capture);
  walk.discover(outputs);
  walk.seed(seeds);
  walk.locate(inputs);
  // Before anything runs (or is freed): a refusal leaves the graph as it was.
  if (refuse_unreachable)
    if (const std::size_t i = walk.first_unreachable(); i != kNoSlot) refuse_unreachable(i);
  walk.run(retain_graph || create_graph);
  return std::move(capture.grads);
}

}  // namespace detail

}  // namespace autograd
