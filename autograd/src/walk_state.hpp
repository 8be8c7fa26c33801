#pragma once
// What the backward walk on this thread is doing right now, for the pieces of the graph that
// need to know: the node whose backward rule runs (a saved tensor looks for its own output
// there when a graph of the backward is built), and whether gradients go into .grad.
#include <functional>
#include <span>

#include "autograd/graph.hpp"

namespace autograd {
namespace detail {

struct WalkState {
  Node* running = nullptr;      // the node whose apply() runs now (null outside)
  // grad(): one flag per input edge of the running node, 0 where that gradient reaches none of
  // grad()'s inputs (Node::needs_input_grad then says false); null: every gradient is wanted.
  const char* edges_wanted = nullptr;
  bool accumulates_grad = true;  // false inside grad(): nothing is written into .grad
};
WalkState& walk_state();

// Sets the running node (and which of its input gradients are wanted) for its lifetime and
// restores the ones before (walks nest).
class RunningNode {
 public:
  explicit RunningNode(Node& node, const char* edges_wanted = nullptr)
      : prev_(walk_state().running), prev_wanted_(walk_state().edges_wanted) {
    walk_state().running = &node;
    walk_state().edges_wanted = edges_wanted;
  }
  ~RunningNode() {
    walk_state().running = prev_;
    walk_state().edges_wanted = prev_wanted_;
  }
  RunningNode(const RunningNode&) = delete;
  RunningNode& operator=(const RunningNode&) = delete;

 private:
  Node* prev_;
  const char* prev_wanted_;
};

// grad()'s walk (walk.cpp): from `outputs` seeded with `seeds` (checked already), the gradients
// that arrive at `inputs` (undefined where none does); writes no .grad. When
// `refuse_unreachable` is given, it is called (and expected to throw) with the index of the first
// input no gradient can reach, once the graph is discovered and before any node runs.
TensorList capture_gradients(std::span<const Tensor> outputs, std::span<const Tensor> seeds,
                             std::span<const Tensor> inputs, bool retain_graph, bool create_graph,
                             const std::function<void(std::size_t)>& refuse_unreachable = {});

}  // namespace detail
}  // namespace autograd
