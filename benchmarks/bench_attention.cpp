// One training step of nn::MultiHeadAttention — forward and backward of self-attention, float32,
// need_weights = false, loss = sum of the output — at the benchmark shapes, timed as medians.
//
//   bench_attention                      every short shape at 1 and 2 threads, as a table
//   bench_attention --shapes toy,large --threads 1 --samples 21 --min-time 0.05
//   bench_attention --tsv                machine-readable lines (compare_torch.py reads them):
//       ours <shape> <threads> <median s/step> <GFLOP/s> <sample,sample,...> <median CPU s/step>
//       [<peak MiB> <attention GFLOP/s>]   (the last two with --memory or --attention-flops)
//   (* % of peak = FLOPs per CPU-second of the process over one core's FP32 peak)
//   bench_attention --core composed      the composed attention core instead of the fused one
//   bench_attention --dropout 0.1        dropout p = 0.1 on the attention weights (default 0)
//   bench_attention --peak               only the FP32 peak, measured per core for each vector ISA the
//                                        CPU runs, and the ISA the kernels are compiled for
//                                        (bench_common.hpp says how)
// Long sequences (T = 1k..16k; not in `all`):
//   bench_attention --shapes long --memory --attention-flops --samples 3 --cpu-samples 0 --max-gib 8
//       --memory: the step's peak resident memory above the process's baseline (one more step,
//       after the warm-up; peak_memory.hpp says how); --attention-flops: the attention part's
//       GFLOP/s (attention_core_flops over the step's median time) and its % of `threads` cores'
//       FP32 peak; --max-gib: a process whose resident memory passes the limit prints
//       `over <shape> <threads> <limit GiB>` (a tsv line) and exits with code 3
//   bench_attention --shapes memory --memory-only --threads 1     peak memory only, no timing:
//       memory <shape> <threads> <peak MiB>   (tsv)
//   bench_attention --memory-check       the peak-memory measure against a known 256 MiB buffer
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <fmt/format.h>

#include <autograd/autograd.hpp>
#include <nn/nn.hpp>

#include "bench_common.hpp"
#include "peak_memory.hpp"

namespace {

struct Flags {
  std::string core_name = "fused";
  bool peak_only = false, memory = false, memory_only = false, attention_flops = false, memory_check = false;
  int cpu_samples = -1;  // default: max(3, samples / 2)
  double max_gib = 0;
  double dropout = 0;
};

void print_peak(const bench::PeakEstimate& peak, bool tsv) {
  if (tsv) {
    fmt::print("peak\t{:.4g}\t{:.3g}\t{}\t{:.3f}\t{}\n", peak.gflops(), peak.flops_per_cycle, peak.isa, peak.ghz,
               peak.kernels_isa);
    return;
  }
  fmt::print("machine: {}\n", bench::cpu_description());
  fmt::print("kernels: {} (ag::kernel_isa() = {}; the rest of the build: {})\n", peak.kernels_isa,
             autograd::kernel_isa(), bench::compiled_isa());
  fmt::print("clock: {:.2f} GHz (measured: dependent integer multiplies)\n", peak.ghz);
  for (const auto& m : peak.measured)
    fmt::print("FP32 peak per core, {:<8}: {:7.1f} GFLOP/s = {:5.1f} FLOP/cycle (14 independent FMA chains)\n",
               m.isa, m.gflops, m.flops_per_cycle);
  if (peak.measured.empty()) fmt::print("FP32 peak: not measured (not an x86-64 build)\n");
}

// The peak-memory measure against a buffer of known size, written page by page.
void memory_check() {
  constexpr std::size_t kBytes = std::size_t{256} << 20;
  const double mib = bench::peak_mib_above_baseline([&] {
    std::vector<char> buffer(kBytes, 1);
    bench::do_not_optimize(buffer.data());
  });
  fmt::print("peak memory of a 256 MiB buffer, measured: {:.1f} MiB\n", mib);
}

// One shape at one thread count: warm-up, then the step's peak memory and/or its times.
void measure(const bench::AttentionShape& s, int n, nn::AttentionCore core, const bench::AttentionRunOptions& run,
             const Flags& f, const bench::PeakEstimate& peak, int name_width) {
  const bench::ResidentLimit limit(
      f.max_gib, run.tsv ? fmt::format("over\t{}\t{}\t{}\n", s.name, n, f.max_gib)
                         : fmt::format("{:<16} {:>7}  skipped: resident memory above --max-gib {} GiB\n", s.name,
                                       n, f.max_gib));
  bench::AttentionStep step(s, core, f.dropout);
  for (int i = 0; i < (s.is_long() ? 1 : 3); ++i) step();  // warm up: grads and caches exist
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const auto t0 = bench::Clock::now();
  const double mib = f.memory || f.memory_only ? bench::peak_mib_above_baseline(step) : nan;
  const double t_memory_step = bench::seconds_since(t0);
  if (f.memory_only) {
    if (run.tsv) fmt::print("memory\t{}\t{}\t{:.1f}\n", s.name, n, mib);
    else fmt::print("{:<16} {:>7} {:>12.1f}\n", s.name, n, mib);
    return;
  }
  // A long shape's step takes seconds: one call a sample, and the memory step, when there was
  // one, shows it without another calibration call.
  const bool one_call = s.is_long() && (f.memory ? t_memory_step : 0.0) >= run.min_time;
  const int reps = one_call ? 1 : bench::calibrate(step, run.min_time);
  std::vector<double> times;
  for (int i = 0; i < run.samples; ++i) times.push_back(bench::sample(step, reps));
  const double med = bench::median(times);
  std::vector<double> cpu;
  const int n_cpu = f.cpu_samples < 0 ? std::max(3, run.samples / 2) : f.cpu_samples;
  for (int i = 0; i < n_cpu; ++i) cpu.push_back(bench::sample_cpu(step, reps));
  const double cpu_med = cpu.empty() ? nan : bench::median(cpu);
  const double gflops = bench::attention_flops(s) / med / 1e9;
  const double attn_gflops = bench::attention_core_flops(s) / med / 1e9;
  const bool extra = f.memory || f.attention_flops;
  if (run.tsv) {
    fmt::print("ours\t{}\t{}\t{:.9g}\t{:.4g}\t{:.9g}\t{:.9g}", s.name, n, med, gflops, fmt::join(times, ","),
               cpu_med);
    if (extra) fmt::print("\t{:.1f}\t{:.4g}", mib, f.attention_flops ? attn_gflops : nan);
    fmt::print("\n");
    return;
  }
  // % of peak against the CPU time used (robust to other processes' load): FLOPs per
  // CPU-second over one core's peak.
  const std::string time = s.is_long() ? fmt::format("{:>9.1f} ms", med * 1e3) : fmt::format("{:>9.1f} µs", med * 1e6);
  const std::string pct = cpu.empty() ? std::string("–")
                                      : fmt::format("{:.1f}%", 100.0 * bench::attention_flops(s) / cpu_med / 1e9 /
                                                                   peak.gflops());
  fmt::print("{:<{}} {:>7} {} {:>10.2f} {:>12}", s.name, name_width, n, time, gflops, pct);
  if (f.attention_flops)
    fmt::print(" {:>10.2f} {:>9.1f}%", attn_gflops, 100.0 * attn_gflops / (n * peak.gflops()));
  if (f.memory) fmt::print(" {:>10.1f}", mib);
  fmt::print("\n");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("One training step of nn::MultiHeadAttention (forward + backward, float32), timed as medians.",
               "bench_attention");
  bench::AttentionRunOptions run;
  bench::add_attention_run_options(app, run);
  Flags f;
  app.add_option("--core", f.core_name, "attention core (default fused)")->check(CLI::IsMember({"fused", "composed"}));
  app.add_flag("--peak", f.peak_only, "print only the FP32 peak estimate");
  app.add_flag("--memory", f.memory, "also the step's peak resident memory above the baseline (MiB)");
  app.add_flag("--memory-only", f.memory_only, "only the step's peak memory, no timing");
  app.add_flag("--attention-flops", f.attention_flops, "also the attention part's GFLOP/s and % of peak");
  app.add_flag("--memory-check", f.memory_check, "measure a known 256 MiB buffer with the peak-memory measure");
  app.add_option("--cpu-samples", f.cpu_samples, "CPU-time samples (default max(3, samples / 2); 0: none)")
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--dropout", f.dropout, "dropout probability on the attention weights (default 0)")
      ->check(CLI::Range(0.0, 0.999))->type_name("P");
  app.add_option("--max-gib", f.max_gib, "stop when resident memory passes this many GiB (default 0: no limit)")
      ->check(CLI::NonNegativeNumber)->type_name("G");
  CLI11_PARSE(app, argc, argv);
  if (f.memory_check) {
    memory_check();
    return 0;
  }
  const bool tsv = run.tsv;
  const bench::PeakEstimate peak =
      (tsv && !f.peak_only) || f.memory_only ? bench::PeakEstimate{} : bench::estimate_fp32_peak();
  if (f.peak_only) {
    print_peak(peak, tsv);
    return 0;
  }
  const nn::AttentionCore core = f.core_name == "composed" ? nn::AttentionCore::Composed : nn::AttentionCore::Fused;

  std::size_t name_width = 14;
  for (const auto& s : bench::attention_shapes())
    if (run.wants(s)) name_width = std::max(name_width, s.name.size());
  if (!tsv && f.memory_only) {
    fmt::print("nn::MultiHeadAttention forward + backward, float32, need_weights = false, {} core: peak memory of one "
               "step above the baseline\n\n{:<16} {:>7} {:>12}\n", f.core_name, "shape", "threads", "peak MiB");
  } else if (!tsv) {
    fmt::print("nn::MultiHeadAttention forward + backward, float32, need_weights = false, {} core, dropout {}\n",
               core == nn::AttentionCore::Fused ? "fused" : "composed", f.dropout);
    fmt::print("kernels compiled for {}; FP32 peak per core ({}, measured): {:.1f} FLOP/cycle x {:.2f} GHz = "
               "{:.1f} GFLOP/s\n\n", peak.kernels_isa, peak.isa, peak.flops_per_cycle, peak.ghz, peak.gflops());
    fmt::print("{:<{}} {:>7} {:>12} {:>10} {:>12}", "shape", name_width, "threads", "time/step", "GFLOP/s",
               "% of peak*");
    if (f.attention_flops) fmt::print(" {:>10} {:>10}", "attn GF/s", "attn %**");
    if (f.memory) fmt::print(" {:>10}", "peak MiB");
    fmt::print("\n");
  }
  run.for_each_run([&](const bench::AttentionShape& s, int n) { measure(s, n, core, run, f, peak, static_cast<int>(name_width)); });
  if (!tsv && f.attention_flops)
    fmt::print("\n** attention part (Q·Kᵀ, P·V and their backward; causal: the pairs at or below the diagonal) "
               "over the step's wall time, against threads x one core's FP32 peak\n");
  return 0;
}
