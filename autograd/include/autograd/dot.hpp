#pragma once
// The graph behind a tensor as Graphviz DOT: one box per op (name, output shapes), one per
// leaf (shape, gradient norm when .grad is known). `dot -Tsvg graph.dot > graph.svg` draws it.
#include <string>

#include "autograd/tensor.hpp"

namespace autograd {

std::string to_dot(const Tensor& t);

}  // namespace autograd
