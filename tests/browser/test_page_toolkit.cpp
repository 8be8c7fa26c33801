// The examples' page toolkit (examples/html_page, examples/svg_charts) and train_heads' use of it,
// without a browser: escaping, JSON inside a script, the file written through a temporary file,
// the heatmap's labels, cells, mask and colour scale, the line chart, and what bad input throws.
#define BOOST_TEST_MODULE page_toolkit
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "html_page.hpp"
#include "report_html.hpp"
#include "report_json.hpp"
#include "report_svg.hpp"
#include "svg_charts.hpp"

namespace {

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

std::string read(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The message of the exception `f` throws, checked to be of type E.
template <class E, class F>
std::string thrown(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  BOOST_FAIL("no exception");
  return {};
}

struct TempDir {
  std::filesystem::path path = std::filesystem::temp_directory_path() / ("page_toolkit_" + std::to_string(::getpid()));
  TempDir() { std::filesystem::create_directories(path); }
  ~TempDir() { std::filesystem::remove_all(path); }
};

svg::Heatmap small_map() {
  svg::Heatmap m;
  m.title = "a <b> & 'c'";
  m.rows = 3;
  m.cols = 3;
  m.values = {1, 0, 0, 0.5, 0.5, 0, 0.2, 0.3, 0.5};
  m.scale = svg::ColourScale::sequential(0, 1, "attention weight");
  m.causal_mask = true;
  return m;
}

}  // namespace

BOOST_AUTO_TEST_CASE(escape_replaces_every_markup_character) {
  BOOST_TEST(html::escape("<a href=\"x\">'&'</a>") == "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;");
  BOOST_TEST(html::escape("plain 1.5 → t") == "plain 1.5 → t");
}

BOOST_AUTO_TEST_CASE(json_in_a_script_cannot_close_it_and_reads_back_the_same) {
  const nlohmann::json value = {{"name", "</script><script>alert(1)</script>"}, {"x", {1.5, -2}}, {"amp", "a & b"}};
  const std::string text = html::json_in_script(value);
  BOOST_TEST(text.find('<') == std::string::npos);
  BOOST_TEST(text.find('>') == std::string::npos);
  BOOST_TEST(text.find('&') == std::string::npos);
  BOOST_TEST(nlohmann::json::parse(text) == value);
}

BOOST_AUTO_TEST_CASE(write_file_replaces_the_file_and_leaves_no_temporary) {
  TempDir dir;
  const auto path = (dir.path / "page.html").string();
  html::write_file(path, "first");
  html::write_file(path, "second, longer");
  BOOST_TEST(read(path) == "second, longer");
  BOOST_TEST(std::distance(std::filesystem::directory_iterator(dir.path), std::filesystem::directory_iterator{}) == 1);
}

BOOST_AUTO_TEST_CASE(write_file_names_the_path_it_cannot_write) {
  TempDir dir;
  const auto path = (dir.path / "no_such_dir" / "page.html").string();
  const std::string message = thrown<std::runtime_error>([&] { html::write_file(path, "x"); });
  BOOST_TEST(message.find("cannot write " + path) == 0, message);
  const auto over_dir = dir.path.string();  // a directory cannot be replaced by a file
  BOOST_TEST(thrown<std::runtime_error>([&] { html::write_file(over_dir, "x"); }).find(over_dir) != std::string::npos);
}

BOOST_AUTO_TEST_CASE(heatmap_labels_positions_masks_and_carries_its_scale) {
  const std::string s = svg::heatmap_svg(small_map(), 0, 0, true);
  for (int p = 0; p < 3; ++p) {
    BOOST_TEST(count(s, "class=\"col-label\">" + std::to_string(p) + "</text>") == 1u);
    BOOST_TEST(count(s, "class=\"row-label\">" + std::to_string(p) + "</text>") == 1u);
  }
  BOOST_TEST(count(s, "<rect class=\"cell\"") == 9u);
  BOOST_TEST(count(s, "masked (causal)") == 2 * 3u);  // 3 cells above the diagonal: title and data-v
  BOOST_TEST(count(s, "<title>query position 2, key position 1: 0.300</title>") == 1u);
  BOOST_TEST(count(s, "data-lo=\"0\" data-hi=\"1\"") == 1u);
  BOOST_TEST(count(s, "class=\"scale-tick\">0.5</text>") == 1u);
  BOOST_TEST(count(s, "a &lt;b&gt; &amp; &#39;c&#39;") == 1u);  // the title, escaped
  BOOST_TEST(s.find("<b>") == std::string::npos);
}

BOOST_AUTO_TEST_CASE(heatmap_is_as_wide_as_its_title) {
  svg::Heatmap m = small_map();
  m.title = std::string(120, 'W');
  BOOST_TEST(svg::heatmap_size(m).width >= svg::text_width(m.title, 13));
  BOOST_TEST(svg::text_width(m.title, 13) > 3 * m.cell);
}

BOOST_AUTO_TEST_CASE(colour_scales_end_where_they_say) {
  const auto seq = svg::ColourScale::sequential(0, 1, "w");
  BOOST_TEST(seq.colour(0) == "rgb(255,255,255)");
  BOOST_TEST(seq.colour(-3) == seq.colour(0));
  BOOST_TEST(seq.colour(1) == seq.colour(7));
  const auto div = svg::ColourScale::diverging_for({-0.5, 2, 1}, "g");
  BOOST_TEST(div.lo == -2.0);
  BOOST_TEST(div.hi == 2.0);
  BOOST_TEST(div.colour(0) == "rgb(255,255,255)");
  BOOST_TEST(div.colour(-2) != div.colour(2));
  BOOST_TEST(svg::ColourScale::diverging_for({0, 0}, "g").hi == 1.0);  // all zero: a range of its own
}

BOOST_AUTO_TEST_CASE(bad_input_throws_naming_what_is_wrong) {
  svg::Heatmap m = small_map();
  m.values.pop_back();
  const std::string h = thrown<std::invalid_argument>([&] { svg::heatmap_svg(m); });
  BOOST_TEST(h.find("heatmap_svg") == 0, h);
  BOOST_TEST(h.find("8 values for 3 x 3") != std::string::npos, h);
  const std::string c = thrown<std::invalid_argument>([] { svg::ColourScale::sequential(1, 1, "x"); });
  BOOST_TEST(c.find("lo < hi, got 1 and 1") != std::string::npos, c);
  svg::LineChart chart;
  chart.series.push_back({.name = "loss", .colour = "red", .x = {1, 2}, .y = {1}, .markers = false});
  const std::string l = thrown<std::invalid_argument>([&] { svg::line_chart_svg(chart); });
  BOOST_TEST(l.find("series 'loss' has 2 x values and 1 y values") != std::string::npos, l);
  html::Page page("p");
  const std::string s = thrown<std::invalid_argument>(
      [&] { page.slider({.id = "s", .label = "step", .labels = {"a", "b"}, .frames = {"x"}}); });
  BOOST_TEST(s.find("'s' has 1 frames and 2 labels") != std::string::npos, s);
  BOOST_TEST(thrown<std::invalid_argument>([&] { page.heading(7, "x"); }).find("level 7") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(line_chart_has_ticks_a_legend_and_hover_values) {
  svg::LineChart chart;
  chart.title = "accuracy";
  chart.x_label = "step";
  chart.y_label = "acc";
  chart.y_max = 100;
  chart.series.push_back({.name = "1 head", .colour = "red", .x = {0, 50, 100}, .y = {10, 40, 60}, .markers = true});
  chart.series.push_back({.name = "2 heads", .colour = "blue", .x = {0, 50, 100}, .y = {10, 70, 99}, .markers = false});
  const std::string s = svg::line_chart_svg(chart);
  BOOST_TEST(count(s, "class=\"series\"") == 2u);
  BOOST_TEST(count(s, "<circle class=\"point\"") == 3u);
  BOOST_TEST(count(s, "<title>1 head: step 50, acc 40</title>") == 1u);
  BOOST_TEST(count(s, "class=\"y-tick\">100</text>") == 1u);
  BOOST_TEST(count(s, "class=\"x-tick\">0</text>") == 1u);
  BOOST_TEST(count(s, "class=\"legend\">2 heads</text>") == 1u);
}

BOOST_AUTO_TEST_CASE(page_catches_errors_and_escapes_its_text) {
  html::Page page("t <1>");
  page.heading(2, "A & B").paragraph("<script>").table({.caption = "c", .header = {"h"}, .rows = {{"<td>"}},
                                                        .attributes = "id=\"t\"", .row_attributes = "class=\"r\""});
  page.slider({.id = "s", .label = "step", .labels = {"a", "b"}, .frames = {"<svg></svg>", "<svg></svg>"}});
  const std::string s = page.html();
  BOOST_TEST(count(s, "data-script-errors=\"0\"") == 1u);
  BOOST_TEST(count(s, "<pre id=\"script-errors\" hidden></pre>") == 1u);
  BOOST_TEST(s.find("addEventListener('error'") < s.find("<body>"));  // the catcher runs before the body
  BOOST_TEST(count(s, "<h2 id=\"section-1\">A &amp; B</h2>") == 1u);
  BOOST_TEST(count(s, "<p>&lt;script&gt;</p>") == 1u);
  BOOST_TEST(count(s, "<tr class=\"r\"><td>&lt;td&gt;</td></tr>") == 1u);
  BOOST_TEST(count(s, "data-frame=\"0\" hidden") == 1u);  // without script the last frame shows
  BOOST_TEST(count(s, "data-frame=\"1\">") == 1u);
  BOOST_TEST(s.find("http://") == s.find("http://www.w3.org/2000/svg"));  // nothing fetched
}

BOOST_AUTO_TEST_CASE(summary_and_report_carry_the_ablation_when_measured) {
  heads::RunRecord r;
  r.heads = 2;
  r.accuracy = 0.9;
  r.focus = {{.label = "first token", .mean_weight = 0.8, .previous = 0.1, .first = 0.8, .current = 0.1},
             {.label = "previous token", .mean_weight = 0.7, .previous = 0.7, .first = 0.1, .current = 0.2}};
  r.sample = {.heads = 2, .length = 3, .weights = std::vector<double>(18, 0.25), .tokens = {4, 5, 6}};
  const heads::JobInfo job{.task = "t", .mlp = true, .vocab = 7, .seq_len = 3, .d_model = 4, .steps = 10,
                           .classes = 13, .seed = 1, .threads = 1};
  r.seconds = 1;
  BOOST_TEST(heads::run_json(r, job)["heads"][0].count("ablated_accuracy") == 0u);
  BOOST_TEST(heads::report_html({r}, job).find("id=\"ablation\"") == std::string::npos);
  r.ablation = {{.zero = 0.25, .mean = 0.5}, {.zero = 0.125, .mean = 0.75}};
  const auto j = heads::run_json(r, job);
  BOOST_TEST(j["heads"][1]["ablated_accuracy"].get<double>() == 0.125);
  BOOST_TEST(j["heads"][1]["mean_ablated_accuracy"].get<double>() == 0.75);
  const std::string page = heads::report_html({r}, job);
  BOOST_TEST(count(page, "class=\"ablation-row\"") == 2u);
  BOOST_TEST(count(page, "<td>12.5%</td>") == 1u);
  BOOST_TEST(count(page, "<td>-77.5 points</td>") == 1u);
}
