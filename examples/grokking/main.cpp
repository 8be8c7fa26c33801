// grokking — grokking of modular addition (Power et al. 2022) as Nanda et al. 2023 set it up
// (TransformerLens's Grokking demo): a 1-layer transformer memorises a + b mod 113 on 30 % of the
// pairs within a few hundred steps and generalises to the rest thousands of steps later; the
// embedding ends up carried by a few Fourier frequencies, and the restricted and excluded losses
// show the generalising circuit forming before the test loss falls.
//
//   grokking                                   # the full run: p = 113, 25,000 steps
//   grokking --quick                           # p = 53, 2,000 steps: 99 % test accuracy within a minute
//   grokking --quick --summary s.json --report r.html
//   grokking --help
#include <new>
#include <stdexcept>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cli_checks.hpp"
#include "grokking.hpp"
#include "html_page.hpp"
#include "report.hpp"

namespace ag = autograd;

namespace {

struct Options {
  grokking::Config config;
  bool quick = false;
  int threads = 1;
  std::string summary, report, initial_weights, trained_weights;
  bool quiet = false, float64 = false;
};

// The flags given on the command line override the configuration (--quick's or the full one).
struct Given {
  std::optional<std::int64_t> p, steps, eval_interval, snapshot_interval, d_model, heads, d_mlp;
  std::optional<double> train_fraction, lr, weight_decay;
  std::optional<std::uint64_t> seed;
};

void add_options(CLI::App& app, Options& o, Given& g) {
  using cli_checks::integer_at_least, cli_checks::integer_in, cli_checks::non_negative_number,
      cli_checks::positive_number;
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_flag("--quick", o.quick,
               "p = 53, 60 % of the pairs for training, 2,000 steps (99 % test accuracy within a minute; with "
               "this many pairs there is no long plateau)");
  app.add_option("--p", g.p, "the modulus, a prime (default 113; 53 with --quick)")->type_name("P")
      ->transform(integer_in(5, 1000));
  app.add_option("--train-fraction", g.train_fraction, "the pairs used for training (default 0.3; 0.6 with --quick)")
      ->type_name("X")->check(cli_checks::number_between(0, 1));
  app.add_option("--steps", g.steps, "full-batch AdamW steps (default 25000; 2000 with --quick)")->type_name("N")
      ->transform(integer_at_least(1));
  app.add_option("--d-model", g.d_model, "model width (default 128)")->type_name("D")->transform(integer_at_least(1));
  app.add_option("--heads", g.heads, "attention heads (default 4)")->type_name("H")->transform(integer_at_least(1));
  app.add_option("--d-mlp", g.d_mlp, "MLP width (default 512)")->type_name("N")->transform(integer_at_least(1));
  app.add_option("--lr", g.lr, "AdamW's learning rate (default 1e-3)")->type_name("X")->check(positive_number());
  app.add_option("--weight-decay", g.weight_decay, "AdamW's weight decay (default 1.0)")->type_name("X")
      ->check(non_negative_number());
  app.add_option("--eval-interval", g.eval_interval, "steps between test-set evaluations (default 100; 50 with --quick)")
      ->type_name("N")->transform(integer_at_least(1));
  app.add_option("--snapshot-interval", g.snapshot_interval,
                 "steps between the snapshots the progress measures are taken at (default 500; 100 with --quick)")
      ->type_name("N")->transform(integer_at_least(1));
  app.add_option("--seed", g.seed, "seed of the weights and the data split (default 1)")->type_name("S")
      ->transform(integer_at_least(0));
  app.add_option("--threads", o.threads, "kernel threads (default 1: the model is small); results do not depend on it")->type_name("N")
      ->transform(integer_in(1, 256));
  app.add_option("--summary", o.summary, "write the measurements as JSON")->type_name("FILE")->check(cli_checks::file_name());
  app.add_option("--report", o.report,
                 "write a page: the loss and accuracy curves, the embedding's Fourier spectrum, the progress measures")
      ->type_name("FILE.html")->check(cli_checks::file_name());
  app.add_option("--save-initial", o.initial_weights,
                 "write the initial weights (TransformerLens names) and the training rows, as safetensors")
      ->type_name("FILE")->check(cli_checks::file_name());
  app.add_option("--save-model", o.trained_weights,
                 "write the trained model (TransformerLens names, safetensors; the summary's transformer_lens_config "
                 "builds it in Python)")
      ->type_name("FILE")->check(cli_checks::file_name());
  app.add_flag("--float64", o.float64, "Float64 parameters (default Float32), e.g. to compare with another "
                                       "implementation to rounding");
  app.add_flag("--quiet", o.quiet, "no progress lines");
}

void finish_options(Options& o, const Given& g) {
  grokking::Config& c = o.config;
  if (o.quick) c = grokking::Config::quick();
  if (g.p) c.p = *g.p;
  if (g.train_fraction) c.train_fraction = *g.train_fraction;
  if (g.steps) c.steps = *g.steps;
  if (g.d_model) c.d_model = *g.d_model;
  if (g.heads) c.n_heads = *g.heads;
  if (g.d_mlp) c.d_mlp = *g.d_mlp;
  if (g.lr) c.lr = *g.lr;
  if (g.weight_decay) c.weight_decay = *g.weight_decay;
  if (g.eval_interval) c.eval_interval = *g.eval_interval;
  if (g.snapshot_interval) c.snapshot_interval = *g.snapshot_interval;
  if (g.seed) c.seed = *g.seed;
  if (o.float64) c.dtype = ag::Dtype::Float64;
  c.check();
  cli_checks::check_outputs({{"--summary", o.summary}, {"--report", o.report}, {"--save-initial", o.initial_weights},
                             {"--save-model", o.trained_weights}});
}

std::string step_or_none(const std::optional<std::int64_t>& s) { return s ? fmt::format("step {}", *s) : "never"; }

int run(const Options& o) {
  const grokking::Config& c = o.config;
  if (!o.quiet)
    fmt::print("task: {}\nmodel: 1 layer, d_model {}, {} heads, d_mlp {}, ReLU, no LayerNorm; full-batch AdamW lr {}, "
               "weight decay {}, betas ({}, {}); {} steps, seed {}\n",
               c.describe(), c.d_model, c.n_heads, c.d_mlp, c.lr, c.weight_decay, c.beta1, c.beta2, c.steps, c.seed);
  grokking::Outputs outputs;
  outputs.initial_weights = o.initial_weights;
  outputs.trained_weights = o.trained_weights;
  if (!o.quiet)
    outputs.progress = [](const grokking::CurvePoint& p) {
      fmt::print("step {:>6}: train loss {:.3e} accuracy {:6.2f} %; test loss {:.3e} accuracy {:6.2f} %\n", p.step,
                 p.train_loss, 100 * p.train_accuracy, p.test_loss, 100 * p.test_accuracy);
      std::fflush(stdout);
    };
  const grokking::Result r = grokking::run(c, outputs);
  fmt::print("trained in {:.1f} s ({:.1f} steps/s, {} thread{}); measured in {:.1f} s\n", r.train_seconds,
             static_cast<double>(c.steps) / r.train_seconds, r.threads, r.threads == 1 ? "" : "s", r.measure_seconds);
  fmt::print("memorised (train accuracy >= 99 %): {}; grokked (test accuracy >= 99 %): {}\n",
             step_or_none(r.memorized_step), step_or_none(r.grokked_step));
  fmt::print("test loss peak: {:.3f} at step {}\n", r.test_loss_peak.test_loss, r.test_loss_peak.step);
  fmt::print("final: train loss {:.3e}, test loss {:.3e}, test accuracy {:.2f} %\n", r.final_point.train_loss,
             r.final_point.test_loss, 100 * r.final_point.test_accuracy);
  std::string keys;
  for (auto k : r.key_frequencies) keys += fmt::format("{}{}", keys.empty() ? "" : ", ", k);
  fmt::print("key frequencies of the embedding: {} ({:.1f} % of its non-constant squared norm)\n", keys,
             100 * r.progress.back().key_share);
  fmt::print("progress measures at the end: restricted loss {:.3e} (test pairs), excluded loss {:.3e} (training "
             "pairs)\n",
             r.progress.back().restricted_loss, r.progress.back().excluded_loss);
  if (!o.summary.empty()) {
    html::write_file(o.summary, grokking::summary_json(r).dump(1) + "\n");
    fmt::print("summary: {}\n", o.summary);
  }
  if (!o.report.empty()) {
    html::write_file(o.report, grokking::report_html(r));
    fmt::print("report: {}\n", o.report);
  }
  if (!o.initial_weights.empty()) fmt::print("initial weights: {}\n", o.initial_weights);
  if (!o.trained_weights.empty()) fmt::print("trained model: {}\n", o.trained_weights);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"grokking: a 1-layer transformer learning a + b mod p, memorising first and generalising later"};
  Options o;
  Given g;
  add_options(app, o, g);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return cli_checks::finish_stdout("grokking", app.exit(e));  // --help
    cli_checks::report_error("grokking", std::string(e.what()) + " (try --help)");
    return 1;
  }
  try {
    finish_options(o, g);
    ag::set_num_threads(o.threads);
    return cli_checks::finish_stdout("grokking", run(o));
  } catch (const std::bad_alloc&) {
    cli_checks::report_error("grokking", "ran out of memory: the sizes asked for need more than this machine has "
                                    "(see --help for the flags that set them)");
    return 1;
  } catch (const std::exception& e) {
    cli_checks::report_error("grokking", e.what());
    return 1;
  }
}
