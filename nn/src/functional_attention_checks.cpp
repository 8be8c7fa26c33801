// The argument checks of multi_head_attention_forward, and its masks, built from autograd ops.
#include <cmath>
#include <limits>
#include <optional>

#include "functional_attention_detail.hpp"

namespace nn::functional::detail {

namespace {

constexpr std::string_view kOp = "MultiHeadAttention";
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// `name` is defined (or, if optional, undefined) and of shape `want`, in W_Q's dtype.
void check_weight(std::string_view name, const ag::Tensor& t, const ag::Shape& want, std::string_view meaning,
                  ag::Dtype dtype, bool optional) {
  if (!t.defined()) {
    if (optional) return;
    ag::fail(kOp, "weight {} is undefined", name);
  }
  if (t.shape() != want)
    ag::fail(kOp, "weight {} of shape {} should be {} = {}", name, ag::shape_str(t.shape()), meaning,
             ag::shape_str(want));
  if (t.dtype() != dtype)
    ag::fail(kOp, "weight {} dtype {} differs from W_Q's {}", name, ag::dtype_name(t.dtype()), ag::dtype_name(dtype));
}

// The weights fit together (W_Q square, E divisible by num_heads, every other shape from E) and
// the config is sound; returns E.
std::int64_t check_weights(const MultiHeadAttentionWeights& w, const MultiHeadAttentionConfig& c) {
  if (!w.W_Q.defined() || w.W_Q.dim() != 2 || w.W_Q.size(0) != w.W_Q.size(1))
    ag::fail(kOp, "weight W_Q must be a square (embed_dim, embed_dim) matrix, got {}",
             w.W_Q.defined() ? ag::shape_str(w.W_Q.shape()) : "an undefined tensor");
  const std::int64_t E = w.W_Q.size(0), H = c.num_heads;
  if (E <= 0 || H <= 0) ag::fail(kOp, "embed_dim and num_heads must be positive, got {} and {}", E, H);
  if (E % H != 0) ag::fail(kOp, "embed_dim {} is not divisible by num_heads {}", E, H);
  const ag::Dtype dtype = w.W_Q.dtype();
  const std::int64_t kdim = w.W_K.defined() && w.W_K.dim() == 2 ? w.W_K.size(0) : 0;
  const std::int64_t vdim = w.W_V.defined() && w.W_V.dim() == 2 ? w.W_V.size(0) : 0;
  check_weight("W_K", w.W_K, {kdim, E}, "(kdim, embed_dim)", dtype, false);
  check_weight("W_V", w.W_V, {vdim, E}, "(vdim, embed_dim)", dtype, false);
  check_weight("W_O", w.W_O, {E, E}, "(embed_dim, embed_dim)", dtype, false);
  check_weight("b_Q", w.b_Q, {E}, "(embed_dim)", dtype, true);
  check_weight("b_K", w.b_K, {E}, "(embed_dim)", dtype, true);
  check_weight("b_V", w.b_V, {E}, "(embed_dim)", dtype, true);
  check_weight("b_O", w.b_O, {E}, "(embed_dim)", dtype, true);
  if (w.bias_k.defined() != w.bias_v.defined()) ag::fail(kOp, "bias_k and bias_v must be given together");
  check_weight("bias_k", w.bias_k, {E}, "(embed_dim)", dtype, true);
  check_weight("bias_v", w.bias_v, {E}, "(embed_dim)", dtype, true);
  if (!(c.dropout_p >= 0.0 && c.dropout_p < 1.0)) ag::fail(kOp, "dropout must be in [0, 1), got {}", c.dropout_p);
  return E;
}

// query, key and value are defined, of W_Q's dtype, all batched or all unbatched, of the widths
// the weights take and of one batch size; key and value have one length. Returns the sizes.
Geometry check_inputs(const ag::Tensor& query, const ag::Tensor& key, const ag::Tensor& value,
                      const MultiHeadAttentionWeights& w, std::int64_t E) {
  if (!query.defined() || !key.defined() || !value.defined())
    ag::fail(kOp, "query, key and value must all be defined");
  const ag::Dtype dtype = w.W_Q.dtype();
  for (const auto* t : {&query, &key, &value})
    if (t->dtype() != dtype)
      ag::fail(kOp, "input dtype {} differs from the parameters' {} (convert with .to())", ag::dtype_name(t->dtype()),
               ag::dtype_name(dtype));
  const bool batched = query.dim() == 3;
  if ((query.dim() != 2 && query.dim() != 3) || key.dim() != query.dim() || value.dim() != query.dim())
    ag::fail(kOp, "query, key and value must be all batched (3-D) or all unbatched (2-D), got {}, {} and {}",
             ag::shape_str(query.shape()), ag::shape_str(key.shape()), ag::shape_str(value.shape()));
  if (query.size(-1) != E)
    ag::fail(kOp, "query of shape {} should end in embed_dim = {}", ag::shape_str(query.shape()), E);
  if (key.size(-1) != w.W_K.size(0))
    ag::fail(kOp, "key of shape {} should end in kdim = {}", ag::shape_str(key.shape()), w.W_K.size(0));
  if (value.size(-1) != w.W_V.size(0))
    ag::fail(kOp, "value of shape {} should end in vdim = {}", ag::shape_str(value.shape()), w.W_V.size(0));
  if (batched && (key.size(0) != query.size(0) || value.size(0) != query.size(0)))
    ag::fail(kOp, "batch sizes differ: query {}, key {}, value {}", ag::shape_str(query.shape()),
             ag::shape_str(key.shape()), ag::shape_str(value.shape()));
  if (key.size(-2) != value.size(-2))
    ag::fail(kOp, "key {} and value {} have different sequence lengths", ag::shape_str(key.shape()),
             ag::shape_str(value.shape()));
  Geometry g;
  g.batched = batched;
  g.B = batched ? query.size(0) : 1;
  g.T = query.size(-2);
  g.S = key.size(-2);
  g.E = E;
  return g;
}

// The masks' shapes fit the inputs, and their values are what a mask may hold: no NaN, and no
// +inf in attn_mask (its sum with a score would be +inf, its softmax NaN).
void check_masks(const AttentionOptions& o, const Geometry& g, const ag::Tensor& query, const ag::Tensor& key) {
  const std::int64_t B = g.B, H = g.H, T = g.T, S = g.S;
  if (o.is_causal && T != S)
    ag::fail(kOp, "is_causal needs as many queries as keys, got T = {} (query {}) and S = {} (key {})", T,
             ag::shape_str(query.shape()), S, ag::shape_str(key.shape()));
  ag::NoGradGuard no_grad;
  if (o.key_padding_mask.defined()) {
    const ag::Shape want = g.batched ? ag::Shape{B, S} : ag::Shape{S};
    if (o.key_padding_mask.shape() != want)
      ag::fail(kOp, "key_padding_mask of shape {} does not match the keys {}: expected {}",
               ag::shape_str(o.key_padding_mask.shape()), ag::shape_str(key.shape()), ag::shape_str(want));
    if (o.key_padding_mask.numel() > 0 && std::isnan(ag::max(o.key_padding_mask.detach()).item()))
      ag::fail(kOp, "key_padding_mask of shape {} holds NaN (nonzero entries mark padding keys)",
               ag::shape_str(o.key_padding_mask.shape()));
  }
  if (o.attn_mask.defined()) {
    const ag::Shape m = o.attn_mask.shape(), per_head = {B * H, T, S};
    if (m != ag::Shape{T, S} && m != per_head)
      ag::fail(kOp, "attn_mask of shape {} fits neither (T, S) = {} nor ({}, T, S) = {} for query {} and key {}",
               ag::shape_str(m), ag::shape_str({T, S}), g.batched ? "B * num_heads" : "num_heads",
               ag::shape_str(per_head), ag::shape_str(query.shape()), ag::shape_str(key.shape()));
    const double top = o.attn_mask.numel() > 0 ? ag::max(o.attn_mask.detach()).item() : 0.0;
    if (std::isnan(top) || top == std::numeric_limits<double>::infinity())
      ag::fail(kOp, "attn_mask of shape {} holds {}; it may hold finite numbers and -inf (blocked)", ag::shape_str(m),
               std::isnan(top) ? "NaN" : "+inf");
  }
}

// (T, S): -inf where key j comes after query i (j > i), else 0.
ag::Tensor causal_mask(std::int64_t T, std::int64_t S, ag::Dtype dtype) {
  const ag::Tensor i = ag::reshape(ag::arange(static_cast<double>(T), dtype), {T, 1});
  const ag::Tensor j = ag::reshape(ag::arange(static_cast<double>(S), dtype), {1, S});
  const ag::Tensor after = ag::relu(j - i);  // j - i where j > i, else 0: nonzero exactly for the later keys
  return ag::masked_fill(ag::zeros({T, S}, dtype), after, kNegInf);
}

}  // namespace

Geometry check_arguments(const ag::Tensor& query, const ag::Tensor& key, const ag::Tensor& value,
                         const MultiHeadAttentionWeights& weights, const MultiHeadAttentionConfig& config,
                         const AttentionOptions& options) {
  const std::int64_t E = check_weights(weights, config);
  Geometry g = check_inputs(query, key, value, weights, E);
  g.H = config.num_heads;
  g.S_total = g.S + (weights.bias_k.defined() ? 1 : 0) + (config.add_zero_attn ? 1 : 0);
  check_masks(options, g, query, key);
  return g;
}

Masks build_masks(const AttentionOptions& o, const Geometry& g, bool causal_flag, ag::Dtype dtype) {
  // A floating attn_mask that requires grad gets its gradient, as in PyTorch: the mask is then
  // built with the graph recorded (the other masks are constants and add nothing to it).
  const bool mask_grad = o.attn_mask.defined() && ag::is_floating(o.attn_mask.dtype()) && o.attn_mask.requires_grad();
  std::optional<ag::NoGradGuard> no_grad;
  if (!mask_grad) no_grad.emplace();
  Masks masks;
  masks.causal_flag = causal_flag;
  ag::Tensor& mask = masks.additive;
  auto add = [&mask](const ag::Tensor& m) { mask = mask.defined() ? mask + m : m; };  // -inf + anything = -inf
  if (o.attn_mask.defined()) {  // (T, S), or (B·H, T, S) read as (B, H, T, S)
    // A floating mask is added as it is; an Int64 mask (what the comparisons return) is boolean:
    // nonzero = blocked (-inf), zero = allowed (0).
    const ag::Tensor raw = mask_grad ? o.attn_mask : o.attn_mask.detach();
    const ag::Tensor m = ag::is_floating(raw.dtype()) ? raw.to(dtype)
                                                      : ag::masked_fill(ag::zeros(raw.shape(), dtype), raw, kNegInf);
    add(m.dim() == 2 ? m : ag::reshape(m, {g.B, g.H, g.T, g.S}));
  }
  if (o.key_padding_mask.defined()) {  // (B, S) -> (B, 1, 1, S): -inf on the padding keys
    // nonzero tested in the mask's own dtype (a tiny float64 entry is still padding in a float32 layer)
    const ag::Tensor padding = ag::ne(ag::reshape(o.key_padding_mask.detach(), {g.B, 1, 1, g.S}), 0.0);
    add(ag::masked_fill(ag::zeros(padding.shape(), dtype), padding, kNegInf));
  }
  if (o.is_causal && !causal_flag) add(causal_mask(g.T, g.S, dtype));
  if (mask.defined() && g.S_total > g.S) {  // the appended keys: visible to every query
    ag::Shape extra = mask.shape();
    extra.back() = g.S_total - g.S;
    mask = ag::cat({mask, ag::zeros(extra, dtype)}, -1);
  }
  return masks;
}

}  // namespace nn::functional::detail
