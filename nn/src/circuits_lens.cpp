// The residual stream of a TransformerLM read from a cache (logit lens, decompositions, logit
// attributions), path patching and resample ablation.
#include <numeric>

#include "nn/circuits.hpp"
#include "nn/study.hpp"

namespace nn::circuits {

namespace {

std::int64_t upto(std::string_view op, const TransformerLM& model, std::int64_t layer) {
  const std::int64_t L = model.config().n_layers;
  if (layer == -1) return L;
  if (layer < 0 || layer > L) ag::fail(op, "layer {} is out of range: -1 (all) or 0 .. {}", layer, L);
  return layer;
}

const ag::Tensor& cached(std::string_view op, const ActivationCache& cache, const std::string& name) {
  if (!cache.contains(name))
    ag::fail(op, "the cache has no '{}': run_with_cache with it among CacheOptions::names (or every point)", name);
  return cache[name];
}

// The parts stacked on a new leading dim, normalised as apply_ln_to_stack does when asked.
ResidualStack finish(std::string_view op, const TransformerLM& model, const ActivationCache& cache,
                     std::vector<ag::Tensor> parts, std::vector<std::string> labels, bool apply_ln, std::int64_t layer) {
  if (parts.empty()) ag::fail(op, "layer 0 has nothing before it to stack");
  for (auto& p : parts) p = ag::unsqueeze(p, 0);
  ResidualStack s{ag::cat(parts, 0), std::move(labels)};
  if (apply_ln) s.stack = apply_ln_to_stack(model, cache, s.stack, layer);
  return s;
}

}  // namespace

ResidualStack accumulated_resid(const TransformerLM& model, const ActivationCache& cache, std::int64_t layer,
                                bool incl_mid, bool apply_ln) {
  constexpr const char* op = "accumulated_resid";
  const std::int64_t L = model.config().n_layers, n = upto(op, model, layer);
  incl_mid = incl_mid && model.config().d_mlp != 0;  // as TL: an attention-only model has no resid_mid
  std::vector<ag::Tensor> parts;
  std::vector<std::string> labels;
  ag::NoGradGuard no_grad;
  for (std::int64_t l = 0; l <= n; ++l) {
    if (l == L) {
      parts.push_back(cached(op, cache, fmt::format("blocks.{}.resid_post", L - 1)));
      labels.push_back("final_post");
      continue;
    }
    parts.push_back(cached(op, cache, fmt::format("blocks.{}.resid_pre", l)));
    labels.push_back(fmt::format("{}_pre", l));
    if (incl_mid && l < n) {
      parts.push_back(cached(op, cache, fmt::format("blocks.{}.resid_mid", l)));
      labels.push_back(fmt::format("{}_mid", l));
    }
  }
  if (apply_ln && n == L && model.config().normalization == Normalization::LayerNorm) {
    // As TL 3.9 does for the final layer: each stream through the whole ln_final, its own mean
    // and scale, weight and bias (the fused op, so that no hook point of ln_final fires).
    const LayerNorm& ln = model.ln_final();
    ResidualStack s = finish(op, model, cache, std::move(parts), std::move(labels), false, layer);
    s.stack = ag::layer_norm(s.stack, ln.options().normalized_shape, ln.weight(), ln.bias(), ln.options().eps);
    return s;
  }
  return finish(op, model, cache, std::move(parts), std::move(labels), apply_ln, layer);
}

ResidualStack decompose_resid(const TransformerLM& model, const ActivationCache& cache, std::int64_t layer,
                              bool apply_ln) {
  constexpr const char* op = "decompose_resid";
  const std::int64_t n = upto(op, model, layer);
  std::vector<ag::Tensor> parts;
  std::vector<std::string> labels;
  ag::NoGradGuard no_grad;
  parts.push_back(cached(op, cache, "embed_out"));
  labels.push_back("embed");
  if (model.config().positional_embedding == PositionalEmbedding::Learned) {
    parts.push_back(cached(op, cache, "pos_embed_out"));
    labels.push_back("pos_embed");
  }
  for (std::int64_t l = 0; l < n; ++l) {
    parts.push_back(cached(op, cache, fmt::format("blocks.{}.attn_out", l)));
    labels.push_back(fmt::format("{}_attn_out", l));
    if (model.config().d_mlp != 0) {
      parts.push_back(cached(op, cache, fmt::format("blocks.{}.mlp_out", l)));
      labels.push_back(fmt::format("{}_mlp_out", l));
    }
  }
  return finish(op, model, cache, std::move(parts), std::move(labels), apply_ln, layer);
}

ResidualStack stack_head_results(const TransformerLM& model, const ActivationCache& cache, std::int64_t layer,
                                 bool apply_ln) {
  constexpr const char* op = "stack_head_results";
  const std::int64_t n = upto(op, model, layer), H = model.config().n_heads;
  std::vector<ag::Tensor> parts;
  std::vector<std::string> labels;
  ag::NoGradGuard no_grad;
  for (std::int64_t l = 0; l < n; ++l) {
    const ag::Tensor& r = cached(op, cache, fmt::format("blocks.{}.attn.result", l));  // (B, H, T, E)
    for (std::int64_t h = 0; h < H; ++h) {
      parts.push_back(ag::squeeze(ag::narrow(r, 1, h, 1), 1));
      labels.push_back(fmt::format("L{}H{}", l, h));
    }
  }
  return finish(op, model, cache, std::move(parts), std::move(labels), apply_ln, layer);
}

ag::Tensor apply_ln_to_stack(const TransformerLM& model, const ActivationCache& cache, const ag::Tensor& stack,
                             std::int64_t layer) {
  constexpr const char* op = "apply_ln_to_stack";
  const std::int64_t L = model.config().n_layers;
  if (layer != -1 && (layer < 0 || layer > L)) ag::fail(op, "layer {} is out of range: -1 (final) or 0 .. {}", layer, L);
  if (!stack.defined() || stack.dim() != 4 || stack.size(-1) != model.config().d_model)
    ag::fail(op, "stack of shape {} is not (n, B, T, d_model = {})",
             stack.defined() ? ag::shape_str(stack.shape()) : "undefined", model.config().d_model);
  if (model.config().normalization == Normalization::None) return stack;
  const std::string point = layer == -1 || layer == L ? "ln_final.scale" : fmt::format("blocks.{}.ln_1.scale", layer);
  ag::Tensor scale = cached(op, cache, point);  // (B, T, 1)
  // With a q/k/v input hooked, ln_1 ran on the three inputs as one stack (B, T, 3, 1): the queries'.
  if (scale.dim() == 4 && scale.size(2) == 3) scale = ag::squeeze(ag::narrow(scale, 2, 0, 1), 2);
  if (scale.dim() != 3 || scale.size(0) != stack.size(1) || scale.size(1) != stack.size(2))
    ag::fail(op, "stack of shape {} does not fit the cached {} of shape {}", ag::shape_str(stack.shape()), point,
             ag::shape_str(scale.shape()));
  const ag::Tensor centred = ag::sub(stack, ag::mean(stack, -1, true));
  return ag::div(centred, ag::unsqueeze(scale.to(stack.dtype()), 0));
}

ag::Tensor logit_lens(const TransformerLM& model, const ResidualStack& accumulated) {
  if (!accumulated.stack.defined() || accumulated.stack.dim() != 4)
    ag::fail("logit_lens", "the stack must be (n, B, T, E), got {}",
             accumulated.stack.defined() ? ag::shape_str(accumulated.stack.shape()) : "undefined");
  return model.unembed(accumulated.stack);
}

ag::Tensor logit_directions(const TransformerLM& model, const std::vector<std::int64_t>& tokens) {
  const std::int64_t V = model.config().d_vocab_out;
  for (auto t : tokens)
    if (t < 0 || t >= V) ag::fail("logit_directions", "token {} is out of range for d_vocab_out {}", t, V);
  const ag::Tensor idx = ag::tensor(tokens, {static_cast<std::int64_t>(tokens.size())});
  ag::Tensor d = ag::index_select(ag::transpose(model.W_U(), 0, 1), 0, idx);  // (n, E)
  if (model.config().normalization == Normalization::LayerNorm) d = ag::mul(d, model.ln_final().weight());
  return d;
}

ag::Tensor residual_stack_to_logit(const ag::Tensor& stack, const ag::Tensor& direction) {
  constexpr const char* op = "residual_stack_to_logit";
  if (!stack.defined() || stack.dim() != 4)
    ag::fail(op, "stack must be (n, B, T, E), got {}", stack.defined() ? ag::shape_str(stack.shape()) : "undefined");
  const std::int64_t B = stack.size(1), T = stack.size(2), E = stack.size(3);
  if (!direction.defined() || (direction.shape() != ag::Shape{E} && direction.shape() != ag::Shape{B, T, E}))
    ag::fail(op, "direction of shape {} fits neither (E) = {} nor (B, T, E) = {}",
             direction.defined() ? ag::shape_str(direction.shape()) : "undefined", ag::shape_str({E}),
             ag::shape_str({B, T, E}));
  const ag::Tensor d = direction.dim() == 1 ? ag::reshape(direction, {1, 1, 1, E}) : ag::unsqueeze(direction, 0);
  return ag::sum(ag::mul(stack, d.to(stack.dtype())), -1);
}

// ---- path patching ----

namespace {

double metric_value(const std::function<ag::Tensor(const ag::Tensor&)>& metric, const ag::Tensor& logits,
                    const char* which) {
  const ag::Tensor m = metric(logits);
  if (!m.defined() || m.numel() != 1 || !std::isfinite(m.to(ag::Dtype::Float64).item()))
    ag::fail("path_patching", "the metric of the {} run must be one finite element, got {}", which,
             m.defined() ? fmt::format("shape {}{}", ag::shape_str(m.shape()),
                                       m.numel() == 1 ? fmt::format(" value {}", m.to(ag::Dtype::Float64).item()) : "")
                         : "undefined");
  return m.to(ag::Dtype::Float64).item();
}

// Removes the hooks it was given when it goes, also when a forward throws.
struct Hooks {
  std::vector<HookHandle> handles;
  ~Hooks() {
    for (auto& h : handles) h.remove();
  }
};

}  // namespace

PathPatchingResult path_patching(TransformerLM& model, const std::function<ag::Tensor(const ag::Tensor&)>& metric,
                                 const ag::Tensor& clean_tokens, const ag::Tensor& corrupted_tokens,
                                 std::int64_t sender_layer, std::int64_t receiver_layer, Composition receiver_input) {
  constexpr const char* op = "path_patching";
  const std::int64_t L = model.config().n_layers, H = model.config().n_heads;
  if (!metric) ag::fail(op, "the metric is an empty function");
  if (receiver_input != Composition::Q && receiver_input != Composition::K && receiver_input != Composition::V)
    ag::fail(op, "unknown receiver input {} (Composition::Q, K or V)", static_cast<int>(receiver_input));
  if (sender_layer < 0 || sender_layer >= L || receiver_layer <= sender_layer || receiver_layer >= L)
    ag::fail(op, "sender layer {} and receiver layer {}: need 0 <= sender < receiver < n_layers = {}", sender_layer,
             receiver_layer, L);
  if (!clean_tokens.defined() || !corrupted_tokens.defined() || clean_tokens.shape() != corrupted_tokens.shape())
    ag::fail(op, "clean tokens of shape {} and corrupted tokens of shape {} differ",
             clean_tokens.defined() ? ag::shape_str(clean_tokens.shape()) : "undefined",
             corrupted_tokens.defined() ? ag::shape_str(corrupted_tokens.shape()) : "undefined");
  ag::NoGradGuard no_grad;
  const std::string result_point = fmt::format("blocks.{}.attn.result", sender_layer);
  const char* input_name = receiver_input == Composition::Q ? "q_input" : receiver_input == Composition::K ? "k_input" : "v_input";
  const char* head_point = receiver_input == Composition::Q ? "q" : receiver_input == Composition::K ? "k" : "v";
  const std::string input_point = fmt::format("blocks.{}.{}", receiver_layer, input_name);
  const std::string receiver_point = fmt::format("blocks.{}.attn.{}", receiver_layer, head_point);

  PathPatchingResult r;
  const ActivationCache clean = run_with_cache(model, [&] { return model.forward(clean_tokens); }, {.names = {result_point}});
  r.clean_metric = metric_value(metric, clean.output, "clean");
  const ActivationCache corrupted =
      run_with_cache(model, [&] { return model.forward(corrupted_tokens); }, {.names = {result_point}});
  r.corrupted_metric = metric_value(metric, corrupted.output, "corrupted");
  const ag::Tensor delta = ag::sub(clean[result_point], corrupted[result_point]);  // (B, H, T, E)
  const bool batched = corrupted_tokens.dim() == 2;
  for (std::int64_t i = 0; i < H; ++i) {
    // The receiver layer's per-head q (k, v) with sender i's clean-minus-corrupted result added to its input.
    ag::Tensor patched_heads;
    {
      Hooks hooks;
      const ag::Tensor add = ag::squeeze(ag::narrow(delta, 1, i, 1), 1);  // (B, T, E)
      hooks.handles.push_back(model.add_hook(input_point, [&](const ag::Tensor& v, const std::string&) {
        return ag::add(v, batched ? add : ag::squeeze(add, 0));
      }));
      hooks.handles.push_back(model.add_hook(receiver_point, [&](const ag::Tensor& v, const std::string&) {
        patched_heads = v;
        return ag::Tensor();
      }));
      (void)model.forward(corrupted_tokens);
    }
    std::vector<double> row;
    for (std::int64_t j = 0; j < H; ++j) {
      Hooks hooks;
      hooks.handles.push_back(model.add_hook(receiver_point, [&](const ag::Tensor& v, const std::string&) {
        std::vector<ag::Tensor> heads;
        for (std::int64_t h = 0; h < H; ++h) heads.push_back(ag::narrow(h == j ? patched_heads : v, 1, h, 1));
        return ag::cat(heads, 1);
      }));
      row.push_back(metric_value(metric, model.forward(corrupted_tokens), "patched"));
    }
    r.per_pair.push_back(std::move(row));
  }
  return r;
}

ForwardHook resample_ablate_head(std::int64_t head, const ag::Tensor& source_z, ag::Generator& gen) {
  constexpr const char* op = "resample_ablate_head";
  if (!source_z.defined() || source_z.dim() != 4 || source_z.size(0) < 2)
    ag::fail(op, "source_z must be (B, H, T, d_k) with B >= 2 sequences to draw from, got {}",
             source_z.defined() ? ag::shape_str(source_z.shape()) : "undefined");
  if (head < 0 || head >= source_z.size(1))
    ag::fail(op, "head {} is out of range for source_z {} (heads 0 .. {})", head, ag::shape_str(source_z.shape()),
             source_z.size(1) - 1);
  // Sattolo's algorithm: a random cyclic permutation, so no sequence keeps its own z.
  const std::int64_t B = source_z.size(0);
  std::vector<std::int64_t> perm(static_cast<std::size_t>(B));
  std::iota(perm.begin(), perm.end(), std::int64_t{0});
  for (std::int64_t i = B - 1; i > 0; --i) {
    const auto j = static_cast<std::int64_t>(gen.next_u64() % static_cast<std::uint64_t>(i));
    std::swap(perm[static_cast<std::size_t>(i)], perm[static_cast<std::size_t>(j)]);
  }
  ag::Tensor resampled;
  {
    ag::NoGradGuard no_grad;
    resampled = ag::index_select(source_z.detach(), 0, ag::tensor(perm, {B}));
  }
  return study::patch_head(head, resampled, -1);
}

}  // namespace nn::circuits
