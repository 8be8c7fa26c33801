// Times what a circuits study spends its time on, on a small study model (2 layers, d_vocab 64,
// n_ctx 64, d_model 128, 4 heads, d_mlp 512, batch 16, float32): a full z patching sweep (every
// layer, per head and per head × position; by circuits::z_patching_sweep with the metric read at
// the last position, the same with every position's logits made, and by study::activation_patching,
// a hooked full forward per patch), run_with_cache of the activations TransformerLens's
// run_with_cache holds by default (the same tensors under our names; and of every one of our hook
// points, which include q/k/v inputs, raw scores, concat and per-head results that TL computes only
// when asked), and a training step (forward, backward, AdamW). Prints one JSON object per
// measurement (median of --reps): benchmarks/compare_transformer_lens.py runs TransformerLens on the
// same model and prints ratios.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nn/nn.hpp>

namespace ag = autograd;

namespace {

double median_seconds(int reps, const std::function<void()>& f) {
  std::vector<double> t;
  f();  // warm-up
  for (int i = 0; i < reps; ++i) {
    const auto a = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_circuits: patching sweep, run_with_cache and a training step of a 2-layer TransformerLM"};
  int reps = 5, threads = 1;
  app.add_option("--reps", reps, "repetitions (median reported)")->check(CLI::Range(1, 1000));
  app.add_option("--threads", threads, "threads")->check(CLI::Range(1, 256));
  int only_steps = 0;
  app.add_option("--only-train-steps", only_steps, "run this many training steps and nothing else (to profile them)")
      ->check(CLI::Range(1, 1000000));
  int only_caches = 0;
  app.add_option("--only-caches", only_caches,
                 "run this many run_with_cache calls of TransformerLens's default points and nothing else (to profile them)")
      ->check(CLI::Range(1, 1000000));
  CLI11_PARSE(app, argc, argv);
  ag::set_num_threads(threads);
  ag::Generator gen(0);
  const std::int64_t B = 16, T = 64, V = 64;
  nn::TransformerLM model({.n_layers = 2, .d_model = 128, .n_heads = 4, .d_mlp = 512, .d_vocab = V, .n_ctx = T}, gen);
  const ag::Tensor clean = ag::randint(0, V, {B, T}, gen), corrupted = ag::randint(0, V, {B, T}, gen);
  nn::AdamW opt(model.named_parameters(), {.lr = 1e-3});
  const auto train_step = [&] {
    opt.zero_grad();
    ag::Tensor loss = model.loss(clean);
    loss.backward();
    opt.step();
  };
  // TransformerLens's default hook points, in our names (docs/circuits.md maps them).
  std::vector<std::string> tl_points = {"embed_out", "pos_embed_out", "ln_final.scale", "ln_final.normalized"};
  for (int l = 0; l < 2; ++l)
    for (const char* p : {"resid_pre", "ln_1.scale", "ln_1.normalized", "attn.q", "attn.k", "attn.v", "attn.attn_scores",
                          "attn.pattern", "attn.z", "attn_out", "resid_mid", "ln_2.scale", "ln_2.normalized", "mlp_pre",
                          "mlp_hidden", "mlp_out", "resid_post"})
      tl_points.push_back(fmt::format("blocks.{}.{}", l, p));
  if (only_caches > 0) {
    ag::NoGradGuard g;
    for (int i = 0; i < only_caches; ++i)
      nn::run_with_cache(model, [&] { return model.forward(clean); }, {.names = tl_points});
    return 0;
  }
  if (only_steps > 0) {
    for (int i = 0; i < only_steps; ++i) train_step();
    return 0;
  }
  // The metric: mean logit of each sequence's last token at the last position.
  const auto metric = [&](const ag::Tensor& tokens) {
    const ag::Tensor last = ag::squeeze(ag::narrow(model.forward(tokens), 1, T - 1, 1), 1);  // (B, V)
    return ag::mean(ag::gather(last, 1, ag::reshape(ag::narrow(clean, 1, T - 1, 1), {B, 1})));
  };
  // The same sweep three ways: study::activation_patching (a hooked full forward per patch), and
  // circuits::z_patching_sweep, told that the metric reads the last position or not.
  std::vector<nn::study::PatchingResult> hooked;
  const double sweep_hooks = median_seconds(reps, [&] {
    hooked.clear();
    for (int l = 0; l < 2; ++l)
      hooked.push_back(
          nn::study::activation_patching(model, fmt::format("blocks.{}.attn.z", l), metric, clean, corrupted));
  });
  const auto answer = ag::reshape(ag::narrow(clean, 1, T - 1, 1), {B, 1});
  const auto metric_of_logits = [&](const ag::Tensor& logits) {  // (B, T or 1, V): the last row
    return ag::mean(ag::gather(ag::squeeze(ag::narrow(logits, 1, logits.size(1) - 1, 1), 1), 1, answer));
  };
  std::vector<nn::study::PatchingResult> fast, fast_all;
  const double sweep = median_seconds(reps, [&] {
    fast = nn::circuits::z_patching_sweep(model, metric_of_logits, clean, corrupted,
                                          {.reads = nn::circuits::MetricReads::LastPosition});
  });
  const double sweep_all = median_seconds(reps, [&] {
    fast_all = nn::circuits::z_patching_sweep(model, metric_of_logits, clean, corrupted);
  });
  // The largest difference from the hooked sweep's metrics (float32 rounding).
  double worst = 0;
  for (const auto* r : {&fast, &fast_all})
    for (std::size_t l = 0; l < 2; ++l)
      for (std::size_t h = 0; h < hooked[l].per_head.size(); ++h) {
        worst = std::max(worst, std::abs((*r)[l].per_head[h] - hooked[l].per_head[h]));
        for (std::size_t t = 0; t < hooked[l].per_head_position[h].size(); ++t)
          worst = std::max(worst, std::abs((*r)[l].per_head_position[h][t] - hooked[l].per_head_position[h][t]));
      }
  const auto cached = [&](const std::vector<std::string>& names, std::size_t& bytes) {
    return median_seconds(reps, [&] {
      ag::NoGradGuard g;
      const nn::ActivationCache c = nn::run_with_cache(model, [&] { return model.forward(clean); }, {.names = names});
      bytes = 0;
      for (const auto& n : c.names()) bytes += static_cast<std::size_t>(c[n].numel()) * ag::dtype_size(c[n].dtype());
    });
  };
  std::size_t cache_bytes = 0, all_bytes = 0;
  const double cache = cached(tl_points, cache_bytes);
  const double cache_all = cached({}, all_bytes);
  const double step = median_seconds(reps, train_step);
  std::printf("{\"what\": \"sweep\", \"seconds\": %.6f, \"largest_difference\": %.3g}\n", sweep, worst);
  std::printf("{\"what\": \"sweep_all_positions\", \"seconds\": %.6f}\n", sweep_all);
  std::printf("{\"what\": \"sweep_hooks\", \"seconds\": %.6f}\n", sweep_hooks);
  std::printf("{\"what\": \"run_with_cache\", \"seconds\": %.6f, \"bytes\": %zu}\n", cache, cache_bytes);
  std::printf("{\"what\": \"run_with_cache_every_point\", \"seconds\": %.6f, \"bytes\": %zu}\n", cache_all, all_bytes);
  std::printf("{\"what\": \"train_step\", \"seconds\": %.6f}\n", step);
  return 0;
}
