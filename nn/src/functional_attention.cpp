// nn::functional::multi_head_attention_forward: check, project (packed or separate), attend,
// mix with W_O, shape the results. The argument checks and the masks are in
// functional_attention_checks.cpp.
#include <array>
#include <cmath>
#include <limits>

#include "functional_attention_detail.hpp"
#include "nn/module.hpp"
#include "per_example_capture.hpp"

namespace nn {

namespace functional {

namespace {

using detail::Geometry;

// q, k, v after the input projections, in one of two forms: `qkv` (B, T, 3E), each row
// [q | k | v] (one product by [W_Q | W_K | W_V], for the packed fused op); or q (B, T, E),
// k and v (B, S', E) with the appended keys and values, if any.
struct Projected {
  ag::Tensor qkv;
  ag::Tensor q, k, v;
};

// The seed's projection y = x · W + b on (B, L, in) inputs: one (B·L, in) · (in, out) product each.
Projected project(const ag::Tensor& query, const ag::Tensor& key, const ag::Tensor& value,
                  const MultiHeadAttentionWeights& w, const Geometry& g, bool add_zero_attn, bool packed) {
  if (packed) {
    const std::array<ag::Tensor, 3> weights{w.W_Q, w.W_K, w.W_V}, biases{w.b_Q, w.b_K, w.b_V};
    Projected p{ag::linear_cat(query, weights, biases), {}, {}, {}};  // (B, T, 3E)
    if (nn::detail::per_example_capture != nullptr) [[unlikely]]
      for (std::size_t i = 0, column = 0; i < 3; column += static_cast<std::size_t>(weights[i].size(1)), ++i)
        nn::detail::record_linear(query, p.qkv, weights[i], biases[i], static_cast<std::int64_t>(column));
    return p;
  }
  Projected p;
  p.q = ag::linear(query, w.W_Q, w.b_Q);  // (B, T, E)
  p.k = ag::linear(key, w.W_K, w.b_K);    // (B, S, E)
  p.v = ag::linear(value, w.W_V, w.b_V);  // (B, S, E)
  if (nn::detail::per_example_capture != nullptr) [[unlikely]] {
    nn::detail::record_linear(query, p.q, w.W_Q, w.b_Q);
    nn::detail::record_linear(key, p.k, w.W_K, w.b_K);
    nn::detail::record_linear(value, p.v, w.W_V, w.b_V);
  }
  if (w.bias_k.defined()) {  // one more key and value, learned, after the S keys
    p.k = ag::cat({p.k, ag::expand(ag::reshape(w.bias_k, {1, 1, g.E}), {g.B, 1, g.E})}, 1);  // (B, S+1, E)
    p.v = ag::cat({p.v, ag::expand(ag::reshape(w.bias_v, {1, 1, g.E}), {g.B, 1, g.E})}, 1);  // (B, S+1, E)
  }
  if (add_zero_attn) {  // one more all-zero key and value
    const ag::Tensor zero = ag::zeros({g.B, 1, g.E}, query.dtype());
    p.k = ag::cat({p.k, zero}, 1);  // (B, S', E)
    p.v = ag::cat({p.v, zero}, 1);  // (B, S', E)
  }
  return p;
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

// The call's hook callback, if any, at one point: the value, or the replacement it returned.
struct Points {
  const std::function<ag::Tensor(const char*, const ag::Tensor&)>* hooks = nullptr;
  ag::Tensor operator()(const char* point, const ag::Tensor& value) const {
    if (hooks == nullptr) return value;
    ag::Tensor replacement = (*hooks)(point, value);
    if (!replacement.defined()) return value;
    check_replacement("MultiHeadAttention", point, value, replacement);
    return replacement;
  }
};

struct CoreResult {
  ag::Tensor concat;   // (B, T, E): the heads' contexts side by side
  ag::Tensor weights;  // (B, H, T, S')
};

// Whether every element is finite (all = true), or below +inf and not NaN (all = false: -inf,
// which the mask uses to block, allowed).
bool bounded(const ag::Tensor& t, bool all) {
  bool ok = true;
  ag::dispatch(t.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const auto a = t.as_array<T>();
    ok = all ? a.isFinite().all() : (a < std::numeric_limits<T>::infinity()).all();
  });
  return ok;
}

// Whether the sum of t's elements is finite (one vectorised pass): for softmax weights, in [0, 1],
// exactly when none is NaN.
bool finite_sum(const ag::Tensor& t) {
  bool ok = true;
  ag::dispatch(t.dtype(), [&](auto zero) {
    using T = decltype(zero);
    ok = std::isfinite(t.as_array<T>().sum());
  });
  return ok;
}

// Called when the softmax gave NaN: refused when the scores overflowed the dtype from finite
// values, rather than returned (the fused ops refuse the same). qk is q·kᵀ before its hook, raw
// after it, scaled the scores before theirs; a hook's own non-finite values pass as they are.
void check_scores(const ag::Tensor& q, const ag::Tensor& k, const ag::Tensor& qk, const ag::Tensor& raw,
                  const ag::Tensor& scaled) {
  const char* what = nullptr;
  if (!bounded(qk, true) && bounded(q, true) && bounded(k, true)) what = "a product q·kᵀ of finite q and k";
  else if (bounded(raw, true) && !bounded(scaled, false)) what = "a score q·kᵀ/√d_k + mask of finite terms";
  if (what == nullptr) return;
  ag::fail("MultiHeadAttention", "the scores overflowed {} on the composed core: {} is not finite, so the softmax "
           "would be NaN; the inputs or the weights are too large", ag::dtype_name(qk.dtype()), what);
}

// The attention core written out as separate autograd ops: the readable reference that the
// fused op is tested against. Each intermediate passes through its hook point `at`; fills
// `study` with them when it is given.
CoreResult compose_attention(const Projected& p, const ag::Tensor& mask, std::int64_t H, double dropout_p,
                             ag::Generator& gen, const Points& at, AttentionStudy* study) {
  const ag::Tensor q = at("q", split_heads(p.q, H));  // (B, H, T, d_k)
  const ag::Tensor k = at("k", split_heads(p.k, H));  // (B, H, S', d_k)
  const ag::Tensor v = at("v", split_heads(p.v, H));  // (B, H, S', d_k)
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));  // 1/√d_k
  const ag::Tensor qk = ag::matmul(q, ag::transpose(k, -2, -1));   // (B,H,T,d_k)·(B,H,d_k,S')
  const ag::Tensor raw_scores = at("raw_scores", qk);
  ag::Tensor attn_scores = raw_scores * scale;                      // (B, H, T, S')
  if (mask.defined()) attn_scores = attn_scores + mask;              // + the mask (broadcast); -inf blocks
  const ag::Tensor scaled = attn_scores;
  attn_scores = at("attn_scores", attn_scores);
  // A row whose scores are all -inf (every key blocked) gets zero weights and zero gradients.
  const ag::Tensor weights = ag::softmax(attn_scores, -1);  // (B, H, T, S'), rows sum to 1 (or 0)
  if (!finite_sum(weights)) check_scores(q, k, qk, raw_scores, scaled);
  const ag::Tensor pattern = at("pattern", weights);
  const ag::Tensor dropped = dropout_p > 0.0 ? ag::dropout(pattern, dropout_p, true, gen) : pattern;
  const ag::Tensor z = at("z", ag::matmul(dropped, v));  // (B,H,T,S')·(B,H,S',d_k) = (B, H, T, d_k)
  const ag::Tensor concat = at("concat", merge_heads(z));  // (B, T, E)
  if (study) *study = AttentionStudy{q, k, v, raw_scores, attn_scores, pattern, z, concat, concat.requires_grad()};
  return {concat, pattern};
}

// Every head at once, on the core the call asked for. The fused ops read head h from columns
// h·d_k .. (h+1)·d_k - 1 of q, k, v in place and write the concat directly: no split into
// (B, H, L, d_k) copies, no merge. Without need_weights they return no weights, and from
// T·S ≥ 2^20 run their tiled core, whose memory grows linearly in T (ag::sdpa_path says which). `path` receives the core that ran
// (the fused op's own report) and why.
CoreResult attend(const Projected& p, const detail::Masks& m, const MultiHeadAttentionConfig& c,
                  std::string_view why_composed, bool need_weights, AttentionStudy* study, ag::SdpaPath& path) {
  ag::Generator& gen = c.dropout_generator != nullptr ? *c.dropout_generator : ag::default_generator();
  const std::int64_t H = c.num_heads;
  if (!why_composed.empty()) {
    path = {ag::SdpaCore::Composed, why_composed};
    return compose_attention(p, m.additive, H, c.dropout_p, gen, Points{c.hooks}, study);
  }
  const ag::SdpaOptions options{.need_weights = need_weights,
                                .attn_mask = m.additive,
                                .dropout_p = c.dropout_p,
                                .is_causal = m.causal_flag,
                                .generator = &gen};
  const ag::SdpaResult r = p.qkv.defined() ? ag::scaled_dot_product_attention_packed(p.qkv, H, options)
                                           : ag::scaled_dot_product_attention_heads_last(p.q, p.k, p.v, H, options);
  path = r.path;
  return {r.output, r.weights};
}

// Study: every intermediate keeps its gradient (when the forward recorded a graph).
void retain_grads(AttentionStudy& s) {
  for (ag::Tensor* t : {&s.q, &s.k, &s.v, &s.raw_scores, &s.attn_scores, &s.pattern, &s.z, &s.concat})
    if (t->defined() && t->requires_grad()) t->retain_grad();
}

// Back to the caller's form: unbatched inputs give unbatched results; weights averaged over the
// heads, per head, or not at all.
AttentionOutput shape_output(const ag::Tensor& out, const ag::Tensor& weights, bool batched,
                             const AttentionOptions& options) {
  AttentionOutput result;
  result.output = batched ? out : ag::squeeze(out, 0);  // (B, T, E) or (T, E)
  if (options.need_weights) {
    const ag::Tensor w = options.average_attn_weights ? ag::mean(weights, 1) : weights;  // (B, T, S') or (B, H, T, S')
    result.weights = batched ? w : ag::squeeze(w, 0);
  } else {
    result.weights = ag::Tensor::undefined("need_weights = false: the attention weights were not asked for");
  }
  return result;
}

// Why a call runs the Composed core: the first of these that holds; empty for the fused core.
std::string_view composed_reason(const MultiHeadAttentionConfig& config) {
  if (config.core == AttentionCore::Composed) return "AttentionCore::Composed";
  if (config.study != nullptr) return "study mode";
  if (config.hooks != nullptr) return "hooks";
  return {};
}

}  // namespace

ag::SdpaPath attention_path(const ag::Tensor& query, const ag::Tensor& key, const ag::Tensor& value,
                            const MultiHeadAttentionWeights& weights, const MultiHeadAttentionConfig& config,
                            const AttentionOptions& options) {
  const Geometry g = detail::check_arguments(query, key, value, weights, config, options);
  const std::string_view why_composed = composed_reason(config);
  if (!why_composed.empty()) return {ag::SdpaCore::Composed, why_composed};
  return ag::sdpa_path(g.T, g.S_total, {.need_weights = options.need_weights});
}

AttentionOutput multi_head_attention_forward(const ag::Tensor& query, const ag::Tensor& key, const ag::Tensor& value,
                                             const MultiHeadAttentionWeights& weights,
                                             const MultiHeadAttentionConfig& config,
                                             const AttentionOptions& options) {
  // ---- check ----
  const Geometry g = detail::check_arguments(query, key, value, weights, config, options);
  // Work batched throughout: an unbatched input is a batch of one.
  const ag::Tensor query3 = g.batched ? query : ag::unsqueeze(query, 0);  // (B, T, E)
  const ag::Tensor key3 = g.batched ? key : ag::unsqueeze(key, 0);        // (B, S, kdim)
  const ag::Tensor value3 = g.batched ? value : ag::unsqueeze(value, 0);  // (B, S, vdim)

  // ---- choose the core; build the masks ----
  const std::string_view why_composed = composed_reason(config);
  const bool composed = !why_composed.empty();
  // Self-attention (one tensor as query, key and value) on the fused core: one projection by
  // [W_Q | W_K | W_V] gives q, k, v side by side in each row, and the fused op reads them there.
  // One GEMM forward and one per operand backward instead of three each (and no sum of three dX).
  const bool packed = !composed && g.S_total == g.S && query.is_same(key) && key.is_same(value);
  // The fused op takes causality as a flag when the keys are exactly the S inputs.
  const bool causal_flag = options.is_causal && !composed && g.S_total == g.S;
  const detail::Masks masks = detail::build_masks(options, g, causal_flag, query.dtype());

  // ---- project, attend, mix with W_O ----
  const Projected p = project(query3, key3, value3, weights, g, config.add_zero_attn, packed);
  AttentionStudy study;
  ag::SdpaPath path;
  const CoreResult core = attend(p, masks, config, why_composed, options.need_weights,
                                 config.study != nullptr ? &study : nullptr, path);
  if (config.path != nullptr) *config.path = path;
  ag::Tensor out = ag::linear(core.concat, weights.W_O, weights.b_O);  // (B, T, E)
  if (nn::detail::per_example_capture != nullptr) [[unlikely]]
    nn::detail::record_linear(core.concat, out, weights.W_O, weights.b_O);
  out = Points{config.hooks}("out", out);
  if (config.study != nullptr) {
    retain_grads(study);
    *config.study = std::move(study);
  }

  // ---- shape ----
  return shape_output(out, core.weights, g.batched, options);
}

}  // namespace functional

namespace {

constexpr std::string_view kStudyFields = "q, k, v, raw_scores, attn_scores, pattern, z, concat";

}  // namespace

const ag::Tensor& AttentionStudy::value(std::string_view field) const {
  if (field == "q") return q;
  if (field == "k") return k;
  if (field == "v") return v;
  if (field == "raw_scores") return raw_scores;
  if (field == "attn_scores") return attn_scores;
  if (field == "pattern") return pattern;
  if (field == "z") return z;
  if (field == "concat") return concat;
  ag::fail("AttentionStudy", "no field {}; the fields are {}", quote_name(field), kStudyFields);
}

ag::Tensor AttentionStudy::grad(std::string_view field) const {
  const ag::Tensor& t = value(field);
  if (!t.defined())
    ag::fail("AttentionStudy::grad", "the study is empty: no forward in study mode has filled it ({} asked for)",
             quote_name(field));
  if (!has_graph)
    ag::fail("AttentionStudy::grad", "no gradient of {}: the forward that made this study recorded no graph (it ran "
             "under NoGradGuard, or nothing it used requires grad). A study holds the last forward's live tensors; "
             "for values that later forwards do not replace, use nn::run_with_cache", quote_name(field));
  ag::Tensor g = t.grad();
  if (!g.defined())
    ag::fail("AttentionStudy::grad", "no gradient of {} yet: no backward since the forward that made this study "
             "has reached it", quote_name(field));
  return g;
}

ag::Tensor AttentionStudy::head(const ag::Tensor& t, std::int64_t h, std::int64_t b) {
  if (!t.defined())
    ag::fail("AttentionStudy::head", "the tensor is undefined: a .grad() not computed yet (no backward since the "
             "forward, or a forward without a graph, e.g. under NoGradGuard), or a study no forward has filled");
  if (t.dim() != 4) ag::fail("AttentionStudy::head", "needs a (B, H, rows, cols) tensor, got {}", ag::shape_str(t.shape()));
  if (b < 0 || b >= t.size(0) || h < 0 || h >= t.size(1))
    ag::fail("AttentionStudy::head", "batch {} head {} out of range for shape {}", b, h, ag::shape_str(t.shape()));
  ag::NoGradGuard no_grad;
  ag::Tensor slice = ag::narrow(ag::narrow(t.detach(), 0, b, 1), 1, h, 1);  // (1, 1, rows, cols)
  return ag::reshape(slice, {t.size(2), t.size(3)}).clone();
}

}  // namespace nn
