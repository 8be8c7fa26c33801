#include "report_svg.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include <fmt/format.h>

namespace heads {

svg::Heatmap head_heatmap(const std::vector<double>& values, std::int64_t head, std::int64_t T, std::string title,
                          const svg::ColourScale& scale, const std::vector<std::int64_t>& tokens) {
  svg::Heatmap m;
  m.title = std::move(title);
  m.rows = m.cols = T;
  const auto begin = values.begin() + static_cast<std::ptrdiff_t>(head * T * T);
  m.values.assign(begin, begin + static_cast<std::ptrdiff_t>(T * T));
  for (auto tok : tokens) m.row_notes.push_back(std::to_string(tok));
  m.col_notes = m.row_notes;
  if (!tokens.empty()) m.notes_label = "grey: the token at each position";
  m.scale = scale;
  m.causal_mask = true;
  m.attributes = fmt::format("data-head=\"{}\"", head + 1);
  if (scale.diverging) m.format = [](double v) { return fmt::format("{:.3g}", v); };
  return m;
}

svg::ColourScale weight_scale() { return svg::ColourScale::sequential(0, 1, "attention weight"); }

const char* run_colour(std::size_t i) {
  const char* colours[] = {"#d62728", "#1f77b4", "#2ca02c", "#9467bd"};
  return colours[i % 4];
}

std::string attention_svg(const RunRecord& r) {
  std::vector<svg::Heatmap> maps;
  for (std::int64_t h = 0; h < r.sample.heads; ++h) {
    const HeadFocus& f = r.focus[static_cast<std::size_t>(h)];
    maps.push_back(head_heatmap(r.sample.weights, h, r.sample.length,
                                fmt::format("head {}: {} ({:.2f})", h + 1, f.label, f.mean_weight), weight_scale(),
                                r.sample.tokens));
  }
  return svg::heatmap_row_svg(fmt::format("Attention weights, {} head{}, on a test sequence",
                                          r.heads, r.heads == 1 ? "" : "s"),
                              maps);
}

svg::LineChart loss_chart(const std::vector<RunRecord>& runs, double chance_loss) {
  svg::LineChart c;
  c.title = "Training loss (cross entropy, moving average of 25 steps)";
  c.x_label = "step";
  c.y_label = "loss";
  c.y_max = chance_loss * 1.15;
  for (const auto& r : runs)
    for (double l : r.losses) c.y_max = std::max(c.y_max, std::min(l, chance_loss * 1.5));
  c.references.push_back({chance_loss, "chance (ln classes)"});
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const auto& losses = runs[i].losses;
    svg::Series s;
    s.name = fmt::format("{} head{}: test accuracy {:.1f}%", runs[i].heads, runs[i].heads == 1 ? "" : "s",
                         100 * runs[i].accuracy);
    s.colour = run_colour(i);
    double window = 0;  // the sum of the last 25 losses
    for (std::size_t k = 0; k < losses.size(); ++k) {
      window += losses[k] - (k >= 25 ? losses[k - 25] : 0.0);
      s.x.push_back(static_cast<double>(k + 1));
      s.y.push_back(window / static_cast<double>(std::min<std::size_t>(k + 1, 25)));
    }
    c.series.push_back(std::move(s));
  }
  return c;
}

std::string loss_svg(const std::vector<RunRecord>& runs, double chance_loss) {
  return svg::line_chart_svg(loss_chart(runs, chance_loss));
}

}  // namespace heads
