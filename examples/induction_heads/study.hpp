#pragma once
// Training a 2-layer attention-only nn::TransformerLM (task.hpp: on Markov chains), and the measurements of
// its induction circuit on held-out sequences: the losses by kind of token, the in-context
// learning score, every head's scores, the previous-token and induction heads, their
// K-composition against random matrices, and the path ablation through layer 1's keys, queries
// and values.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nn/nn.hpp>

#include "task.hpp"

namespace induction {

struct StudyConfig {
  TaskConfig task;
  std::int64_t d_model = 64;
  std::int64_t n_heads = 4;
  std::int64_t batch = 32;
  std::int64_t steps = 1500;
  double lr = 3e-3;
  double weight_decay = 0.01;  // AdamW's default
  std::int64_t eval_interval = 50;  // steps between held-out evaluations (the curve)
  std::int64_t test_sequences = 512;
  std::uint64_t seed = 1;
  int baseline_samples = 100;  // random matrices for the K-composition baseline
  ag::Dtype dtype = ag::Dtype::Float32;  // of the parameters

  void check() const;  // throws std::invalid_argument naming the flag at fault
};

// Losses on held-out sequences (mean cross entropy per predicted token, nats).
struct Losses {
  double all = 0;
  double first_occurrence = 0;  // tokens of the segment's first copy
  double repeated = 0;          // the second copy but its first token: what an induction head predicts
  // Mean loss at the last T/4 positions minus at the first T/4 (Olsson et al.), on held-out
  // sequences of the training kind (in the path ablations: on the repeat sequences).
  double in_context_score = 0;
};

struct CurvePoint {
  std::int64_t step = 0;
  double train_loss = 0;  // mean training-batch loss since the previous point (step 0: the first batch's)
  Losses test;
  // The best previous-token score of a layer-0 head and the best induction score of a layer-1
  // head at this point (HeadScores' shares), to see both heads form at the phase change.
  double previous_token_score = 0, induction_score = 0;
};

struct HeadScores {
  std::int64_t layer = 0, head = 0;
  // The share of the head's attention on the detector's target keys, averaged over the query
  // positions that have one (every position but the first for previous-token; a token seen before
  // for duplicate-token and induction), over the held-out sequences.
  double previous_token = 0, induction = 0, duplicate_token = 0;
  // TransformerLens's head_detector scores ("mul"), over every query position (nn::circuits::head_scores):
  // an induction head scores at most the share of positions that have an earlier occurrence.
  double tl_previous_token = 0, tl_induction = 0, tl_duplicate_token = 0;
  // Where the head looks, from every query position i >= 1: the attention-weighted mean of i - j
  // (1 for a previous-token head) and of j / i (about 0.5 for a head that reads half-way back).
  // and the mean of each query's largest weight (1/(i+1) for uniform attention, 1 for one key), which
  // tells a sharp head that reads half-way back from a uniform one.
  double mean_offset = 0, mean_relative_position = 0, mean_max_weight = 0;
};

struct PathAblation {
  std::string input;  // "keys", "queries", "values"
  double induction_score = 0;  // the induction head's
  Losses loss;
};

// One held-out sequence with both heads' patterns over it, for the report.
struct Example {
  std::vector<std::int64_t> tokens;
  std::int64_t start = 0, period = 0;
  std::vector<double> previous_token_pattern, induction_pattern;  // (T, T) row-major
};

struct StudyResult {
  StudyConfig config;
  std::int64_t parameters = 0;
  int threads = 1;
  double train_seconds = 0, measure_seconds = 0;
  std::vector<double> train_losses;  // every step's batch loss
  std::vector<CurvePoint> curve;
  Losses final_loss;
  std::vector<HeadScores> heads;  // layer-major
  std::int64_t previous_token_head = 0;  // in layer 0
  // The layer-0 heads the path ablation removes: the previous-token head and any other scoring >= 0.5.
  std::vector<std::int64_t> ablated_heads;
  std::int64_t induction_head = 0;       // in layer 1
  std::vector<double> k_composition_matrix;  // (H, H): layer-0 head i's OV into layer-1 head j's keys
  double k_composition = 0;
  double k_composition_baseline = 0, k_composition_baseline_std = 0;
  std::vector<PathAblation> path_ablation;  // keys, queries, values
  std::optional<std::int64_t> phase_change_step;  // from when the in-context score stays at or below half its final value
  // The previous-token head's mean weight on the previous position, per query position 1 .. T-1.
  std::vector<double> previous_token_by_position;
  Example example;

  const HeadScores& head(std::int64_t layer, std::int64_t h) const {
    return heads[static_cast<std::size_t>(layer * config.n_heads + h)];
  }
  double induction_score() const { return head(1, induction_head).induction; }
  double previous_token_score() const { return head(0, previous_token_head).previous_token; }
};

// The experiment's goals, each with what was measured.
struct Goal {
  std::string name;
  bool met = false;
  std::string measured;
};
std::vector<Goal> goals(const StudyResult& r);

// progress(step, train_loss, point): called at every evaluation (point) during training.
using Progress = std::function<void(const CurvePoint& point)>;

// Optional outputs of a run.
struct StudyOutputs {
  Progress progress;
  // The initial model (TransformerLens names and shapes) and every step's training batch
  // ("data.train_tokens", (steps, batch, T) Int64), as safetensors, written before training, so
  // that another implementation can train the same model on the same sequences.
  std::string initial_weights;
  // The trained model under TransformerLens's names (safetensors), written after training:
  // nn::load_transformer_lens_state_dict loads it into a model of model_config(config), and
  // HookedTransformer(HookedTransformerConfig(**summary["transformer_lens_config"])) in Python.
  std::string trained_weights;
};

// The model the study trains: 2 attention-only layers of the configuration's sizes.
nn::TransformerLMConfig model_config(const StudyConfig& config);

// The most training tokens StudyOutputs::initial_weights holds (steps x batch x T): 2^27, 1 GiB.
constexpr std::int64_t kMaxSavedTokens = std::int64_t{1} << 27;

StudyResult run_study(const StudyConfig& config, const StudyOutputs& outputs = {});

}  // namespace induction
