#include "options.hpp"

#include <filesystem>
#include <stdexcept>

#include <fmt/format.h>

#include "cli_checks.hpp"
#include "html_page.hpp"

namespace char_gpt {

namespace {

// The flags that set TrainConfig: a resumed run takes these from its checkpoint.
const char* const kSettingFlags[] = {
    "--n-layer", "--n-head", "--n-embd", "--block-size", "--batch-size", "--max-iters", "--lr", "--min-lr",
    "--warmup-iters", "--lr-decay-iters", "--weight-decay", "--beta1", "--beta2", "--grad-clip", "--dropout",
    "--bias", "--no-tie-weights", "--eval-interval", "--eval-iters", "--seed", "--float64"};

using cli_checks::integer_at_least, cli_checks::non_negative_number, cli_checks::number_below,
    cli_checks::positive_number;

void add_model_options(CLI::App& app, TrainConfig& c) {
  auto& m = c.model;
  app.add_option("--n-layer", m.n_layer, "transformer blocks (default 4)")->transform(integer_at_least(1));
  app.add_option("--n-head", m.n_head, "attention heads per block (default 4)")->transform(integer_at_least(1));
  app.add_option("--n-embd", m.n_embd, "model width (default 128)")->transform(integer_at_least(1));
  app.add_option("--block-size", m.block_size, "context length in characters (default 64)")
      ->transform(integer_at_least(1));
  app.add_option("--dropout", m.dropout, "dropout on the embeddings and the attention weights (default 0)")
      ->check(number_below(0, 1));
  app.add_flag("--bias", m.bias, "biases in the blocks' linear layers (default none, as nanoGPT's config)");
  app.add_flag_callback("--no-tie-weights", [&m] { m.tie_weights = false; },
                        "a head of its own instead of the token embedding transposed");
  app.add_flag_callback("--float64", [&m] { m.dtype = ag::Dtype::Float64; }, "train in float64");
}

void add_training_options(CLI::App& app, TrainConfig& c) {
  app.add_option("--batch-size", c.batch_size, "sequences per step (default 12)")->transform(integer_at_least(1));
  app.add_option("--max-iters", c.max_iters, "optimizer steps (default 2000)")->transform(integer_at_least(0));
  app.add_option("--lr", c.lr, "peak learning rate (default 1e-3)")->check(positive_number());
  app.add_option("--min-lr", c.min_lr, "learning rate at the end of the cosine (default 1e-4)")
      ->check(non_negative_number());
  app.add_option("--warmup-iters", c.warmup_iters, "linear warmup steps (default 100)")
      ->transform(integer_at_least(0));
  app.add_option("--lr-decay-iters", c.lr_decay_iters, "step where the cosine reaches min-lr (default: max-iters)")
      ->transform(integer_at_least(0));
  app.add_option("--weight-decay", c.weight_decay, "AdamW's decay of the 2-D parameters (default 0.1)")
      ->check(non_negative_number());
  app.add_option("--beta1", c.beta1, "AdamW beta1 (default 0.9)")->check(number_below(0, 1));
  app.add_option("--beta2", c.beta2, "AdamW beta2 (default 0.99)")->check(number_below(0, 1));
  app.add_option("--grad-clip", c.grad_clip, "clip the gradients' total norm (default 1; 0: no clipping)")
      ->check(non_negative_number());
  app.add_option("--eval-interval", c.eval_interval, "steps between evaluations and checkpoints (default 250)")
      ->transform(integer_at_least(1));
  app.add_option("--eval-iters", c.eval_iters, "batches per split in an evaluation (default 20)")
      ->transform(integer_at_least(1));
  app.add_option("--seed", c.seed, "seed of the initial weights and of the batches (default 1)")
      ->transform(integer_at_least(0));
}

void add_sample_options(CLI::App& app, Options& o) {
  app.add_option("--max-new-tokens", o.sample.max_new_tokens, "characters to sample (default 500; 0: none)")
      ->transform(integer_at_least(0));
  app.add_option("--temperature", o.sample.temperature, "sampling temperature (default 0.8)")
      ->check(positive_number());
  app.add_option("--top-k", o.sample.top_k, "sample among the k likeliest characters (default 200)")
      ->transform(integer_at_least(1));
  app.add_option("--sample-seed", o.sample.seed, "seed of the sampling (default 1337)")
      ->transform(integer_at_least(0));
  app.add_option("--start", o.start, "the prompt (default a newline)");
}

}  // namespace

std::string Options::checkpoint() const { return (std::filesystem::path(out) / "ckpt.safetensors").string(); }

void add_options(CLI::App& app, Options& o) {
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  add_model_options(app, o.config);
  add_training_options(app, o.config);
  add_sample_options(app, o);
  app.add_option("--data", o.data, "UTF-8 text file, or a directory of them (default /usr/share/games/fortunes)");
  app.add_option("--out", o.out, "directory for the checkpoint, loss.svg, report.html, summary.json "
                                 "(default char_gpt_out)");
  app.add_flag("--resume", o.resume, "continue <out>/ckpt.safetensors with its settings");
  app.add_flag("--sample", o.sample_only, "only sample text from <out>/ckpt.safetensors");
  app.add_option("--log-interval", o.log_interval, "steps between progress lines (default 10)")
      ->transform(integer_at_least(1));
  app.add_option("--threads", o.threads, "kernel threads (default 1); results do not depend on it")
      ->transform(cli_checks::integer_in(1, 256));
  app.add_option("--stop-at", o.stop_at,
                 "stop at this step with a checkpoint, as if interrupted (the schedule stays --max-iters');\n"
                 "continue with --resume")
      ->transform(integer_at_least(1));
  app.add_flag_callback("--no-full-eval", [&o] { o.full_eval = false; },
                        "skip the full validation loss at the end");
  app.add_option("--save-init", o.save_init, "save the initial parameters (safetensors) for the PyTorch parity check");
  app.add_flag("--quiet", o.quiet, "no progress lines");
}

void finish_options(const CLI::App& app, Options& o) {
  for (const char* flag : kSettingFlags)
    if (app.count(flag) > 0) o.given_settings.push_back(flag);
  o.start_given = app.count("--start") > 0;
  if (o.resume && o.sample_only) throw std::invalid_argument("--resume and --sample exclude each other");
  decode_utf8(o.start, "--start");  // refused now if it is not UTF-8
  if (!o.resume && !o.sample_only) {
    const TrainConfig& c = o.config;
    if (c.min_lr > c.lr) throw std::invalid_argument(fmt::format("--min-lr {} is above --lr {}", c.min_lr, c.lr));
    if (c.warmup_iters > c.decay_iters())
      throw std::invalid_argument(fmt::format("--warmup-iters {} is beyond the end of the decay, step {} ({})",
                                              c.warmup_iters, c.decay_iters(),
                                              c.lr_decay_iters > 0 ? "--lr-decay-iters" : "--max-iters"));
    o.config.model.vocab_size = 1;  // the corpus sets it; checked here with the rest
    o.config.check();
  }
  o.sample.check();
  if (o.sample_only) return;
  // Everything a run writes, checked before it trains: a path that cannot be written would
  // otherwise be found only at its end.
  std::error_code ec;
  std::filesystem::create_directories(o.out, ec);
  if (ec || !std::filesystem::is_directory(o.out))
    throw std::invalid_argument(fmt::format("--out {}: cannot make the directory ({})", o.out,
                                            ec ? ec.message() : "a file of that name exists"));
  for (const char* name : {"ckpt.safetensors", "loss.svg", "report.html", "summary.json"}) {
    try {
      html::check_writable((std::filesystem::path(o.out) / name).string());
    } catch (const std::exception& e) {
      throw std::invalid_argument(fmt::format("--out {}: {}", o.out, e.what()));
    }
  }
  if (!o.save_init.empty()) {
    try {
      html::check_writable(o.save_init);
    } catch (const std::exception& e) {
      throw std::invalid_argument(fmt::format("--save-init {}: {}", o.save_init, e.what()));
    }
  }
}

std::vector<std::int32_t> prompt_tokens(const Options& o, const Vocabulary& vocab) {
  const std::u32string start = decode_utf8(o.start, "--start");
  if (start.empty()) return {0};
  for (char32_t ch : start)
    if (!vocab.contains(ch)) {
      if (!o.start_given) return {0};  // the default prompt, a newline, and a corpus without one
      throw std::invalid_argument(fmt::format("--start '{}': the character '{}' (U+{:04X}) is not in the corpus",
                                              o.start, encode_utf8(std::u32string(1, ch)),
                                              static_cast<std::uint32_t>(ch)));
    }
  return vocab.encode(start);
}

TrainConfig resumed_config(const Options& o, const TrainConfig& checkpoint) {
  TrainConfig c = checkpoint;
  for (const auto& flag : o.given_settings)
    if (flag != "--max-iters")
      throw std::invalid_argument(fmt::format("--resume continues the checkpoint's run with its own settings; "
                                              "leave out {}",
                                              flag));
  if (o.config.max_iters != checkpoint.max_iters &&
      std::find(o.given_settings.begin(), o.given_settings.end(), "--max-iters") != o.given_settings.end()) {
    c.lr_decay_iters = checkpoint.decay_iters();  // the schedule stays the checkpoint's
    c.max_iters = o.config.max_iters;
  }
  return c;
}

}  // namespace char_gpt
