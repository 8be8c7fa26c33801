// The induction-head study of docs/circuits.md, end to end: train a 2-layer attention-only
// transformer on in-context Markov chains, find its previous-token head and its
// induction head, measure their K-composition against random matrices of the same shapes, show by
// path ablation that the induction head reads the previous-token head through its keys alone, and
// write the attention patterns to a page. It says whether the circuit formed (previous-token
// score >= 0.5, induction score >= 0.7, K-composition >= 1.3x the baseline, the keys-only ablation
// cutting the induction score by 30 % and the others by less than 10 %); it fails (exit 1) only
// when the study could not be measured (a score that is not finite), and exits 2 on bad arguments.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include <nn/nn.hpp>

namespace ag = autograd;
namespace circuits = nn::circuits;

constexpr std::int64_t kVocab = 8, kT = 64;

// B walks of kT tokens, each of a Markov chain of its own over kVocab tokens, its rows drawn from
// Dirichlet(1) (normalised Exp(1) draws): the next token is best predicted by what followed the
// current one earlier in the sequence, which is what an induction head reads (Edelman et al. 2024).
ag::Tensor sequences(std::int64_t B, ag::Generator& gen) {
  std::vector<std::int64_t> t;
  for (std::int64_t b = 0; b < B; ++b) {
    std::vector<double> weight = ag::rand({kVocab, kVocab}, ag::Dtype::Float64, gen).to_vector();
    for (double& w : weight) w = -std::log1p(-w);
    const std::vector<double> u = ag::rand({kT}, ag::Dtype::Float64, gen).to_vector();
    std::int64_t x = ag::randint(0, kVocab, {1}, gen).to_vector()[0];
    for (std::int64_t i = 0; i < kT; ++i) {
      t.push_back(x);
      const double* row = &weight[static_cast<std::size_t>(x * kVocab)];
      double left = u[static_cast<std::size_t>(i)] * std::accumulate(row, row + kVocab, 0.0);
      for (x = 0; x < kVocab - 1 && (left -= row[x]) >= 0;) ++x;
    }
  }
  return ag::tensor(t, {B, kT});
}

// B sequences of kT / 2 random tokens, each repeated once: where the induction pattern is defined
// at every position of the second half (the sequences the head scores are measured on).
ag::Tensor repeated(std::int64_t B, ag::Generator& gen) {
  const ag::Tensor half = ag::randint(0, kVocab, {B, kT / 2}, gen);
  return ag::cat({half, half}, 1);
}

// Each head's share of attention on the detector's targets over the query positions that have
// one (Share; TL's measure, Mul, also counts the positions without): (L, H).
ag::Tensor scores(const nn::ActivationCache& cache, circuits::HeadKind kind, const ag::Tensor& tokens) {
  return circuits::head_scores(cache, kind, tokens, {.error_measure = circuits::ErrorMeasure::Share},
                               {"blocks.0.attn.pattern", "blocks.1.attn.pattern"});
}

// The head with the highest score in one layer of an (L, H) score table.
std::int64_t best_head(const ag::Tensor& scores, std::int64_t layer) {
  const std::vector<double> row = ag::narrow(scores, 0, layer, 1).to_vector();
  return static_cast<std::int64_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

double at(const ag::Tensor& t, std::int64_t i, std::int64_t j) { return t.to_vector()[i * t.size(1) + j]; }

int main(int argc, char** argv) {
  int steps = 1500;  // training steps: argv[1] if given, a whole integer >= 1
  double lr = 3e-3;  // argv[2] if given, a finite number > 0
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char *first = a.data(), *last = first + a.size();
    const auto [end, ec] = i == 1 ? std::from_chars(first, last, steps) : std::from_chars(first, last, lr);
    if (i > 2 || ec != std::errc() || end != last || steps < 1 || !std::isfinite(lr) || lr <= 0)
      return std::fprintf(stderr, "usage: %s [steps >= 1 [lr > 0]]; bad argument '%s'\n", argv[0], argv[i]), 2;
  }
  ag::set_num_threads(1);
  ag::Generator gen(1);
  nn::TransformerLM model({.n_layers = 2, .d_model = 64, .n_heads = 4, .d_vocab = kVocab, .n_ctx = kT}, gen);
  nn::AdamW opt(model.named_parameters(), {.lr = lr});
  for (int step = 0; step < steps; ++step) {
    opt.zero_grad();
    ag::Tensor loss = model.loss(sequences(32, gen));
    loss.backward();
    opt.step();
    if (step % 300 == 0) std::printf("step %4d  loss %.3f\n", step, loss.item());
  }

  // Held-out repeated sequences, every hook point cached, no graph.
  ag::NoGradGuard no_grad;
  const ag::Tensor tokens = repeated(64, gen);
  const auto forward = [&] { return model.forward(tokens); };
  const nn::ActivationCache cache = nn::run_with_cache(model, forward);
  const ag::Tensor prev = scores(cache, circuits::HeadKind::PreviousToken, tokens);  // (2, 4)
  const ag::Tensor induction = scores(cache, circuits::HeadKind::Induction, tokens);
  const std::int64_t p = best_head(prev, 0), h = best_head(induction, 1);
  std::printf("previous-token head L0H%lld: score %.3f\n", static_cast<long long>(p), at(prev, 0, p));
  std::printf("induction head L1H%lld: score %.3f\n", static_cast<long long>(h), at(induction, 1, h));

  // K-composition of the two (Elhage et al. 2021), against random matrices of the same shapes.
  const double k = at(circuits::composition_scores(model.attn(0), model.attn(1), circuits::Composition::K), p, h);
  const auto baseline =
      circuits::random_composition_baseline(model.attn(0), model.attn(1), circuits::Composition::K, gen);
  std::printf("K-composition %.3f (random baseline %.3f +- %.3f)\n", k, baseline.mean, baseline.std);

  // Path ablation: the previous-token head's output removed from layer 1's keys, queries or
  // values alone, and the induction head's score then.
  std::vector<double> ablated;
  for (const char* input : {"k_input", "q_input", "v_input"}) {
    ag::Tensor result;  // blocks.0.attn.result (B, H, T, E) of this forward
    nn::HookHandle read = model.add_hook("blocks.0.attn.result", [&](const ag::Tensor& r, const std::string&) {
      result = r;
      return ag::Tensor();
    });
    nn::HookHandle remove = model.add_hook(std::string("blocks.1.") + input, [&](const ag::Tensor& x, const std::string&) {
      return x - ag::squeeze(ag::narrow(result, 1, p, 1), 1);
    });
    const nn::ActivationCache c =
        nn::run_with_cache(model, forward, {.names = {"blocks.0.attn.pattern", "blocks.1.attn.pattern"}});
    read.remove();
    remove.remove();
    ablated.push_back(at(scores(c, circuits::HeadKind::Induction, tokens), 1, h));
    std::printf("previous-token head removed from layer 1's %s: induction score %.3f\n", input, ablated.back());
  }

  // The patterns of both layers over one sequence, and the score tables, on one page.
  std::vector<std::string> words;
  for (double t : ag::narrow(tokens, 0, 0, 1).to_vector()) words.push_back(std::to_string(static_cast<int>(t)));
  const std::vector<std::string> layers = {"L0", "L1"}, heads = {"H0", "H1", "H2", "H3"};
  nn::viewer::Page page("Induction heads in a 2-layer attention-only transformer");
  page.section("Layer 0 patterns").attention_patterns(cache["blocks.0.attn.pattern"], words, "L0");
  page.section("Layer 1 patterns").attention_patterns(cache["blocks.1.attn.pattern"], words, "L1");
  page.section("Head scores")
      .heatmap("previous-token score", prev, layers, heads, "layer", "head")
      .heatmap("induction score", induction, layers, heads, "layer", "head");
  page.save("induction_study.html");

  const bool formed = at(prev, 0, p) >= 0.5 && at(induction, 1, h) >= 0.7 && k >= 1.3 * baseline.mean &&
                      ablated[0] <= 0.7 * at(induction, 1, h) && ablated[1] >= 0.9 * at(induction, 1, h) &&
                      ablated[2] >= 0.9 * at(induction, 1, h);
  std::printf("%s\n", formed ? "the induction circuit formed" : "the induction circuit did NOT form");
  const bool finite = std::isfinite(at(prev, 0, p) + at(induction, 1, h) + k + ablated[0] + ablated[1] + ablated[2]);
  return finite ? 0 : 1;
}
