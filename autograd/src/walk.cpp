// The backward walk. Read `walk` below first: it is the whole algorithm, on one screen. It is
// Kahn's algorithm on consumer counts, iterative (so no recursion limit), with the ready nodes in
// a heap by sequence number:
//
//   count  every node reachable from the roots gets a slot and a count of its consumers (the
//          edges into it from reached nodes): the nodes that must run before it
//   seed   each root's gradient arrives at the output of its node that the root is
//   walk   of the ready nodes (all consumers run), the one created last runs: its output hooks,
//          its backward rule, then each input's gradient is added to what has arrived at the
//          producer's output, and a producer whose last consumer this was becomes ready. A leaf's
//          node is its AccumulateGrad, whose rule adds into .grad. Without retain_graph a node's
//          saved tensors and edges are freed once it ran
//
// The bookkeeping is in walk_bookkeeping.hpp: the tables indexed by slot (never fields on the
// nodes, so a hook may start a nested walk over the same nodes), reused from the thread's earlier
// walks so that backward()'s walk allocates nothing once warm, the claims that keep walks on two
// threads off one node, the hooks and checks around a rule, and grad()'s capture of its inputs'
// gradients. run_backward and capture_gradients, after `walk`, set it up for backward() and grad().
#include <span>
#include <utility>

#include "autograd/graph.hpp"
#include "walk_bookkeeping.hpp"
#include "walk_state.hpp"

namespace autograd {

using namespace detail::walking;

namespace {

// The algorithm. `capture` is null for backward(); for grad() it says which nodes run (those that
// lead to its inputs) and keeps the gradients that arrive at its inputs.
void walk(WalkTables& t, std::span<const Tensor> roots, std::span<const Tensor> seeds, bool retain_graph,
          Capture* capture) {
  // 1. Count: each node reachable from the roots gets a slot (t.nodes grows as the loop goes), and
  //    pending[s] counts the edges that lead to slot s.
  for (const Tensor& root : roots) t.add_root(root);
  for (std::size_t slot = 0; slot < t.nodes.size(); ++slot) {
    const Node& node = *t.nodes[slot];
    if (node.released()) freed_graph_error(node);
    t.first_edge.push_back(t.producers.size());
    for (const Edge& e : node.next_edges) {
      const std::size_t producer = e.valid() ? t.add_node(e.node) : kNoSlot;  // kNoSlot: needs no gradient
      t.producers.push_back(producer);
      if (producer != kNoSlot) ++t.pending[producer];
    }
  }
  t.first_edge.push_back(t.producers.size());

  // 2. Seed: each root's gradient arrives at its node's output.
  t.lay_out_gradients();
  for (std::size_t r = 0; r < seeds.size(); ++r) accumulate(t.arrived_at(t.roots[r]), seeds[r]);
  if (capture) capture->locate(t);  // grad(): which nodes lead to its inputs (it may refuse here)

  // 3. Walk: run the ready node created last, and pass each input's gradient to its producer.
  ReadyHeap ready(t);
  for (std::size_t slot = 0; slot < t.nodes.size(); ++slot)
    if (t.pending[slot] == 0) ready.push(slot);
  while (!ready.empty()) {
    const std::size_t slot = ready.pop();
    Node& node = *t.nodes[slot];
    if (node.released()) freed_graph_error(node);  // by a walk started from a hook
    TensorList& grad_outputs = t.take_arrived(slot);
    const bool runs = capture == nullptr || capture->runs(slot);
    if (any_defined(grad_outputs) && (runs || capture->is_target(slot))) {
      if (capture) capture->keep(slot, grad_outputs, false);  // grad(): what arrived at its inputs
      run_output_hooks(node, grad_outputs);  // zeros for outputs that got none, then the hooks
      if (capture) capture->keep(slot, grad_outputs, true);  // an input's gradient is what its hooks leave
      if (runs) {
        {
          detail::RunningNode running(node, capture ? capture->edges_wanted(t, slot) : nullptr);
          node.apply(grad_outputs, t.grad_inputs);  // the rule: one gradient per input
        }
        check_returned(node, grad_outputs, t.grad_inputs);
      }
    }
    grad_outputs.clear();  // drop this node's incoming gradients now
    // Route each input's gradient to its producer; the producer is ready once its last consumer ran.
    for (std::size_t j = 0; j < node.next_edges.size(); ++j) {
      const std::size_t producer = t.producer(slot, j);
      if (producer == kNoSlot) continue;
      if (j < t.grad_inputs.size() && t.grad_inputs[j].defined())
        accumulate(t.arrived_at(producer, node.next_edges[j].input_nr), t.grad_inputs[j]);
      if (--t.pending[producer] == 0) ready.push(producer);
    }
    t.grad_inputs.clear();
    if (runs && !retain_graph) free_node(node);
  }
}

}  // namespace

void run_backward(const TensorList& roots, const TensorList& grads, bool retain_graph, bool create_graph) {
  run_backward(std::span<const Tensor>(roots), std::span<const Tensor>(grads), retain_graph, create_graph);
}

void run_backward(std::span<const Tensor> roots, std::span<const Tensor> grads, bool retain_graph,
                  bool create_graph) {
  if (roots.size() != grads.size()) fail("backward", "{} roots but {} gradients", roots.size(), grads.size());
  NestingDepth depth;                   // a hook may run a backward, but not without end
  WalkModes modes(create_graph, true);  // without create_graph, rules compute with no graph of the graph
  WalkTablesLease tables;               // its end lets go of every node the walk held
  // With create_graph the graph is kept: the new graph of the gradients refers to it.
  walk(*tables, roots, grads, retain_graph || create_graph, nullptr);
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
  Capture capture(inputs, refuse_unreachable);
  walk(*tables, outputs, seeds, retain_graph || create_graph, &capture);
  return std::move(capture.grads);
}

}  // namespace detail

}  // namespace autograd
