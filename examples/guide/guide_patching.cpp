// docs/circuits.md's patching sweep: a 2-layer TransformerLM trained briefly to copy repeated
// sequences, then every layer's z patched from clean (repeated) into corrupted (first half
// replaced) runs by nn::circuits::z_patching_sweep, against study::activation_patching (a hooked
// full forward per patch), with a metric over the second half and one at the last position.
// Writes patching_study.html (heatmaps of the restored share); fails when the two ways differ.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nn/nn.hpp>

namespace ag = autograd;
namespace circuits = nn::circuits;

constexpr std::int64_t kVocab = 32, kHalf = 12, kT = 2 * kHalf, kB = 8;

ag::Tensor repeated(std::int64_t B, ag::Generator& gen) {  // B sequences of kHalf tokens, twice
  const ag::Tensor half = ag::randint(0, kVocab, {B, kHalf}, gen);
  return ag::cat({half, half}, 1);
}

// The restored share (patched - corrupted) / (clean - corrupted) of each cell.
std::vector<std::vector<double>> restored(const nn::study::PatchingResult& r) {
  std::vector<std::vector<double>> cells = r.per_head_position;
  for (auto& row : cells)
    for (double& v : row) v = (v - r.corrupted_metric) / (r.clean_metric - r.corrupted_metric);
  return cells;
}

int main() {
  ag::Generator gen(1);
  nn::TransformerLM model({.n_layers = 2, .d_model = 64, .n_heads = 4, .d_mlp = 256, .d_vocab = kVocab, .n_ctx = kT},
                          gen);
  nn::AdamW opt(model.named_parameters(), {.lr = 3e-3});
  for (int step = 0; step < 300; ++step) {
    opt.zero_grad();
    ag::Tensor loss = model.loss(repeated(32, gen));
    loss.backward();
    opt.step();
    if (step % 100 == 99) std::printf("step %d: loss %.3f\n", step + 1, loss.item());
  }
  model.eval();
  ag::NoGradGuard no_grad;
  const ag::Tensor clean = repeated(kB, gen);
  const ag::Tensor corrupted = ag::cat({ag::randint(0, kVocab, {kB, kHalf}, gen), ag::narrow(clean, 1, kHalf, kHalf)}, 1);
  // Minus the cross entropy of the second half's next tokens, and of the last position's alone.
  const ag::Tensor targets = ag::reshape(ag::narrow(clean, 1, kHalf + 1, kHalf - 1), {kB * (kHalf - 1)});
  using Metric = std::function<ag::Tensor(const ag::Tensor&)>;
  const Metric second_half = [&](const ag::Tensor& logits) {  // logits (B, T, V)
    return ag::neg(ag::cross_entropy(ag::reshape(ag::narrow(logits, 1, kHalf, kHalf - 1), {-1, kVocab}), targets));
  };
  const ag::Tensor last_target = ag::reshape(ag::narrow(clean, 1, kHalf, 1), {kB});
  const Metric last = [&](const ag::Tensor& logits) {  // logits (B, T, V) or, from the sweep, (B, 1, V)
    return ag::neg(ag::cross_entropy(ag::reshape(ag::narrow(logits, 1, -1, 1), {kB, kVocab}), last_target));
  };

  nn::viewer::Page page("z patching of a 2-layer TransformerLM");
  double worst = 0;
  for (const bool at_last : {false, true}) {
    const Metric& metric = at_last ? last : second_half;
    const auto sweep = circuits::z_patching_sweep(
        model, metric, clean, corrupted,
        {.reads = at_last ? circuits::MetricReads::LastPosition : circuits::MetricReads::AllPositions});
    page.section(at_last ? "Metric at the last position" : "Metric over the second half");
    for (std::size_t l = 0; l < sweep.size(); ++l) {
      page.heatmap({.title = fmt::format("layer {}: share restored by patching head h at position t", l),
                    .values = restored(sweep[l]), .row_labels = {}, .col_labels = {}, .row_axis = "head",
                    .col_axis = "position", .value_name = "restored"});
      // The same numbers the slow way: a hooked full forward per patch.
      const nn::study::PatchingResult slow = nn::study::activation_patching(
          model, fmt::format("blocks.{}.attn.z", l), [&](const ag::Tensor& t) { return metric(model.forward(t)); },
          clean, corrupted);
      for (std::size_t h = 0; h < slow.per_head.size(); ++h) {
        worst = std::max(worst, std::abs(sweep[l].per_head[h] - slow.per_head[h]));
        for (std::size_t t = 0; t < slow.per_head_position[h].size(); ++t)
          worst = std::max(worst, std::abs(sweep[l].per_head_position[h][t] - slow.per_head_position[h][t]));
      }
    }
  }
  page.save("patching_study.html");
  std::printf("largest |z_patching_sweep - activation_patching|: %.3g; wrote patching_study.html\n", worst);
  return worst < 1e-4 ? 0 : 1;
}
