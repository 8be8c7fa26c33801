// The tiled attention core as a graph node: the forward of attention_flash.cpp, whose backward
// runs attention_flash_backward.cpp, or, while a graph of the backward is being built
// (create_graph), the same gradients composed of autograd ops with the weights recomputed.
#include <array>
#include <limits>

#include "autograd/grad_mode.hpp"
#include "kernels/attention_flash.hpp"
#include "ops/attention_node.hpp"

namespace autograd::sdpa {

namespace {

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

// The backward rule. Saved: q, k, v (packed: the one tensor), the mask, the output and the row
// log-sum-exps (B, H, T), and the dropout stream (a key: the mask is regenerated tile by tile);
// never a (T, S) matrix.
struct FlashBackward {
  std::string_view op;
  SavedTensor q, k, v, mask, out, lse;
  bool packed = false;
  Dims d;
  double scale = 1.0;
  bool causal = false;
  philox::DropoutStream dropout;

  std::size_t mask_input() const { return packed ? 1 : 3; }

  GradList operator()(const TensorList& g, const Node& node) const {
    if (is_grad_enabled()) return composed(g, node);
    const Tensor qt = q.get(op), kt = packed ? qt : k.get(op), vt = packed ? qt : v.get(op);
    const Tensor mt = mask.defined() ? mask.get(op) : Tensor(), ot = out.get(op), lt = lse.get(op);
    const Dtype dtype = qt.dtype();
    const KernelGrads dg = kernel_grads(qt, kt, vt, packed, node);
    Tensor dmask;
    if (mt.defined() && node.needs_input_grad(mask_input())) dmask = zeros(mt.shape(), dtype);
    const MaskStrides ms = mt.defined() ? mask_strides(mt.shape()) : MaskStrides{};
    const Tensor dout = g[0].defined() ? g[0] : zeros_like(ot);
    dispatch(dtype, [&](auto zero) {
      using T = decltype(zero);
      auto ptr = [](const Tensor& t) { return t.defined() ? t.data<T>() : nullptr; };
      const FlashBackwardData<T> data{qt.data<T>(),   kt.data<T>(), vt.data<T>(), ptr(mt),   ot.data<T>(),
                                      lt.data<T>(),   dout.data<T>(), ptr(dg.dq), ptr(dg.dk), ptr(dg.dv),
                                      ptr(dmask),     dropout.active() ? &dropout : nullptr};
      flash_backward<T>(d, data, ms, static_cast<T>(scale), causal);
    });
    GradList grads = kernel_input_grads(dg, packed);
    if (mt.defined()) grads.push_back(dmask);
    return grads;
  }

  // The same gradients from differentiable ops (create_graph): P = softmax(scale·Q·Kᵀ + M) is
  // recomputed from the connected q, k and mask, materialised, so that the gradients can be
  // differentiated again (to any order); then the untiled op's composed formulas.
  GradList composed(const TensorList& g, const Node& node) const {
    const bool want_mask = mask.defined() && node.needs_input_grad(mask_input());
    const Tensor qt = q.get(op);
    ComposedInputs in{qt, Tensor(), Tensor(), Tensor(), Tensor(), g[0], Tensor()};
    const ComposedWants want =
        take_operands(in, qt, packed ? Tensor() : k.get(op), packed ? Tensor() : v.get(op), d.H * d.d_k, node);
    const bool want_dv = want.dv, want_dqk = want.dqk;
    if (!in.dout.defined()) in.dout = zeros_like(out.get(op));
    Tensor scores = mul(matmul(heads(in.q, d.H), heads_t(in.k, d.H)), scale);  // (B, H, T, S)
    if (mask.defined()) scores = add(scores, mask.get(op));
    if (causal) scores = add(scores, causal_additive(d.T, d.S, qt.dtype()));
    in.p = softmax(scores, -1);
    if (dropout.active()) in.z = dropout_factors(d, qt.dtype(), dropout, op);  // the forward's mask, regenerated
    const ComposedGrads c = composed_backward(in, d.H, scale, want_dv, want_dqk || want_mask);
    GradList grads = composed_input_grads(c, in, packed, want_dv, node);
    if (mask.defined()) grads.push_back(want_mask ? sum_to(c.dscores, mask.get(op).shape()) : Tensor());
    return grads;
  }
};

}  // namespace

SdpaResult attend_tiled(std::string_view op, const Dims& d, const Shape& out_shape, const Operands& in,
                        bool is_causal, double scale, const philox::DropoutStream& dropout) {
  count_tiled_call();
  const Dtype dtype = in.q.dtype();
  const Tensor& k = in.packed() ? in.q : in.k;
  const Tensor& v = in.packed() ? in.q : in.v;
  const MaskStrides ms = in.mask.defined() ? mask_strides(in.mask.shape()) : MaskStrides{};
  Tensor output = Tensor::empty(out_shape, dtype, op);
  Tensor lse = Tensor::empty({d.B, d.H, d.T, 2}, dtype, op);  // (lse, its low part) per row
  dispatch(dtype, [&](auto zero) {
    using T = decltype(zero);
    const T* mask = in.mask.defined() ? in.mask.data<T>() : nullptr;
    const FlashForwardData<T> data{in.q.data<T>(), k.data<T>(),      v.data<T>(),
                                   mask,           output.data<T>(), lse.data<T>(),
                                   dropout.active() ? &dropout : nullptr};
    flash_forward<T>(d, data, ms, static_cast<T>(scale), is_causal);
  });
  GradList inputs = node_inputs(in);
  const std::span<const Tensor> input_span(inputs.begin(), inputs.size());
  const SdpaPath path{SdpaCore::Tiled, {}};
  if (!needs_grad(input_span)) return {output, Tensor(), path};
  const std::array<Tensor, 1> outputs{output};
  record(op, input_span, outputs,
         FlashBackward{op, SavedTensor(in.q), SavedTensor(in.k), SavedTensor(in.v), SavedTensor(in.mask),
                       SavedTensor(output), SavedTensor(lse), in.packed(), d, scale, is_causal, dropout});
  return {output, Tensor(), path};
}

}  // namespace autograd::sdpa
