#include "report_html.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "html_page.hpp"
#include "report_json.hpp"
#include "report_svg.hpp"

namespace heads {

namespace {

std::string plural_heads(std::int64_t h) { return fmt::format("{} head{}", h, h == 1 ? "" : "s"); }
std::string percent(double x) { return fmt::format("{:.1f}%", 100 * x); }

void overview(html::Page& page, const std::vector<RunRecord>& runs, const JobInfo& job) {
  page.heading(2, "The runs");
  page.paragraph(fmt::format(
      "Task: {} (sequences of {} random tokens from {}; every position t >= 1 needs the previous token and the first "
      "token at once). Model: embeddings, one block ({}), LayerNorm, readout; d_model {}, {} steps, seed {}. The runs "
      "share the initial weights and the training batches; only the split into heads differs. Every figure below is "
      "measured on held-out test sequences that were never trained on.",
      job.task, job.seq_len, job.vocab, job.mlp ? "causal attention + MLP" : "causal attention only", job.d_model,
      job.steps, job.seed));
  html::Table t;
  t.caption = "Test figures";
  t.header = {"run", "parameters", "test accuracy", "test loss", "training loss (last 50 steps)", "training time"};
  t.attributes = "id=\"runs\"";
  for (const auto& r : runs)
    t.rows.push_back({plural_heads(r.heads), std::to_string(r.parameters), percent(r.accuracy),
                      fmt::format("{:.4f}", r.test_loss), fmt::format("{:.4f}", r.final_loss),
                      fmt::format("{:.1f} s", r.seconds)});
  page.table(t);
}

svg::LineChart accuracy_chart(const std::vector<RunRecord>& runs) {
  svg::LineChart c;
  c.title = "Held-out accuracy along training";
  c.x_label = "step";
  c.y_label = "test accuracy (%)";
  c.y_max = 100;
  c.attributes = "id=\"accuracy-chart\"";
  for (std::size_t i = 0; i < runs.size(); ++i) {
    svg::Series s;
    s.name = plural_heads(runs[i].heads);
    s.colour = run_colour(i);
    s.markers = true;
    for (const auto& snap : runs[i].study.snapshots) {
      s.x.push_back(static_cast<double>(snap.step));
      s.y.push_back(100 * snap.accuracy);
    }
    c.series.push_back(std::move(s));
  }
  return c;
}

void curves(html::Page& page, const std::vector<RunRecord>& runs, const JobInfo& job) {
  page.heading(2, "Loss and accuracy, 1 head against 2");
  svg::LineChart loss = loss_chart(runs, std::log(static_cast<double>(job.classes)));
  loss.attributes = "id=\"loss-chart\"";
  page.figures({svg::line_chart_svg(loss), svg::line_chart_svg(accuracy_chart(runs))},
               {"Training loss per step (moving average of 25 steps).",
                "Accuracy on the held-out sequences, measured at each snapshot; hover a point for its value."});
}

void final_maps(html::Page& page, const std::vector<RunRecord>& runs) {
  page.heading(2, "Attention maps of the trained models");
  page.paragraph("Each head's attention weights on one test sequence: row = query position t, column = key position "
                 "(grey: the token there). Causal attention: keys after the query are masked. Hover a cell for its value.");
  for (const auto& r : runs) {
    std::vector<std::string> maps;
    for (std::int64_t h = 0; h < r.sample.heads; ++h) {
      const HeadFocus& f = r.focus[static_cast<std::size_t>(h)];
      maps.push_back(svg::heatmap_svg(head_heatmap(r.sample.weights, h, r.sample.length,
                                                   fmt::format("{}, head {}: {}", plural_heads(r.heads), h + 1, f.label),
                                                   weight_scale(), r.sample.tokens),
                                      0, 0, true));
    }
    page.figures(maps);
  }
}

void evolution(html::Page& page, const std::vector<RunRecord>& runs) {
  page.heading(2, "Attention along training");
  page.paragraph("Each head's attention pattern averaged over the held-out sequences, at snapshots along training. "
                 "Move the slider (or press play) to step through them.");
  for (const auto& r : runs) {
    if (r.study.snapshots.empty()) continue;
    html::Slider s;
    s.id = fmt::format("snapshots-{}", r.heads);
    s.label = plural_heads(r.heads) + ":";
    for (const auto& snap : r.study.snapshots) {
      s.labels.push_back(fmt::format("step {}: test accuracy {}", snap.step, percent(snap.accuracy)));
      std::vector<std::string> maps;
      for (std::int64_t h = 0; h < r.heads; ++h)
        maps.push_back(svg::heatmap_svg(head_heatmap(snap.mean_weights, h, r.sample.length,
                                                     fmt::format("head {} at step {}", h + 1, snap.step), weight_scale()),
                                        0, 0, true));
      s.frames.push_back(html::figures(maps));
    }
    page.slider(s);
  }
}

void gradients(html::Page& page, const std::vector<RunRecord>& runs) {
  page.heading(2, "dL/dA: the gradient of the test loss with respect to each head's attention pattern");
  page.paragraph("Next to each head's mean attention pattern A, the gradient of the test loss L with respect to A "
                 "(the mean over the held-out sequences of the gradient of each sequence's own loss). Red: raising "
                 "that weight raises the loss; blue: raising it lowers the loss. Masked (causal) cells cannot move.");
  for (const auto& r : runs) {
    if (r.study.attention_grad.empty() || r.study.snapshots.empty()) continue;
    const auto& pattern = r.study.snapshots.back().mean_weights;
    const svg::ColourScale scale = svg::ColourScale::diverging_for(r.study.attention_grad, "dL/dA");
    for (std::int64_t h = 0; h < r.heads; ++h) {
      const std::string name = fmt::format("{}, head {}", plural_heads(r.heads), h + 1);
      svg::Heatmap g = head_heatmap(r.study.attention_grad, h, r.sample.length, name + ": dL/dA", scale);
      g.attributes += " data-kind=\"attention-grad\"";
      page.figures({svg::heatmap_svg(head_heatmap(pattern, h, r.sample.length, name + ": A", weight_scale()), 0, 0, true),
                    svg::heatmap_svg(g, 0, 0, true)});
    }
  }
}

void ablation(html::Page& page, const std::vector<RunRecord>& runs) {
  if (std::none_of(runs.begin(), runs.end(), [](const RunRecord& r) { return !r.ablation.empty(); })) return;
  page.heading(2, "Ablation: test accuracy with one head removed");
  page.paragraph("Each head's context z (its output before W_O) replaced by 0 (zero ablation) or by its mean over the "
                 "test sequences (mean ablation); the rest of the model unchanged. A head the task needs costs "
                 "accuracy when removed.");
  html::Table t;
  t.caption = "Ablation per head";
  t.header = {"run", "head", "attends to", "test accuracy", "zero-ablated", "mean-ablated", "drop (zero)", "drop (mean)"};
  t.attributes = "id=\"ablation\"";
  t.row_attributes = "class=\"ablation-row\"";
  for (const auto& r : runs)
    for (std::size_t h = 0; h < r.ablation.size(); ++h) {
      const HeadAblation& a = r.ablation[h];
      t.rows.push_back({plural_heads(r.heads), std::to_string(h + 1), r.focus[h].label, percent(r.accuracy),
                        percent(a.zero), percent(a.mean), fmt::format("{:+.1f} points", 100 * (a.zero - r.accuracy)),
                        fmt::format("{:+.1f} points", 100 * (a.mean - r.accuracy))});
    }
  page.table(t);
}

// Heads x positions as a map, e.g. the metric change from patching one head at one position.
svg::Heatmap head_position_map(const std::vector<std::vector<double>>& values, std::string title,
                               const svg::ColourScale& scale) {
  svg::Heatmap m;
  m.title = std::move(title);
  m.rows = static_cast<std::int64_t>(values.size());
  m.cols = static_cast<std::int64_t>(values.front().size());
  m.row_axis = "head";
  m.col_axis = "position";
  m.scale = scale;
  m.cell = 30;
  for (std::size_t h = 0; h < values.size(); ++h) {
    m.row_labels.push_back(std::to_string(h + 1));
    m.values.insert(m.values.end(), values[h].begin(), values[h].end());
  }
  m.format = [](double v) { return fmt::format("{:+.3f}", v); };
  return m;
}

void patching_run(html::Page& page, const RunRecord& r) {
  const PatchingRecord& p = r.study.patching;
  page.heading(3, fmt::format("{}: clean metric {:.4f}, corrupted {:.4f}", plural_heads(r.heads), p.clean_metric,
                              p.corrupted_metric));
  html::Table t;
  t.caption = fmt::format("Patching each head from clean into corrupted ({})", plural_heads(r.heads));
  t.header = {"head", "attends to", "patched - corrupted", "share restored", "attribution estimate", "estimate error"};
  t.attributes = fmt::format("class=\"patching\" data-heads=\"{}\"", r.heads);
  t.row_attributes = "class=\"patching-row\"";
  const double gap = p.clean_metric - p.corrupted_metric;
  for (std::size_t h = 0; h < p.per_head.size(); ++h)
    t.rows.push_back({std::to_string(h + 1), r.focus[h].label, fmt::format("{:+.4f}", p.per_head[h]),
                      gap != 0 ? percent(p.per_head[h] / gap) : "-", fmt::format("{:+.4f}", p.estimate_per_head[h]),
                      fmt::format("{:.4f}", std::abs(p.estimate_per_head[h] - p.per_head[h]))});
  page.table(t);
  std::vector<double> all;
  for (const auto* rows : {&p.per_head_position, &p.estimate_per_head_position})
    for (const auto& row : *rows) all.insert(all.end(), row.begin(), row.end());
  const svg::ColourScale scale = svg::ColourScale::diverging_for(all, "metric change");
  page.figures({svg::heatmap_svg(head_position_map(p.per_head_position, "activation patching", scale), 0, 0, true),
                svg::heatmap_svg(head_position_map(p.estimate_per_head_position, "attribution estimate", scale), 0, 0,
                                 true)},
               {"Patching one head's z at one position: the metric change (patched - corrupted).",
                fmt::format("The first-order estimate from one backward; largest error against patching {:.4f}.",
                            p.max_abs_error)});
}

void patching(html::Page& page, const std::vector<RunRecord>& runs) {
  const auto has = [](const RunRecord& r) { return !r.study.patching.per_head.empty(); };
  if (std::none_of(runs.begin(), runs.end(), has)) return;
  page.heading(2, "Activation patching and attribution patching");
  page.paragraph(fmt::format(
      "Clean: the test sequences. Corrupted: the same sequences with {}. Metric: the mean log-probability of the "
      "clean targets. Patching copies one head's context z from the clean run into the corrupted run (all positions, "
      "or one position) and measures how much of the metric comes back. Attribution patching estimates the same "
      "change to first order, (z_clean - z_corrupted) · d metric/dz, from one backward at the corrupted run; where "
      "patching moves the metric a long way (tens of nats here) a first-order estimate can be far off, even of the "
      "wrong sign, and the error column says by how much.",
      runs.front().study.patching.corruption));
  for (const auto& r : runs)
    if (has(r)) patching_run(page, r);
}

}  // namespace

std::string report_html(const std::vector<RunRecord>& runs, const JobInfo& job) {
  html::Page page("train_heads: does attention need several heads?");
  overview(page, runs, job);
  curves(page, runs, job);
  final_maps(page, runs);
  evolution(page, runs);
  gradients(page, runs);
  ablation(page, runs);
  patching(page, runs);
  page.heading(2, "The summary as JSON");
  page.paragraph("The same figures as train_heads --summary writes, also embedded in this page as JSON "
                 "(script id=\"summary\").");
  const nlohmann::ordered_json summary = summary_json(runs, job);
  page.preformatted(summary.dump(2), "show the JSON");
  page.data("summary", summary);
  return page.html();
}

void write_report(const std::string& path, const std::vector<RunRecord>& runs, const JobInfo& job) {
  html::write_file(path, report_html(runs, job));
}

}  // namespace heads
