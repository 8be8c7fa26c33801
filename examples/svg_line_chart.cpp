// svg::line_chart_svg: curves against a common x axis, with ticks at round numbers.
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

#include "svg_charts.hpp"

namespace svg {

namespace {

// A round tick spacing (1, 2 or 5 times a power of ten) giving about `n` ticks over `range`.
double nice_step(double range, int n) {
  const double raw = range / n;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
}

// The plot area: data (x0..x1, y0..y1) onto pixels. On a log axis y0 and y1 are log10 of the
// range and py takes the value itself.
struct Axes {
  double left = 62, right = 18, top = 36, bottom = 46, W = 640, H = 360;
  double x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  bool log_y = false;
  double px(double x) const { return left + (W - left - right) * (x - x0) / (x1 - x0); }
  double py(double y) const {
    const double v = log_y ? std::log10(y) : y;
    return H - bottom - (H - top - bottom) * (std::clamp(v, y0, y1) - y0) / (y1 - y0);
  }
};

// A value the chart can draw: finite, and positive on a log axis.
bool drawable(double y, bool log_y) { return std::isfinite(y) && (!log_y || y > 0); }

Axes fit_axes(const LineChart& c) {
  Axes a;
  a.W = c.width;
  a.H = c.height;
  a.log_y = c.log_y;
  double xmin = std::numeric_limits<double>::infinity(), xmax = -xmin, ymin = xmin, ymax = -xmin;
  for (const auto& s : c.series) {
    if (s.x.size() != s.y.size())
      throw std::invalid_argument(fmt::format("line_chart_svg: series '{}' has {} x values and {} y values", s.name,
                                              s.x.size(), s.y.size()));
    for (std::size_t i = 0; i < s.x.size(); ++i) {
      xmin = std::min(xmin, s.x[i]);
      xmax = std::max(xmax, s.x[i]);
      if (drawable(s.y[i], c.log_y)) ymin = std::min(ymin, s.y[i]), ymax = std::max(ymax, s.y[i]);
    }
  }
  if (!(xmax > xmin)) xmin = 0, xmax = std::isfinite(xmax) && xmax > 0 ? xmax : 1;
  a.x0 = std::min(0.0, xmin);
  a.x1 = xmax;
  if (c.log_y) {
    const bool given = c.y_max > c.y_min && c.y_min > 0;
    if (!given && !(ymax >= ymin)) ymin = 1, ymax = 10;
    a.y0 = std::floor(std::log10(given ? c.y_min : ymin));
    a.y1 = std::ceil(std::log10(given ? c.y_max : ymax));
    if (a.y1 <= a.y0) a.y1 = a.y0 + 1;
  } else if (c.y_max > c.y_min) {
    a.y0 = c.y_min, a.y1 = c.y_max;
  } else {
    if (!(ymax > ymin)) ymin = std::isfinite(ymin) ? ymin - 1 : 0, ymax = ymin + 2;
    a.y0 = ymin, a.y1 = ymax;
  }
  return a;
}

std::string axes_svg(const LineChart& c, const Axes& a) {
  std::string s = fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"black\"/>\n"
                              "<line x1=\"{0}\" y1=\"{2}\" x2=\"{3}\" y2=\"{2}\" stroke=\"black\"/>\n",
                              a.left, a.top, a.H - a.bottom, a.W - a.right);
  if (a.log_y) {
    // A tick at every power of ten (every second or third one on a tall range).
    const int every = a.y1 - a.y0 > 12 ? 3 : a.y1 - a.y0 > 6 ? 2 : 1;
    for (int e = static_cast<int>(a.y0); e <= static_cast<int>(a.y1); e += every) {
      const double y = a.py(std::pow(10.0, e));
      s += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#eee\"/>"
                       "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\" class=\"y-tick\">1e{}</text>\n",
                       a.left, y, a.W - a.right, y, a.left - 5, y + 4, e);
    }
  }
  const double ys = nice_step(a.y1 - a.y0, 5);
  for (double v = std::ceil(a.y0 / ys - 1e-9) * ys; !a.log_y && v <= a.y1 + ys * 1e-9; v += ys) {
    const double y = a.py(v);
    s += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#eee\"/>"
                     "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\" class=\"y-tick\">{:g}</text>\n",
                     a.left, y, a.W - a.right, y, a.left - 5, y + 4, std::abs(v) < ys * 1e-9 ? 0.0 : v);
  }
  const double xs = nice_step(a.x1 - a.x0, 6);
  for (double v = std::ceil(a.x0 / xs - 1e-9) * xs; v <= a.x1 + xs * 1e-9; v += xs) {
    const double x = a.px(v);
    s += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" stroke=\"black\"/>"
                     "<text x=\"{0:.1f}\" y=\"{3:.1f}\" text-anchor=\"middle\" class=\"x-tick\">{4:g}</text>\n",
                     x, a.H - a.bottom, a.H - a.bottom + 4, a.H - a.bottom + 16, std::abs(v) < xs * 1e-9 ? 0.0 : v);
  }
  s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", (a.left + a.W - a.right) / 2,
                   a.H - 10, escape(c.x_label));
  s += fmt::format("<text transform=\"translate(14,{:.1f}) rotate(-90)\" text-anchor=\"middle\">{}</text>\n",
                   (a.top + a.H - a.bottom) / 2, escape(c.y_label));
  for (const auto& r : c.references) {
    const double y = a.py(r.y);
    s += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#999\" "
                     "stroke-dasharray=\"4 3\"/><text x=\"{:.1f}\" y=\"{:.1f}\" fill=\"#777\" text-anchor=\"end\">{}"
                     "</text>\n",
                     a.left, y, a.W - a.right, y, a.W - a.right - 4, y - 4, escape(r.label));
  }
  return s;
}

std::string series_svg(const Series& s, const Axes& a, const LineChart& c) {
  std::string points;
  for (std::size_t i = 0; i < s.x.size(); ++i)
    if (drawable(s.y[i], a.log_y)) points += fmt::format("{:.1f},{:.1f} ", a.px(s.x[i]), a.py(s.y[i]));
  std::string out = fmt::format("<g class=\"series\" data-name=\"{}\"><polyline fill=\"none\" stroke=\"{}\" "
                                "stroke-width=\"1.6\" points=\"{}\"/>\n",
                                escape(s.name), s.colour, points);
  if (s.markers)
    for (std::size_t i = 0; i < s.x.size(); ++i) {
      if (!drawable(s.y[i], a.log_y)) continue;
      const std::string text = fmt::format("{}: {} {:g}, {} {:.4g}", s.name, c.x_label, s.x[i], c.y_label, s.y[i]);
      out += fmt::format("<circle class=\"point\" cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\" data-v=\"{}\">"
                         "<title>{}</title></circle>\n",
                         a.px(s.x[i]), a.py(s.y[i]), s.colour, escape(text), escape(text));
    }
  return out + "</g>\n";
}

}  // namespace

std::string line_chart_svg(const LineChart& c) {
  LineChart fitted = c;
  fitted.width = std::max(c.width, text_width(c.title, 14) + 20);
  Axes a = fit_axes(fitted);
  a.top = 36 + 16 * static_cast<double>(c.series.size());  // the legend above the plot area
  a.H += a.top - 36;
  fitted.height = a.H;
  std::string s = svg_open(fitted.width, a.H, "class=\"line-chart\"" + (c.attributes.empty() ? "" : " " + c.attributes));
  s += fmt::format("<text x=\"10\" y=\"20\" font-size=\"14\" class=\"chart-title\">{}</text>\n", escape(c.title));
  s += axes_svg(fitted, a);
  for (const auto& series : c.series) s += series_svg(series, a, fitted);
  const double lx = a.left + 10;
  for (std::size_t i = 0; i < c.series.size(); ++i) {
    const double y = 44 + 16 * static_cast<double>(i);
    s += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\" stroke-width=\"2\"/>"
                     "<text x=\"{:.1f}\" y=\"{:.1f}\" class=\"legend\">{}</text>\n",
                     lx, y - 4, lx + 20, y - 4, c.series[i].colour, lx + 26, y, escape(c.series[i].name));
  }
  return s + "</svg>\n";
}

}  // namespace svg
