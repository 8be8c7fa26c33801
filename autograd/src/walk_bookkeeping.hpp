#pragma once
// The backward walk's bookkeeping. The algorithm is `walk` in walk.cpp and reads without this
// file; what is here keeps the walk's tables and does the work around a node's backward rule.
//
//   WalkTables       the walk's tables, indexed by slot (the order in which the walk reached the
//                    node): the node, how many of its consumers have still to run, the producer
//                    each of its edges leads to, and the gradients that arrived at its outputs.
//                    Which slot a node has is kept in a SlotMap of the tables, never on the node,
//                    so a hook may start another walk over the same nodes (a nested backward).
//   WalkTablesLease  one walk's tables, taken from the thread's spares and given back cleared with
//                    their capacity kept (so a warm walk allocates nothing); giving them back lets
//                    go of every node the walk held, also when something threw.
//   WalkClaim        a walk's hold on a node: walks on one thread nest, and a walk on another
//                    thread that reaches a held node throws instead of racing.
//   ReadyHeap        the slots whose consumers have all run, the node created last on top.
//   Capture          grad(): where each of its inputs' gradients arrives, and which nodes lead there.
//   run_output_hooks, check_returned, free_node   before, after and once past a node's rule.
//   NestingDepth, WalkModes   guards of one walk: how deep walks nest, grad mode, .grad writes.
//
// What the walk calls once per node (the claims, the hooks, the checks) is defined inline at the
// end of this file, so that keeping it apart costs the walk no calls.
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <span>
#include <stdexcept>
#include <utility>
#include <vector>

#include "autograd/anomaly.hpp"
#include "autograd/grad_mode.hpp"
#include "autograd/graph.hpp"
#include "autograd/ops.hpp"

namespace autograd {
namespace detail {

// A walk's hold on a node: Node::walkers_ packs the holding thread's token (high bits) and the
// number of its walks that hold the node (low bits). Walks on one thread nest; a walk on
// another thread that reaches a held node throws. Leaf accumulators are never held (they lock).
class WalkClaim {
 public:
  static void acquire(Node& node);
  static void release(Node& node) noexcept;

 private:
  static constexpr int kCountBits = 16;
  static constexpr std::uint64_t kCountMask = (std::uint64_t{1} << kCountBits) - 1;
  static std::uint64_t thread_token();
  [[noreturn]] static void busy_error(const Node& node);
};

namespace walking {

constexpr std::size_t kNoSlot = static_cast<std::size_t>(-1);

// One output of the node in a slot.
struct Output {
  std::size_t slot;
  std::uint32_t nr;
};

// Node -> slot, open addressing over a power-of-two array. Entries of earlier walks are told
// apart by a generation number, so starting a walk clears nothing and a warm walk allocates
// nothing.
class SlotMap {
 public:
  void begin_walk();
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
  std::size_t find(const Node* node) const;
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
  void grow();
  std::vector<Entry> entries_;
  std::size_t used_ = 0;
  std::uint32_t generation_ = 0;
};

// The tables of one walk, indexed by slot (the order in which the walk reached the node).
struct WalkTables {
  SlotMap slots;                             // node -> slot
  std::vector<std::shared_ptr<Node>> nodes;  // slot -> node; keeps them alive during the walk
  std::vector<int> pending;                  // consumers not yet run
  std::vector<std::size_t> first_edge;       // where the node's edges start in `producers`
  std::vector<std::size_t> producers;        // per edge: the slot it leads to (kNoSlot: no gradient)
  std::vector<std::size_t> first_grad;       // where the node's outputs start in `arrived`
  std::vector<Tensor> arrived;               // per output: the sum of the gradients arrived so far
  std::vector<Output> roots;                 // the output each root is
  std::vector<std::size_t> ready;            // ReadyHeap's array
  TensorList grad_outputs, grad_inputs;      // of the node running now

  // The slot of `node`; a node reached for the first time gets the next one, a consumer count
  // of zero, and this walk's claim.
  std::size_t add_node(const std::shared_ptr<Node>& node) {
    const auto [slot, fresh] = slots.find_or_insert(node.get(), nodes.size());
    if (fresh) {
      nodes.push_back(node);
      pending.push_back(0);
      if (!node->accumulates_into_leaf()) {
        try {
          WalkClaim::acquire(*node);
        } catch (...) {
          nodes.pop_back();  // not held: not to be let go of either
          pending.pop_back();
          throw;
        }
      }
    }
    return slot;
  }
  // Adds the node of `root` (which must have one) and notes which of its outputs the root is.
  void add_root(const Tensor& root);
  // Lays out `arrived`: one place per output of every node reached, all empty.
  void lay_out_gradients();
  std::size_t producer(std::size_t slot, std::size_t edge) const { return producers[first_edge[slot] + edge]; }
  Tensor& arrived_at(std::size_t slot, std::size_t nr) { return arrived[first_grad[slot] + nr]; }
  Tensor& arrived_at(Output o) { return arrived_at(o.slot, o.nr); }
  // Moves what arrived at the outputs of the node in `slot` into grad_outputs.
  TensorList& take_arrived(std::size_t slot) {
    const auto begin = arrived.begin() + static_cast<std::ptrdiff_t>(first_grad[slot]);
    const auto end = arrived.begin() + static_cast<std::ptrdiff_t>(first_grad[slot + 1]);
    grad_outputs.assign(std::make_move_iterator(begin), std::make_move_iterator(end));
    return grad_outputs;
  }
  // Lets go of every node (and its claim on it) and tensor; keeps the capacity unless a very
  // large graph made it big.
  void clear();
  static constexpr std::size_t kKeepNodes = std::size_t{1} << 16;
};

// This walk's tables, taken from the thread's spares (a new walk of the slot map begun) and given
// back (cleared) at the end.
class WalkTablesLease {
 public:
  WalkTablesLease();
  ~WalkTablesLease();
  WalkTablesLease(const WalkTablesLease&) = delete;
  WalkTablesLease& operator=(const WalkTablesLease&) = delete;
  WalkTables& operator*() { return *tables_; }

 private:
  std::unique_ptr<WalkTables> tables_;
};

// The ready slots in a heap (in the tables' `ready`): the node created last comes out first.
class ReadyHeap {
 public:
  explicit ReadyHeap(WalkTables& t) : heap_(t.ready), nodes_(t.nodes) {}
  bool empty() const { return heap_.empty(); }
  void push(std::size_t slot) {
    heap_.push_back(slot);
    std::push_heap(heap_.begin(), heap_.end(), LaterFirst{nodes_});
  }
  std::size_t pop() {
    std::pop_heap(heap_.begin(), heap_.end(), LaterFirst{nodes_});
    const std::size_t slot = heap_.back();
    heap_.pop_back();
    return slot;
  }

 private:
  struct LaterFirst {
    const std::vector<std::shared_ptr<Node>>& nodes;
    bool operator()(std::size_t a, std::size_t b) const { return nodes[a]->sequence_nr < nodes[b]->sequence_nr; }
  };
  std::vector<std::size_t>& heap_;
  const std::vector<std::shared_ptr<Node>>& nodes_;
};

// grad(): where the gradient of each input arrives (the slot of its node and which output),
// what arrived there, and which nodes lead to some input (only those run).
class Capture {
 public:
  Capture(std::span<const Tensor> inputs, const std::function<void(std::size_t)>& refuse_unreachable)
      : inputs_(inputs), refuse_unreachable_(refuse_unreachable) {}
  // After seeding: finds where each input's gradient arrives and marks the nodes that lead there.
  // Then, when refuse_unreachable was given and some input no gradient can reach, calls it with
  // the index of the first such input, before any node runs (a refusal leaves the graph as it was).
  void locate(const WalkTables& t);
  // Whether the node in `slot` runs: it leads to some input.
  bool runs(std::size_t slot) const { return needed_[slot] != 0; }
  // Whether the gradient of some input arrives at an output of the node in `slot`.
  bool is_target(std::size_t slot) const { return target_[slot] != 0; }
  // Keeps what arrived at the outputs of the node in `slot` that are inputs; once the hooks ran
  // (`hooked`), what they made of it, where a gradient arrived at all.
  void keep(std::size_t slot, const TensorList& grad_outputs, bool hooked);
  // One flag per edge of the node in `slot`: 0 where the gradient leads to no input.
  const char* edges_wanted(const WalkTables& t, std::size_t slot) const {
    return edge_wanted_.data() + t.first_edge[slot];
  }
  TensorList grads;  // per input; undefined where none arrived

 private:
  std::size_t first_unreachable(const WalkTables& t) const;
  std::span<const Tensor> inputs_;
  const std::function<void(std::size_t)>& refuse_unreachable_;
  std::vector<Output> at_;          // per input; slot kNoSlot: not reached
  std::vector<char> needed_;        // per slot
  std::vector<char> target_;        // per slot: some input's gradient arrives there
  std::vector<char> edge_wanted_;   // per edge: it leads to a needed or target slot
};

// Throws: `node` was freed by an earlier walk without retain_graph.
[[noreturn]] void freed_graph_error(const Node& node);

// Adds g into a place of `arrived` (the first gradient is taken as it is).
inline void accumulate(Tensor& place, const Tensor& g) { place = place.defined() ? add(place, g) : g; }

inline bool any_defined(const TensorList& grads) {
  return std::any_of(grads.begin(), grads.end(), [](const Tensor& g) { return g.defined(); });
}

// Stands in zeros for outputs that got no gradient (unless the rule reads undefined as zero) and
// runs the hooks of each output, which may replace its gradient (same shape and dtype, or it throws).
inline void run_output_hooks(const Node& node, TensorList& grad_outputs);

// A rule returns one gradient per input, each undefined or of that input's shape and dtype.
// While a graph of the backward is built, a gradient that arrived as part of that graph must
// leave as part of it: a rule that computed with raw kernels would cut the graph, and the
// derivatives through it would silently be zero.
inline void check_returned(const Node& node, const TensorList& grad_outputs, const TensorList& grad_inputs);

// After its rule ran in a walk without retain_graph: frees the node's saved tensors and edges. A
// leaf's AccumulateGrad stays: the leaf keeps it for later walks.
inline void free_node(Node& node) {
  if (!node.accumulates_into_leaf()) node.mark_released();
}

// How many backward walks this thread is inside (a hook may start one within another). A hook
// whose backward reaches the same hook again would recurse until the stack runs out; past
// kMaxNesting walks deep that is an error instead.
class NestingDepth {
 public:
  NestingDepth();
  ~NestingDepth();
  NestingDepth(const NestingDepth&) = delete;
  NestingDepth& operator=(const NestingDepth&) = delete;
  static constexpr int kMaxNesting = 64;
};

// Grad mode for the backward rules (on only when they build a graph), and whether the walk
// adds into .grad, both restored when the walk ends.
class WalkModes {
 public:
  WalkModes(bool create_graph, bool accumulates);
  ~WalkModes();
  WalkModes(const WalkModes&) = delete;
  WalkModes& operator=(const WalkModes&) = delete;

 private:
  bool grad_, accumulates_;
};

}  // namespace walking

// Called once per node by the walk, so inline (see the top of this file).

inline void WalkClaim::acquire(Node& node) {
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

inline void WalkClaim::release(Node& node) noexcept {
  std::uint64_t held = node.walkers_.load(std::memory_order_relaxed);
  for (;;) {
    const std::uint64_t next = (held & kCountMask) == 1 ? 0 : held - 1;
    if (node.walkers_.compare_exchange_weak(held, next, std::memory_order_release, std::memory_order_relaxed))
      return;
  }
}

inline std::uint64_t WalkClaim::thread_token() {
  static std::atomic<std::uint64_t> next{1};
  thread_local const std::uint64_t token = next++;
  return token;
}

namespace walking {

inline void run_output_hooks(const Node& node, TensorList& grad_outputs) {
  for (std::size_t i = 0; i < grad_outputs.size(); ++i) {
    const TensorMeta& meta = node.output_meta[i];
    Tensor& g = grad_outputs[i];
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

inline void check_returned(const Node& node, const TensorList& grad_outputs, const TensorList& grads) {
  if (is_anomaly_enabled()) anomaly_check_backward(node, grads);
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
  const bool graph_in = std::any_of(grad_outputs.begin(), grad_outputs.end(),
                                    [](const Tensor& g) { return g.defined() && g.requires_grad(); });
  for (std::size_t j = 0; graph_in && j < grads.size(); ++j)
    if (grads[j].defined() && !grads[j].requires_grad())
      throw std::runtime_error(fmt::format(
          "backward of '{}' cannot be differentiated again (create_graph): its gradient for input {} was "
          "computed outside the graph; use first-order backward through it, or write its backward with "
          "differentiable ops",
          printable(node.name()), j));
}

}  // namespace walking
}  // namespace detail
}  // namespace autograd
