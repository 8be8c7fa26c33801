// PyTorch-style printing of tensors: the layout of torch/_tensor_str.py (aligned columns, rows
// wrapped at the line width, "..." summaries, suffixes wrapped the same way), on our suffixes.
#include "autograd/format.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "autograd/graph.hpp"

namespace autograd {

namespace {

constexpr std::size_t kIndent = 7;  // the width of "tensor(", where every row's '[' lines up

void check_options(const PrintOptions& o) {
  if (o.precision < 0 || o.precision > 30) fail("to_string", "precision must be in [0, 30], got {}", o.precision);
  if (o.threshold < 0) fail("to_string", "threshold must be >= 0, got {}", o.threshold);
  if (o.edgeitems < 0) fail("to_string", "edgeitems must be >= 0, got {}", o.edgeitems);
  if (o.linewidth < 1) fail("to_string", "linewidth must be >= 1, got {}", o.linewidth);
}

class Printer {
 public:
  Printer(const Tensor& t, const PrintOptions& options)
      : shape_(t.shape()),
        strides_(contiguous_strides(t.shape())),
        values_(t.to_vector()),
        ints_(t.dtype() == Dtype::Int64 ? std::vector<std::int64_t>(t.data<std::int64_t>(),
                                                                     t.data<std::int64_t>() + t.numel())
                                        : std::vector<std::int64_t>()),
        integer_(t.dtype() == Dtype::Int64),
        options_(options),
        summarise_(t.numel() > options.threshold) {
    choose_style();
  }

  std::string body() const {
    if (shape_.empty()) return element(0);
    if (values_.empty()) return "[]";
    return block(0, 0, kIndent);
  }

 private:
  // Whether a dim of n elements is shown as its edges and "...".
  bool cut(std::int64_t n) const { return summarise_ && n > options_.edgeitems && n - options_.edgeitems > options_.edgeitems; }

  // Calls f(index into values_, or -1 for the "..." place) for each entry shown along dim.
  template <class F>
  void for_each_shown(std::size_t dim, F&& f) const {
    const std::int64_t n = shape_[dim];
    const bool is_cut = cut(n);
    for (std::int64_t i = 0; i < n; ++i) {
      if (is_cut && i == options_.edgeitems) {
        f(-1);
        i = n - options_.edgeitems;
        if (i >= n) break;
      }
      f(i);
    }
  }

  // Where every value that will be printed is (the summary's edges only), for the style and the width.
  void collect(std::size_t dim, std::int64_t offset, std::vector<std::int64_t>& out) const {
    for_each_shown(dim, [&](std::int64_t i) {
      if (i < 0) return;
      const std::int64_t at = offset + i * strides_[dim];
      if (dim + 1 == shape_.size()) {
        out.push_back(at);
      } else {
        collect(dim + 1, at, out);
      }
    });
  }

  // PyTorch's rule: scientific when the nonzero finite magnitudes span more than 1000x, or one is
  // above 1e8 or below 1e-4; every element padded to the widest. Integers print as they are.
  void choose_style() {
    std::vector<std::int64_t> shown;
    if (shape_.empty()) {
      shown.push_back(0);
    } else if (!values_.empty()) {
      collect(0, 0, shown);
    }
    double lo = std::numeric_limits<double>::infinity(), hi = 0;
    for (std::int64_t at : shown) {
      const double v = values_[static_cast<std::size_t>(at)];
      if (!std::isfinite(v) || v == 0) continue;
      lo = std::min(lo, std::abs(v));
      hi = std::max(hi, std::abs(v));
    }
    scientific_ = !integer_ && options_.sci_mode.value_or(hi > 0 && (hi / lo > 1000.0 || hi > 1e8 || lo < 1e-4));
    for (std::int64_t at : shown) width_ = std::max(width_, number(at).size());
  }

  // The element at flat position `at`, unpadded.
  std::string number(std::int64_t at) const {
    const auto i = static_cast<std::size_t>(at);
    if (integer_) return fmt::format("{}", ints_[i]);
    const double v = values_[i];
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    return scientific_ ? fmt::format("{:.{}e}", v, options_.precision) : fmt::format("{:.{}f}", v, options_.precision);
  }

  std::string element(std::int64_t at) const {
    const std::string s = number(at);
    return std::string(width_ > s.size() ? width_ - s.size() : 0, ' ') + s;
  }

  // The last dim: elements in lines of as many as fit in the line width after `indent` columns.
  std::string vector(std::int64_t offset, std::size_t indent) const {
    const std::size_t dim = shape_.size() - 1;
    if (cut(shape_[dim]) && options_.edgeitems == 0) return "[...]";
    std::vector<std::string> items;
    for_each_shown(dim, [&](std::int64_t i) {
      items.push_back(i < 0 ? " ..." : element(offset + i * strides_[dim]));
    });
    const auto linewidth = static_cast<std::size_t>(options_.linewidth);
    const std::size_t per_line = linewidth > indent ? std::max<std::size_t>(1, (linewidth - indent) / (width_ + 2)) : 1;
    std::string out = "[";
    for (std::size_t k = 0; k < items.size(); ++k) {
      if (k > 0 && k % per_line == 0) {
        out += ",\n";
        out.append(indent + 1, ' ');
      } else if (k > 0) {
        out += ", ";
      }
      out += items[k];
    }
    return out + "]";
  }

  std::string block(std::size_t dim, std::int64_t offset, std::size_t indent) const {
    if (dim + 1 == shape_.size()) return vector(offset, indent);
    std::string sep = ",";
    sep.append(shape_.size() - dim - 1, '\n');
    sep.append(indent + 1, ' ');
    std::string out = "[";
    bool first = true;
    for_each_shown(dim, [&](std::int64_t i) {
      if (!first) out += sep;
      first = false;
      out += i < 0 ? "..." : block(dim + 1, offset + i * strides_[dim], indent + 1);
    });
    return out + "]";
  }

  const Shape& shape_;
  const Shape strides_;
  const std::vector<double> values_;
  const std::vector<std::int64_t> ints_;  // Int64 tensors: the exact values
  const bool integer_;
  const PrintOptions& options_;
  const bool summarise_;
  bool scientific_ = false;
  std::size_t width_ = 1;
};

// PyTorch's _add_suffixes: each suffix goes on the same line unless that would pass the line
// width (counted as PyTorch counts it: the last line's length plus 2), else on a new line
// indented under the first '['.
std::string add_suffixes(std::string text, const std::vector<std::string>& suffixes, std::size_t linewidth) {
  const std::size_t newline = text.rfind('\n');
  std::size_t last = (newline == std::string::npos ? text.size() : text.size() - newline - 1) + 2;
  for (const std::string& s : suffixes) {
    if (last + s.size() + 2 > linewidth) {
      text += ",\n";
      text.append(kIndent, ' ');
      text += s;
      last = kIndent + s.size();
    } else {
      text += ", " + s;
      last += s.size() + 2;
    }
  }
  return text + ")";
}

}  // namespace

std::string to_string(const Tensor& t) { return to_string(t, PrintOptions{}); }

std::string to_string(const Tensor& t, const PrintOptions& options) {
  check_options(options);
  if (!t.defined()) return "tensor(undefined)";
  std::vector<std::string> suffixes = {fmt::format("dtype={}", dtype_name(t.dtype())),
                                       fmt::format("shape={}", shape_str(t.shape()))};
  if (t.grad_fn()) {
    suffixes.push_back(fmt::format("grad_fn=<{}>", printable(t.grad_fn()->name())));
  } else if (t.requires_grad()) {
    suffixes.push_back("requires_grad=true");
  }
  return add_suffixes("tensor(" + Printer(t, options).body(), suffixes, static_cast<std::size_t>(options.linewidth));
}

}  // namespace autograd
