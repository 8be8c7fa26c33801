#include "nn/layers.hpp"

#include <array>
#include <cmath>
#include <memory>
#include <span>

#include "nn/init.hpp"

namespace nn {

// ---- Embedding ----

Embedding::Embedding(std::int64_t num_embeddings, std::int64_t embedding_dim)
    : Embedding(EmbeddingOptions{num_embeddings, embedding_dim}) {}

Embedding::Embedding(const EmbeddingOptions& options) : Embedding(options, ag::default_generator()) {}

Embedding::Embedding(const EmbeddingOptions& options, ag::Generator& gen) : Module("Embedding"), options_(options) {
  if (options.num_embeddings <= 0 || options.embedding_dim <= 0)
    ag::fail("Embedding", "num_embeddings and embedding_dim must be positive, got {} and {}", options.num_embeddings,
             options.embedding_dim);
  weight_ = register_parameter("weight", ag::randn({options.num_embeddings, options.embedding_dim}, options.dtype, gen));
}

ag::Tensor Embedding::forward(const ag::Tensor& indices) const { return ag::embedding(weight_, indices); }

std::string Embedding::extra_repr() const {
  return fmt::format("{}, {}", options_.num_embeddings, options_.embedding_dim);
}

// ---- LayerNorm ----

ag::Tensor layer_norm(const ag::Tensor& x, const ag::Shape& normalized_shape, const ag::Tensor& weight,
                      const ag::Tensor& bias, double eps) {
  constexpr const char* op = "layer_norm";
  if (!x.defined()) ag::fail(op, "input is undefined");
  const std::size_t k = normalized_shape.size();
  if (k == 0) ag::fail(op, "normalized_shape is empty");
  if (x.dim() < static_cast<std::int64_t>(k) ||
      !std::equal(normalized_shape.begin(), normalized_shape.end(), x.shape().end() - static_cast<std::ptrdiff_t>(k)))
    ag::fail(op, "input {} does not end with normalized_shape {}", ag::shape_str(x.shape()),
             ag::shape_str(normalized_shape));
  for (const auto* p : {&weight, &bias}) {
    if (!p->defined()) continue;
    const char* what = p == &weight ? "weight" : "bias";
    if (p->shape() != normalized_shape)
      ag::fail(op, "{} {} must have normalized_shape {}", what, ag::shape_str(p->shape()), ag::shape_str(normalized_shape));
    if (p->dtype() != x.dtype())
      ag::fail(op, "dtypes differ: input {} and {} {}", ag::dtype_name(x.dtype()), what, ag::dtype_name(p->dtype()));
  }
  if (!(eps >= 0.0)) ag::fail(op, "eps must be >= 0, got {}", eps);
  const std::int64_t D = ag::shape_numel(normalized_shape);
  const std::int64_t N = D == 0 ? 0 : x.numel() / D;

  // Per row: the mean and 1/√(var + eps), in float64 (a tensor, so its buffer is reused warm).
  const ag::Tensor stats = ag::Tensor::empty({N, 2}, ag::Dtype::Float64);
  double* st = stats.data<double>();
  ag::Tensor y = ag::Tensor::empty(x.shape(), x.dtype());
  ag::dispatch(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    using Row = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;
    using RowOut = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>;
    const T* xs = x.data<T>();
    T* ys = y.data<T>();
    const T* w = weight.defined() ? weight.data<T>() : nullptr;
    const T* b = bias.defined() ? bias.data<T>() : nullptr;
    for (std::int64_t n = 0; n < N; ++n) {
      Row row(xs + n * D, D);
      RowOut out(ys + n * D, D);
      // mean and biased variance accumulated in double: stable for float32 rows
      const double mu = row.template cast<double>().mean();
      const double var = (row.template cast<double>() - mu).square().mean();
      const double rstd = 1.0 / std::sqrt(var + eps);
      st[2 * n] = mu;
      st[2 * n + 1] = rstd;
      out = (row - static_cast<T>(mu)) * static_cast<T>(rstd);
      if (w) out *= Row(w, D);
      if (b) out += Row(b, D);
    }
  });
  std::array<ag::Tensor, 3> all_inputs{x};
  std::size_t n_inputs = 1;
  if (weight.defined()) all_inputs[n_inputs++] = weight;
  if (bias.defined()) all_inputs[n_inputs++] = bias;
  const std::span<const ag::Tensor> inputs(all_inputs.data(), n_inputs);
  if (!ag::needs_grad(inputs)) return y;

  const bool has_weight = weight.defined(), has_bias = bias.defined();
  // y = x̂·w + b, x̂ = (x − μ)·r  =>  db = Σ_rows dy,  dw = Σ_rows dy·x̂,
  //                                  dx = r · (dx̂ − mean(dx̂) − x̂ · mean(dx̂·x̂)),  dx̂ = dy·w
  ag::record(
      "layer_norm", inputs, std::span<const ag::Tensor>(&y, 1),
      [stats, saved_x = ag::SavedTensor(x), saved_w = has_weight ? ag::SavedTensor(weight) : ag::SavedTensor(),
       has_weight, has_bias, normalized_shape, D, N](const ag::TensorList& g, const ag::Node& node) {
        const ag::Tensor xv = saved_x.get("layer_norm");
        const double* st = stats.data<double>();
        const ag::Tensor wv = has_weight ? saved_w.get("layer_norm") : ag::Tensor();
        const bool need_x = node.needs_input_grad(0);
        const bool need_w = has_weight && node.needs_input_grad(1);
        const bool need_b = has_bias && node.needs_input_grad(has_weight ? 2 : 1);
        ag::Tensor dx, dw, db;
        if (need_x) dx = ag::Tensor::empty(xv.shape(), xv.dtype());
        if (need_w) dw = ag::zeros(wv.shape(), wv.dtype());
        if (need_b) db = ag::zeros(normalized_shape, xv.dtype());
        ag::dispatch(xv.dtype(), [&](auto zero) {
          using T = decltype(zero);
          using Arr = Eigen::Array<T, Eigen::Dynamic, 1>;
          using Row = Eigen::Map<const Arr>;
          using RowOut = Eigen::Map<Arr>;
          const T* xs = xv.data<T>();
          const T* dys = g[0].data<T>();
          // x̂ and dx̂ of one row, in a pooled buffer (no allocation once warm)
          const ag::Tensor scratch = ag::Tensor::empty({2, D}, xv.dtype());
          RowOut xhat(scratch.data<T>(), D), dxhat(scratch.data<T>() + D, D);
          for (std::int64_t n = 0; n < N; ++n) {
            Row row(xs + n * D, D), dy(dys + n * D, D);
            const T mu = static_cast<T>(st[2 * n]);
            const T r = static_cast<T>(st[2 * n + 1]);
            xhat = (row - mu) * r;
            if (need_b) RowOut(db.data<T>(), D) += dy;
            if (need_w) RowOut(dw.data<T>(), D) += dy * xhat;
            if (need_x) {
              if (has_weight) {
                dxhat = dy * Row(wv.data<T>(), D);
              } else {
                dxhat = dy;
              }
              const T mean_dxhat = dxhat.mean();
              const T mean_dxhat_xhat = (dxhat * xhat).mean();
              RowOut(dx.data<T>() + n * D, D) = r * (dxhat - mean_dxhat - xhat * mean_dxhat_xhat);
            }
          }
        });
        ag::GradList grads{dx};
        if (has_weight) grads.push_back(dw);
        if (has_bias) grads.push_back(db);
        return grads;
      });
  return y;
}

LayerNorm::LayerNorm(std::int64_t normalized_size, double eps)
    : LayerNorm(LayerNormOptions{.normalized_shape = {normalized_size}, .eps = eps}) {}

LayerNorm::LayerNorm(const LayerNormOptions& options) : Module("LayerNorm"), options_(options) {
  if (options.normalized_shape.empty()) ag::fail("LayerNorm", "normalized_shape is empty");
  for (auto d : options.normalized_shape)
    if (d <= 0) ag::fail("LayerNorm", "normalized_shape {} must be positive", ag::shape_str(options.normalized_shape));
  if (!(options.eps >= 0.0)) ag::fail("LayerNorm", "eps must be >= 0, got {}", options.eps);
  if (options.elementwise_affine) {
    weight_ = register_parameter("weight", ag::ones(options.normalized_shape, options.dtype));
    if (options.bias) bias_ = register_parameter("bias", ag::zeros(options.normalized_shape, options.dtype));
  }
}

ag::Tensor LayerNorm::forward(const ag::Tensor& x) const {
  return layer_norm(x, options_.normalized_shape, weight_, bias_, options_.eps);
}

std::string LayerNorm::extra_repr() const {
  return fmt::format("{}, eps={}{}", ag::shape_str(options_.normalized_shape), options_.eps,
                     options_.elementwise_affine ? "" : ", elementwise_affine=false");
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

TransformerBlock::TransformerBlock(std::int64_t d_model, std::int64_t num_heads)
    : TransformerBlock(TransformerBlockOptions{.d_model = d_model, .num_heads = num_heads}) {}

TransformerBlock::TransformerBlock(const TransformerBlockOptions& options)
    : TransformerBlock(options, ag::default_generator()) {}

TransformerBlock::TransformerBlock(const TransformerBlockOptions& options, ag::Generator& gen)
    : Module("TransformerBlock"), options_(options) {
  if (options_.d_model <= 0) ag::fail("TransformerBlock", "d_model must be positive, got {}", options_.d_model);
  if (options_.d_ff == 0) options_.d_ff = 4 * options_.d_model;
  if (options_.d_ff < 0) ag::fail("TransformerBlock", "d_ff must be positive, got {}", options_.d_ff);
  const auto& o = options_;
  LayerNormOptions ln{.normalized_shape = {o.d_model}, .eps = o.layer_norm_eps, .dtype = o.dtype};
  ln_1_ = register_module("ln_1", std::make_shared<LayerNorm>(ln));
  MultiHeadAttentionOptions mha;
  mha.embed_dim = o.d_model;
  mha.num_heads = o.num_heads;
  mha.dropout = o.dropout;
  mha.bias = o.bias;
  mha.dtype = o.dtype;
  attn_ = register_module("attn", std::make_shared<MultiHeadAttention>(mha, gen));
  ln_2_ = register_module("ln_2", std::make_shared<LayerNorm>(ln));
  fc_1_ = register_module("fc_1", std::make_shared<Linear>(LinearOptions{o.d_model, o.d_ff, o.bias, o.dtype}, gen));
  fc_2_ = register_module("fc_2", std::make_shared<Linear>(LinearOptions{o.d_ff, o.d_model, o.bias, o.dtype}, gen));
}

ag::Tensor TransformerBlock::forward(const ag::Tensor& x) const {
  AttentionOptions options;
  options.need_weights = false;
  return forward(x, options).output;
}

TransformerBlockOutput TransformerBlock::forward(const ag::Tensor& x, const AttentionOptions& options) const {
  const ag::Tensor h = ln_1_->forward(x);                       // (B, T, d_model)
  AttentionOutput a = attn_->forward(h, h, h, options);         // (B, T, d_model)
  const ag::Tensor x1 = ag::add(x, a.output);                   // residual
  const ag::Tensor m = ln_2_->forward(x1);                      // (B, T, d_model)
  const ag::Tensor f = fc_1_->forward(m);                       // (B, T, d_ff)
  const ag::Tensor act = options_.gelu ? ag::gelu(f) : ag::relu(f);
  return {ag::add(x1, fc_2_->forward(act)), a.weights};        // residual
}

std::string TransformerBlock::extra_repr() const {
  return fmt::format("d_model={}, num_heads={}, d_ff={}", options_.d_model, options_.num_heads, options_.d_ff);
}

}  // namespace nn
