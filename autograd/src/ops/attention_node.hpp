#pragma once
// What the fused attention ops share (internal, not installed): the operands of the graph node,
// what both nodes save, the gradient assembly and the backward op, and the tiled core's entry.
// attention.cpp (the untiled node) and attention_flash_node.cpp (the tiled one) both use it;
// attention_backward.cpp holds the backward op.
#include <cstdint>
#include <string_view>

#include "autograd/attention.hpp"
#include "autograd/graph.hpp"
#include "autograd/ops.hpp"
#include "autograd/tensor.hpp"
#include "kernels/attention_core.hpp"
#include "kernels/philox.hpp"

namespace autograd::sdpa {

// What SdpaResult::weights says when they were not asked for.
inline constexpr const char* kNoWeights = "need_weights = false: the attention weights were not formed";

// What the op reads: q, k and v, or (packed) one tensor holding all three, whose column blocks
// the layouts in sdpa::Dims pick; and the additive mask, if any.
struct Operands {
  Tensor q, k, v;  // packed: q is the qkv tensor, k and v are undefined
  Tensor mask;
  bool packed() const { return !k.defined(); }
};

// The graph node's inputs: q, k, v (packed: the one qkv tensor), then the mask if there is one.
inline GradList node_inputs(const Operands& in) {
  GradList inputs{in.q};
  if (!in.packed()) {
    inputs.push_back(in.k);
    inputs.push_back(in.v);
  }
  if (in.mask.defined()) inputs.push_back(in.mask);
  return inputs;
}

// What both graph nodes save besides their core's own tensors: the operands (packed: q is the
// qkv tensor, k and v undefined; mask undefined: none), where each slice lives, the scale and
// causality.
struct NodeSaved {
  std::string_view op;
  SavedTensor q, k, v, mask;
  Dims d;
  double scale = 1.0;
  bool causal = false;

  bool packed() const { return !k.defined(); }
  std::size_t mask_input() const { return packed() ? 1 : 3; }  // the mask's place among the node's inputs

  // The saved operands. The mask is taken when `mask_values` (the core reads it) or when it
  // requires grad (the backward op then needs it as an input, for its gradient's way back);
  // otherwise it stays undefined.
  Operands operands(const Node& node, bool mask_values) const {
    Operands in{q.get(op), packed() ? Tensor() : k.get(op), packed() ? Tensor() : v.get(op), Tensor()};
    if (mask.defined() && (mask_values || node.next_edges[mask_input()].valid())) in.mask = mask.get(op);
    return in;
  }
};

// The gradients a core's backward kernel writes, in the layouts of the node's inputs: a buffer
// for each input that asks for one (undefined for the others); packed, one tensor of qkv's shape
// that dq, dk and dv all name (the layouts put each in its own columns of it). dmask, in the
// mask's shape, is the core's to make when want_mask.
struct KernelGrads {
  Tensor dq, dk, dv, dmask;
  bool want_mask = false;
};

inline KernelGrads kernel_grads(const NodeSaved& s, const Operands& in, const Node& node) {
  const Dtype dtype = in.q.dtype();
  KernelGrads g;
  if (in.packed()) {
    if (node.needs_input_grad(0)) g.dq = g.dk = g.dv = Tensor::empty(in.q.shape(), dtype);
  } else {
    if (node.needs_input_grad(0)) g.dq = Tensor::empty(in.q.shape(), dtype);
    if (node.needs_input_grad(1)) g.dk = Tensor::empty(in.k.shape(), dtype);
    if (node.needs_input_grad(2)) g.dv = Tensor::empty(in.v.shape(), dtype);
  }
  g.want_mask = s.mask.defined() && node.needs_input_grad(s.mask_input());
  return g;
}

// Where the backward op's rule finds the weights P and the dropout factors Z: the fused core's
// saved weights and factors, or (weights undefined) P recomputed from q, k and the mask with
// differentiable ops and Z regenerated from the call's stream (the tiled core).
struct WeightsSource {
  Tensor weights, keep;
  philox::DropoutStream dropout;
};

// The node's input gradients from the kernel's buffers, in the order of the node's inputs (the
// mask's, if the op has one, last). `g` is what reached the node's outputs: the output's
// gradient, then (the fused core) the weights'. When a graph of the backward is being built
// (create_graph), the gradients are recorded as the outputs of one op, `<op>_backward`, whose
// inputs are the operands and `g`, and whose rule (attention_backward.cpp) is the op's second
// derivative written once from differentiable ops; a first-order backward records nothing.
GradList input_grads(const NodeSaved& s, const Operands& in, const TensorList& g,
                     const KernelGrads& grads, const WeightsSource& weights);

// The dropout factors Z (0 or 1/(1-p)) of the whole (B, H, T, S), element ((b·H + h)·T + i)·S + j
// drawn from the call's stream as ag::dropout numbers it (kernels/philox.hpp), for the op `op` (which
// a shape too large to count names). attention.cpp.
Tensor dropout_factors(const Dims& d, Dtype dtype, const philox::DropoutStream& stream, std::string_view op);

// The op on the tiled core (need_weights = false; arguments checked, scale resolved; dropout
// from the call's stream, inactive for p = 0): the output, weights undefined, path Tiled;
// `keyless` says whether a row with keys had no score above −inf (as sdpa::forward returns).
// attention_flash_node.cpp.
SdpaResult attend_tiled(std::string_view op, const Dims& d, const Shape& out_shape, const Operands& in,
                        bool is_causal, double scale, const philox::DropoutStream& dropout, bool& keyless);

}  // namespace autograd::sdpa
