#include "sample.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

namespace char_gpt {

void SampleOptions::check() const {
  if (max_new_tokens < 0)
    throw std::invalid_argument(fmt::format("sample: max_new_tokens must be >= 0, got {}", max_new_tokens));
  if (!(temperature > 0.0) || !std::isfinite(temperature))
    throw std::invalid_argument(fmt::format("sample: temperature must be positive and finite, got {}", temperature));
  if (top_k < 1) throw std::invalid_argument(fmt::format("sample: top_k must be >= 1, got {}", top_k));
}

std::vector<double> next_token_probabilities(const std::vector<double>& logits, double temperature,
                                             std::int64_t top_k) {
  if (logits.empty()) throw std::invalid_argument("next_token_probabilities: no logits");
  std::vector<double> sorted = logits;
  const auto k = static_cast<std::size_t>(std::min<std::int64_t>(top_k, static_cast<std::int64_t>(logits.size())));
  std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(k - 1), sorted.end(),
                   std::greater<double>());
  const double kth = sorted[k - 1];
  const double top = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size(), 0.0);
  double total = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] < kth) continue;  // outside the top k
    p[i] = std::exp((logits[i] - top) / temperature);
    total += p[i];
  }
  for (double& x : p) x /= total;
  return p;
}

std::vector<std::int32_t> generate(Gpt& model, std::vector<std::int32_t> context, const SampleOptions& options) {
  options.check();
  const std::int64_t V = model.config().vocab_size, block = model.config().block_size;
  if (context.empty()) throw std::invalid_argument("generate: the context is empty (give at least one token)");
  for (auto t : context)
    if (t < 0 || t >= V) throw std::invalid_argument(fmt::format("generate: token {} is outside [0, {})", t, V));
  const bool was_training = model.is_training();
  model.eval();
  ag::NoGradGuard no_grad;
  ag::Generator gen(options.seed);
  for (std::int64_t n = 0; n < options.max_new_tokens; ++n) {
    const auto T = std::min<std::int64_t>(block, static_cast<std::int64_t>(context.size()));
    std::vector<double> window(context.end() - T, context.end());
    const ag::Tensor logits = model.forward(ag::tensor(window, {1, T}));  // (1, T, V)
    const std::vector<double> last = ag::narrow(logits, 1, T - 1, 1).to_vector();
    const std::vector<double> p = next_token_probabilities(last, options.temperature, options.top_k);
    const double u = gen.uniform();
    double cumulative = 0;
    std::int32_t next = -1;
    for (std::int64_t i = 0; i < V; ++i) {
      cumulative += p[static_cast<std::size_t>(i)];
      if (p[static_cast<std::size_t>(i)] > 0) next = static_cast<std::int32_t>(i);  // the last kept, for u ≈ 1
      if (u < cumulative) break;
    }
    context.push_back(next);
  }
  model.train(was_training);
  return context;
}

}  // namespace char_gpt
