#pragma once
// Text from a trained char_gpt model, one character at a time (nanoGPT's sample.py): the model
// reads the last block_size tokens, the last position's logits are divided by the temperature,
// all but the top_k largest are dropped, and the next token is drawn from the softmax of the
// rest with a seeded generator. Runs in eval mode under NoGradGuard.
#include <cstdint>
#include <vector>

#include "gpt.hpp"

namespace char_gpt {

struct SampleOptions {
  std::int64_t max_new_tokens = 500;
  double temperature = 0.8;  // > 0; below 1 sharpens the distribution
  std::int64_t top_k = 200;  // >= 1; at least the vocabulary size keeps every token
  std::uint64_t seed = 1337;

  void check() const;  // std::invalid_argument naming the setting at fault
};

// context: at least one token, each in [0, vocab_size). Returns context followed by the new
// tokens. The model's training mode is restored afterwards.
std::vector<std::int32_t> generate(Gpt& model, std::vector<std::int32_t> context, const SampleOptions& options);

// The next-token distribution generate() draws from, for one row of logits: probabilities
// (summing to 1) after temperature and top-k. Ties at the k-th largest logit are all kept, as
// nanoGPT's `logits < topk_values[-1]` rule does.
std::vector<double> next_token_probabilities(const std::vector<double>& logits, double temperature,
                                             std::int64_t top_k);

}  // namespace char_gpt
