#include "nn/multihead_attention.hpp"

#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include "nn/init.hpp"

namespace nn {

namespace {

constexpr std::string_view kOp = "MultiHeadAttention";
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// The seed's projection y = x · W + b on a (B, L, in) input: one (B·L, in) · (in, out) product.
ag::Tensor project(const ag::Tensor& x, const ag::Tensor& W, const ag::Tensor& b) {
  return ag::linear(x, W, b);  // (B, L, out); b may be undefined (bias = false)
}

// (B, L, E) -> (B, H, L, d_k): head h takes columns h·d_k .. (h+1)·d_k - 1. Only a regrouping.
ag::Tensor split_heads(const ag::Tensor& x, std::int64_t H) {
  const std::int64_t B = x.size(0), L = x.size(1), E = x.size(2);
  return ag::transpose(ag::reshape(x, {B, L, H, E / H}), 1, 2);  // (B, L, H, d_k) -> (B, H, L, d_k)
}

// (B, H, L, d_k) -> (B, L, E): the heads side by side again (concat).
ag::Tensor merge_heads(const ag::Tensor& x) {
  const std::int64_t B = x.size(0), H = x.size(1), L = x.size(2), d_k = x.size(3);
  return ag::reshape(ag::transpose(x, 1, 2), {B, L, H * d_k});  // (B, L, H, d_k) -> (B, L, E)
}

// Everything the masks say, as one additive mask over the scores.
struct CombinedMask {
  ag::Tensor additive;  // (Bm, Hm, Tm, S'), Bm in {1, B}, Hm in {1, H}, Tm in {1, T}: 0 or the float mask, -inf blocks
  ag::Tensor blocked;   // (Bm, Hm, Tm, 1): 1 where every key of the row is blocked; undefined if no row is
  bool causal = false;  // causality left to the fused op's is_causal flag (not in `additive`)
};

// key_padding_mask is (B, S) or undefined; attn_mask is (T, S), (B·H, T, S) or undefined (already
// checked). The S' - S extra columns (bias_k, zero attention) are never blocked.
CombinedMask combine_masks(const ag::Tensor& key_padding_mask, const ag::Tensor& attn_mask, bool is_causal,
                           bool causal_in_mask, std::int64_t B, std::int64_t H, std::int64_t T,
                           std::int64_t S, std::int64_t S_total, ag::Dtype dtype) {
  CombinedMask mask;
  const bool has_kpm = key_padding_mask.defined(), has_attn = attn_mask.defined();
  if (!has_kpm && !has_attn && !causal_in_mask) {
    mask.causal = is_causal;
    return mask;
  }
  const bool per_head = has_attn && attn_mask.dim() == 3;
  // Only the dims some mask varies along are materialised (a padding mask alone is (B, 1, 1, S')).
  const std::int64_t Bm = (has_kpm || per_head) ? B : 1, Hm = per_head ? H : 1;
  const std::int64_t Tm = (has_attn || causal_in_mask) ? T : 1;
  // Read and built in float64 tensors (their buffers are reused warm: no allocation per step).
  const ag::Tensor kpm_t = has_kpm ? key_padding_mask.detach().to(ag::Dtype::Float64) : ag::Tensor();
  const ag::Tensor am_t = has_attn ? attn_mask.detach().to(ag::Dtype::Float64) : ag::Tensor();
  const double* kpm = has_kpm ? kpm_t.data<double>() : nullptr;
  const double* am = has_attn ? am_t.data<double>() : nullptr;
  const ag::Tensor values = ag::Tensor::empty({Bm, Hm, Tm, S_total}, ag::Dtype::Float64);
  const ag::Tensor blocked = ag::zeros({Bm, Hm, Tm, 1}, ag::Dtype::Float64);
  double* blocked_rows = blocked.data<double>();
  bool any_blocked = false;
  for (std::int64_t b = 0; b < Bm; ++b)
    for (std::int64_t h = 0; h < Hm; ++h)
      for (std::int64_t i = 0; i < Tm; ++i) {
        const std::int64_t row = (b * Hm + h) * Tm + i;
        double* out = values.data<double>() + row * S_total;
        bool all_blocked = true;
        for (std::int64_t j = 0; j < S_total; ++j) {
          double m = 0.0;
          if (j < S) {
            if (has_attn) m = am[((per_head ? b * H + h : 0) * T + i) * S + j];
            if (has_kpm && kpm[b * S + j] != 0.0) m = kNegInf;
            if (causal_in_mask && j > i) m = kNegInf;
          }
          out[j] = m;
          all_blocked = all_blocked && m == kNegInf;
        }
        if (all_blocked) {
          blocked_rows[row] = 1.0;
          any_blocked = true;
        }
      }
  mask.additive = values.to(dtype);
  if (any_blocked) mask.blocked = blocked.to(dtype);
  mask.causal = is_causal && !causal_in_mask;
  return mask;
}

struct CoreResult {
  ag::Tensor context;  // (B, H, T, d_k); undefined from the fused core, which writes the concat
  ag::Tensor weights;  // (B, H, T, S')
};

// The attention core written out as separate autograd ops: the readable reference that the
// fused op is tested against. Fills `study` with every intermediate when it is given.
CoreResult compose_attention(const ag::Tensor& q, const ag::Tensor& k, const ag::Tensor& v,
                             const CombinedMask& mask, double dropout_p, ag::Generator& gen,
                             AttentionStudy* study) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));  // 1/√d_k
  ag::Tensor raw_scores = ag::matmul(q, ag::transpose(k, -2, -1));  // (B,H,T,d_k)·(B,H,d_k,S') = (B,H,T,S')
  ag::Tensor scores = raw_scores * scale;                             // (B, H, T, S')
  if (mask.additive.defined()) scores = scores + mask.additive;       // (B,H,T,S') + (Bm,Hm,Tm,S'); -inf blocks
  // softmax of an all -inf row is 0/0: give such rows finite logits, then zero their weights
  // (masked_fill passes no gradient to what it overwrites, so the row's gradients are zero too).
  ag::Tensor logits = mask.blocked.defined() ? ag::masked_fill(scores, mask.blocked, 0.0) : scores;
  ag::Tensor weights = ag::softmax(logits, -1);                                   // (B, H, T, S'), rows sum to 1
  if (mask.blocked.defined()) weights = ag::masked_fill(weights, mask.blocked, 0.0);  // blocked rows sum to 0
  ag::Tensor dropped = dropout_p > 0.0 ? ag::dropout(weights, dropout_p, true, gen) : weights;  // (B, H, T, S')
  ag::Tensor context = ag::matmul(dropped, v);  // (B,H,T,S')·(B,H,S',d_k) = (B, H, T, d_k)
  if (study) {
    study->q = q;
    study->k = k;
    study->v = v;
    study->raw_scores = raw_scores;
    study->scores = scores;
    study->weights = weights;
    study->context = context;
  }
  return {context, weights};
}

void retain(ag::Tensor& t) {
  if (t.defined() && t.requires_grad()) t.retain_grad();
}

}  // namespace

ag::Tensor AttentionStudy::head(const ag::Tensor& t, std::int64_t h, std::int64_t b) {
  if (!t.defined()) ag::fail("AttentionStudy::head", "tensor is undefined (no backward yet?)");
  if (t.dim() != 4) ag::fail("AttentionStudy::head", "needs a (B, H, rows, cols) tensor, got {}", ag::shape_str(t.shape()));
  if (b < 0 || b >= t.size(0) || h < 0 || h >= t.size(1))
    ag::fail("AttentionStudy::head", "batch {} head {} out of range for shape {}", b, h, ag::shape_str(t.shape()));
  ag::NoGradGuard no_grad;
  ag::Tensor slice = ag::narrow(ag::narrow(t.detach(), 0, b, 1), 1, h, 1);  // (1, 1, rows, cols)
  return ag::reshape(slice, {t.size(2), t.size(3)}).clone();
}

MultiHeadAttention::MultiHeadAttention(std::int64_t embed_dim, std::int64_t num_heads)
    : MultiHeadAttention(MultiHeadAttentionOptions{embed_dim, num_heads}) {}

MultiHeadAttention::MultiHeadAttention(const MultiHeadAttentionOptions& options)
    : MultiHeadAttention(options, ag::default_generator()) {}

MultiHeadAttention::MultiHeadAttention(const MultiHeadAttentionOptions& options, ag::Generator& gen)
    : Module("MultiHeadAttention"), options_(options) {
  const auto& o = options;
  if (o.embed_dim <= 0 || o.num_heads <= 0)
    ag::fail(kOp, "embed_dim and num_heads must be positive, got {} and {}", o.embed_dim, o.num_heads);
  if (o.embed_dim % o.num_heads != 0)
    ag::fail(kOp, "embed_dim {} is not divisible by num_heads {}", o.embed_dim, o.num_heads);
  if (o.kdim < 0 || o.vdim < 0) ag::fail(kOp, "kdim and vdim must be >= 0 (0 = embed_dim), got {} and {}", o.kdim, o.vdim);
  if (!(o.dropout >= 0.0 && o.dropout < 1.0)) ag::fail(kOp, "dropout must be in [0, 1), got {}", o.dropout);
  if (options_.kdim == 0) options_.kdim = o.embed_dim;
  if (options_.vdim == 0) options_.vdim = o.embed_dim;
  const std::int64_t E = o.embed_dim;
  W_Q_ = register_parameter("W_Q", ag::zeros({E, E}, o.dtype));
  W_K_ = register_parameter("W_K", ag::zeros({options_.kdim, E}, o.dtype));
  W_V_ = register_parameter("W_V", ag::zeros({options_.vdim, E}, o.dtype));
  W_O_ = register_parameter("W_O", ag::zeros({E, E}, o.dtype));
  if (o.bias) {
    b_Q_ = register_parameter("b_Q", ag::zeros({E}, o.dtype));
    b_K_ = register_parameter("b_K", ag::zeros({E}, o.dtype));
    b_V_ = register_parameter("b_V", ag::zeros({E}, o.dtype));
    b_O_ = register_parameter("b_O", ag::zeros({E}, o.dtype));
  }
  if (o.add_bias_kv) {
    bias_k_ = register_parameter("bias_k", ag::zeros({E}, o.dtype));
    bias_v_ = register_parameter("bias_v", ag::zeros({E}, o.dtype));
  }
  reset_parameters(gen);
  dropout_gen_.manual_seed(gen.next_u64());
}

void MultiHeadAttention::reset_parameters(ag::Generator& gen) {
  const std::int64_t E = options_.embed_dim;
  if (options_.kdim == E && options_.vdim == E) {
    // PyTorch draws one (3E x E) in_proj block: fan_in + fan_out = E + 3E.
    const double a = std::sqrt(6.0 / static_cast<double>(4 * E));
    for (auto* W : {&W_Q_, &W_K_, &W_V_}) init::uniform_(*W, -a, a, gen);
  } else {
    for (auto* W : {&W_Q_, &W_K_, &W_V_}) init::xavier_uniform_(*W, gen);
  }
  init::kaiming_uniform_(W_O_, gen, std::sqrt(5.0));  // nn.Linear's default: U(-1/√E, 1/√E)
  for (auto* b : {&b_Q_, &b_K_, &b_V_, &b_O_})
    if (b->defined()) init::zeros_(*b);
  for (auto* b : {&bias_k_, &bias_v_})
    if (b->defined()) init::xavier_normal_(*b, gen);
}

void MultiHeadAttention::set_study(bool on) {
  options_.study = on;
  if (!on) {
    study_ = AttentionStudy{};
    has_study_ = false;
  }
}

const AttentionStudy& MultiHeadAttention::study() const {
  if (!options_.study) ag::fail(kOp, "study mode is off: call set_study(true) before forward");
  if (!has_study_) ag::fail(kOp, "no forward has run in study mode yet");
  return study_;
}

AttentionOutput MultiHeadAttention::forward(const ag::Tensor& query, const ag::Tensor& key,
                                            const ag::Tensor& value, const AttentionOptions& ao) {
  // ---- check the arguments ----
  if (!query.defined() || !key.defined() || !value.defined())
    ag::fail(kOp, "query, key and value must all be defined");
  const ag::Dtype dtype = W_Q_.dtype();
  for (const auto* t : {&query, &key, &value})
    if (t->dtype() != dtype)
      ag::fail(kOp, "input dtype {} differs from the parameters' {} (convert with .to())",
               ag::dtype_name(t->dtype()), ag::dtype_name(dtype));
  const bool batched = query.dim() == 3;
  if ((query.dim() != 2 && query.dim() != 3) || key.dim() != query.dim() || value.dim() != query.dim())
    ag::fail(kOp, "query, key and value must be all batched (3-D) or all unbatched (2-D), got {}, {} and {}",
             ag::shape_str(query.shape()), ag::shape_str(key.shape()), ag::shape_str(value.shape()));
  const std::int64_t E = options_.embed_dim, H = options_.num_heads;
  if (query.size(-1) != E)
    ag::fail(kOp, "query of shape {} should end in embed_dim = {}", ag::shape_str(query.shape()), E);
  if (key.size(-1) != options_.kdim)
    ag::fail(kOp, "key of shape {} should end in kdim = {}", ag::shape_str(key.shape()), options_.kdim);
  if (value.size(-1) != options_.vdim)
    ag::fail(kOp, "value of shape {} should end in vdim = {}", ag::shape_str(value.shape()), options_.vdim);
  if (batched && (key.size(0) != query.size(0) || value.size(0) != query.size(0)))
    ag::fail(kOp, "batch sizes differ: query {}, key {}, value {}", ag::shape_str(query.shape()),
             ag::shape_str(key.shape()), ag::shape_str(value.shape()));
  if (key.size(-2) != value.size(-2))
    ag::fail(kOp, "key {} and value {} have different sequence lengths", ag::shape_str(key.shape()),
             ag::shape_str(value.shape()));

  // Work batched throughout: an unbatched input is a batch of one.
  const ag::Tensor query3 = batched ? query : ag::unsqueeze(query, 0);  // (B, T, E)
  const ag::Tensor key3 = batched ? key : ag::unsqueeze(key, 0);        // (B, S, kdim)
  const ag::Tensor value3 = batched ? value : ag::unsqueeze(value, 0);  // (B, S, vdim)
  const std::int64_t B = query3.size(0), T = query3.size(1), S = key3.size(1);

  if (ao.is_causal && T != S)
    ag::fail(kOp, "is_causal needs as many queries as keys, got T = {} (query {}) and S = {} (key {})", T,
             ag::shape_str(query.shape()), S, ag::shape_str(key.shape()));
  ag::Tensor key_padding_mask;  // (B, S)
  if (ao.key_padding_mask.defined()) {
    const ag::Shape want = batched ? ag::Shape{B, S} : ag::Shape{S};
    if (ao.key_padding_mask.shape() != want)
      ag::fail(kOp, "key_padding_mask of shape {} does not match the keys {}: expected {}",
               ag::shape_str(ao.key_padding_mask.shape()), ag::shape_str(key.shape()), ag::shape_str(want));
    key_padding_mask = ao.key_padding_mask;
  }
  if (ao.attn_mask.defined()) {
    const ag::Shape m = ao.attn_mask.shape();
    const ag::Shape per_head = {B * H, T, S};
    if (m != ag::Shape{T, S} && m != per_head)
      ag::fail(kOp, "attn_mask of shape {} fits neither (T, S) = {} nor ({}, T, S) = {} for query {} and key {}",
               ag::shape_str(m), ag::shape_str({T, S}), batched ? "B * num_heads" : "num_heads",
               ag::shape_str(per_head), ag::shape_str(query.shape()), ag::shape_str(key.shape()));
  }

  const bool composed = options_.core == AttentionCore::Composed || options_.study;
  const std::int64_t S_total = S + (options_.add_bias_kv ? 1 : 0) + (options_.add_zero_attn ? 1 : 0);
  // The fused op takes causality as a flag; elsewhere it becomes part of the additive mask.
  const bool causal_in_mask = ao.is_causal && (composed || S_total != S);
  const CombinedMask mask =
      combine_masks(key_padding_mask, ao.attn_mask, ao.is_causal, causal_in_mask, B, H, T, S, S_total, dtype);

  const double dropout_p = is_training() ? options_.dropout : 0.0;
  // Self-attention (one tensor as query, key and value) on the fused core: one projection by
  // [W_Q | W_K | W_V] gives q, k, v side by side in each row, and the fused op reads them there.
  // One GEMM forward and one per operand backward instead of three each (and no sum of three dX).
  if (!composed && !options_.add_bias_kv && !options_.add_zero_attn && query.is_same(key) &&
      key.is_same(value)) {
    const std::array<ag::Tensor, 3> weights{W_Q_, W_K_, W_V_}, biases{b_Q_, b_K_, b_V_};
    const ag::Tensor qkv = ag::linear_cat(query3, weights, options_.bias ? std::span<const ag::Tensor>(biases)
                                                                          : std::span<const ag::Tensor>());  // (B, T, 3E)
    ag::SdpaResult r = ag::scaled_dot_product_attention_packed(qkv, H, mask.additive, mask.causal, 0.0, dropout_p,
                                                               &dropout_gen_);
    ag::Tensor out = project(r.output, W_O_, b_O_);  // (B, T, E)
    AttentionOutput result;
    result.output = batched ? out : ag::squeeze(out, 0);  // (B, T, E) or (T, E)
    if (ao.need_weights) {
      ag::Tensor w = ao.average_attn_weights ? ag::mean(r.weights, 1) : r.weights;  // (B, T, T) or (B, H, T, T)
      result.weights = batched ? w : ag::squeeze(w, 0);
    }
    return result;
  }

  // ---- project, then split into heads ----
  ag::Tensor q = project(query3, W_Q_, b_Q_);  // (B, T, E)
  ag::Tensor k = project(key3, W_K_, b_K_);    // (B, S, E)
  ag::Tensor v = project(value3, W_V_, b_V_);  // (B, S, E)
  if (options_.add_bias_kv) {  // one more key and value, learned, after the S keys
    k = ag::cat({k, ag::expand(ag::reshape(bias_k_, {1, 1, E}), {B, 1, E})}, 1);  // (B, S+1, E)
    v = ag::cat({v, ag::expand(ag::reshape(bias_v_, {1, 1, E}), {B, 1, E})}, 1);  // (B, S+1, E)
  }
  if (options_.add_zero_attn) {  // one more all-zero key and value
    const ag::Tensor zero = ag::zeros({B, 1, E}, dtype);
    k = ag::cat({k, zero}, 1);  // (B, S', E)
    v = ag::cat({v, zero}, 1);  // (B, S', E)
  }

  // ---- attend in every head at once, then concat the heads ----
  CoreResult core;
  AttentionStudy study;
  ag::Tensor concat;  // (B, T, E): the heads' contexts side by side
  if (composed) {
    ag::Tensor qh = split_heads(q, H);  // (B, H, T, d_k)
    ag::Tensor kh = split_heads(k, H);  // (B, H, S', d_k)
    ag::Tensor vh = split_heads(v, H);  // (B, H, S', d_k)
    core = compose_attention(qh, kh, vh, mask, dropout_p, dropout_gen_, options_.study ? &study : nullptr);
    concat = merge_heads(core.context);
  } else {
    // The fused op reads head h from columns h·d_k .. (h+1)·d_k − 1 of q, k, v in place and writes
    // the concat directly: no split into (B, H, L, d_k) copies, no merge.
    ag::SdpaResult r = ag::scaled_dot_product_attention_heads_last(q, k, v, H, mask.additive, mask.causal, 0.0,
                                                                   dropout_p, &dropout_gen_);
    core = {ag::Tensor(), r.weights};
    concat = r.output;
  }

  // ---- mix with W_O ----
  ag::Tensor out = project(concat, W_O_, b_O_);  // (B, T, E)

  if (options_.study) {
    study.concat = concat;
    for (ag::Tensor* t : {&study.q, &study.k, &study.v, &study.raw_scores, &study.scores, &study.weights,
                          &study.context, &study.concat})
      retain(*t);
    study_ = std::move(study);
    has_study_ = true;
  }

  AttentionOutput result;
  result.output = batched ? out : ag::squeeze(out, 0);  // (B, T, E) or (T, E)
  if (ao.need_weights) {
    ag::Tensor w = ao.average_attn_weights ? ag::mean(core.weights, 1) : core.weights;  // (B, T, S') or (B, H, T, S')
    result.weights = batched ? w : ag::squeeze(w, 0);
  }
  return result;
}

std::string MultiHeadAttention::extra_repr() const {
  const auto& o = options_;
  std::string s = fmt::format("embed_dim={}, num_heads={}, head_dim={}, dropout={}, bias={}", o.embed_dim,
                              o.num_heads, head_dim(), o.dropout, o.bias);
  if (o.kdim != o.embed_dim || o.vdim != o.embed_dim) s += fmt::format(", kdim={}, vdim={}", o.kdim, o.vdim);
  if (o.add_bias_kv) s += ", add_bias_kv=true";
  if (o.add_zero_attn) s += ", add_zero_attn=true";
  s += o.core == AttentionCore::Fused ? ", core=fused" : ", core=composed";
  if (o.study) s += ", study=true";
  return s;
}

}  // namespace nn
