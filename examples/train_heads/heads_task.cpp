#include "heads_task.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace heads {

std::int64_t Task::classes() const {
  switch (kind) {
    case TaskKind::Modular: return vocab;
    case TaskKind::Pair: return vocab * vocab;
    case TaskKind::Difference: break;
  }
  return 2 * vocab - 1;  // -(V-1) .. V-1
}

std::string Task::describe() const {
  switch (kind) {
    case TaskKind::Modular: return fmt::format("y_t = (x_(t-1) - x_0) mod {}", vocab);
    case TaskKind::Pair: return fmt::format("y_t = (x_0, x_(t-1)), one of {} classes", vocab * vocab);
    case TaskKind::Difference: break;
  }
  return fmt::format("y_t = x_(t-1) - x_0, from -{0} to {0}", vocab - 1);
}

namespace {

std::int64_t target(const Task& task, std::int64_t first, std::int64_t previous) {
  const std::int64_t V = task.vocab;
  switch (task.kind) {
    case TaskKind::Modular: return ((previous - first) % V + V) % V;
    case TaskKind::Pair: return first * V + previous;
    case TaskKind::Difference: break;
  }
  return previous - first + (V - 1);  // the signed difference, shifted to a class index
}

}  // namespace

Batch make_batch(ag::Generator& gen, const Task& task, std::int64_t size) {
  Batch b;
  b.size = size;
  const std::int64_t T = task.seq_len;
  b.tokens.resize(static_cast<std::size_t>(size * T));
  b.targets.resize(b.tokens.size());
  for (std::int64_t s = 0; s < size; ++s) {
    std::int64_t* x = b.tokens.data() + s * T;
    std::int64_t* y = b.targets.data() + s * T;
    for (std::int64_t t = 0; t < T; ++t)
      x[t] = static_cast<std::int64_t>(gen.next_u64() % static_cast<std::uint64_t>(task.vocab));
    y[0] = kIgnore;
    for (std::int64_t t = 1; t < T; ++t) y[t] = target(task, x[0], x[t - 1]);
  }
  const std::vector<double> values(b.tokens.begin(), b.tokens.end());
  b.token_tensor = ag::tensor(values, {size, T});
  return b;
}

double batch_accuracy(const ag::Tensor& logits, const std::vector<std::int64_t>& targets) {
  const std::int64_t V = logits.size(-1);
  const auto v = logits.to_vector();
  std::int64_t right = 0, counted = 0;
  for (std::size_t i = 0; i < targets.size(); ++i) {
    if (targets[i] == kIgnore) continue;
    const double* row = v.data() + static_cast<std::int64_t>(i) * V;
    const auto best = std::max_element(row, row + V) - row;
    right += best == targets[i];
    ++counted;
  }
  return counted ? static_cast<double>(right) / static_cast<double>(counted) : 0.0;
}

}  // namespace heads
