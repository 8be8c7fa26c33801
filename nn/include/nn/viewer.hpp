#pragma once
// nn::viewer: self-contained HTML pages of what a study computed (inline SVG, CSS and script;
// nothing fetched, opens from file://), in the spirit of CircuitsVis:
//   - attention patterns, one map per head, layer by layer, with the tokens on both axes and the
//     query, key and weight of any cell under the pointer;
//   - heatmaps of study results (patching per layer × head or head × position, scores), with a
//     diverging colour scale centred on 0 when the values have both signs;
//   - line charts (a logit lens across layers, a loss curve).
//
//   nn::viewer::Page page("Induction heads");
//   page.section("Layer 0").attention_patterns(cache["blocks.0.attn.pattern"], tokens, "L0");
//   page.section("Patching").heatmap({.title = "z patching", .values = result.per_head_position, ...});
//   page.save("study.html");
//
// The page checks itself: its script counts any script error on <html data-script-errors> ("0"
// when none) and writes it into <pre id="script-errors">, sets <html data-js-ready="1"> once it has
// run, builds the contents list from the sections and the tooltip (tests/browser/check_page.sh).
//
// A page is UTF-8: every text given to it (titles, headings, paragraphs, labels, axis names,
// tokens, series names, table cells) must be valid UTF-8, else std::invalid_argument naming the
// function, the text and the offset of its first bad byte. Every refusal (std::invalid_argument
// naming the function and the values at fault) comes before anything is written: a refused call
// leaves the page as it was (tests/study/test_viewer_refusals.cpp).
#include <cstdint>
#include <string>
#include <vector>

#include <autograd/autograd.hpp>

namespace nn::viewer {

namespace ag = autograd;

struct Heatmap {
  std::string title;
  std::vector<std::vector<double>> values;  // rows x columns; NaN and ±inf cells are drawn blank (their hover text gives the value)
  std::vector<std::string> row_labels;      // one per row (or empty: 0, 1, ...); another count throws
  std::vector<std::string> col_labels;      // one per column (or empty); another count throws
  std::string row_axis = "row", col_axis = "column", value_name = "value";
};

struct Series {
  std::string name;
  std::vector<double> x, y;  // the same length
};

struct LineChart {
  std::string title;
  std::vector<Series> series;
  std::string x_axis = "x", y_axis = "y";
  // Optional names of the x values 0, 1, ... (e.g. layer labels): at most as many as the longest
  // series has points, else line_chart throws naming both counts.
  std::vector<std::string> x_labels;
  std::vector<double> marks;          // x values marked with a vertical line (e.g. a phase change)
};

class Page {
 public:
  explicit Page(std::string title);

  // A section: a heading with an entry in the contents list.
  Page& section(const std::string& heading);
  Page& paragraph(const std::string& text);  // plain text

  // pattern (H, T, S) or (B, H, T, S) (a cache's "blocks.l.attn.pattern"; `batch` picks the
  // sequence, in [0, B); an (H, T, S) pattern is one sequence, batch 0), tokens the T (= S) token
  // strings: one map per head, labelled `label` + "H" + h.
  // Throws naming the shapes when the tokens do not fit or `batch` is out of range.
  Page& attention_patterns(const ag::Tensor& pattern, const std::vector<std::string>& tokens,
                           const std::string& label = "", std::int64_t batch = 0);
  Page& heatmap(const Heatmap& map);
  // values (R, C) as a heatmap (any dtype; Int64 and floats); the labels as in Heatmap.
  Page& heatmap(const std::string& title, const ag::Tensor& values, std::vector<std::string> row_labels = {},
                std::vector<std::string> col_labels = {}, std::string row_axis = "row", std::string col_axis = "column");
  Page& line_chart(const LineChart& chart);
  // A table of plain text cells, the first row its header.
  Page& table(const std::vector<std::vector<std::string>>& rows);

  std::string html() const;
  // Writes the page atomically (a reader never sees half a file); throws naming the path.
  void save(const std::string& path) const;

 private:
  std::string title_, body_;
  int sections_ = 0, figures_ = 0;
};

// The text with &, <, >, " and ' written as entities.
std::string escape(const std::string& text);

}  // namespace nn::viewer
