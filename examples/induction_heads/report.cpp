#include "report.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "html_page.hpp"
#include "svg_charts.hpp"

namespace induction {

namespace {

nlohmann::json number(double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(); }

nlohmann::json losses_json(const Losses& l) {
  return {{"loss", number(l.all)},
          {"first_occurrence_loss", number(l.first_occurrence)},
          {"repeated_loss", number(l.repeated)},
          {"in_context_score", number(l.in_context_score)}};
}

std::string fixed(double x, int digits = 3) {
  return std::isfinite(x) ? fmt::format("{:.{}f}", x, digits) : std::string("not measured");
}

std::string head_name(std::int64_t layer, std::int64_t head) { return fmt::format("L{}H{}", layer, head); }

double relative_change(double clean, double ablated) { return clean != 0 ? ablated / clean - 1 : 0.0; }

// A chart over the training steps.
svg::LineChart step_chart(std::string title, std::string y_label, std::string id) {
  svg::LineChart c;
  c.title = std::move(title);
  c.x_label = "step";
  c.y_label = std::move(y_label);
  c.attributes = "id=\"" + id + "\"";
  return c;
}

svg::LineChart loss_chart(const StudyResult& r) {
  svg::LineChart c = step_chart("Loss on held-out sequences (cross entropy per token)", "loss", "loss-chart");
  svg::Series all{.name = "all tokens", .colour = "#1f77b4", .x = {}, .y = {}, .markers = true};
  svg::Series first{.name = "first occurrences", .colour = "#ff7f0e", .x = {}, .y = {}, .markers = true};
  svg::Series repeated{.name = "repeated tokens", .colour = "#2ca02c", .x = {}, .y = {}, .markers = true};
  double top = 0;
  for (const auto& p : r.curve) {
    const auto x = static_cast<double>(p.step);
    all.x.push_back(x), all.y.push_back(p.test.all);
    first.x.push_back(x), first.y.push_back(p.test.first_occurrence);
    repeated.x.push_back(x), repeated.y.push_back(p.test.repeated);
    top = std::max({top, p.test.all, p.test.first_occurrence, p.test.repeated});
  }
  c.series = {all, first, repeated};
  if (r.phase_change_step) {
    const auto x = static_cast<double>(*r.phase_change_step);
    c.series.push_back({.name = fmt::format("phase change (step {})", *r.phase_change_step), .colour = "#d62728",
                        .x = {x, x}, .y = {0, top}});
  }
  c.references.push_back({std::log(static_cast<double>(r.config.task.vocab)),
                          fmt::format("ln {} (guessing)", r.config.task.vocab)});
  c.y_min = 0;
  c.y_max = top * 1.05;
  return c;
}

svg::LineChart in_context_chart(const StudyResult& r) {
  svg::LineChart c = step_chart("In-context score: loss at the last quarter of positions minus at the first quarter",
                                "nats", "in-context-chart");
  svg::Series s{.name = "in-context score", .colour = "#9467bd", .x = {}, .y = {}, .markers = true};
  double lo = 0, hi = 0;
  for (const auto& p : r.curve) {
    s.x.push_back(static_cast<double>(p.step));
    s.y.push_back(p.test.in_context_score);
    lo = std::min(lo, p.test.in_context_score);
    hi = std::max(hi, p.test.in_context_score);
  }
  c.series = {s};
  if (r.phase_change_step) {
    const auto x = static_cast<double>(*r.phase_change_step);
    c.series.push_back({.name = fmt::format("phase change (step {})", *r.phase_change_step), .colour = "#d62728",
                        .x = {x, x}, .y = {lo, hi}});
    c.references.push_back({r.curve.back().test.in_context_score / 2, "half the final score"});
  }
  c.y_min = lo * 1.05 - 0.05;
  c.y_max = hi + 0.05;
  return c;
}

// The best previous-token score in layer 0 and the best induction score in layer 1 at each
// evaluation, with the phase change: the two heads form together.
svg::LineChart head_scores_chart(const StudyResult& r) {
  svg::LineChart c = step_chart("Best head scores during training", "share of attention", "head-scores-chart");
  svg::Series previous{.name = "previous-token (best layer-0 head)", .colour = "#1f77b4", .x = {}, .y = {},
                       .markers = true};
  svg::Series induction{.name = "induction (best layer-1 head)", .colour = "#2ca02c", .x = {}, .y = {},
                        .markers = true};
  for (const auto& p : r.curve) {
    const auto x = static_cast<double>(p.step);
    previous.x.push_back(x), previous.y.push_back(p.previous_token_score);
    induction.x.push_back(x), induction.y.push_back(p.induction_score);
  }
  c.series = {previous, induction};
  if (r.phase_change_step) {
    const auto x = static_cast<double>(*r.phase_change_step);
    c.series.push_back({.name = fmt::format("phase change (step {})", *r.phase_change_step), .colour = "#d62728",
                        .x = {x, x}, .y = {0, 1}});
  }
  c.references.push_back({1 / static_cast<double>(r.config.task.vocab),
                          fmt::format("1/{} (uniform attention's induction score)", r.config.task.vocab)});
  c.y_min = 0;
  c.y_max = 1;
  return c;
}

svg::Heatmap pattern_map(const StudyResult& r, const std::string& title, const std::vector<double>& pattern,
                         const std::string& attributes) {
  const Example& e = r.example;
  const auto T = static_cast<std::int64_t>(e.tokens.size());
  svg::Heatmap m;
  m.title = title;
  m.rows = m.cols = T;
  m.values = pattern;
  for (std::int64_t i = 0; i < T; ++i) {
    std::string note = std::to_string(e.tokens[static_cast<std::size_t>(i)]);
    if (i >= e.start && i < e.start + e.period) note += " a";        // first copy
    if (i >= e.start + e.period && i < e.start + 2 * e.period) note += " b";  // second copy
    m.row_notes.push_back(note);
    m.col_notes.push_back(note);
  }
  m.notes_label = "token (a: first copy of the segment, b: its repeat)";
  m.scale = svg::ColourScale::sequential(0, 1, "attention weight");
  m.causal_mask = true;
  m.cell = 14;
  m.attributes = attributes;
  return m;
}

void settings_table(html::Page& page, const StudyResult& r) {
  const StudyConfig& c = r.config;
  html::Table t;
  t.caption = "Settings";
  t.header = {"setting", "value"};
  t.attributes = "id=\"settings\"";
  t.rows = {{"task", c.task.describe()},
            {"model", fmt::format("nn::TransformerLM: 2 attention-only layers, d_model {}, {} heads of {}, "
                                  "LayerNorm, learned positions; {} parameters",
                                  c.d_model, c.n_heads, c.d_model / c.n_heads, r.parameters)},
            {"training", fmt::format("AdamW lr {}, weight decay {}, batch {}, {} steps (fresh sequences each step)",
                                     c.lr, c.weight_decay, c.batch, c.steps)},
            {"held out", fmt::format("{} sequences", c.test_sequences)},
            {"seed, threads", fmt::format("{}, {}", c.seed, r.threads)},
            {"time", fmt::format("{:.1f} s training, {:.1f} s measuring", r.train_seconds, r.measure_seconds)}};
  page.table(t);
}

// The previous-token head's weight on the previous position over the held-out sequences, by
// quarter of the query positions.
std::string previous_by_position_text(const StudyResult& r) {
  const std::vector<double>& w = r.previous_token_by_position;  // query positions 1 .. T-1
  const auto n = static_cast<std::int64_t>(w.size());
  if (n < 4) return "";
  std::string parts;
  for (std::int64_t q = 0; q < 4; ++q) {
    const std::int64_t lo = q * n / 4, hi = (q + 1) * n / 4;
    double sum = 0;
    for (std::int64_t i = lo; i < hi; ++i) sum += w[static_cast<std::size_t>(i)];
    parts += fmt::format("{}{} at positions {}-{}", q == 0 ? "" : q == 3 ? " and " : ", ",
                         fixed(sum / static_cast<double>(hi - lo)), lo + 1, hi);
  }
  return fmt::format("Over the held-out sequences its mean weight on the previous position is {} "
                     "(the summary's previous_token_by_position has every position).",
                     parts);
}

// With few token kinds the current token occurs several times before, and an induction head (which
// matches one token) spreads its weight over the tokens after every earlier occurrence: on the
// Markov training task that is the best prediction (the sequence's bigram statistics). This says,
// for the example's repeat, how the weight on the right key (the first copy's) compares with an
// even split over all candidates.
std::string split_paragraph(const StudyResult& r) {
  const Example& e = r.example;
  const auto T = static_cast<std::int64_t>(e.tokens.size());
  double on_right = 0, on_candidates = 0, even_share = 0, occurrences = 0;
  std::int64_t queries = 0;
  for (std::int64_t i = e.start + e.period; i + 1 < e.start + 2 * e.period && i < T; ++i) {
    const std::int64_t right = i - e.period + 1;
    std::int64_t count = 0;
    double candidates = 0;
    for (std::int64_t j = 1; j <= i; ++j)
      if (e.tokens[static_cast<std::size_t>(j - 1)] == e.tokens[static_cast<std::size_t>(i)]) {
        ++count;
        candidates += e.induction_pattern[static_cast<std::size_t>(i * T + j)];
      }
    if (count == 0) continue;
    on_right += e.induction_pattern[static_cast<std::size_t>(i * T + right)];
    on_candidates += candidates;
    even_share += 1.0 / static_cast<double>(count);
    occurrences += static_cast<double>(count);
    ++queries;
  }
  if (queries == 0) return "";
  const double n = static_cast<double>(queries);
  return fmt::format(
      "How sharp to expect the induction pattern: with {} token kinds, the current token of this repeat occurred "
      "{:.1f} times before on average, and the induction head puts {} of its weight on the tokens after those "
      "earlier occurrences together, {} on the right one (the first copy's), where an even split over each "
      "query's earlier occurrences would give {} (the mean over the queries of 1 / their count). "
      "An induction head matches the current token only, so it cannot tell the first copy's occurrence from the "
      "others: on in-context Markov chains, the training task, that average over every earlier occurrence is the "
      "best prediction (the sequence's bigram statistics), and the repeated-token loss stays well above 0. "
      "TransformerLens's demonstrations use tens of thousands of token kinds, where each token occurs once and "
      "the pattern is a single sharp stripe.",
      r.config.task.vocab, occurrences / n, fixed(on_candidates / n), fixed(on_right / n), fixed(even_share / n));
}

}  // namespace

nlohmann::json summary_json(const StudyResult& r) {
  const StudyConfig& c = r.config;
  nlohmann::json heads = nlohmann::json::array();
  for (const auto& h : r.heads)
    heads.push_back({{"layer", h.layer},
                     {"head", h.head},
                     {"previous_token_score", h.previous_token},
                     {"induction_score", h.induction},
                     {"duplicate_token_score", h.duplicate_token},
                     {"head_detector", {{"previous_token_head", h.tl_previous_token},
                                        {"induction_head", h.tl_induction},
                                        {"duplicate_token_head", h.tl_duplicate_token}}},
                     {"mean_offset", h.mean_offset},
                     {"mean_relative_position", h.mean_relative_position},
                     {"mean_max_weight", h.mean_max_weight}});
  nlohmann::json ablation = nlohmann::json::object();
  for (const auto& a : r.path_ablation)
    ablation[a.input] = {{"induction_score", a.induction_score},
                         {"relative_change", relative_change(r.induction_score(), a.induction_score)},
                         {"loss", number(a.loss.all)},
                         {"repeated_loss", number(a.loss.repeated)}};
  nlohmann::json curve = nlohmann::json::array();
  for (const auto& p : r.curve) {
    nlohmann::json point = losses_json(p.test);
    point["step"] = p.step;
    point["train_loss"] = number(p.train_loss);
    point["previous_token_score"] = number(p.previous_token_score);
    point["induction_score"] = number(p.induction_score);
    curve.push_back(point);
  }
  nlohmann::json goal_list = nlohmann::json::array();
  bool formed = true;
  for (const auto& g : goals(r)) {
    goal_list.push_back({{"goal", g.name}, {"met", g.met}, {"measured", g.measured}});
    formed = formed && g.met;
  }
  const std::int64_t H = c.n_heads;
  nlohmann::json kmatrix = nlohmann::json::array();
  for (std::int64_t i = 0; i < H; ++i)
    kmatrix.push_back(std::vector<double>(r.k_composition_matrix.begin() + i * H,
                                          r.k_composition_matrix.begin() + (i + 1) * H));
  nlohmann::json ablated = nlohmann::json::array();
  for (std::int64_t h : r.ablated_heads) ablated.push_back({0, h});
  return {{"implementation", "headgrad"},
          {"config",
           {{"vocab", c.task.vocab}, {"seq_len", c.task.seq_len}, {"period_min", c.task.period_min},
            {"period_max", c.task.period_max},
            {"train_on", c.task.training == Training::Markov ? "markov" : "repeat"}, {"n_layers", 2},
            {"d_model", c.d_model}, {"n_heads", c.n_heads}, {"d_head", c.d_model / c.n_heads},
            {"attention_only", true}, {"normalization", "layer_norm"}, {"positions", "learned"},
            {"batch", c.batch}, {"steps", c.steps}, {"lr", c.lr}, {"weight_decay", c.weight_decay},
            {"eval_interval", c.eval_interval}, {"test_sequences", c.test_sequences}, {"seed", c.seed},
            {"dtype", c.dtype == ag::Dtype::Float64 ? "float64" : "float32"}}},
          {"transformer_lens_config", nlohmann::json::parse(nn::transformer_lens_config_json(model_config(c)))},
          {"parameters", r.parameters},
          {"threads", r.threads},
          {"train_seconds", r.train_seconds},
          {"measure_seconds", r.measure_seconds},
          {"loss", number(r.final_loss.all)},
          {"first_occurrence_loss", number(r.final_loss.first_occurrence)},
          {"repeated_loss", number(r.final_loss.repeated)},
          {"in_context_score", number(r.final_loss.in_context_score)},
          {"heads", heads},
          {"previous_token_head", {0, r.previous_token_head}},
          {"ablated_heads", ablated},
          {"induction_head", {1, r.induction_head}},
          {"k_composition", r.k_composition},
          {"k_composition_baseline", r.k_composition_baseline},
          {"k_composition_baseline_std", r.k_composition_baseline_std},
          {"k_composition_ratio", r.k_composition_baseline > 0 ? r.k_composition / r.k_composition_baseline : 0.0},
          {"k_composition_matrix", kmatrix},
          {"path_ablation", ablation},
          {"phase_change_step", r.phase_change_step ? nlohmann::json(*r.phase_change_step) : nlohmann::json()},
          {"previous_token_by_position", r.previous_token_by_position},
          {"curve", curve},
          {"train_losses", r.train_losses},
          {"goals", goal_list},
          {"circuit_formed", formed}};
}

std::string report_html(const StudyResult& r) {
  const StudyConfig& c = r.config;
  const std::int64_t p = r.previous_token_head, ih = r.induction_head, H = c.n_heads;
  html::Page page("induction_heads: the induction circuit of a 2-layer attention-only transformer");
  page.heading(2, "The run");
  const std::string measured = fmt::format(
      "sequences of {} random tokens in which a segment of random length ({} to {} tokens) is repeated at once, the "
      "rest fresh random tokens: the period varies, so no position predicts a repeated token, only reading the "
      "sequence back does",
      c.task.seq_len, c.task.period_min, c.task.period_max);
  const std::string trained =
      c.task.training == Training::Markov
          ? fmt::format("Trained on Markov chains over {} tokens, a chain of its own per sequence (Edelman et al. "
                        "2024): the next token is best predicted from what followed the current token earlier in "
                        "the sequence. Measured on {}.",
                        c.task.vocab, measured)
          : fmt::format("Trained and measured on {}.", measured);
  page.paragraph(fmt::format(
      "{} A 2-layer attention-only transformer can learn both by forming the induction circuit (Elhage et al. 2021; "
      "Olsson et al. 2022): a previous-token head in layer 0 writes each token's predecessor into its position, "
      "and an induction head in layer 1 keys on it to attend to the token after earlier occurrences of the "
      "current one and copy it. Everything below is measured on {} held-out sequences; the in-context score "
      "(loss at the last quarter of the positions minus at the first) on held-out sequences of the training kind.",
      trained, c.test_sequences));
  settings_table(page, r);
  html::Table goals_table;
  goals_table.caption = "The experiment's goals";
  goals_table.header = {"goal", "measured", "met"};
  goals_table.attributes = "id=\"goals\"";
  goals_table.row_attributes = "class=\"goal-row\"";
  for (const auto& g : goals(r)) goals_table.rows.push_back({g.name, g.measured, g.met ? "yes" : "NO"});
  page.table(goals_table);

  page.heading(2, "Loss curve and the phase change");
  page.paragraph(fmt::format(
      "Final held-out loss {} (first occurrences {}, repeated tokens {}; guessing is ln {} = {}: on the random "
      "tokens outside the repeat a model trained on Markov chains predicts a little worse than guessing, as it "
      "reads bigram statistics that random tokens do not have). The phase change is {}: the first evaluation "
      "from which the in-context score stays at or beyond half its final value, {}.",
      fixed(r.final_loss.all), fixed(r.final_loss.first_occurrence), fixed(r.final_loss.repeated), c.task.vocab,
      fixed(std::log(static_cast<double>(c.task.vocab))),
      r.phase_change_step ? fmt::format("at step {}", *r.phase_change_step) : std::string("not seen"),
      fixed(r.final_loss.in_context_score)));
  page.raw(svg::line_chart_svg(loss_chart(r)));
  page.raw(svg::line_chart_svg(in_context_chart(r)));
  page.paragraph(
      "The two heads form together around the phase change (Olsson et al.'s co-occurrence evidence): the best "
      "previous-token score of a layer-0 head and the best induction score of a layer-1 head at each evaluation.");
  page.raw(svg::line_chart_svg(head_scores_chart(r)));

  page.heading(2, "Attention patterns");
  const Example& e = r.example;
  page.paragraph(fmt::format(
      "One held-out sequence: its segment of {} tokens starts at position {} and repeats at position {}. The "
      "previous-token head {} attends from each position to the one before; the induction head {} attends, within "
      "the repeat, to the token after the earlier occurrence of the current token (the diagonal {} back). {}",
      e.period, e.start, e.start + e.period, head_name(0, p), head_name(1, ih), e.period - 1,
      previous_by_position_text(r)));
  page.raw(html::figures(
      {svg::heatmap_svg(pattern_map(r, fmt::format("{}: previous-token head", head_name(0, p)),
                                    e.previous_token_pattern, "data-head=\"previous-token\""),
                        0, 0, true),
       svg::heatmap_svg(pattern_map(r, fmt::format("{}: induction head", head_name(1, ih)), e.induction_pattern,
                                    "data-head=\"induction\""),
                        0, 0, true)}));

  page.paragraph(split_paragraph(r));

  page.heading(2, "Head scores");
  {
    // Uniform causal attention: query i spreads 1/(i+1) over its keys; the mean largest weight over
    // the query positions 1 .. T-1 is the mean of 1/(i+1).
    const std::int64_t T = c.task.seq_len;
    double uniform_max = 0;
    for (std::int64_t i = 1; i < T; ++i) uniform_max += 1 / static_cast<double>(i + 1);
    uniform_max /= static_cast<double>(T - 1);
    std::string repeat_note;
    if (c.task.training == Training::Repeat)
      repeat_note =
          " A sharp head with j / i near 0.5 reads half-way back, as the layer-0 heads of a model that learned the "
          "repeats without a previous-token head do: the bigram x_k, x_(k+1) read into position 2k + 2 by two "
          "heads, which a layer-1 head then keys on; it only serves repeats early in the sequence.";
    page.paragraph(fmt::format(
        "Each score is the share of a head's attention on the detector's target key, averaged over the query "
        "positions that have one: the previous position (previous-token), the token after an earlier occurrence "
        "of the current token (induction), an earlier occurrence itself (duplicate-token). With {} token kinds, "
        "uniform attention scores about 1/{} = {} on induction and duplicate-token: the level of the heads that do "
        "neither. TransformerLens's head_detector (\"mul\", nn::circuits::head_scores) averages over every query "
        "position instead, so its induction score is at most the share of positions that repeat an earlier token; "
        "it is given alongside. The last three columns say where a head looks from query i: the attention-weighted "
        "mean of i - j (1 for a previous-token head), of j / i, and how sharply (the mean largest weight; {} for "
        "uniform attention over {} positions).{}",
        c.task.vocab, c.task.vocab, fixed(1 / static_cast<double>(c.task.vocab)), fixed(uniform_max), T,
        repeat_note));
  }
  html::Table heads;
  heads.caption = "Every head";
  heads.header = {"head", "previous-token", "induction", "duplicate-token", "TL previous-token", "TL induction",
                  "TL duplicate-token", "mean i - j", "mean j / i", "mean largest weight"};
  heads.attributes = "id=\"head-scores\"";
  heads.row_attributes = "class=\"head-row\"";
  for (const auto& h : r.heads)
    heads.rows.push_back({head_name(h.layer, h.head) +
                              (h.layer == 0 && h.head == p   ? " (previous-token head)"
                               : h.layer == 1 && h.head == ih ? " (induction head)"
                                                              : ""),
                          fixed(h.previous_token), fixed(h.induction), fixed(h.duplicate_token),
                          fixed(h.tl_previous_token), fixed(h.tl_induction), fixed(h.tl_duplicate_token),
                          fixed(h.mean_offset, 2), fixed(h.mean_relative_position),
                          fixed(h.mean_max_weight)});
  page.table(heads);

  page.heading(2, "K-composition");
  page.paragraph(fmt::format(
      "How much of what a layer-0 head writes (its OV circuit) a layer-1 head's keys read (its QK circuit, "
      "transposed): ||W_OV W_K W_Q^T||_F / (||W_OV||_F ||W_K W_Q^T||_F) (nn::circuits::composition_scores). "
      "{} into {}: {}, against {} +- {} for random matrices of the same shapes ({} draws; {:.2f} x).",
      head_name(0, p), head_name(1, ih), fixed(r.k_composition), fixed(r.k_composition_baseline),
      fixed(r.k_composition_baseline_std), c.baseline_samples,
      r.k_composition_baseline > 0 ? r.k_composition / r.k_composition_baseline : 0.0));
  html::Table k;
  k.caption = "K-composition, layer-0 head (rows) into layer-1 head (columns)";
  k.header = {"layer 0 \\ layer 1"};
  for (std::int64_t j = 0; j < H; ++j) k.header.push_back(head_name(1, j));
  k.attributes = "id=\"k-composition\"";
  for (std::int64_t i = 0; i < H; ++i) {
    std::vector<std::string> row = {head_name(0, i)};
    for (std::int64_t j = 0; j < H; ++j) row.push_back(fixed(r.k_composition_matrix[static_cast<std::size_t>(i * H + j)]));
    k.rows.push_back(row);
  }
  page.table(k);

  page.heading(2, "Path ablation");
  page.paragraph(fmt::format(
      "The previous-token heads' output (every layer-0 head scoring at least 0.5 as one, and the best always; "
      "their slices of blocks.0.attn.result, read by a hook in the same forward) subtracted from one input of "
      "layer 1 alone (blocks.1.k_input, q_input or v_input): the induction head "
      "should lose its pattern when the keys lose it, and keep it otherwise (its pattern does not depend on the "
      "values at all)."));
  html::Table ablation;
  std::string removed;
  for (std::int64_t h : r.ablated_heads) removed += (removed.empty() ? "" : " + ") + head_name(0, h);
  ablation.caption = fmt::format("{} removed from layer 1's ...", removed);
  ablation.header = {"input", fmt::format("{} induction score", head_name(1, ih)), "change", "loss", "repeated-token loss"};
  ablation.attributes = "id=\"path-ablation\"";
  ablation.row_attributes = "class=\"ablation-row\"";
  ablation.rows.push_back({"nothing (clean)", fixed(r.induction_score()), "", fixed(r.final_loss.all),
                           fixed(r.final_loss.repeated)});
  for (const auto& a : r.path_ablation)
    ablation.rows.push_back({a.input + " only", fixed(a.induction_score),
                             fmt::format("{:+.1f} %", 100 * relative_change(r.induction_score(), a.induction_score)),
                             fixed(a.loss.all), fixed(a.loss.repeated)});
  page.table(ablation);
  page.data("summary", summary_json(r));
  return page.html();
}

}  // namespace induction
