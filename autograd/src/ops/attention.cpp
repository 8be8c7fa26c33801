// Fused scaled dot-product attention: the three entry points (heads-first, heads-last, packed),
// their argument checks, the choice of core and its reason (sdpa_path: the tiled one of
// attention_flash*.cpp when the weights are not asked for and T·S is large), and the graph node
// whose backward runs the hand-derived kernels of attention_core.cpp (derived step by step in
// docs/attention_backward.md); its second derivative is the backward op's rule
// (attention_backward.cpp).
#include "autograd/attention.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include "autograd/graph.hpp"
#include "autograd/ops.hpp"
#include "kernels/attention_core.hpp"
#include "kernels/attention_flash_tiles.hpp"
#include "kernels/parallel.hpp"
#include "kernels/philox.hpp"
#include "ops/attention_node.hpp"
#include "ops/checks.hpp"

namespace autograd {

namespace sdpa {

// Dropout factors Z (0 or 1/(1-p)) of the whole (B, H, T, S), from the call's stream: element
// ((b·H + h)·T + i)·S + j as ag::dropout numbers it, so the same generator state gives the same
// mask as ag::dropout on the weights, whatever the thread count.
Tensor dropout_factors(const Dims& d, Dtype dtype, const philox::DropoutStream& stream, std::string_view op) {
  Tensor keep = Tensor::empty({d.B, d.H, d.T, d.S}, dtype, op);
  dispatch(dtype, [&](auto zero) {
    using T = decltype(zero);
    T* z = keep.data<T>();
    const T scale = static_cast<T>(stream.scale());
    parallel_for(d.slices(), d.slices() * d.T * d.S >= kParallelElementwise, [&](std::int64_t bh) {
      philox::keep_block(stream, d.H, d.T, d.S, bh / d.H, bh % d.H, 0, d.T, 0, d.S, scale, z + bh * d.T * d.S, d.S);
    });
  });
  return keep;
}

}  // namespace sdpa

namespace {

using sdpa::Operands;
using sdpa::node_inputs;

constexpr std::string_view kOp = "scaled_dot_product_attention";

// ---- argument checks ----

// q, k and v are defined, of rank `rank` (laid out as `layout`), and of one dtype.
void check_qkv(std::string_view op, const Tensor& q, const Tensor& k, const Tensor& v, std::int64_t rank,
               std::string_view layout) {
  check_defined(op, q, "q");
  check_defined(op, k, "k");
  check_defined(op, v, "v");
  check_floating(op, q, "q");
  check_floating(op, k, "k");
  check_floating(op, v, "v");
  for (const auto* t : {&q, &k, &v})
    if (t->dim() != rank)
      fail(op, "q, k and v must be {}-D {}; got q {}, k {}, v {}", rank, layout, shape_str(q.shape()),
           shape_str(k.shape()), shape_str(v.shape()));
  if (q.dtype() != k.dtype() || q.dtype() != v.dtype())
    fail(op, "dtypes differ: q {}, k {}, v {}", dtype_name(q.dtype()), dtype_name(k.dtype()), dtype_name(v.dtype()));
}

// The mask holds finite numbers and -inf only: a +inf entry makes its score +inf and the row's
// softmax NaN, and a NaN entry makes the row NaN (nn::MultiHeadAttention refuses both alike).
// One pass over the mask, in blocks whose test has no early exit (so it vectorises); the first
// bad entry is then found within its block and named by its index.
void check_mask_values(std::string_view op, const Tensor& mask) {
  dispatch(mask.dtype(), [&](auto zero) {
    using T = decltype(zero);
    constexpr T inf = std::numeric_limits<T>::infinity();
    constexpr std::int64_t kBlock = 256;
    const T* m = mask.data<T>();
    const std::int64_t n = mask.numel();
    for (std::int64_t begin = 0; begin < n; begin += kBlock) {
      const std::int64_t end = std::min(n, begin + kBlock);
      int bad = 0;  // a count, which vectorises better than a flag
      for (std::int64_t i = begin; i < end; ++i) bad += m[i] < inf ? 0 : 1;  // +inf or NaN
      if (bad == 0) continue;
      std::int64_t at = begin;
      while (m[at] < inf) ++at;
      std::vector<std::int64_t> index(mask.shape().size());
      for (std::size_t d = index.size(), rest = static_cast<std::size_t>(at); d-- > 0;) {
        const auto size = static_cast<std::size_t>(mask.shape()[d]);
        index[d] = static_cast<std::int64_t>(rest % size);
        rest /= size;
      }
      fail(op, "attn_mask of shape {} holds {} at index {}; it may hold finite numbers and -inf (blocked)",
           shape_str(mask.shape()), std::isnan(m[at]) ? "NaN" : "+inf", shape_str(index));
    }
  });
}

// An Int64 (boolean) mask is refused, saying what the ops take instead; q_dtype, when known,
// is named as the dtype the float mask must have.
void check_not_boolean(std::string_view op, const Tensor& mask, const Dtype* q_dtype) {
  if (mask.dtype() != Dtype::Int64) return;
  fail(op, "attn_mask is Int64: this op takes an additive float mask{} (a 0/1 mask converted with .to() "
           "blocks nothing; the boolean form is nn::MultiHeadAttention's)",
       q_dtype != nullptr ? fmt::format(" of q's dtype ({}; -inf blocks), e.g. masked_fill(zeros(shape), blocked, -inf)",
                                        dtype_name(*q_dtype))
                          : std::string(" (-inf blocks), e.g. masked_fill(zeros(shape), blocked, -inf)"));
}

// The mask broadcasts to (B, H, T, S) = target and has the dtype of q.
void check_mask(std::string_view op, const Tensor& mask, const Shape& target, Dtype dtype) {
  const Shape& ms = mask.shape();
  bool ok = ms.size() <= 4;
  for (std::size_t i = 0; ok && i < ms.size(); ++i) {
    const std::int64_t want = target[4 - ms.size() + i];
    ok = ms[i] == want || ms[i] == 1;
  }
  if (!ok) fail(op, "attn_mask of shape {} does not broadcast to (B, H, T, S) = {}", shape_str(ms), shape_str(target));
  check_not_boolean(op, mask, &dtype);
  if (mask.dtype() != dtype)
    fail(op, "attn_mask dtype {} differs from q's {}", dtype_name(mask.dtype()), dtype_name(dtype));
  check_mask_values(op, mask);
}

// The checks on the logical (B, H, L, d) shapes qs, ks, vs, for every entry point.
void check_logical(std::string_view op, const Shape& qs, const Shape& ks, const Shape& vs, Dtype dtype,
                   const SdpaOptions& options) {
  const Tensor& mask = options.attn_mask;
  const bool is_causal = options.is_causal;
  const double scale = options.scale, dropout_p = options.dropout_p;
  if (qs[0] != ks[0] || qs[1] != ks[1] || qs[0] != vs[0] || qs[1] != vs[1])
    fail(op, "batch and head dims differ: q {}, k {}, v {}", shape_str(qs), shape_str(ks), shape_str(vs));
  if (qs[3] != ks[3]) fail(op, "q and k head dims differ: {} and {}", shape_str(qs), shape_str(ks));
  if (ks[2] != vs[2]) fail(op, "k and v sequence lengths differ: {} and {}", shape_str(ks), shape_str(vs));
  if (is_causal && qs[2] != ks[2])
    fail(op, "is_causal needs as many queries as keys (T == S); got q {} and k {}", shape_str(qs), shape_str(ks));
  if (mask.defined()) check_mask(op, mask, {qs[0], qs[1], qs[2], ks[2]}, dtype);
  if (!std::isfinite(scale)) fail(op, "scale must be finite, got {}", scale);
  if (dtype == Dtype::Float32 && !std::isfinite(static_cast<float>(scale)))
    fail(op, "scale {} is not finite as a float32 (the tensors' dtype)", scale);
  if (!(dropout_p >= 0.0 && dropout_p <= 1.0)) fail(op, "dropout_p must be in [0, 1], got {}", dropout_p);
}

// Whether every element of t is finite (one pass that vectorises; no early exit).
bool all_finite(const Tensor& t) {
  bool ok = true;
  dispatch(t.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* x = t.data<T>();
    int bad = 0;
    for (std::int64_t i = 0, n = t.numel(); i < n; ++i) bad += std::isfinite(x[i]) ? 0 : 1;
    ok = bad == 0;
  });
  return ok;
}

// Finite q, k and v (and a mask of finite numbers and -inf, checked before) give a finite output
// unless the scaled scores overflowed the dtype: a scale finite but too large for these inputs.
// Refused, naming the scale, rather than returned as NaN. The output is one pass (T·d_v per
// slice against the T·S·d of the call); the inputs are read only when it is not finite.
// `keyless`: the kernel saw a row with no score above −inf. Without a mask only scores that
// overflowed to −inf do that (the row would come out as 0, as if every key were blocked).
void check_output_finite(std::string_view op, const Tensor& output, const Operands& in, double scale,
                         bool keyless) {
  if (all_finite(output) && !(keyless && !in.mask.defined())) return;
  for (const Tensor* t : {&in.q, &in.k, &in.v})
    if (t->defined() && !all_finite(*t)) return;  // NaN or inf in, NaN out, as in PyTorch
  fail(op, "the scaled scores overflowed {}: q, k and v are finite, but a score q·kᵀ·scale{} (scale = {}) is not, "
       "so the softmax would be NaN or a row would see no key; use smaller inputs or a smaller scale (the default "
       "is 1/sqrt(d_k))",
       dtype_name(output.dtype()), in.mask.defined() ? " + attn_mask" : "", scale);
}

// ---- the op ----

// The backward rule: the kernel's gradients (sdpa::input_grads records them as the backward
// op's outputs when a graph of the backward is built). Saved: q, k, v (packed: the one tensor),
// the mask (read only as the backward op's input), the weights P and the dropout factors Z; not
// the scores.
struct AttentionBackward {
  sdpa::NodeSaved s;
  SavedTensor weights, keep;

  GradList operator()(const TensorList& g, const Node& node) const {
    const Operands in = s.operands(node, false);
    const Tensor& qt = in.q;
    const Tensor& kt = in.packed() ? qt : in.k;
    const Tensor& vt = in.packed() ? qt : in.v;
    const Tensor pt = weights.get(s.op), zt = keep.defined() ? keep.get(s.op) : Tensor();
    const Dtype dtype = qt.dtype();
    sdpa::KernelGrads dg = sdpa::kernel_grads(s, in, node);
    Tensor dscores;  // dL/dS, summed to the mask's shape below
    if (dg.want_mask) dscores = Tensor::empty(pt.shape(), dtype);
    dispatch(dtype, [&](auto zero) {
      using T = decltype(zero);
      auto ptr = [](const Tensor& t) { return t.defined() ? t.data<T>() : nullptr; };
      const sdpa::BackwardData<T> data{qt.data<T>(), kt.data<T>(), vt.data<T>(), pt.data<T>(),
                                       ptr(zt),      ptr(g[0]),    ptr(g[1]),    ptr(dg.dq),
                                       ptr(dg.dk),   ptr(dg.dv),   ptr(dscores)};
      sdpa::backward<T>(s.d, data, static_cast<T>(s.scale), s.causal);
    });
    if (dscores.defined()) dg.dmask = sum_to(dscores, node.input_meta[s.mask_input()].shape);
    return sdpa::input_grads(s, in, g, dg, {pt, zt, {}});
  }

  // Forward mode (sdpa::tangent): the output's tangent, and the weights' when they are used.
  GradList tangents(const TensorList& t, const Node& node, std::uint64_t wanted) const {
    const Operands in = s.operands(node, false);
    const Tensor& qt = in.q;
    const Tensor& kt = in.packed() ? qt : in.k;
    const Tensor& vt = in.packed() ? qt : in.v;
    const Tensor pt = weights.get(s.op), zt = keep.defined() ? keep.get(s.op) : Tensor();
    const Tensor& dq = t[0];
    const Tensor& dk = in.packed() ? t[0] : t[1];
    const Tensor& dv = in.packed() ? t[0] : t[2];
    const Tensor dmask = s.mask.defined() && s.mask_input() < t.size() ? t[s.mask_input()] : Tensor();
    const sdpa::MaskStrides ms = dmask.defined() ? sdpa::mask_strides(dmask.shape()) : sdpa::MaskStrides{};
    const Dtype dtype = qt.dtype();
    Tensor dout = Tensor::empty(node.output_meta[0].shape, dtype, s.op);
    Tensor dweights = (wanted & 2u) != 0 ? Tensor::empty(pt.shape(), dtype, s.op) : Tensor();
    dispatch(dtype, [&](auto zero) {
      using T = decltype(zero);
      auto ptr = [](const Tensor& x) -> const T* { return x.defined() ? x.data<T>() : nullptr; };
      const sdpa::TangentData<T> data{qt.data<T>(), kt.data<T>(), vt.data<T>(), pt.data<T>(), ptr(zt),
                                      ptr(dq),      ptr(dk),      ptr(dv),      ptr(dmask),   dout.data<T>(),
                                      dweights.defined() ? dweights.data<T>() : nullptr};
      sdpa::tangent<T>(s.d, data, ms, static_cast<T>(s.scale), s.causal);
    });
    return GradList{dout, dweights};
  }
};

}  // namespace

std::string_view core_name(SdpaCore core) {
  switch (core) {
    case SdpaCore::Fused: return "fused";
    case SdpaCore::Tiled: return "tiled";
    case SdpaCore::Composed: return "composed";
  }
  return "unknown";
}

// Without weights, the tiled core takes every call (dropout included: it regenerates each tile's
// mask from the call's stream) but those too small for tiling to pay (sdpa::FlashTiles). With
// them, the untiled kernel, which forms them; at a size the tiled core would take, that is what
// the reason says.
SdpaPath sdpa_path(std::int64_t T, std::int64_t S, const SdpaOptions& options) {
  // The checks of the ops that concern these arguments, so that the rule refuses what they refuse.
  if (T < 0 || S < 0) fail("sdpa_path", "T and S must be non-negative, got T = {}, S = {}", T, S);
  if (options.is_causal && T != S)
    fail("sdpa_path", "is_causal needs as many queries as keys (T == S); got T = {}, S = {}", T, S);
  if (!std::isfinite(options.scale)) fail("sdpa_path", "scale must be finite, got {}", options.scale);
  if (!(options.dropout_p >= 0.0 && options.dropout_p <= 1.0))
    fail("sdpa_path", "dropout_p must be in [0, 1], got {}", options.dropout_p);
  if (const Tensor& mask = options.attn_mask; mask.defined()) {  // what the ops check of it without B and H
    const Shape& ms = mask.shape();
    const std::size_t r = ms.size();
    if (r > 4 || (r >= 1 && ms[r - 1] != S && ms[r - 1] != 1) || (r >= 2 && ms[r - 2] != T && ms[r - 2] != 1))
      fail("sdpa_path", "attn_mask of shape {} does not broadcast to (B, H, T, S) with T = {}, S = {}", shape_str(ms),
           T, S);
    check_not_boolean("sdpa_path", mask, nullptr);
    check_mask_values("sdpa_path", mask);
  }
  // (T·S formed without overflow: an empty slice with huge T and S does not wrap.)
  const std::int64_t min_scores = sdpa::flash_tiles().min_tiled_scores;
  const bool large = min_scores <= 0 || (T > 0 && S >= (min_scores + T - 1) / T);
  if (!large) return {SdpaCore::Fused, {}};
  if (options.need_weights) return {SdpaCore::Fused, "need_weights"};
  return {SdpaCore::Tiled, {}};
}

namespace {

// Every entry point, once the arguments are checked: d says where each slice lives, out_shape is
// the output's shape (its layout is d.out).
SdpaResult attend(std::string_view op, const sdpa::Dims& d, const Shape& out_shape, const Operands& in,
                  const SdpaOptions& options) {
  const bool is_causal = options.is_causal, need_weights = options.need_weights;
  const double dropout_p = options.dropout_p;
  // scale 0 means 1/sqrt(d_k); with d_k = 0 every product is 0 and the scale does not matter.
  double scale = options.scale;
  if (scale == 0.0) scale = d.d_k > 0 ? 1.0 / std::sqrt(static_cast<double>(d.d_k)) : 1.0;
  // The call's one draw: the dropout mask is a function of this seed (kernels/philox.hpp).
  philox::DropoutStream stream;
  if (dropout_p > 0.0) {
    Generator& gen = options.generator != nullptr ? *options.generator : default_generator();
    stream = philox::DropoutStream(gen.next_u64(), dropout_p);
  }
  const SdpaPath path = sdpa_path(d.T, d.S, options);
  if (path.core == SdpaCore::Tiled) {
    bool keyless = false;
    SdpaResult r = sdpa::attend_tiled(op, d, out_shape, in, is_causal, scale, stream, keyless);
    check_output_finite(op, r.output, in, scale, keyless);
    return r;
  }
  const Dtype dtype = in.q.dtype();
  const Tensor& k = in.packed() ? in.q : in.k;
  const Tensor& v = in.packed() ? in.q : in.v;
  const sdpa::MaskStrides ms = in.mask.defined() ? sdpa::mask_strides(in.mask.shape()) : sdpa::MaskStrides{};
  // (The sizes were checked one by one; the op names itself when they multiply past a count.)
  const Tensor keep = dropout_p > 0.0 ? sdpa::dropout_factors(d, dtype, stream, op) : Tensor();

  Tensor output = Tensor::empty(out_shape, dtype, op);
  Tensor weights = Tensor::empty({d.B, d.H, d.T, d.S}, dtype, op);
  bool keyless = false;
  dispatch(dtype, [&](auto zero) {
    using T = decltype(zero);
    auto ptr = [](const Tensor& t) -> const T* { return t.defined() ? t.data<T>() : nullptr; };
    const sdpa::ForwardData<T> data{in.q.data<T>(),  k.data<T>(),       v.data<T>(),     ptr(in.mask),
                                    ptr(keep),       weights.data<T>(), output.data<T>()};
    keyless = sdpa::forward<T>(d, data, ms, static_cast<T>(scale), is_causal);
  });
  check_output_finite(op, output, in, scale, keyless);

  GradList inputs = node_inputs(in);
  const std::span<const Tensor> input_span(inputs.begin(), inputs.size());
  if (!needs_grad(input_span)) return {output, need_weights ? weights : Tensor::undefined(sdpa::kNoWeights), path};
  const std::array<Tensor, 2> outputs{output, weights};
  record(op, input_span, outputs,
         AttentionBackward{{op, SavedTensor(in.q), SavedTensor(in.k), SavedTensor(in.v), SavedTensor(in.mask), d, scale,
                            is_causal},
                           SavedTensor(weights), SavedTensor(keep)});
  // An output nobody used (usually `weights`) reaches the rule undefined, read as zero: no
  // [B, H, T, S] tensor of zeros is made and added.
  output.grad_fn()->materialize_grads = false;
  return {output, need_weights ? weights : Tensor::undefined(sdpa::kNoWeights), path};
}

}  // namespace

SdpaResult scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const SdpaOptions& options) {
  check_qkv(kOp, q, k, v, 4, "(B, H, seq, head_dim)");
  check_logical(kOp, q.shape(), k.shape(), v.shape(), q.dtype(), options);
  const std::int64_t B = q.size(0), H = q.size(1), T = q.size(2), S = k.size(2), d_k = q.size(3), d_v = v.size(3);
  const sdpa::Dims d{B, H, T, S, d_k, d_v, sdpa::heads_first(H, T, d_k), sdpa::heads_first(H, S, d_k),
                     sdpa::heads_first(H, S, d_v), sdpa::heads_first(H, T, d_v)};
  return attend(kOp, d, {B, H, T, d_v}, {q, k, v, options.attn_mask}, options);
}

SdpaResult scaled_dot_product_attention_heads_last(const Tensor& q, const Tensor& k, const Tensor& v,
                                                   std::int64_t num_heads, const SdpaOptions& options) {
  constexpr std::string_view op = "scaled_dot_product_attention_heads_last";
  check_qkv(op, q, k, v, 3, "(B, seq, heads * head_dim)");
  const std::int64_t H = num_heads;
  if (H <= 0) fail(op, "num_heads must be positive, got {}", H);
  for (const auto* t : {&q, &k, &v})
    if (t->size(2) % H != 0)
      fail(op, "the last dims of q {}, k {}, v {} must be divisible by num_heads = {}", shape_str(q.shape()),
           shape_str(k.shape()), shape_str(v.shape()), H);
  const std::int64_t B = q.size(0), T = q.size(1), S = k.size(1), d_k = q.size(2) / H, d_v = v.size(2) / H;
  // The same checks as the (B, H, L, d) op, on the shapes the heads-last tensors stand for.
  check_logical(op, {B, H, T, d_k}, {k.size(0), H, S, k.size(2) / H}, {v.size(0), H, v.size(1), d_v}, q.dtype(),
                options);
  const sdpa::Dims d{B, H, T, S, d_k, d_v, sdpa::heads_last(H, T, d_k), sdpa::heads_last(H, S, d_k),
                     sdpa::heads_last(H, S, d_v), sdpa::heads_last(H, T, d_v)};
  return attend(op, d, {B, T, H * d_v}, {q, k, v, options.attn_mask}, options);
}

SdpaResult scaled_dot_product_attention_packed(const Tensor& qkv, std::int64_t num_heads,
                                               const SdpaOptions& options) {
  constexpr std::string_view op = "scaled_dot_product_attention_packed";
  check_defined(op, qkv, "qkv");
  check_floating(op, qkv, "qkv");
  if (qkv.dim() != 3) fail(op, "qkv must be 3-D (B, seq, 3 * heads * head_dim); got {}", shape_str(qkv.shape()));
  const std::int64_t H = num_heads;
  if (H <= 0) fail(op, "num_heads must be positive, got {}", H);
  if (H > qkv.size(2) / 3)
    fail(op, "the last dim of qkv {} must be divisible by 3 * num_heads, with num_heads = {}", shape_str(qkv.shape()), H);
  if (qkv.size(2) % (3 * H) != 0)
    fail(op, "the last dim of qkv {} must be divisible by 3 * num_heads = {}", shape_str(qkv.shape()), 3 * H);
  const std::int64_t B = qkv.size(0), T = qkv.size(1), dh = qkv.size(2) / (3 * H);
  check_logical(op, {B, H, T, dh}, {B, H, T, dh}, {B, H, T, dh}, qkv.dtype(), options);
  const sdpa::Dims d{B, H, T, T, dh, dh, sdpa::packed(H, T, dh, 0), sdpa::packed(H, T, dh, 1),
                     sdpa::packed(H, T, dh, 2), sdpa::heads_last(H, T, dh)};
  return attend(op, d, {B, T, H * dh}, {qkv, Tensor(), Tensor(), options.attn_mask}, options);
}

}  // namespace autograd
