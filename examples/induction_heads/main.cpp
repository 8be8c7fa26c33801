// induction_heads — the induction-head experiment (Elhage et al. 2021; Olsson et al. 2022) as one
// command: a 2-layer attention-only transformer trained on in-context Markov chains (a chain per
// sequence), and the circuit it forms measured on held-out sequences in which a random segment
// repeats: a
// previous-token head in layer 0, an induction head in layer 1, their K-composition against
// random matrices, and path ablation showing the induction head reads the previous-token head
// through its keys alone.
//
//   induction_heads                                   # the default run (about half a minute)
//   induction_heads --seed 3 --summary s.json --report r.html
//   induction_heads --train-on repeat --vocab 48 --seq-len 32   # trained on the repeat task instead
//   induction_heads --steps 200 --save-initial w.safetensors --float64   # for benchmarks/induction_torch.py
//   induction_heads --help
#include <new>
#include <stdexcept>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cli_checks.hpp"
#include "html_page.hpp"
#include "report.hpp"
#include "study.hpp"

namespace ag = autograd;
using namespace induction;

namespace {

struct Options {
  StudyConfig study;
  int threads = 1;
  std::string summary, report, initial_weights, trained_weights;
  std::string train_on = "markov";
  bool quiet = false, float64 = false;
};

void add_options(CLI::App& app, Options& o) {
  using cli_checks::integer_at_least, cli_checks::integer_in, cli_checks::non_negative_number,
      cli_checks::positive_number;
  StudyConfig& c = o.study;
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--vocab", c.task.vocab, "vocabulary size (default 8)")->type_name("V")->transform(integer_at_least(2));
  app.add_option("--seq-len", c.task.seq_len, "sequence length (default 64)")->type_name("T")
      ->transform(integer_at_least(2));
  app.add_option("--train-on", o.train_on,
                 "training sequences: markov (a Markov chain per sequence, the default) or repeat (the "
                 "measurement's task)")
      ->type_name("KIND")
      ->check(CLI::IsMember({"markov", "repeat"}));
  app.add_option("--period-min", c.task.period_min, "shortest repeated segment (default 6)")->type_name("N")
      ->transform(integer_at_least(1));
  app.add_option("--period-max", c.task.period_max, "longest repeated segment, at most T/2 (default 16)")
      ->type_name("N")->transform(integer_at_least(1));
  app.add_option("--d-model", c.d_model, "model width (default 64)")->type_name("D")->transform(integer_at_least(1));
  app.add_option("--heads", c.n_heads, "attention heads per layer (default 4)")->type_name("H")
      ->transform(integer_at_least(1));
  app.add_option("--batch", c.batch, "sequences per step (default 32)")->type_name("N")->transform(integer_at_least(1));
  app.add_option("--steps", c.steps, "training steps (default 1500)")->type_name("N")->transform(integer_at_least(1));
  app.add_option("--lr", c.lr, "AdamW's learning rate (default 3e-3)")->type_name("X")->check(positive_number());
  app.add_option("--weight-decay", c.weight_decay, "AdamW's weight decay (default 0.01)")->type_name("X")
      ->check(non_negative_number());
  app.add_option("--eval-interval", c.eval_interval, "steps between held-out evaluations (default 50)")
      ->type_name("N")->transform(integer_at_least(1));
  app.add_option("--test-sequences", c.test_sequences, "held-out sequences (default 512)")->type_name("N")
      ->transform(integer_at_least(1));
  app.add_option("--seed", c.seed, "seed of the weights and the data (default 1)")->type_name("S")
      ->transform(integer_at_least(0));
  app.add_option("--threads", o.threads,
                 "kernel threads (default 1: the model is small); results do not depend on it")
      ->type_name("N")->transform(integer_in(1, 256));
  app.add_option("--summary", o.summary, "write the measurements as JSON")->type_name("FILE")->check(cli_checks::file_name());
  app.add_option("--report", o.report, "write a page: the loss curve, both heads' patterns, the scores, "
                                       "the path ablation")
      ->type_name("FILE.html")->check(cli_checks::file_name());
  app.add_option("--save-initial", o.initial_weights,
                 "write the initial weights (TransformerLens names) and every step's training batch, as safetensors")
      ->type_name("FILE")->check(cli_checks::file_name());
  app.add_option("--save-model", o.trained_weights,
                 "write the trained model (TransformerLens names, safetensors; the summary's transformer_lens_config "
                 "builds it in Python)")
      ->type_name("FILE")->check(cli_checks::file_name());
  app.add_flag("--float64", o.float64, "Float64 parameters (default Float32), e.g. to compare with another "
                                       "implementation to rounding");
  app.add_flag("--quiet", o.quiet, "no progress lines");
}

void finish_options(Options& o) {
  o.study.task.training = o.train_on == "repeat" ? Training::Repeat : Training::Markov;
  if (o.float64) o.study.dtype = ag::Dtype::Float64;
  o.study.check();
  if (!o.initial_weights.empty() && o.study.steps > kMaxSavedTokens / o.study.batch / o.study.task.seq_len)
    throw std::invalid_argument(fmt::format("--save-initial: --steps {} of --batch {} x --seq-len {} training tokens "
                                            "exceed the {} the file may hold",
                                            o.study.steps, o.study.batch, o.study.task.seq_len, kMaxSavedTokens));
  cli_checks::check_outputs({{"--summary", o.summary}, {"--report", o.report}, {"--save-initial", o.initial_weights},
                             {"--save-model", o.trained_weights}});
}

int run(const Options& o) {
  const StudyConfig& c = o.study;
  if (!o.quiet)
    fmt::print("task: {}\nmodel: 2 attention-only layers, d_model {}, {} heads; AdamW lr {}, batch {}, {} steps, "
               "seed {}\n",
               c.task.describe(), c.d_model, c.n_heads, c.lr, c.batch, c.steps, c.seed);
  const auto progress = [&](const CurvePoint& p) {
    if (o.quiet) return;
    fmt::print("step {:>5}: train loss {:.3f}; held-out loss {:.3f}, first occurrences {:.3f}, repeated {:.3f}, "
               "in-context score {:+.3f}\n",
               p.step, p.train_loss, p.test.all, p.test.first_occurrence, p.test.repeated, p.test.in_context_score);
    std::fflush(stdout);
  };
  const StudyResult r = run_study(c, {.progress = progress, .initial_weights = o.initial_weights, .trained_weights = o.trained_weights});
  fmt::print("trained in {:.1f} s ({:.0f} steps/s, {} thread{}); measured in {:.1f} s\n", r.train_seconds,
             static_cast<double>(c.steps) / r.train_seconds, r.threads, r.threads == 1 ? "" : "s", r.measure_seconds);
  fmt::print("phase change (in-context score at half its final value and below from then on): {}\n",
             r.phase_change_step ? fmt::format("step {}", *r.phase_change_step) : std::string("none"));
  fmt::print("heads (previous-token / induction / duplicate-token score; mean i - j, mean j / i, mean largest weight):\n");
  for (const auto& h : r.heads)
    fmt::print("  L{}H{}: {:.3f} / {:.3f} / {:.3f}; {:.2f}, {:.3f}, {:.3f}\n", h.layer, h.head, h.previous_token, h.induction,
               h.duplicate_token, h.mean_offset, h.mean_relative_position, h.mean_max_weight);
  fmt::print("previous-token head L0H{}, induction head L1H{}; K-composition {:.3f} (random baseline {:.3f} +- {:.3f})\n",
             r.previous_token_head, r.induction_head, r.k_composition, r.k_composition_baseline,
             r.k_composition_baseline_std);
  std::string removed;
  for (std::int64_t h : r.ablated_heads) removed += fmt::format("{}L0H{}", removed.empty() ? "" : " + ", h);
  for (const auto& a : r.path_ablation)
    fmt::print("previous-token heads ({}) removed from layer 1's {}: induction score {:.3f}, loss {:.3f} (repeated "
               "{:.3f})\n",
               removed, a.input, a.induction_score, a.loss.all, a.loss.repeated);
  bool all = true;
  for (const auto& g : goals(r)) {
    fmt::print("goal {}: {} ({})\n", g.name, g.met ? "met" : "NOT met", g.measured);
    all = all && g.met;
  }
  fmt::print("{}\n", all ? "the induction circuit formed" : "the induction circuit did not form (see the goals)");
  if (!o.summary.empty()) {
    html::write_file(o.summary, summary_json(r).dump(1) + "\n");
    fmt::print("summary: {}\n", o.summary);
  }
  if (!o.report.empty()) {
    html::write_file(o.report, report_html(r));
    fmt::print("report: {}\n", o.report);
  }
  if (!o.initial_weights.empty()) fmt::print("initial weights and training batches: {}\n", o.initial_weights);
  if (!o.trained_weights.empty()) fmt::print("trained model: {}\n", o.trained_weights);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"induction_heads: the induction-head circuit of a 2-layer attention-only transformer, trained and "
               "measured"};
  Options o;
  add_options(app, o);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return cli_checks::finish_stdout("induction_heads", app.exit(e));  // --help
    cli_checks::report_error("induction_heads", std::string(e.what()) + " (try --help)");
    return 1;
  }
  try {
    finish_options(o);
    ag::set_num_threads(o.threads);
    return cli_checks::finish_stdout("induction_heads", run(o));
  } catch (const std::bad_alloc&) {
    cli_checks::report_error("induction_heads", "ran out of memory: the sizes asked for need more than this machine has "
                                    "(see --help for the flags that set them)");
    return 1;
  } catch (const std::exception& e) {
    cli_checks::report_error("induction_heads", e.what());
    return 1;
  }
}
