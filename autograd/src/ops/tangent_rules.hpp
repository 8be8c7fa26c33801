#pragma once
// Forward-mode rules (Node::tangents) beside the backward of ops recorded with a lambda (internal,
// not installed): record(name, inputs, y, with_tangents(backward, tangent)) or, for an op of one
// input whose Jacobian is symmetric (elementwise: diagonal; a scalar factor), symmetric(backward),
// whose tangent is the backward applied to it. Tangents come in one per input (undefined = zero,
// at least one defined) and go out one per output, computed with grad mode off.
#include <cstdint>
#include <utility>

#include "autograd/graph.hpp"
#include "autograd/ops.hpp"

namespace autograd {

template <class Backward, class Tangent>
struct WithTangents {
  Backward backward;
  Tangent tangent;
  auto operator()(const TensorList& g, const Node& n) const { return backward(g, n); }
  auto tangents(const TensorList& t, const Node& n, std::uint64_t) const { return tangent(t, n); }
};

template <class Backward, class Tangent>
WithTangents<Backward, Tangent> with_tangents(Backward backward, Tangent tangent) {
  return {std::move(backward), std::move(tangent)};
}

// The same with what both rules read kept once: backward(state, g, n) and tangent(state, t, n).
template <class State, class Backward, class Tangent>
struct SharedTangents {
  State state;
  Backward backward;
  Tangent tangent;
  auto operator()(const TensorList& g, const Node& n) const { return backward(state, g, n); }
  auto tangents(const TensorList& t, const Node& n, std::uint64_t) const { return tangent(state, t, n); }
};

template <class State, class Backward, class Tangent>
SharedTangents<State, Backward, Tangent> with_tangents(State state, Backward backward, Tangent tangent) {
  return {std::move(state), std::move(backward), std::move(tangent)};
}

template <class Backward>
struct Symmetric {
  Backward backward;
  auto operator()(const TensorList& g, const Node& n) const { return backward(g, n); }
  auto tangents(const TensorList& t, const Node& n, std::uint64_t) const { return backward(t, n); }
};

template <class Backward>
Symmetric<Backward> symmetric(Backward backward) {
  return {std::move(backward)};
}

// t broadcast to the output's shape (the tangent of an input that broadcast into it).
inline Tensor to_output(const Tensor& t, const Node& n) {
  const Shape& shape = n.output_meta[0].shape;
  return t.shape() == shape ? t : add(zeros(shape, t.dtype()), t);
}

// a + b over the tangents that are defined (each broadcast to the output), zeros when none is.
inline Tensor tangent_sum(const Tensor& a, const Tensor& b, const Node& n) {
  if (a.defined() && b.defined()) return to_output(add(a, b), n);
  if (a.defined()) return to_output(a, n);
  if (b.defined()) return to_output(b, n);
  return zeros(n.output_meta[0].shape, n.output_meta[0].dtype);
}

}  // namespace autograd
