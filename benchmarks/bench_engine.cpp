// Micro-benchmarks of the engine (medians; run with --threads 1 for stable figures):
//   op          one small op (a * b on [4] tensors) with graph recording, and without
//   backward    backward() on a tiny graph (sum(a * b + a), [4] leaves): build + backward minus build
//   core        the fused attention core against the composed one (MultiHeadAttention, fwd + bwd),
//               interleaved sample by sample, at the toy and medium shapes
//   train       the toy example's model (examples/train_heads/: embedding, one pre-LN transformer
//               block, readout, cross-entropy, AdamW, clipping) — steps per second, and heap
//               allocations (count and bytes) per step once warm, counted by the operator new below
//   memory      peak resident memory of one forward + backward of MultiHeadAttention at the large
//               shape (getrusage), above what the module and input take; run it alone
//               (`bench_engine memory`), since the peak is a high-water mark of the whole process
//
//   bench_engine [op] [backward] [core] [train] [memory] [--threads N] [--tsv] [--trace-allocs]
//   (--trace-allocs: after `core` and `train`, prints the call stack of each allocation of one
//   more warm step)
#include <execinfo.h>
#include <sys/resource.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <autograd/autograd.hpp>
#include <nn/nn.hpp>

#include "bench_common.hpp"
#include "heads_model.hpp"

namespace ag = autograd;

#include "counting_allocator.hpp"  // g_allocations, g_allocated_bytes, g_trace

namespace {

bool g_tsv = false;
bool g_trace_train = false;  // --trace-allocs: trace the allocations of one more warm step (core, train)

void report(const std::string& key, double value, const std::string& unit, const std::string& note = "") {
  if (g_tsv)
    fmt::print("engine\t{}\t{:.6g}\t{}\n", key, value, unit);
  else
    fmt::print("  {:<44} {:>12.4g} {:<8} {}\n", key, value, unit, note);
  std::fflush(stdout);
}

// Median seconds per call. Calls are timed in groups of `inner` (a group of sub-microsecond
// calls is still far shorter than a scheduler time slice, so an interrupted group is an outlier
// that the median drops).
template <class F>
double median_seconds(F&& f, int inner = 1, int samples = 15, double min_time = 0.02) {
  for (int i = 0; i < 3; ++i) f();
  auto group = [&] {
    for (int i = 0; i < inner; ++i) f();
  };
  const int reps = bench::calibrate(group, min_time);
  std::vector<double> times;
  for (int i = 0; i < samples; ++i) times.push_back(bench::sample(group, reps) / inner);
  return bench::median(times);
}

// Allocations made by one call of f (after warm-up calls), and their bytes.
template <class F>
std::pair<double, double> allocations_per_call(F&& f, int calls = 20) {
  for (int i = 0; i < 5; ++i) f();
  const std::uint64_t n0 = g_allocations.load(), b0 = g_allocated_bytes.load();
  for (int i = 0; i < calls; ++i) f();
  return {static_cast<double>(g_allocations.load() - n0) / calls,
          static_cast<double>(g_allocated_bytes.load() - b0) / calls};
}

// Reports the allocations per call of a warm step (their bytes followed by `note`); with
// --trace-allocs, one more call prints each allocation it makes.
template <class F>
void report_step_allocations(const std::string& key, F& step, const std::string& note) {
  const auto [n, bytes] = allocations_per_call(step);
  report(key, n, "/step", fmt::format("{:.0f} bytes{}", bytes, note));
  if (g_trace_train) {
    g_trace = true;
    step();
    g_trace = false;
  }
}

void bench_op() {
  ag::Tensor a = ag::randn({4}).requires_grad_();
  ag::Tensor b = ag::randn({4});
  ag::Tensor keep;
  auto with_graph = [&] { keep = a * b; };  // records a node; the previous one is freed here
  const double t_graph = median_seconds(with_graph, 50);
  const auto [n_graph, bytes_graph] = allocations_per_call(with_graph);
  auto no_graph = [&] {
    ag::NoGradGuard guard;
    keep = a * b;
  };
  const double t_plain = median_seconds(no_graph, 50);
  const auto [n_plain, bytes_plain] = allocations_per_call(no_graph);
  report("op a*b [4], graph recorded", t_graph * 1e6, "µs", "(goal <= 0.5 µs)");
  report("op a*b [4], NoGradGuard", t_plain * 1e6, "µs");
  report("op a*b [4], graph recorded: allocations", n_graph, "/op", fmt::format("{:.0f} bytes", bytes_graph));
  report("op a*b [4], NoGradGuard: allocations", n_plain, "/op", fmt::format("{:.0f} bytes", bytes_plain));
}

void bench_backward() {
  ag::Tensor a = ag::randn({4}).requires_grad_();
  ag::Tensor b = ag::randn({4}).requires_grad_();
  auto build = [&] { return ag::sum(a * b + a); };
  ag::Tensor keep;
  const double t_build = median_seconds([&] { keep = build(); }, 10);
  const double t_both = median_seconds([&] {
    ag::Tensor loss = build();
    loss.backward();
  }, 10);
  report("tiny graph sum(a*b + a): build (3 ops)", t_build * 1e6, "µs");
  report("tiny graph: backward() alone", (t_both - t_build) * 1e6, "µs", "(PyTorch: compare_torch.py --micro)");
  const auto [n, bytes] = allocations_per_call([&] { build().backward(); });
  report("tiny graph build + backward: allocations", n, "/call", fmt::format("{:.0f} bytes", bytes));
}

void bench_core() {
  for (const auto& s : bench::attention_shapes()) {
    if (s.name != "toy" && s.name != "medium" && s.name != "medium-causal") continue;
    bench::AttentionStep fused(s, nn::AttentionCore::Fused), composed(s, nn::AttentionCore::Composed);
    for (int i = 0; i < 3; ++i) {
      fused();
      composed();
    }
    const int reps_f = bench::calibrate(fused, 0.02), reps_c = bench::calibrate(composed, 0.02);
    std::vector<double> tf, tc;
    for (int i = 0; i < 15; ++i) {  // interleaved, so that load changes hit both alike
      tf.push_back(bench::sample(fused, reps_f));
      tc.push_back(bench::sample(composed, reps_c));
    }
    const double f = bench::median(tf), c = bench::median(tc);
    report(fmt::format("MHA fwd+bwd {} fused", s.name), f * 1e6, "µs");
    report(fmt::format("MHA fwd+bwd {} composed", s.name), c * 1e6, "µs");
    report(fmt::format("MHA {} composed / fused", s.name), c / f, "x");
  }
  bench::AttentionShape toy{"toy", 8, 32, 64, 4};
  bench::AttentionStep step(toy, nn::AttentionCore::Fused);
  report_step_allocations("MHA fwd+bwd toy: allocations", step, "");
}

// examples/train_heads/'s model (heads_model.hpp) and training step, on one fixed batch.
void bench_train() {
  const std::int64_t vocab = 8, T = 12, d_model = 32, d_ff = 128, batch = 64;
  ag::Generator gen(1);
  heads::HeadsModel model(
      {.vocab = vocab, .seq_len = T, .d_model = d_model, .d_ff = d_ff, .heads = 2, .classes = vocab, .mlp = true}, gen);
  std::vector<double> tokens(static_cast<std::size_t>(batch * T));
  std::vector<std::int64_t> targets(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<double>(gen.next_u64() % vocab);
    targets[i] = i % T == 0 ? -100 : static_cast<std::int64_t>(gen.next_u64() % vocab);
  }
  const ag::Tensor token_tensor = ag::tensor(tokens, {batch, T});
  nn::AdamW opt(model.parameters(), {.lr = 3e-3, .weight_decay = 0.01});
  const nn::CrossEntropyOptions ce{.ignore_index = -100};
  const std::vector<ag::Tensor> params = model.parameters();  // once, as a training loop would
  auto step = [&] {
    ag::Tensor loss = nn::cross_entropy(model.forward(token_tensor), targets, ce);
    opt.zero_grad();
    loss.backward();
    nn::clip_grad_norm_(params, 1.0);
    opt.step();
  };
  const double t = median_seconds(step, 1, 15, 0.05);
  report("toy model training step (B=64, T=12, D=32, 2 heads)", t * 1e6, "µs");
  report("toy model training steps per second", 1.0 / t, "steps/s");
  report_step_allocations("toy model training step: allocations", step, " (goal: 0)");
}

double max_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // Linux reports KiB
}

void bench_memory() {
  const bench::AttentionShape large{"large", 8, 256, 384, 6};
  bench::AttentionStep step(large, nn::AttentionCore::Fused);
  const double before = max_rss_mib();
  step();
  const double after = max_rss_mib();
  report("large MHA fwd+bwd: peak RSS of the process", after, "MiB");
  report("large MHA fwd+bwd: peak RSS above module + input", after - before, "MiB");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("Micro-benchmarks of the engine (medians).", "bench_engine");
  std::vector<std::string> what;
  app.add_option("what", what, "any of op, backward, core, train, memory (default: op backward core train)")
      ->check(CLI::IsMember({"op", "backward", "core", "train", "memory"}));
  int threads = 1;
  app.add_option("--threads", threads, "kernel threads (default 1)")->check(CLI::Range(1, 1 << 16));
  app.add_flag("--tsv", g_tsv, "machine-readable lines instead of a table");
  app.add_flag("--trace-allocs", g_trace_train, "after core and train, the call stack of each allocation of one more step");
  CLI11_PARSE(app, argc, argv);
  ag::set_num_threads(threads);
  if (what.empty()) what = {"op", "backward", "core", "train"};
  if (!g_tsv) fmt::print("headgrad engine micro-benchmarks ({} thread(s), medians)\n", ag::get_num_threads());
  for (const auto& w : what) {
    if (w == "op") bench_op();
    if (w == "backward") bench_backward();
    if (w == "core") bench_core();
    if (w == "train") bench_train();
    if (w == "memory") bench_memory();
  }
  return 0;
}
