#pragma once
// train_heads --report FILE.html: one self-contained page (html_page.hpp) with the runs' figures,
// the loss and held-out accuracy curves, each head's attention map with position labels, the maps
// along training behind a slider, dL/dA per head, head ablation and activation/attribution
// patching. Sections whose measurements are missing from the records are left out.
#include <string>
#include <vector>

#include "report.hpp"

namespace heads {

std::string report_html(const std::vector<RunRecord>& runs, const JobInfo& job);
// Writes report_html(...) to `path` (through a temporary file); throws naming the path.
void write_report(const std::string& path, const std::vector<RunRecord>& runs, const JobInfo& job);

}  // namespace heads
