#pragma once
// train_heads' pictures as SVG text (a file of their own, or inline in an HTML page), drawn with
// the toolkit in svg_charts.hpp.
#include <cstdint>
#include <string>
#include <vector>

#include "report.hpp"
#include "svg_charts.hpp"

namespace heads {

// Head `head`'s (T x T) map out of `values` (heads, T, T) row-major: rows are query positions,
// columns key positions, labelled 0 .. T-1 (with the token under each position when `tokens` is
// given); key positions after the query are drawn as masked (causal attention).
svg::Heatmap head_heatmap(const std::vector<double>& values, std::int64_t head, std::int64_t T, std::string title,
                          const svg::ColourScale& scale, const std::vector<std::int64_t>& tokens = {});

// The weight scale of every attention map: 0 to 1.
svg::ColourScale weight_scale();

// Each head's attention map on the run's test sequence, side by side, with a colour scale.
std::string attention_svg(const RunRecord& run);

// The training loss of every run (moving average of 25 steps) against the step, with the loss of
// guessing (`chance_loss`, ln of the class count) as a dashed line.
svg::LineChart loss_chart(const std::vector<RunRecord>& runs, double chance_loss);
std::string loss_svg(const std::vector<RunRecord>& runs, double chance_loss);

// The colour of run i's curves.
const char* run_colour(std::size_t i);

}  // namespace heads
