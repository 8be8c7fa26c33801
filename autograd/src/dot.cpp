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

}  // namespace

std::string to_dot(const Tensor& t) {
  if (!t.defined()) fail("to_dot", "tensor is undefined");
  std::string out = "digraph autograd {\n  rankdir=BT;\n  node [fontname=\"monospace\", fontsize=10];\n";
  out += fmt::format("  out [shape=doubleoctagon, label=\"{}\\n{}\"];\n",
                     t.name().empty() ? "output" : label_text(t.name()), shape_str(t.shape()));
  const Edge root = gradient_edge(t);
  if (!root.valid()) return out + "}\n";

  std::unordered_map<const Node*, std::size_t> ids;
  std::vector<std::shared_ptr<Node>> stack{root.node};
  ids[root.node.get()] = 0;
  out += fmt::format("  n0 -> out;\n");
  while (!stack.empty()) {
    auto node = stack.back();
    stack.pop_back();
    const std::size_t id = ids[node.get()];
    if (auto* acc = dynamic_cast<AccumulateGrad*>(node.get())) {
      out += fmt::format("  n{} [shape=ellipse, style=filled, fillcolor=lightblue, label=\"{}\"];\n", id,
                         leaf_label(*acc->leaf()));
      continue;
    }
    std::vector<std::string> shapes;
    for (const auto& m : node->output_meta) shapes.push_back(shape_str(m.shape));
    out += fmt::format("  n{} [shape=box, label=\"{}\\n{}{}\"];\n", id, label_text(node->name()),
                       fmt::join(shapes, " "), node->released() ? "\\n(freed)" : "");
    for (const auto& e : node->next_edges) {
      if (!e.valid()) continue;
      auto [it, inserted] = ids.emplace(e.node.get(), ids.size());
      if (inserted) stack.push_back(e.node);
      out += fmt::format("  n{} -> n{};\n", it->second, id);
    }
  }
  return out + "}\n";
}

}  // namespace autograd
