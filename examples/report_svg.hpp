#pragma once
// train_heads' pictures as SVG text (a file of their own, or inline in an HTML page).
#include <string>
#include <vector>

#include "report.hpp"

namespace heads {

// Each head's attention map on the run's test sequence, side by side, darker = more weight.
std::string attention_svg(const RunRecord& run);

// The training loss of every run (moving average of 25 steps) against the step, with the loss of
// guessing (`chance_loss`, ln of the class count) as a dashed line.
std::string loss_svg(const std::vector<RunRecord>& runs, double chance_loss);

}  // namespace heads
