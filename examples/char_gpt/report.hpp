#pragma once
// char_gpt's pictures and page: the loss curves as SVG (the training loss, smoothed, and the
// evaluations of both splits) and one self-contained HTML page (examples/html_page.hpp) with the
// settings, the curves, the evaluations, the timing and the sampled text.
#include <cstdint>
#include <string>

#include "trainer.hpp"

namespace char_gpt {

struct RunSummary {
  TrainConfig config;
  std::string corpus;              // where the text came from
  std::int64_t corpus_chars = 0;
  std::int64_t parameters = 0;
  History history;
  double full_val_loss = 0;        // NaN when not measured
  double seconds = 0;              // training time of this process (not of earlier, resumed parts)
  double tokens_per_second = 0;
  int threads = 1;
  std::string sample;              // UTF-8
};

// The loss curves as one SVG document.
std::string loss_curves_svg(const History& history);

// The page as HTML text; write it with html::write_file.
std::string report_html(const RunSummary& run);

// A summary as JSON: the settings, the losses and the timing (the sample too).
nlohmann::json summary_json(const RunSummary& run);

}  // namespace char_gpt
