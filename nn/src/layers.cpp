#include "nn/layers.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "nn/init.hpp"
#include "parameter_budget.hpp"
#include "per_example_capture.hpp"

namespace nn {

// ---- Embedding ----

Embedding::Embedding(std::int64_t num_embeddings, std::int64_t embedding_dim)
    : Embedding(EmbeddingOptions{num_embeddings, embedding_dim}) {}

Embedding::Embedding(const EmbeddingOptions& options) : Embedding(options, ag::default_generator()) {}

Embedding::Embedding(const EmbeddingOptions& options, ag::Generator& gen) : Module("Embedding"), options_(options) {
  if (options.num_embeddings <= 0 || options.embedding_dim <= 0)
    ag::fail("Embedding", "num_embeddings and embedding_dim must be positive, got {} and {}", options.num_embeddings,
             options.embedding_dim);
  if (!ag::is_floating(options.dtype))
    ag::fail("Embedding", "dtype must be Float32 or Float64 (the weight's; indices may be Int64), got {}",
             ag::dtype_name(options.dtype));
  detail::claim_parameter("Embedding", "weight", {options.num_embeddings, options.embedding_dim});
  weight_.bind(
      register_parameter("weight", ag::randn({options.num_embeddings, options.embedding_dim}, options.dtype, gen)));
}

ag::Tensor Embedding::forward(const ag::Tensor& indices) const {
  ag::Tensor y = ag::embedding(weight_, indices);
  if (detail::per_example_capture != nullptr) [[unlikely]]
    detail::record_embedding(indices, y, weight_);
  return y;
}

std::string Embedding::extra_repr() const {
  return fmt::format("{}, {}", options_.num_embeddings, options_.embedding_dim);
}

// ---- LayerNorm ----

namespace {

// For x seen as rows of `row` elements: per row, the power of two s = 2^-e with max|x| in
// [2^(e-1), 2^e), when some row's max|x| lies outside [2^-50, 2^50] (its squares summed could
// overflow or underflow); shaped as x with the row's dims 1. For a tiny row e is held at -63
// (float32) or -511 (float64), so that s² stays finite; for a huge one s is at least 2^-1024,
// which the dtype holds (as a subnormal). Undefined when every row is in range (then s = 1).
ag::Tensor row_power_of_two(const ag::Tensor& x, std::int64_t row, std::int64_t row_dims) {
  if (row <= 0 || x.numel() == 0) return {};
  const std::int64_t rows = x.numel() / row;
  std::vector<double> s(static_cast<std::size_t>(rows), 1.0);
  bool any = false;
  ag::dispatch(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    if constexpr (std::is_floating_point_v<T>) {
      const int limit = std::is_same_v<T, float> ? 63 : 511;
      const T* v = x.data<T>();
      for (std::int64_t r = 0; r < rows; ++r) {
        double top = 0;
        for (std::int64_t i = 0; i < row; ++i) top = std::max(top, std::fabs(static_cast<double>(v[r * row + i])));
        if (!(top > 0x1p50 || (top > 0 && top < 0x1p-50)) || !std::isfinite(top)) continue;
        int e = 0;
        std::frexp(top, &e);  // top in [2^(e-1), 2^e)
        s[static_cast<std::size_t>(r)] = std::ldexp(1.0, -std::max(e, -limit));
        any = true;
      }
    }
  });
  if (!any) return {};
  ag::Shape shape = x.shape();
  for (std::int64_t d = x.dim() - row_dims; d < x.dim(); ++d) shape[static_cast<std::size_t>(d)] = 1;
  return ag::tensor(s, shape, x.dtype());
}

}  // namespace

LayerNorm::LayerNorm(std::int64_t normalized_size, double eps)
    : LayerNorm(LayerNormOptions{.normalized_shape = {normalized_size}, .eps = eps}) {}

LayerNorm::LayerNorm(const LayerNormOptions& options) : Module("LayerNorm"), options_(options) {
  declare_hook_points({"scale", "normalized"});
  if (options.normalized_shape.empty()) ag::fail("LayerNorm", "normalized_shape is empty");
  for (auto d : options.normalized_shape)
    if (d <= 0) ag::fail("LayerNorm", "normalized_shape {} must be positive", ag::shape_str(options.normalized_shape));
  if (!(options.eps >= 0.0)) ag::fail("LayerNorm", "eps must be >= 0, got {}", options.eps);
  if (options.dtype == ag::Dtype::Float32 && options.eps > 0.0 && static_cast<float>(options.eps) == 0.0f)
    ag::fail("LayerNorm", "eps = {} is 0 in Float32, the layer's dtype (the hook points' form would divide by 0); "
             "use a float32 number or 0", options.eps);
  if (!ag::is_floating(options.dtype))
    ag::fail("LayerNorm", "dtype must be Float32 or Float64, got {}", ag::dtype_name(options.dtype));
  if (options.elementwise_affine) {
    detail::claim_parameter("LayerNorm", "weight", options.normalized_shape);
    weight_.bind(register_parameter("weight", ag::ones(options.normalized_shape, options.dtype)));
    if (options.bias) {
      detail::claim_parameter("LayerNorm", "bias", options.normalized_shape);
      bias_.bind(register_parameter("bias", ag::zeros(options.normalized_shape, options.dtype)));
    }
  }
}

ag::Tensor LayerNorm::forward(const ag::Tensor& x) const {
  const HookPoints& at = hook_points();
  if (!at.any()) {
    ag::Tensor y = ag::layer_norm(x, options_.normalized_shape, weight_, bias_, options_.eps);
    if (detail::per_example_capture != nullptr) [[unlikely]]  // the composed form below (hooks) is not recorded
      detail::record_layer_norm(x, y, weight_, bias_, static_cast<std::int64_t>(options_.normalized_shape.size()),
                                options_.eps);
    return y;
  }
  // Composed, so that the scale point's value is the one the output is divided by. The op runs
  // first for its errors (shapes, dtypes; with eps = 0, a row of zero variance), which the
  // composed ops would not give.
  const auto n = static_cast<std::int64_t>(options_.normalized_shape.size());
  {
    const ag::NoGradGuard no_grad;
    (void)ag::layer_norm(x, options_.normalized_shape, weight_, bias_, options_.eps);
  }
  std::vector<std::int64_t> dims;
  for (std::int64_t d = x.dim() - n; d < x.dim(); ++d) dims.push_back(d);
  // A row far from 1 in magnitude (its squares would overflow or underflow) is first multiplied
  // by a power of two s that brings it near 1, exactly: y and the scale point are the same
  // functions of x, the point's value √(var + eps) = √(var(s·x) + eps·s²) / s.
  const ag::Tensor s = row_power_of_two(x, ag::shape_numel(options_.normalized_shape), n);
  const ag::Tensor xs = s.defined() ? ag::mul(x, s) : x;
  const ag::Tensor centred = ag::sub(xs, ag::mean(xs, dims, true));
  const ag::Tensor eps = s.defined() ? ag::mul(ag::square(s), options_.eps) : ag::Tensor();
  const ag::Tensor var = ag::mean(ag::square(centred), dims, true);
  const ag::Tensor scaled = ag::sqrt(s.defined() ? ag::add(var, eps) : ag::add(var, options_.eps));
  const ag::Tensor scale = at.run(0, s.defined() ? ag::div(scaled, s) : scaled);
  ag::Tensor y = ag::div(centred, s.defined() ? ag::mul(scale, s) : scale);
  if (weight_.defined()) y = ag::mul(y, weight_);
  if (bias_.defined()) y = ag::add(y, bias_);
  return at.run(1, y);
}

std::string LayerNorm::extra_repr() const {
  return fmt::format("{}, eps={}{}", ag::shape_str(options_.normalized_shape), options_.eps,
                     !options_.elementwise_affine ? ", elementwise_affine=false" : options_.bias ? "" : ", bias=false");
}

// ---- Sequential ----

ag::Tensor Sequential::forward(const ag::Tensor& x) const {
  ag::Tensor h = x;
  for (const auto& layer : layers_) h = layer(h);
  return h;
}

}  // namespace nn

namespace nn {

// ---- TransformerBlock ----

namespace {

// The block's hook points, in the order the forward reaches them; the attention-only form has
// the first five and resid_post.
enum BlockPoint : std::size_t { kResidPre, kQInput, kKInput, kVInput, kAttnOut, kResidMid, kMlpPre, kMlpHidden, kMlpOut };

}  // namespace

TransformerBlock::TransformerBlock(std::int64_t d_model, std::int64_t num_heads)
    : TransformerBlock(TransformerBlockOptions{.d_model = d_model, .num_heads = num_heads}) {}

TransformerBlock::TransformerBlock(const TransformerBlockOptions& options)
    : TransformerBlock(options, ag::default_generator()) {}

TransformerBlock::TransformerBlock(const TransformerBlockOptions& options, ag::Generator& gen)
    : Module("TransformerBlock"), options_(options) {
  if (options_.mlp)
    declare_hook_points({"resid_pre", "q_input", "k_input", "v_input", "attn_out", "resid_mid", "mlp_pre",
                         "mlp_hidden", "mlp_out", "resid_post"});
  else
    declare_hook_points({"resid_pre", "q_input", "k_input", "v_input", "attn_out", "resid_post"});
  if (options_.d_model <= 0) ag::fail("TransformerBlock", "d_model must be positive, got {}", options_.d_model);
  if (options_.d_ff == 0) options_.d_ff = 4 * options_.d_model;
  if (options_.d_ff < 0) ag::fail("TransformerBlock", "d_ff must be positive, got {}", options_.d_ff);
  const auto& o = options_;
  // bias = false: no bias anywhere, the LayerNorms' included (PyTorch's TransformerEncoderLayer(bias=False))
  if (!options_.layer_norm_bias) options_.layer_norm_bias = o.bias;
  LayerNormOptions ln{.normalized_shape = {o.d_model}, .eps = o.layer_norm_eps, .bias = *o.layer_norm_bias,
                      .dtype = o.dtype};
  const bool norm = o.normalization == Normalization::LayerNorm;
  if (norm) ln_1_ = register_module("ln_1", std::make_shared<LayerNorm>(ln));
  MultiHeadAttentionOptions mha;
  mha.embed_dim = o.d_model;
  mha.num_heads = o.num_heads;
  mha.dropout = o.dropout;
  mha.bias = o.bias;
  mha.dtype = o.dtype;
  attn_ = register_module("attn", std::make_shared<MultiHeadAttention>(mha, gen));
  if (!o.mlp) return;
  if (norm) ln_2_ = register_module("ln_2", std::make_shared<LayerNorm>(ln));
  fc_1_ = register_module("fc_1", std::make_shared<Linear>(LinearOptions{o.d_model, o.d_ff, o.bias, o.dtype}, gen));
  fc_2_ = register_module("fc_2", std::make_shared<Linear>(LinearOptions{o.d_ff, o.d_model, o.bias, o.dtype}, gen));
}

ag::Tensor TransformerBlock::forward(const ag::Tensor& x) const {
  AttentionOptions options;
  options.need_weights = false;
  return forward(x, options).output;
}

TransformerBlockOutput TransformerBlock::forward(const ag::Tensor& x, const AttentionOptions& options) const {
  // Each hook point returns its value unchanged (no call, no allocation) when it has no hook.
  const HookPoints& at = hook_points();
  const ag::Tensor x0 = at.run(kResidPre, x);  // (B, T, d_model)
  AttentionOutput a;
  const ag::Tensor q_in = at.run(kQInput, x0), k_in = at.run(kKInput, x0), v_in = at.run(kVInput, x0);
  if (!q_in.is_same(x0) || !k_in.is_same(x0) || !v_in.is_same(x0)) {  // an input replaced (or watched)
    std::vector<ag::Tensor> in = {q_in, k_in, v_in};
    // The three inputs go through ln_1 as one stack (..., 3, d_model), so that its points are
    // reached once per forward (ln_1.scale is then (..., 3, 1): q's, k's, v's).
    if (ln_1_) {
      const std::int64_t d = x0.dim() - 1;
      const ag::Tensor h = ln_1_->forward(ag::stack(in, d));
      for (std::int64_t i = 0; i < 3; ++i) in[static_cast<std::size_t>(i)] = ag::squeeze(ag::narrow(h, d, i, 1), d);
    }
    a = attn_->forward(in[0], in[1], in[2], options);
  } else {
    const ag::Tensor h = ln_1_ ? ln_1_->forward(x0) : x0;
    a = attn_->forward(h, h, h, options);
  }
  return {after_attention(x0, a.output), a.weights};
}

ag::Tensor TransformerBlock::after_attention(const ag::Tensor& x, const ag::Tensor& attn_out) const {
  const ag::Dtype dtype = attn_->W_O().dtype();
  if (!x.defined() || !attn_out.defined() || x.shape() != attn_out.shape() || x.dim() < 1 ||
      x.size(-1) != options_.d_model || x.dtype() != dtype || attn_out.dtype() != dtype)
    ag::fail("TransformerBlock::after_attention", "x and attn_out must be one shape (..., d_model = {}) of the block's "
             "dtype {}, got {} {} and {} {}", options_.d_model, ag::dtype_name(dtype),
             x.defined() ? ag::dtype_name(x.dtype()) : "", x.defined() ? ag::shape_str(x.shape()) : "undefined",
             attn_out.defined() ? ag::dtype_name(attn_out.dtype()) : "",
             attn_out.defined() ? ag::shape_str(attn_out.shape()) : "undefined");
  // Each hook point returns its value unchanged (no call, no allocation) when it has no hook.
  const HookPoints& at = hook_points();
  const std::size_t resid_post = at.names().size() - 1;
  const ag::Tensor x1 = ag::add(x, at.run(kAttnOut, attn_out));  // residual
  if (!options_.mlp) return at.run(resid_post, x1);
  const ag::Tensor x1h = at.run(kResidMid, x1);
  const ag::Tensor f = at.run(kMlpPre, fc_1_->forward(ln_2_ ? ln_2_->forward(x1h) : x1h));  // (..., d_ff)
  const auto approximate = options_.gelu_tanh ? ag::GeluApproximation::Tanh : ag::GeluApproximation::None;
  const ag::Tensor act = at.run(kMlpHidden, options_.gelu ? ag::gelu(f, approximate) : ag::relu(f));
  return at.run(resid_post, ag::add(x1h, at.run(kMlpOut, fc_2_->forward(act))));  // residual
}

ag::Tensor TransformerBlock::forward_last(const ag::Tensor& x) const {
  if (hook_count() != 0)
    ag::fail("TransformerBlock::forward_last", "the block has {} hook(s), which this partial forward would skip; use "
             "forward", hook_count());
  if (!x.defined() || x.dim() < 2 || x.dim() > 3 || x.size(-2) < 1 || x.size(-1) != options_.d_model)
    ag::fail("TransformerBlock::forward_last", "x must be (B, T, d_model = {}) or (T, d_model) with T >= 1, got {}",
             options_.d_model, x.defined() ? ag::shape_str(x.shape()) : "undefined");
  if (x.dim() == 2) return ag::squeeze(forward_rows(ag::unsqueeze(x, 0), {}, {}, 1).output, 0);
  return forward_rows(x, {}, {}, 1).output;
}

TransformerBlock::Rows TransformerBlock::forward_rows(const ag::Tensor& x_rows, const ag::Tensor& k_prev,
                                                      const ag::Tensor& v_prev, std::int64_t queries) const {
  constexpr std::string_view op = "TransformerBlock::forward_rows";
  if (hook_count() != 0)
    ag::fail(op, "the block has {} hook(s), which this partial forward would skip; use forward", hook_count());
  const std::int64_t E = options_.d_model;
  const ag::Dtype dtype = attn_->W_Q().dtype();
  if (!x_rows.defined() || x_rows.dim() != 3 || x_rows.size(2) != E || x_rows.dtype() != dtype)
    ag::fail(op, "x_rows must be (B, R, d_model = {}) of the block's dtype {}, got {} {}", E, ag::dtype_name(dtype),
             x_rows.defined() ? ag::dtype_name(x_rows.dtype()) : "",
             x_rows.defined() ? ag::shape_str(x_rows.shape()) : "undefined");
  const std::int64_t B = x_rows.size(0), R = x_rows.size(1);
  if (k_prev.defined() != v_prev.defined())
    ag::fail(op, "k_prev and v_prev come together: one is undefined and the other is not");
  const std::int64_t before = k_prev.defined() && k_prev.dim() == 3 ? k_prev.size(1) : 0, T = before + R;
  for (const ag::Tensor* t : {&k_prev, &v_prev})
    if (t->defined() && (t->dim() != 3 || t->size(0) != B || t->size(2) != E || t->size(1) != before ||
                         t->dtype() != x_rows.dtype()))
      ag::fail(op, "k_prev and v_prev must be (B = {}, rows before, d_model = {}) of x_rows' dtype {}, got {} {} and "
               "{} {}", B, E, ag::dtype_name(x_rows.dtype()), ag::dtype_name(k_prev.dtype()),
               ag::shape_str(k_prev.shape()), ag::dtype_name(v_prev.dtype()), ag::shape_str(v_prev.shape()));
  if (queries < 1 || queries > R)
    ag::fail(op, "queries = {} must be in 1 .. R = {} (the rows of x_rows {})", queries, R,
             ag::shape_str(x_rows.shape()));
  if (is_training() && options_.dropout > 0)
    ag::fail(op, "dropout {} would act in training mode, and this forward has none; call eval() first",
             options_.dropout);
  const MultiHeadAttention& a = *attn_;
  const ag::Tensor h = ln_1_ ? ln_1_->forward(x_rows) : x_rows;
  const ag::Tensor hq = queries == R ? h : ag::narrow(h, 1, R - queries, queries);
  Rows r;
  r.keys = ag::linear(h, a.W_K(), a.b_K());
  r.values = ag::linear(h, a.W_V(), a.b_V());
  if (before > 0) {
    r.keys = ag::cat({k_prev, r.keys}, 1);
    r.values = ag::cat({v_prev, r.values}, 1);
  }
  // Query i is row T-queries+i and sees keys 0 .. T-queries+i. The last row sees every key.
  ag::Tensor mask;
  if (queries > 1 && queries < T) {
    std::vector<double> m(static_cast<std::size_t>(queries * T), 0.0);
    for (std::int64_t i = 0; i < queries; ++i)
      for (std::int64_t j = T - queries + i + 1; j < T; ++j)
        m[static_cast<std::size_t>(i * T + j)] = -std::numeric_limits<double>::infinity();
    mask = ag::tensor(m, {queries, T}, x_rows.dtype());
  }
  r.z = ag::scaled_dot_product_attention_heads_last(
            ag::linear(hq, a.W_Q(), a.b_Q()), r.keys, r.values, a.num_heads(),
            {.need_weights = false, .attn_mask = mask, .is_causal = queries == T && queries > 1})
            .output;
  const ag::Tensor x_q = queries == R ? x_rows : ag::narrow(x_rows, 1, R - queries, queries);
  r.output = after_attention(x_q, ag::linear(r.z, a.W_O(), a.b_O()));
  return r;
}

namespace {
template <class M>
M& child(const std::shared_ptr<M>& m, const char* name, const char* why) {
  if (!m) ag::fail("TransformerBlock", "this block has no {} ({})", name, why);
  return *m;
}
}  // namespace

LayerNorm& TransformerBlock::ln_1() const { return child(ln_1_, "ln_1", "normalization is None"); }
LayerNorm& TransformerBlock::ln_2() const {
  return child(ln_2_, "ln_2", options_.mlp ? "normalization is None" : "it is attention-only");
}
Linear& TransformerBlock::fc_1() const { return child(fc_1_, "fc_1", "it is attention-only"); }
Linear& TransformerBlock::fc_2() const { return child(fc_2_, "fc_2", "it is attention-only"); }

std::string TransformerBlock::extra_repr() const {
  std::string s = options_.mlp ? fmt::format("d_model={}, num_heads={}, d_ff={}", options_.d_model, options_.num_heads,
                                             options_.d_ff)
                               : fmt::format("d_model={}, num_heads={}, attention-only", options_.d_model,
                                             options_.num_heads);
  if (options_.normalization == Normalization::None) s += ", normalization=none";
  return s;
}

}  // namespace nn
