#pragma once
// What train_heads measured, as plain data that every report reads (terminal, SVG, JSON): one
// record per trained model, and the settings the models share. Nothing here trains anything.
#include <cstdint>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

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
  AttentionSample sample;
};

// The settings all runs share.
struct JobInfo {
  std::string task;  // the task in words, e.g. "y_t = x_(t-1) - x_0, from -23 to 23"
  bool mlp = true;   // false: attention-only block
  std::int64_t vocab = 0, seq_len = 0, d_model = 0, steps = 0, classes = 0;
  std::uint64_t seed = 0;
  int threads = 1;
};

// Writes `text` to `path`, replacing the file; throws std::runtime_error naming the path when it
// cannot be written completely.
inline void write_text_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (out) out << text;
  if (out) out.close();
  if (!out) throw std::runtime_error("cannot write " + path);
}

}  // namespace heads
