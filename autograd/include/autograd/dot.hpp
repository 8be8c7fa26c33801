#pragma once
// The graph behind a tensor as Graphviz DOT: one box per op (name, output shapes), one per
// leaf (its tensor name, so a module's parameters show their dotted names such as
// "fc_1.weight"; shape; gradient norm when .grad is known). `dot -Tsvg graph.dot > graph.svg`
// draws it.
#include <string>
#include <utility>
#include <vector>

#include "autograd/tensor.hpp"

namespace autograd {

struct DotOptions {
  // Tensors to highlight, each with a label (e.g. a cache's hook-point names): the node that
  // made each one, or its leaf node, is filled in colour and shows the label ("label (output 1)"
  // for a node with several outputs). Marks whose tensor is not in the graph are listed in a
  // note beside it.
  std::vector<std::pair<std::string, Tensor>> marked;
};

std::string to_dot(const Tensor& t);
std::string to_dot(const Tensor& t, const DotOptions& options);

}  // namespace autograd
