#include "report.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "html_page.hpp"
#include "svg_charts.hpp"

namespace grokking {

namespace {

nlohmann::json number(double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(); }
nlohmann::json step_json(const std::optional<std::int64_t>& s) { return s ? nlohmann::json(*s) : nlohmann::json(); }

std::string fixed(double x, int digits = 3) {
  return std::isfinite(x) ? fmt::format("{:.{}f}", x, digits) : std::string("not measured");
}
std::string sci(double x) { return std::isfinite(x) ? fmt::format("{:.3g}", x) : std::string("not measured"); }
std::string step_text(const std::optional<std::int64_t>& s) { return s ? fmt::format("{}", *s) : "never"; }

constexpr double spectrum_tick_font = 11;  // the SVG's font size

std::string keys_text(const std::vector<std::int64_t>& keys) {
  std::string s;
  for (auto k : keys) s += fmt::format("{}{}", s.empty() ? "" : ", ", k);
  return s;
}

// The MLP neurons grouped by the frequency that explains most of each one's variance: per
// frequency, the neurons it explains by at least kWellExplained, and their mean fraction; largest
// group first.
constexpr double kWellExplained = 0.85;
struct NeuronCluster {
  std::int64_t frequency = 0, neurons = 0;
  double mean_explained = 0;
};
std::vector<NeuronCluster> neuron_clusters(const Result& r) {
  std::vector<NeuronCluster> clusters;
  for (std::size_t n = 0; n < r.neuron_frequency.size(); ++n) {
    if (r.neuron_explained[n] < kWellExplained) continue;
    const std::int64_t k = r.neuron_frequency[n];
    auto it = std::find_if(clusters.begin(), clusters.end(), [k](const auto& c) { return c.frequency == k; });
    if (it == clusters.end()) it = clusters.insert(clusters.end(), {.frequency = k});
    it->mean_explained += r.neuron_explained[n];
    ++it->neurons;
  }
  for (auto& c : clusters) c.mean_explained /= static_cast<double>(c.neurons);
  std::stable_sort(clusters.begin(), clusters.end(), [](const auto& a, const auto& b) {
    return a.neurons != b.neurons ? a.neurons > b.neurons : a.frequency < b.frequency;
  });
  return clusters;
}
std::int64_t dead_neurons(const Result& r) {
  return std::count(r.neuron_frequency.begin(), r.neuron_frequency.end(), std::int64_t{0});
}

// A chart over the training steps.
svg::LineChart step_chart(std::string title, std::string y_label, bool log_y, std::string id) {
  svg::LineChart c;
  c.title = std::move(title);
  c.x_label = "step";
  c.y_label = std::move(y_label);
  c.log_y = log_y;
  c.attributes = fmt::format("id=\"{}\"", id);
  return c;
}

// One field of the points (CurvePoint or ProgressPoint) against their steps.
template <class Point>
svg::Series step_series(std::string name, std::string colour, const std::vector<Point>& points,
                        double Point::*field, bool markers) {
  svg::Series s{.name = std::move(name), .colour = std::move(colour), .x = {}, .y = {}, .markers = markers};
  for (const Point& p : points) {
    s.x.push_back(static_cast<double>(p.step));
    s.y.push_back(p.*field);
  }
  return s;
}

constexpr const char* kBlue = "#1f77b4";
constexpr const char* kOrange = "#ff7f0e";

svg::LineChart loss_chart(const Result& r) {
  svg::LineChart c = step_chart("Loss (cross entropy, log scale)", "loss", true, "loss-chart");
  c.series = {step_series("train", kBlue, r.curve, &CurvePoint::train_loss, false),
              step_series("test", kOrange, r.curve, &CurvePoint::test_loss, false)};
  if (r.grokked_step) {
    const auto x = static_cast<double>(*r.grokked_step);
    double lo = 1e300, hi = 0;
    for (const auto& p : r.curve)
      for (double v : {p.train_loss, p.test_loss})
        if (v > 0 && std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
    c.series.push_back({.name = fmt::format("test accuracy >= 99 % (step {})", *r.grokked_step), .colour = "#d62728",
                        .x = {x, x}, .y = {lo, hi}});
  }
  return c;
}

svg::LineChart accuracy_chart(const Result& r) {
  svg::LineChart c = step_chart("Accuracy", "accuracy", false, "accuracy-chart");
  c.series = {step_series("train", kBlue, r.curve, &CurvePoint::train_accuracy, false),
              step_series("test", kOrange, r.curve, &CurvePoint::test_accuracy, false)};
  c.y_min = 0;
  c.y_max = 1;
  return c;
}

svg::LineChart progress_chart(const Result& r) {
  svg::LineChart c =
      step_chart("Progress measures (log scale), with the final key frequencies", "loss", true, "progress-chart");
  c.series = {step_series("train loss", kBlue, r.progress, &ProgressPoint::train_loss, true),
              step_series("test loss", kOrange, r.progress, &ProgressPoint::test_loss, true),
              step_series("restricted loss (test pairs)", "#2ca02c", r.progress, &ProgressPoint::restricted_loss, true),
              step_series("excluded loss (training pairs)", "#9467bd", r.progress, &ProgressPoint::excluded_loss, true)};
  return c;
}

// The frequencies labelled under the spectrum's bars, with the row (0 or 1) each label is in: the key
// frequencies first, from the lowest, then every tenth frequency, each in the first row where its
// label keeps clear of those already placed there (so that adjacent key frequencies alternate rows,
// and all fit while a bar is at least half a label wide); a frequency that fits in neither row is
// left unlabelled (a key frequency keeps its red bar and hover text).
std::vector<std::pair<std::int64_t, int>> spectrum_labels(const Result& r, double bar) {
  const auto n = static_cast<std::int64_t>(r.frequency_norms.size());
  std::vector<std::int64_t> keys = r.key_frequencies;
  std::sort(keys.begin(), keys.end());
  std::vector<std::int64_t> wanted = keys;
  for (std::int64_t k = 10; k <= n; k += 10)
    if (!std::binary_search(keys.begin(), keys.end(), k)) wanted.push_back(k);
  const auto span = [bar](std::int64_t k) {
    const double centre = bar * (static_cast<double>(k) - 0.5),
                 half = svg::text_width(std::to_string(k), spectrum_tick_font) / 2 + 1;
    return std::pair{centre - half, centre + half};
  };
  std::vector<std::pair<std::int64_t, int>> placed;
  for (auto k : wanted)
    for (int row = 0; row < 2; ++row) {
      const auto [lo, hi] = span(k);
      const bool clear = std::none_of(placed.begin(), placed.end(), [&](const auto& other) {
        const auto [other_lo, other_hi] = span(other.first);
        return other.second == row && lo < other_hi && other_lo < hi;
      });
      if (clear) {
        placed.emplace_back(k, row);
        break;
      }
    }
  return placed;
}

// The embedding's norm per frequency as bars, the key frequencies in red, each with its value on hover.
std::string spectrum_svg(const Result& r) {
  const auto n = r.frequency_norms.size();
  const double bar = std::max(4.0, std::min(14.0, 560.0 / static_cast<double>(n)));
  const double left = 56, top = 40, height = 220, width = left + bar * static_cast<double>(n) + 20;
  const double top_value = std::max(1e-12, *std::max_element(r.frequency_norms.begin(), r.frequency_norms.end()));
  std::string s = svg::svg_open(width, top + height + 62, "id=\"fourier-spectrum\" class=\"bar-chart\"");
  s += "<text x=\"10\" y=\"20\" font-size=\"14\" class=\"chart-title\">Norm of W_E per Fourier frequency "
       "(key frequencies in red)</text>\n";
  s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"black\"/>"
                   "<line x1=\"{0}\" y1=\"{2}\" x2=\"{3}\" y2=\"{2}\" stroke=\"black\"/>\n",
                   left, top, top + height, width - 20);
  for (int t = 0; t <= 4; ++t) {
    const double v = top_value * t / 4, y = top + height - height * t / 4;
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\" class=\"y-tick\">{:.3g}</text>\n", left - 5,
                     y + 4, v);
  }
  for (std::size_t i = 0; i < n; ++i) {
    const auto k = static_cast<std::int64_t>(i + 1);
    const bool key = std::find(r.key_frequencies.begin(), r.key_frequencies.end(), k) != r.key_frequencies.end();
    const double h = height * r.frequency_norms[i] / top_value, x = left + bar * static_cast<double>(i);
    const std::string text = fmt::format("frequency {}: norm {:.4g}{}", k, r.frequency_norms[i], key ? " (key)" : "");
    s += fmt::format("<rect class=\"bar{}\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\" "
                     "data-frequency=\"{}\" data-v=\"{}\"><title>{}</title></rect>\n",
                     key ? " key" : "", x + 0.5, top + height - h, bar - 1, h, key ? "#d62728" : "#1f77b4", k,
                     svg::escape(text), svg::escape(text));
  }
  for (const auto& [k, row] : spectrum_labels(r, bar))
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" font-size=\"{}\" class=\"x-tick\" "
                     "data-frequency=\"{}\">{}</text>\n",
                     left + bar * (static_cast<double>(k) - 0.5), top + height + 14 + 12 * row, spectrum_tick_font, k, k);
  s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">frequency k (cos and sin of 2πk·x/{})</text>\n",
                   (left + width - 20) / 2, top + height + 48, r.config.p);
  return s + "</svg>\n";
}

}  // namespace

nlohmann::json summary_json(const Result& r) {
  const Config& c = r.config;
  nlohmann::json curve = nlohmann::json::array();
  for (const auto& p : r.curve)
    curve.push_back({{"step", p.step},
                     {"train_loss", number(p.train_loss)},
                     {"train_accuracy", number(p.train_accuracy)},
                     {"test_loss", number(p.test_loss)},
                     {"test_accuracy", number(p.test_accuracy)}});
  nlohmann::json progress = nlohmann::json::array();
  for (const auto& p : r.progress)
    progress.push_back({{"step", p.step},
                        {"train_loss", number(p.train_loss)},
                        {"test_loss", number(p.test_loss)},
                        {"train_accuracy", number(p.train_accuracy)},
                        {"test_accuracy", number(p.test_accuracy)},
                        {"restricted_loss", number(p.restricted_loss)},
                        {"excluded_loss", number(p.excluded_loss)},
                        {"key_share", number(p.key_share)},
                        {"weight_norm", number(p.weight_norm)}});
  const ProgressPoint& last = r.progress.back();
  nlohmann::json clusters = nlohmann::json::array();
  for (const auto& k : neuron_clusters(r))
    clusters.push_back({{"frequency", k.frequency}, {"neurons", k.neurons}, {"mean_explained", k.mean_explained}});
  return {{"implementation", "headgrad"},
          {"p", c.p},
          {"train_fraction", c.train_fraction},
          {"steps", c.steps},
          {"seed", c.seed},
          {"config",
           {{"p", c.p}, {"train_fraction", c.train_fraction}, {"n_layers", 1}, {"d_vocab", c.p + 1},
            {"equals_token", c.p}, {"d_vocab_out", c.p}, {"n_ctx", 3}, {"activation", "relu"},
            {"normalization", "none"}, {"biases", "held at 0"}, {"d_model", c.d_model}, {"n_heads", c.n_heads},
            {"d_head", c.d_model / c.n_heads}, {"d_mlp", c.d_mlp}, {"steps", c.steps}, {"lr", c.lr},
            {"weight_decay", c.weight_decay}, {"betas", {c.beta1, c.beta2}}, {"eval_interval", c.eval_interval},
            {"snapshot_interval", c.snapshot_interval}, {"seed", c.seed},
            {"dtype", c.dtype == ag::Dtype::Float64 ? "float64" : "float32"}}},
          {"transformer_lens_config", nlohmann::json::parse(nn::transformer_lens_config_json(model_config(c)))},
          {"parameters", r.parameters},
          {"trained_parameters", r.trained_parameters},
          {"train_pairs", r.train_pairs},
          {"test_pairs", r.test_pairs},
          {"threads", r.threads},
          {"train_seconds", r.train_seconds},
          {"measure_seconds", r.measure_seconds},
          {"train_loss", number(r.final_point.train_loss)},
          {"train_accuracy", number(r.final_point.train_accuracy)},
          {"test_loss", number(r.final_point.test_loss)},
          {"test_accuracy", number(r.final_point.test_accuracy)},
          {"memorized_step", step_json(r.memorized_step)},
          {"grokked_step", step_json(r.grokked_step)},
          {"test_loss_peak", {{"step", r.test_loss_peak.step}, {"loss", number(r.test_loss_peak.test_loss)}}},
          {"key_frequencies", r.key_frequencies},
          {"key_frequency_share", number(last.key_share)},
          {"frequency_norms", r.frequency_norms},
          {"constant_norm", number(r.constant_norm)},
          {"neuron_frequency", r.neuron_frequency},
          {"neuron_explained", r.neuron_explained},
          {"neuron_clusters", clusters},
          {"restricted_loss", number(last.restricted_loss)},
          {"excluded_loss", number(last.excluded_loss)},
          {"progress", progress},
          {"curve", curve}};
}

std::string report_html(const Result& r) {
  const Config& c = r.config;
  html::Page page("grokking: a + b mod " + std::to_string(c.p));
  page.heading(1, fmt::format("Grokking a + b mod {}", c.p));
  page.paragraph(fmt::format(
      "A 1-layer transformer (d_model {}, {} heads of {}, d_mlp {}, ReLU, no LayerNorm, biases held at 0; {} "
      "trained parameters) reads \"a b =\" and predicts (a + b) mod {} at \"=\". It is trained full-batch with "
      "AdamW (lr {}, weight decay {}, betas ({}, {})) on {} of the {} pairs for {} steps (seed {}, {:.1f} s on {} "
      "thread{}); the other {} pairs are the test set. Nanda et al. 2023 (TransformerLens's Grokking demo) report, "
      "for p = 113 and 30 % of the pairs: train loss 0.032 at step 199 while the test loss rises to about 34 near "
      "step 1,400; test loss 22.3 at step 9,999, 0.86 at 13,799 and 1.5e-4 at 14,999.",
      c.d_model, c.n_heads, c.d_model / c.n_heads, c.d_mlp, r.trained_parameters, c.p, c.lr, c.weight_decay, c.beta1,
      c.beta2, r.train_pairs, c.p * c.p, c.steps, c.seed, r.train_seconds, r.threads, r.threads == 1 ? "" : "s",
      r.test_pairs));
  html::Table summary;
  summary.caption = "What happened";
  summary.header = {"measure", "value"};
  summary.attributes = "id=\"grokking-summary\"";
  summary.rows = {
      {"memorised (first step with train accuracy >= 99 %)", step_text(r.memorized_step)},
      {"grokked (first evaluation with test accuracy >= 99 %)", step_text(r.grokked_step)},
      {"test loss peak", fmt::format("{} at step {}", fixed(r.test_loss_peak.test_loss), r.test_loss_peak.step)},
      {"final train loss / accuracy", fmt::format("{} / {:.2f} %", sci(r.final_point.train_loss),
                                                  100 * r.final_point.train_accuracy)},
      {"final test loss / accuracy", fmt::format("{} / {:.2f} %", sci(r.final_point.test_loss),
                                                 100 * r.final_point.test_accuracy)},
      {"key frequencies", fmt::format("{} ({:.1f} % of W_E's non-constant squared norm)",
                                      keys_text(r.key_frequencies), 100 * r.progress.back().key_share)},
      {"final restricted loss (test pairs)", sci(r.progress.back().restricted_loss)},
      {"final excluded loss (training pairs)", sci(r.progress.back().excluded_loss)}};
  page.table(summary);

  page.heading(2, "Memorisation, then generalisation");
  // What this run did, in its own steps (a --quick run, with 60 % of the pairs, has no long plateau).
  const std::string memorised = r.memorized_step ? fmt::format("at step {}", *r.memorized_step) : "not by the end";
  std::string generalised = fmt::format("has not reached 99 % by step {}", c.steps);
  if (r.grokked_step)
    generalised = r.memorized_step ? fmt::format("reaches 99 % at step {}, {} steps after the training accuracy did",
                                                 *r.grokked_step, *r.grokked_step - *r.memorized_step)
                                   : fmt::format("reaches 99 % at step {}", *r.grokked_step);
  page.paragraph(fmt::format(
      "The model memorises the training pairs first (training accuracy 99 % {}) while the test loss rises. Weight "
      "decay then keeps shrinking the weights, and the test accuracy {}. Evaluated every {} steps.",
      memorised, generalised, c.eval_interval));
  page.figures({svg::line_chart_svg(loss_chart(r)), svg::line_chart_svg(accuracy_chart(r))});

  page.heading(2, "The embedding in the Fourier basis");
  page.paragraph(fmt::format(
      "W_E's rows for the numbers 0 .. {} as functions on Z_{}, written in the orthonormal Fourier basis (the "
      "constant, then cos and sin of 2πk·x/{} for k = 1 .. {}); the bar of frequency k is the norm of its cos and "
      "sin components together. The key frequencies are the fewest that carry 90 % of the squared norm of all "
      "frequencies. The constant component's norm is {}.",
      c.p - 1, c.p, c.p, (c.p - 1) / 2, fixed(r.constant_norm)));
  page.raw(html::figures({spectrum_svg(r)}));

  page.heading(2, "The MLP neurons");
  const std::vector<NeuronCluster> clusters = neuron_clusters(r);
  std::int64_t explained = 0;
  for (const auto& k : clusters) explained += k.neurons;
  page.paragraph(fmt::format(
      "Each neuron's activation at \"=\" over the {} pairs, in the 2D Fourier basis of (a, b): the fraction of its "
      "variance in the terms of one frequency k (cos ka, sin ka, cos kb, sin kb and their products), for the k "
      "that explains most (Nanda et al. 2023, section 4.2). {} of the {} neurons have at least {:.0f} % of their "
      "variance explained by one frequency ({} are dead: constant over the pairs); they fall into the {} "
      "clusters below. The embedding's key frequencies are {}.",
      c.p * c.p, explained, r.neuron_frequency.size(), 100 * kWellExplained, dead_neurons(r), clusters.size(),
      keys_text(r.key_frequencies)));
  html::Table neurons;
  neurons.caption = fmt::format("Neurons explained >= {:.0f} % by one frequency", 100 * kWellExplained);
  neurons.header = {"frequency", "key frequency of W_E", "neurons", "mean fraction explained"};
  neurons.attributes = "id=\"neuron-clusters\"";
  neurons.row_attributes = "class=\"neuron-row\"";
  for (const auto& k : clusters) {
    const bool key = std::find(r.key_frequencies.begin(), r.key_frequencies.end(), k.frequency) !=
                     r.key_frequencies.end();
    neurons.rows.push_back({std::to_string(k.frequency), key ? "yes" : "no", std::to_string(k.neurons),
                            fmt::format("{:.1f} %", 100 * k.mean_explained)});
  }
  page.table(neurons);

  page.heading(2, "Progress measures");
  page.paragraph(
      "Taken at snapshots of the weights, with the key frequencies of the final model. Restricted loss: each MLP "
      "neuron's activation at \"=\" replaced by its mean over the pairs plus its components along cos(w(a+b)) "
      "and sin(w(a+b)) for the key frequencies w, read through W_out and W_U alone (the logits shifted to the "
      "model's mean), on the test pairs: it falls when the Fourier circuit forms, before the test loss does. "
      "Excluded loss: those components removed from the activations, the rest of the residual stream kept, on "
      "the training pairs: it rises as the memorised solution is replaced by the circuit. At the end the "
      "restricted loss can be below the test loss, and even the training loss: keeping only the key frequencies "
      "removes what is left of the memorised solution, which still costs a little on every pair. The weight norm "
      "(all trained weights together) is what weight decay shrinks; it falls while the model generalises.");
  page.figures({svg::line_chart_svg(progress_chart(r))});
  html::Table progress;
  progress.caption = "At each snapshot";
  progress.header = {"step",          "train loss",       "test loss", "restricted loss",
                     "excluded loss", "key share of W_E", "weight norm"};
  progress.attributes = "id=\"progress\"";
  progress.row_attributes = "class=\"progress-row\"";
  for (const auto& p : r.progress)
    progress.rows.push_back({std::to_string(p.step), sci(p.train_loss), sci(p.test_loss), sci(p.restricted_loss),
                             sci(p.excluded_loss), fmt::format("{:.1f} %", 100 * p.key_share),
                             fmt::format("{:.1f}", p.weight_norm)});
  page.table(progress);
  page.data("summary", summary_json(r));
  return page.html();
}

}  // namespace grokking
