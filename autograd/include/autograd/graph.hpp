#pragma once
// The graph that backward() walks.
//
// Each differentiable op that sees an input requiring grad creates one Node. The node points
// backwards, at the nodes that made its inputs (Edges); leaves that require grad are reached
// through an AccumulateGrad node that adds into their .grad. Output tensors point at their node,
// nodes never point at their outputs, so there are no reference cycles: a graph lives as long
// as some tensor computed from it (or a retained backward) holds it.
//
// Backward rules receive the gradients of the node's outputs as arguments and return the
// gradients of its inputs (flashlight's style); what a rule needs from the forward pass it
// keeps in SavedTensors, which remember the version of the data they saved.
#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "autograd/detail/small_pool.hpp"
#include "autograd/tensor.hpp"

namespace autograd {

// The gradients a built-in backward rule returns: up to N tensors held inline, so that returning
// them allocates nothing (a TensorList would allocate once per node and backward call). Rules
// with more inputs than that return a TensorList.
template <std::size_t N>
class InlineTensorList {
 public:
  InlineTensorList() = default;
  explicit InlineTensorList(std::size_t n) { resize(n); }
  InlineTensorList(std::initializer_list<Tensor> items) {
    for (const auto& t : items) push_back(t);
  }
  void resize(std::size_t n) {
    if (n > N) throw std::length_error("InlineTensorList: more tensors than its capacity");
    for (std::size_t i = n; i < size_; ++i) items_[i] = Tensor();
    size_ = n;
  }
  void push_back(Tensor t) {
    if (size_ == N) throw std::length_error("InlineTensorList: more tensors than its capacity");
    items_[size_++] = std::move(t);
  }
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  Tensor& operator[](std::size_t i) { return items_[i]; }
  const Tensor& operator[](std::size_t i) const { return items_[i]; }
  Tensor* begin() { return items_.data(); }
  Tensor* end() { return items_.data() + size_; }

 private:
  std::array<Tensor, N> items_;
  std::size_t size_ = 0;
};
using GradList = InlineTensorList<4>;

struct Edge {
  std::shared_ptr<Node> node;  // null: that input needs no gradient
  std::uint32_t input_nr = 0;  // which output of `node` the input was
  bool valid() const { return node != nullptr; }
};

// Shape and dtype of a tensor the node consumed or produced; used to check the gradients that
// flow through it and to stand in zeros for outputs that received no gradient.
struct TensorMeta {
  Shape shape;
  Dtype dtype = Dtype::Float32;
  // Outputs only: the storage the output was made with, by which a saved tensor recognises the
  // node's own output when a graph of the backward is built (identity only, never read).
  const Storage* storage = nullptr;
};

namespace detail {
class WalkClaim;  // the backward walk's claim on a node (walk_bookkeeping.hpp)
// True while a grad() walk runs `node`'s rule and the gradient of its input i reaches none of
// grad()'s inputs (walk_bookkeeping.cpp).
bool input_grad_unwanted(const Node& node, std::size_t i);
}

class Node : public std::enable_shared_from_this<Node> {
 public:
  explicit Node(std::string_view name);
  // Frees the graph behind this node in a loop, not by recursion: a chain of any length is
  // dropped with a small, bounded stack.
  virtual ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // grad_outputs has one tensor per output (zeros where none arrived, or undefined when
  // materialize_grads is false); fills grad_inputs (empty on entry; the caller reuses its
  // capacity) with exactly one gradient per input edge, undefined where that input needs none.
  virtual void apply(const TensorList& grad_outputs, TensorList& grad_inputs) = 0;
  // Drops what was saved for backward; the node can no longer be applied.
  virtual void release_saved() {}
  // Forward mode (ag::jvp): fills output_tangents with one tangent per output (undefined = zero)
  // from input_tangents, one per input edge (undefined = zero, at least one defined), computed
  // from what the node saved, outside any graph. Bit j of `wanted` says whether output j's tangent
  // is used (outputs from 64 on always are); a rule may leave the others undefined. Returns false
  // when the op has no forward-mode rule (jvp then takes the double-vjp construction).
  virtual bool tangents(const TensorList& input_tangents, TensorList& output_tangents, std::uint64_t wanted) {
    (void)input_tangents, (void)output_tangents, (void)wanted;
    return false;
  }

  std::string_view name() const { return name_; }
  bool released() const { return released_; }
  void mark_released();
  // True when input i requires a gradient and, while a grad() walk runs this node's rule, that
  // gradient leads to one of grad()'s inputs (a rule skips the gradients nobody asked for).
  bool needs_input_grad(std::size_t i) const {
    return i < next_edges.size() && next_edges[i].valid() && !detail::input_grad_unwanted(*this, i);
  }
  // True for a leaf's AccumulateGrad: the one kind of node that backward() calls on several
  // threads may reach at the same time (it locks the leaf's .grad while it adds).
  bool accumulates_into_leaf() const { return accumulates_into_leaf_; }

  // (Lists from the per-thread small-object pool: no system allocation once warm.)
  std::vector<Edge, detail::PoolAllocator<Edge>> next_edges;              // one per input
  std::vector<TensorMeta, detail::PoolAllocator<TensorMeta>> input_meta;  // one per input
  std::vector<TensorMeta, detail::PoolAllocator<TensorMeta>> output_meta; // one per output
  std::vector<std::vector<TensorHook>> output_hooks;  // per output, run before apply (empty: none)
  std::uint64_t sequence_nr;           // creation order; later nodes run first
  std::string creation_context;        // where it was made (filled under anomaly detection)
  // True (the default): an output that received no gradient is handed to apply() as zeros of
  // its shape. False: it is handed over undefined, and the rule must treat it as zero; rules
  // of multi-output ops set this to skip work (and memory) for outputs nobody used.
  bool materialize_grads = true;

 protected:
  Node(std::string_view name, bool accumulates_into_leaf);

 private:
  friend class detail::WalkClaim;
  // (From the small-object pool too: a name longer than the string's inline buffer, such as
  // "scaled_dot_product_attention", would otherwise allocate on every record.)
  std::basic_string<char, std::char_traits<char>, detail::PoolAllocator<char>> name_;
  bool released_ = false;
  bool accumulates_into_leaf_ = false;
  // Which thread's walks hold this node now, and how many of them (nested walks from hooks):
  // zero when no walk does. A walk on another thread that reaches the node meanwhile refuses.
  std::atomic<std::uint64_t> walkers_{0};
};

// Backward rule given as a function: grads of outputs -> grads of inputs.
using BackwardFn = std::function<TensorList(const TensorList& grad_outputs, const Node& node)>;

// A rule object with a forward-mode rule as well: tangents(input_tangents, node, wanted) returns
// the output tangents (a TensorList or a GradList), as Node::tangents describes.
template <class F>
concept HasTangentRule = requires(const F& f, const TensorList& t, const Node& n, std::uint64_t wanted) {
  f.tangents(t, n, wanted);
};

// A node whose backward rule is a callable F(const TensorList&, const Node&) returning a
// TensorList or a GradList, kept inside the node: recording an op makes one allocation (node
// and rule together), where a std::function would make a second one for the rule's captures.
// When F also has a forward-mode rule (HasTangentRule), the node's tangents() calls it.
template <class F>
class FunctionNode final : public Node {
 public:
  FunctionNode(std::string_view name, F fn) : Node(name), fn_(std::move(fn)) {}
  void apply(const TensorList& grad_outputs, TensorList& grad_inputs) override {
    auto grads = (*fn_)(grad_outputs, *this);
    grad_inputs.assign(std::make_move_iterator(grads.begin()), std::make_move_iterator(grads.end()));
  }
  bool tangents(const TensorList& input_tangents, TensorList& output_tangents, std::uint64_t wanted) override {
    if constexpr (HasTangentRule<F>) {
      if (!fn_) return false;  // released
      auto t = fn_->tangents(input_tangents, *this, wanted);
      output_tangents.assign(std::make_move_iterator(t.begin()), std::make_move_iterator(t.end()));
      return true;
    } else {
      (void)input_tangents, (void)output_tangents, (void)wanted;
      return false;
    }
  }
  void release_saved() override { fn_.reset(); }  // drops the rule's SavedTensors

 private:
  std::optional<F> fn_;
};

// Adds the gradient into a leaf's .grad (in place once .grad exists), after the leaf's hooks.
// Walks on several threads may add into one leaf: the addition holds a lock of that leaf.
class AccumulateGrad : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf);
  void apply(const TensorList& grad_outputs, TensorList& grad_inputs) override;
  const std::shared_ptr<TensorImpl>& leaf() const { return leaf_; }

 private:
  std::shared_ptr<TensorImpl> leaf_;
};

// A tensor kept for backward. It holds the data outside the graph (no cycles) and the
// version it had; get() throws if the data was changed in place in between.
//
// It also remembers where the tensor came from in the graph, for backward rules that build a
// graph of their own (create_graph): a tensor made by an earlier op keeps that op's node, a leaf
// that requires grad is kept itself, and a tensor that had no graph yet when it was saved may be
// the op's own output (saved before the node existed): get() then finds it among the outputs of
// the node being run. Holding the node of an output would be a cycle; holding the earlier ops'
// nodes is not (the node holds them through its edges anyway).
class SavedTensor {
 public:
  SavedTensor() = default;
  explicit SavedTensor(const Tensor& t);
  // `op` names the backward that needs it, for the error message. While grad mode is on (a
  // backward with create_graph) the tensor returned is part of the graph, as the original was.
  Tensor get(std::string_view op) const;
  bool defined() const { return data_.defined(); }

 private:
  Tensor connected() const;
  Tensor data_;
  std::uint64_t version_ = 0;
  std::shared_ptr<Node> grad_fn_;      // the op that made it, if any
  std::shared_ptr<TensorImpl> leaf_;   // the tensor itself, when it is a leaf that requires grad
  std::uint32_t output_nr_ = 0;
};

// True when grad mode is on and some input requires grad: the op must record a node.
bool needs_grad(const Tensor& a);
bool needs_grad(const Tensor& a, const Tensor& b);
bool needs_grad(const TensorList& inputs);
bool needs_grad(std::span<const Tensor> inputs);

// The edge that carries a gradient into t (its grad_fn, or its leaf accumulator); an invalid
// edge when t needs no gradient.
Edge gradient_edge(const Tensor& t);
// The AccumulateGrad node of a leaf that requires grad (made on first use, shared after).
std::shared_ptr<Node> grad_accumulator(const Tensor& leaf);

// Connects an already built node (custom Node subclasses).
void connect(const std::shared_ptr<Node>& node, const TensorList& inputs, const TensorList& outputs);
// The same over spans, so that callers need not build vectors.
void connect(const std::shared_ptr<Node>& node, std::span<const Tensor> inputs, std::span<const Tensor> outputs);

// Makes a node with backward rule `fn` (a lambda or BackwardFn) that consumes `inputs` and
// produces `outputs`, and points each output at it. Call only when needs_grad(inputs).
// The braced-list overloads (`record("mul", {a, b}, y, rule)`) build no vector.
template <class F>
void record(std::string_view name, std::span<const Tensor> inputs, std::span<const Tensor> outputs, F&& fn) {
  connect(std::allocate_shared<FunctionNode<std::decay_t<F>>>(detail::PoolAllocator<FunctionNode<std::decay_t<F>>>{}, name,
                                                          std::forward<F>(fn)), inputs, outputs);
}
template <class F>
void record(std::string_view name, const TensorList& inputs, const TensorList& outputs, F&& fn) {
  record(name, std::span<const Tensor>(inputs), std::span<const Tensor>(outputs), std::forward<F>(fn));
}
template <class F>
void record(std::string_view name, std::initializer_list<Tensor> inputs, const TensorList& outputs, F&& fn) {
  record(name, std::span<const Tensor>(inputs.begin(), inputs.size()), std::span<const Tensor>(outputs),
         std::forward<F>(fn));
}
// Single-output shorthands that return the output.
template <class F>
Tensor record(std::string_view name, const TensorList& inputs, Tensor output, F&& fn) {
  record(name, std::span<const Tensor>(inputs), std::span<const Tensor>(&output, 1), std::forward<F>(fn));
  return output;
}
template <class F>
Tensor record(std::string_view name, std::initializer_list<Tensor> inputs, Tensor output, F&& fn) {
  record(name, std::span<const Tensor>(inputs.begin(), inputs.size()), std::span<const Tensor>(&output, 1),
         std::forward<F>(fn));
  return output;
}

// Runs backward from `roots` seeded with `grads` (same shapes). Used by Tensor::backward.
// A hook may call backward() again (a nested walk, with its own bookkeeping). Walks on several
// threads may share leaves; one that reaches a node another thread's walk holds throws.
// create_graph: the backward rules run with grad mode on, so the gradients they compute (and
// the .grad they leave) are part of a graph that can be differentiated again; the graph walked
// is kept, whatever retain_graph says.
void run_backward(const TensorList& roots, const TensorList& grads, bool retain_graph, bool create_graph = false);
void run_backward(std::span<const Tensor> roots, std::span<const Tensor> grads, bool retain_graph,
                  bool create_graph = false);

// ---- the functional gradient (torch.autograd.grad) ----
// retain_graph and create_graph are Tensor::backward's BackwardOptions (tensor.hpp): the same
// names, defaults and meaning (src/grad.cpp checks the defaults agree at compile time).
struct GradOptions {
  // One per output (each of its output's shape and dtype); empty, or an undefined entry, means
  // ones for a one-element output.
  TensorList grad_outputs = {};
  bool retain_graph = false;
  // The returned gradients are part of a graph (differentiable again, to any order); implies
  // retain_graph.
  bool create_graph = false;
  // An input the outputs do not depend on gets an undefined tensor instead of an error.
  bool allow_unused = false;
};

// d(outputs)/d(inputs), summed over the outputs and weighted by grad_outputs: one gradient per
// input, of its shape. Writes no .grad (neither the inputs' nor any other tensor's) and runs
// only the part of the graph between the outputs and the inputs. Inputs may be leaves or
// tensors made by ops; each must require grad.
TensorList grad(const TensorList& outputs, const TensorList& inputs, const GradOptions& options = {});

// True while the backward walk on this thread adds into .grad (backward()); false while it only
// hands gradients back (grad()). Hooks that store gradients, as retain_grad's does, ask it.
bool backward_accumulates_grad();

// Sums a broadcast gradient back to `shape` (NumPy broadcasting rules in reverse).
Tensor sum_to(const Tensor& grad, const Shape& shape);

}  // namespace autograd
