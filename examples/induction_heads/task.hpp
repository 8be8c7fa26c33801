#pragma once
// The two kinds of sequences of the experiment.
//
// Training: in-context Markov chains (Edelman et al. 2024, "The evolution of statistical induction
// heads"): each sequence has a transition matrix of its own, every row drawn from Dirichlet(1) over
// the vocabulary, and its T tokens are a walk of that chain. The best prediction of the next token
// is the bigram statistics of the sequence so far: the tokens that followed earlier occurrences of
// the current one, which a previous-token head in layer 0 and an induction head in layer 1 read.
//
// Measurement: the variable-period repeat task: T random tokens in which a segment of random length
// (the period, from period_min to period_max) is repeated at once, at a random place, the rest
// fresh random tokens. The second copy is predicted by an induction head, and the losses on its
// tokens and on the first copy's tell the circuit's effect.
//
// (Trained on the repeat task itself, a 2-layer attention-only model of this size, in headgrad as in
// TransformerLens, finds another way to lower its loss: duplicate-token heads in layer 0, no
// previous-token head, no induction head. --train-on repeat shows it.)
#include <cstdint>
#include <string>
#include <vector>

#include <autograd/autograd.hpp>

namespace induction {

namespace ag = autograd;

enum class Training { Markov, Repeat };

// The largest vocabulary of Markov training sequences (each draws a vocab x vocab matrix).
constexpr std::int64_t kMaxMarkovVocab = 1024;

struct TaskConfig {
  std::int64_t vocab = 8;
  std::int64_t seq_len = 64;
  std::int64_t period_min = 6;
  std::int64_t period_max = 16;
  Training training = Training::Markov;

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
// B training sequences (B, T) Int64: Markov chains, or repeat-task sequences (make_batch's tokens).
ag::Tensor make_training_batch(const TaskConfig& task, std::int64_t B, ag::Generator& gen);

// Where each predicted token (the targets tokens[:, 1:], (B, T - 1) row-major) falls:
enum class TargetKind : std::uint8_t {
  Other,       // a fresh random token, before or after the two copies
  First,       // in the first copy of the segment
  RepeatHead,  // the second copy's first token (unpredictable: its predecessor ends the first copy)
  Repeat,      // the rest of the second copy: an induction head predicts these
};
std::vector<TargetKind> target_kinds(const Batch& batch);

}  // namespace induction
