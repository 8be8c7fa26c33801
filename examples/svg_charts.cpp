#include "svg_charts.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

namespace svg {

std::string escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

double text_width(std::string_view text, double font_size) {
  double chars = 0;
  for (unsigned char c : text)
    if ((c & 0xC0) != 0x80) chars += 1;  // count UTF-8 characters, not bytes
  return chars * font_size * 0.62;
}

std::string svg_open(double width, double height, const std::string& attributes) {
  return fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" "
                     "viewBox=\"0 0 {:.0f} {:.0f}\" font-family=\"sans-serif\" font-size=\"11\"{}{}>\n"
                     "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
                     width, height, width, height, attributes.empty() ? "" : " ", attributes);
}

ColourScale ColourScale::sequential(double lo, double hi, std::string label) {
  if (!(hi > lo)) throw std::invalid_argument(fmt::format("ColourScale::sequential: wants lo < hi, got {} and {}", lo, hi));
  return {lo, hi, false, std::move(label)};
}

ColourScale ColourScale::diverging_for(const std::vector<double>& values, std::string label) {
  double m = 0;
  for (double v : values)
    if (std::isfinite(v)) m = std::max(m, std::abs(v));
  if (m == 0) m = 1;
  return {-m, m, true, std::move(label)};
}

namespace {

struct Rgb {
  double r, g, b;
};

Rgb mix(Rgb a, Rgb b, double t) { return {a.r + (b.r - a.r) * t, a.g + (b.g - a.g) * t, a.b + (b.b - a.b) * t}; }

Rgb scale_rgb(const ColourScale& s, double value) {
  const Rgb white{255, 255, 255}, blue{33, 75, 180}, div_blue{33, 102, 172}, red{178, 24, 43};
  if (!std::isfinite(value)) return {200, 200, 200};
  const double t = std::clamp((value - s.lo) / (s.hi - s.lo), 0.0, 1.0);
  if (!s.diverging) return mix(white, blue, t);
  return t < 0.5 ? mix(div_blue, white, t * 2) : mix(white, red, t * 2 - 1);
}

std::string css(Rgb c) {
  return fmt::format("rgb({},{},{})", std::lround(c.r), std::lround(c.g), std::lround(c.b));
}

bool dark(Rgb c) { return 0.299 * c.r + 0.587 * c.g + 0.114 * c.b < 140; }

std::string default_format(double v) { return fmt::format("{:.3f}", v); }

// Row and column labels: given ones, else the positions.
std::string label_at(const std::vector<std::string>& labels, std::int64_t i) {
  return i < static_cast<std::int64_t>(labels.size()) ? labels[static_cast<std::size_t>(i)] : std::to_string(i);
}

// The layout of one heatmap: where the grid is and how big everything is.
struct Layout {
  double title_h = 22, axis_h = 14, label_h = 14, note_h = 0, left = 0, legend_h = 46, width = 0, height = 0;
  double grid_x() const { return left; }
  double grid_y() const { return title_h + axis_h + label_h + note_h; }
};

Layout layout(const Heatmap& m) {
  Layout l;
  l.note_h = m.col_notes.empty() ? 0 : 12;
  double row_label_w = 0;
  for (std::int64_t r = 0; r < m.rows; ++r) {
    const std::string note = r < static_cast<std::int64_t>(m.row_notes.size()) ? m.row_notes[static_cast<std::size_t>(r)] : "";
    row_label_w = std::max(row_label_w, text_width(label_at(m.row_labels, r), 11) + text_width(note, 9) + 6);
  }
  l.left = 18 + row_label_w + 4;  // the rotated row-axis title, then the labels
  const double grid_w = m.cell * static_cast<double>(m.cols);
  const double legend_w = 20 + text_width(m.scale.label, 10) + 160;
  l.width = std::max({l.left + grid_w + 12, text_width(m.title, 13) + 12, text_width(m.col_axis + " →", 10) + l.left,
                      legend_w});
  if (!m.notes_label.empty()) {
    l.legend_h += 14;
    l.width = std::max(l.width, text_width(m.notes_label, 10) + 12);
  }
  l.height = l.grid_y() + m.cell * static_cast<double>(m.rows) + l.legend_h;
  return l;
}

// The labels of the rows and columns, and the axis titles.
std::string heatmap_labels(const Heatmap& m, const Layout& l) {
  std::string s;
  const double gx = l.grid_x(), gy = l.grid_y();
  s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"10\" fill=\"#444\" class=\"axis-title\">{} →</text>\n", gx,
                   l.title_h + 10, escape(m.col_axis));
  s += fmt::format("<text transform=\"translate(11,{:.1f}) rotate(-90)\" text-anchor=\"middle\" font-size=\"10\" "
                   "fill=\"#444\" class=\"axis-title\">{}</text>\n",
                   gy + m.cell * static_cast<double>(m.rows) / 2, escape(m.row_axis));
  for (std::int64_t c = 0; c < m.cols; ++c) {
    const double x = gx + (static_cast<double>(c) + 0.5) * m.cell;
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" class=\"col-label\">{}</text>\n", x,
                     l.title_h + l.axis_h + 10, escape(label_at(m.col_labels, c)));
    if (c < static_cast<std::int64_t>(m.col_notes.size()))
      s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" font-size=\"9\" fill=\"#777\">{}</text>\n",
                       x, l.title_h + l.axis_h + l.label_h + 8, escape(m.col_notes[static_cast<std::size_t>(c)]));
  }
  for (std::int64_t r = 0; r < m.rows; ++r) {
    const double y = gy + (static_cast<double>(r) + 0.5) * m.cell + 4;
    std::string note;
    if (r < static_cast<std::int64_t>(m.row_notes.size()))
      note = fmt::format("<tspan font-size=\"9\" fill=\"#777\"> {}</tspan>", escape(m.row_notes[static_cast<std::size_t>(r)]));
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\" class=\"row-label\">{}{}</text>\n", gx - 4, y,
                     escape(label_at(m.row_labels, r)), note);
  }
  return s;
}

std::string heatmap_cells(const Heatmap& m, const Layout& l) {
  const auto& format = m.format ? m.format : default_format;
  std::string s;
  for (std::int64_t r = 0; r < m.rows; ++r)
    for (std::int64_t c = 0; c < m.cols; ++c) {
      const double v = m.values[static_cast<std::size_t>(r * m.cols + c)];
      const double x = l.grid_x() + static_cast<double>(c) * m.cell, y = l.grid_y() + static_cast<double>(r) * m.cell;
      const bool masked = m.causal_mask && c > r;
      const Rgb fill = masked ? Rgb{236, 236, 236} : scale_rgb(m.scale, v);
      const std::string where = fmt::format("{} {}, {} {}", m.row_axis, label_at(m.row_labels, r), m.col_axis,
                                            label_at(m.col_labels, c));
      const std::string text = masked ? "masked (causal)" : format(v);
      s += fmt::format("<rect class=\"cell\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"{}\" height=\"{}\" fill=\"{}\" "
                       "stroke=\"#ccc\" stroke-width=\"0.5\" data-r=\"{}\" data-c=\"{}\" data-v=\"{}\"><title>{}: "
                       "{}</title></rect>\n",
                       x, y, m.cell, m.cell, css(fill), r, c, escape(text), escape(where), escape(text));
      if (m.show_values && !masked)
        s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" font-size=\"11\" fill=\"{}\" "
                         "pointer-events=\"none\">{}</text>\n",
                         x + m.cell / 2, y + m.cell / 2 + 4, dark(fill) ? "white" : "black", escape(text));
    }
  return s;
}

// The colour scale: a bar of 24 steps from lo to hi with the range's ends and middle as numbers.
std::string legend(const ColourScale& sc, double x, double y) {
  const double bar_w = 144, step = bar_w / 24;
  std::string s = fmt::format("<g class=\"colour-scale\" data-lo=\"{}\" data-hi=\"{}\">\n", sc.lo, sc.hi);
  s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"10\" fill=\"#444\">colour: {}</text>\n", x, y + 9,
                   escape(sc.label));
  for (int i = 0; i < 24; ++i) {
    const double v = sc.lo + (sc.hi - sc.lo) * (i + 0.5) / 24;
    s += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"10\" fill=\"{}\"/>\n", x + i * step, y + 14,
                     step + 0.3, css(scale_rgb(sc, v)));
  }
  s += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{}\" height=\"10\" fill=\"none\" stroke=\"#888\" "
                   "stroke-width=\"0.5\"/>\n",
                   x, y + 14, bar_w);
  const double ticks[] = {sc.lo, (sc.lo + sc.hi) / 2, sc.hi};
  const char* anchors[] = {"start", "middle", "end"};
  for (int i = 0; i < 3; ++i)
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"10\" text-anchor=\"{}\" class=\"scale-tick\">{:.3g}"
                     "</text>\n",
                     x + bar_w * i / 2, y + 36, anchors[i], ticks[i] == 0 ? 0.0 : ticks[i]);
  return s + "</g>\n";
}

}  // namespace

std::string ColourScale::colour(double value) const { return css(scale_rgb(*this, value)); }

Size heatmap_size(const Heatmap& m) {
  const Layout l = layout(m);
  return {l.width, l.height};
}

std::string heatmap_svg(const Heatmap& m, double x, double y, bool standalone) {
  if (m.rows < 1 || m.cols < 1 || m.values.size() != static_cast<std::size_t>(m.rows * m.cols))
    throw std::invalid_argument(fmt::format("heatmap_svg: '{}' has {} values for {} x {} cells", m.title,
                                            m.values.size(), m.rows, m.cols));
  const Layout l = layout(m);
  const std::string attrs = fmt::format("class=\"heatmap\" data-rows=\"{}\" data-cols=\"{}\" data-row-axis=\"{}\" "
                                        "data-col-axis=\"{}\"{}{}",
                                        m.rows, m.cols, escape(m.row_axis), escape(m.col_axis),
                                        m.attributes.empty() ? "" : " ", m.attributes);
  std::string s = standalone ? svg_open(l.width, l.height, attrs)
                             : fmt::format("<svg x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.0f}\" height=\"{:.0f}\" {}>\n", x,
                                           y, l.width, l.height, attrs);
  s += fmt::format("<text x=\"2\" y=\"15\" font-size=\"13\" font-weight=\"bold\" class=\"map-title\">{}</text>\n",
                   escape(m.title));
  s += heatmap_labels(m, l);
  s += heatmap_cells(m, l);
  const double below = l.grid_y() + m.cell * static_cast<double>(m.rows) + 6;
  s += legend(m.scale, 4, below);
  if (!m.notes_label.empty())
    s += fmt::format("<text x=\"4\" y=\"{:.1f}\" font-size=\"10\" fill=\"#777\">{}</text>\n", below + 52,
                     escape(m.notes_label));
  return s + "</svg>\n";
}

std::string heatmap_row_svg(const std::string& title, const std::vector<Heatmap>& maps, double gap) {
  double width = 0, height = 0;
  for (const auto& m : maps) {
    const Size z = heatmap_size(m);
    width += z.width + (width > 0 ? gap : 0);
    height = std::max(height, z.height);
  }
  width = std::max(width, text_width(title, 14)) + 20;
  std::string s = svg_open(width, height + 36);
  s += fmt::format("<text x=\"10\" y=\"20\" font-size=\"14\">{}</text>\n", escape(title));
  double x = 10;
  for (const auto& m : maps) {
    s += heatmap_svg(m, x, 32);
    x += heatmap_size(m).width + gap;
  }
  return s + "</svg>\n";
}

}  // namespace svg
