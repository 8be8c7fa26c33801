#pragma once
// train_heads' summary as JSON. The top level describes the run with the most heads (the last
// run) and the shared settings; "runs" lists every run. Keys keep the order below.
//   {"num_heads", "accuracy", "final_loss", "test_loss",
//    "heads": [{"head", "focus", "mean_weight", "weight_on_previous", "weight_on_first", "weight_on_current",
//               "ablated_accuracy" (test accuracy with the head's z set to 0), "mean_ablated_accuracy" (set to
//               its mean over the test sequences)}],
//    "parameters", "d_model", "head_dim", "steps", "seconds", "steps_per_second",
//    "task", "mlp", "vocab", "seq_len", "seed", "threads", "accuracy_gain_points" (with two runs or more),
//    "runs": [{"num_heads", ... "steps_per_second"}]}
// Figures are rounded as printed: 4 decimals, seconds 2, steps per second 1, the gain in points 2.
#include <vector>

#include <nlohmann/json.hpp>

#include "report.hpp"

namespace heads {

nlohmann::ordered_json run_json(const RunRecord& run, const JobInfo& job);
nlohmann::ordered_json summary_json(const std::vector<RunRecord>& runs, const JobInfo& job);

}  // namespace heads
