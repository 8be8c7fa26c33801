#include "nn/viewer.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string_view>

#include <fmt/format.h>

#include "atomic_file.hpp"
#include "names.hpp"
#include "nn/module.hpp"

namespace nn::viewer {

namespace {

constexpr const char* kOp = "nn::viewer";

// In <head>: every script error and unhandled rejection is counted on <html data-script-errors>
// and shown in <pre id="script-errors">.
constexpr const char* kCatcher = R"JS(
(function () {
  var n = 0, early = [];
  function report(m) {
    n += 1;
    document.documentElement.setAttribute('data-script-errors', String(n));
    var pre = document.getElementById('script-errors');
    if (!pre) { early.push(m); return; }
    pre.hidden = false;
    pre.textContent += early.splice(0).concat([m]).join('\n') + '\n';
  }
  window.addEventListener('error', function (e) { report('error: ' + e.message); }, true);
  window.addEventListener('unhandledrejection', function (e) {
    report('unhandled rejection: ' + ((e.reason && e.reason.message) || e.reason));
  });
})();
)JS";

// Last in <body>: the contents list, the tooltip (the <title> of the cell or point under the
// pointer), the highlight of a query's row and key's column across a head's map; then ready.
constexpr const char* kScript = R"JS(
(function () {
  var toc = document.querySelector('#toc ol');
  document.querySelectorAll('h2[id]').forEach(function (h) {
    var li = document.createElement('li'), a = document.createElement('a');
    a.href = '#' + h.id;
    a.textContent = h.textContent;
    li.appendChild(a);
    toc.appendChild(li);
  });
  var tip = document.createElement('div');
  tip.id = 'tooltip';
  tip.hidden = true;
  document.body.appendChild(tip);
  document.addEventListener('mouseover', function (e) {
    var el = e.target.closest ? e.target.closest('[data-v]') : null;
    document.querySelectorAll('.hl').forEach(function (c) { c.classList.remove('hl'); });
    if (!el) { tip.hidden = true; return; }
    var t = el.querySelector('title');
    tip.textContent = t ? t.textContent : el.getAttribute('data-v');
    tip.hidden = false;
    var svg = el.closest('svg');
    if (svg && el.hasAttribute('data-r'))
      svg.querySelectorAll('[data-r="' + el.getAttribute('data-r') + '"]').forEach(function (c) { c.classList.add('hl'); });
  });
  document.addEventListener('mousemove', function (e) {
    tip.style.left = (e.clientX + 14) + 'px';
    tip.style.top = (e.clientY + 14) + 'px';
  });
  document.documentElement.setAttribute('data-js-ready', '1');
})();
)JS";

constexpr const char* kStyle = R"CSS(
body { font-family: 'DejaVu Sans', sans-serif; margin: 24px auto; max-width: 1200px; color: #222; }
h1 { font-size: 24px; } h2 { font-size: 19px; margin-top: 32px; border-bottom: 1px solid #ccc; }
#script-errors { color: #a00; background: #fee; border: 1px solid #a00; padding: 8px; }
.figures { display: flex; flex-wrap: wrap; gap: 16px; align-items: flex-start; }
figure { margin: 0 0 12px; width: fit-content; } figcaption { font-size: 13px; text-align: center; }
svg text { font-size: 11px; fill: #333; }
svg .cell.hl { stroke: #f80; stroke-width: 1.5; }
table { border-collapse: collapse; font-size: 13px; } td, th { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
#tooltip { position: fixed; background: #222; color: #fff; padding: 3px 7px; font-size: 12px; border-radius: 3px;
           pointer-events: none; }
)CSS";

std::string num(double v) {
  if (std::isnan(v)) return "none";
  return fmt::format("{:.4g}", v);
}

// White to blue for values in [0, max], white to red for [min, 0], red through white to blue when
// they have both signs: a positive value is blue whatever the map's range, so maps compare by colour.
std::string colour(double v, double lo, double hi) {
  if (!std::isfinite(v)) return "#ffffff";  // NaN and ±inf: blank (the hover text gives the value)
  const auto mix = [](double t, int r, int g, int b) {
    t = std::clamp(t, 0.0, 1.0);
    return fmt::format("#{:02x}{:02x}{:02x}", static_cast<int>(255 + t * (r - 255)), static_cast<int>(255 + t * (g - 255)),
                       static_cast<int>(255 + t * (b - 255)));
  };
  if (lo < 0 && hi > 0) {
    const double m = std::max(-lo, hi);
    return v >= 0 ? mix(v / m, 33, 102, 172) : mix(-v / m, 178, 24, 43);
  }
  if (hi <= 0) return mix(lo < 0 ? v / lo : 0.0, 178, 24, 43);
  return mix(hi > lo ? (v - std::min(lo, 0.0)) / (hi - std::min(lo, 0.0)) : 1.0, 33, 102, 172);
}

// A page is UTF-8: text that is not is refused, naming the call, the text and the offset of its
// first byte that is not part of valid UTF-8. Every entry point checks all its text before it
// writes anything, so a refused call leaves the page as it was.
void check_text(std::string_view call, std::string_view what, const std::string& text) {
  const std::size_t at = detail::invalid_utf8_at(text);
  if (at != std::string_view::npos)
    ag::fail(kOp, "{}: {} {} is not valid UTF-8 (byte 0x{:02x} at offset {}); a page is UTF-8", call, what,
             quote_name(text), static_cast<unsigned char>(text[at]), at);
}

void check_texts(std::string_view call, std::string_view what, const std::vector<std::string>& texts) {
  for (std::size_t i = 0; i < texts.size(); ++i) check_text(call, fmt::format("{} {}", what, i), texts[i]);
}

// A heatmap's text, its rows of equal length and a label per row and per column (or none).
void check_heatmap(const Heatmap& m) {
  check_text("heatmap", "title", m.title);
  const std::string call = fmt::format("heatmap {}", quote_name(m.title));
  check_texts(call, "row label", m.row_labels);
  check_texts(call, "column label", m.col_labels);
  check_text(call, "row_axis", m.row_axis);
  check_text(call, "col_axis", m.col_axis);
  check_text(call, "value_name", m.value_name);
  const std::size_t R = m.values.size(), C = R ? m.values[0].size() : 0;
  for (std::size_t r = 0; r < R; ++r)
    if (m.values[r].size() != C)
      ag::fail(kOp, "{}: row {} has {} values, row 0 has {}", call, r, m.values[r].size(), C);
  if (!m.row_labels.empty() && m.row_labels.size() != R)
    ag::fail(kOp, "{}: {} row labels for {} rows (give one per row, or none)", call, m.row_labels.size(), R);
  if (!m.col_labels.empty() && m.col_labels.size() != C)
    ag::fail(kOp, "{}: {} column labels for {} columns (give one per column, or none)", call, m.col_labels.size(), C);
}

std::string label_at(const std::vector<std::string>& labels, std::size_t i) {
  return i < labels.size() ? labels[i] : std::to_string(i);
}

// One heatmap as SVG, with a colour scale under it. `cell_title(r, c, v)` is the hover text. The
// map has passed check_heatmap.
template <class Title>
std::string heatmap_svg(const Heatmap& m, double cell, Title cell_title) {
  const std::size_t R = m.values.size(), C = R ? m.values[0].size() : 0;
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const auto& row : m.values)
    for (double v : row)
      if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  if (!(lo <= hi)) lo = hi = 0;
  const double left = 70, top = 60, w = cell * static_cast<double>(C), h = cell * static_cast<double>(R);
  std::string s = fmt::format(R"~(<svg class="heatmap" width="{}" height="{}" role="img" aria-label="{}">)~",
                              left + w + 10, top + h + 50, escape(m.title));
  for (std::size_t c = 0; c < C; ++c)
    s += fmt::format(R"~(<text class="col-label" transform="translate({},{}) rotate(-60)">{}</text>)~",
                     left + cell * (static_cast<double>(c) + 0.5), top - 4, escape(label_at(m.col_labels, c)));
  for (std::size_t r = 0; r < R; ++r) {
    s += fmt::format(R"~(<text class="row-label" x="{}" y="{}" text-anchor="end">{}</text>)~", left - 4,
                     top + cell * (static_cast<double>(r) + 0.7), escape(label_at(m.row_labels, r)));
    for (std::size_t c = 0; c < C; ++c) {
      const double v = m.values[r][c];
      s += fmt::format(R"~(<rect class="cell" data-r="{}" data-v="{}" x="{}" y="{}" width="{}" height="{}" fill="{}">)~"
                       R"~(<title>{}</title></rect>)~",
                       r, num(v), left + cell * static_cast<double>(c), top + cell * static_cast<double>(r), cell, cell,
                       colour(v, lo, hi), escape(cell_title(r, c, v)));
    }
  }
  // The colour scale: its ends and middle, named.
  const double y = top + h + 12;
  for (int i = 0; i <= 20; ++i) {
    const double v = lo + (hi - lo) * i / 20.0;
    s += fmt::format(R"~(<rect class="colour-scale" x="{}" y="{}" width="{}" height="10" fill="{}"/>)~",
                     left + w * i / 21.0, y, w / 21.0 + 0.5, colour(v, lo, hi));
  }
  s += fmt::format(R"~(<text class="scale-tick" x="{}" y="{}">{}</text>)~", left, y + 24, num(lo));
  s += fmt::format(R"~(<text class="scale-tick" x="{}" y="{}" text-anchor="end">{}</text>)~", left + w, y + 24, num(hi));
  s += fmt::format(R"~(<text x="{}" y="{}" text-anchor="middle">colour: {}</text></svg>)~", left + w / 2, y + 36,
                   escape(m.value_name));
  return s;
}

std::vector<double> values_of(const ag::Tensor& t) {
  ag::NoGradGuard no_grad;
  return t.to(ag::Dtype::Float64).to_vector();
}

}  // namespace

std::string escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

Page::Page(std::string title) : title_(std::move(title)) { check_text("Page", "title", title_); }

Page& Page::section(const std::string& heading) {
  check_text("section", "heading", heading);
  body_ += fmt::format("<h2 id=\"section-{}\">{}</h2>\n", ++sections_, escape(heading));
  return *this;
}

Page& Page::paragraph(const std::string& text) {
  check_text("paragraph", "text", text);
  body_ += "<p>" + escape(text) + "</p>\n";
  return *this;
}

Page& Page::attention_patterns(const ag::Tensor& pattern, const std::vector<std::string>& tokens,
                               const std::string& label, std::int64_t batch) {
  if (!pattern.defined() || (pattern.dim() != 3 && pattern.dim() != 4))
    ag::fail(kOp, "attention_patterns: pattern must be (H, T, S) or (B, H, T, S), got {}",
             pattern.defined() ? ag::shape_str(pattern.shape()) : "undefined");
  // An (H, T, S) pattern is one sequence: batch 0.
  const std::int64_t B = pattern.dim() == 4 ? pattern.size(0) : 1;
  if (batch < 0 || batch >= B)
    ag::fail(kOp, "attention_patterns: batch {} is out of range for pattern of shape {}: it holds {} sequence{}, batch "
             "in [0, {})", batch, ag::shape_str(pattern.shape()), B, B == 1 ? "" : "s", B);
  const ag::Tensor p = pattern.dim() == 4 ? ag::squeeze(ag::narrow(pattern, 0, batch, 1), 0) : pattern;
  const std::int64_t H = p.size(0), T = p.size(1), S = p.size(2);
  if (static_cast<std::int64_t>(tokens.size()) != T || S != T)
    ag::fail(kOp, "attention_patterns: {} tokens for a pattern of shape {} (T = S = the number of tokens needed)",
             tokens.size(), ag::shape_str(pattern.shape()));
  check_text("attention_patterns", "label", label);
  check_texts("attention_patterns", "token", tokens);
  const std::vector<double> v = values_of(p);
  const double cell = T <= 16 ? 22 : T <= 40 ? 12 : 6;
  std::vector<std::string> labels;
  for (std::int64_t i = 0; i < T; ++i) labels.push_back(fmt::format("{} {}", tokens[static_cast<std::size_t>(i)], i));
  body_ += "<div class=\"figures\">\n";
  for (std::int64_t h = 0; h < H; ++h) {
    Heatmap m{.title = fmt::format("{}H{}", label, h), .values = {}, .row_labels = labels, .col_labels = labels,
              .row_axis = "query", .col_axis = "key", .value_name = "attention weight"};
    for (std::int64_t i = 0; i < T; ++i) {
      m.values.emplace_back();
      for (std::int64_t j = 0; j < S; ++j) m.values.back().push_back(v[static_cast<std::size_t>((h * T + i) * S + j)]);
    }
    const std::string svg = heatmap_svg(m, cell, [&](std::size_t r, std::size_t c, double w) {
      return fmt::format("{}: query '{}' ({}) attends to key '{}' ({}): {}", m.title, tokens[r], r, tokens[c], c, num(w));
    });
    body_ += fmt::format("<figure data-head=\"{}\">{}<figcaption>{}</figcaption></figure>\n", escape(m.title), svg,
                         escape(m.title));
  }
  body_ += "</div>\n";
  return *this;
}

Page& Page::heatmap(const Heatmap& map) {
  check_heatmap(map);
  const std::size_t C = map.values.empty() ? 0 : map.values[0].size();
  const double cell = std::max(8.0, std::min(36.0, 720.0 / std::max<double>(1.0, static_cast<double>(C))));
  const std::string svg = heatmap_svg(map, cell, [&](std::size_t r, std::size_t c, double v) {
    return fmt::format("{} {}, {} {}: {}", map.row_axis, label_at(map.row_labels, r), map.col_axis,
                       label_at(map.col_labels, c), num(v));
  });
  body_ += fmt::format("<figure id=\"figure-{}\">{}<figcaption>{}</figcaption></figure>\n", ++figures_, svg,
                       escape(map.title));
  return *this;
}

Page& Page::heatmap(const std::string& title, const ag::Tensor& values, std::vector<std::string> row_labels,
                    std::vector<std::string> col_labels, std::string row_axis, std::string col_axis) {
  check_text("heatmap", "title", title);
  if (!values.defined() || values.dim() != 2)
    ag::fail(kOp, "heatmap {}: values must be (rows, columns), got {}", quote_name(title),
             values.defined() ? ag::shape_str(values.shape()) : "undefined");
  const std::vector<double> v = values_of(values);
  Heatmap m{.title = title, .values = {}, .row_labels = std::move(row_labels), .col_labels = std::move(col_labels),
            .row_axis = std::move(row_axis), .col_axis = std::move(col_axis)};
  for (std::int64_t r = 0; r < values.size(0); ++r)
    m.values.emplace_back(v.begin() + r * values.size(1), v.begin() + (r + 1) * values.size(1));
  return heatmap(m);
}

Page& Page::line_chart(const LineChart& chart) {
  check_text("line_chart", "title", chart.title);
  const std::string call = fmt::format("line_chart {}", quote_name(chart.title));
  check_text(call, "x_axis", chart.x_axis);
  check_text(call, "y_axis", chart.y_axis);
  check_texts(call, "x_label", chart.x_labels);
  std::size_t points = 0;  // of the longest series
  for (std::size_t k = 0; k < chart.series.size(); ++k) {
    const Series& s = chart.series[k];
    check_text(call, fmt::format("series {}: name", k), s.name);
    if (s.x.size() != s.y.size())
      ag::fail(kOp, "{}: series {} has {} x and {} y values", call, quote_name(s.name), s.x.size(), s.y.size());
    points = std::max(points, s.x.size());
  }
  // x_labels name the x values 0, 1, ...: a label past the last point would name nothing drawn.
  if (chart.x_labels.size() > points)
    ag::fail(kOp, "{}: {} x_labels for {} points ({}); give at most one label per point", call, chart.x_labels.size(),
             points, chart.series.empty() ? "no series" : "its longest series");
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  for (const auto& s : chart.series) {
    for (std::size_t i = 0; i < s.x.size(); ++i)
      if (std::isfinite(s.x[i]) && std::isfinite(s.y[i]))
        x0 = std::min(x0, s.x[i]), x1 = std::max(x1, s.x[i]), y0 = std::min(y0, s.y[i]), y1 = std::max(y1, s.y[i]);
  }
  if (!(x0 <= x1)) x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) y1 = y0 + 1;
  const double W = 640, Hh = 300, l = 60, t = 20, w = W - l - 160, h = Hh - t - 50;
  // halves first: x1 − x0 of values near ±1.8e308 would overflow
  const auto X = [&](double x) { return l + (x / 2 - x0 / 2) / (x1 / 2 - x0 / 2) * w; };
  const auto Y = [&](double y) { return t + h - (y / 2 - y0 / 2) / (y1 / 2 - y0 / 2) * h; };
  static const char* kColours[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf"};
  std::string s = fmt::format(R"~(<svg class="line-chart" width="{}" height="{}" role="img" aria-label="{}">)~", W, Hh,
                              escape(chart.title));
  s += fmt::format(R"~(<rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="#999"/>)~", l, t, w, h);
  for (int i = 0; i <= 4; ++i) {
    const double xv = x0 / 4 * (4 - i) + x1 / 4 * i, yv = y0 / 4 * (4 - i) + y1 / 4 * i;  // no x1 − x0: see X
    std::string xl = num(xv);
    if (!chart.x_labels.empty()) {
      const double r = std::round(xv);
      xl = r >= 0 && r < static_cast<double>(chart.x_labels.size()) && std::abs(r - xv) < 1e-9
               ? chart.x_labels[static_cast<std::size_t>(r)] : "";
    }
    s += fmt::format(R"~(<text class="x-tick" x="{}" y="{}" text-anchor="middle">{}</text>)~", X(xv), t + h + 14, escape(xl));
    s += fmt::format(R"~(<text class="y-tick" x="{}" y="{}" text-anchor="end">{}</text>)~", l - 4, Y(yv) + 4, num(yv));
  }
  s += fmt::format(R"~(<text x="{}" y="{}" text-anchor="middle">{}</text>)~", l + w / 2, Hh - 8, escape(chart.x_axis));
  s += fmt::format(R"~(<text transform="translate(12,{}) rotate(-90)" text-anchor="middle">{}</text>)~", t + h / 2,
                   escape(chart.y_axis));
  for (double m : chart.marks)
    if (std::isfinite(m))
      s += fmt::format(R"~(<line class="mark" x1="{0}" x2="{0}" y1="{1}" y2="{2}" stroke="#888" stroke-dasharray="4 3"/>)~",
                     X(m), t, t + h);
  for (std::size_t k = 0; k < chart.series.size(); ++k) {
    const auto& se = chart.series[k];
    const char* col = kColours[k % 7];
    std::string path;
    for (std::size_t i = 0; i < se.x.size(); ++i)
      if (std::isfinite(se.x[i]) && std::isfinite(se.y[i]))
        path += fmt::format("{}{:.2f},{:.2f} ", path.empty() ? "M" : "L", X(se.x[i]), Y(se.y[i]));
    s += fmt::format(R"~(<g class="series" data-name="{}"><path d="{}" fill="none" stroke="{}" stroke-width="1.5"/>)~",
                     escape(se.name), path, col);
    const std::size_t every = std::max<std::size_t>(1, se.x.size() / 60);
    for (std::size_t i = 0; i < se.x.size(); i += every)
      if (std::isfinite(se.x[i]) && std::isfinite(se.y[i]))
        s += fmt::format(R"~(<circle class="point" data-v="{}" cx="{:.2f}" cy="{:.2f}" r="2.5" fill="{}"><title>{}: {} {}, {} {}</title></circle>)~",
                         num(se.y[i]), X(se.x[i]), Y(se.y[i]), col, escape(se.name), escape(chart.x_axis), num(se.x[i]),
                         escape(chart.y_axis), num(se.y[i]));
    s += fmt::format(R"~(<text x="{}" y="{}" fill="{}">{}</text></g>)~", l + w + 8, t + 14 + 16 * static_cast<double>(k),
                     col, escape(se.name));
  }
  s += "</svg>";
  body_ += fmt::format("<figure id=\"figure-{}\">{}<figcaption>{}</figcaption></figure>\n", ++figures_, s,
                       escape(chart.title));
  return *this;
}

Page& Page::table(const std::vector<std::vector<std::string>>& rows) {
  for (std::size_t r = 0; r < rows.size(); ++r)
    for (std::size_t c = 0; c < rows[r].size(); ++c)
      check_text("table", fmt::format("cell [{}, {}]", r, c), rows[r][c]);
  body_ += "<table>\n";
  for (std::size_t r = 0; r < rows.size(); ++r) {
    body_ += "<tr>";
    for (const auto& cell : rows[r]) body_ += fmt::format(fmt::runtime(r == 0 ? "<th>{}</th>" : "<td>{}</td>"), escape(cell));
    body_ += "</tr>\n";
  }
  body_ += "</table>\n";
  return *this;
}

std::string Page::html() const {
  return fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\" data-script-errors=\"0\">\n<head>\n<meta charset=\"utf-8\">\n<title>{0}</title>\n"
      "<style>{1}</style>\n<script>{2}</script>\n</head>\n<body>\n<pre id=\"script-errors\" hidden></pre>\n<h1>{0}</h1>\n"
      "<nav id=\"toc\"><ol></ol></nav>\n{3}<script>{4}</script>\n</body>\n</html>\n",
      escape(title_), kStyle, kCatcher, body_, kScript);
}

void Page::save(const std::string& path) const { detail::write_file_atomically(path, html()); }

}  // namespace nn::viewer
