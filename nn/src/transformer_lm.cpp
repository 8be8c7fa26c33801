#include "nn/transformer_lm.hpp"

#include <algorithm>
#include <cmath>
#include <map>

#include <cstdint>

#include <nlohmann/json.hpp>

#include "nn/checkpoint.hpp"
#include "nn/init.hpp"
#include "per_example_capture.hpp"

namespace nn {

namespace {

constexpr const char* kOp = "TransformerLM";
enum ModelPoint : std::size_t { kEmbedOut, kPosEmbedOut, kLogits };

}  // namespace

void TransformerLMConfig::check() const {
  const auto positive = [](const char* name, std::int64_t v) {
    if (v <= 0) ag::fail(kOp, "{} must be positive, got {}", name, v);
  };
  positive("n_layers", n_layers);
  positive("d_model", d_model);
  positive("n_heads", n_heads);
  positive("d_vocab", d_vocab);
  positive("n_ctx", n_ctx);
  if (d_vocab_out < 0) ag::fail(kOp, "d_vocab_out must be positive, or 0 for d_vocab, got {}", d_vocab_out);
  if (tied_embeddings && d_vocab_out != 0 && d_vocab_out != d_vocab)
    ag::fail(kOp, "tied embeddings need d_vocab_out = d_vocab, got d_vocab_out {} and d_vocab {}", d_vocab_out,
             d_vocab);
  if (d_mlp < 0) ag::fail(kOp, "d_mlp must be positive, or 0 for attention-only blocks, got {}", d_mlp);
  if (d_head < 0) ag::fail(kOp, "d_head must be positive, or 0 for d_model / n_heads, got {}", d_head);
  if (d_model % n_heads != 0) ag::fail(kOp, "d_model {} is not divisible by n_heads {}", d_model, n_heads);
  if (d_head != 0 && (d_head > d_model || d_head * n_heads != d_model))  // d_head ≤ d_model: no overflow
    ag::fail(kOp, "d_head {} times n_heads {} is not d_model {} (headgrad's heads split d_model)", d_head, n_heads,
             d_model);
  if (!(layer_norm_eps >= 0.0) || !std::isfinite(layer_norm_eps))
    ag::fail(kOp, "layer_norm_eps must be finite and >= 0, got {}", layer_norm_eps);
  if (!ag::is_floating(dtype)) ag::fail(kOp, "dtype must be Float32 or Float64, got {}", ag::dtype_name(dtype));
  if (activation != Activation::Gelu && activation != Activation::GeluTanh && activation != Activation::Relu)
    ag::fail(kOp, "unknown activation {} (Gelu, GeluTanh or Relu)", static_cast<int>(activation));
  if (normalization != Normalization::LayerNorm && normalization != Normalization::None)
    ag::fail(kOp, "unknown normalization {} (LayerNorm or None)", static_cast<int>(normalization));
  if (positional_embedding != PositionalEmbedding::Learned && positional_embedding != PositionalEmbedding::None)
    ag::fail(kOp, "unknown positional_embedding {} (Learned or None)", static_cast<int>(positional_embedding));
  // The parameter count, refused past 2^40 (4 TiB of float32) before anything is allocated, so
  // that a mistyped size gets this message instead of std::bad_alloc or an endless allocation.
  constexpr std::int64_t kLimit = std::int64_t{1} << 40;
  const auto times = [&](std::int64_t a, std::int64_t b) {
    std::int64_t r = 0;
    return __builtin_mul_overflow(a, b, &r) || r > kLimit ? kLimit + 1 : r;
  };
  // Every term is at most kLimit + 1, so these sums of a few cannot overflow.
  const std::int64_t E = d_model, M = std::min(d_mlp, kLimit + 1);
  const std::int64_t per_block =
      std::min(kLimit + 1, times(4, times(E, E)) + times(2, times(E, M)) + times(8, E) + M);
  std::int64_t total = std::min(kLimit + 1, times(n_layers, per_block));
  const std::int64_t unembed = tied_embeddings ? 0 : times(d_vocab_out == 0 ? d_vocab : d_vocab_out, E + 1);
  total = std::min(kLimit + 1, total + times(d_vocab, E) + unembed + times(n_ctx, E));
  if (total > kLimit)
    ag::fail(kOp, "n_layers {}, d_model {}, d_mlp {}, d_vocab {}, n_ctx {} need more than 2^40 parameters", n_layers,
             d_model, d_mlp, d_vocab, n_ctx);
}

TransformerLM::TransformerLM(const TransformerLMConfig& config) : TransformerLM(config, ag::default_generator()) {}

TransformerLM::TransformerLM(const TransformerLMConfig& config, ag::Generator& gen)
    : Module("TransformerLM"), config_(config) {
  config_.check();
  if (config_.d_head == 0) config_.d_head = config_.d_model / config_.n_heads;
  if (config_.d_vocab_out == 0) config_.d_vocab_out = config_.d_vocab;
  declare_hook_points({"embed_out", "pos_embed_out", "logits"});
  build(gen);
}

void TransformerLM::build(ag::Generator& gen) {
  const auto& c = config_;
  const bool norm = c.normalization == Normalization::LayerNorm;
  embed_ = register_module("embed", std::make_shared<Embedding>(EmbeddingOptions{c.d_vocab, c.d_model, c.dtype}, gen));
  if (c.positional_embedding == PositionalEmbedding::Learned)
    pos_embed_ =
        register_module("pos_embed", std::make_shared<Embedding>(EmbeddingOptions{c.n_ctx, c.d_model, c.dtype}, gen));
  blocks_ = register_module("blocks", std::make_shared<ModuleList>());
  TransformerBlockOptions b;
  b.d_model = c.d_model;
  b.num_heads = c.n_heads;
  b.d_ff = c.d_mlp == 0 ? c.d_model : c.d_mlp;
  b.mlp = c.d_mlp != 0;
  b.gelu = c.activation != Activation::Relu;
  b.gelu_tanh = c.activation == Activation::GeluTanh;
  b.normalization = c.normalization;
  b.layer_norm_eps = c.layer_norm_eps;
  b.dtype = c.dtype;
  for (std::int64_t i = 0; i < c.n_layers; ++i) blocks_->push_back(std::make_shared<TransformerBlock>(b, gen));
  if (norm)
    ln_final_ = register_module(
        "ln_final", std::make_shared<LayerNorm>(LayerNormOptions{.normalized_shape = {c.d_model},
                                                                  .eps = c.layer_norm_eps, .dtype = c.dtype}));
  if (!c.tied_embeddings)
    unembed_ = register_module("unembed", std::make_shared<Linear>(LinearOptions{c.d_model, c.d_vocab_out, true, c.dtype}, gen));
  if (pos_embed_) positions_ = ag::arange(std::int64_t{0}, c.n_ctx, std::int64_t{1}, ag::Dtype::Int64);
  // TransformerLens's default initialisation.
  ag::NoGradGuard no_grad;
  const double std = 0.8 / std::sqrt(static_cast<double>(c.d_model));
  for (auto& [name, p] : named_parameters()) {
    const bool gain = name.find("ln_") != std::string::npos && name.ends_with(".weight");
    if (gain)
      init::ones_(p);
    else if (p.dim() >= 2)
      init::normal_(p, 0.0, std, gen);
    else
      init::zeros_(p);
  }
}

TransformerBlock& TransformerLM::block(std::int64_t layer) const {
  if (layer < 0 || layer >= config_.n_layers)
    ag::fail(kOp, "layer {} is out of range for a model of {} layers", layer, config_.n_layers);
  return blocks_->at<TransformerBlock>(static_cast<std::size_t>(layer));
}

Embedding& TransformerLM::pos_embed() const {
  if (!pos_embed_) ag::fail(kOp, "this model has no learned positional embedding");
  return *pos_embed_;
}
LayerNorm& TransformerLM::ln_final() const {
  if (!ln_final_) ag::fail(kOp, "this model has no ln_final (normalization is None)");
  return *ln_final_;
}
Linear& TransformerLM::unembed_layer() const {
  if (!unembed_) ag::fail(kOp, "this model has no unembed layer: its embeddings are tied (W_U is embed.weightᵀ)");
  return *unembed_;
}
ag::Tensor TransformerLM::W_U() const {
  return unembed_ ? ag::Tensor(unembed_->weight()) : ag::transpose(embed_->weight(), 0, 1);
}
ag::Tensor TransformerLM::b_U() const { return unembed_ ? ag::Tensor(unembed_->bias()) : ag::Tensor(); }

ag::Tensor TransformerLM::embed_tokens(const ag::Tensor& tokens) const {
  if (!tokens.defined()) ag::fail(kOp, "tokens are undefined");
  if (tokens.dim() != 2)
    ag::fail(kOp, "tokens must be (B, T) or (T), got shape {}", ag::shape_str(tokens.shape()));
  const std::int64_t B = tokens.size(0), T = tokens.size(1);
  if (T < 1 || T > config_.n_ctx)
    ag::fail(kOp, "tokens of shape {}: T = {} must be in 1 .. n_ctx = {}", ag::shape_str(tokens.shape()), T,
             config_.n_ctx);
  const HookPoints& at = hook_points();
  ag::Tensor x = at.run(kEmbedOut, embed_->forward(tokens));  // (B, T, E)
  if (pos_embed_) {
    ag::Tensor positions = T == config_.n_ctx ? positions_ : ag::narrow(positions_, 0, 0, T);  // (T)
    // Per-example gradients (nn/per_example.hpp) need each example's own lookup: the positions
    // repeated for the batch, (B, T), the same values.
    if (detail::per_example_capture != nullptr) [[unlikely]]
      positions = ag::expand(ag::unsqueeze(positions, 0), {B, T});
    ag::Tensor p = pos_embed_->forward(positions);  // (T, E), or (B, T, E) with the positions repeated
    if (at.hooked(kPosEmbedOut)) p = at.run(kPosEmbedOut, ag::expand(p, {B, T, config_.d_model}));
    x = ag::add(x, p);
  }
  return x;
}

ag::Tensor TransformerLM::run_blocks(ag::Tensor x, std::int64_t from, std::int64_t to) const {
  AttentionOptions options;
  options.is_causal = true;
  options.need_weights = false;
  for (std::int64_t i = from; i < to; ++i) x = block(i).forward(x, options).output;
  return x;
}

ag::Tensor TransformerLM::unembed(const ag::Tensor& x) const {
  const ag::Tensor h = ln_final_ ? ln_final_->forward(x) : x;
  const ag::Tensor logits = unembed_ ? unembed_->forward(h) : ag::matmul(h, ag::transpose(embed_->weight(), 0, 1));
  return hook_points().run(kLogits, logits);
}

namespace {
// (T) -> (1, T), and the logits back: the model works on batches.
ag::Tensor as_batch(const ag::Tensor& tokens) {
  if (tokens.defined() && tokens.dim() == 1) return ag::unsqueeze(tokens, 0);
  return tokens;
}
ag::Tensor as_given(const ag::Tensor& tokens, const ag::Tensor& out) {
  return tokens.dim() == 1 ? ag::squeeze(out, 0) : out;
}
}  // namespace

ag::Tensor TransformerLM::forward(const ag::Tensor& tokens) const {
  const ag::Tensor t = as_batch(tokens);
  return as_given(tokens, unembed(run_blocks(embed_tokens(t), 0, config_.n_layers)));
}

ag::Tensor TransformerLM::forward_last(const ag::Tensor& tokens) const {
  const ag::Tensor t = as_batch(tokens);
  ag::Tensor logits;
  if (hook_count() != 0) {
    logits = forward(t);
    logits = ag::narrow(logits, 1, logits.size(1) - 1, 1);
  } else {
    const ag::Tensor x = run_blocks(embed_tokens(t), 0, config_.n_layers - 1);
    logits = unembed(block(config_.n_layers - 1).forward_last(x));
  }
  return as_given(tokens, ag::reshape(logits, {logits.size(0), logits.size(2)}));
}

ag::Tensor TransformerLM::loss(const ag::Tensor& tokens) const {
  const ag::Tensor t = as_batch(tokens);
  if (t.defined() && t.dim() == 2 && t.size(0) == 0)
    ag::fail("TransformerLM::loss", "tokens of shape {}: an empty batch has no loss (the mean over no positions)",
             ag::shape_str(tokens.shape()));
  if (t.defined() && t.dim() == 2 && t.size(1) < 2)
    ag::fail("TransformerLM::loss", "tokens of shape {}: next-token prediction needs T >= 2",
             ag::shape_str(tokens.shape()));
  const ag::Tensor logits = unembed(run_blocks(embed_tokens(t), 0, config_.n_layers));
  const std::int64_t T = t.size(1);
  return ag::cross_entropy(ag::narrow(logits, 1, 0, T - 1), ag::narrow(t, 1, 1, T - 1));
}

ag::Tensor TransformerLM::residual_at(const ag::Tensor& tokens, std::int64_t layer) const {
  if (layer < 0 || layer > config_.n_layers)
    ag::fail("TransformerLM::residual_at", "layer {} is out of range 0 .. {}", layer, config_.n_layers);
  const ag::Tensor t = as_batch(tokens);
  return as_given(tokens, run_blocks(embed_tokens(t), 0, layer));
}

ag::Tensor TransformerLM::forward_from(std::int64_t layer, const ag::Tensor& residual) const {
  if (layer < 0 || layer > config_.n_layers)
    ag::fail("TransformerLM::forward_from", "layer {} is out of range 0 .. {}", layer, config_.n_layers);
  if (!residual.defined() || (residual.dim() != 3 && residual.dim() != 2) || residual.size(-1) != config_.d_model ||
      residual.size(-2) > config_.n_ctx)
    ag::fail("TransformerLM::forward_from", "residual of shape {} is not (B, T, d_model = {}) with T <= n_ctx = {}",
             residual.defined() ? ag::shape_str(residual.shape()) : "undefined", config_.d_model, config_.n_ctx);
  if (residual.dtype() != embed_->weight().dtype())
    ag::fail("TransformerLM::forward_from", "residual is {} but the model's parameters are {}",
             ag::dtype_name(residual.dtype()), ag::dtype_name(embed_->weight().dtype()));
  const ag::Tensor r = residual.dim() == 2 ? ag::unsqueeze(residual, 0) : residual;
  const ag::Tensor out = unembed(run_blocks(r, layer, config_.n_layers));
  return residual.dim() == 2 ? ag::squeeze(out, 0) : out;
}

std::string TransformerLM::extra_repr() const {
  const auto& c = config_;
  return fmt::format("n_layers={}, d_model={}, n_heads={}, d_head={}, d_mlp={}, d_vocab={}, {}n_ctx={}{}{}{}",
                     c.n_layers, c.d_model, c.n_heads, c.d_head, c.d_mlp, c.d_vocab,
                     c.d_vocab_out != c.d_vocab ? fmt::format("d_vocab_out={}, ", c.d_vocab_out) : "", c.n_ctx,
                     c.normalization == Normalization::None ? ", normalization=none" : "",
                     c.positional_embedding == PositionalEmbedding::None ? ", positional_embedding=none" : "",
                     c.tied_embeddings ? ", tied_embeddings=true" : "");
}

// ---- TransformerLens's layout ----

namespace {

// One of our parameters under TL's name, and how its shape changes between the layouts.
enum class Layout { Same, HeadsColumns, HeadsRows, HeadsBias };

struct TlEntry {
  std::string ours, theirs;
  Layout layout = Layout::Same;
};

std::vector<TlEntry> tl_entries(const TransformerLM& model) {
  const auto& c = model.config();
  std::vector<TlEntry> e;
  e.push_back({"embed.weight", "embed.W_E"});
  if (c.positional_embedding == PositionalEmbedding::Learned) e.push_back({"pos_embed.weight", "pos_embed.W_pos"});
  const bool norm = c.normalization == Normalization::LayerNorm;
  for (std::int64_t i = 0; i < c.n_layers; ++i) {
    const std::string o = fmt::format("blocks.{}.", i);
    if (norm) {
      e.push_back({o + "ln_1.weight", o + "ln1.w"});
      e.push_back({o + "ln_1.bias", o + "ln1.b"});
    }
    for (const char* m : {"Q", "K", "V"}) e.push_back({o + "attn.W_" + m, o + "attn.W_" + m, Layout::HeadsColumns});
    e.push_back({o + "attn.W_O", o + "attn.W_O", Layout::HeadsRows});
    for (const char* m : {"Q", "K", "V"}) e.push_back({o + "attn.b_" + m, o + "attn.b_" + m, Layout::HeadsBias});
    e.push_back({o + "attn.b_O", o + "attn.b_O"});
    if (c.d_mlp != 0) {
      if (norm) {
        e.push_back({o + "ln_2.weight", o + "ln2.w"});
        e.push_back({o + "ln_2.bias", o + "ln2.b"});
      }
      e.push_back({o + "fc_1.weight", o + "mlp.W_in"});
      e.push_back({o + "fc_1.bias", o + "mlp.b_in"});
      e.push_back({o + "fc_2.weight", o + "mlp.W_out"});
      e.push_back({o + "fc_2.bias", o + "mlp.b_out"});
    }
  }
  if (norm) {
    e.push_back({"ln_final.weight", "ln_final.w"});
    e.push_back({"ln_final.bias", "ln_final.b"});
  }
  if (!c.tied_embeddings) {
    e.push_back({"unembed.weight", "unembed.W_U"});
    e.push_back({"unembed.bias", "unembed.b_U"});
  }
  return e;
}

// Ours -> TL's shape: (E, H·d) -> (H, E, d); (H·d, E) -> (H, d, E); (H·d) -> (H, d).
ag::Tensor to_tl(const ag::Tensor& p, Layout layout, std::int64_t H) {
  switch (layout) {
    case Layout::HeadsColumns: return ag::permute(ag::reshape(p, {p.size(0), H, p.size(1) / H}), {1, 0, 2}).clone();
    case Layout::HeadsRows: return ag::reshape(p, {H, p.size(0) / H, p.size(1)}).clone();
    case Layout::HeadsBias: return ag::reshape(p, {H, p.size(0) / H}).clone();
    case Layout::Same: break;
  }
  return p.clone();
}

ag::Shape tl_shape(const ag::Shape& s, Layout layout, std::int64_t H) {
  switch (layout) {
    case Layout::HeadsColumns: return {H, s[0], s[1] / H};
    case Layout::HeadsRows: return {H, s[0] / H, s[1]};
    case Layout::HeadsBias: return {H, s[0] / H};
    case Layout::Same: break;
  }
  return s;
}

// TL's shape -> ours (the inverse of to_tl).
ag::Tensor from_tl(const ag::Tensor& t, Layout layout) {
  switch (layout) {
    case Layout::HeadsColumns: return ag::reshape(ag::permute(t, {1, 0, 2}), {t.size(1), t.size(0) * t.size(2)});
    case Layout::HeadsRows: return ag::reshape(t, {t.size(0) * t.size(1), t.size(2)});
    case Layout::HeadsBias: return ag::reshape(t, {t.size(0) * t.size(1)});
    case Layout::Same: break;
  }
  return t;
}

std::map<std::string, ag::Tensor> parameters_by_name(const TransformerLM& model) {
  std::map<std::string, ag::Tensor> m;
  for (const auto& [name, p] : model.named_parameters()) m.emplace(name, p);
  return m;
}

}  // namespace

NamedTensors transformer_lens_state_dict(const TransformerLM& model) {
  ag::NoGradGuard no_grad;
  const auto& c = model.config();
  const auto params = parameters_by_name(model);
  NamedTensors out;
  for (const auto& e : tl_entries(model)) out.emplace_back(e.theirs, to_tl(params.at(e.ours), e.layout, c.n_heads));
  if (c.positional_embedding == PositionalEmbedding::None)
    out.emplace_back("pos_embed.W_pos", ag::zeros({c.n_ctx, c.d_model}, c.dtype));
  if (c.tied_embeddings) {
    out.emplace_back("unembed.W_U", ag::transpose(model.embed().weight(), 0, 1).clone());
    out.emplace_back("unembed.b_U", ag::zeros({c.d_vocab_out}, c.dtype));
  }
  return out;
}

void load_transformer_lens_state_dict(TransformerLM& model, const NamedTensors& tensors) {
  constexpr const char* op = "load_transformer_lens_state_dict";
  const auto& c = model.config();
  std::map<std::string, ag::Tensor> given;
  for (const auto& [name, t] : tensors) {
    if (!given.emplace(name, t).second) ag::fail(op, "tensor '{}' is given twice", ag::printable(name));
  }
  const auto params = parameters_by_name(model);
  std::vector<std::pair<ag::Tensor, ag::Tensor>> copies;  // (our parameter, its new value), all checked first
  std::map<std::string, bool> used;
  const auto take = [&](const std::string& name, const ag::Shape& shape) -> const ag::Tensor& {
    const auto it = given.find(name);
    if (it == given.end()) ag::fail(op, "tensor '{}' {} is missing", name, ag::shape_str(shape));
    if (!it->second.defined() || it->second.shape() != shape)
      ag::fail(op, "tensor '{}' has shape {}, the model needs {}", name,
               it->second.defined() ? ag::shape_str(it->second.shape()) : "undefined", ag::shape_str(shape));
    if (!ag::is_floating(it->second.dtype()))
      ag::fail(op, "tensor '{}' is {}, not Float32 or Float64", name, ag::dtype_name(it->second.dtype()));
    used[name] = true;
    return it->second;
  };
  for (const auto& e : tl_entries(model)) {
    const ag::Tensor& p = params.at(e.ours);
    const ag::Tensor& t = take(e.theirs, tl_shape(p.shape(), e.layout, c.n_heads));
    copies.emplace_back(p, from_tl(t, e.layout));
  }
  const auto must_be_zero = [&](const std::string& name, const ag::Shape& shape, const char* why) {
    const ag::Tensor& t = take(name, shape);
    if (ag::max(ag::abs(t.to(ag::Dtype::Float64))).item() != 0.0)
      ag::fail(op, "tensor '{}' is not zero, and this model {}", name, why);
  };
  if (c.positional_embedding == PositionalEmbedding::None)
    must_be_zero("pos_embed.W_pos", {c.n_ctx, c.d_model}, "has no positional embedding");
  if (c.tied_embeddings) {
    const ag::Tensor& W_U = take("unembed.W_U", {c.d_model, c.d_vocab});
    const ag::Tensor& W_E = given.at("embed.W_E");
    if (ag::max(ag::abs(ag::sub(W_U.to(ag::Dtype::Float64), ag::transpose(W_E, 0, 1).to(ag::Dtype::Float64)))).item() != 0.0)
      ag::fail(op, "tensor 'unembed.W_U' is not embed.W_Eᵀ, and this model's embeddings are tied");
    must_be_zero("unembed.b_U", {c.d_vocab}, "has tied embeddings without an unembedding bias");
  }
  for (const auto& [name, t] : given) {
    if (used.count(name)) continue;
    // TL's buffers, of one of this model's layers: "blocks.<l>.attn.mask" or ".attn.IGNORE".
    bool buffer = false;
    for (std::int64_t l = 0; l < c.n_layers && !buffer; ++l) {
      const std::string prefix = fmt::format("blocks.{}.attn.", l);
      buffer = name == prefix + "mask" || name == prefix + "IGNORE";
    }
    if (!buffer)
      ag::fail(op, "tensor '{}' is not a parameter of this model ({} layers, d_mlp {}{})", ag::printable(name),
               c.n_layers, c.d_mlp, c.normalization == Normalization::None ? ", no LayerNorm" : "");
  }
  ag::NoGradGuard no_grad;
  for (auto& [p, v] : copies) {
    ag::Tensor target = p;
    target.copy_(v);
  }
}

void save_transformer_lens_state_dict(const TransformerLM& model, const std::string& path) {
  save_safetensors(path, transformer_lens_state_dict(model));
}

void load_transformer_lens_state_dict(TransformerLM& model, const std::string& path) {
  load_transformer_lens_state_dict(model, load_safetensors(path).tensors);
}

std::string transformer_lens_config_json(const TransformerLMConfig& config) {
  config.check();
  nlohmann::ordered_json j;
  j["n_layers"] = config.n_layers;
  j["d_model"] = config.d_model;
  j["n_heads"] = config.n_heads;
  j["d_head"] = config.d_model / config.n_heads;
  j["d_vocab"] = config.d_vocab;
  if (config.d_vocab_out != 0 && config.d_vocab_out != config.d_vocab) j["d_vocab_out"] = config.d_vocab_out;
  j["n_ctx"] = config.n_ctx;
  if (config.d_mlp == 0)
    j["attn_only"] = true;
  else
    j["d_mlp"] = config.d_mlp;
  j["act_fn"] = config.activation == Activation::Relu       ? "relu"
                : config.activation == Activation::GeluTanh ? "gelu_new"
                                                            : "gelu";
  if (config.normalization == Normalization::LayerNorm)
    j["normalization_type"] = "LN";
  else
    j["normalization_type"] = nullptr;
  j["positional_embedding_type"] = "standard";
  j["eps"] = config.layer_norm_eps;
  j["default_prepend_bos"] = false;
  return j.dump();
}

TransformerLMConfig config_from_transformer_lens_json(std::string_view json) {
  constexpr const char* op = "config_from_transformer_lens_json";
  const nlohmann::json j = nlohmann::json::parse(json, nullptr, false);
  if (j.is_discarded() || !j.is_object()) ag::fail(op, "the text is not a JSON object");
  // A value as messages show it: arrays and objects by kind (printing a deeply nested one would
  // recurse as deep), strings through ag::printable, everything cut to 60 characters.
  const auto shown = [](const nlohmann::json& v) -> std::string {
    if (v.is_array()) return "an array";
    if (v.is_object()) return "an object";
    std::string text = v.is_string() ? fmt::format("\"{}\"", ag::printable(v.get<std::string>())) : v.dump();
    if (text.size() > 60) text = text.substr(0, 57) + "...";
    return text;
  };
  const auto integer = [&](const char* key, bool required, std::int64_t fallback) -> std::int64_t {
    if (!j.contains(key) || j[key].is_null()) {
      if (required) ag::fail(op, "'{}' is missing", key);
      return fallback;
    }
    const nlohmann::json& v = j[key];
    if (!v.is_number_integer()) ag::fail(op, "'{}' must be an integer, got {}", key, shown(v));
    if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX))
      ag::fail(op, "'{}' {} is too large", key, shown(v));
    return v.get<std::int64_t>();
  };
  const auto text = [&](const char* key) -> std::string {
    if (!j.contains(key) || j[key].is_null()) return "";
    if (!j[key].is_string()) ag::fail(op, "'{}' must be a string or null, got {}", key, shown(j[key]));
    return j[key].get<std::string>();
  };
  TransformerLMConfig c;
  c.n_layers = integer("n_layers", true, 0);
  c.d_model = integer("d_model", true, 0);
  c.n_heads = integer("n_heads", true, 0);
  c.d_head = integer("d_head", false, 0);
  c.d_vocab = integer("d_vocab", true, 0);
  c.n_ctx = integer("n_ctx", true, 0);
  const std::int64_t out = integer("d_vocab_out", false, -1);
  c.d_vocab_out = out == -1 ? 0 : out;
  if (out == 0 || out < -1) ag::fail(op, "'d_vocab_out' must be positive or -1 (d_vocab), got {}", out);
  const bool attn_only = j.contains("attn_only") && j["attn_only"].is_boolean() && j["attn_only"].get<bool>();
  if (j.contains("attn_only") && !j["attn_only"].is_boolean() && !j["attn_only"].is_null())
    ag::fail(op, "'attn_only' must be true or false, got {}", j["attn_only"].dump());
  c.d_mlp = attn_only ? 0 : integer("d_mlp", true, 0);
  if (!attn_only && c.d_mlp <= 0) ag::fail(op, "'d_mlp' must be positive without attn_only, got {}", c.d_mlp);
  // An attention-only model has no MLP: its act_fn is not used, whatever it says.
  const std::string act = text("act_fn");
  if (act == "relu") c.activation = Activation::Relu;
  else if (act == "gelu_new") c.activation = Activation::GeluTanh;
  else if (act == "gelu" || attn_only) c.activation = Activation::Gelu;
  else ag::fail(op, "'act_fn' {} has no counterpart here (gelu, gelu_new or relu)", shown(j.value("act_fn", nlohmann::json())));
  const std::string norm = text("normalization_type");
  if (norm == "LN") c.normalization = Normalization::LayerNorm;
  else if (norm.empty()) c.normalization = Normalization::None;
  else ag::fail(op, "'normalization_type' {} has no counterpart here (\"LN\" or null)", shown(j["normalization_type"]));
  const std::string positions = text("positional_embedding_type");
  if (!positions.empty() && positions != "standard")
    ag::fail(op, "'positional_embedding_type' {} has no counterpart here (\"standard\")",
             shown(j["positional_embedding_type"]));
  if (j.contains("eps")) {
    if (!j["eps"].is_number()) ag::fail(op, "'eps' must be a number, got {}", shown(j["eps"]));
    c.layer_norm_eps = j["eps"].get<double>();
  }
  c.check();
  return c;
}

std::string transformer_lens_point_name(std::string_view tl_name) {
  std::string s(tl_name);
  if (s.find("hook_") == std::string::npos) return "";
  if (s == "hook_embed") return "embed_out";
  if (s == "hook_pos_embed") return "pos_embed_out";
  const auto replace = [&s](std::string_view from, std::string_view to) {
    if (const auto at = s.find(from); at != std::string::npos) s.replace(at, from.size(), to);
  };
  replace(".ln1.", ".ln_1.");
  replace(".ln2.", ".ln_2.");
  replace(".mlp.hook_pre", ".mlp_pre");
  replace(".mlp.hook_post", ".mlp_hidden");
  replace("hook_", "");
  return s;
}

}  // namespace nn
