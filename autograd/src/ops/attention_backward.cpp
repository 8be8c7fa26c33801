// The backward op of the fused attention cores, scaled_dot_product_attention_backward (as in
// PyTorch), which both graph nodes (attention.cpp, attention_flash_node.cpp) share. Its forward
// is the core's hand-derived backward kernel, run by the node; when a graph of the backward is
// being built (create_graph) the node records the kernel's gradients as the outputs of this op,
// whose rule, the second derivative, is written here once from differentiable ops. That rule is
// itself differentiable, so the op is differentiable to any order.
#include <array>
#include <cstdint>
#include <limits>
#include <span>
#include <string>

#include "ops/attention_node.hpp"

namespace autograd::sdpa {

namespace {

// ---- (B, H, L, d) views of the op's layouts, each one copy at most ----

// heads: (B, H, L, d) from (B, H, L, d) itself, or from (B, L, H·d) with head h in columns
// h·d .. (h+1)·d - 1.
Tensor heads(const Tensor& x, std::int64_t H) {
  if (x.dim() == 4) return x;
  return transpose(reshape(x, {x.size(0), x.size(1), H, x.size(2) / H}), 1, 2);
}

// heads_t: (B, H, d, L), each head's matrix transposed.
Tensor heads_t(const Tensor& x, std::int64_t H) {
  if (x.dim() == 4) return transpose(x, -2, -1);
  return permute(reshape(x, {x.size(0), x.size(1), H, x.size(2) / H}), {0, 2, 3, 1});
}

// (B, H, L, d) back to the layout of `like`.
Tensor from_heads(const Tensor& x, const Tensor& like) {
  if (like.dim() == 4) return x;
  return reshape(transpose(x, 1, 2), {x.size(0), x.size(2), x.size(1) * x.size(3)});
}

// (B, H, d, L) back to the layout of `like` (transposing each head's matrix).
Tensor from_heads_t(const Tensor& x, const Tensor& like) {
  if (like.dim() == 4) return transpose(x, -2, -1);
  return reshape(permute(x, {0, 3, 1, 2}), {x.size(0), x.size(3), x.size(1) * x.size(2)});
}

// ---- helpers in which an undefined tensor stands for zero ----

// a + b (both undefined: undefined).
Tensor plus(const Tensor& a, const Tensor& b) {
  if (!a.defined()) return b;
  if (!b.defined()) return a;
  return add(a, b);
}

// x ⊙ Z, or x without dropout (Z undefined).
Tensor dropped(const Tensor& x, const Tensor& z) { return z.defined() ? mul(x, z) : x; }

// X pulled back through the row softmax that gave P: P ⊙ (X − rowsum(X ⊙ P)). It is 0 wherever
// P is (blocked entries, fully blocked rows).
Tensor through_softmax(const Tensor& p, const Tensor& x) { return mul(p, sub(x, sum(mul(x, p), -1, true))); }

// (T, S) additive mask of the causal constraint: 0 on and below the diagonal, -inf above.
Tensor causal_additive(std::int64_t T, std::int64_t S, Dtype dtype) {
  Tensor m = Tensor::empty({T, S}, dtype);
  dispatch(dtype, [&](auto zero) {
    using U = decltype(zero);
    U* p = m.data<U>();
    for (std::int64_t i = 0; i < T; ++i)
      for (std::int64_t j = 0; j < S; ++j) p[i * S + j] = j > i ? -std::numeric_limits<U>::infinity() : U(0);
  });
  return m;
}

// The backward op's inputs, in this order; an absent one (packed: k and v; no mask, or one that
// needs no gradient in the fused core; no gradient reached an output) is undefined.
enum Input : std::size_t { kQ, kK, kV, kMask, kDout, kDweights, kInputs };

// The backward op's rule. Per slice, with s the scale, φ(X) = P ⊙ (X − rowsum(X ⊙ P)) the pull
// back through the softmax, and dO, dW the gradients that reached the output and the weights,
// the op computes the first derivatives
//   dP = (dO·Vᵀ) ⊙ Z + dW,  dS = φ(dP),  dQ = s·dS·K,  dK = s·dSᵀ·Q,  dV = (P ⊙ Z)ᵀ·dO,
//   dM = dS summed to the mask's shape.
// Given gQ, gK, gV, gM, the gradients that reached dQ, dK, dV and dM, its rule is their
// derivative:
//   G_S   = s·gQ·Kᵀ + s·Q·gKᵀ + gM                      (what reached dS)
//   G_dP  = φ(G_S)                                      (what reached dP: d/d(dW))
//   G_P   = G_S ⊙ (dP − rowsum(dP ⊙ P)) − rowsum(G_S ⊙ P) ⊙ dP + Z ⊙ (dO·gVᵀ)
//                                                        (what reached P through dS and dV)
//   G_sc  = φ(G_P)                                      (what reached the scores through P)
//   d/dQ  = s·(dS·gK + G_sc·K),   d/dK = s·(dSᵀ·gQ + G_scᵀ·Q),   d/dM = G_sc summed to M's shape,
//   d/dV  = (G_dP ⊙ Z)ᵀ·dO,       d/d(dO) = (G_dP ⊙ Z)·V + (P ⊙ Z)·gV,   d/d(dW) = G_dP.
// (P depends on Q, K and M through the scores: G_sc carries that part.) dK, dV and their kind
// are formed transposed, (B, H, d, S), so that no (T, S) matrix is transposed. P is 0 on blocked
// entries and fully blocked rows, so φ of anything is 0 there and no -inf enters.
struct SecondOrder {
  std::string_view op;  // the forward op's name, for the saved tensors' messages
  SavedTensor q, k, v, mask, dout, dweights;  // the inputs (as Input orders them)
  SavedTensor weights, keep;                  // the fused core's P and Z; undefined: recomputed
  philox::DropoutStream dropout;              // the tiled core's stream
  Dims d;
  double scale = 1.0;
  bool causal = false;
  // Which of the node's input gradients (q, k, v, mask; packed: qkv, mask) are this op's
  // outputs, bit i for position i: the undefined ones are not.
  unsigned outputs = 0;

  TensorList operator()(const TensorList& g, const Node& n) const {
    const bool packed = !k.defined();
    const std::int64_t H = d.H;
    // The operands, laid out as the op's inputs (packed: the three column blocks of qkv), and the
    // gradients that reached the outputs (undefined: zero) in the same layouts.
    Tensor Q = q.get(op), K, V, gQ, gK, gV, gM;
    const Tensor qkv = Q;
    std::size_t next = 0;
    auto reached = [&](unsigned position) { return (outputs >> position & 1u) != 0 ? g[next++] : Tensor(); };
    if (packed) {
      const TensorList blocks = split(qkv, H * d.d_k, 2);
      Q = blocks[0], K = blocks[1], V = blocks[2];
      if (const Tensor gqkv = reached(0); gqkv.defined()) {
        const TensorList gb = split(gqkv, H * d.d_k, 2);
        gQ = gb[0], gK = gb[1], gV = gb[2];
      }
      gM = reached(1);
    } else {
      K = k.get(op), V = v.get(op);
      gQ = reached(0), gK = reached(1), gV = reached(2), gM = reached(3);
    }
    const Tensor M = mask.defined() ? mask.get(op) : Tensor();
    const Tensor dO = dout.defined() ? dout.get(op) : Tensor();
    const Tensor dW = dweights.defined() ? dweights.get(op) : Tensor();
    const Tensor P = weights.defined() ? weights.get(op) : recomputed_weights(Q, K, M);
    const Tensor Z = keep.defined()     ? keep.get(op)
                     : dropout.active() ? dropout_factors(d, Q.dtype(), dropout, op)
                                        : Tensor();

    const bool want_q = n.needs_input_grad(kQ), want_k = packed ? want_q : n.needs_input_grad(kK),
               want_v = packed ? want_q : n.needs_input_grad(kV), want_m = n.needs_input_grad(kMask),
               want_dout = n.needs_input_grad(kDout), want_dw = n.needs_input_grad(kDweights);
    const Tensor Kh = heads(K, H), dOh = dO.defined() ? heads(dO, H) : Tensor();

    // The first-order dP and the cotangents above, each undefined where it is zero.
    Tensor dP = dW;
    if (dO.defined()) dP = plus(dropped(matmul(dOh, heads_t(V, H)), Z), dP);
    Tensor gS;
    if (gQ.defined()) gS = mul(matmul(heads(gQ, H), heads_t(K, H)), scale);
    if (gK.defined()) gS = plus(gS, mul(matmul(heads(Q, H), heads_t(gK, H)), scale));
    gS = plus(gS, gM);
    const Tensor gdP = gS.defined() && (want_v || want_dout || want_dw) ? through_softmax(P, gS) : Tensor();
    Tensor gScores;
    if (want_q || want_k || want_m) {
      Tensor gP;
      if (gS.defined() && dP.defined())
        gP = sub(mul(gS, sub(dP, sum(mul(dP, P), -1, true))), mul(sum(mul(gS, P), -1, true), dP));
      if (gV.defined() && dO.defined()) gP = plus(gP, dropped(matmul(dOh, heads_t(gV, H)), Z));
      if (gP.defined()) gScores = through_softmax(P, gP);
    }
    const Tensor dS = (want_q || want_k) && dP.defined() && (gQ.defined() || gK.defined()) ? through_softmax(P, dP)
                                                                                           : Tensor();

    Tensor dq, dk, dv;
    if (want_q) {
      Tensor t;
      if (dS.defined() && gK.defined()) t = matmul(dS, heads(gK, H));
      if (gScores.defined()) t = plus(t, matmul(gScores, Kh));
      if (t.defined()) dq = from_heads(mul(t, scale), Q);
    }
    if (want_k) {  // transposed: s·(gQᵀ·dS + Qᵀ·G_sc)
      Tensor t;
      if (dS.defined() && gQ.defined()) t = matmul(heads_t(gQ, H), dS);
      if (gScores.defined()) t = plus(t, matmul(heads_t(Q, H), gScores));
      if (t.defined()) dk = from_heads_t(mul(t, scale), K);
    }
    if (want_v && gdP.defined() && dO.defined()) dv = from_heads_t(matmul(heads_t(dO, H), dropped(gdP, Z)), V);

    TensorList grads(kInputs);
    if (packed) {
      auto part = [](const Tensor& t, const Tensor& like) { return t.defined() ? t : zeros_like(like); };
      if (dq.defined() || dk.defined() || dv.defined()) grads[kQ] = cat({part(dq, Q), part(dk, K), part(dv, V)}, 2);
    } else {
      grads[kQ] = dq, grads[kK] = dk, grads[kV] = dv;
    }
    if (want_m && gScores.defined()) grads[kMask] = sum_to(gScores, n.input_meta[kMask].shape);
    if (want_dout) {
      Tensor t;
      if (gdP.defined()) t = matmul(dropped(gdP, Z), heads(V, H));
      if (gV.defined()) t = plus(t, matmul(dropped(P, Z), heads(gV, H)));
      if (t.defined()) grads[kDout] = from_heads(t, dO);
    }
    if (want_dw) grads[kDweights] = gdP;
    return grads;
  }

  // P = softmax(s·Q·Kᵀ + M) (causal: -inf above the diagonal), from differentiable ops: the
  // tiled core keeps no weights.
  Tensor recomputed_weights(const Tensor& Q, const Tensor& K, const Tensor& M) const {
    Tensor scores = mul(matmul(heads(Q, d.H), heads_t(K, d.H)), scale);  // (B, H, T, S)
    if (M.defined()) scores = add(scores, M);
    if (causal) scores = add(scores, causal_additive(d.T, d.S, Q.dtype()));
    return softmax(scores, -1);
  }
};

}  // namespace

GradList input_grads(const NodeSaved& s, const Operands& in, const TensorList& g,
                     const KernelGrads& kg, const WeightsSource& w) {
  GradList grads = in.packed() ? GradList{kg.dq} : GradList{kg.dq, kg.dk, kg.dv};
  if (s.mask.defined()) grads.push_back(kg.dmask);
  const Tensor dout = g[0], dweights = g.size() > 1 ? g[1] : Tensor();
  const std::array<Tensor, kInputs> inputs{in.q, in.k, in.v, in.mask, dout, dweights};
  if (!needs_grad(std::span<const Tensor>(inputs))) return grads;  // first order: nothing to record
  std::array<Tensor, 4> outputs;
  std::size_t count = 0;
  unsigned which = 0;
  for (std::size_t i = 0; i < grads.size(); ++i)
    if (grads[i].defined()) {
      outputs[count++] = grads[i];
      which |= 1u << i;
    }
  if (count == 0) return grads;
  auto saved = [](const Tensor& t) { return SavedTensor(t); };
  record(std::string(s.op) + "_backward", std::span<const Tensor>(inputs),
         std::span<const Tensor>(outputs.data(), count),
         SecondOrder{s.op, saved(in.q), saved(in.k), saved(in.v), saved(in.mask), saved(dout), saved(dweights),
                     saved(w.weights), saved(w.keep), w.dropout, s.d, s.scale, s.causal, which});
  // A gradient nobody differentiates reaches the rule undefined, read as zero.
  outputs[0].grad_fn()->materialize_grads = false;
  return grads;
}

}  // namespace autograd::sdpa
