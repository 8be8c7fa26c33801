#pragma once
// The variable-period repeat task: sequences of T random tokens in which a segment
// of random length (the period, from period_min to period_max) is repeated at once, at a random
// place, the rest fresh random tokens. The period varies, so no position predicts the repeat:
// only reading the sequence back does (a previous-token head and an induction head).
#include <cstdint>
#include <string>
#include <vector>

#include <autograd/autograd.hpp>

namespace induction {

namespace ag = autograd;

struct TaskConfig {
  std::int64_t vocab = 48;
  std::int64_t seq_len = 32;
  std::int64_t period_min = 6;
  std::int64_t period_max = 16;

  // Throws std::invalid_argument naming the flag at fault (a period that does not fit twice in
  // the sequence, a range upside down, ...).
  void check() const;
  std::string describe() const;
};

struct Batch {
  ag::Tensor tokens;                  // (B, T) Int64
  std::vector<std::int64_t> start;    // per sequence: where the segment first occurs
  std::vector<std::int64_t> period;   // per sequence: its length (the second copy starts at start + period)
  std::int64_t size() const { return static_cast<std::int64_t>(start.size()); }
  std::int64_t seq_len() const { return tokens.size(1); }
};

// B sequences drawn from gen: tokens uniform in [0, vocab), the period uniform in
// [period_min, period_max], the first copy's start uniform in [0, T - 2·period].
Batch make_batch(const TaskConfig& task, std::int64_t B, ag::Generator& gen);

// Where each predicted token (the targets tokens[:, 1:], (B, T - 1) row-major) falls:
enum class TargetKind : std::uint8_t {
  Other,       // a fresh random token, before or after the two copies
  First,       // in the first copy of the segment
  RepeatHead,  // the second copy's first token (unpredictable: its predecessor ends the first copy)
  Repeat,      // the rest of the second copy: an induction head predicts these
};
std::vector<TargetKind> target_kinds(const Batch& batch);

}  // namespace induction
