// The tiled attention core as a graph node: the forward of attention_flash.cpp, whose backward
// runs attention_flash_backward.cpp; its second derivative is the backward op's rule
// (attention_backward.cpp), which recomputes the weights from differentiable ops.
#include <array>
#include <limits>

#include "kernels/attention_flash.hpp"
#include "ops/attention_node.hpp"

namespace autograd::sdpa {

namespace {

// The backward rule: the kernel's gradients (input_grads records them as the backward op's
// outputs when a graph of the backward is built). Saved: q, k, v (packed: the one tensor), the
// mask, the output and the row log-sum-exps (B, H, T), and the dropout stream (a key: the mask
// is regenerated tile by tile); never a (T, S) matrix.
struct FlashBackward {
  NodeSaved s;
  SavedTensor out, lse;
  philox::DropoutStream dropout;

  GradList operator()(const TensorList& g, const Node& node) const {
    const Operands in = s.operands(node, true);
    const Tensor& qt = in.q;
    const Tensor& kt = in.packed() ? qt : in.k;
    const Tensor& vt = in.packed() ? qt : in.v;
    const Tensor& mt = in.mask;
    const Tensor ot = out.get(s.op), lt = lse.get(s.op);
    const Dtype dtype = qt.dtype();
    KernelGrads dg = kernel_grads(s, in, node);
    if (dg.want_mask) dg.dmask = zeros(mt.shape(), dtype);
    const MaskStrides ms = mt.defined() ? mask_strides(mt.shape()) : MaskStrides{};
    const Tensor dout = g[0].defined() ? g[0] : zeros_like(ot);
    dispatch(dtype, [&](auto zero) {
      using T = decltype(zero);
      auto ptr = [](const Tensor& t) { return t.defined() ? t.data<T>() : nullptr; };
      const FlashBackwardData<T> data{qt.data<T>(),   kt.data<T>(),   vt.data<T>(), ptr(mt),    ot.data<T>(),
                                      lt.data<T>(),   dout.data<T>(), ptr(dg.dq),   ptr(dg.dk), ptr(dg.dv),
                                      ptr(dg.dmask),  dropout.active() ? &dropout : nullptr};
      flash_backward<T>(s.d, data, ms, static_cast<T>(s.scale), s.causal);
    });
    return input_grads(s, in, g, dg, {Tensor(), Tensor(), dropout});
  }
};

}  // namespace

SdpaResult attend_tiled(std::string_view op, const Dims& d, const Shape& out_shape, const Operands& in,
                        bool is_causal, double scale, const philox::DropoutStream& dropout, bool& keyless) {
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
    // a row with keys but no score above −inf has lse = +inf (its output 0)
    const T* l = lse.data<T>();
    keyless = false;
    for (std::int64_t i = 0, rows = d.S > 0 ? d.slices() * d.T : 0; i < rows && !keyless; ++i)
      keyless = l[2 * i] == std::numeric_limits<T>::infinity();
  });
  GradList inputs = node_inputs(in);
  const std::span<const Tensor> input_span(inputs.begin(), inputs.size());
  const SdpaPath path{SdpaCore::Tiled, {}};
  if (!needs_grad(input_span)) return {output, Tensor::undefined(kNoWeights), path};
  const std::array<Tensor, 1> outputs{output};
  record(op, input_span, outputs,
         FlashBackward{{op, SavedTensor(in.q), SavedTensor(in.k), SavedTensor(in.v), SavedTensor(in.mask), d, scale,
                        is_causal},
                       SavedTensor(output), SavedTensor(lse), dropout});
  return {output, Tensor::undefined(kNoWeights), path};
}

}  // namespace autograd::sdpa
