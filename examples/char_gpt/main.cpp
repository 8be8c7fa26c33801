// char_gpt — a character-level GPT trained from C++ on a real text (nanoGPT's shakespeare_char,
// on headgrad). By default the corpus is the English fortune-cookie texts of Debian's `fortunes`
// package; any UTF-8 text file works with --data FILE.
//
//   char_gpt                                # nanoGPT's CPU configuration, 2000 steps
//   char_gpt --max-iters 500 --out run1     # shorter; checkpoints and pictures in run1/
//   char_gpt --stop-at 200 --out run1       # as if interrupted at step 200
//   char_gpt --resume --out run1            # continues run1/ckpt.safetensors bit for bit
//   char_gpt --sample --out run1 --temperature 0.9 --top-k 20 --sample-seed 7
//   char_gpt --help
//
// Writes into --out: ckpt.safetensors (at every evaluation and at the end), loss.svg,
// report.html (one self-contained page) and summary.json.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "html_page.hpp"
#include "options.hpp"
#include "report.hpp"
#include "sample.hpp"
#include "trainer.hpp"

namespace ag = autograd;
using namespace char_gpt;

namespace {

// prompt: prompt_tokens(o, vocab), taken before the work, so that a prompt the corpus cannot
// encode is refused before training.
std::string sample_text(Gpt& model, const Vocabulary& vocab, const std::vector<std::int32_t>& prompt,
                        const Options& o) {
  return encode_utf8(vocab.decode(generate(model, prompt, o.sample)));
}

void print_sample(const std::string& text, const Options& o) {
  fmt::print("---- sample (temperature {}, top-k {}, seed {}) ----\n{}\n----\n", o.sample.temperature, o.sample.top_k,
             o.sample.seed, text);
}

int sample_only(const Options& o) {
  const std::string path = o.checkpoint();
  const CheckpointInfo info = read_checkpoint_info(path);
  const std::vector<std::int32_t> prompt = prompt_tokens(o, info.vocab);
  auto model = load_model(path, info);
  fmt::print("{}: step {}, {} parameters, vocabulary {}\n", path, info.step, model->num_parameters(),
             info.vocab.size());
  print_sample(sample_text(*model, info.vocab, prompt, o), o);
  return 0;
}

void report_eval(const EvalRecord& e, bool quiet) {
  if (!quiet) fmt::print("step {}: train loss {:.4f}, val loss {:.4f}\n", e.step, e.train, e.val);
}

// Trains to max_iters (or --stop-at), evaluating and saving a checkpoint every eval_interval steps
// and at the end. Returns the seconds spent in training steps.
double train_loop(Trainer& t, const Options& o) {
  const auto& c = t.config();
  const std::int64_t end = o.stop_at > 0 ? std::min(o.stop_at, c.max_iters) : c.max_iters;
  if (t.history().evals.empty()) report_eval(t.evaluate(), o.quiet);
  const double tokens = static_cast<double>(c.batch_size * c.model.block_size);
  double seconds = 0, window = 0;
  std::int64_t window_steps = 0;
  while (t.step() < end) {
    const auto start = std::chrono::steady_clock::now();
    const double loss = t.train_step();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    seconds += dt;
    window += dt;
    ++window_steps;
    if (!std::isfinite(loss))
      throw std::runtime_error(fmt::format("char_gpt: the training loss is {} at step {}; the learning rate (--lr {}) "
                                           "is likely too large",
                                           loss, t.step(), c.lr));
    if (!o.quiet && (t.step() % o.log_interval == 0 || t.step() == c.max_iters)) {
      fmt::print("step {}/{}: loss {:.4f}, lr {:.2e}, {:.0f} tokens/s ({:.1f} steps/s)\n", t.step(), c.max_iters,
                 loss, t.optimizer().lr(), tokens * static_cast<double>(window_steps) / window,
                 static_cast<double>(window_steps) / window);
      std::fflush(stdout);
      window = 0;
      window_steps = 0;
    }
    if (t.step() % c.eval_interval == 0 || t.step() == c.max_iters) {
      report_eval(t.evaluate(), o.quiet);
      t.save(o.checkpoint());
    } else if (t.step() == end) {
      t.save(o.checkpoint());
    }
  }
  return seconds;
}

int train(const Options& o) {
  const std::u32string text = load_corpus(o.data);
  Vocabulary vocab(text);
  const std::vector<std::int32_t> prompt = prompt_tokens(o, vocab);
  Split split = split_tokens(vocab.encode(text));
  TrainConfig config = o.config;
  if (o.resume) config = resumed_config(o, read_checkpoint_info(o.checkpoint()).config);
  Trainer t(config, vocab, std::move(split));
  if (o.resume) t.load(o.checkpoint());
  if (!o.save_init.empty()) nn::save_parameters(t.model(), o.save_init);
  fmt::print("corpus: {}, {} characters, vocabulary {}; {} parameters; {}\n", o.data, text.size(), vocab.size(),
             t.model().num_parameters(),
             o.resume ? fmt::format("resumed at step {}", t.step()) : std::string("from scratch"));
  RunSummary run;
  run.config = t.config();
  run.corpus = o.data;
  run.corpus_chars = static_cast<std::int64_t>(text.size());
  run.parameters = t.model().num_parameters();
  run.threads = ag::get_num_threads();
  const std::int64_t first_step = t.step();
  run.seconds = train_loop(t, o);
  if (t.step() < config.max_iters) {
    fmt::print("stopped at step {} of {}: {} (continue with --resume)\n", t.step(), config.max_iters, o.checkpoint());
    return 0;
  }
  const auto steps = static_cast<double>(t.step() - first_step);
  run.tokens_per_second = run.seconds > 0 ? steps * static_cast<double>(config.batch_size * config.model.block_size) /
                                                run.seconds
                                          : 0.0;
  run.full_val_loss = o.full_eval ? t.full_val_loss() : std::numeric_limits<double>::quiet_NaN();
  if (o.full_eval) fmt::print("full validation loss {:.4f} after {} steps\n", run.full_val_loss, t.step());
  if (steps > 0) fmt::print("{:.1f} s training, {:.0f} tokens/s\n", run.seconds, run.tokens_per_second);
  run.history = t.history();
  if (o.sample.max_new_tokens > 0) {
    run.sample = sample_text(t.model(), vocab, prompt, o);
    print_sample(run.sample, o);
  }
  const std::filesystem::path out(o.out);
  html::write_file((out / "loss.svg").string(), loss_curves_svg(run.history));
  html::write_file((out / "report.html").string(), report_html(run));
  html::write_file((out / "summary.json").string(), summary_json(run).dump(1) + "\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"char_gpt: a character-level GPT trained with headgrad (nanoGPT's flags)"};
  Options o;
  add_options(app, o);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help: the usage
    fmt::print(stderr, "char_gpt: {} (try --help)\n", e.what());
    return 1;
  }
  try {
    finish_options(app, o);
    ag::set_num_threads(o.threads);
    return o.sample_only ? sample_only(o) : train(o);
  } catch (const std::exception& e) {
    const std::string message = e.what();
    fmt::print(stderr, "{}{}\n", message.starts_with("char_gpt: ") ? "" : "char_gpt: ", message);
    return 1;
  }
}
