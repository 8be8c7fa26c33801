#include "task.hpp"

#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

namespace induction {

void TaskConfig::check() const {
  if (vocab < 2) throw std::invalid_argument(fmt::format("--vocab {}: needs at least 2 tokens", vocab));
  // Each Markov training sequence draws a transition matrix of vocab² entries.
  if (training == Training::Markov && vocab > kMaxMarkovVocab)
    throw std::invalid_argument(fmt::format("--vocab {}: a Markov training sequence draws a {} x {} transition "
                                            "matrix; at most {} token kinds with --train-on markov",
                                            vocab, vocab, vocab, kMaxMarkovVocab));
  // (A segment of one token has nothing after its first token to predict by induction: the
  // repeated-token loss would be a mean over no targets.)
  if (period_min < 2)
    throw std::invalid_argument(fmt::format(
        "--period-min {}: the segment needs at least 2 tokens (only the tokens after the first of the repeat are "
        "predicted by induction)", period_min));
  if (period_max < period_min)
    throw std::invalid_argument(fmt::format("--period-max {} is below --period-min {}", period_max, period_min));
  if (period_max > seq_len / 2)  // 2·period_max > seq_len, without overflow
    throw std::invalid_argument(fmt::format("--period-max {}: a segment of {} tokens repeated does not fit in "
                                            "--seq-len {} (needs twice {} tokens)",
                                            period_max, period_max, seq_len, period_max));
}

std::string TaskConfig::describe() const {
  const std::string repeat = fmt::format("{} random tokens of {} in which a segment of {} to {} tokens is repeated "
                                         "at once",
                                         seq_len, vocab, period_min, period_max);
  if (training == Training::Repeat) return repeat;
  return fmt::format("trained on walks of {} tokens of a Markov chain over {} tokens, a chain per sequence "
                     "(rows from Dirichlet(1)); measured on {}",
                     seq_len, vocab, repeat);
}

namespace {

std::int64_t draw_below(ag::Generator& gen, std::int64_t n) {  // uniform in [0, n)
  return static_cast<std::int64_t>(gen.next_u64() % static_cast<std::uint64_t>(n));
}
double draw_open01(ag::Generator& gen) {  // uniform in (0, 1)
  return (static_cast<double>(gen.next_u64() >> 11) + 0.5) * 0x1p-53;
}

}  // namespace

ag::Tensor make_training_batch(const TaskConfig& task, std::int64_t B, ag::Generator& gen) {
  if (task.training == Training::Repeat) return make_batch(task, B, gen).tokens;
  const std::int64_t T = task.seq_len, V = task.vocab;
  std::vector<std::int64_t> t(static_cast<std::size_t>(B * T));
  std::vector<double> cumulative(static_cast<std::size_t>(V * V));
  for (std::int64_t b = 0; b < B; ++b) {
    // Each row of the chain's matrix from Dirichlet(1): independent Exp(1) draws, normalised
    // (kept as running sums, to draw the next token by one comparison per candidate).
    for (std::int64_t r = 0; r < V; ++r) {
      double sum = 0;
      for (std::int64_t c = 0; c < V; ++c) cumulative[static_cast<std::size_t>(r * V + c)] = sum += -std::log(draw_open01(gen));
      for (std::int64_t c = 0; c < V; ++c) cumulative[static_cast<std::size_t>(r * V + c)] /= sum;
    }
    std::int64_t token = draw_below(gen, V);
    for (std::int64_t i = 0; i < T; ++i) {
      t[static_cast<std::size_t>(b * T + i)] = token;
      const double u = draw_open01(gen);
      std::int64_t next = 0;
      while (next < V - 1 && u >= cumulative[static_cast<std::size_t>(token * V + next)]) ++next;
      token = next;
    }
  }
  return ag::tensor_int64(t, {B, T});
}

Batch make_batch(const TaskConfig& task, std::int64_t B, ag::Generator& gen) {
  const std::int64_t T = task.seq_len;
  std::vector<std::int64_t> t(static_cast<std::size_t>(B * T));
  Batch batch;
  const auto draw = [&gen](std::int64_t n) { return draw_below(gen, n); };
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t i = 0; i < T; ++i) t[static_cast<std::size_t>(b * T + i)] = draw(task.vocab);
    const std::int64_t period = task.period_min + draw(task.period_max - task.period_min + 1);
    const std::int64_t start = draw(T - 2 * period + 1);
    for (std::int64_t i = 0; i < period; ++i)
      t[static_cast<std::size_t>(b * T + start + period + i)] = t[static_cast<std::size_t>(b * T + start + i)];
    batch.start.push_back(start);
    batch.period.push_back(period);
  }
  batch.tokens = ag::tensor_int64(t, {B, T});
  return batch;
}

std::vector<TargetKind> target_kinds(const Batch& batch) {
  const std::int64_t B = batch.size(), T = batch.seq_len();
  std::vector<TargetKind> kinds(static_cast<std::size_t>(B * (T - 1)), TargetKind::Other);
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t s = batch.start[static_cast<std::size_t>(b)], p = batch.period[static_cast<std::size_t>(b)];
    for (std::int64_t pos = 1; pos < T; ++pos) {  // the target tokens[b][pos], predicted at pos - 1
      TargetKind k = TargetKind::Other;
      if (pos >= s && pos < s + p) k = TargetKind::First;
      else if (pos == s + p) k = TargetKind::RepeatHead;
      else if (pos > s + p && pos < s + 2 * p) k = TargetKind::Repeat;
      kinds[static_cast<std::size_t>(b * (T - 1) + pos - 1)] = k;
    }
  }
  return kinds;
}

}  // namespace induction
