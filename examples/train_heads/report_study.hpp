#pragma once
// What train_heads measures on held-out sequences beyond accuracy: snapshots along training, the
// gradient of the test loss with respect to each head's attention pattern, head ablation, and
// activation and attribution patching. Every function leaves the model as it found it (no hook
// left behind, training mode restored).
#include <cstdint>
#include <vector>

#include "heads_model.hpp"
#include "heads_task.hpp"
#include "report.hpp"

namespace heads {

// Accuracy and loss on `test`, and each head's attention pattern averaged over its sequences.
Snapshot take_snapshot(HeadsModel& model, const Batch& test, std::int64_t step);

// The gradient of each test sequence's loss with respect to its attention pattern, (heads, T, T),
// averaged over the test sequences.
std::vector<double> attention_gradient(HeadsModel& model, const Batch& test);

// Test accuracy with each head's z set to 0 (zero ablation) and to its mean over `test` (mean
// ablation), through hooks on the attention layer's z point.
std::vector<HeadAblation> ablate_heads(HeadsModel& model, const Batch& test);

// Activation patching per head and per head and position from the first `sequences` test
// sequences (clean) into the same with x_0 replaced (corrupted), with attribution patching's
// estimate; the metric is the mean log-probability of the clean targets.
PatchingRecord patch_heads(HeadsModel& model, const Task& task, const Batch& test, std::int64_t sequences);

}  // namespace heads
