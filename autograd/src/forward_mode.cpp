// Forward mode by the ops' own rules: the graph behind the outputs is put in an order where every
// node comes after the nodes that made its inputs, and each node that a moving input reaches turns
// its inputs' tangents into its outputs' (Node::tangents). Nodes no input reaches are skipped, so
// a rule is needed only on the paths from the inputs to the outputs.
#include "forward_mode.hpp"

#include <fmt/format.h>

#include <unordered_map>
#include <utility>
#include <vector>

#include "autograd/grad_mode.hpp"
#include "autograd/graph.hpp"
#include "autograd/ops.hpp"

namespace autograd::detail {

namespace {

// The node that carries a gradient into t and which of its outputs t is; the leaf's
// accumulator (made if it has none yet) for a leaf that requires grad; null when t needs no
// gradient. (Owned: an accumulator nothing else holds lives as long as the walk.)
std::pair<std::shared_ptr<Node>, std::uint32_t> source_of(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {nullptr, 0};
  if (t.grad_fn()) return {t.grad_fn(), t.impl()->output_nr};
  return {grad_accumulator(t), 0};
}

struct Walk {
  struct Entry {
    std::shared_ptr<Node> node;
    TensorList tangents;     // one per output, once computed (undefined = zero)
    std::uint64_t wanted = 0;  // outputs whose tangents something downstream reads
    bool seeded = false;     // an input of the walk: its tangents are given, never computed
    bool expanded = false;   // its inputs' nodes have been pushed
    bool emitted = false;    // it is in the order
  };
  std::vector<Entry> entries;
  std::unordered_map<const Node*, std::size_t> index;

  std::size_t add(const std::shared_ptr<Node>& n) {
    auto [it, inserted] = index.emplace(n.get(), entries.size());
    if (inserted) {
      Entry e;
      e.node = n;
      e.tangents.resize(n->output_meta.size() > 0 ? n->output_meta.size() : 1);
      entries.push_back(std::move(e));
    }
    return it->second;
  }
};

void mark_wanted(Walk::Entry& e, std::uint32_t nr) {
  if (nr < 64) e.wanted |= std::uint64_t{1} << nr;
}

Tensor sum_tangents(const Tensor& a, const Tensor& b) {
  if (!a.defined()) return b;
  if (!b.defined()) return a;
  return add(a, b);
}

}  // namespace

std::optional<TensorList> tangents_by_rules(const TensorList& outputs, const TensorList& inputs,
                                            const TensorList& tangents, std::string* missing) {
  const auto give_up = [&](std::string why) -> std::optional<TensorList> {
    if (missing != nullptr) *missing = std::move(why);
    return std::nullopt;
  };
  Walk w;
  // The seeds: the inputs' nodes, their tangents given. (An input given twice gets the sum.)
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const auto [node, nr] = source_of(inputs[i]);
    if (node == nullptr || !tangents[i].defined()) continue;
    Walk::Entry& e = w.entries[w.add(node)];
    e.seeded = true;
    if (nr >= e.tangents.size()) e.tangents.resize(nr + 1);
    e.tangents[nr] = sum_tangents(e.tangents[nr], tangents[i]);
  }
  // Depth first from the outputs, stopping at seeds and leaves: `order` lists every node after
  // the nodes its inputs come from.
  std::vector<std::size_t> order, stack;
  for (const auto& y : outputs) {
    const auto [node, nr] = source_of(y);
    if (node == nullptr) continue;
    const std::size_t k = w.add(node);
    mark_wanted(w.entries[k], nr);
    stack.push_back(k);
  }
  while (!stack.empty()) {
    const std::size_t k = stack.back();
    if (w.entries[k].expanded) {  // its inputs' nodes are done (or it is a seed or a leaf)
      stack.pop_back();
      Walk::Entry& e = w.entries[k];
      if (!e.emitted && !e.seeded && !e.node->accumulates_into_leaf()) order.push_back(k);
      e.emitted = true;
      continue;
    }
    w.entries[k].expanded = true;
    if (w.entries[k].seeded || w.entries[k].node->accumulates_into_leaf()) continue;
    Node* node = w.entries[k].node.get();
    for (const Edge& edge : node->next_edges) {
      if (!edge.valid()) continue;
      const std::size_t c = w.add(edge.node);
      mark_wanted(w.entries[c], edge.input_nr);
      if (!w.entries[c].expanded) stack.push_back(c);
    }
  }
  // Each node a seed reaches, in order: its inputs' tangents to its outputs'.
  {
    NoGradGuard no_grad;
    TensorList in, out;
    for (const std::size_t k : order) {
      Node* node = w.entries[k].node.get();
      // A node whose graph was freed (fn called backward() itself) has lost its edges: the walk
      // cannot tell what reaches it, so it gives up (the construction then names the node).
      if (node->released()) return give_up(fmt::format("'{}' (its graph was freed)", node->name()));
      in.assign(node->next_edges.size(), Tensor());
      bool any = false;
      for (std::size_t i = 0; i < node->next_edges.size(); ++i) {
        const Edge& edge = node->next_edges[i];
        if (!edge.valid()) continue;
        const Walk::Entry& src = w.entries[w.index.at(edge.node.get())];
        if (edge.input_nr < src.tangents.size() && src.tangents[edge.input_nr].defined()) {
          in[i] = src.tangents[edge.input_nr];
          any = true;
        }
      }
      if (!any) continue;
      out.clear();
      if (!node->tangents(in, out, w.entries[k].wanted)) return give_up(fmt::format("'{}'", node->name()));
      if (out.size() > node->output_meta.size())
        fail("jvp", "the forward-mode rule of '{}' returned {} tangents for {} outputs", node->name(), out.size(),
             node->output_meta.size());
      for (std::size_t j = 0; j < out.size(); ++j) {
        const TensorMeta& m = node->output_meta[j];
        if (out[j].defined() && (out[j].shape() != m.shape || out[j].dtype() != m.dtype))
          fail("jvp", "the forward-mode rule of '{}' returned for output {} a tangent {} {}, but that output is {} {}",
               node->name(), j, shape_str(out[j].shape()), dtype_name(out[j].dtype()), shape_str(m.shape),
               dtype_name(m.dtype));
      }
      Walk::Entry& e = w.entries[k];
      for (std::size_t j = 0; j < out.size() && j < e.tangents.size(); ++j) e.tangents[j] = std::move(out[j]);
    }
  }
  TensorList result(outputs.size());
  for (std::size_t j = 0; j < outputs.size(); ++j) {
    const auto [node, nr] = source_of(outputs[j]);
    if (node == nullptr) continue;
    const Walk::Entry& e = w.entries[w.index.at(node.get())];
    if (nr < e.tangents.size()) result[j] = e.tangents[nr];
  }
  return result;
}

}  // namespace autograd::detail
