// docs/guide.md's function transforms on a small float64 TransformerLM (random weights):
//   1. the Jacobian of one attention head's output z (layer 1, head 2, one query position) with
//      respect to the residual stream entering layer 1, in reverse and forward mode, with the
//      head's sensitivity to each source position next to its attention pattern;
//   2. each example's gradient of every parameter (nn::per_example_gradients) and the cosine
//      similarity of those gradients between examples.
// Fails (exit 1) when a check does: the two modes against each other and against a jvp, the
// positions after the query at exactly zero (causal), the per-example gradients against the
// fallback of one backward per example, a repeated example at similarity 1.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nn/nn.hpp>

namespace ag = autograd;

constexpr std::int64_t kVocab = 16, kT = 8, kE = 32, kH = 4, kHead = 2, kQuery = 5;

// Hooks that stay for one scope: removed when it ends, also by an exception.
struct ScopedHooks {
  std::vector<nn::HookHandle> handles;
  ~ScopedHooks() {
    for (auto& h : handles) h.remove();
  }
};

double max_abs_diff(const ag::Tensor& a, const ag::Tensor& b) {
  const std::vector<double> x = a.to_vector(), y = b.to_vector();
  double d = x.size() == y.size() ? 0.0 : INFINITY;
  for (std::size_t i = 0; i < x.size() && i < y.size(); ++i) d = std::max(d, std::abs(x[i] - y[i]));
  return d;
}

int main() {
  ag::Generator gen(3);
  nn::TransformerLM model({.n_layers = 2, .d_model = kE, .n_heads = kH, .d_mlp = 64, .d_vocab = kVocab,
                           .n_ctx = kT, .dtype = ag::Dtype::Float64},
                          gen);
  const ag::Tensor tokens = ag::randint(0, kVocab, {1, kT}, gen);
  bool ok = true;
  const auto check = [&ok](bool pass, const std::string& what) {
    fmt::print("{}: {}\n", pass ? "ok" : "FAILED", what);
    ok = ok && pass;
  };

  // The residual stream entering layer 1, (1, T, E), and layer 1's pattern, (1, H, T, T).
  const ag::Tensor resid = model.residual_at(tokens, 1);
  ag::Tensor pattern;
  {
    const ag::NoGradGuard no_grad;
    const ScopedHooks hooks{{model.add_hook("blocks.1.attn.pattern", [&](const ag::Tensor& p, const std::string&) {
      pattern = p.clone();
      return ag::Tensor();
    })}};
    model.forward(tokens);
  }

  // resid ↦ z of layer 1's head kHead at position kQuery, (d_head): the residual stream is
  // replaced by the function's argument and z read where the head forms it. (Hook handles are
  // not RAII: ScopedHooks removes them also when forward throws.)
  const auto head_z = [&](const std::vector<ag::Tensor>& in) {
    ag::Tensor z;
    const ScopedHooks hooks{{
        model.add_hook("blocks.1.resid_pre", [&](const ag::Tensor&, const std::string&) { return in[0]; }),
        model.add_hook("blocks.1.attn.z", [&](const ag::Tensor& v, const std::string&) {
          z = v;  // (1, H, T, d_head)
          return ag::Tensor();
        }),
    }};
    model.forward(tokens);
    return ag::reshape(ag::narrow(ag::narrow(z, 1, kHead, 1), 2, kQuery, 1), {-1});
  };
  const ag::Tensor J = ag::jacobian(head_z, {resid})[0];  // (d_head, 1, T, E)
  const ag::Tensor Jf = ag::jacobian(head_z, {resid}, {.mode = ag::JacobianMode::Forward})[0];
  check(max_abs_diff(J, Jf) < 1e-12, fmt::format("reverse and forward Jacobians {} agree to {:.1e}",
                                                 ag::shape_str(J.shape()), max_abs_diff(J, Jf)));

  // One jvp along a random direction equals the Jacobian applied to it.
  const ag::Tensor v = ag::randn(resid.shape(), ag::Dtype::Float64, gen);
  const ag::JvpResult jv = ag::jvp([&](const ag::TensorList& in) { return ag::TensorList{head_z(in)}; }, {resid}, {v});
  const ag::Tensor Jv = ag::matmul(ag::reshape(J, {J.size(0), -1}), ag::reshape(v, {-1}));
  check(max_abs_diff(jv.tangents[0], Jv) < 1e-12, fmt::format("jvp equals J·v to {:.1e}", max_abs_diff(jv.tangents[0], Jv)));

  // The head's sensitivity to each source position, ‖∂z/∂resid[j]‖, beside its attention there.
  fmt::print("layer 1, head {}, query position {}:\n  source  ‖dz/dresid‖  pattern\n", kHead, kQuery);
  const std::vector<double> jn = J.to_vector(), pn = pattern.to_vector();
  bool causal = true;
  for (std::int64_t j = 0; j < kT; ++j) {
    double s = 0.0;
    for (std::int64_t r = 0; r < J.size(0); ++r)
      for (std::int64_t e = 0; e < kE; ++e) s += std::pow(jn[static_cast<std::size_t>((r * kT + j) * kE + e)], 2);
    const double p = pn[static_cast<std::size_t>((kHead * kT + kQuery) * kT + j)];
    fmt::print("  {:>6}  {:>11.4f}  {:>7.4f}\n", j, std::sqrt(s), p);
    if (j > kQuery) causal = causal && s == 0.0;
  }
  check(causal, "the positions after the query have a Jacobian of exactly zero");

  // Each example's gradient of its mean next-token loss: six sequences, the fourth a copy of
  // the first; the targets are the tokens shifted by one (the last wraps to the first).
  ag::Tensor batch = ag::randint(0, kVocab, {6, kT}, gen);
  batch = ag::cat({ag::narrow(batch, 0, 0, 3), ag::narrow(batch, 0, 0, 1), ag::narrow(batch, 0, 4, 2)}, 0);
  const ag::Tensor targets = ag::cat({ag::narrow(batch, 1, 1, kT - 1), ag::narrow(batch, 1, 0, 1)}, 1);
  const nn::PerExampleLoss losses = [&](const ag::Tensor& b) {
    const ag::Tensor ce = ag::cross_entropy(model.forward(b), targets, {.reduction = ag::Reduction::None});  // (B, T)
    return ag::mean(ce, 1);                                                                                 // (B)
  };
  const nn::PerExampleGrads g = nn::per_example_gradients(model, batch, losses);
  const nn::PerExampleGrads ref = nn::per_example_gradients(model, batch, losses, {.method = nn::PerExampleMethod::Fallback});
  double worst = 0.0;
  ag::TensorList flat;
  for (std::size_t k = 0; k < g.grads.size(); ++k) {
    worst = std::max(worst, max_abs_diff(g.grads[k].second, ref.grads[k].second));
    flat.push_back(ag::reshape(g.grads[k].second, {g.batch_size, -1}));
  }
  check(g.fallback.empty() && worst < 1e-12,
        fmt::format("{} parameters on the fast path, equal to one backward per example to {:.1e}", g.fast.size(), worst));

  const ag::Tensor G = ag::cat(flat, 1);                                   // (B, parameters)
  const ag::Tensor norms = ag::sqrt(ag::sum(ag::square(G), 1, true));      // (B, 1)
  const ag::Tensor unit = ag::div(G, norms);
  const ag::Tensor similarity = ag::matmul(unit, ag::transpose(unit, 0, 1));  // (B, B)
  fmt::print("cosine similarity of the examples' gradients ({} parameters):\n", G.size(1));
  const std::vector<double> sim = similarity.to_vector();
  for (std::int64_t i = 0; i < g.batch_size; ++i) {
    std::string row;
    for (std::int64_t j = 0; j < g.batch_size; ++j) row += fmt::format(" {:>6.3f}", sim[static_cast<std::size_t>(i * g.batch_size + j)]);
    fmt::print(" {}\n", row);
  }
  check(std::abs(sim[3] - 1.0) < 1e-12, "example 3, a copy of example 0, has similarity 1 with it");
  return ok ? 0 : 1;
}
