#pragma once
// What the fused attention ops share (internal, not installed): the operands of the graph node,
// the backward composed of autograd ops that runs while a graph of the backward is being built
// (create_graph), and the tiled core's entry. attention.cpp (the untiled node) and
// attention_flash_node.cpp (the tiled one) both use it.
#include <string_view>

#include "autograd/attention.hpp"
#include "autograd/graph.hpp"
#include "autograd/ops.hpp"
#include "autograd/tensor.hpp"
#include "kernels/attention_core.hpp"
#include "kernels/philox.hpp"

namespace autograd::sdpa {

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



// Views of one operand (B, H, L, d) laid out as the op's input: (B, H, L, d) itself, or
// (B, L, H·d) with head h in columns h·d .. (h+1)·d - 1. Each is one copy at most.
// heads: (B, H, L, d).
inline Tensor heads(const Tensor& x, std::int64_t H) {
  if (x.dim() == 4) return x;
  return transpose(reshape(x, {x.size(0), x.size(1), H, x.size(2) / H}), 1, 2);
}

// heads_t: (B, H, d, L), each head's matrix transposed.
inline Tensor heads_t(const Tensor& x, std::int64_t H) {
  if (x.dim() == 4) return transpose(x, -2, -1);
  return permute(reshape(x, {x.size(0), x.size(1), H, x.size(2) / H}), {0, 2, 3, 1});
}

// (B, H, L, d) back to the layout of `like`.
inline Tensor from_heads(const Tensor& x, const Tensor& like) {
  if (like.dim() == 4) return x;
  return reshape(transpose(x, 1, 2), {x.size(0), x.size(2), x.size(1) * x.size(3)});
}

// (B, H, d, L) back to the layout of `like` (transposing each head's matrix).
inline Tensor from_heads_t(const Tensor& x, const Tensor& like) {
  if (like.dim() == 4) return transpose(x, -2, -1);
  return reshape(permute(x, {0, 3, 1, 2}), {x.size(0), x.size(3), x.size(1) * x.size(2)});
}

// What the composed backward reads, every tensor connected to the graph: q, k, v (laid out as the
// op's inputs; packed: the three column blocks of qkv), the weights P (the node's own output, so
// that their derivative runs through this node again), the dropout factors Z (constants, or
// undefined), and the gradients that reached the output and the weights (undefined: zero).
struct ComposedInputs {
  Tensor q, k, v, p, z, dout, dweights;
};

// Which gradients the composed backward is to form: dV, and dQ with dK.
struct ComposedWants {
  bool dv = false, dqk = false;
};

// in.q, in.k, in.v from the node's saved operands: q, k and v, or (k undefined: packed) the three
// column blocks of the qkv tensor q, each qk_cols wide; and which gradients the node's inputs
// (q, k, v, or the one qkv) ask for.
inline ComposedWants take_operands(ComposedInputs& in, const Tensor& q, const Tensor& k, const Tensor& v,
                                   std::int64_t qk_cols, const Node& node) {
  if (!k.defined()) {  // one split: one node, whose gradient is one cat
    const TensorList blocks = split(q, qk_cols, 2);
    in.q = blocks[0];
    in.k = blocks[1];
    in.v = blocks[2];
    return {node.needs_input_grad(0), node.needs_input_grad(0)};
  }
  in.q = q;
  in.k = k;
  in.v = v;
  return {node.needs_input_grad(2), node.needs_input_grad(0) || node.needs_input_grad(1)};
}

struct ComposedGrads {
  Tensor dq, dk, dv, dscores;  // in the layouts of q, k, v; dscores (B, H, T, S)
};

// The gradients of the forward written with differentiable ops, so that they can be
// differentiated again (to any order):
//   dV = (P ⊙ Z)ᵀ·dO,  dP = (dO·Vᵀ) ⊙ Z + dW,  dS = P ⊙ (dP − rowsum(dP ⊙ P)),
//   dQ = scale·dS·K,  dK = scale·dSᵀ·Q,  dM = dS.
// dV and dK are formed transposed (dVᵀ = dOᵀ·(P ⊙ Z), dKᵀ = scale·Qᵀ·dS), so that no [T, S]
// matrix is transposed. P is 0 on blocked entries and fully blocked rows (causal ones included),
// so dS is 0 there; no score is recomputed, so no -inf enters.
inline ComposedGrads composed_backward(const ComposedInputs& in, std::int64_t H, double scale, bool want_dv, bool want_ds) {
  ComposedGrads out;
  Tensor dp;  // dL/dP
  if (in.dout.defined()) {
    if (want_dv) {
      const Tensor pd = in.z.defined() ? mul(in.p, in.z) : in.p;
      out.dv = from_heads_t(matmul(heads_t(in.dout, H), pd), in.v);
    }
    if (want_ds) {
      dp = matmul(heads(in.dout, H), heads_t(in.v, H));
      if (in.z.defined()) dp = mul(dp, in.z);
    }
  } else if (want_dv) {
    // Only the weights got a gradient: dV is 0, as the kernel gives it, but part of the graph
    // (the gradient of the weights may carry one). v is finite wherever the output is.
    out.dv = mul(in.v, 0.0);
  }
  if (want_ds && in.dweights.defined()) dp = dp.defined() ? add(dp, in.dweights) : in.dweights;
  if (!dp.defined()) return out;
  out.dscores = mul(in.p, sub(dp, sum(mul(dp, in.p), -1, true)));
  out.dq = from_heads(mul(matmul(out.dscores, heads(in.k, H)), scale), in.q);
  out.dk = from_heads_t(mul(matmul(heads_t(in.q, H), out.dscores), scale), in.k);
  return out;
}

// The gradient assembly both nodes share. The kernels' buffers for the inputs that ask for a
// gradient (undefined for the others); packed: one tensor of qkv's shape, which dq, dk and dv all
// name (the layouts put each in its own columns of it).
struct KernelGrads {
  Tensor dq, dk, dv;
};

inline KernelGrads kernel_grads(const Tensor& q, const Tensor& k, const Tensor& v, bool packed, const Node& node) {
  const Dtype dtype = q.dtype();
  KernelGrads g;
  if (packed) {
    if (node.needs_input_grad(0)) g.dq = g.dk = g.dv = Tensor::empty(q.shape(), dtype);
  } else {
    if (node.needs_input_grad(0)) g.dq = Tensor::empty(q.shape(), dtype);
    if (node.needs_input_grad(1)) g.dk = Tensor::empty(k.shape(), dtype);
    if (node.needs_input_grad(2)) g.dv = Tensor::empty(v.shape(), dtype);
  }
  return g;
}

// The kernels' gradients in the order of the node's inputs (the mask's, if any, goes after).
inline GradList kernel_input_grads(const KernelGrads& g, bool packed) {
  return packed ? GradList{g.dq} : GradList{g.dq, g.dk, g.dv};
}

// The composed backward's gradients in the order of the node's inputs (the mask's, if any, goes
// after): packed, the one gradient [dq | dk | dv] (an absent part zero) when `packed_wanted`;
// otherwise dq, dk, dv for the inputs that ask for them.
inline GradList composed_input_grads(const ComposedGrads& c, const ComposedInputs& in, bool packed,
                                     bool packed_wanted, const Node& node) {
  if (!packed) return {node.needs_input_grad(0) ? c.dq : Tensor(), node.needs_input_grad(1) ? c.dk : Tensor(), c.dv};
  if (!packed_wanted) return {Tensor()};
  auto part = [](const Tensor& t, const Tensor& like) { return t.defined() ? t : zeros_like(like); };
  return {cat({part(c.dq, in.q), part(c.dk, in.k), part(c.dv, in.v)}, 2)};
}

// The dropout factors Z (0 or 1/(1-p)) of the whole (B, H, T, S), element ((b·H + h)·T + i)·S + j
// drawn from the call's stream as ag::dropout numbers it (kernels/philox.hpp), for the op `op` (which
// a shape too large to count names). attention.cpp.
Tensor dropout_factors(const Dims& d, Dtype dtype, const philox::DropoutStream& stream, std::string_view op);

// The op on the tiled core (need_weights = false; arguments checked, scale resolved; dropout
// from the call's stream, inactive for p = 0): the output, weights undefined, path Tiled.
// attention_flash_node.cpp.
SdpaResult attend_tiled(std::string_view op, const Dims& d, const Shape& out_shape, const Operands& in,
                        bool is_causal, double scale, const philox::DropoutStream& dropout);

}  // namespace autograd::sdpa
