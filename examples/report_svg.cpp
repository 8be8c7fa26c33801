#include "report_svg.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include <fmt/format.h>

namespace heads {

namespace {

std::string svg_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

std::string svg_open(double width, double height) {
  return fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" font-family=\"sans-serif\" "
      "font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      width, height);
}

// One head's map with its top-left corner at (x0, y0): tokens label the rows and columns.
std::string head_map(const RunRecord& r, std::int64_t h, double x0, double y0, double cell) {
  const AttentionSample& w = r.sample;
  const HeadFocus& f = r.focus[static_cast<std::size_t>(h)];
  std::string s = fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"12\">head {}: {} ({:.2f})</text>\n", x0,
                              y0 - 18, h + 1, svg_escape(f.label), f.mean_weight);
  for (std::int64_t t = 0; t < w.length; ++t) {
    const auto tok = w.tokens[static_cast<std::size_t>(t)];
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", x0 - 4,
                     y0 + (static_cast<double>(t) + 0.7) * cell, tok);
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n",
                     x0 + (static_cast<double>(t) + 0.5) * cell, y0 - 3, tok);
    for (std::int64_t k = 0; k < w.length; ++k) {
      const double v = std::clamp(w.at(h, t, k), 0.0, 1.0);
      // white (0) to deep blue (1)
      const int red = static_cast<int>(std::lround(255 - 222 * v)), green = static_cast<int>(std::lround(255 - 180 * v));
      const int blue = static_cast<int>(std::lround(255 - 75 * v));
      s += fmt::format(
          "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{}\" height=\"{}\" fill=\"rgb({},{},{})\" stroke=\"#ddd\" "
          "stroke-width=\"0.5\"><title>query {} -> key {}: {:.3f}</title></rect>\n",
          x0 + static_cast<double>(k) * cell, y0 + static_cast<double>(t) * cell, cell, cell, red, green, blue, t, k, v);
    }
  }
  return s;
}

}  // namespace

std::string attention_svg(const RunRecord& r) {
  const std::int64_t H = r.sample.heads, T = r.sample.length;
  const double cell = 22, margin = 40, gap = 50, title_h = 46;
  const double map = cell * static_cast<double>(T);
  const double width = std::max(600.0, margin * 2 + static_cast<double>(H) * map + static_cast<double>(H - 1) * gap);
  const double height = title_h + margin + map + 30;
  std::string s = svg_open(width, height);
  s += fmt::format("<text x=\"{}\" y=\"18\" font-size=\"14\">Attention weights, {} head{}, on a test sequence "
                   "(row: query position t, column: key position)</text>\n",
                   margin, r.heads, r.heads == 1 ? "" : "s");
  for (std::int64_t h = 0; h < H; ++h)
    s += head_map(r, h, margin + static_cast<double>(h) * (map + gap), title_h + margin - 10, cell);
  s += fmt::format("<text x=\"{}\" y=\"{:.0f}\" fill=\"#555\">tokens label the rows and columns; darker = more weight "
                   "(hover a cell for its value)</text>\n",
                   margin, height - 8);
  s += "</svg>\n";
  return s;
}

namespace {

// The plot area of the loss picture: step 0 .. steps across, loss 0 .. ymax up.
struct LossAxes {
  double W = 640, H = 360, left = 60, right = 20, top = 40, bottom = 45;
  double steps = 1, ymax = 1;
  double x(double step) const { return left + (W - left - right) * step / steps; }
  double y(double loss) const { return top + (H - top - bottom) * (1 - std::clamp(loss, 0.0, ymax) / ymax); }
};

std::string loss_axes(const LossAxes& a, double chance_loss) {
  std::string s = fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"black\"/>\n", a.left, a.top,
                              a.H - a.bottom);
  s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"black\"/>\n", a.left, a.H - a.bottom,
                   a.W - a.right);
  for (int i = 0; i <= 5; ++i) {
    const double v = a.ymax * i / 5;
    s += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#eee\"/>\n", a.left, a.y(v),
                     a.W - a.right, a.y(v));
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{:.1f}</text>\n", a.left - 5, a.y(v) + 4, v);
    const double st = a.steps * i / 5;
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{:.0f}</text>\n", a.x(st),
                     a.H - a.bottom + 15, st);
  }
  s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">step</text>\n", (a.left + a.W - a.right) / 2,
                   a.H - 8);
  s += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#999\" stroke-dasharray=\"4 3\"/>"
                   "<text x=\"{:.1f}\" y=\"{:.1f}\" fill=\"#777\" text-anchor=\"end\">chance (ln classes)</text>\n",
                   a.left, a.y(chance_loss), a.W - a.right, a.y(chance_loss), a.W - a.right - 4, a.y(chance_loss) - 4);
  return s;
}

// The polyline of one run's loss, each point the mean of the last 25 steps (fewer at the start).
std::string loss_curve(const LossAxes& a, const std::vector<double>& losses, const char* color) {
  std::string points;
  for (std::size_t k = 0; k < losses.size(); ++k) {
    const std::size_t lo = k >= 24 ? k - 24 : 0;
    double avg = 0;
    for (std::size_t j = lo; j <= k; ++j) avg += losses[j];
    avg /= static_cast<double>(k - lo + 1);
    points += fmt::format("{:.1f},{:.1f} ", a.x(static_cast<double>(k + 1)), a.y(avg));
  }
  return fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" points=\"{}\"/>\n", color, points);
}

}  // namespace

std::string loss_svg(const std::vector<RunRecord>& runs, double chance_loss) {
  LossAxes a;
  a.ymax = chance_loss * 1.15;
  for (const auto& r : runs)
    for (double l : r.losses) a.ymax = std::max(a.ymax, std::min(l, chance_loss * 1.5));
  a.steps = static_cast<double>(runs.front().losses.size());
  std::string s = svg_open(a.W, a.H);
  s += fmt::format("<text x=\"{}\" y=\"22\" font-size=\"14\">Training loss (cross entropy, moving average of 25 "
                   "steps)</text>\n",
                   a.left);
  s += loss_axes(a, chance_loss);
  const char* colors[] = {"#d62728", "#1f77b4", "#2ca02c", "#9467bd"};
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const auto& r = runs[i];
    const char* color = colors[i % 4];
    s += loss_curve(a, r.losses, color);
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" fill=\"{}\">{} head{}: test accuracy {:.1f}%</text>\n",
                     a.W - a.right - 220, a.top + 80 + 16 * static_cast<double>(i), color, r.heads,
                     r.heads == 1 ? "" : "s", 100 * r.accuracy);
  }
  s += "</svg>\n";
  return s;
}

}  // namespace heads

