// nn::viewer refuses what it cannot draw faithfully, with a std::invalid_argument naming the
// function called and the values at fault, and a refused call adds nothing to the page: labels
// that do not match the rows or columns of a heatmap, a batch out of range for an attention
// pattern, more x_labels than points in a line chart, and text that is not UTF-8 (a page is UTF-8)
// given to any entry point. The cases that are accepted are checked beside them, so that a check
// that refused everything would fail too.
#define BOOST_TEST_MODULE viewer_refusals
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <vector>

#include <nn/nn.hpp>

namespace ag = autograd;
namespace viewer = nn::viewer;

namespace {

// f must throw std::invalid_argument whose message starts with "nn::viewer: ", names `call` and
// shows every fragment, and holds no raw 0xff byte; and the page must not change.
template <class F>
void expect_refused(viewer::Page& page, F f, const std::string& call, std::initializer_list<std::string> fragments) {
  const std::string before = page.html();
  try {
    f();
    BOOST_ERROR("no error; expected one from " << call);
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    BOOST_TEST_MESSAGE(what);
    BOOST_TEST(what.rfind("nn::viewer: " + call, 0) == 0,
               "message does not start with nn::viewer: " << call << ": " << what);
    for (const auto& s : fragments) BOOST_TEST(what.find(s) != std::string::npos, "no '" << s << "' in: " << what);
    BOOST_TEST(what.find('\xff') == std::string::npos, "a raw 0xff byte in: " << what);
  } catch (const std::exception& e) {
    BOOST_ERROR("wrong exception from " << call << ": " << e.what());
  }
  BOOST_TEST((page.html() == before), call << " changed the page although it was refused");
}

// A (B, H, T, T) attention pattern of uniform weights.
ag::Tensor pattern(std::vector<std::int64_t> shape) {
  const std::int64_t T = shape.back();
  return ag::div(ag::ones(shape, ag::Dtype::Float32), static_cast<double>(T));
}

const std::string kBad = "l\xff";  // 0xff never appears in UTF-8: offset 1
const std::string kCut = "caf\xc3";  // a two-byte sequence cut short: offset 3

using Values = std::vector<std::vector<double>>;
using Labels = std::vector<std::string>;

viewer::Heatmap heatmap(std::string title, Values values, Labels rows = {}, Labels cols = {}) {
  viewer::Heatmap m;
  m.title = std::move(title);
  m.values = std::move(values);
  m.row_labels = std::move(rows);
  m.col_labels = std::move(cols);
  return m;
}

viewer::LineChart chart(std::string title, std::vector<viewer::Series> series, Labels x_labels = {}) {
  viewer::LineChart c;
  c.title = std::move(title);
  c.series = std::move(series);
  c.x_labels = std::move(x_labels);
  return c;
}


}  // namespace

BOOST_AUTO_TEST_CASE(heatmap_refuses_row_and_column_labels_that_do_not_match_naming_both_counts) {
  viewer::Page page("p");
  const std::vector<std::vector<double>> v = {{1, 2}, {3, 4}};  // 2 x 2
  expect_refused(page, [&] { page.heatmap(heatmap("m", v, {"a"})); }, "heatmap",
                 {"'m'", "1 row labels", "2 rows"});
  expect_refused(page, [&] { page.heatmap(heatmap("m", v, {"a", "b", "c"})); }, "heatmap",
                 {"3 row labels", "2 rows"});
  expect_refused(page, [&] { page.heatmap(heatmap("m", v, {}, {"x", "y", "z"})); }, "heatmap",
                 {"3 column labels", "2 columns"});
  expect_refused(page, [&] { page.heatmap(heatmap("m", {}, {}, {"x"})); }, "heatmap",
                 {"1 column labels", "0 columns"});
  // The tensor overload alike.
  const ag::Tensor t = ag::tensor({1.0, 2.0, 3.0, 4.0}, {2, 2});
  expect_refused(page, [&] { page.heatmap("t", t, {"a"}); }, "heatmap", {"'t'", "1 row labels", "2 rows"});
  expect_refused(page, [&] { page.heatmap("t", t, {}, {"x", "y", "z"}); }, "heatmap", {"3 column labels", "2 columns"});
  // One label per row and column, or none, is drawn.
  page.heatmap(heatmap("m", v, {"a", "b"}, {"x", "y"}));
  page.heatmap(heatmap("m", v));
  page.heatmap("t", t, {"a", "b"}, {"x", "y"});
  page.heatmap("t", t);
  BOOST_TEST(page.html().find(">b</text>") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(heatmap_still_refuses_rows_of_different_lengths) {
  viewer::Page page("p");
  expect_refused(page, [&] { page.heatmap(heatmap("m", {{1, 2}, {3}})); }, "heatmap",
                 {"row 1 has 1 values", "row 0 has 2"});
}

BOOST_AUTO_TEST_CASE(attention_patterns_refuses_a_batch_out_of_range_for_3d_and_4d_patterns) {
  viewer::Page page("p");
  const std::vector<std::string> tokens = {"a", "b", "c"};
  // (H, T, S) is one sequence: batch 0 only.
  expect_refused(page, [&] { page.attention_patterns(pattern({2, 3, 3}), tokens, "L0", 1); }, "attention_patterns",
                 {"batch 1", "[2, 3, 3]"});
  expect_refused(page, [&] { page.attention_patterns(pattern({2, 3, 3}), tokens, "L0", -1); }, "attention_patterns",
                 {"batch -1", "[2, 3, 3]"});
  expect_refused(page, [&] { page.attention_patterns(pattern({2, 2, 3, 3}), tokens, "L0", 2); }, "attention_patterns",
                 {"batch 2", "[2, 2, 3, 3]"});
  expect_refused(page, [&] { page.attention_patterns(pattern({2, 2, 3, 3}), tokens, "L0", -1); }, "attention_patterns",
                 {"batch -1", "[2, 2, 3, 3]"});
  page.attention_patterns(pattern({2, 3, 3}), tokens, "A", 0);
  page.attention_patterns(pattern({2, 2, 3, 3}), tokens, "B", 1);
  BOOST_TEST(page.html().find("data-head=\"AH1\"") != std::string::npos);
  BOOST_TEST(page.html().find("data-head=\"BH1\"") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(line_chart_refuses_more_x_labels_than_points) {
  viewer::Page page("p");
  const viewer::Series three{"s", {0, 1, 2}, {1, 2, 3}}, two{"t", {0, 1}, {1, 2}};
  expect_refused(page, [&] { page.line_chart(chart("c", {three, two}, {"a", "b", "c", "d"})); },
                 "line_chart", {"'c'", "4 x_labels", "3 points"});
  expect_refused(page, [&] { page.line_chart(chart("c", {}, {"a"})); }, "line_chart",
                 {"1 x_labels", "0 points"});
  expect_refused(page, [&] { page.line_chart(chart("c", {three, {"u", {0, 1}, {1}}})); }, "line_chart",
                 {"series 'u' has 2 x and 1 y values"});
  // As many labels as the longest series has points, or fewer, are drawn.
  page.line_chart(chart("c", {three, two}, {"L0", "L1", "L2"}));
  page.line_chart(chart("c", {three}, {"L0"}));
  BOOST_TEST(page.html().find(">L2</text>") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(every_text_entry_point_refuses_text_that_is_not_utf8_naming_it_and_the_offset) {
  BOOST_CHECK_EXCEPTION(viewer::Page{kBad}, std::invalid_argument, [](const std::invalid_argument& e) {
    const std::string what = e.what();
    BOOST_TEST_MESSAGE(what);
    return what.rfind("nn::viewer: Page: title", 0) == 0 && what.find("offset 1") != std::string::npos &&
           what.find("0xff") != std::string::npos && what.find('\xff') == std::string::npos;
  });
  viewer::Page page("p");
  const std::vector<std::vector<double>> v = {{1, 2}, {3, 4}};
  const std::vector<std::string> tokens = {"a", kBad, "c"};
  expect_refused(page, [&] { page.paragraph(kBad); }, "paragraph", {"text 'l\\xff'", "byte 0xff at offset 1", "UTF-8"});
  expect_refused(page, [&] { page.paragraph(kCut); }, "paragraph", {"byte 0xc3 at offset 3"});
  expect_refused(page, [&] { page.section(kBad); }, "section", {"heading", "offset 1"});
  expect_refused(page, [&] { page.attention_patterns(pattern({1, 3, 3}), tokens); }, "attention_patterns",
                 {"token 1", "offset 1"});
  expect_refused(page, [&] { page.attention_patterns(pattern({1, 3, 3}), {"a", "b", "c"}, kCut); },
                 "attention_patterns", {"label", "offset 3"});
  expect_refused(page, [&] { page.heatmap(heatmap(kBad, v)); }, "heatmap", {"title", "offset 1"});
  expect_refused(page, [&] { page.heatmap(heatmap("m", v, {"a", kBad})); }, "heatmap",
                 {"row label 1", "offset 1"});
  expect_refused(page, [&] { page.heatmap(heatmap("m", v, {}, {kCut, "b"})); }, "heatmap",
                 {"column label 0", "offset 3"});
  {
    auto x = heatmap("m", v);
    x.row_axis = kBad;
    expect_refused(page, [&] { page.heatmap(x); }, "heatmap", {"row_axis", "offset 1"});
  }
  {
    auto x = heatmap("m", v);
    x.col_axis = kBad;
    expect_refused(page, [&] { page.heatmap(x); }, "heatmap", {"col_axis", "offset 1"});
  }
  {
    auto x = heatmap("m", v);
    x.value_name = kBad;
    expect_refused(page, [&] { page.heatmap(x); }, "heatmap", {"value_name", "offset 1"});
  }
  const ag::Tensor t = ag::tensor({1.0, 2.0, 3.0, 4.0}, {2, 2});
  expect_refused(page, [&] { page.heatmap(kBad, t); }, "heatmap", {"title", "offset 1"});
  expect_refused(page, [&] { page.heatmap("t", t, {}, {}, "row", kBad); }, "heatmap", {"col_axis", "offset 1"});
  const viewer::Series s{"s", {0, 1}, {1, 2}}, bad{kBad, {0, 1}, {1, 2}};
  expect_refused(page, [&] { page.line_chart(chart(kBad, {s})); }, "line_chart", {"title", "offset 1"});
  expect_refused(page, [&] { page.line_chart(chart("c", {s, bad})); }, "line_chart",
                 {"series 1: name", "offset 1"});
  {
    auto x = chart("c", {s});
    x.x_axis = kBad;
    expect_refused(page, [&] { page.line_chart(x); }, "line_chart", {"x_axis", "offset 1"});
  }
  {
    auto x = chart("c", {s});
    x.y_axis = kBad;
    expect_refused(page, [&] { page.line_chart(x); }, "line_chart", {"y_axis", "offset 1"});
  }
  expect_refused(page, [&] { page.line_chart(chart("c", {s}, {"a", kCut})); }, "line_chart",
                 {"x_label 1", "offset 3"});
  expect_refused(page, [&] { page.table({{"h", "i"}, {"ok", kBad}}); }, "table", {"cell [1, 1]", "offset 1"});
  // Valid UTF-8 beyond ASCII is written as it is.
  page.paragraph("café ∑ 𝔸").section("Köpfe").table({{"ü"}});
  BOOST_TEST(page.html().find("<p>café ∑ 𝔸</p>") != std::string::npos);
}

// Infinite values are drawn as NaN ones are (a blank cell that keeps its value in the hover text)
// and leave the colour range to the finite cells; a line chart's infinite marks are left out and
// values near the largest double still give finite coordinates.
BOOST_AUTO_TEST_CASE(infinite_values_are_drawn_blank_and_keep_the_finite_colours) {
  viewer::Page inf_page("p"), finite_page("p");
  inf_page.heatmap(heatmap("m", {{1, INFINITY}, {-1, 0}}));
  finite_page.heatmap(heatmap("m", {{1, NAN}, {-1, 0}}));
  const std::string html = inf_page.html();
  BOOST_TEST(html.find("#-") == std::string::npos, "a negative colour component in the page");
  BOOST_TEST(html.find(R"(fill="#ffffff")") != std::string::npos);
  BOOST_TEST(html.find("inf") != std::string::npos, "the inf cell's value is not in its hover text");
  // Every fill, in order, is the one the same map with a NaN in place of the inf gets: the finite
  // cells keep their colours (before, v / inf made them all white) and the scale its range.
  const auto fills = [](const std::string& h) {
    std::vector<std::string> out;
    for (std::size_t at = 0; (at = h.find(R"(fill="#)", at)) != std::string::npos; at += 7) out.push_back(h.substr(at, 14));
    return out;
  };
  const std::vector<std::string> with_inf = fills(html), with_nan = fills(finite_page.html());
  BOOST_TEST(with_inf == with_nan, boost::test_tools::per_element());
  BOOST_TEST(with_inf.size() > 4u);
  viewer::Page charts("c");
  viewer::LineChart c = chart("big", {viewer::Series{"s", {-1e308, 1e308}, {-1e308, 1e308}}});
  c.marks = {INFINITY, NAN, 0.0};
  charts.line_chart(c);
  const std::string chart_html = charts.html();
  BOOST_TEST(chart_html.find("nan") == std::string::npos, "a NaN coordinate in the chart");
  BOOST_TEST(chart_html.find("inf") == std::string::npos, "an infinite coordinate in the chart");
}
