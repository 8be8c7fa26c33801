// The graph behind a tensor as Graphviz DOT.
#include "autograd/dot.hpp"

#include <cmath>
#include <unordered_map>

#include "autograd/graph.hpp"

namespace autograd {

namespace {

// A name as text inside a quoted DOT label: control bytes (NUL included) spelled out by
// printable(), then the quote and the backslash escaped for DOT, so the label shows the name as
// printable() writes it. (A \n between the parts of a label is DOT's line break.)
std::string label_text(std::string_view name) {
  std::string out;
  for (char c : printable(name)) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

std::string leaf_label(const TensorImpl& leaf) {
  std::string label = leaf.name.empty() ? "leaf" : label_text(leaf.name);
  label += "\\n" + shape_str(leaf.shape);
  if (leaf.grad) {
    double norm = 0.0;
    for (double v : Tensor(leaf.grad).to_vector()) norm += v * v;
    label += fmt::format("\\n|grad| = {:.4g}", std::sqrt(norm));
  }
  return label;
}

constexpr const char* kMarkColour = "gold";

// The marked tensors, found by the node that made them: (node, output) for a non-leaf, the leaf
// itself for a leaf. Each mark is looked for once; `found` records the ones the walk met.
struct Marks {
  const DotOptions& options;
  std::vector<bool> found = std::vector<bool>(options.marked.size(), false);

  // The mark lines for a node ("\n<label>" each), empty when it carries none.
  std::string of_node(const Node& node) {
    std::string out;
    for (std::size_t i = 0; i < options.marked.size(); ++i) {
      const Tensor& t = options.marked[i].second;
      if (!t.defined() || t.grad_fn().get() != &node) continue;
      found[i] = true;
      out += "\\n" + label_text(options.marked[i].first);
      if (node.output_meta.size() > 1) out += fmt::format(" (output {})", t.output_nr());
    }
    return out;
  }
  std::string of_leaf(const TensorImpl& leaf) {
    std::string out;
    for (std::size_t i = 0; i < options.marked.size(); ++i) {
      if (options.marked[i].second.impl().get() != &leaf) continue;
      found[i] = true;
      out += "\\n" + label_text(options.marked[i].first);
    }
    return out;
  }
  // A note listing the marks the walk did not meet, or nothing.
  std::string missing() const {
    std::string lines;
    for (std::size_t i = 0; i < options.marked.size(); ++i) {
      if (found[i]) continue;
      const Tensor& t = options.marked[i].second;
      lines += "\\n" + label_text(options.marked[i].first) + " " +
               (t.defined() ? shape_str(t.shape()) : std::string("(undefined)"));
    }
    if (lines.empty()) return {};
    return fmt::format("  not_in_graph [shape=note, label=\"marked, not in this graph:{}\"];\n", lines);
  }
};

std::string node_line(std::size_t id, const Node& node, Marks& marks) {
  if (const auto* acc = dynamic_cast<const AccumulateGrad*>(&node)) {
    const std::string mark = marks.of_leaf(*acc->leaf());
    return fmt::format("  n{} [shape=ellipse, style=filled, fillcolor={}{}, label=\"{}{}\"];\n", id,
                       mark.empty() ? "lightblue" : kMarkColour, mark.empty() ? "" : ", penwidth=2",
                       leaf_label(*acc->leaf()), mark);
  }
  std::vector<std::string> shapes;
  for (const auto& m : node.output_meta) shapes.push_back(shape_str(m.shape));
  const std::string mark = marks.of_node(node);
  return fmt::format("  n{} [shape=box{}, label=\"{}\\n{}{}{}\"];\n", id,
                     mark.empty() ? "" : fmt::format(", style=filled, fillcolor={}, penwidth=2", kMarkColour),
                     label_text(node.name()), fmt::join(shapes, " "), node.released() ? "\\n(freed)" : "", mark);
}

}  // namespace

std::string to_dot(const Tensor& t) { return to_dot(t, DotOptions{}); }

std::string to_dot(const Tensor& t, const DotOptions& options) {
  if (!t.defined()) fail("to_dot", "the tensor is {}", undefined_description(t));
  std::string out = "digraph autograd {\n  rankdir=BT;\n  node [fontname=\"monospace\", fontsize=10];\n";
  out += fmt::format("  out [shape=doubleoctagon, label=\"{}\\n{}\"];\n",
                     t.name().empty() ? "output" : label_text(t.name()), shape_str(t.shape()));
  Marks marks{options};
  const Edge root = gradient_edge(t);
  if (!root.valid()) return out + marks.missing() + "}\n";

  std::unordered_map<const Node*, std::size_t> ids;
  std::vector<std::shared_ptr<Node>> stack{root.node};
  ids[root.node.get()] = 0;
  out += fmt::format("  n0 -> out;\n");
  while (!stack.empty()) {
    auto node = stack.back();
    stack.pop_back();
    const std::size_t id = ids[node.get()];
    out += node_line(id, *node, marks);
    if (dynamic_cast<AccumulateGrad*>(node.get())) continue;
    for (const auto& e : node->next_edges) {
      if (!e.valid()) continue;
      auto [it, inserted] = ids.emplace(e.node.get(), ids.size());
      if (inserted) stack.push_back(e.node);
      out += fmt::format("  n{} -> n{};\n", it->second, id);
    }
  }
  return out + marks.missing() + "}\n";
}

}  // namespace autograd
