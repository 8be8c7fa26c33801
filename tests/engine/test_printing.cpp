// Printing tensors: PyTorch's layout (aligned columns, rows wrapped at the line width, "..."
// summaries, suffixes wrapped), checked two ways: against PyTorch's own printer on the cases of
// tests/data/printing_reference.txt (made by make_printing_reference.py), and by reading the
// printed text back (every element the same width, every line within the width, every number
// the value rounded) on tensors of random values.
#define BOOST_TEST_MODULE printing
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "test_support.hpp"

namespace ag = autograd;
using test_support::check_throws;

namespace {

struct ReferenceCase {
  std::string name;
  ag::Dtype dtype = ag::Dtype::Float32;
  ag::Shape shape;
  std::vector<double> values;
  ag::PrintOptions options;
  bool requires_grad = false;
  std::string expected;
};

double parse_value(const std::string& word) {
  if (word == "nan") return std::numeric_limits<double>::quiet_NaN();
  if (word == "inf") return std::numeric_limits<double>::infinity();
  if (word == "-inf") return -std::numeric_limits<double>::infinity();
  return std::stod(word);
}

// The values of a formula line: value i = s_i * (((i*a + b) mod m) + o) / d.
std::vector<double> formula_values(std::istringstream& in, std::int64_t n) {
  std::int64_t a, b, m, o, neg;
  double d;
  in >> a >> b >> m >> o >> d >> neg;
  std::vector<double> out;
  for (std::int64_t i = 0; i < n; ++i) {
    const double s = neg > 0 && i % neg == 1 ? -1.0 : 1.0;
    out.push_back(s * static_cast<double>((i * a + b) % m + o) / d);
  }
  return out;
}

std::vector<ReferenceCase> read_reference() {
  std::ifstream file(std::string(HEADGRAD_TEST_DATA_DIR) + "/printing_reference.txt");
  BOOST_REQUIRE_MESSAGE(file, "cannot open tests/data/printing_reference.txt");
  std::vector<ReferenceCase> cases;
  std::string line;
  while (std::getline(file, line)) {
    std::istringstream in(line);
    std::string key;
    in >> key;
    if (key == "case") {
      cases.emplace_back();
      in >> cases.back().name;
      continue;
    }
    if (key.empty() || key[0] == '#') continue;
    BOOST_REQUIRE(!cases.empty());
    ReferenceCase& c = cases.back();
    if (key == "dtype") {
      std::string d;
      in >> d;
      c.dtype = d == "Float64" ? ag::Dtype::Float64 : ag::Dtype::Float32;
    } else if (key == "shape") {
      for (std::int64_t s; in >> s;) c.shape.push_back(s);
    } else if (key == "formula") {
      c.values = formula_values(in, ag::checked_numel("test", c.shape));
    } else if (key == "values") {
      for (std::string w; in >> w;) c.values.push_back(parse_value(w));
    } else if (key == "options") {
      int sci;
      in >> c.options.precision >> c.options.threshold >> c.options.edgeitems >> c.options.linewidth >> sci;
      if (sci >= 0) c.options.sci_mode = sci == 1;
    } else if (key == "requires_grad") {
      int r;
      in >> r;
      c.requires_grad = r == 1;
    } else if (key == "expected") {
      int lines;
      in >> lines;
      for (int k = 0; k < lines; ++k) {
        BOOST_REQUIRE(std::getline(file, line));
        c.expected += (k > 0 ? "\n" : "") + line;
      }
    } else {
      BOOST_FAIL("unknown line in printing_reference.txt: " << line);
    }
  }
  return cases;
}

ag::Tensor make(const ReferenceCase& c) {
  ag::Tensor t = ag::tensor(c.values, c.shape, c.dtype);
  if (c.requires_grad) t.requires_grad_();
  return t;
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// The element texts of a printed tensor, in order, each with the blanks that pad it to its
// column (so every element's length is the column width). Separators are ", " within a line, and
// ",\n" plus the indent between lines: a wrapped row's next line is indented by 7 + rank columns
// (one more than the innermost '['), a new row by fewer, followed by its '['. "..." is left out.
std::vector<std::string> elements_of(const std::string& printed) {
  std::size_t close = 7;  // the ']' that closes the body's first '['
  for (int depth = 0; close < printed.size(); ++close) {
    depth += printed[close] == '[' ? 1 : printed[close] == ']' ? -1 : 0;
    if (depth == 0) break;
  }
  const std::string body = printed.substr(7, close - 7 + 1);
  const std::size_t rank = body.find_first_not_of('[');
  std::vector<std::string> out;
  std::string cur;
  auto flush = [&] {
    const std::size_t first = cur.find_first_not_of(' ');
    if (first != std::string::npos && cur.substr(first) != "...") out.push_back(cur);
    cur.clear();
  };
  for (std::size_t i = 0; i < body.size(); ++i) {
    const char ch = body[i];
    if (ch == '[' || ch == ']') {
      flush();
    } else if (ch == ',') {
      flush();
      if (i + 1 < body.size() && body[i + 1] == ' ') ++i;  // the blank of ", "
    } else if (ch == '\n') {
      flush();
      while (i + 1 < body.size() && body[i + 1] == '\n') ++i;
      for (std::size_t k = 0; k < 7 + rank && i + 1 < body.size() && body[i + 1] == ' '; ++k) ++i;
    } else {
      cur += ch;
    }
  }
  flush();
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_reference_case_prints_as_pytorch_prints_it) {
  const std::vector<ReferenceCase> cases = read_reference();
  BOOST_REQUIRE_GE(cases.size(), 20u);
  for (const ReferenceCase& c : cases) {
    BOOST_TEST_CONTEXT("case " << c.name) {
      BOOST_REQUIRE_EQUAL(c.values.size(), static_cast<std::size_t>(ag::checked_numel("test", c.shape)));
      BOOST_TEST(ag::to_string(make(c), c.options) == c.expected);
    }
  }
}

BOOST_AUTO_TEST_CASE(the_default_options_are_pytorchs_and_fmt_uses_them) {
  for (const ReferenceCase& c : read_reference()) {
    const ag::PrintOptions d;
    const bool is_default = c.options.precision == d.precision && c.options.threshold == d.threshold &&
                            c.options.edgeitems == d.edgeitems && c.options.linewidth == d.linewidth &&
                            !c.options.sci_mode.has_value();
    if (!is_default) continue;
    BOOST_TEST_CONTEXT("case " << c.name) {
      BOOST_TEST(fmt::format("{}", make(c)) == c.expected);
      BOOST_TEST(ag::to_string(make(c)) == c.expected);
    }
  }
}

// Read back: random normal values of many shapes and both dtypes, scaled so that some print
// wide; every element is right-aligned to one width, every line fits in 80 columns, and the
// numbers are the values to 4 decimals (of the mantissa, when scientific).
BOOST_AUTO_TEST_CASE(printed_elements_are_aligned_fit_the_line_and_read_back_as_the_values) {
  const std::vector<ag::Shape> shapes = {{1}, {7}, {25}, {3, 17}, {5, 2}, {2, 3, 14}, {2, 2, 2, 11}, {1, 1, 30}};
  const std::vector<double> scales = {1.0, -3.0, 250.0};
  ag::Generator gen(7);
  for (const ag::Shape& shape : shapes)
    for (ag::Dtype dtype : {ag::Dtype::Float32, ag::Dtype::Float64})
      for (double scale : scales) {
        const ag::Tensor t = ag::randn(shape, dtype, gen) * scale;
        const std::string printed = fmt::format("{}", t);
        BOOST_TEST_CONTEXT(printed) {
          for (const std::string& line : lines_of(printed)) BOOST_TEST(line.size() <= 80u);
          const std::vector<std::string> elems = elements_of(printed);
          const std::vector<double> values = t.to_vector();
          BOOST_REQUIRE_EQUAL(elems.size(), values.size());
          // Scientific exactly when the magnitudes span more than 1000x, or one is above 1e8 or
          // below 1e-4 (these values are finite and nonzero).
          double lo = 1e300, hi = 0;
          for (double v : values) lo = std::min(lo, std::abs(v)), hi = std::max(hi, std::abs(v));
          const bool scientific = hi / lo > 1000 || hi > 1e8 || lo < 1e-4;
          const std::size_t width = elems[0].size();
          for (std::size_t i = 0; i < elems.size(); ++i) {
            BOOST_TEST(elems[i].size() == width);
            BOOST_TEST(elems[i].back() != ' ');
            const std::size_t e = elems[i].find('e');
            BOOST_TEST((e != std::string::npos) == scientific);
            // 4 digits after the point: of the value, or of its mantissa times 10^exponent.
            const double unit = e == std::string::npos ? 1e-4 : std::pow(10.0, std::stoi(elems[i].substr(e + 1)) - 4);
            BOOST_TEST(std::abs(std::stod(elems[i]) - values[i]) <= 0.5 * unit * (1 + 1e-9));
          }
          // The widest value takes the whole width: no element is padded more than needed.
          bool some_unpadded = false;
          for (const std::string& e : elems) some_unpadded |= e[0] != ' ';
          BOOST_TEST(some_unpadded);
        }
      }
}

BOOST_AUTO_TEST_CASE(a_summary_shows_the_edges_of_every_dim) {
  ag::Generator gen(3);
  const ag::Tensor t = ag::randn({11, 12, 13}, ag::Dtype::Float64, gen);  // 1716 > 1000 elements
  const std::string printed = fmt::format("{}", t);
  const std::vector<double> v = t.to_vector();
  std::vector<double> expected;  // indices 0, 1, 2, n-3, n-2, n-1 along every dim
  auto edges = [](std::int64_t n) { return std::vector<std::int64_t>{0, 1, 2, n - 3, n - 2, n - 1}; };
  for (std::int64_t i : edges(11))
    for (std::int64_t j : edges(12))
      for (std::int64_t k : edges(13)) expected.push_back(v[static_cast<std::size_t>((i * 12 + j) * 13 + k)]);
  const std::vector<std::string> elems = elements_of(printed);
  BOOST_REQUIRE_EQUAL(elems.size(), expected.size());
  for (std::size_t i = 0; i < elems.size(); ++i) BOOST_TEST(std::abs(std::stod(elems[i]) - expected[i]) <= 0.5e-4);
  // One "..." per cut row (6 x 6 rows of the last dim), one per cut matrix (6), one for dim 0.
  std::size_t dots = 0;
  for (std::size_t p = printed.find("..."); p != std::string::npos; p = printed.find("...", p + 3)) ++dots;
  BOOST_TEST(dots == 6u * 6u + 6u + 1u);
  for (const std::string& line : lines_of(printed)) BOOST_TEST(line.size() <= 80u);
  // At the threshold exactly nothing is cut.
  BOOST_TEST(fmt::format("{}", ag::zeros({1000})).find("...") == std::string::npos);
  BOOST_TEST(fmt::format("{}", ag::zeros({1001})).find("...") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(small_tensors_print_as_before) {
  BOOST_TEST(fmt::format("{}", ag::tensor({1, 2, 3, 4}, {2, 2}, ag::Dtype::Float64)) ==
             "tensor([[1.0000, 2.0000],\n        [3.0000, 4.0000]], dtype=Float64, shape=[2, 2])");
  BOOST_TEST(fmt::format("{}", ag::scalar_tensor(-0.5)) == "tensor(-0.5000, dtype=Float32, shape=[])");
  BOOST_TEST(fmt::format("{}", ag::zeros({0, 3})) == "tensor([], dtype=Float32, shape=[0, 3])");
  BOOST_TEST(fmt::format("{}", ag::Tensor()) == "tensor(undefined)");
}

BOOST_AUTO_TEST_CASE(options_out_of_range_are_refused_naming_the_option) {
  const ag::Tensor t = ag::zeros({2});
  check_throws<std::invalid_argument>([&] { ag::to_string(t, {.precision = -1}); }, {"to_string", "precision", "-1"});
  check_throws<std::invalid_argument>([&] { ag::to_string(t, {.precision = 31}); }, {"to_string", "precision", "31"});
  check_throws<std::invalid_argument>([&] { ag::to_string(t, {.threshold = -5}); }, {"to_string", "threshold", "-5"});
  check_throws<std::invalid_argument>([&] { ag::to_string(t, {.edgeitems = -2}); }, {"to_string", "edgeitems", "-2"});
  check_throws<std::invalid_argument>([&] { ag::to_string(t, {.linewidth = 0}); }, {"to_string", "linewidth", "0"});
}

BOOST_AUTO_TEST_CASE(no_edge_items_summarise_to_dots) {
  // PyTorch prints "[...]" when edgeitems is 0 and the tensor is summarised.
  BOOST_TEST(ag::to_string(ag::zeros({5, 4}), {.threshold = 3, .edgeitems = 0}) ==
             "tensor([...], dtype=Float32, shape=[5, 4])");
  BOOST_TEST(ag::to_string(ag::zeros({5}), {.threshold = 3, .edgeitems = 0}) ==
             "tensor([...], dtype=Float32, shape=[5])");
}
