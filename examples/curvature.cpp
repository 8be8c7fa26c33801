// curvature — how sharp is the loss of train_heads' model, with 1 head against 2 heads?
//
// The top eigenvalue of the Hessian of the held-out loss, λ_max, is the curvature along the
// sharpest direction in parameter space (a plain gradient step is stable only while lr < 2/λ_max).
// The Hessian of this model has tens of thousands of rows and is never built: it is seen only
// through Hessian-vector products H·v, each one backward pass through the graph of the gradient
// (ag::grad with create_graph, then ag::grad of g·v), and power iteration on those products gives
// λ_max. It is measured at several steps while train_heads' model is trained as train_heads trains
// it (same seeds, data and optimiser, in float64), for 1 head and for 2 heads (same parameter count,
// same initial weights, same batches). At the end, one training step on the penalised loss
// L + λ‖∇_θ L‖² (a gradient penalty: backward through a gradient) is checked against central
// differences of the penalised loss, and against ∇L + 2λ·H∇L.
//
//   curvature                        # 1 head and 2 heads, seed 1
//   curvature --seeds 1,2,3 --json curvature.json
//   curvature --quick --check        # a small model in seconds; exit 1 when a check fails
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <nn/nn.hpp>

#include "cli_checks.hpp"
#include "curvature_study.hpp"
#include "html_page.hpp"
#include "report.hpp"
#include "svg_charts.hpp"

namespace ag = autograd;
using namespace curvature;

namespace {

struct Options {
  StudyConfig study;
  std::vector<std::int64_t> heads = {1, 2};
  std::vector<std::uint64_t> seeds = {1};
  std::string json;
  std::string svg;      // a chart of log10 λ_max along training
  bool quick = false;   // a small model and few steps
  bool check = false;   // exit 1 when a check fails
  bool quiet = false;
  int threads = 1;
};

void add_options(CLI::App& app, Options& o) {
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  using cli_checks::integer_at_least, cli_checks::positive_number;
  app.add_option("--heads", o.heads, "head counts to compare (default 1,2)")->delimiter(',')->transform(integer_at_least(1));
  app.add_option("--seeds", o.seeds, "seeds for weights and data (default 1)")->delimiter(',')
      ->transform(integer_at_least(0));
  app.add_option("--steps", o.study.steps, "training steps (default 2000)")->transform(integer_at_least(1));
  app.add_option("--checkpoints", o.study.checkpoints, "steps at which λ_max is measured (default 0,100,250,500,750,1000,1500,2000)")
      ->delimiter(',')->transform(integer_at_least(0));
  app.add_option("--sequences", o.study.hessian_sequences, "held-out sequences of the measured loss (default 256)")
      ->transform(integer_at_least(1));
  app.add_option("--iterations", o.study.power.max_iterations, "most power iterations per measurement (default 100)")
      ->transform(integer_at_least(1));
  app.add_option("--tolerance", o.study.power.tolerance, "stop at ‖Hv − λv‖ <= tol·|λ| (default 1e-3)")
      ->check(positive_number());
  app.add_option("--penalty", o.study.penalty, "λ of the gradient-penalty step (default 0.1)")->check(positive_number());
  app.add_option("--penalty-lr", o.study.penalty_lr,
                 "learning rate of the penalty step (default: 1 / (λ_max·(1 + 2λ·λ_max)) from the last measurement)")
      ->check(positive_number());
  app.add_flag("--attention-only", [&o](std::int64_t) { o.study.mlp = false; }, "no MLP in the block");
  app.add_option("--json", o.json, "write every measurement as JSON")->type_name("FILE");
  app.add_option("--svg", o.svg, "write a chart of log10 lambda_max along training")->type_name("FILE.svg");
  app.add_flag("--quick", o.quick, "a small model (V=6, T=6, d_model=8) for 60 steps: seconds, not minutes");
  app.add_flag("--check", o.check,
               "exit 1 unless every power iteration converged, H is symmetric to 1e-9 and the penalty's\n"
               "gradient matches central differences and ∇L + 2λ·H∇L to 1e-6");
  app.add_option("--threads", o.threads, "kernel threads (default 1)")->transform(cli_checks::integer_in(1, 256));
  app.add_flag("--quiet", o.quiet, "no progress lines");
}

// An output path that cannot be written is refused before the study, naming its flag.
void check_output(const char* flag, const std::string& path) {
  try {
    html::check_writable(path);
  } catch (const std::exception& e) {
    throw std::invalid_argument(fmt::format("{} {}: {}", flag, path, e.what()));
  }
}

void make_quick(StudyConfig& s) {
  s.task.vocab = 6;
  s.task.seq_len = 6;
  s.d_model = 8;
  s.d_ff = 16;
  s.batch = 16;
  s.steps = 60;
  s.checkpoints = {0, 20, 60};
  s.hessian_sequences = 32;
  s.power = {.max_iterations = 1000, .tolerance = 1e-6};
}

void print_table(const std::vector<CurvatureRun>& runs) {
  fmt::print("\n{:>4} {:>5} {:>6} {:>8} {:>6} {:>8} {:>10} {:>6} {:>9} {:>8} {:>7}\n", "seed", "heads", "step",
             "loss", "acc", "|grad|", "lambda_max", "H·v's", "residual", "H·v ms", "fwd+bwd");
  for (const auto& r : runs)
    for (const auto& p : r.points)
      fmt::print("{:>4} {:>5} {:>6} {:>8.4f} {:>6.3f} {:>8.4f} {:>10.4f} {:>6} {:>9.1e}{} {:>7.2f} {:>7.2f}\n", r.seed,
                 r.heads, p.step, p.loss, p.accuracy, p.grad_norm, p.top.eigenvalue, p.top.iterations, p.top.residual,
                 p.top.converged ? " " : "*", p.hvp_ms, p.step_ms);
  bool any_stopped = false;
  for (const auto& r : runs)
    for (const auto& p : r.points) any_stopped = any_stopped || !p.top.converged;
  if (any_stopped) fmt::print("(* the power iteration stopped before its residual reached the tolerance)\n");
  fmt::print("\ngradient-penalty step, P = L + λ‖∇_θ L‖², one SGD step on ∇P (by backward through ∇L):\n");
  fmt::print("{:>4} {:>5} {:>6} {:>8} {:>10} {:>14} {:>14} {:>9} {:>9} {:>9} {:>8} {:>10}\n", "seed", "heads", "λ",
             "L", "‖∇L‖²", "∇P·d backward", "∇P·d central", "rel err", "vs 2λH∇L", "lr", "L after", "‖∇L‖² after");
  for (const auto& r : runs) {
    const auto& q = r.penalty;
    fmt::print("{:>4} {:>5} {:>6} {:>8.4f} {:>10.3e} {:>14.7e} {:>14.7e} {:>9.1e} {:>9.1e} {:>9.2e} {:>8.4f} {:>10.3e}\n",
               r.seed, r.heads, q.lambda, q.loss, q.penalty, q.directional, q.numeric, q.rel_error,
               q.second_route_error, q.lr, q.loss_after, q.penalty_after);
  }
}

// The mean λ_max over seeds at each checkpoint, per head count.
void print_summary(const std::vector<CurvatureRun>& runs, const Options& o) {
  if (o.seeds.size() < 2) return;
  fmt::print("\nmean lambda_max over {} seeds (min .. max):\n", o.seeds.size());
  for (auto h : o.heads) {
    fmt::print("  {} head{}:", h, h == 1 ? " " : "s");
    for (auto step : o.study.checkpoints) {
      double sum = 0, lo = 1e300, hi = -1e300;
      int n = 0;
      for (const auto& r : runs)
        for (const auto& p : r.points)
          if (r.heads == h && p.step == step) sum += p.top.eigenvalue, lo = std::min(lo, p.top.eigenvalue),
                                             hi = std::max(hi, p.top.eigenvalue), ++n;
      if (n) fmt::print("  step {}: {:.3f} ({:.3f} .. {:.3f})", step, sum / n, lo, hi);
    }
    fmt::print("\n");
  }
}

nlohmann::json to_json(const std::vector<CurvatureRun>& runs, const Options& o) {
  nlohmann::json out = {{"task", o.study.task.describe()}, {"d_model", o.study.d_model}, {"mlp", o.study.mlp},
                        {"steps", o.study.steps}, {"hessian_sequences", o.study.hessian_sequences},
                        {"tolerance", o.study.power.tolerance}, {"runs", nlohmann::json::array()}};
  for (const auto& r : runs) {
    nlohmann::json run = {{"num_heads", r.heads}, {"seed", r.seed}, {"parameters", r.parameters},
                          {"seconds", r.seconds}, {"points", nlohmann::json::array()}};
    for (const auto& p : r.points)
      run["points"].push_back({{"step", p.step}, {"loss", p.loss}, {"accuracy", p.accuracy},
                               {"grad_norm", p.grad_norm}, {"lambda_max", p.top.eigenvalue},
                               {"iterations", p.top.iterations}, {"residual", p.top.residual},
                               {"converged", p.top.converged}, {"history", p.top.history},
                               {"symmetry_error", p.symmetry_error}, {"hvp_ms", p.hvp_ms}, {"step_ms", p.step_ms}});
    const auto& q = r.penalty;
    run["penalty_step"] = {{"lambda", q.lambda}, {"loss", q.loss}, {"penalty", q.penalty},
                           {"directional_backward", q.directional}, {"directional_central", q.numeric},
                           {"rel_error", q.rel_error}, {"second_route_error", q.second_route_error},
                           {"lr", q.lr}, {"loss_after", q.loss_after}, {"penalty_after", q.penalty_after}};
    out["runs"].push_back(run);
  }
  return out;
}

// log10 λ_max against the step, one curve per run: blue shades for 1 head, orange for 2, ...
std::string chart(const std::vector<CurvatureRun>& runs) {
  static const char* colours[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"};
  svg::LineChart c;
  c.title = "Top Hessian eigenvalue of the held-out loss along training";
  c.x_label = "training step";
  c.y_label = "log10 lambda_max";
  for (const auto& r : runs) {
    svg::Series s;
    s.name = fmt::format("{} head{}, seed {}", r.heads, r.heads == 1 ? "" : "s", r.seed);
    s.colour = colours[static_cast<std::size_t>(r.heads - 1) % 5];
    s.markers = true;
    for (const auto& p : r.points) {
      s.x.push_back(static_cast<double>(p.step));
      s.y.push_back(std::log10(std::max(std::abs(p.top.eigenvalue), 1e-12)));
    }
    c.series.push_back(std::move(s));
  }
  return svg::line_chart_svg(c);
}

// What --check demands; each failure printed.
int failed_checks(const std::vector<CurvatureRun>& runs) {
  int failed = 0;
  auto demand = [&failed](bool ok, const std::string& what) {
    if (!ok) fmt::print(stderr, "curvature: check failed: {}\n", what), ++failed;
  };
  for (const auto& r : runs) {
    const std::string who = fmt::format("{} heads, seed {}", r.heads, r.seed);
    for (const auto& p : r.points) {
      demand(p.top.converged, fmt::format("{}, step {}: power iteration did not converge (residual {:.2e})", who,
                                          p.step, p.top.residual));
      demand(p.symmetry_error <= 1e-9, fmt::format("{}, step {}: uᵀHw vs wᵀHu differ by {:.2e}", who, p.step,
                                                   p.symmetry_error));
    }
    demand(r.penalty.rel_error <= 1e-6, fmt::format("{}: penalised gradient vs central differences: rel error {:.2e}",
                                                    who, r.penalty.rel_error));
    demand(r.penalty.second_route_error <= 1e-6,
           fmt::format("{}: ∇P vs ∇L + 2λ·H∇L: rel error {:.2e}", who, r.penalty.second_route_error));
  }
  return failed;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app("Top Hessian eigenvalue of train_heads' loss along training (power iteration on Hessian-vector\n"
               "products), 1 head against 2 heads, and a checked gradient-penalty step.",
               "curvature");
  add_options(app, o);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    fmt::print(stderr, "curvature: {} (try --help)\n", e.what());
    return 1;
  }
  try {
    if (o.quick) make_quick(o.study);
    for (auto h : o.heads)
      if (o.study.d_model % h != 0)
        throw std::invalid_argument(fmt::format("d_model {} is not divisible by {} heads", o.study.d_model, h));
    for (const auto& [flag, path] : {std::pair{"--json", o.json}, std::pair{"--svg", o.svg}})
      if (!path.empty()) check_output(flag, path);
    ag::set_num_threads(o.threads);
    fmt::print("task: {}; d_model {}, {}; {} steps; H of the mean loss on {} held-out sequences\n",
               o.study.task.describe(), o.study.d_model, o.study.mlp ? "with MLP" : "attention only", o.study.steps,
               o.study.hessian_sequences);
    std::vector<CurvatureRun> runs;
    for (auto seed : o.seeds)
      for (auto h : o.heads) runs.push_back(run_study(o.study, h, seed, !o.quiet));
    print_table(runs);
    print_summary(runs, o);
    if (!o.json.empty()) {
      heads::write_text_file(o.json, to_json(runs, o).dump(2) + "\n");
      fmt::print("json: {}\n", o.json);
    }
    if (!o.svg.empty()) {
      heads::write_text_file(o.svg, chart(runs));
      fmt::print("svg: {}\n", o.svg);
    }
    if (o.check) {
      const int failed = failed_checks(runs);
      fmt::print("checks: {}\n", failed ? fmt::format("{} failed", failed) : std::string("all passed"));
      if (failed) return 1;
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "curvature: {}\n", e.what());
    return 1;
  }
  return 0;
}
