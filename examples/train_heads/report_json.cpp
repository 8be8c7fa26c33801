#include "report_json.hpp"

#include <charconv>
#include <string>

#include <fmt/format.h>

namespace heads {

namespace {

// `value` with `digits` decimals, the number that fmt's {:.Nf} prints.
double rounded(double value, int digits) {
  const std::string text = fmt::format("{:.{}f}", value, digits);
  double out = value;  // inf and nan stay as they are (the JSON writer makes them null)
  std::from_chars(text.data(), text.data() + text.size(), out);
  return out;
}

}  // namespace

nlohmann::ordered_json run_json(const RunRecord& r, const JobInfo& job) {
  nlohmann::ordered_json heads = nlohmann::ordered_json::array();
  for (std::size_t h = 0; h < r.focus.size(); ++h) {
    const HeadFocus& f = r.focus[h];
    heads.push_back({{"head", h + 1},
                     {"focus", f.label},
                     {"mean_weight", rounded(f.mean_weight, 4)},
                     {"weight_on_previous", rounded(f.previous, 4)},
                     {"weight_on_first", rounded(f.first, 4)},
                     {"weight_on_current", rounded(f.current, 4)}});
    if (h < r.ablation.size()) {
      heads.back()["ablated_accuracy"] = rounded(r.ablation[h].zero, 4);
      heads.back()["mean_ablated_accuracy"] = rounded(r.ablation[h].mean, 4);
    }
  }
  nlohmann::ordered_json j;
  j["num_heads"] = r.heads;
  j["accuracy"] = rounded(r.accuracy, 4);
  j["final_loss"] = rounded(r.final_loss, 4);
  j["test_loss"] = rounded(r.test_loss, 4);
  j["heads"] = std::move(heads);
  j["parameters"] = r.parameters;
  j["d_model"] = job.d_model;
  j["head_dim"] = job.d_model / r.heads;
  j["steps"] = job.steps;
  j["seconds"] = rounded(r.seconds, 2);
  j["steps_per_second"] = rounded(static_cast<double>(job.steps) / r.seconds, 1);
  return j;
}

nlohmann::ordered_json summary_json(const std::vector<RunRecord>& runs, const JobInfo& job) {
  const RunRecord& main = runs.back();
  nlohmann::ordered_json j = run_json(main, job);
  j["task"] = job.task;
  j["mlp"] = job.mlp;
  j["vocab"] = job.vocab;
  j["seq_len"] = job.seq_len;
  j["seed"] = job.seed;
  j["threads"] = job.threads;
  if (runs.size() > 1) j["accuracy_gain_points"] = rounded(100 * (main.accuracy - runs.front().accuracy), 2);
  nlohmann::ordered_json all = nlohmann::ordered_json::array();
  for (const RunRecord& r : runs) all.push_back(run_json(r, job));
  j["runs"] = std::move(all);
  return j;
}

}  // namespace heads
