#pragma once
// worked_example's numbers as the terminal prints them, and its walk-through as one
// self-contained HTML page (html_page.hpp): the input, the split into heads, each head's scores,
// weights and context as heatmaps with position labels, the concat, W_O and the output; then the
// backward of L with each gradient next to the quantity it belongs to. Every number on the page
// is printed by the same functions as the terminal's, from the same tensors.
#include <string>
#include <vector>

#include <nn/nn.hpp>

namespace worked {

namespace ag = autograd;

// "1.340": three decimals as the seed prints them; whole numbers as they are ("1"); no "-0.000".
std::string num(double x);
std::string vec(const std::vector<double>& v);  // "[1.340, 0.660]"
std::vector<double> row(const ag::Tensor& m, std::int64_t r);  // row r of a 2-D tensor

// The tensors of one forward and backward of the seed's layer.
struct WalkThrough {
  const nn::AttentionStudy& study;  // of the forward, after L's backward
  const nn::MultiHeadAttention& layer;
  ag::Tensor Q, K, V;  // the inputs (2, 4), leaves with their gradients
  ag::Tensor out;      // (2, 4), with its gradient retained
  double loss = 0;     // L = out(t1)[0]
  std::vector<std::string> tokens;  // "t1", "t2"
};

std::string walkthrough_html(const WalkThrough& w);

}  // namespace worked
