#pragma once
// train_heads' task: sequences of random tokens x_0 .. x_(T-1) from a vocabulary of V, and at every
// position t >= 1 a target that needs two relationships at once, the previous token and the first
// token. Position 0 has no target.
#include <cstdint>
#include <string>
#include <vector>

#include <autograd/autograd.hpp>

namespace heads {

namespace ag = autograd;

enum class TaskKind {
  Difference,  // y_t = x_(t-1) - x_0, shifted to a class index: 2V - 1 classes
  Modular,     // y_t = (x_(t-1) - x_0) mod V: V classes
  Pair,        // y_t = (x_0, x_(t-1)) as one of V * V classes
};

struct Task {
  TaskKind kind = TaskKind::Difference;
  std::int64_t vocab = 24;
  std::int64_t seq_len = 12;

  std::int64_t classes() const;
  std::string describe() const;  // the target in words
};

// The target of positions that have none (cross_entropy's ignore_index).
constexpr std::int64_t kIgnore = -100;

struct Batch {
  std::int64_t size = 0;
  std::vector<std::int64_t> tokens;   // (size, T) row-major
  std::vector<std::int64_t> targets;  // (size, T); kIgnore at position 0
  ag::Tensor token_tensor;            // (size, T), the token indices as values
};

// `size` sequences of random tokens drawn from `gen`, with their targets.
Batch make_batch(ag::Generator& gen, const Task& task, std::int64_t size);

// The share of targets (other than kIgnore) whose largest logit is the target class.
// logits: (..., classes), one row per entry of `targets`.
double batch_accuracy(const ag::Tensor& logits, const std::vector<std::int64_t>& targets);

}  // namespace heads
