#include "study.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

#include "cli_checks.hpp"

namespace induction {

namespace circuits = nn::circuits;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Olsson et al.'s in-context learning score of logits (B, T, V) on tokens (B, T): the mean loss
// at the last quarter of the positions minus at the first quarter.
double in_context_score(const ag::Tensor& logits, const ag::Tensor& tokens) {
  const std::int64_t B = tokens.size(0), T = tokens.size(1);
  const std::vector<double> l = ag::cross_entropy(ag::slice(logits, 1, 0, T - 1), ag::slice(tokens, 1, 1, T),
                                                  {.reduction = ag::Reduction::None})
                                    .to_vector();
  const std::int64_t window = std::max<std::int64_t>(1, (T - 1) / 4);
  double early = 0, late = 0;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t i = 0; i < window; ++i) {
      early += l[static_cast<std::size_t>(b * (T - 1) + i)];
      late += l[static_cast<std::size_t>(b * (T - 1) + T - 1 - window + i)];
    }
  return (late - early) / static_cast<double>(B * window);
}

// Per predicted token losses (B, T - 1) of logits (B, T, V) on the batch, summarised by kind; the
// in-context score of the batch itself.
Losses losses_of(const ag::Tensor& logits, const Batch& batch) {
  const std::int64_t B = batch.size(), T = batch.seq_len();
  const ag::Tensor per = ag::cross_entropy(ag::slice(logits, 1, 0, T - 1), ag::slice(batch.tokens, 1, 1, T),
                                           {.reduction = ag::Reduction::None});
  const std::vector<double> l = per.to_vector();
  const std::vector<TargetKind> kinds = target_kinds(batch);
  double all = 0, first = 0, repeated = 0;
  std::int64_t n_first = 0, n_repeated = 0;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t i = 0; i < T - 1; ++i) {
      const auto k = static_cast<std::size_t>(b * (T - 1) + i);
      all += l[k];
      if (kinds[k] == TargetKind::First) first += l[k], ++n_first;
      if (kinds[k] == TargetKind::Repeat) repeated += l[k], ++n_repeated;
    }
  const auto mean = [](double s, std::int64_t n) { return n > 0 ? s / static_cast<double>(n) : std::nan(""); };
  return {.all = mean(all, B * (T - 1)),
          .first_occurrence = mean(first, n_first),
          .repeated = mean(repeated, n_repeated),
          .in_context_score = in_context_score(logits, batch.tokens)};
}

// The losses on the repeat sequences, with the in-context score taken on held-out sequences of the
// training kind (Markov chains: later positions have more of the chain's statistics to read).
Losses held_out_losses(const nn::TransformerLM& model, const ag::Tensor& repeat_logits, const Batch& test,
                       const ag::Tensor& training_kind) {
  Losses l = losses_of(repeat_logits, test);
  if (training_kind.defined()) l.in_context_score = in_context_score(model.forward(training_kind), training_kind);
  return l;
}

// The share of attention on the detector's targets over the query positions that have one, per
// head: patterns (B, H, T, T), detection (B, T, T).
std::vector<double> target_share(const ag::Tensor& pattern, const ag::Tensor& detection) {
  return circuits::head_scores(pattern, detection, {.error_measure = circuits::ErrorMeasure::Share}).to_vector();
}

// Per head: the attention-weighted mean of i - j and of j / i over the query positions i >= 1.
struct Looks {
  std::vector<double> offset, relative, max_weight;
};
Looks where_heads_look(const ag::Tensor& pattern) {
  const std::int64_t B = pattern.size(0), H = pattern.size(1), T = pattern.size(2);
  const std::vector<double> P = pattern.to_vector();
  std::vector<double> offset(static_cast<std::size_t>(H), 0.0), relative(static_cast<std::size_t>(H), 0.0),
      max_weight(static_cast<std::size_t>(H), 0.0);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 1; i < T; ++i) {
        const std::size_t p0 = static_cast<std::size_t>(((b * H + h) * T + i) * T);
        double top = 0;
        for (std::int64_t j = 0; j <= i; ++j) {
          const double a = P[p0 + static_cast<std::size_t>(j)];
          top = std::max(top, a);
          offset[static_cast<std::size_t>(h)] += a * static_cast<double>(i - j);
          relative[static_cast<std::size_t>(h)] += a * static_cast<double>(j) / static_cast<double>(i);
        }
        max_weight[static_cast<std::size_t>(h)] += top;
      }
  const auto n = static_cast<double>(B * (T - 1));
  for (std::int64_t h = 0; h < H; ++h) {
    offset[static_cast<std::size_t>(h)] /= n;
    relative[static_cast<std::size_t>(h)] /= n;
    max_weight[static_cast<std::size_t>(h)] /= n;
  }
  return {offset, relative, max_weight};
}

std::vector<double> pattern_slice(const ag::Tensor& pattern, std::int64_t b, std::int64_t h) {
  return ag::narrow(ag::narrow(pattern, 0, b, 1), 1, h, 1).to_vector();
}

// Removes the hooks when it goes, also when a measurement throws.
struct Hooks {
  std::vector<nn::HookHandle> handles;
  ~Hooks() {
    for (auto& h : handles) h.remove();
  }
};

const char* const kPatterns[] = {"blocks.0.attn.pattern", "blocks.1.attn.pattern"};

void measure(nn::TransformerLM& model, const Batch& test, const ag::Tensor& training_kind, StudyResult& r) {
  const StudyConfig& c = r.config;
  const std::int64_t H = c.n_heads;
  const auto forward = [&] { return model.forward(test.tokens); };
  const nn::ActivationCache cache = nn::run_with_cache(model, forward, {.names = {kPatterns[0], kPatterns[1]}});
  r.final_loss = held_out_losses(model, cache.output, test, training_kind);
  const circuits::HeadKind kinds[] = {circuits::HeadKind::PreviousToken, circuits::HeadKind::Induction,
                                      circuits::HeadKind::DuplicateToken};
  std::vector<ag::Tensor> detection;
  for (auto kind : kinds) detection.push_back(circuits::detection_pattern(kind, test.tokens));
  r.heads.clear();
  for (std::int64_t layer = 0; layer < 2; ++layer) {
    const ag::Tensor& P = cache[kPatterns[layer]];
    std::vector<std::vector<double>> share, tl;
    for (std::size_t k = 0; k < 3; ++k) {
      share.push_back(target_share(P, detection[k]));
      tl.push_back(circuits::head_scores(P, detection[k]).to_vector());
    }
    const Looks looks = where_heads_look(P);
    for (std::int64_t h = 0; h < H; ++h) {
      const auto u = static_cast<std::size_t>(h);
      r.heads.push_back({.layer = layer, .head = h, .previous_token = share[0][u], .induction = share[1][u],
                         .duplicate_token = share[2][u], .tl_previous_token = tl[0][u], .tl_induction = tl[1][u],
                         .tl_duplicate_token = tl[2][u], .mean_offset = looks.offset[u],
                         .mean_relative_position = looks.relative[u], .mean_max_weight = looks.max_weight[u]});
    }
  }
  for (std::int64_t h = 0; h < H; ++h) {
    if (r.head(0, h).previous_token > r.head(0, r.previous_token_head).previous_token) r.previous_token_head = h;
    if (r.head(1, h).induction > r.head(1, r.induction_head).induction) r.induction_head = h;
  }
  const std::int64_t p = r.previous_token_head, ih = r.induction_head;
  // The path ablation removes every layer-0 head that does the previous-token head's job (score
  // >= 0.5; the best one always): a model may share it between two heads, and removing one alone
  // would then leave the other carrying the keys.
  r.ablated_heads.clear();
  for (std::int64_t h = 0; h < H; ++h)
    if (h == p || r.head(0, h).previous_token >= 0.5) r.ablated_heads.push_back(h);

  // K-composition of every (layer-0, layer-1) pair, and its level for random matrices.
  r.k_composition_matrix =
      circuits::composition_scores(model.attn(0), model.attn(1), circuits::Composition::K).to_vector();
  r.k_composition = r.k_composition_matrix[static_cast<std::size_t>(p * H + ih)];
  ag::Generator baseline_gen(c.seed ^ 0xba5e11e5ULL);
  const auto baseline = circuits::random_composition_baseline(model.attn(0), model.attn(1), circuits::Composition::K,
                                                              baseline_gen, c.baseline_samples);
  r.k_composition_baseline = baseline.mean;
  r.k_composition_baseline_std = baseline.std;

  // Path ablation: the previous-token heads' output (their slices of blocks.0.attn.result, read in
  // the same forward) subtracted from one input of layer 1 alone.
  r.path_ablation.clear();
  const std::pair<const char*, const char*> inputs[] = {
      {"keys", "blocks.1.k_input"}, {"queries", "blocks.1.q_input"}, {"values", "blocks.1.v_input"}};
  for (const auto& [input, point] : inputs) {
    ag::Tensor head_out;  // (B, T, E)
    nn::ActivationCache ablated;
    {
      Hooks hooks;
      hooks.handles.push_back(model.add_hook("blocks.0.attn.result", [&](const ag::Tensor& result, const std::string&) {
        head_out = ag::Tensor();
        for (std::int64_t h : r.ablated_heads) {
          const ag::Tensor one = ag::squeeze(ag::narrow(result, 1, h, 1), 1);
          head_out = head_out.defined() ? head_out + one : one;
        }
        return ag::Tensor();
      }));
      hooks.handles.push_back(model.add_hook(point, [&](const ag::Tensor& x, const std::string&) {
        return x - head_out;
      }));
      ablated = nn::run_with_cache(model, forward, {.names = {kPatterns[1]}});
    }
    const double score = target_share(ablated[kPatterns[1]], detection[1])[static_cast<std::size_t>(ih)];
    r.path_ablation.push_back({.input = input, .induction_score = score, .loss = losses_of(ablated.output, test)});
  }

  // One sequence for the pictures: the first with a period at least the middle of the range.
  std::int64_t b = 0;
  for (std::int64_t k = 0; k < test.size(); ++k)
    if (2 * test.period[static_cast<std::size_t>(k)] >= c.task.period_min + c.task.period_max) {
      b = k;
      break;
    }
  Example& e = r.example;
  e.tokens.clear();
  for (double t : ag::narrow(test.tokens, 0, b, 1).to_vector()) e.tokens.push_back(static_cast<std::int64_t>(t));
  e.start = test.start[static_cast<std::size_t>(b)];
  e.period = test.period[static_cast<std::size_t>(b)];
  e.previous_token_pattern = pattern_slice(cache[kPatterns[0]], b, p);
  // The previous-token head's weight on i - 1 by query position i, over the held-out sequences.
  const std::vector<double> P0 = ag::narrow(cache[kPatterns[0]], 1, p, 1).to_vector();  // (B, 1, T, T)
  const std::int64_t B = test.size(), T = test.seq_len();
  r.previous_token_by_position.assign(static_cast<std::size_t>(T - 1), 0.0);
  for (std::int64_t s = 0; s < B; ++s)
    for (std::int64_t i = 1; i < T; ++i)
      r.previous_token_by_position[static_cast<std::size_t>(i - 1)] +=
          P0[static_cast<std::size_t>((s * T + i) * T + i - 1)] / static_cast<double>(B);
  e.induction_pattern = pattern_slice(cache[kPatterns[1]], b, ih);
}

std::optional<std::int64_t> phase_change(const std::vector<CurvePoint>& curve) {
  if (curve.empty()) return std::nullopt;
  const double final_score = curve.back().test.in_context_score;
  if (!(final_score < 0)) return std::nullopt;  // no in-context learning to speak of
  // The first evaluation from which the score stays at or below half its final value: the
  // untrained model's score is noise of either sign (it can start below that line by chance).
  std::optional<std::int64_t> step;
  for (const auto& point : curve)
    if (point.test.in_context_score > final_score / 2)
      step.reset();
    else if (!step)
      step = point.step;
  return step;
}

// The initial weights under TransformerLens's names and the training batches drawn from a copy of
// the training generator (the same batches training draws after), for benchmarks/induction_torch.py.
void save_initial(const nn::TransformerLM& model, const StudyConfig& c, ag::Generator data, const std::string& path) {
  nn::NamedTensors tensors = nn::transformer_lens_state_dict(model);
  std::vector<ag::Tensor> batches;
  batches.reserve(static_cast<std::size_t>(c.steps));
  for (std::int64_t step = 1; step <= c.steps; ++step) batches.push_back(make_training_batch(c.task, c.batch, data));
  tensors.emplace_back("data.train_tokens", ag::stack(batches, 0));
  nn::save_safetensors(path, tensors);
}

}  // namespace

void StudyConfig::check() const {
  task.check();
  const auto fail = [](const std::string& what) { throw std::invalid_argument(what); };
  if (d_model % n_heads != 0) fail(fmt::format("--d-model {} is not divisible by --heads {}", d_model, n_heads));
  if (test_sequences < 1) fail("--test-sequences must be at least 1");
  // Sizes past these would only fail later, in an allocation or the model's own check, naming no flag.
  const std::pair<const char*, std::pair<std::int64_t, std::int64_t>> sizes[] = {
      {"--seq-len", {task.seq_len, 1 << 14}}, {"--d-model", {d_model, 1 << 14}}, {"--heads", {n_heads, 1 << 10}},
      {"--vocab", {task.vocab, 1 << 20}},     {"--batch", {batch, 1 << 16}},     {"--test-sequences", {test_sequences, 1 << 16}}};
  for (const auto& [flag, size] : sizes)
    if (size.first > size.second) fail(fmt::format("{} {} is too large (at most {})", flag, size.first, size.second));
  if (const std::string decay = cli_checks::decay_problem(lr, weight_decay); !decay.empty()) fail(decay);
}

std::vector<Goal> goals(const StudyResult& r) {
  std::vector<Goal> g;
  const double clean = r.induction_score();
  const auto drop = [clean](const PathAblation& a) { return clean > 0 ? 1 - a.induction_score / clean : 0.0; };
  g.push_back({"previous-token score >= 0.5", r.previous_token_score() >= 0.5,
               fmt::format("{:.3f}", r.previous_token_score())});
  g.push_back({"induction score >= 0.7", clean >= 0.7, fmt::format("{:.3f}", clean)});
  g.push_back({"K-composition >= 1.3 x its random baseline", r.k_composition >= 1.3 * r.k_composition_baseline,
               fmt::format("{:.3f} vs {:.3f} ({:.2f} x)", r.k_composition, r.k_composition_baseline,
                           r.k_composition / r.k_composition_baseline)});
  for (const auto& a : r.path_ablation) {
    const bool keys = a.input == "keys";
    const double d = drop(a);
    g.push_back({fmt::format("{}-only path ablation cuts the induction score by {}", a.input,
                             keys ? ">= 30 %" : "< 10 %"),
                 keys ? d >= 0.3 : d < 0.1, fmt::format("{:.3f} -> {:.3f} ({:+.1f} %)", clean, a.induction_score,
                                                       -100 * d)});
  }
  return g;
}

nn::TransformerLMConfig model_config(const StudyConfig& c) {
  return {.n_layers = 2, .d_model = c.d_model, .n_heads = c.n_heads, .d_mlp = 0, .d_vocab = c.task.vocab,
          .n_ctx = c.task.seq_len, .dtype = c.dtype};
}

StudyResult run_study(const StudyConfig& config, const StudyOutputs& outputs) {
  config.check();
  const Progress& progress = outputs.progress;
  if (!outputs.initial_weights.empty() && config.steps > kMaxSavedTokens / config.batch / config.task.seq_len)
    throw std::invalid_argument(fmt::format("run_study: {} steps of {} x {} training tokens exceed the {} the "
                                            "initial-weights file may hold",
                                            config.steps, config.batch, config.task.seq_len, kMaxSavedTokens));
  StudyResult r;
  r.config = config;
  const StudyConfig& c = r.config;
  ag::Generator init(c.seed);
  nn::TransformerLM model(model_config(c), init);
  r.parameters = model.num_parameters();
  r.threads = ag::get_num_threads();
  ag::Generator data(c.seed * 0x9e3779b97f4a7c15ULL + 1), held_out(c.seed * 0x9e3779b97f4a7c15ULL + 2);
  const Batch test = make_batch(c.task, c.test_sequences, held_out);
  const ag::Tensor training_kind =
      c.task.training == Training::Markov ? make_training_batch(c.task, c.test_sequences, held_out) : ag::Tensor();
  if (!outputs.initial_weights.empty()) save_initial(model, c, data, outputs.initial_weights);
  nn::AdamW opt(model.named_parameters(), {.lr = c.lr, .weight_decay = c.weight_decay});

  const auto decay_hint = [&c] {
    return c.weight_decay > 0.01 ? fmt::format(", or --weight-decay, now {}", c.weight_decay) : std::string();
  };
  const ag::Tensor previous_token_targets = circuits::detection_pattern(circuits::HeadKind::PreviousToken, test.tokens);
  const ag::Tensor induction_targets = circuits::detection_pattern(circuits::HeadKind::Induction, test.tokens);
  const auto best = [](const std::vector<double>& scores) { return *std::max_element(scores.begin(), scores.end()); };
  const auto evaluate = [&](std::int64_t step, double train_loss) {
    ag::NoGradGuard no_grad;
    const nn::ActivationCache cache = nn::run_with_cache(model, [&] { return model.forward(test.tokens); },
                                                         {.names = {kPatterns[0], kPatterns[1]}});
    const Losses losses = held_out_losses(model, cache.output, test, training_kind);
    if (!std::isfinite(losses.all))
      throw std::runtime_error(fmt::format("induction_heads: the held-out loss is {} after step {}: the weights "
                                           "diverged (lower --lr, now {}{})",
                                           losses.all, step, c.lr, decay_hint()));
    CurvePoint point{.step = step, .train_loss = train_loss, .test = losses,
                     .previous_token_score = best(target_share(cache[kPatterns[0]], previous_token_targets)),
                     .induction_score = best(target_share(cache[kPatterns[1]], induction_targets))};
    r.curve.push_back(point);
    if (progress) progress(point);
  };
  double window = 0;
  std::int64_t window_steps = 0;
  for (std::int64_t step = 1; step <= c.steps; ++step) {
    const auto start = Clock::now();
    const ag::Tensor tokens = make_training_batch(c.task, c.batch, data);
    opt.zero_grad();
    ag::Tensor loss = model.loss(tokens);
    const double value = loss.item();
    if (!std::isfinite(value))
      throw std::runtime_error(fmt::format("induction_heads: the training loss is {} at step {}; the learning rate "
                                           "(--lr {}) is likely too large{}",
                                           value, step, c.lr, decay_hint()));
    if (step == 1) {
      r.train_seconds += seconds_since(start);
      evaluate(0, value);
    }
    const auto resumed = Clock::now();
    loss.backward();
    opt.step();
    r.train_seconds += seconds_since(step == 1 ? resumed : start);
    r.train_losses.push_back(value);
    window += value;
    ++window_steps;
    if (step % c.eval_interval == 0 || step == c.steps) {
      evaluate(step, window / static_cast<double>(window_steps));
      window = 0;
      window_steps = 0;
    }
  }
  r.phase_change_step = phase_change(r.curve);
  if (!outputs.trained_weights.empty()) nn::save_transformer_lens_state_dict(model, outputs.trained_weights);
  const auto start = Clock::now();
  {
    ag::NoGradGuard no_grad;
    measure(model, test, training_kind, r);
  }
  r.measure_seconds = seconds_since(start);
  return r;
}

}  // namespace induction
