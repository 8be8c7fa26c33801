// The seed's multi-head attention walk-through, computed by nn::MultiHeadAttention.
//
// d_model = 4, 2 heads of width d_k = 2. The seed starts from two tokens whose projected Q, K, V
// rows are already computed; we get exactly those rows out of the layer by setting
// W_Q = W_K = W_V = I (and no biases) and feeding the rows in as query, key and value. Study mode
// keeps every intermediate tensor of the forward pass, so the program prints the seed's steps —
// split, raw scores, scaled scores, weights, per-head outputs, concat, W_O — from the layer itself,
// then runs backward on a simple loss and prints the gradients, and gradchecks every parameter.
//
// With --report FILE.html it also writes the walk-through as a page to open in a browser
// (worked_example_page.hpp), with the same numbers.
//
//   build:  cmake --build build --target worked_example && ./build/examples/worked_example
//           ./build/examples/worked_example --report worked_example.html
#include <cmath>
#include <exception>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nn/nn.hpp>

#include "html_page.hpp"
#include "worked_example_page.hpp"

namespace ag = autograd;

namespace {

using worked::num;
using worked::row;
using worked::vec;

void print_matrix(const std::string& indent, const ag::Tensor& m) {
  for (std::int64_t r = 0; r < m.size(0); ++r) fmt::print("{}{}\n", indent, vec(row(m, r)));
}

void set(const ag::Tensor& param, const std::vector<double>& values) {
  ag::NoGradGuard no_grad;
  ag::Tensor p = param;
  p.copy_(ag::tensor(values, param.shape(), param.dtype()));
}

// The seed's example, built: d_model = 4, 2 heads of width 2, no biases, W_Q = W_K = W_V = I and
// the seed's W_O; study mode keeps every intermediate tensor.
constexpr std::int64_t d_model = 4, num_heads = 2, d_k = d_model / num_heads;
const char* const token[] = {"t1", "t2"};
using S = nn::AttentionStudy;

nn::MultiHeadAttention seed_layer() {
  nn::MultiHeadAttentionOptions opt{d_model, num_heads, 0.0, /*bias=*/false};
  opt.dtype = ag::Dtype::Float64;
  opt.study = true;  // keep per-head Q, K, V, scores, weights and context of each forward
  nn::MultiHeadAttention mha(opt);
  const std::vector<double> identity = {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1};
  set(mha.W_Q(), identity);
  set(mha.W_K(), identity);
  set(mha.W_V(), identity);
  set(mha.W_O(), {1, 0, 1, 0,  // the seed's W_O
                  0, 1, 0, 1,
                  1, 0, 0, 1,
                  0, 1, 1, 0});
  return mha;
}

// Split, then per head: raw scores, scaled scores, weights and the weighted sum of values.
void print_split_and_attend(const S& st) {
  fmt::print("\nSplit. Head 1 takes columns 1-2, head 2 takes columns 3-4 (a reshape, nothing new):\n");
  for (std::int64_t h = 0; h < num_heads; ++h) {
    const ag::Tensor q = S::head(st.q, h), k = S::head(st.k, h), v = S::head(st.v, h);
    fmt::print("  head {}:  Q-t1 {}  Q-t2 {}   K-t1 {}  K-t2 {}   V-t1 {}  V-t2 {}\n", h + 1, vec(row(q, 0)),
               vec(row(q, 1)), vec(row(k, 0)), vec(row(k, 1)), vec(row(v, 0)), vec(row(v, 1)));
  }
  const double root = std::sqrt(static_cast<double>(d_k));
  for (std::int64_t h = 0; h < num_heads; ++h) {
    fmt::print("\nAttend (head {}). sqrt(d_k) = sqrt({}) = {:.3f}\n", h + 1, d_k, root);
    const ag::Tensor raw = S::head(st.raw_scores, h), scaled = S::head(st.attn_scores, h), w = S::head(st.pattern, h);
    const ag::Tensor v = S::head(st.v, h), ctx = S::head(st.z, h);
    for (int t = 0; t < 2; ++t) {
      fmt::print("  {}: raw scores Q·Kᵀ {}  -> scaled (÷{:.3f}) {}  -> softmax weights {}\n", token[t],
                 vec(row(raw, t)), root, vec(row(scaled, t)), vec(row(w, t)));
      const auto wt = row(w, t);
      fmt::print("      head{}-{} = {}·{} + {}·{} = {}\n", h + 1, token[t], num(wt[0]), vec(row(v, 0)), num(wt[1]),
                 vec(row(v, 1)), vec(row(ctx, t)));
    }
  }
  fmt::print("  (head 2's value rows are both [1, 1], so every weighted sum lands on [1, 1])\n");
}

// Concat of the heads, W_O, and the output rows.
void print_concat_and_output(const S& st, const nn::MultiHeadAttention& mha, const ag::Tensor& out) {
  const ag::Tensor concat = ag::reshape(st.concat.detach(), {2, d_model});
  fmt::print("\nConcat. Head 1's output, then head 2's:\n");
  for (int t = 0; t < 2; ++t) fmt::print("  {}: {}\n", token[t], vec(row(concat, t)));
  fmt::print("\nW_O (rows):\n");
  print_matrix("  ", mha.W_O());
  fmt::print("out = concat · W_O:\n");
  for (int t = 0; t < 2; ++t) fmt::print("  out({}) = {}\n", token[t], vec(row(out, t)));
  const auto c1 = row(concat, 0);
  fmt::print("  check: out(t1)[0] = {}·1 + {}·0 + {}·1 + {}·0 = {}\n", num(c1[0]), num(c1[1]), num(c1[2]),
             num(c1[3]), num(c1[0] + c1[2]));
  fmt::print("\nParameters: {} = 4 · d_model² = 4 · {}; with 4 heads of width 1 it would be {} too.\n",
             mha.num_parameters(), d_model * d_model,
             nn::MultiHeadAttention(nn::MultiHeadAttentionOptions{d_model, 4, 0.0, false}).num_parameters());
}

// Backward of L = out(t1)[0], the first number of t1's output: dL/dW_O and dL/d(scores).
double print_backward(const S& st, const nn::MultiHeadAttention& mha, ag::Tensor out) {
  out.retain_grad();  // dL/dout, for the page
  ag::Tensor loss = ag::sum(ag::narrow(ag::narrow(out, 0, 0, 1), 1, 0, 1));
  loss.backward();
  fmt::print("\nBackward of L = out(t1)[0] = {}\n", num(loss.item()));
  fmt::print("dL/dW_O (only column 1 is nonzero: it holds concat(t1), what out(t1)[0] read):\n");
  print_matrix("  ", mha.W_O().grad());
  for (std::int64_t h = 0; h < num_heads; ++h) {
    fmt::print("dL/d(scaled scores), head {}:\n", h + 1);
    print_matrix("  ", S::head(st.attn_scores.grad(), h));
  }
  fmt::print("  (head 2's scores get no gradient: its values are all equal, so moving weight between\n"
             "   keys changes nothing; in head 1, raising t1's score for K-t1 raises L)\n");
  fmt::print("dL/d(raw scores) = dL/d(scaled scores) / {:.3f}; head 1: {}\n", std::sqrt(static_cast<double>(d_k)),
             vec(row(S::head(st.raw_scores.grad(), 0), 0)));
  return loss.item();
}

// Every parameter against central differences, float64, on both attention cores.
bool gradcheck_parameters(nn::MultiHeadAttention& mha, const ag::Tensor& Q, const ag::Tensor& K, const ag::Tensor& V) {
  fmt::print("\nGradcheck (float64, central differences, atol 1e-8, rtol 1e-6), output = out:\n");
  mha.set_study(false);
  bool all_ok = true;
  for (auto& [name, p] : mha.named_parameters()) {
    for (auto core : {nn::AttentionCore::Fused, nn::AttentionCore::Composed}) {
      mha.set_core(core);
      auto r = ag::gradcheck([&](const std::vector<ag::Tensor>&) { return mha(Q, K, V).output; }, {p});
      all_ok = all_ok && r.ok;
      fmt::print("  {} ({:8}): {}  max abs error {:.1e}\n", name, core == nn::AttentionCore::Fused ? "fused" : "composed",
                 r.ok ? "ok  " : "FAIL", r.max_abs_error);
    }
  }
  return all_ok;
}

// The page argument: none, or --report FILE.html. Anything else is refused with the usage.
bool parse_args(int argc, char** argv, std::string& report) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--report" && i + 1 < argc) {
      report = argv[++i];
    } else if (arg == "--report") {
      fmt::print(stderr, "worked_example: --report wants a file name\nusage: worked_example [--report FILE.html]\n");
      return false;
    } else {
      fmt::print(stderr, "worked_example: unexpected argument '{}'\nusage: worked_example [--report FILE.html]\n", arg);
      return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string report;
  if (!parse_args(argc, argv, report)) return 2;
  if (!report.empty()) {
    try {  // before the walk-through, so that a path that cannot be written costs nothing
      html::check_writable(report);
    } catch (const std::exception& e) {
      fmt::print(stderr, "worked_example: --report {}: {}\n", report, e.what());
      return 1;
    }
  }
  const ag::Dtype f64 = ag::Dtype::Float64;
  nn::MultiHeadAttention mha = seed_layer();
  // The projected rows. Head 1 (columns 1-2) is the seed's: Q-t1 [1,0], K-t1 [1,0], K-t2 [0,1],
  // V-t1 [2,0], V-t2 [0,2]. Head 2's values are [1,1] for both tokens, as in the seed. They are
  // leaves with gradients, for the page's dL/dQ, dL/dK, dL/dV.
  ag::Tensor Q = ag::tensor({1, 0, 1, 0, 0, 1, 0, 1}, {2, 4}, f64);
  ag::Tensor K = ag::tensor({1, 0, 0, 1, 0, 1, 1, 0}, {2, 4}, f64);
  ag::Tensor V = ag::tensor({2, 0, 1, 1, 0, 2, 1, 1}, {2, 4}, f64);
  for (ag::Tensor* t : {&Q, &K, &V}) t->requires_grad_();

  fmt::print("Multi-head attention with the seed's numbers: d_model = {}, {} heads, d_k = {}\n\n", d_model,
             num_heads, d_k);
  fmt::print("{}\n\n", mha);
  fmt::print("W_Q = W_K = W_V = I, so the inputs are the projected rows themselves:\n");
  for (int t = 0; t < 2; ++t)
    fmt::print("  {}:  Q {}   K {}   V {}\n", token[t], vec(row(Q, t)), vec(row(K, t)), vec(row(V, t)));

  auto [out, weights] = mha(Q, K, V);
  print_split_and_attend(mha.study());
  print_concat_and_output(mha.study(), mha, out);
  const double loss = print_backward(mha.study(), mha, out);
  if (!report.empty()) {
    try {  // before the gradcheck, which runs the layer again
      html::write_file(report, worked::walkthrough_html({mha.study(), mha, Q, K, V, out, loss, {"t1", "t2"}}));
    } catch (const std::exception& e) {
      fmt::print(stderr, "worked_example: {}\n", e.what());
      return 1;
    }
  }
  const bool ok = gradcheck_parameters(mha, Q, K, V);
  if (!report.empty()) fmt::print("\nreport: {}\n", report);
  return ok ? 0 : 1;
}
