#include "worked_example_page.hpp"

#include <cmath>

#include <fmt/format.h>

#include "html_page.hpp"

namespace worked {

std::string num(double x) {
  if (std::abs(x) < 5e-4) x = 0.0;  // no "-0.000"
  return x == std::round(x) ? fmt::format("{}", static_cast<long long>(x)) : fmt::format("{:.3f}", x);
}

std::string vec(const std::vector<double>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + num(v[i]);
  return s + "]";
}

std::vector<double> row(const ag::Tensor& m, std::int64_t r) {
  const auto all = m.to_vector();
  const auto cols = m.size(1);
  return {all.begin() + r * cols, all.begin() + (r + 1) * cols};
}

namespace {

using S = nn::AttentionStudy;

// How a matrix's rows and columns are labelled.
enum class Axes {
  Tokens,     // rows: the token positions; columns: numbered from first_column
  Attention,  // rows: query positions; columns: key positions
  Weights,    // a weight matrix: rows and columns numbered from 1
};

struct Matrix {
  Matrix(std::string title_, ag::Tensor m_, Axes axes_ = Axes::Tokens, std::int64_t first_column_ = 1,
         bool weights_scale_ = false)
      : title(std::move(title_)), m(std::move(m_)), axes(axes_), first_column(first_column_),
        weights_scale(weights_scale_) {}
  std::string title;
  ag::Tensor m;  // 2-D
  Axes axes;
  std::int64_t first_column;  // the number of the first column
  bool weights_scale;         // 0..1 (attention weights); else diverging around 0
};

// The matrix as a heatmap with its values in the cells, captioned with its rows as the terminal
// prints them.
std::pair<std::string, std::string> picture(const Matrix& x, const std::vector<std::string>& tokens) {
  svg::Heatmap h;
  h.title = x.title;
  h.rows = x.m.size(0);
  h.cols = x.m.size(1);
  h.values = x.m.detach().to_vector();
  h.show_values = true;
  h.cell = 46;
  h.format = num;
  h.scale = x.weights_scale ? svg::ColourScale::sequential(0, 1, "attention weight")
                            : svg::ColourScale::diverging_for(h.values, "value");
  std::string caption;
  for (std::int64_t r = 0; r < h.rows; ++r) {
    const bool token_rows = x.axes != Axes::Weights;
    const std::string name = token_rows ? tokens[static_cast<std::size_t>(r)] : fmt::format("row {}", r + 1);
    caption += fmt::format("{}{}: {}", r ? "\n" : "", name, vec(row(x.m, r)));
    if (token_rows) h.row_notes.push_back(tokens[static_cast<std::size_t>(r)]);
    else h.row_labels.push_back(std::to_string(r + 1));
  }
  for (std::int64_t c = 0; c < h.cols; ++c) {
    if (x.axes == Axes::Attention) h.col_notes.push_back(tokens[static_cast<std::size_t>(c)]);
    else h.col_labels.push_back(std::to_string(c + (x.axes == Axes::Weights ? 1 : x.first_column)));
  }
  h.row_axis = x.axes == Axes::Attention ? "query position" : x.axes == Axes::Weights ? "row" : "position";
  h.col_axis = x.axes == Axes::Attention ? "key position" : "column";
  return {svg::heatmap_svg(h, 0, 0, true), caption};
}

void show(html::Page& page, const std::vector<Matrix>& xs, const std::vector<std::string>& tokens) {
  std::vector<std::string> pictures, captions;
  for (const auto& x : xs) {
    auto [svg, caption] = picture(x, tokens);
    pictures.push_back(std::move(svg));
    captions.push_back(std::move(caption));
  }
  page.figures(pictures, captions);
}

// The (T, d_k) slice of head h of a (B, H, T, d_k) tensor; its columns are h*d_k+1 .. of the row.
Matrix head_matrix(const std::string& title, const ag::Tensor& t, std::int64_t h, Axes axes = Axes::Tokens) {
  const ag::Tensor m = S::head(t, h);
  return {fmt::format("{}, head {}", title, h + 1), m, axes, h * m.size(1) + 1};
}

ag::Tensor rows_of(const ag::Tensor& t) { return ag::reshape(t.detach(), {t.numel() / t.size(-1), t.size(-1)}); }

void forward_sections(html::Page& page, const WalkThrough& w) {
  const S& st = w.study;
  const std::int64_t H = w.layer.num_heads(), d_k = w.layer.head_dim();
  page.heading(2, "The input");
  page.paragraph("W_Q = W_K = W_V = I (no biases), so the layer's inputs are the projected rows Q, K, V themselves. "
                 "Rows are token positions (0 = t1, 1 = t2), columns the 4 features.");
  show(page, {{"Q", w.Q}, {"K", w.K}, {"V", w.V}}, w.tokens);
  page.heading(2, "Split into heads");
  page.paragraph(fmt::format("Head 1 takes columns 1-{0}, head 2 columns {1}-{2}: a reshape, nothing new.", d_k,
                             d_k + 1, 2 * d_k));
  for (std::int64_t h = 0; h < H; ++h)
    show(page, {head_matrix("Q", st.q, h), head_matrix("K", st.k, h), head_matrix("V", st.v, h)}, w.tokens);
  for (std::int64_t h = 0; h < H; ++h) {
    page.heading(2, fmt::format("Attend, head {}", h + 1));
    page.paragraph(fmt::format("Raw scores Q·Kᵀ, scaled by 1/sqrt(d_k) = 1/{:.3f}, softmax weights A per query row, "
                               "and the head's output z = A·V.",
                               std::sqrt(static_cast<double>(d_k))));
    show(page,
         {head_matrix("raw scores Q·Kᵀ", st.raw_scores, h, Axes::Attention),
          head_matrix("scaled scores", st.attn_scores, h, Axes::Attention),
          {fmt::format("weights A, head {}", h + 1), S::head(st.pattern, h), Axes::Attention, 1, true},
          head_matrix("z = A·V", st.z, h)},
         w.tokens);
  }
  page.heading(2, "Concat, W_O and the output");
  page.paragraph("Each token's head outputs side by side (head 1's, then head 2's), mixed by W_O: out = concat · W_O.");
  show(page, {{"concat", rows_of(st.concat)}, {"W_O", w.layer.W_O(), Axes::Weights}, {"out", w.out}}, w.tokens);
}

void backward_sections(html::Page& page, const WalkThrough& w) {
  const S& st = w.study;
  page.heading(2, "Backward of L = out(t1)[0]");
  page.paragraph(fmt::format("L = {}. Each gradient stands next to the quantity it belongs to.", num(w.loss)));
  show(page, {{"out", w.out}, {"dL/dout", w.out.grad()}}, w.tokens);
  show(page, {{"W_O", w.layer.W_O(), Axes::Weights}, {"dL/dW_O", w.layer.W_O().grad(), Axes::Weights}}, w.tokens);
  show(page, {{"concat", rows_of(st.concat)}, {"dL/dconcat", rows_of(st.concat.grad())}}, w.tokens);
  for (std::int64_t h = 0; h < w.layer.num_heads(); ++h) {
    page.heading(3, fmt::format("Head {}", h + 1));
    show(page, {head_matrix("z", st.z, h), head_matrix("dL/dz", st.z.grad(), h)}, w.tokens);
    show(page,
         {{fmt::format("A, head {}", h + 1), S::head(st.pattern, h), Axes::Attention, 1, true},
          head_matrix("dL/dA", st.pattern.grad(), h, Axes::Attention)},
         w.tokens);
    show(page,
         {head_matrix("scaled scores", st.attn_scores, h, Axes::Attention),
          head_matrix("dL/d(scaled scores)", st.attn_scores.grad(), h, Axes::Attention)},
         w.tokens);
    show(page,
         {head_matrix("raw scores", st.raw_scores, h, Axes::Attention),
          head_matrix("dL/d(raw scores)", st.raw_scores.grad(), h, Axes::Attention)},
         w.tokens);
    show(page,
         {head_matrix("Q", st.q, h), head_matrix("dL/dQ", st.q.grad(), h), head_matrix("K", st.k, h),
          head_matrix("dL/dK", st.k.grad(), h), head_matrix("V", st.v, h), head_matrix("dL/dV", st.v.grad(), h)},
         w.tokens);
  }
  page.heading(3, "The inputs");
  show(page, {{"Q", w.Q}, {"dL/dQ", w.Q.grad()}, {"K", w.K}, {"dL/dK", w.K.grad()}, {"V", w.V}, {"dL/dV", w.V.grad()}},
       w.tokens);
}

}  // namespace

std::string walkthrough_html(const WalkThrough& w) {
  html::Page page("Multi-head attention with the seed's numbers");
  page.paragraph(fmt::format("d_model = {}, {} heads of width d_k = {}; two tokens t1 and t2 at positions 0 and 1. "
                             "Hover a cell for its value. The numbers are those worked_example prints.",
                             w.layer.embed_dim(), w.layer.num_heads(), w.layer.head_dim()));
  forward_sections(page, w);
  backward_sections(page, w);
  return page.html();
}

}  // namespace worked
