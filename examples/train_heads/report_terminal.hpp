#pragma once
// train_heads' terminal output: the job's header, a live progress line while a model trains, and
// per model its test figures, where each head attends, the test accuracy with each head ablated
// and a shaded attention map.
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "report.hpp"

namespace heads {

// One progress line on stderr: rewritten in place every 100 ms on a terminal, else one line per
// tenth of the run.
class Progress {
 public:
  Progress(bool enabled, std::int64_t total, std::string label);
  void update(std::int64_t step, double loss, double accuracy, bool force = false);
  void finish();  // ends the line on a terminal

 private:
  bool enabled_, tty_;
  std::int64_t total_;
  std::string label_;
  std::chrono::steady_clock::time_point start_, last_{};
};

void print_job(const JobInfo& job);  // what is trained, on what
void print_run(const RunRecord& run, const JobInfo& job);
void print_comparison(const std::vector<RunRecord>& runs);  // the most heads against 1 head

}  // namespace heads
