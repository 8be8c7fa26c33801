#pragma once
// What train_heads measured, as plain data that every report reads (terminal, SVG, JSON, HTML):
// one record per trained model, and the settings the models share. Nothing here trains anything.
#include <cstdint>
#include <string>
#include <vector>

#include "html_page.hpp"

namespace heads {

// Where one head attends, from its attention weights on held-out sequences.
struct HeadFocus {
  std::string label;       // "previous token", "first token", "current token" or "mixed"
  double mean_weight = 0;  // mean weight on the labelled position (the largest of the three)
  double previous = 0, first = 0, current = 0;
};

// The attention weights of every head on one test sequence.
struct AttentionSample {
  std::int64_t heads = 0, length = 0;
  std::vector<double> weights;       // (heads, length, length) row-major: head, query, key
  std::vector<std::int64_t> tokens;  // the sequence, `length` tokens
  double at(std::int64_t head, std::int64_t query, std::int64_t key) const {
    return weights[static_cast<std::size_t>((head * length + query) * length + key)];
  }
};

// What removing one head does: test accuracy with its context z set to 0, and set to its mean
// over the test sequences.
struct HeadAblation {
  double zero = 0, mean = 0;
};

// The held-out figures and each head's mean attention pattern over the test sequences at one
// step of training.
struct Snapshot {
  std::int64_t step = 0;
  double accuracy = 0, loss = 0;
  std::vector<double> mean_weights;  // (heads, T, T) row-major
};

// Activation patching from clean test sequences into corrupted ones (x_0 replaced), per head and
// per head and position, with the attribution-patching estimate of the same changes. The metric
// is the mean log-probability of the clean targets.
struct PatchingRecord {
  std::string corruption;
  double clean_metric = 0, corrupted_metric = 0;
  // The change of the metric (patched - corrupted) per head, and per head and position (heads x T).
  std::vector<double> per_head, estimate_per_head;
  std::vector<std::vector<double>> per_head_position, estimate_per_head_position;
  double max_abs_error = 0;  // of the estimate against the real change
};

// The report's extras, measured only when a report is asked for.
struct StudyRecord {
  std::vector<Snapshot> snapshots;      // along training, the last at the final step
  std::vector<double> attention_grad;   // (heads, T, T): d(test loss)/d(pattern), mean over test sequences
  PatchingRecord patching;
  double seconds = 0;                   // time the extras took
};

// One trained model.
struct RunRecord {
  std::int64_t heads = 0;
  std::int64_t parameters = 0;
  double accuracy = 0;   // on the held-out sequences
  double test_loss = 0;
  double final_loss = 0;  // mean training loss over the last 50 steps
  double seconds = 0;     // training time
  std::vector<double> losses;  // training loss per step
  std::vector<HeadFocus> focus;
  std::vector<HeadAblation> ablation;  // per head
  AttentionSample sample;
  StudyRecord study;  // empty without a report
};

// The settings all runs share.
struct JobInfo {
  std::string task;  // the task in words, e.g. "y_t = x_(t-1) - x_0, from -23 to 23"
  bool mlp = true;   // false: attention-only block
  std::int64_t vocab = 0, seq_len = 0, d_model = 0, steps = 0, classes = 0;
  std::uint64_t seed = 0;
  int threads = 1;
};

// Writes `text` to `path` through a temporary file renamed over it; throws std::runtime_error
// naming the path when it cannot be written completely.
inline void write_text_file(const std::string& path, const std::string& text) { html::write_file(path, text); }

}  // namespace heads
