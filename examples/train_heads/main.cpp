// train_heads — does attention need several heads? A measured answer to the seed's claim that
// one head "can only average the values one way", while several heads can each learn a
// different relationship ("one head might learn to look at the previous word, another at the
// sentence's subject").
//
// The task (heads_task.hpp): sequences of T random tokens x_0 .. x_{T-1} from a vocabulary of V;
// at every position t >= 1 the model must output y_t = x_{t-1} - x_0, the signed difference
// between the previous token and the first token (2V - 1 classes). Each position needs two
// relationships at once — "previous token" and "first token" — and in order: averaging the two
// tokens loses which one is subtracted.
//
// The model (heads_model.hpp): token + position embeddings, ONE pre-LayerNorm transformer block,
// a final LayerNorm and a linear readout. The 1-head and 2-head models have the same d_model, the
// same parameter count (the split is only a reshape of the projections), the same initial weights
// (drawn from the same seed) and see the same training batches: only the split differs. Each
// head's focus is measured afterwards from its attention weights on held-out sequences, not
// assumed. The reports are in report_terminal, report_svg and report_json.
//
//   train_heads                          # 1 head, then 2 heads, and the comparison
//   train_heads --heads 2 --seed 7 --summary run.json
//   train_heads --load train_heads_out/model_2_heads.torch.safetensors   # rebuilt from the file alone
//   train_heads --help
//
// Each trained model is saved twice (unless --no-files): model_<N>_heads.safetensors in headgrad's
// naming (nn::save_parameters) and model_<N>_heads.torch.safetensors in PyTorch's
// (nn::save_torch_state_dict: loads into torch.nn.TransformerEncoderLayer-based code, see
// docs/torch_interop.md). Both carry the model's configuration, so --load needs nothing else.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nn/nn.hpp>

#include "cli_checks.hpp"
#include "heads_model.hpp"
#include "heads_task.hpp"
#include "report.hpp"
#include "report_html.hpp"
#include "report_json.hpp"
#include "report_study.hpp"
#include "report_svg.hpp"
#include "report_terminal.hpp"

namespace ag = autograd;
using namespace heads;

namespace {

struct Config {
  std::vector<std::int64_t> heads = {1, 2};  // --heads N trains only N
  std::uint64_t seed = 1;
  Task task;
  std::int64_t d_model = 32;
  std::int64_t d_ff = 128;
  std::int64_t batch = 64;
  std::int64_t steps = 2000;
  std::int64_t warmup = 100;
  double lr = 3e-3;
  double weight_decay = 0.01;
  double clip = 1.0;
  std::int64_t test_sequences = 1024;
  int threads = 1;
  std::string summary;
  std::string report;            // --report FILE.html
  std::int64_t snapshots = 16;   // held-out snapshots along training for the report
  std::string out_dir = "train_heads_out";
  std::string load;  // --load FILE: evaluate a saved model instead of training
  bool write_files = true;  // pictures and trained models in out_dir
  bool quiet = false;
  bool mlp = true;
};

const std::map<std::string, TaskKind> kTasks = {
    {"difference", TaskKind::Difference}, {"modular", TaskKind::Modular}, {"pair", TaskKind::Pair}};

CLI::Validator task_name() {
  return {[](std::string& text) -> std::string {
            if (kTasks.count(text)) return {};
            return fmt::format("'{}' is not one of difference, modular, pair", text);
          },
          "difference|modular|pair"};
}

void add_options(CLI::App& app, Config& c) {
  using cli_checks::integer_at_least, cli_checks::positive_number;
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // a repeated option: the last wins
  app.add_option_function<std::int64_t>("--heads", [&c](std::int64_t n) { c.heads = {n}; },
                                        "train only an N-head model (default: 1 head, then 2 heads)")
      ->type_name("N")->transform(integer_at_least(1));
  app.add_option("--seed", c.seed, "seed for weights and data (default 1)")->type_name("S")->transform(integer_at_least(0));
  app.add_option("--summary", c.summary, "write a JSON summary")->type_name("FILE");
  app.add_option("--report", c.report,
                 "write a page to open in a browser: curves, attention maps along training, dL/dA,\n"
                 "ablation and patching (measured on held-out sequences)")
      ->type_name("FILE.html");
  app.add_option("--snapshots", c.snapshots, "held-out snapshots along training in the report (default 16)")
      ->type_name("N")->transform(integer_at_least(1));
  app.add_option("--out", c.out_dir, "directory for the pictures and trained models (default train_heads_out)")
      ->type_name("DIR");
  app.add_flag_callback("--no-files", [&c] { c.write_files = false; }, "write no pictures or models");
  app.add_option("--load", c.load,
                 "no training: rebuild a model that train_heads saved (either naming) from the file alone\n"
                 "and measure it on held-out sequences of its task (drawn from --seed)")
      ->type_name("FILE");
  app.add_option("--steps", c.steps, "training steps (default 2000)")->type_name("N")->transform(integer_at_least(1));
  app.add_option("--batch", c.batch, "sequences per step (default 64)")->type_name("N")->transform(integer_at_least(1));
  app.add_option("--seq-len", c.task.seq_len, "sequence length (default 12)")->type_name("T")->transform(integer_at_least(3));
  app.add_option("--vocab", c.task.vocab, "vocabulary size (default 24)")->type_name("V")->transform(integer_at_least(2));
  app.add_option("--d-model", c.d_model, "model width (default 32)")->type_name("D")->transform(integer_at_least(1));
  app.add_option("--d-ff", c.d_ff, "MLP width (default 128)")->type_name("F")->transform(integer_at_least(1));
  app.add_option("--lr", c.lr, "peak learning rate of AdamW, warmup then cosine (default 3e-3)")
      ->type_name("X")->check(positive_number());
  app.add_option_function<std::string>("--task", [&c](const std::string& name) { c.task.kind = kTasks.at(name); },
                                       "difference (default): y = x_(t-1) - x_0;  modular: (x_(t-1) - x_0) mod V;\n"
                                       "pair: y = (x_0, x_(t-1)) as one of V*V classes")
      ->type_name("NAME")->check(task_name());
  app.add_flag_callback("--attention-only", [&c] { c.mlp = false; },
                        "no MLP in the block: attention, residual, LayerNorm, linear readout");
  app.add_option("--threads", c.threads,
                 "kernel threads (default 1: this model is so small that more threads only add\n"
                 "synchronisation); same seed and thread count give the same losses bit for bit")
      ->type_name("N")->transform(cli_checks::integer_in(1, 256));
  app.add_flag("--quiet", c.quiet, "no progress line");
}

// An output file's directory exists, the path is not a directory and a file can be written
// there: checked before training, so that a typo does not cost the run. An existing file is left
// as it is until the run has its replacement.
void check_output_path(const std::string& option, const std::string& path) {
  if (path.empty()) return;
  const std::filesystem::path p(path);
  const std::filesystem::path dir = p.has_parent_path() ? p.parent_path() : std::filesystem::path(".");
  if (std::filesystem::is_directory(p))
    throw std::invalid_argument(fmt::format("{} {}: is a directory, wanted a file name", option, path));
  if (!std::filesystem::is_directory(dir))
    throw std::invalid_argument(fmt::format("{} {}: directory {} does not exist", option, path, dir.string()));
  try {
    html::check_writable(path);
  } catch (const std::exception& e) {
    throw std::invalid_argument(fmt::format("{} {}: {}", option, path, e.what()));
  }
}

// The files a training run writes into --out (save_model, write_pictures): the directory is made
// and each file checked before training.
void check_out_dir(const Config& c) {
  std::error_code ec;
  std::filesystem::create_directories(c.out_dir, ec);
  if (ec || !std::filesystem::is_directory(c.out_dir))
    throw std::invalid_argument(fmt::format("--out {}: cannot make the directory ({})", c.out_dir,
                                            ec ? ec.message() : "a file of that name exists"));
  std::vector<std::string> names = {"loss.svg"};
  for (auto h : c.heads)
    for (const char* name : {"model_{}_heads.safetensors", "model_{}_heads.torch.safetensors", "attention_{}_heads.svg"})
      names.push_back(fmt::format(fmt::runtime(name), h));
  for (const auto& name : names) {
    try {
      html::check_writable(c.out_dir + "/" + name);
    } catch (const std::exception& e) {
      throw std::invalid_argument(fmt::format("--out {}: {}", c.out_dir, e.what()));
    }
  }
}

// The checks that involve more than one option, and the derived settings.
void finish_config(Config& c) {
  check_output_path("--summary", c.summary);
  check_output_path("--report", c.report);
  for (auto h : c.heads)
    if (c.d_model % h != 0)
      throw std::invalid_argument(fmt::format("--d-model {} is not divisible by {} heads", c.d_model, h));
  c.warmup = std::min(c.warmup, c.steps / 10);
  if (!c.summary.empty() && !c.report.empty() &&
      std::filesystem::weakly_canonical(std::filesystem::absolute(c.summary)) ==
          std::filesystem::weakly_canonical(std::filesystem::absolute(c.report)))
    throw std::invalid_argument(fmt::format("--summary and --report name the same file, {}", c.report));
  if (c.load.empty() && c.write_files) check_out_dir(c);
}

JobInfo job_info(const Config& c) {
  return {.task = c.task.describe(), .mlp = c.mlp, .vocab = c.task.vocab, .seq_len = c.task.seq_len,
          .d_model = c.d_model, .steps = c.steps, .classes = c.task.classes(), .seed = c.seed,
          .threads = ag::get_num_threads()};
}

// For the report: held-out accuracy, loss and mean attention at step 0, every steps/snapshots
// steps and at the last step. Their time is the report's, not training's.
void snapshot(HeadsModel& model, const Config& c, const Batch& test, std::int64_t step, RunRecord& r) {
  const std::int64_t every = std::max<std::int64_t>(1, c.steps / c.snapshots);
  if (c.report.empty() || (step % every != 0 && step != c.steps)) return;
  const auto start = std::chrono::steady_clock::now();
  r.study.snapshots.push_back(take_snapshot(model, test, step));
  r.study.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The report's measurements on the trained model: dL/dA per head, and patching from 256 test
// sequences into the same with x_0 replaced.
void study(HeadsModel& model, const Config& c, const Batch& test, RunRecord& r) {
  if (c.report.empty()) return;
  const auto start = std::chrono::steady_clock::now();
  r.study.attention_grad = attention_gradient(model, test);
  r.study.patching = patch_heads(model, c.task, test, 256);
  r.study.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Accuracy, loss and each head's focus on the held-out sequences, never trained on, the accuracy
// with each head ablated, and the attention weights of the first of them.
void evaluate(HeadsModel& model, const Config& c, const Batch& test, RunRecord& r) {
  ag::NoGradGuard no_grad;
  model.eval();
  const auto out = model.forward_with_weights(test.token_tensor);
  r.accuracy = batch_accuracy(out.logits, test.targets);
  r.test_loss = nn::cross_entropy(out.logits, test.targets, {.ignore_index = kIgnore}).item();
  r.focus = measure_focus(out.weights);
  r.ablation = ablate_heads(model, test);
  const std::int64_t T = c.task.seq_len;
  r.sample = {.heads = r.heads, .length = T,
              .weights = ag::narrow(out.weights, 0, 0, 1).detach().to_vector(),
              .tokens = {test.tokens.begin(), test.tokens.begin() + T}};
}

std::string task_name(TaskKind kind) {
  for (const auto& [name, k] : kTasks)
    if (k == kind) return name;
  return "difference";
}

// The trained model in headgrad's naming and in PyTorch's; both files carry its configuration
// (nn::module_config) and the task, so that --load (or Python) needs nothing else.
void save_model(const HeadsModel& model, const Config& c, const RunRecord& r) {
  std::filesystem::create_directories(c.out_dir);
  const nn::Metadata metadata = {{"task", c.task.describe()}, {"task_kind", task_name(c.task.kind)},
                                 {"num_heads", std::to_string(r.heads)},
                                 {"test_accuracy", fmt::format("{:.4f}", r.accuracy)}};
  const std::string stem = fmt::format("{}/model_{}_heads", c.out_dir, r.heads);
  nn::save_parameters(model, stem + ".safetensors", metadata);
  nn::save_torch_state_dict(model, stem + ".torch.safetensors", metadata);
}

// --load: the model rebuilt from its file, measured on held-out sequences of the file's task.
void evaluate_saved(const Config& c) {
  const std::unique_ptr<HeadsModel> model = load_heads_model(c.load);
  const HeadsModelOptions o = heads_options_from_config(nn::read_module_config(c.load));
  const nn::Metadata metadata = nn::load_safetensors(c.load).metadata;
  Task task = c.task;
  if (const auto kind = metadata.find("task_kind"); kind != metadata.end() && kTasks.count(kind->second))
    task.kind = kTasks.at(kind->second);
  task.vocab = o.vocab;
  task.seq_len = o.seq_len;
  if (task.classes() != o.classes)
    throw std::invalid_argument(fmt::format("--load {}: the readout has {} classes but the task \"{}\" has {}", c.load,
                                            o.classes, task.describe(), task.classes()));
  ag::Generator test_gen(c.seed * 0x9E3779B97F4A7C15ull + 2);
  const Batch test = make_batch(test_gen, task, c.test_sequences);
  ag::NoGradGuard no_grad;
  model->eval();
  const ag::Tensor logits = model->forward(test.token_tensor);
  fmt::print("{}: {} head{}, d_model {}, {}, {} parameters; task {}\n", c.load, o.heads, o.heads == 1 ? "" : "s",
             o.d_model, o.mlp ? "with MLP" : "attention only", model->num_parameters(), task.describe());
  fmt::print("test accuracy {:.4f} on {} held-out sequences (seed {})\n", batch_accuracy(logits, test.targets),
             c.test_sequences, c.seed);
}

RunRecord train(const Config& c, std::int64_t heads) {
  // Same seeds for every head count: identical initial weights and identical batches.
  ag::Generator init_gen(c.seed);
  ag::Generator data_gen(c.seed * 0x9E3779B97F4A7C15ull + 1);
  ag::Generator test_gen(c.seed * 0x9E3779B97F4A7C15ull + 2);
  const Batch test = make_batch(test_gen, c.task, c.test_sequences);  // held out: never trained on
  HeadsModel model({.vocab = c.task.vocab, .seq_len = c.task.seq_len, .d_model = c.d_model, .d_ff = c.d_ff,
                    .heads = heads, .classes = c.task.classes(), .mlp = c.mlp},
                   init_gen);
  const std::vector<ag::Tensor> params = model.parameters();
  nn::AdamW opt(params, {.lr = c.lr, .weight_decay = c.weight_decay});
  nn::LRScheduler sched(opt, nn::warmup_cosine_lr(c.lr, c.warmup, c.steps, c.lr * 0.05));
  const nn::CrossEntropyOptions ce{.ignore_index = kIgnore};
  RunRecord r;
  r.heads = heads;
  r.parameters = model.num_parameters();
  Progress progress(!c.quiet, c.steps, fmt::format("{} head{}", heads, heads == 1 ? "" : "s"));
  const auto start = std::chrono::steady_clock::now();
  double batch_acc = 0.0;  // shown in the progress line, refreshed every 10 steps
  snapshot(model, c, test, 0, r);
  for (std::int64_t step = 1; step <= c.steps; ++step) {
    const Batch b = make_batch(data_gen, c.task, c.batch);
    const ag::Tensor logits = model.forward(b.token_tensor);
    ag::Tensor loss = nn::cross_entropy(logits, b.targets, ce);
    const double value = loss.item();
    if (!std::isfinite(value)) {  // nothing after this step would mean anything
      progress.finish();
      throw std::runtime_error(fmt::format("{} head{}: the training loss is {} at step {}; the learning rate (--lr {}) is "
                                           "likely too large",
                                           heads, heads == 1 ? "" : "s", value, step, c.lr));
    }
    opt.zero_grad();
    loss.backward();
    nn::clip_grad_norm_(params, c.clip);
    opt.step();
    sched.step();
    r.losses.push_back(value);
    snapshot(model, c, test, step, r);
    if (c.quiet) continue;
    const bool last = step == c.steps;
    if (step % 10 == 1 || last) batch_acc = batch_accuracy(logits, b.targets);
    progress.update(step, r.losses.back(), batch_acc, last);
  }
  progress.finish();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() - r.study.seconds;
  const std::size_t tail = std::min<std::size_t>(50, r.losses.size());
  for (std::size_t i = r.losses.size() - tail; i < r.losses.size(); ++i) r.final_loss += r.losses[i] / static_cast<double>(tail);
  evaluate(model, c, test, r);
  study(model, c, test, r);
  if (c.write_files) save_model(model, c, r);
  return r;
}

void write_pictures(const std::vector<RunRecord>& runs, const Config& c) {
  std::filesystem::create_directories(c.out_dir);
  for (const auto& r : runs) write_text_file(fmt::format("{}/attention_{}_heads.svg", c.out_dir, r.heads), attention_svg(r));
  write_text_file(c.out_dir + "/loss.svg", loss_svg(runs, std::log(static_cast<double>(c.task.classes()))));
  fmt::print("pictures: {0}/loss.svg, {0}/attention_<N>_heads.svg; trained models: {0}/model_<N>_heads.safetensors "
             "(PyTorch's naming: .torch.safetensors)\n",
             c.out_dir);
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  CLI::App app("Trains a one-block transformer with 1 head and with 2 heads (same d_model, same parameter\n"
               "count, same initial weights, same data) on y_t = x_(t-1) - x_0, and reports test accuracy\n"
               "and where each head attends.",
               "train_heads");
  add_options(app, c);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help: the usage
    fmt::print(stderr, "train_heads: {} (try --help)\n", e.what());
    return 1;
  }
  try {
    finish_config(c);
    ag::set_num_threads(c.threads);
    if (!c.load.empty()) {
      evaluate_saved(c);
      return 0;
    }
    const JobInfo job = job_info(c);
    print_job(job);
    std::vector<RunRecord> runs;
    for (auto heads : c.heads) {
      runs.push_back(train(c, heads));
      print_run(runs.back(), job);
    }
    print_comparison(runs);
    if (c.write_files) write_pictures(runs, c);
    if (!c.report.empty()) {
      write_report(c.report, runs, job);
      double seconds = 0;
      for (const auto& r : runs) seconds += r.study.seconds;
      fmt::print("report: {} (its measurements took {:.1f} s)\n", c.report, seconds);
    }
    if (!c.summary.empty()) {
      write_text_file(c.summary, summary_json(runs, job).dump(2) + "\n");
      fmt::print("summary: {}\n", c.summary);
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "train_heads: {}\n", e.what());
    return 1;
  }
  return 0;
}
