#include "report.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "html_page.hpp"
#include "svg_charts.hpp"

namespace char_gpt {

namespace {

constexpr std::size_t kSmoothing = 25;  // steps in the training loss's moving average

svg::LineChart loss_chart(const History& h) {
  svg::LineChart c;
  c.title = fmt::format("Loss (cross entropy per character; training: moving average of {} steps)", kSmoothing);
  c.x_label = "step";
  c.y_label = "loss";
  c.attributes = "id=\"loss-chart\"";
  svg::Series train{.name = "training batches", .colour = "#9ecae1", .x = {}, .y = {}};
  double window = 0;
  const auto& l = h.train_losses;
  for (std::size_t k = 0; k < l.size(); ++k) {
    window += l[k] - (k >= kSmoothing ? l[k - kSmoothing] : 0.0);
    train.x.push_back(static_cast<double>(k + 1));
    train.y.push_back(window / static_cast<double>(std::min(k + 1, kSmoothing)));
  }
  svg::Series eval_train{.name = "train split (evaluation)", .colour = "#1f77b4", .x = {}, .y = {}, .markers = true};
  svg::Series eval_val{.name = "validation split (evaluation)", .colour = "#d62728", .x = {}, .y = {}, .markers = true};
  for (const auto& e : h.evals) {
    eval_train.x.push_back(static_cast<double>(e.step));
    eval_train.y.push_back(e.train);
    eval_val.x.push_back(static_cast<double>(e.step));
    eval_val.y.push_back(e.val);
  }
  // The first evaluation (uniform guessing, about ln V) would squash the rest: cap the axis.
  double top = 0;
  for (const auto* s : {&train, &eval_train, &eval_val})
    for (std::size_t k = s->y.size() / 20; k < s->y.size(); ++k) top = std::max(top, s->y[k]);
  c.y_max = top > 0 ? top * 1.25 : 0;
  c.series = {train, eval_train, eval_val};
  return c;
}

std::string number(double x) { return std::isfinite(x) ? fmt::format("{:.4f}", x) : "not measured"; }

void settings_table(html::Page& page, const RunSummary& r) {
  const auto& c = r.config;
  html::Table t;
  t.caption = "Settings (nanoGPT's names)";
  t.header = {"setting", "value"};
  t.attributes = "id=\"settings\"";
  const std::pair<std::string, std::string> rows[] = {
      {"corpus", fmt::format("{} ({} characters, vocabulary {})", r.corpus, r.corpus_chars, c.model.vocab_size)},
      {"n_layer, n_head, n_embd", fmt::format("{}, {}, {}", c.model.n_layer, c.model.n_head, c.model.n_embd)},
      {"block_size, batch_size", fmt::format("{}, {}", c.model.block_size, c.batch_size)},
      {"parameters", std::to_string(r.parameters)},
      {"dropout, bias, tied head", fmt::format("{}, {}, {}", c.model.dropout, c.model.bias, c.model.tie_weights)},
      {"optimizer", fmt::format("AdamW (betas {}, {}; weight decay {} on 2-D parameters), grad_clip {}", c.beta1,
                                c.beta2, c.weight_decay, c.grad_clip)},
      {"learning rate", fmt::format("{} peak, {} warmup steps, cosine to {} at step {}", c.lr, c.warmup_iters,
                                    c.min_lr, c.decay_iters())},
      {"steps, seed, threads", fmt::format("{}, {}, {}", c.max_iters, c.seed, r.threads)}};
  for (const auto& [k, v] : rows) t.rows.push_back({k, v});
  page.table(t);
}

}  // namespace

std::string loss_curves_svg(const History& history) { return svg::line_chart_svg(loss_chart(history)); }

std::string report_html(const RunSummary& r) {
  html::Page page("char_gpt: a character-level GPT");
  page.heading(2, "The run");
  page.paragraph(fmt::format(
      "A GPT over characters (token and position embeddings, {} pre-LayerNorm transformer blocks with causal "
      "self-attention, a final LayerNorm and a head tied to the token embedding), trained with headgrad from C++. "
      "Full validation loss after {} steps: {}. Training took {:.1f} s in this process ({:.0f} tokens/s).",
      r.config.model.n_layer, r.history.train_losses.size(), number(r.full_val_loss), r.seconds,
      r.tokens_per_second));
  settings_table(page, r);
  page.heading(2, "Loss curves");
  page.raw(loss_curves_svg(r.history));
  html::Table evals;
  evals.caption = "Evaluations (the same fixed batches each time)";
  evals.header = {"step", "train split", "validation split"};
  evals.attributes = "id=\"evals\"";
  for (const auto& e : r.history.evals)
    evals.rows.push_back({std::to_string(e.step), number(e.train), number(e.val)});
  page.table(evals);
  page.heading(2, "Sample");
  page.preformatted(r.sample);
  page.data("summary", summary_json(r));
  return page.html();
}

nlohmann::json summary_json(const RunSummary& r) {
  nlohmann::json evals = nlohmann::json::array();
  for (const auto& e : r.history.evals) evals.push_back({{"step", e.step}, {"train", e.train}, {"val", e.val}});
  return {{"implementation", "headgrad"},
          {"config", r.config.to_json()},
          {"corpus", r.corpus},
          {"corpus_chars", r.corpus_chars},
          {"parameters", r.parameters},
          {"steps", r.history.train_losses.size()},
          {"train_losses", r.history.train_losses},
          {"evals", evals},
          {"full_val_loss", std::isfinite(r.full_val_loss) ? nlohmann::json(r.full_val_loss) : nlohmann::json()},
          {"seconds", r.seconds},
          {"tokens_per_second", r.tokens_per_second},
          {"threads", r.threads},
          {"sample", r.sample}};
}

}  // namespace char_gpt
