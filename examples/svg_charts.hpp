#pragma once
// Pictures as SVG text, for a file of their own or inline in an HTML page: a heatmap with its
// rows and columns labelled by position and a colour scale, and a line chart with axes and ticks.
// Every text that goes in is escaped. Nothing here knows what the numbers mean.
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace svg {

// `text` with & < > " ' replaced by entities: safe in SVG/HTML text and in quoted attributes.
std::string escape(std::string_view text);

// The width a line of sans-serif text takes at `font_size`, estimated generously (so that a title
// the picture is sized by is never clipped).
double text_width(std::string_view text, double font_size);

// A colour for every number in [lo, hi]: sequential (white at lo to deep blue at hi) or diverging
// (blue at lo, white at 0, red at hi; lo = -hi). Values outside the range take the end colours.
struct ColourScale {
  double lo = 0, hi = 1;
  bool diverging = false;
  std::string label;  // what the colour measures, e.g. "attention weight"

  static ColourScale sequential(double lo, double hi, std::string label);
  // Symmetric around 0 over the largest absolute value of `values` (1 when all are 0).
  static ColourScale diverging_for(const std::vector<double>& values, std::string label);
  std::string colour(double value) const;  // "rgb(r,g,b)"
};

// A (rows x cols) matrix of numbers as coloured cells, each with its value on hover (an SVG
// <title>, and data attributes a page's script reads for its tooltip).
struct Heatmap {
  std::string title;
  std::int64_t rows = 0, cols = 0;
  std::vector<double> values;  // rows x cols, row-major
  std::string row_axis = "query position", col_axis = "key position";
  std::vector<std::string> row_labels, col_labels;  // default: the positions "0", "1", ...
  std::vector<std::string> row_notes, col_notes;    // optional second label, e.g. the token there
  std::string notes_label;                          // what the second labels are, under the map
  ColourScale scale;
  bool causal_mask = false;   // cells with col > row are drawn grey as "masked"
  bool show_values = false;   // write each value in its cell (small matrices)
  double cell = 22;
  std::function<std::string(double)> format;  // the text of a value; default "{:.3f}"
  std::string attributes;     // extra attributes of the <svg> element, e.g. data-head="1"
};

struct Size {
  double width = 0, height = 0;
};
Size heatmap_size(const Heatmap& map);
// The map as one <svg> element (title, position labels, cells, colour-scale legend with its
// numeric range) at (x, y) of an enclosing picture; with standalone, a complete SVG document.
std::string heatmap_svg(const Heatmap& map, double x = 0, double y = 0, bool standalone = false);

// Several heatmaps side by side (a `gap` apart) under a title, as one SVG document.
std::string heatmap_row_svg(const std::string& title, const std::vector<Heatmap>& maps, double gap = 40);

// One curve of a line chart; with markers, a dot per point with its value on hover.
struct Series {
  std::string name, colour;
  std::vector<double> x, y;
  bool markers = false;
};
struct ReferenceLine {  // a dashed horizontal line, e.g. the loss of guessing
  double y = 0;
  std::string label;
};
struct LineChart {
  std::string title, x_label, y_label;
  std::vector<Series> series;
  std::vector<ReferenceLine> references;
  double y_min = 0, y_max = 0;  // y_max <= y_min: from the data
  bool log_y = false;           // a logarithmic y axis, ticks at powers of ten; values <= 0 are left out
  double width = 590, height = 340;
  std::string attributes;
};
// The chart as one complete <svg> element: axes with ticks, the curves, a legend.
std::string line_chart_svg(const LineChart& chart);

// The SVG document's opening tag and a white background.
std::string svg_open(double width, double height, const std::string& attributes = {});

}  // namespace svg
